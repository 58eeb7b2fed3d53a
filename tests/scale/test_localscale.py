"""labkit.scale.probe (the machine's parallel limit) and labkit.scale.localscale (scaling on one machine, taken
apart)."""
from __future__ import annotations

import pandas as pd
import pytest

from helpers import fake_paired, fake_run, no_separate_launch
from labkit.scale import localscale, probe, scaling


def test_gemm_probe_one_process_counts_real_flops():
    one = probe.gemm_probe(1, seconds=0.3, n=128)
    assert one["processes"] == 1 and one["speedup"] == pytest.approx(1.0)
    # a single-thread float32 GEMM on any CPU of this century: between 0.1 and 1000 GFLOP/s
    assert 0.1 < one["gflops_total"] < 1000


def test_gemm_probe_against_a_given_base():
    two = probe.gemm_probe(2, seconds=0.3, n=128, base=1.0)
    assert len(two["gflops_each"]) == 2
    assert two["speedup"] == pytest.approx(sum(two["gflops_each"]))
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)


@pytest.mark.parametrize("kw, word", [({"processes": 0}, "processes"), ({"processes": 1, "seconds": 0}, "seconds"),
                                      ({"processes": 1, "n": 4}, "n must")])
def test_probe_bad_input_names_the_parameter(kw, word):
    with pytest.raises(ValueError, match=word):
        probe.gemm_rates(**kw)


def test_decompose_takes_the_three_curves_apart(monkeypatch):
    # compute 10 ms alone, 12 ms when two share the chip; the exchange adds 5 ms; GEMMs keep 0.95
    monkeypatch.setattr(scaling, "run", no_separate_launch)
    monkeypatch.setattr(scaling, "run_paired", fake_paired(
        fake_run(lambda n, sync, b: (10 if n == 1 else 12) + (5 if sync and n > 1 else 0))))
    monkeypatch.setattr(probe, "gemm_probe", lambda n, seconds, base=None: {
        "gflops_total": 100.0 * n * (1 if n == 1 else 0.95), "speedup": n * (1 if n == 1 else 0.95),
        "efficiency": 1 if n == 1 else 0.95})
    table, hvd, free = localscale.decompose([2], steps=3)
    assert list(table.workers) == [1, 2]  # one worker is always measured: the baseline
    row = table.set_index("workers").loc[2]
    assert row.no_sync_efficiency == pytest.approx(10 / 12)
    assert row.horovod_efficiency == pytest.approx(10 / 17)
    assert row.horovod_vs_machine == pytest.approx(10 / 17 / 0.95)
    assert bool(row.in_sync) and not free.set_index("np").loc[2, "in_sync"]


@pytest.mark.parametrize("smoke, window", [("0", probe.WINDOW_S), ("1", probe.SMOKE_WINDOW_S)])
def test_the_probe_window_is_a_size_smoke_scale_shrinks(monkeypatch, smoke, window):
    monkeypatch.setenv("LABKIT_SMOKE", smoke)
    monkeypatch.setattr(scaling, "run", no_separate_launch)
    monkeypatch.setattr(scaling, "run_paired", fake_paired(fake_run(lambda n, sync, b: 10)))
    seen = []
    monkeypatch.setattr(probe, "gemm_probe", lambda n, seconds, base=None: seen.append(seconds) or {
        "gflops_total": 100.0 * n, "speedup": float(n), "efficiency": 1.0})
    localscale.decompose([2], steps=3, progress=False)
    assert seen == [window, window] and probe.SMOKE_WINDOW_S < probe.WINDOW_S == 2.0
    localscale.decompose([2], steps=3, progress=False, probe_seconds=0.5)  # the caller's own window stands
    assert seen[-2:] == [0.5, 0.5]


def test_both_curves_divide_by_one_baseline_the_worker_without_exchange(monkeypatch):
    """A 1-worker launch with Horovod 1 ms slower than without: both curves still divide by the one without."""
    monkeypatch.setattr(scaling, "run", no_separate_launch)
    monkeypatch.setattr(scaling, "run_paired", fake_paired(
        fake_run(lambda n, sync, b: (10 if n == 1 else 12) + (1 if sync else 0) + (4 if sync and n > 1 else 0))))
    monkeypatch.setattr(probe, "gemm_probe", lambda n, seconds, base=None: {
        "gflops_total": 100.0 * n, "speedup": float(n), "efficiency": 1.0})
    table, hvd, free = localscale.decompose([2], steps=3)
    one, two = table.set_index("workers").loc[1], table.set_index("workers").loc[2]
    assert two.horovod_speedup == pytest.approx(2 * 10 / 17) and two.horovod_efficiency == pytest.approx(10 / 17)
    assert one.horovod_speedup == pytest.approx(10 / 11)  # the exchange's cost at one worker shows, not hidden
    assert two.horovod_speedup == pytest.approx(hvd.set_index("np").loc[2, "speedup"])  # one number, printed twice
    assert "1 worker without the exchange" in table.attrs["baseline"]


def test_above_bound_names_a_superlinear_speedup():
    table = pd.DataFrame({"workers": [1, 2], "gemm_speedup": [1.0, 1.92], "no_sync_speedup": [1.0, 1.75],
                          "horovod_speedup": [1.0, 2.15]})
    line = localscale.above_bound(table, cores=2)
    assert "2.15x with Horovod at 2 workers, above the bound 1.92x" in line and "\n" not in line
    assert "without the exchange" not in line
    assert localscale.above_bound(table.assign(horovod_speedup=[1.0, 1.6]), cores=2) is None
    assert "above the bound 1.00x" in localscale.above_bound(table.assign(gemm_speedup=[1.0, 2.0]), cores=1)


@pytest.mark.parametrize("call, word", [
    (lambda: localscale.decompose([0]), "workers"),
    (lambda: localscale.decompose([2], threads=2), "threads"),
])
def test_bad_input_names_the_parameter(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def _fake_controller_run(step_ms, calls):
    """scaling.run_paired stand-in for controller_cost: step_ms(launcher, env, sync, round) -> ms, for the
    launch's blocks with (sync True) and without the exchange; records each launch."""
    def run_paired(nps, *, batch_size=64, launcher="auto", env_extra=None, **kw):
        assert "sync" not in kw
        r = sum(1 for c in calls if c == (launcher, tuple(sorted(env_extra.items()))))
        calls.append((launcher, tuple(sorted(env_extra.items()))))
        frames = []
        for sync in (True, False):
            t = step_ms(launcher, env_extra, sync, r) / 1e3
            ranks = [{"controller": launcher, "tuning": dict(env_extra), "thread_cpu_ms_per_step":
                      {"training": 9.0, "horovod_background": 1.0 + sync + i}} for i in range(2)]
            frames.append(pd.DataFrame([{"np": nps[0], "step_time_s": t, "cpu_step_time_s": 0.8 * t,
                                         "in_sync": sync, "ranks": ranks}]))
        return tuple(frames)
    return run_paired


def test_controller_cost_interleaves_the_settings_and_takes_medians(monkeypatch):
    monkeypatch.setattr(localscale, "mpi_available", lambda: True)
    calls = []
    # no exchange 9 ms under Gloo, 10 under MPI; Gloo's exchange 14 ms; MPI's 10, 11 and then 30 ms (a busy spell)
    mpi = [10.0, 11.0, 30.0]
    monkeypatch.setattr(scaling, "run", no_separate_launch)
    monkeypatch.setattr(scaling, "run_paired", _fake_controller_run(
        lambda launcher, env, sync, r: (9.0 if launcher == "gloo" else 10.0) if not sync
        else 14.0 if launcher == "gloo" else mpi[r], calls))
    settings = [("Gloo", "gloo", {}), ("MPI, tuned", "mpi", {"HOROVOD_CYCLE_TIME": "0.2"})]
    cost = localscale.controller_cost(64, settings=settings, rounds=3, steps=5)
    gloo, tuned = (), (("HOROVOD_CYCLE_TIME", "0.2"),)
    # every round runs every setting, each in one launch with and without the exchange
    assert calls == [("gloo", gloo), ("mpi", tuned)] * 3
    row = cost.set_index("label").loc["MPI, tuned"]
    assert row.horovod_step_ms == pytest.approx(11.0)  # the median of 10, 11, 30: the busy spell does not count
    assert row.vs_no_sync == pytest.approx(10 / 11)
    assert row.vs_best_no_sync == pytest.approx(9 / 11)  # against Gloo's faster run without exchange
    assert row.horovod_cpu_ms == pytest.approx(0.8 * 11)
    assert row.horovod_hvd_thread_cpu_ms == pytest.approx(2.5) and row.no_sync_hvd_thread_cpu_ms == pytest.approx(1.5)
    assert row.settings == "HOROVOD_CYCLE_TIME=0.2" and row.workers_saw == {"HOROVOD_CYCLE_TIME": "0.2"}
    assert row.controller == "mpi" and bool(row.in_sync) and row.horovod_all_step_ms == [10.0, 11.0, 30.0]
    assert cost.set_index("label").loc["Gloo"].vs_no_sync == pytest.approx(9 / 14)
    assert cost.set_index("label").loc["Gloo"].vs_best_no_sync == pytest.approx(9 / 14)
    assert cost.set_index("label").loc["Gloo"].settings == "defaults"


@pytest.mark.parametrize("kw, word", [
    ({"batch": 0}, "batch"), ({"np_": 1}, "np_"), ({"rounds": 0}, "rounds"), ({"settings": []}, "settings"),
    ({"settings": [("x", "nccl", {})]}, "settings"),
    ({"settings": [("x", "mpi", {"HOROVOD_CYCLE_TIME": 0.2})]}, "settings"),
    ({"model": "nope"}, "model"),
])
def test_controller_cost_bad_input_names_the_parameter(kw, word, monkeypatch):
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("no launch on bad input"))
    monkeypatch.setattr(scaling, "run_paired", lambda *a, **k: pytest.fail("no launch on bad input"))
    with pytest.raises(ValueError, match=word):
        localscale.controller_cost(**kw)


def test_controller_cost_without_mpi_says_so_before_any_launch(monkeypatch):
    monkeypatch.setattr(localscale, "mpi_available", lambda: False)
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("no launch without MPI"))
    monkeypatch.setattr(scaling, "run_paired", lambda *a, **k: pytest.fail("no launch without MPI"))
    with pytest.raises(RuntimeError, match="Open MPI"):
        localscale.controller_cost(64)


def test_controller_cost_runs_both_controllers_for_real():
    """Two workers under Gloo and under MPI with tuned settings: the workers report the controller the
    launcher chose and the settings it passed, and end in sync."""
    pytest.importorskip("horovod.tensorflow")
    if not localscale.mpi_available():
        pytest.skip("Horovod here was built without MPI, or no mpirun (Open MPI) is on PATH")
    settings = [localscale.CONTROLLERS[0], localscale.CONTROLLERS[-1]]
    cost = localscale.controller_cost(16, settings=settings, rounds=1, steps=5, repeats=1, warmup_steps=2)
    assert cost.controller.tolist() == ["gloo", "mpi"]
    assert cost.workers_saw.tolist() == [{}, {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.1"}]
    assert cost.in_sync.all() and (cost.horovod_step_ms > 0).all() and (cost.no_sync_step_ms > 0).all()


def test_controller_results_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(localscale, "open_mpi_version", lambda: "Open MPI 9.9")
    cost = pd.DataFrame([{"label": "Gloo", "vs_no_sync": 0.66, "in_sync": True, "workers_saw": {},
                          "horovod_all_step_ms": [14.0, 15.0]}])
    doc = localscale.controller_results(cost, model="small_cnn", batch_per_worker=64)
    path = tmp_path / "controllers.json"
    path.write_text(__import__("json").dumps(doc))
    back = localscale.load_controller_results(path)
    assert back["mpi"] == "Open MPI 9.9" and back["model"] == "small_cnn" and back["cores"] >= 1
    assert pd.DataFrame(back["rows"]).to_dict("records") == cost.to_dict("records")


@pytest.mark.parametrize("argv, word", [(["--rounds", "0"], "--rounds"), (["--batch-size", "0"], "--batch-size"),
                                        (["--model", "nope"], "model")])
def test_controller_cli_bad_input_says_which_before_any_launch(argv, word, monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("no launch on bad input"))
    monkeypatch.setattr(scaling, "run_paired", lambda *a, **k: pytest.fail("no launch on bad input"))
    assert localscale.main(argv + ["--out", "/nonexistent/x.json"]) == 2
    assert word in capsys.readouterr().err


def test_the_committed_controller_measurement_is_complete():
    """The measurement 04 shows where MPI is missing: every setting of CONTROLLERS, workers in sync."""
    doc = localscale.load_controller_results()
    rows = pd.DataFrame(doc["rows"]).set_index("label")
    assert list(rows.index) == [label for label, _, _ in localscale.CONTROLLERS]
    assert rows.in_sync.all() and rows.controller.tolist() == [c for _, c, _ in localscale.CONTROLLERS]
    for label, _, env in localscale.CONTROLLERS:
        assert rows.loc[label, "workers_saw"] == env  # the workers ran with the settings the table names
    assert doc["mpi"].startswith("Open MPI") and doc["horovod"] == "0.28.1"
