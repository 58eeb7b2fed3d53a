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
from hypothesis import given, settings, strategies as st

from labkit import sweep

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
        return {"accuracy": 0.1 * (i % 7), "params": 1000 + 10 * i, "note": f"toy {i}"}


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


# ----------------------------------------------------------------------------- configs and memory
def test_seed000_configs_and_paper_param_formula():
    configs = sweep.seed000_configs()
    assert len(configs) == 16
    assert {(c["filters"], c["filter_size"], c["pool_size"], c["extra_conv"]) for c in configs} == {
        (f, k, p, e) for f in (20, 32) for k in (5, 3) for p in (3, 2) for e in (False, True)}
    assert len({sweep.config_name(c) for c in configs}) == 16
    # hand count of f20_k5_p3: conv1 (5*5*3+1)*20 = 1520; conv2 (5*5*20+1)*40 = 20040;
    # 32 -> 15 -> 7 after two 3x3/2 pools, fc (7*7*40+1)*10 = 19610
    assert sweep.matlab_param_count(configs[0]) == 1520 + 20040 + 19610
    assert sweep.matlab_param_count(configs[0], include_mean_image=True) == 1520 + 20040 + 19610 + 3072


def test_paper_formula_matches_keras_models():
    from labkit.models.cifar import seed000_net

    for cfg in sweep.seed000_configs():
        assert sweep.count_params(seed000_net(**cfg)) == sweep.matlab_param_count(cfg), cfg


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
        assert r["status"] == "ok" and r["params"] == 1000 + 10 * i and r["memory_bytes"] == 4 * (1000 + 10 * i)
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


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_sweep import Toy, toy_configs
from labkit import sweep
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
    with pytest.raises(ValueError, match="threads"):
        sweep.limit_threads(0)


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
    return {"accuracy": 0.0, "params": 0, "report": sweep.thread_report(), "cpu_per_wall": cpu_per_wall}


@pytest.mark.slow
def test_thread_limits_respected_in_workers(tmp_path):
    configs = [{"i": i, "seconds": 1.5} for i in range(2)]
    run = sweep.run_sweep(configs, report_threads, tmp_path / "r.jsonl", num_workers=2, threads_per_worker=1,
                          progress=False)
    assert not run.failed, run.failed
    for r in run.records:
        rep = r["report"]
        assert rep["tf_intra_op"] == 1 and rep["tf_inter_op"] == 1
        assert all(rep[var] == "1" for var in sweep.THREAD_ENV_VARS)
        assert all(n <= 1 for n in rep["blas_threads"])
        # one compute thread cannot use more than one core's worth of CPU time (contention only lowers it)
        assert r["cpu_per_wall"] < 1.3
    # default split: cores // workers
    assert sweep.run_sweep(configs[:1], report_threads, tmp_path / "d.jsonl", num_workers=1,
                           progress=False, warmup=False, max_new=0).threads_per_worker == sweep.available_cores()


# ----------------------------------------------------------------------------- CLI
def test_cli_help_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.cli_main(["--help"])
    assert exit_info.value.code == 0
    assert "--workers" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        sweep.cli_main(["--workers", "0"])
    assert exit_info.value.code == 2 and "--workers" in capsys.readouterr().err
    out = tmp_path / "r.jsonl"
    sweep.write_results(out, [{"key": "x", "status": "ok"}])
    assert sweep.cli_main(["--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert sweep.cli_main(["--configs", "f99_k5_p3"]) == 2
    assert sweep.cli_main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 17 and listed[1].split()[:2] == ["f20_k5_p3", str(1520 + 20040 + 19610)]


def test_recommend_picks_smallest_front_network_within_tolerance():
    import pandas as pd

    df = pd.DataFrame({"name": list("abcde"), "status": ["ok"] * 4 + ["error"],
                       "memory_bytes": [100, 200, 400, 300, None], "accuracy": [0.60, 0.79, 0.80, 0.70, None]})
    assert list(sweep.with_pareto(df).query("pareto").name) == ["a", "b", "c"]  # d is beaten by b
    assert sweep.recommend(df, max_accuracy_drop=0.02)["name"] == "b"
    assert sweep.recommend(df, max_accuracy_drop=0.0)["name"] == "c"
    assert sweep.recommend(df, max_accuracy_drop=0.5)["name"] == "a"
    assert sweep.recommend(df, memory_budget_bytes=300)["name"] == "b"
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        sweep.recommend(df, memory_budget_bytes=50)
    with pytest.raises(ValueError, match="max_accuracy_drop"):
        sweep.recommend(df, max_accuracy_drop=2)


@pytest.mark.slow
def test_cli_trains_real_networks_and_resumes(tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    args = ["--configs", "f20_k3_p2,f20_k3_p3", "--train-size", "64", "--test-size", "64", "--epochs", "1",
            "--out", str(out), "--no-progress"]
    assert sweep.cli_main(args) == 0
    records = sweep.load_results(out)
    assert [r["name"] for r in records] in (["f20_k3_p2", "f20_k3_p3"], ["f20_k3_p3", "f20_k3_p2"])
    for r in records:
        assert r["status"] == "ok" and 0 <= r["accuracy"] <= 1
        assert r["params"] == sweep.matlab_param_count(r["config"]) and r["memory_bytes"] == 4 * r["params"]
        assert r["memory_bytes_keras"] == r["memory_bytes"]  # labkit.models.cifar.memory_footprint agrees
    assert sweep.cli_main(args + ["--resume"]) == 0
    assert "trained 0, skipped 2" in capsys.readouterr().out


def test_measure_speedup_on_work_that_parallelises_perfectly(tmp_path):
    # sleeping needs no CPU, so K workers finish K times sooner even on a busy machine: the oracle is K
    marks = tmp_path / "m"
    marks.mkdir()
    df = sweep.measure_speedup(toy_configs(4), Toy(str(marks), sleep=0.5), workers=(1, 2), tensorflow=False)
    assert list(df.workers) == [1, 2] and list(df.threads_per_worker) == [sweep.available_cores(),
                                                                         max(1, sweep.available_cores() // 2)]
    assert df.speedup.iloc[0] == 1.0 and 1.5 < df.speedup.iloc[1] < 2.5
    assert df.wall_s.iloc[0] >= 4 * 0.5 and (df.cores_used < 0.5).all()  # asleep, not computing
    with pytest.raises(ValueError, match="repeats"):
        sweep.measure_speedup(toy_configs(1), Toy(str(marks)), repeats=0)
