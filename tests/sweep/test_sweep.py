"""labkit.sweep: Pareto front, atomic results file, resume after a kill, failing configs, thread limits."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.base import machine
from labkit.sweep import runner as sweep

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- toy train functions
@dataclass(frozen=True)
class Toy:
    """Picklable stand-in for a trainer: fake accuracy/params from the config, a marker file per call."""

    marker_dir: str
    sleep: float = 0.0
    fail_on: tuple = ()  # config["i"] values that raise
    crash_on: tuple = ()  # config["i"] values that kill their worker process

    def __call__(self, cfg):
        i = cfg["i"]
        Path(self.marker_dir, f"{i}.{os.getpid()}.{time.monotonic_ns()}").touch()
        time.sleep(self.sleep)
        if i in self.fail_on:
            raise RuntimeError(f"config {i} diverged")
        if i in self.crash_on:
            os._exit(3)
        return {"accuracy": 0.1 * (i % 7), "memory_bytes": 4 * (1000 + 10 * i), "note": f"toy {i}"}


def calls(marker_dir):
    return sorted(int(p.name.split(".")[0]) for p in Path(marker_dir).iterdir())


def toy_configs(n):
    return [{"i": i, "width": 8 * (i + 1)} for i in range(n)]


# ----------------------------------------------------------------------------- Pareto front
def brute_force_front(points):
    """The definition, checked pair by pair (O(n^2)): the oracle for pareto_front."""
    front = []
    for i, (m, a) in enumerate(points):
        beaten = any(m2 <= m and a2 >= a and (m2 < m or a2 > a) for j, (m2, a2) in enumerate(points) if j != i)
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], i))


def test_pareto_hand_made():
    points = [(100, 0.70), (50, 0.60), (200, 0.80), (150, 0.65), (50, 0.55), (300, 0.79)]
    # (150, .65) is beaten by (100, .70); (50, .55) by (50, .60); (300, .79) by (200, .80)
    assert sweep.pareto_front(points) == [1, 0, 2]


def test_pareto_ties_and_duplicates():
    # exact duplicates on the front: neither beats the other, both stay
    assert sweep.pareto_front([(10, 0.5), (20, 0.9), (10, 0.5)]) == [0, 2, 1]
    # dominated duplicates: both leave
    assert sweep.pareto_front([(30, 0.4), (30, 0.4), (20, 0.6)]) == [2]
    # same accuracy, more memory: beaten (equal accuracy, strictly more memory)
    assert sweep.pareto_front([(10, 0.5), (20, 0.5)]) == [0]
    # same memory, less accuracy: beaten
    assert sweep.pareto_front([(10, 0.5), (10, 0.6)]) == [1]
    assert sweep.pareto_front([]) == []
    assert sweep.pareto_front([(5, 0.1)]) == [0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=25))
def test_pareto_matches_definition(points):
    # small integer grids make ties and duplicates common
    assert sweep.pareto_front(points) == brute_force_front(points)


def test_pareto_bad_points_name_the_point():
    with pytest.raises(ValueError, match="point 1"):
        sweep.pareto_front([(1, 0.5), (2, float("nan"))])
    with pytest.raises(ValueError, match="pairs"):
        sweep.pareto_front([(1, 0.5, 3)])


# ----------------------------------------------------------------------------- results file
def test_write_results_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    sweep.write_results(out, [{"key": "a", "x": 1}])
    before = out.read_bytes()

    def boom(src, dst):
        raise OSError("disk vanished")

    monkeypatch.setattr(sweep.os, "replace", boom)
    with pytest.raises(OSError):
        sweep.write_results(out, [{"key": "a", "x": 1}, {"key": "b", "x": 2}])
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # no temp file left behind


def test_load_results_rejects_garbage_with_line_number(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"key": "a"}\n{"key": \n')
    with pytest.raises(ValueError, match="line 2"):
        sweep.load_results(out)
    assert sweep.load_results(tmp_path / "missing.jsonl") == []


# ----------------------------------------------------------------------------- the runner
def test_sweep_two_workers_records_every_config(tmp_path):
    marks = tmp_path / "m"
    marks.mkdir()
    out = tmp_path / "r.jsonl"
    configs = toy_configs(5)
    run = sweep.run_sweep(configs, Toy(str(marks)), out, num_workers=2, tensorflow=False, progress=False)
    assert run.ran == 5 and run.skipped == 0 and not run.failed
    assert [r["config"] for r in run.records] == configs
    for r in run.records:
        i = r["config"]["i"]
        assert r["status"] == "ok" and r["memory_bytes"] == 4 * (1000 + 10 * i)
        assert math.isclose(r["accuracy"], 0.1 * (i % 7)) and r["note"] == f"toy {i}" and r["threads"] >= 1
    assert len({r["worker_pid"] for r in run.records} - {os.getpid()}) >= 1  # trained outside this process
    on_disk = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["key"] for r in on_disk) == sorted(sweep.config_key(c) for c in configs)
    assert calls(marks) == [0, 1, 2, 3, 4]
    # re-running skips everything; nothing is trained again
    again = sweep.run_sweep(configs, Toy(str(marks)), out, num_workers=2, tensorflow=False, progress=False)
    assert again.ran == 0 and again.skipped == 5 and calls(marks) == [0, 1, 2, 3, 4]
    assert again.records == run.records


def test_failing_config_is_recorded_and_others_finish(tmp_path):
    marks = tmp_path / "m"
    marks.mkdir()
    out = tmp_path / "r.jsonl"
    configs = toy_configs(4)
    run = sweep.run_sweep(configs, Toy(str(marks), fail_on=(1,)), out, num_workers=2, tensorflow=False,
                          progress=False)
    status = {r["config"]["i"]: r["status"] for r in run.records}
    assert status == {0: "ok", 1: "error", 2: "ok", 3: "ok"}
    bad = run.records[1]
    assert bad["error"] == "RuntimeError: config 1 diverged" and bad["accuracy"] is None
    assert any("diverged" in line for line in bad["traceback"])
    # a resume retries only the failed config; with the bug fixed it lands as ok
    rerun = sweep.run_sweep(configs, Toy(str(marks)), out, num_workers=2, tensorflow=False, progress=False)
    assert rerun.ran == 1 and not rerun.failed
    assert calls(marks) == [0, 1, 1, 2, 3]
    assert len(sweep.load_results(out)) == 4  # the retried record replaced the failed one
    # retry_failed=False keeps the error and trains nothing
    sweep.run_sweep(configs, Toy(str(marks), fail_on=(2,)), out, num_workers=1, tensorflow=False,
                    progress=False, resume=False, max_new=3)
    kept = sweep.run_sweep(configs, Toy(str(marks)), out, num_workers=1, tensorflow=False, progress=False,
                           retry_failed=False, max_new=0)
    assert kept.ran == 0 and [r["status"] for r in kept.records] == ["ok", "ok", "error"]


def test_worker_that_dies_takes_only_its_config(tmp_path):
    marks = tmp_path / "m"
    marks.mkdir()
    configs = toy_configs(4)
    run = sweep.run_sweep(configs, Toy(str(marks), crash_on=(2,), sleep=0.2), tmp_path / "r.jsonl",
                          num_workers=2, tensorflow=False, progress=False)
    status = {r["config"]["i"]: r["status"] for r in run.records}
    assert status == {0: "ok", 1: "ok", 2: "error", 3: "ok"}
    assert "worker process died" in run.records[2]["error"]
    assert run.crashed_workers >= 1


def alive(pids):
    """The pids still running (a zombie waiting for a reaper has stopped running: not counted)."""
    import psutil

    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def wait_gone(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


ORPHAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_sweep import Toy, toy_configs
from labkit.sweep import runner as sweep
sweep.run_sweep(toy_configs(8), Toy({marks!r}, sleep=2.0), {out!r}, num_workers=2, tensorflow=False,
                progress=False)
"""


def start_sweep_and_wait_for_workers(tmp_path, results_before_kill=0):
    import psutil

    marks, out = tmp_path / "m", tmp_path / "r.jsonl"
    marks.mkdir()
    script = ORPHAN_SCRIPT.format(tests=str(HERE), marks=str(marks), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (len(list(marks.iterdir())) >= 2 + results_before_kill
                                               and len(sweep.load_results(out)) >= results_before_kill):
        time.sleep(0.05)
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    workers = {int(p.name.split(".")[1]) for p in marks.iterdir()}
    assert len(workers) == 2 and workers <= set(children), (workers, children)
    return proc, children, out


def test_sigkill_of_the_sweep_leaves_no_worker_behind(tmp_path):
    # only the sweep's process is killed (not its group): a notebook kernel killed by the OOM killer or a lease
    proc, children, _ = start_sweep_and_wait_for_workers(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert wait_gone(children) == []  # the workers (and the resource tracker) are gone within seconds


def test_sigterm_keeps_results_and_ends_workers(tmp_path):
    proc, children, out = start_sweep_and_wait_for_workers(tmp_path, results_before_kill=2)
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    # SIGTERM is handled as Ctrl-C: labkit.sweep.workerpool.Interrupted, a KeyboardInterrupt that names the signal
    assert proc.returncode != 0 and "Interrupted: signal SIGTERM" in err, err[-800:]
    assert wait_gone(children) == []
    saved = sweep.load_results(out)  # the file parses: never half-written
    assert 2 <= len(saved) < 8 and all(r["status"] == "ok" for r in saved)


WATCH_SCRIPT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import os; from labkit.sweep import workerpool; workerpool.watch_parent(os.getppid(), 0.1)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_watchdog_kills_a_worker_whose_parent_died():
    # the macOS path (no prctl): the polling thread alone ends the orphan
    proc = subprocess.Popen([sys.executable, "-c", WATCH_SCRIPT], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    time.sleep(0.5)
    assert alive([child]) == [child]
    proc.kill()
    proc.wait(timeout=30)
    assert wait_gone([child], timeout=10) == []


@dataclass(frozen=True)
class SetToy(Toy):
    """A Toy whose results depend on settings, as a real trainer's do (epochs, data set)."""

    epochs: int = 1

    def settings(self):
        return {"epochs": self.epochs, "dataset": "toy"}


def test_resume_refuses_results_made_with_other_settings(tmp_path):
    out = tmp_path / "r.jsonl"
    configs = toy_configs(3)
    first = sweep.run_sweep(configs, SetToy(str(tmp_path), epochs=1), out, max_new=2, tensorflow=False,
                            progress=False)
    assert all(r["settings"] == {"epochs": 1, "dataset": "toy"} for r in first.records)
    with pytest.raises(ValueError, match="epochs=1 there, 3 now"):
        sweep.run_sweep(configs, SetToy(str(tmp_path), epochs=3), out, tensorflow=False, progress=False)
    assert len(sweep.load_results(out)) == 2  # refused before touching the file
    same = sweep.run_sweep(configs, SetToy(str(tmp_path), epochs=1), out, tensorflow=False, progress=False)
    assert same.ran == 1 and same.skipped == 2
    fresh = sweep.run_sweep(configs, SetToy(str(tmp_path), epochs=3), out, resume=False, tensorflow=False,
                            progress=False)
    assert fresh.ran == 3 and {r["settings"]["epochs"] for r in sweep.load_results(out)} == {3}
    # a file from before settings were recorded: readable, but not resumed with settings it cannot check
    old = tmp_path / "old.jsonl"
    sweep.write_results(old, [{"key": sweep.config_key(configs[0]), "status": "ok", "accuracy": 0.5,
                               "memory_bytes": 10}])
    with pytest.raises(ValueError, match="without recorded settings"):
        sweep.run_sweep(configs, SetToy(str(tmp_path)), old, tensorflow=False, progress=False)
    assert sweep.run_sweep(configs, Toy(str(tmp_path)), old, tensorflow=False, progress=False).skipped == 1


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_sweep import Toy, toy_configs
from labkit.sweep import runner as sweep
sweep.run_sweep(toy_configs(6), Toy({marks!r}, sleep=0.4), {out!r}, num_workers=1, tensorflow=False,
                progress=False)
"""


def test_resume_after_kill_loses_nothing_and_reruns_nothing(tmp_path):
    marks, marks2, out = tmp_path / "m", tmp_path / "m2", tmp_path / "r.jsonl"
    marks.mkdir()
    marks2.mkdir()
    script = KILL_SCRIPT.format(tests=str(HERE), marks=str(marks), out=str(out))
    # own session, so the kill reaches the sweep and its worker (a lease ending, a Ctrl-C gone wrong)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sweep.load_results(out)) < 2:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    saved = sweep.load_results(out)  # parses: the file is never half-written
    assert 2 <= len(saved) < 6
    assert all(r["status"] == "ok" for r in saved)
    run = sweep.run_sweep(toy_configs(6), Toy(str(marks2)), out, num_workers=2, tensorflow=False, progress=False)
    finished_before = {r["config"]["i"] for r in saved}
    assert set(calls(marks2)) == set(range(6)) - finished_before  # nothing re-run
    assert run.skipped == len(saved) and run.ran == 6 - len(saved)
    by_key = {r["key"]: r for r in sweep.load_results(out)}
    assert len(by_key) == 6
    for r in saved:  # earlier results intact, byte for byte
        assert by_key[r["key"]] == r


def test_max_new_stops_early_and_resume_finishes(tmp_path):
    marks = tmp_path / "m"
    marks.mkdir()
    out = tmp_path / "r.jsonl"
    first = sweep.run_sweep(toy_configs(5), Toy(str(marks)), out, max_new=2, tensorflow=False, progress=False)
    assert first.ran == 2 and len(first.records) == 2
    second = sweep.run_sweep(toy_configs(5), Toy(str(marks)), out, tensorflow=False, progress=False)
    assert second.ran == 3 and second.skipped == 2 and calls(marks) == [0, 1, 2, 3, 4]


def test_bad_arguments_name_the_parameter(tmp_path):
    toy = Toy(str(tmp_path))
    with pytest.raises(ValueError, match="num_workers"):
        sweep.run_sweep(toy_configs(2), toy, tmp_path / "r", num_workers=0)
    with pytest.raises(ValueError, match="threads_per_worker"):
        sweep.run_sweep(toy_configs(2), toy, tmp_path / "r", threads_per_worker=0)
    with pytest.raises(ValueError, match="unique"):
        sweep.run_sweep(toy_configs(2) * 2, toy, tmp_path / "r")
    with pytest.raises(ValueError, match="JSON"):
        sweep.run_sweep([{"f": object()}], toy, tmp_path / "r")
    with pytest.raises(ValueError, match="out"):  # a file where the folder should be: before any worker starts
        (tmp_path / "file.txt").write_text("x")
        sweep.run_sweep(toy_configs(2), toy, tmp_path / "file.txt" / "r.jsonl")
    assert not list(tmp_path.glob("[0-9]*"))  # nothing trained


# ----------------------------------------------------------------------------- thread limits
def report_threads(cfg):
    """Train-function stand-in that does TensorFlow work and reports its process's thread limits."""
    import tensorflow as tf

    x = tf.random.normal((256, 256))
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start_wall < cfg["seconds"]:
        x = tf.linalg.matmul(x, x) / 256.0
    float(tf.reduce_sum(x))
    cpu_per_wall = (time.process_time() - start_cpu) / (time.perf_counter() - start_wall)
    return {"accuracy": 0.0, "memory_bytes": 0, "report": machine.thread_report(), "cpu_per_wall": cpu_per_wall}


@pytest.mark.slow
def test_thread_limits_respected_in_workers(tmp_path):
    configs = [{"i": i, "seconds": 1.5} for i in range(2)]
    run = sweep.run_sweep(configs, report_threads, tmp_path / "r.jsonl", num_workers=2, threads_per_worker=1,
                          progress=False)
    assert not run.failed, run.failed
    for r in run.records:
        rep = r["report"]
        assert rep["tf_intra_op"] == 1 and rep["tf_inter_op"] == 1
        assert all(rep[var] == "1" for var in machine.THREAD_ENV_VARS)
        assert all(n <= 1 for n in rep["blas_threads"])
        # one compute thread cannot use more than one core's worth of CPU time (contention only lowers it)
        assert r["cpu_per_wall"] < 1.3
    # default split: cores // workers
    assert sweep.run_sweep(configs[:1], report_threads, tmp_path / "d.jsonl", num_workers=1,
                           progress=False, warmup=False, max_new=0).threads_per_worker == machine.cores()


def test_measure_speedup_on_work_that_parallelises_perfectly(tmp_path):
    # sleeping needs no CPU, so K workers finish K times sooner even on a busy machine: the oracle is K. Three
    # interleaved repeats (their median), as measure_speedup offers against a load that drifts: with one, a stall
    # of the busy suite (three test processes) during the 1-worker run once gave a speedup of 3.8
    marks = tmp_path / "m"
    marks.mkdir()
    df = sweep.measure_speedup(toy_configs(4), Toy(str(marks), sleep=0.5), workers=(1, 2), tensorflow=False,
                               repeats=3)
    assert list(df.workers) == [1, 2] and list(df.threads_per_worker) == [machine.cores(),
                                                                         max(1, machine.cores() // 2)]
    assert df.speedup.iloc[0] == 1.0 and 1.5 < df.speedup.iloc[1] < 2.5
    assert df.wall_s.iloc[0] >= 4 * 0.5 and (df.cores_used < 0.5).all()  # asleep, not computing
    with pytest.raises(ValueError, match="repeats"):
        sweep.measure_speedup(toy_configs(1), Toy(str(marks)), repeats=0)


@pytest.mark.slow
def test_sigkill_of_a_notebook_kernel_leaves_no_worker_behind(tmp_path):
    # the Binder case: a kernel running the sweep is killed (OOM killer, "restart kernel" after a hang)
    import psutil
    from jupyter_client import KernelManager

    marks, out = tmp_path / "m", tmp_path / "r.jsonl"
    marks.mkdir()
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        kc.execute(ORPHAN_SCRIPT.format(tests=str(HERE), marks=str(marks), out=str(out)))
        kernel = psutil.Process(km.provisioner.process.pid)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(marks.iterdir())) < 2:
            time.sleep(0.1)
        workers = {int(p.name.split(".")[1]) for p in marks.iterdir()}
        children = [c.pid for c in kernel.children(recursive=True)]
        assert len(workers) == 2 and workers <= set(children)
        kernel.kill()
        assert wait_gone(children) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_worker_count_has_one_check_and_the_cores_refusal_is_labkit_scales(monkeypatch):
    """run_sweep's num_workers, `labkit sweep --workers` and `labkit scale --np` meet one check each way."""
    from labkit.base import machine
    from labkit.scale import scaling
    from labkit.sweep import runner
    monkeypatch.setattr(machine, "cores", lambda: 3)
    assert runner.check_workers(3, oversubscribe=False) == 3 and runner.check_workers(9) == 9
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=f"^num_workers must be an int >= 1; got {bad!r}$"):
            runner.check_workers(bad)
    with pytest.raises(ValueError, match=r"^--workers 4 starts more worker processes than this machine has "
                                         r"cores \(3\); .* Use --workers up to 3, or pass --oversubscribe"):
        runner.check_workers(4, "--workers", oversubscribe=False)
    with pytest.raises(ValueError, match=r"^--np 4 starts more ranks than this machine has cores \(3\); .*"
                                         r"whole --timeout\. Use --np up to 3, or pass --oversubscribe"):
        scaling.check_cores([1, 4], env={})
    with pytest.raises(ValueError, match="num_workers"):
        sweep.run_sweep([{"i": 1}], lambda c: {}, "unused.jsonl", num_workers=0)


def test_starting_over_keeps_the_old_results_until_a_new_one_lands(tmp_path):
    """resume=False empties the results file only when its first new result lands: a sweep stopped before then
    (here: nothing to train) leaves the old results as they were."""
    out = tmp_path / "r.jsonl"
    configs = toy_configs(3)
    sweep.run_sweep(configs, Toy(str(tmp_path)), out, tensorflow=False, progress=False)
    before = out.read_bytes()
    none = sweep.run_sweep(configs, Toy(str(tmp_path)), out, resume=False, max_new=0, tensorflow=False,
                           progress=False)
    assert none.ran == 0 and out.read_bytes() == before
    one = sweep.run_sweep(configs[:1], Toy(str(tmp_path)), out, resume=False, tensorflow=False, progress=False)
    assert one.ran == 1 and [r["config"]["i"] for r in sweep.load_results(out)] == [0]  # started over


def leave_a_temp_file() -> str:
    """A worker's temporary file that its own clean-up would remove (as TensorFlow's autograph modules)."""
    import tempfile
    fd, name = tempfile.mkstemp(suffix=".py")
    os.close(fd)
    return name


def test_killed_workers_leave_no_temporary_file(tmp_path, monkeypatch):
    import multiprocessing.util

    from labkit.sweep import workerpool
    multiprocessing.util.get_temp_dir()  # this process's own (the fork server's socket), made before TMPDIR is ours
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    pool = workerpool.new_pool(1, threads=1, tensorflow=False)
    left = pool.submit(leave_a_temp_file).result(timeout=120)
    assert Path(left).exists() and Path(left).parent == Path(pool.labkit_tmp)
    workerpool.kill_pool(pool)
    assert not Path(pool.labkit_tmp).exists() and list(tmp_path.iterdir()) == []


def report_env(name: str) -> tuple:
    """A worker's view: one environment variable, its folder, and its parent's process id."""
    return os.environ.get(name), os.getcwd(), os.getppid()


def test_a_worker_sees_the_environment_and_folder_its_pool_was_made_in(tmp_path, monkeypatch):
    """The fork server keeps the environment of its own start; each pool's workers get the one of the pool's."""
    from labkit.sweep import workerpool
    for value in ("first", "second"):
        (tmp_path / value).mkdir()
        monkeypatch.chdir(tmp_path / value)
        monkeypatch.setenv("LABKIT_TEST_POOL_ENV", value)
        pool = workerpool.new_pool(1, threads=1, tensorflow=False)
        try:
            seen, folder, _ = pool.submit(report_env, "LABKIT_TEST_POOL_ENV").result(timeout=120)
        finally:
            workerpool.kill_pool(pool)
        assert (seen, folder) == (value, str(tmp_path / value))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked by a server on Linux only")
def test_every_pool_is_forked_from_one_server_that_holds_tensorflow():
    import psutil

    from labkit.sweep import workerpool
    assert workerpool.start_method() == "forkserver"
    workerpool._stop_server()  # one an earlier test started with other settings would spawn these pools
    parents = set()
    for _ in range(2):
        pool = workerpool.new_pool(2, threads=1)  # workers that train with TensorFlow
        try:
            parents |= {pool.submit(report_env, "HOME").result(timeout=120)[2] for _ in range(4)}
        finally:
            workerpool.kill_pool(pool)
    assert len(parents) == 1 and parents != {os.getpid()}
    server = psutil.Process(parents.pop())
    assert server.ppid() == os.getpid() and "multiprocessing.forkserver" in " ".join(server.cmdline())
    assert any("libtensorflow" in m.path for m in server.memory_maps()), "TensorFlow is imported before the fork"


def _servers() -> list:
    import psutil
    return [c for c in psutil.Process().children() if "multiprocessing.forkserver" in " ".join(c.cmdline())]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked by a server on Linux only")
def test_the_server_ends_after_the_sweeps_and_a_pool_it_cannot_serve_is_spawned(tmp_path, monkeypatch):
    """A pool made with another hash seed than the server started with (set_seed(n) sets it) never gets the
    server's: with no worker of the server left, the server starts again with the pool's settings (one import
    instead of one per worker); while one is left, the pool is spawned. And no server is left SERVER_IDLE_S after
    the sweeps that used it."""
    from labkit.sweep import workerpool
    workerpool._stop_server()  # a server an earlier test started outside a sweep
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with workerpool.one_server():
        seen = []
        for seed in ("0", "5"):  # one after the other: the first pool's worker is gone when the second starts
            monkeypatch.setenv("PYTHONHASHSEED", seed)
            pool = workerpool.new_pool(1, threads=1, tensorflow=False)
            try:
                seen.append((pool.submit(report_env, "PYTHONHASHSEED").result(timeout=120)[::2],
                             [s.pid for s in _servers()]))
            finally:
                workerpool.kill_pool(pool)
        ((seen0, forked_by0), servers0), ((seen5, forked_by5), servers5) = seen
        assert (seen0, seen5) == ("0", "5") and os.getpid() not in (forked_by0, forked_by5)
        assert servers0 == [forked_by0] and servers5 == [forked_by5] and forked_by0 != forked_by5  # started again
        held = workerpool.new_pool(1, threads=1, tensorflow=False)  # a worker of the seed-5 server stays
        try:
            assert held.submit(report_env, "PYTHONHASHSEED").result(timeout=120)[0] == "5"
            monkeypatch.setenv("PYTHONHASHSEED", "7")
            pool = workerpool.new_pool(1, threads=1, tensorflow=False)
            try:
                seen7, _, spawned_by = pool.submit(report_env, "PYTHONHASHSEED").result(timeout=120)
            finally:
                workerpool.kill_pool(pool)
        finally:
            workerpool.kill_pool(held)
        assert seen7 == "7" and spawned_by == os.getpid() and [s.pid for s in _servers()] == [forked_by5]
    monkeypatch.setattr(workerpool, "SERVER_IDLE_S", 1.0)
    for _ in range(2):  # a sweep right after another uses the same server; it goes once they have all ended
        run = sweep.run_sweep(toy_configs(2), Toy(str(tmp_path)), tmp_path / "r.jsonl", num_workers=2,
                              tensorflow=False, progress=False, resume=False)
        assert run.ran == 2 and len(_servers()) == 1
    deadline = time.monotonic() + 15
    while _servers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _servers() == []
