"""A Horovod run every rank can resume from (labkit.scale.checkpoint, hvd_train --checkpoint/--resume): killed with
SIGKILL after a checkpoint and resumed, it ends with the same weights, bit for bit, as a run never stopped; a rank
killed mid-step ends the launch naming it; a checkpoint of another run is refused in one line before any launch."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT
from labkit.scale import checkpoint
from labkit.scale.settings import RunSettings

SMALL = dict(batch_size=8, steps=4, repeats=2, warmup_steps=4, threads=1, checkpoint_every=2)  # 12 steps
TOTAL = 12
RUN = {"model": "small_cnn", "size": 2, "batch_size": 8, "seed": 0, "data": "synthetic", "num_examples": 1024,
       "image_size": 32, "classes": 10, "lr": 0.01, "scale_lr": False, "lr_warmup_steps": 0, "momentum": 0.9}


# --- the checkpoint file and its refusals (no TensorFlow, no launch) ---------------------------------------------

def test_a_checkpoint_reads_back_whole_and_names_its_state(tmp_path):
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64)]
    checkpoint.write(tmp_path, {**RUN, "total_steps": TOTAL, "step": 6}, arrays)
    back = checkpoint.read_arrays(tmp_path)
    assert [a.tolist() for a in back] == [a.tolist() for a in arrays] and back[1].dtype == np.int64
    assert checkpoint.status(tmp_path) == "stopped" and checkpoint.read_meta(tmp_path)["step"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz"]  # no temporary file left
    checkpoint.write(tmp_path, {**RUN, "total_steps": TOTAL, "step": TOTAL}, arrays)
    assert checkpoint.status(tmp_path) == "done"


@pytest.mark.parametrize("change, word", [
    ({"model": "convblock_net"}, "model"), ({"size": 4}, "worker count (--np)"),
    ({"batch_size": 16}, "--batch-size"), ({"seed": 1}, "seed"), ({"lr": 0.1}, "lr"),
])
def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path, change, word):
    checkpoint.write(tmp_path, {**RUN, "total_steps": TOTAL, "step": 6}, [np.zeros(3, np.float32)])
    assert checkpoint.problem(tmp_path, {**RUN, "total_steps": TOTAL}, resume=True) is None
    text = checkpoint.problem(tmp_path, {**RUN, **change, "total_steps": TOTAL}, resume=True)
    assert text.startswith("--resume: the checkpoint in") and word in text and "\n" not in text, text


def test_resume_needs_a_checkpoint_and_a_new_run_never_overwrites_one(tmp_path):
    assert "no checkpoint in" in checkpoint.problem(tmp_path, RUN, resume=True)
    assert checkpoint.problem(tmp_path, RUN, resume=False) is None
    checkpoint.write(tmp_path, {**RUN, "total_steps": TOTAL, "step": 6}, [np.zeros(3, np.float32)])
    assert "add --resume" in checkpoint.problem(tmp_path, RUN, resume=False)
    assert "past this run's 4 steps" in checkpoint.problem(tmp_path, {**RUN, "total_steps": 4}, resume=True)
    (tmp_path / "checkpoint.npz").write_bytes(b"half a file")
    assert "not a readable checkpoint" in checkpoint.problem(tmp_path, RUN, resume=True)


def test_settings_refuse_resume_without_a_checkpoint_or_over_several_launches():
    with pytest.raises(ValueError, match="--resume needs --checkpoint"):
        RunSettings(resume=True).check([2], flags=True)
    with pytest.raises(ValueError, match="checkpoint keeps one run"):
        RunSettings(checkpoint="ck").check([1, 2])
    with pytest.raises(ValueError, match="sync must be True with resume"):
        RunSettings(checkpoint="ck", resume=True, sync=False).check([2])
    argv = RunSettings(checkpoint="ck", resume=True, checkpoint_every=3).argv(2)
    assert argv[argv.index("--checkpoint") + 1] == "ck" and "--resume" in argv
    assert argv[argv.index("--checkpoint-every") + 1] == "3"


def test_the_resumed_schedule_skips_exactly_the_steps_done():
    from labkit.scale import hvd_train as ht
    plan = ht.schedule(4, 2, 4)  # warm-up 4, then 8 timed
    assert ht.remaining(plan, 0) == plan
    assert ht.remaining(plan, 3) == [("main", 1, False), ("main", 8, True)]
    assert ht.remaining(plan, 6) == [("main", 6, True)]
    assert ht.remaining(plan, 12) == []


# --- real launches: 2 workers, small_cnn, 12 steps ---------------------------------------------------------------

def _horovod():
    pytest.importorskip("horovod.tensorflow")


def _launch(folder, *extra, resume=False, timeout=240):
    from labkit.scale.launch import launch
    args = RunSettings(**SMALL, checkpoint=str(folder), resume=resume).argv(2)
    return launch(2, [*args, *extra], launcher="gloo", timeout=timeout, progress=False)


def _left_behind(text: str) -> list:
    import psutil
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(text in part for part in p.info["cmdline"] or ()):
                out.append(p.info["cmdline"])
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    _horovod()
    ranks = _launch(tmp_path_factory.mktemp("whole") / "ck")
    assert [r["checkpoint"]["step"] for r in ranks] == [TOTAL, TOTAL]
    return [r["checksum"] for r in ranks]


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("kill_after", [6])
def test_killed_with_sigkill_and_resumed_ends_bit_for_bit_as_never_stopped(tmp_path, uninterrupted, kill_after):
    """The whole launch (launcher, ranks, watchdog's parent) is SIGKILLed while rank 0 stands after the
    checkpoint of step kill_after; --resume finishes the run: every rank's checksum equals the uninterrupted run's."""
    folder = tmp_path / "ck"
    code = ("import sys; from labkit.scale.launch import launch; "
            f"launch(2, sys.argv[1:], launcher='gloo', timeout=240, progress=False, out_dir={str(tmp_path / 'o')!r})")
    args = RunSettings(**SMALL, checkpoint=str(folder)).argv(2)
    # rank 0 stops for good before step kill_after + 1: the launch is killed there, not after the run ends
    proc = subprocess.Popen([sys.executable, "-c", code, *args, "--hang-rank", "0", "--fault-at-step",
                             str(kill_after)], cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 200
    try:
        while checkpoint.status(folder) == "none" or checkpoint.read_meta(folder)["step"] < kill_after:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert checkpoint.read_meta(folder)["step"] == kill_after
    deadline = time.time() + 30  # the launch's watchdog kills the ranks its dead parent left
    while _left_behind(str(folder)) and time.time() < deadline:
        time.sleep(0.5)
    assert _left_behind(str(folder)) == []
    ranks = _launch(folder, resume=True)
    assert [r["checkpoint"]["resumed_from"] for r in ranks] == [kill_after] * 2
    assert [r["checksum"] for r in ranks] == uninterrupted, "the resumed run's weights differ from the whole run's"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temporary file of a write


@pytest.mark.slow
@pytest.mark.horovod
def test_a_rank_killed_mid_step_ends_the_launch_naming_it(tmp_path):
    """kill -9 of rank 1 (no exception, no Python cleanup): the other rank does not hang; the launch ends within
    seconds of it, naming rank 1, and leaves no process."""
    _horovod()
    from labkit.scale.launch import HorovodRunError
    folder = tmp_path / "ck"
    t0 = time.perf_counter()
    with pytest.raises(HorovodRunError) as err:
        _launch(folder, "--kill-rank", "1", "--fault-at-step", "5", timeout=200)
    wall = time.perf_counter() - t0
    assert err.value.rank == 1 and "rank 1" in str(err.value).splitlines()[0], str(err.value)
    assert wall < 120, f"the launch took {wall:.0f} s to notice a dead rank"
    assert _left_behind(str(folder)) == []
    assert checkpoint.read_meta(folder)["step"] == 4  # the last checkpoint before the kill is whole


@pytest.mark.slow
@pytest.mark.horovod
def test_labkit_scale_refuses_a_checkpoint_of_another_worker_count_before_any_launch(tmp_path):
    checkpoint.write(tmp_path, {**RUN, "size": 4, "total_steps": TOTAL, "step": 6}, [np.zeros(3, np.float32)])
    proc = subprocess.run([sys.executable, "-m", "labkit.cli", "scale", "--np", "2", "--batch-size", "8",
                           "--steps", "4", "--repeats", "2", "--warmup-steps", "4", "--checkpoint", str(tmp_path),
                           "--resume"], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"labkit scale: error: --resume: the checkpoint in {tmp_path} is of another run: its worker count (--np) "
        "is 4, this run's is 2"], proc.stderr
    assert "controller" not in proc.stdout  # nothing launched
