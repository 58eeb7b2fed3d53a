"""labkit.scale.launch: command lines, hosts and slots, the failing rank, and real Horovod launches.

The launches (marked horovod + slow) start horovodrun with Gloo on this machine: a crashed rank, a hung
rank and an interrupted launch, each of which must leave no process behind.
"""
import json
import re
import sys
import time
import uuid

import psutil
import pytest

from labkit.scale import launch, scaling

needs_horovod = pytest.mark.skipif(launch.horovodrun_path() is None, reason="horovodrun not installed")
TINY = dict(batch_size=16, steps=3, repeats=2, warmup_steps=1, num_examples=256)


def test_display_command_names_programs_without_their_paths(monkeypatch):
    """What 04 prints: no path of the machine that ran it, the arguments as they were."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd = launch.build_command(2, ["--steps", "3", "--note", "two words"], launcher="gloo")
    assert cmd[0].startswith("/") and cmd[5 + 1].startswith("/")  # horovodrun's and Python's full paths
    shown = launch.display_command(cmd)
    assert shown.startswith("horovodrun -np 2 -H localhost:2 --gloo python")
    assert "/" not in shown.split("--steps")[0]
    assert shown.endswith("-m labkit.scale.hvd_train --steps 3 --note 'two words'")
    with pytest.raises(ValueError, match="cmd must be a list"):
        launch.display_command("horovodrun -np 2")


def test_build_command_for_each_launcher(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd = launch.build_command(2, ["--steps", "3"], launcher="gloo")
    assert cmd[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert cmd[-4:] == ["-m", "labkit.scale.hvd_train", "--steps", "3"]
    assert launch.build_command(3, launcher="srun")[:3] == ["srun", "--ntasks", "3"]
    with pytest.raises(ValueError, match="launcher"):
        launch.build_command(2, launcher="ssh")
    with pytest.raises(ValueError, match="np must be"):
        launch.build_command(0)


def test_slurm_allocation_gives_the_hosts():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "nodeA,nodeB", "SLURM_NTASKS_PER_NODE": "4"}
    assert launch.slurm_hosts(env) == ["nodeA:4", "nodeB:4"]
    assert launch.slurm_hosts({}) == []
    env2 = {"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert launch.slurm_hosts(env2) == ["n1:2", "n2:2"]
    cmd = launch.build_command(8, launcher="auto", env=env)
    assert cmd[cmd.index("-H") + 1] == "nodeA:4,nodeB:4"


def _leftovers(marker, token):
    """Processes of one launch still alive: by the launch's marker, and independently by command line."""
    by_marker = launch.marked_processes(marker)
    by_cmdline = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and token in " ".join(p.info["cmdline"] or []):
                by_cmdline.append(p)
        except psutil.Error:
            pass
    return by_marker + by_cmdline


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_crashed_rank_gives_its_traceback_and_leaves_no_process(tmp_path):
    marker = uuid.uuid4().hex
    args = scaling.train_args(**TINY, extra=["--fail-rank", "1", "--fault-at-step", "1"])
    with pytest.raises(launch.HorovodRunError) as e:
        launch.launch(2, args, timeout=240, progress=False, out_dir=tmp_path, marker=marker)
    assert e.value.rank == 1 and not e.value.timed_out
    assert "injected failure on rank 1" in str(e.value)
    assert _leftovers(marker, str(tmp_path)) == []
    assert list(tmp_path.glob(".tmp-*")) == []  # the ranks' temporary folder goes with the launch


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_hung_rank_is_killed_at_the_timeout_with_no_orphans(tmp_path, monkeypatch):
    """...and no temporary file: the killed ranks' TensorFlow autograph modules (20 of them in /tmp before) went
    into the launch's own folder, removed with it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # where the ranks' temporary files would go without the launch's
    marker = uuid.uuid4().hex
    args = scaling.train_args(**{**TINY, "warmup_steps": 0}, extra=["--hang-rank", "0", "--fault-at-step", "0"])
    timeout = 20
    t0 = time.perf_counter()
    with pytest.raises(launch.HorovodRunError) as e:
        launch.launch(2, args, timeout=timeout, progress=False, out_dir=tmp_path, marker=marker)
    assert time.perf_counter() - t0 < timeout + 15
    assert e.value.timed_out and "timeout=20" in str(e.value)
    assert _leftovers(marker, str(tmp_path)) == []
    assert list(tmp.iterdir()) == [] and list(tmp_path.glob(".tmp-*")) == []


def test_failing_rank_is_the_cause_not_the_victim():
    tails = {0: ["Traceback (most recent call last):", "tensorflow.errors.UnknownError: Horovod has been shut down",
                 "[[{{node DistributedSGD_Allreduce/HorovodAllreduce_grads_0}}]]"],
             1: ["Traceback (most recent call last):", "RuntimeError: injected failure on rank 1"]}
    # Horovod names whichever exit it noticed first (here rank 0); the root cause is rank 1
    assert launch._failing_rank(["Process name: 0", "Exit code: 1"], tails) == 1
    # kill -9 of rank 1: its stderr ends "Killed", rank 0's collective is torn down under it; on a busy machine
    # Horovod saw rank 0's exit first and named it (seen once in the suite with three test processes)
    killed = {0: ["Horovod has been shut down. This was caused by an exception on one of the ranks ...",
                  "\t [[{{node DistributedGradientTape_Allreduce/cond_1/HorovodAllreduce_grads_0}}]]", "Terminated"],
              1: ["Killed"]}
    assert launch._failing_rank(["Process name: 0", "Exit code: 1"], killed) == 1
    assert launch._failing_rank(["Process name: 1", "Exit code: 137"], killed) == 1
    assert launch._failing_rank([], {0: ["Terminated"], 1: ["bash: line 1: 4242 Killed  python train.py"]}) == 1
    assert launch._failing_rank(["Process name: 3"], {}) == 3
    assert launch._failing_rank([], {}) is None


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_interrupt_kills_every_rank(tmp_path):
    """The notebook's stop button is a KeyboardInterrupt in the loop that streams progress."""
    marker = uuid.uuid4().hex

    def stop_button(info):
        raise KeyboardInterrupt

    args = scaling.train_args(**{**TINY, "steps": 2, "repeats": 50}, extra=["--progress-every", "1"])
    with pytest.raises(KeyboardInterrupt):
        launch.launch(2, args, timeout=240, progress=stop_button, out_dir=tmp_path, marker=marker)
    assert _leftovers(marker, str(tmp_path)) == []


def test_missing_horovod_says_what_to_do(monkeypatch):
    monkeypatch.setattr(launch, "horovodrun_path", lambda: None)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(FileNotFoundError, match="make setup"):
        launch.build_command(2, launcher="gloo")
    assert launch.build_command(2, launcher="srun")[0] == "srun"  # srun needs no horovodrun


def test_take_slots_hands_horovodrun_exactly_np_slots():
    # horovodrun --gloo starts a rank in every slot it is given: np=1 on a 2-slot node must get node:1
    assert launch.take_slots(["node1:2"], 1) == ["node1:1"]
    assert launch.take_slots(["node1:2", "node2:2"], 3) == ["node1:2", "node2:1"]
    assert launch.take_slots(["node1:4"], 4) == ["node1:4"]
    assert launch.take_slots(["node1"], 1) == ["node1:1"]
    with pytest.raises(ValueError, match="np=5"):
        launch.take_slots(["node1:2", "node2:2"], 5)


# ---------------------------------------------------------------- hosts, environment, bad input

def test_hosts_use_horovodruns_syntax_and_bad_entries_name_the_parameter():
    assert launch.parse_hosts("node1:1,node2:2") == ["node1:1", "node2:2"]
    cmd = launch.build_command(2, launcher="gloo", hosts="node1:1,node2:1")
    assert cmd[1:5] == ["-np", "2", "-H", "node1:1,node2:1"]
    with pytest.raises(ValueError, match="hosts cannot be given with launcher='srun'"):
        launch.build_command(2, launcher="srun", hosts="node1:1,node2:1")
    for bad in (["a:x"], ["a:0"], [":2"], ["a:-1"], "node1:1,,node2:1", []):
        with pytest.raises(ValueError, match="hosts must"):
            launch.take_slots(bad, 1)


def test_child_env_is_an_allow_list():
    base = {"PATH": "/usr/bin", "HOME": "/h", "LC_ALL": "C", "SLURM_JOB_ID": "7", "OMP_NUM_THREADS": "1",
            "HOROVOD_FUSION_THRESHOLD": "0", "LABKIT_PROFILE": "quick", "TMPDIR": "/t",
            "JUPYTER_TOKEN": "secret-xyz", "FOO_SECRET": "s", "AWS_SECRET_ACCESS_KEY": "k", "GITHUB_TOKEN": "g",
            "LABKIT_API_KEY": "k2", "HTTPS_PROXY": "http://user:pw@proxy", "JPY_SESSION_NAME": "x"}
    env = launch.child_env({"EXTRA": "1"}, marker="m", base=base)
    assert {"PATH", "HOME", "LC_ALL", "SLURM_JOB_ID", "OMP_NUM_THREADS", "HOROVOD_FUSION_THRESHOLD",
            "LABKIT_PROFILE", "TMPDIR", "EXTRA"} <= set(env)
    assert env[launch.MARKER_ENV] == "m"
    for leaked in ("JUPYTER_TOKEN", "FOO_SECRET", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "LABKIT_API_KEY",
                   "HTTPS_PROXY", "JPY_SESSION_NAME"):
        assert leaked not in env


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1])
def test_launch_rejects_a_bad_timeout_before_anything_starts(timeout, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(ValueError, match="timeout must be"):
        launch.launch(1, timeout=timeout)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- no secret reaches a rank; no orphan, ever

def _sample_processes(stop, seen, secrets):
    """Until stop is set: every process's command line, and the environment of the launch's ranks."""
    while not stop.is_set():
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = "\0".join(p.info["cmdline"] or [])
                if "labkit.scale.hvd_train" in cmd and launch.MARKER_ENV in p.environ():
                    seen["ranks"] += 1
                    seen["leaks"] += [s for s in secrets if s in "\0".join(p.environ().values())]
                seen["leaks"] += [s for s in secrets if s in cmd]
            except (psutil.Error, OSError):
                pass
        time.sleep(0.05)


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_no_secret_reaches_a_rank_and_the_temp_dir_goes(tmp_path, monkeypatch):
    secrets = ["secret-xyz", "foo-secret-value-42"]
    monkeypatch.setenv("JUPYTER_TOKEN", secrets[0])
    monkeypatch.setenv("FOO_SECRET", secrets[1])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import threading
    stop, seen = threading.Event(), {"ranks": 0, "leaks": []}
    sampler = threading.Thread(target=_sample_processes, args=(stop, seen, secrets), daemon=True)
    sampler.start()
    try:
        ranks = launch.launch(1, scaling.train_args(**{**TINY, "repeats": 3}), timeout=240, progress=False)
        with pytest.raises(launch.HorovodRunError):  # and a failed launch removes its folder too
            launch.launch(1, scaling.train_args(**TINY, extra=["--fail-rank", "0", "--fault-at-step", "0"]),
                          timeout=240, progress=False)
    finally:
        stop.set()
        sampler.join()
    assert ranks[0]["rank"] == 0
    assert seen["ranks"] > 0, "the sampler never saw the rank: the test proves nothing"
    assert seen["leaks"] == []
    assert list(tmp_path.glob("labkit-scale-*")) == []


def _marker_of(pid, deadline_s=60):
    """The launch marker in the environment of pid's descendants (horovodrun and the ranks)."""
    end = time.time() + deadline_s
    while time.time() < end:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                marker = child.environ().get(launch.MARKER_ENV)
            except psutil.Error:
                continue
            if marker:
                return marker
        time.sleep(0.2)
    raise AssertionError("no marked process under the launcher")


def _count_after(marker, seconds=4.0):
    time.sleep(seconds)
    return len(launch.marked_processes(marker))


LONG_RUN = ["--np", "2", "--batch-size", "16", "--steps", "2", "--repeats", "200", "--warmup-steps", "1",
            "--timeout", "300"]


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGKILL", -9)])
def test_killing_labkit_scale_mid_run_leaves_no_process(sig, code, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "scale", *LONG_RUN], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        marker = _marker_of(proc.pid)
        for line in proc.stdout:  # mid-run: both ranks are training
            if "step" in line:
                break
        assert launch.marked_processes(marker), "nothing was running"
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=30) == code
        left = _count_after(marker)
        print(f"{sig}: {left} processes with the run's marker after 4 s")
        assert left == 0
        assert list(tmp_path.glob("labkit-scale-*")) == []
        if sig == "SIGTERM":
            err = proc.stderr.read()
            assert "stopped by signal" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_restarting_the_jupyter_kernel_mid_run_leaves_no_process(tmp_path):
    import os

    from jupyter_client import KernelManager
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "TMPDIR": str(tmp_path)})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute("from labkit.scale import scaling\n"
                   "scaling.run(2, batch_size=16, steps=2, repeats=200, warmup_steps=1, timeout=300)")
        marker = _marker_of(km.provisioner.process.pid, deadline_s=120)
        end = time.time() + 120
        while time.time() < end:  # mid-run: wait for rank 0's first progress line in the cell's output
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "stream" and "step" in msg["content"]["text"]:
                break
        assert launch.marked_processes(marker), "nothing was running"
        km.restart_kernel(now=True)
        left = _count_after(marker)
        print(f"kernel restart: {left} processes with the run's marker after 4 s")
        assert left == 0
        assert list(tmp_path.glob("labkit-scale-*")) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# ------------------------------------------------------------ MPI: mpirun directly, the default where Horovod has MPI

FAKE_MPIRUN = """#!{python}
# Records its argv and environment, then plays np ranks: Open MPI 5's tagged output, one rank*.json each.
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["LABKIT_FAKE_LOG"], "w") as f:
    json.dump({{"argv": argv, "env": dict(os.environ)}}, f)
n = int(argv[argv.index("-np") + 1])
out = argv[argv.index("--out") + 1]
for r in range(n):
    print(f"[1,{{r}}]<stdout>: LABKIT_PROGRESS" + json.dumps({{"step": 1, "steps": 1, "loss": 1.0, "elapsed_s": 0.1}}))
    print(f"[1,{{r}}]<stderr>: a line of rank {{r}}", file=sys.stderr)
    with open(os.path.join(out, f"rank{{r}}.json"), "w") as f:
        json.dump({{"rank": r, "controller": "fake"}}, f)
"""


@pytest.fixture
def fake_mpirun(tmp_path, monkeypatch):
    """A fake mpirun (LABKIT_MPIRUN) and a Horovod that says it has MPI; returns the log of its last run."""
    from labkit.scale import mpi
    exe = tmp_path / "mpirun"
    exe.write_text(FAKE_MPIRUN.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "mpirun.json"
    monkeypatch.setenv("LABKIT_MPIRUN", str(exe))
    monkeypatch.setenv("LABKIT_FAKE_LOG", str(log))
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: True)
    monkeypatch.setattr(mpi, "version", lambda exe: "Open MPI 5.0.11")
    for name in (*launch.FAST_MPI_SETTINGS, "SLURM_JOB_ID", "OMPI_MCA_btl"):
        monkeypatch.delenv(name, raising=False)
    return exe, log


def test_mpi_command_is_open_mpi_5s_with_names_not_values(fake_mpirun):
    exe, _ = fake_mpirun
    cmd = launch.build_command(2, ["--steps", "3"], launcher="mpi", export=["PATH", "HOROVOD_CYCLE_TIME"])
    # Open MPI 5's mpirun refuses horovodrun --mpi's single-dash "-bind-to none -map-by slot"
    assert cmd[:13] == [str(exe), "--bind-to", "none", "--map-by", "slot", "--mca", "btl", "^ofi", "-np", "2",
                        "-H", "localhost:2", "--tag-output"]
    assert cmd[13:17] == ["-x", "PATH", "-x", "HOROVOD_CYCLE_TIME"]
    assert cmd[17:] == [sys.executable, "-m", "labkit.scale.hvd_train", "--steps", "3"]
    assert launch.build_command(3, launcher="mpi", hosts="node1:2,node2:2")[5:9] == ["-np", "3", "-H",
                                                                                    "node1:2,node2:1"]


@pytest.mark.parametrize("hosts, env, expected", [
    (None, {}, ["--mca", "btl", "^ofi"]),                      # every rank here: shared memory carries it all
    ("localhost:2", {}, ["--mca", "btl", "^ofi"]),
    ("node1:2,node2:2", {}, []),                                # other hosts: their fabric may be libfabric's
    (None, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_TASKS_PER_NODE": "2(x2)"}, []),
    (None, {"OMPI_MCA_btl": "self,tcp"}, []),                   # the user's own choice of transports
])
def test_mpirun_leaves_libfabric_out_only_where_every_rank_runs_here(hosts, env, expected):
    from labkit.scale import hosts as where
    assert where.local_transports(hosts, env) == expected


def test_a_transport_the_caller_gives_a_launch_is_not_overridden(fake_mpirun):
    exe, log = fake_mpirun
    launch.launch(2, ["--steps", "1"], launcher="mpi", timeout=60, progress=False,
                  env_extra={"OMPI_MCA_btl": "self,tcp"})
    rec = json.loads(log.read_text())
    assert "--mca" not in rec["argv"] and rec["env"]["OMPI_MCA_btl"] == "self,tcp"


@pytest.mark.parametrize("launcher, user, expected", [
    ("auto", {}, {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.1"}),
    ("auto", {"HOROVOD_CYCLE_TIME": "5"}, {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "5"}),
    ("mpi", {}, {}),  # an explicit choice runs Open MPI's and Horovod's own defaults
])
def test_launch_through_mpirun_passes_names_and_the_tuned_settings(fake_mpirun, monkeypatch, capsys, launcher,
                                                                    user, expected):
    exe, log = fake_mpirun
    for k, v in user.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("JUPYTER_TOKEN", "secret-xyz")
    seen = []
    ranks = launch.launch(2, ["--steps", "1"], launcher=launcher, timeout=60, progress=seen.append)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert seen and seen[0]["step"] == 1  # Open MPI 5's "[1,0]<stdout>: " lines were read as rank 0's
    rec = json.loads(log.read_text())
    argv, env = rec["argv"], rec["env"]
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"PATH", launch.MARKER_ENV} <= set(exported) and "JUPYTER_TOKEN" not in exported
    assert "JUPYTER_TOKEN" not in env and not any("secret-xyz" in a for a in argv)
    assert not any("=" in name for name in exported)  # names only: no value reaches the command line
    assert {k: env[k] for k in launch.FAST_MPI_SETTINGS if k in env} == expected
    assert set(expected) <= set(exported)
    out = capsys.readouterr().out
    assert ("controller: MPI via mpirun (Open MPI 5.0.11" in out) is (launcher == "auto")
    assert ("--launcher gloo" in out) is (launcher == "auto")


def test_auto_is_resolved_once_per_run_and_every_launch_takes_that_choice(monkeypatch):
    """scaling.run asks choose_launcher once; launch and build_command take its LauncherChoice as it is."""
    from helpers import fake_launch
    from labkit.scale import mpi
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    asked = []
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: asked.append(1) or True)
    monkeypatch.setattr(mpi, "describe", lambda: "Open MPI")
    calls = []
    monkeypatch.setattr(scaling, "launch", fake_launch(calls))
    scaling.run([1, 2, 4], batch_size=8, progress=False, env_extra={"HOROVOD_CYCLE_TIME": "5"})
    assert len(asked) == 1
    choice = calls[0][2]["launcher"]
    assert all(kw["launcher"] is choice for _, _, kw in calls) and choice.launcher == "mpi"
    assert choice.settings == {"OMPI_MCA_mpi_yield_when_idle": "1"}  # the caller's cycle time kept as theirs
    assert all(kw["env_extra"] == {"HOROVOD_CYCLE_TIME": "5"} for _, _, kw in calls)
    monkeypatch.setattr(mpi, "mpirun_path", lambda: "/opt/mpi/bin/mpirun")
    assert launch.build_command(2, [], launcher=choice)[0] == "/opt/mpi/bin/mpirun" and len(asked) == 1
    assert launch.choose_launcher(choice, hosts="node1:1,node2:1") is choice


def test_default_launcher_follows_the_build_and_the_hosts(monkeypatch):
    from labkit.scale import mpi
    for name in (*launch.FAST_MPI_SETTINGS, "SLURM_JOB_ID", "OMPI_MCA_btl"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mpi, "describe", lambda: "Open MPI 5.0.11 from PyPI in this environment")
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: True)
    chosen, settings, note = launch.choose_launcher()
    assert (chosen, settings) == ("mpi", launch.FAST_MPI_SETTINGS)
    assert note.count("\n") == 0 and "OMPI_MCA_mpi_yield_when_idle=1 HOROVOD_CYCLE_TIME=0.1" in note
    assert launch.choose_launcher(hosts="localhost:2")[0] == "mpi"
    # across machines and inside Slurm: Gloo over the hosts, as before; explicit choices stay
    assert launch.choose_launcher(hosts="node1:1,node2:1")[0] == "gloo"
    assert launch.choose_launcher(env={"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"})[0] == "gloo"
    assert launch.choose_launcher("gloo")[:2] == ("gloo", {})
    assert launch.choose_launcher("mpi")[:2] == ("mpi", {})
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: False)
    chosen, settings, note = launch.choose_launcher()
    assert (chosen, settings) == ("gloo", {}) and "built without MPI" in note and "make setup" in note
    with pytest.raises(ValueError, match="launcher must be"):
        launch.choose_launcher("ssh")


def test_the_default_settings_are_the_fastest_measured():
    """FAST_MPI_SETTINGS are the settings of the fastest row of the committed controller measurement."""
    from labkit.scale import localscale
    rows = localscale.load_controller_results()["rows"]
    best = max(rows, key=lambda r: r["vs_no_sync"])
    assert best["launcher"] == "mpi" and best["workers_saw"] == launch.FAST_MPI_SETTINGS


def test_open_mpi_failure_lines_name_the_rank():
    assert launch._failing_rank(["  Process name: [[63841,1],1]", "  Exit code: 1"], {}) == 1  # Open MPI 4
    assert launch._failing_rank(["  Process name: [prterun-host-77@1,1]"], {}) == 1  # Open MPI 5


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_two_ranks_in_sync_through_the_default_launcher(tmp_path, monkeypatch, capsys):
    """Where Horovod has MPI, the default launch is mpirun with the tuned settings: the ranks say so, and
    their weights end equal."""
    from labkit.scale import mpi
    if not mpi.horovod_has_mpi() or mpi.mpirun_path() is None:
        pytest.skip(f"Horovod here has no MPI ({mpi.describe()})")
    for name in (*launch.FAST_MPI_SETTINGS, "SLURM_JOB_ID", "LABKIT_MPIRUN"):
        monkeypatch.delenv(name, raising=False)
    ranks = launch.launch(2, scaling.train_args(**{**TINY, "repeats": 1}), timeout=240, progress=True,
                          out_dir=tmp_path)
    assert "controller: MPI via mpirun" in capsys.readouterr().out
    assert [r["controller"] for r in ranks] == ["mpi", "mpi"]
    assert [r["tuning"] for r in ranks] == [launch.FAST_MPI_SETTINGS] * 2
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


def test_core_binding_only_for_two_or_more_ranks_that_fit_this_machine(monkeypatch):
    """mpirun's placement: a core (or `threads` cores) per rank when 2+ ranks fit the cores, else none."""
    from labkit.base import machine
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(machine, "cores", lambda: 4)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 4 if logical else 2)  # 2 cores x 2 hyperthreads
    monkeypatch.setattr(sys, "platform", "linux")
    unbound = ["--bind-to", "none", "--map-by", "slot"]
    assert launch.core_binding(2, 1) == ["--map-by", "slot:PE=1", "--bind-to", "core"]
    assert launch.core_binding(1, 1) == unbound  # a lone rank's helper threads may use the free cores
    assert launch.core_binding(3, 1) == unbound  # 3 ranks on 2 physical cores: hyperthreads are not cores
    assert launch.core_binding(2, 2) == unbound
    assert launch.core_binding(2, None) == unbound
    assert launch.core_binding(2, 1, hosts="node1:1,node2:1") == unbound
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8)
    assert launch.core_binding(2, 2) == ["--map-by", "slot:PE=2", "--bind-to", "core"]
    monkeypatch.setattr(sys, "platform", "darwin")  # Open MPI cannot bind on macOS
    assert launch.core_binding(2, 1) == unbound
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        launch.core_binding(2, 0)


def test_mpi_command_places_ranks_by_threads(fake_mpirun, monkeypatch):
    from labkit.base import machine
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    cmd = launch.build_command(2, ["--steps", "3"], launcher="mpi", threads=1)
    assert cmd[1:10] == ["--map-by", "slot:PE=1", "--bind-to", "core", "--mca", "btl", "^ofi", "-np", "2"]
    assert launch.build_command(1, launcher="mpi", threads=1)[1:5] == ["--bind-to", "none", "--map-by", "slot"]


@pytest.mark.skipif(sys.platform != "linux" or psutil.cpu_count(logical=False) is None
                    or min(psutil.cpu_count(logical=False), len(psutil.Process().cpu_affinity())) < 2,
                    reason="needs Linux with 2 usable cores")
def test_real_mpirun_gives_each_bound_rank_its_own_core(monkeypatch):
    """The flags do what they say with the mpirun Horovod links: two ranks, one distinct core each."""
    import os
    import subprocess

    from labkit.scale import mpi
    exe = mpi.mpirun_path()
    if exe is None:
        pytest.skip("no mpirun for Horovod's MPI here")
    env = launch.child_env()
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    code = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([str(exe), *launch.core_binding(2, 1), "-np", "2", "-H", "localhost:2", sys.executable,
                          "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    sets = [line.split("cpus", 1)[1].strip() for line in out.stdout.splitlines() if "cpus" in line]
    assert len(sets) == 2 and all(s.count(",") == 0 for s in sets) and sets[0] != sets[1], out.stdout


def parse_check_build(text: str) -> dict:
    """`horovodrun --check-build`'s report as {'version', 'frameworks', 'controllers', 'operations'}."""
    out = {"version": None, "frameworks": [], "controllers": [], "operations": []}
    m = re.search(r"Horovod v(\S+?):?\s*$", text, re.M)
    if m:
        out["version"] = m.group(1)
    section = None
    keys = {"Available Frameworks": "frameworks", "Available Controllers": "controllers",
            "Available Tensor Operations": "operations"}
    for line in text.splitlines():
        if line.strip().rstrip(":") in keys:
            section = keys[line.strip().rstrip(":")]
        elif (m := re.match(r"\[(X| )\]\s+(\S+)", line.strip())) and section and m.group(1) == "X":
            out[section].append(m.group(2))
    return out


def test_parse_check_build():
    text = ("Horovod v0.28.1:\n\nAvailable Frameworks:\n    [X] TensorFlow\n    [X] PyTorch\n    [ ] MXNet\n\n"
            "Available Controllers:\n    [ ] MPI\n    [X] Gloo\n\nAvailable Tensor Operations:\n    [ ] NCCL\n"
            "    [ ] DDL\n    [ ] CCL\n    [ ] MPI\n    [X] Gloo\n")
    assert parse_check_build(text) == {"version": "0.28.1", "frameworks": ["TensorFlow", "PyTorch"],
                                       "controllers": ["Gloo"], "operations": ["Gloo"]}


@needs_horovod
def test_the_suites_horovodrun_leaves_out_only_a_check_that_holds():
    """tests/bin/horovodrun (the suite's LABKIT_HOROVODRUN, tests/conftest.py) skips horovodrun's per-launch
    gloo_built(): this Horovod is built with Gloo, asked as the real launcher asks (--check-build passes through
    to Horovod's own check, whose Gloo controller is that same gloo_built() call), and the report is what labkit's
    one-process probe (horovod_info.probe_build, which the doctor uses) says: the same build, asked both ways."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from labkit.scale import horovod_info

    shim = Path(__file__).parents[1] / "bin" / "horovodrun"
    if os.environ.get("LABKIT_HOROVODRUN") != str(shim):
        pytest.skip("LABKIT_HOROVODRUN is not the suite's horovodrun here")
    ours = subprocess.run([str(shim), "--check-build"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LABKIT_TEST_PYTHON": sys.executable})
    theirs = parse_check_build(ours.stdout)
    theirs["frameworks"] = [f for f in theirs["frameworks"] if f == "TensorFlow"]  # it marks PyTorch, absent here
    probed, why = horovod_info.probe_build([sys.executable])
    assert ours.returncode == 0 and "Gloo" in theirs["controllers"], ours.stdout + ours.stderr[-500:]
    assert probed == {**theirs, "error": ""}, why
