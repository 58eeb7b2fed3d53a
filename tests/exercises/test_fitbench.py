"""labkit.exercises.fitbench: the fit-side images/s from batch-end marks (hand-computed cases, steps_per_execution
included), the variants' edits still apply to keras_hvd.py, and one tiny real comparison's table (no timing
asserted)."""
import numpy as np
import pytest

from labkit.exercises import check_hvd, fitbench


def _rank(step_times, cpu_times, every=1):
    """Marks as hvd_harness --timing records them: one per `every` steps (steps_per_execution)."""
    ends, cpus = np.cumsum(step_times)[every - 1::every], np.cumsum(cpu_times)[every - 1::every]
    return {"batch_end_s": list(ends), "batch_cpu_s": list(cpus),
            "batch_index": list(range(every - 1, len(step_times), every))}


def test_images_per_sec_from_marks_by_hand():
    # rank 0: 2 warm-up steps (slow), then 2 blocks of 2 steps at 0.1 s and 0.2 s; rank 1 twice as fast
    r0 = _rank([9, 9, 0.1, 0.1, 0.2, 0.2], [1, 1, 0.3, 0.3, 0.3, 0.3])
    r1 = _rank([9, 9, 0.05, 0.05, 0.1, 0.1], [1, 1, 0.2, 0.2, 0.2, 0.2])
    out = fitbench.fit_images_per_sec([r0, r1], batch_size=8, warmup_steps=2, steps=2)
    blocks = [16 / 0.2 + 16 / 0.1, 16 / 0.4 + 16 / 0.2]  # images/s of each block, summed over the ranks
    assert out["images_per_sec"] == pytest.approx(np.mean(blocks))
    assert out["images_per_sec_std"] == pytest.approx(np.std(blocks, ddof=1))
    assert out["cpu_step_time_s"] == pytest.approx(0.25)  # median of rank 0's 0.3 and rank 1's 0.2
    assert out["step_time_p10_s"] == pytest.approx(0.1)  # the slower rank's 10th percentile (numpy's linear rule)


def test_steps_per_execution_marks_spread_their_time_over_their_steps():
    steps = [1.0] * 4 + [0.1] * 4 + [0.3] * 4
    out = fitbench.fit_images_per_sec([_rank(steps, steps, every=4)], batch_size=10, warmup_steps=4, steps=4)
    assert out["images_per_sec"] == pytest.approx(np.mean([40 / 0.4, 40 / 1.2]))
    with pytest.raises(ValueError, match="warmup_steps=2"):
        fitbench.fit_images_per_sec([_rank(steps, steps, every=4)], batch_size=10, warmup_steps=2, steps=4)


def test_every_variant_still_applies_to_the_reference():
    src = check_hvd.REFERENCE.read_text()
    for name, edits in fitbench.VARIANTS:
        assert fitbench._edited(src, edits) != src or not edits, name


@pytest.mark.parametrize("kw, word", [({"rounds": 0}, "rounds"), ({"batch_size": 0}, "batch_size"),
                                      ({"np_": True}, "np_")])
def test_bad_settings_are_one_line_before_any_launch(kw, word):
    with pytest.raises(ValueError, match=word):
        fitbench.compare(**kw)


@pytest.mark.horovod
@pytest.mark.slow
def test_tiny_comparison_table():
    df = fitbench.compare(2, batch_size=4, steps=2, repeats=1, warmup_steps=2, rounds=1)
    assert list(df["path"]) == ["custom_loop", "fit"] and (df["images_per_sec"] > 0).all()
    assert (df["cpu_step_time_s"] > 0).all()
    s = fitbench.summary(df)
    assert s["ratio"] == pytest.approx(s["fit_images_per_sec"] / s["custom_loop_images_per_sec"])
    assert (s["np"], s["batch_size"], s["threads"]) == (2, 4, 1)


def test_sigterm_stops_fit_bench_in_one_line_and_leaves_no_lock(tmp_path):
    """SIGTERM while fit-bench runs (its launch stood in for by a wait): exit 143, one line, the --json lock file
    removed. The default action ended the process and left .r.json.lock beside the results file."""
    import subprocess
    import sys
    code = ("import os, signal, sys, time\n"
            "from labkit.exercises import fitbench\n"
            "def bench(a):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "fitbench._bench = bench\n"
            f"sys.exit(fitbench.cli_main(['--np', '1', '--json', {str(tmp_path / 'r.json')!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["labkit fit-bench: stopped by SIGTERM; every process of the launch "
                                                "was killed"]
    assert list(tmp_path.iterdir()) == []
