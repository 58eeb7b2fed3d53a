"""labkit.launch: command lines, hosts and slots, the failing rank, and real Horovod launches.

The launches (marked horovod + slow) start horovodrun with Gloo on this machine: a crashed rank, a hung
rank and an interrupted launch, each of which must leave no process behind.
"""
import time
import uuid

import psutil
import pytest

from labkit import launch, scaling

needs_horovod = pytest.mark.skipif(launch.horovodrun_path() is None, reason="horovodrun not installed")
TINY = dict(batch_size=16, steps=3, repeats=2, warmup_steps=1, num_examples=256)


def test_build_command_for_each_launcher(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd = launch.build_command(2, ["--steps", "3"], launcher="gloo")
    assert cmd[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert cmd[-4:] == ["-m", "labkit.hvd_train", "--steps", "3"]
    assert "--mpi" in launch.build_command(2, launcher="mpi")
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


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_hung_rank_is_killed_at_the_timeout_with_no_orphans(tmp_path):
    marker = uuid.uuid4().hex
    args = scaling.train_args(**{**TINY, "warmup_steps": 0}, extra=["--hang-rank", "0", "--fault-at-step", "0"])
    timeout = 20
    t0 = time.perf_counter()
    with pytest.raises(launch.HorovodRunError) as e:
        launch.launch(2, args, timeout=timeout, progress=False, out_dir=tmp_path, marker=marker)
    assert time.perf_counter() - t0 < timeout + 15
    assert e.value.timed_out and "timeout=20" in str(e.value)
    assert _leftovers(marker, str(tmp_path)) == []


def test_failing_rank_is_the_cause_not_the_victim():
    tails = {0: ["Traceback (most recent call last):", "tensorflow.errors.UnknownError: Horovod has been shut down",
                 "[[{{node DistributedSGD_Allreduce/HorovodAllreduce_grads_0}}]]"],
             1: ["Traceback (most recent call last):", "RuntimeError: injected failure on rank 1"]}
    # Horovod names whichever exit it noticed first (here rank 0); the root cause is rank 1
    assert launch._failing_rank(["Process name: 0", "Exit code: 1"], tails) == 1
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
