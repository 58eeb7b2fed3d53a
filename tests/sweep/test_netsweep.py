"""labkit.sweep.networks: the MATLAB white paper's 16 networks, the paper's parameter formula, the trainer's input
checks and settings, the recommendation, and the `labkit sweep` command (help without TensorFlow, bad input,
the data set it names, no worker left after a SIGKILL)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from labkit.sweep import networks as netsweep
from labkit.sweep import runner as sweep


# ----------------------------------------------------------------------------- configs and the paper's count
def test_network_configs_and_paper_param_formula():
    configs = netsweep.network_configs()
    assert len(configs) == 16
    assert {(c["filters"], c["filter_size"], c["pool_size"], c["extra_conv"]) for c in configs} == {
        (f, k, p, e) for f in (20, 32) for k in (5, 3) for p in (3, 2) for e in (False, True)}
    assert len({netsweep.network_name(c) for c in configs}) == 16
    # hand count of f20_k5_p3: conv1 (5*5*3+1)*20 = 1520; conv2 (5*5*20+1)*40 = 20040;
    # 32 -> 15 -> 7 after two 3x3/2 pools, fc (7*7*40+1)*10 = 19610
    assert netsweep.network_name(configs[0]) == "f20_k5_p3"
    assert netsweep.matlab_param_count(configs[0]) == 1520 + 20040 + 19610
    assert netsweep.matlab_param_count(configs[0], include_mean_image=True) == 1520 + 20040 + 19610 + 3072


def test_paper_formula_matches_keras_models():
    # Keras is the oracle for the paper's hand formula; memory is labkit.models.cifar's (4 bytes / parameter)
    table = netsweep.config_table()
    assert (table.params == table.params_paper).all()
    assert list(table.memory_kb) == [4 * p / 1e3 for p in table.params]
    assert (table.mmacs > 0).all()


@pytest.mark.parametrize("name", ["filters", "filter_size", "pool_size"])
def test_paper_formula_rejects_sizes_below_one(name):
    cfg = {"filters": 20, "filter_size": 5, "pool_size": 3, "extra_conv": False, name: 0}
    with pytest.raises(ValueError, match=f"^{name} must be an int >= 1"):
        netsweep.matlab_param_count(cfg)
    with pytest.raises(ValueError, match="pool_size"):
        netsweep.matlab_param_count({**cfg, name: 5, "pool_size": 40})  # no feature map left


@pytest.mark.parametrize("field, value", [("epochs", 0), ("train_size", 0), ("test_size", -1), ("batch_size", 0),
                                          ("epochs", 1.5)])
def test_trainer_rejects_bad_settings_before_any_compute(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be an int >= 1"):
        netsweep.NetworkTrainer(**{field: value})


def test_trainer_settings_name_the_data_set(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))  # no Keras cache either
    name, why = netsweep.dataset_choice()
    assert name == "synthetic" and "CIFAR-10 was not found" in why
    trainer = netsweep.NetworkTrainer(epochs=2, train_size=100)
    assert trainer.settings() == {"epochs": 2, "train_size": 100, "test_size": None, "batch_size": 100,
                                  "lr": 0.01, "l2": 0.004, "seed": 0, "dropout": 0.0, "augment": False,
                                  "warmup_epochs": 0, "dataset": "synthetic"}
    assert trainer.name({"filters": 32, "filter_size": 3, "pool_size": 2, "extra_conv": True}) == "f32_k3_p2_x"


@pytest.mark.parametrize("field, value", [("dropout", 1.0), ("dropout", -0.1), ("dropout", True), ("augment", 1),
                                          ("warmup_epochs", 1), ("warmup_epochs", -1)])
def test_trainer_rejects_bad_overfitting_cures(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        netsweep.NetworkTrainer(**{field: value})


def test_dropout_adds_one_layer_and_no_weights():
    from labkit.models.cifar import sweep_net

    plain, dropped = sweep_net(), sweep_net(dropout=0.5)
    assert [x.name for x in dropped.layers if x.name not in {y.name for y in plain.layers}] == ["dropout"]
    assert dropped.count_params() == plain.count_params()
    with pytest.raises(ValueError, match="^dropout must be"):
        sweep_net(dropout=1)


@pytest.mark.slow
@pytest.mark.parametrize("cure", [{}, {"dropout": 0.5}, {"augment": True}])
def test_trainer_reports_train_and_test_accuracy(cure):
    # each cure trains end to end and the record carries both accuracies and the split sizes
    trainer = netsweep.NetworkTrainer(epochs=1, train_size=200, test_size=100, batch_size=50, **cure)
    record = trainer({"filters": 20, "filter_size": 3, "pool_size": 2, "extra_conv": False})
    assert 0 <= record["train_accuracy"] <= 1 and 0 <= record["accuracy"] <= 1
    assert record["train_images"] == 200 and record["test_images"] == 100


def test_recommend_picks_smallest_front_network_within_tolerance():
    import pandas as pd

    df = pd.DataFrame({"name": list("abcde"), "status": ["ok"] * 4 + ["error"],
                       "memory_bytes": [100, 200, 400, 300, None], "accuracy": [0.60, 0.79, 0.80, 0.70, None]})
    assert list(netsweep.with_pareto(df).query("pareto").name) == ["a", "b", "c"]  # d is beaten by b
    assert netsweep.recommend(df, max_accuracy_drop=0.02)["name"] == "b"
    assert netsweep.recommend(df, max_accuracy_drop=0.0)["name"] == "c"
    assert netsweep.recommend(df, max_accuracy_drop=0.5)["name"] == "a"
    assert netsweep.recommend(df, memory_budget_bytes=300)["name"] == "b"
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        netsweep.recommend(df, memory_budget_bytes=50)
    with pytest.raises(ValueError, match="max_accuracy_drop"):
        netsweep.recommend(df, max_accuracy_drop=2)


# ----------------------------------------------------------------------------- CLI
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert netsweep.cli_main(["--workers", "0"]) == 2  # run_sweep's check, naming the option
    assert capsys.readouterr().err == "labkit sweep: --workers must be an int >= 1; got 0\n"
    (tmp_path / "file.txt").write_text("x")
    assert netsweep.cli_main(["--out", str(tmp_path / "file.txt" / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit sweep: --out") and len(err.strip().splitlines()) == 1
    out = tmp_path / "r.jsonl"
    sweep.write_results(out, [{"key": "x", "status": "ok"}])
    assert netsweep.cli_main(["--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert netsweep.cli_main(["--configs", "f99_k5_p3"]) == 2
    assert "f99_k5_p3" in capsys.readouterr().err


def test_cli_overwrite_never_reads_the_file_it_discards(tmp_path, capsys, monkeypatch):
    """--overwrite starts --out over: what the file holds (a line load_results would refuse, say) is no reason
    to refuse, nor to advise --overwrite. check_writable still refuses a file that is not a sweep's own."""
    import types
    out = tmp_path / "r.jsonl"
    sweep.write_results(out, [{"key": "x", "status": "ok"}])
    calls = []

    def run_sweep(configs, trainer, out, **kw):
        calls.append(kw)
        return types.SimpleNamespace(records=[], failed=[], ran=0, skipped=0, wall_s=0.0, startup_s=0.0, out=out)

    def load_results(path):
        raise ValueError(f"results file {path} line 2 is not JSON; ... or start over with --overwrite")

    monkeypatch.setattr(netsweep.sweep, "run_sweep", run_sweep)  # the package's, as labkit sweep calls them
    monkeypatch.setattr(netsweep.sweep, "load_results", load_results)
    assert netsweep.cli_main(["--overwrite", "--out", str(out), "--configs", "f20_k5_p3", "--no-progress"]) == 0
    assert calls and calls[0]["resume"] is False and "--overwrite" not in capsys.readouterr().err
    assert netsweep.cli_main(["--resume", "--out", str(out), "--no-progress"]) == 2  # --resume reads it
    assert "--overwrite" in capsys.readouterr().err


def test_cli_resume_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    trainer = netsweep.NetworkTrainer.for_profile(epochs=1, train_size=64, test_size=64)
    cfg = netsweep.network_configs()[0]
    sweep.write_results(out, [{"key": sweep.config_key(cfg), "status": "ok", "accuracy": 0.2, "memory_bytes": 4,
                               "settings": trainer.settings()}])
    args = ["--out", str(out), "--resume", "--train-size", "64", "--test-size", "64", "--no-progress"]
    assert netsweep.cli_main(args + ["--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "epochs=1 there, 2 now" in err and len(err.strip().splitlines()) == 1


def test_cli_list(capsys):
    assert netsweep.cli_main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 17 and listed[1].split()[:2] == ["f20_k5_p3", str(1520 + 20040 + 19610)]


@pytest.mark.slow
def test_cli_trains_real_networks_names_its_data_and_resumes(tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    args = ["--configs", "f20_k3_p2,f20_k3_p3", "--train-size", "64", "--test-size", "64", "--epochs", "1",
            "--out", str(out), "--no-progress"]
    assert netsweep.cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "data set: " + netsweep.dataset_choice()[1] in printed
    records = sweep.load_results(out)
    assert sorted(r["name"] for r in records) == ["f20_k3_p2", "f20_k3_p3"]
    for r in records:
        assert r["status"] == "ok" and 0 <= r["accuracy"] <= 1 and r["settings"]["epochs"] == 1
        assert r["params"] == netsweep.matlab_param_count(r["config"]) and r["memory_bytes"] == 4 * r["params"]
    assert netsweep.cli_main(args + ["--resume"]) == 0
    assert "trained 0, skipped 2" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_sigkill_leaves_no_tensorflow_worker(tmp_path):
    import psutil

    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "labkit", "sweep", "--workers", "2", "--threads-per-worker", "1", "--epochs", "50",
           "--train-size", "500", "--test-size", "100", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        workers = []
        def loaded_worker(c):  # a worker with TensorFlow in memory (spawned and loaded, or forked by the
            try:               # fork server, which had loaded it); a child that just ended is none
                started = ("spawn_main" in " ".join(c.cmdline())
                           or "multiprocessing.forkserver" in " ".join(c.parent().cmdline()))
                return started and c.memory_info().rss > 150e6
            except (psutil.ZombieProcess, psutil.NoSuchProcess, AttributeError):
                return False

        while time.monotonic() < deadline and len(workers) < 2:  # both workers have TensorFlow loaded
            workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if loaded_worker(c)]
            time.sleep(0.5)
        assert len(workers) == 2
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    left = children
    while left and time.monotonic() < deadline:
        left = [p for p in left if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    assert left == []


def test_conv_block_net_bn_momentum_option():
    # 01's short workshop run needs faster-moving BatchNorm statistics; the default stays Keras's 0.99
    from labkit.models import recipes
    from labkit.models.cifar import convblock_net

    def moms(m):
        return {x.momentum for x in m.layers if x.__class__.__name__ == "BatchNormalization"}

    assert moms(convblock_net(width=4, block_depth=1)) == {0.99}
    assert moms(convblock_net(width=4, block_depth=1, bn_momentum=0.9)) == {0.9}
    assert recipes.convblock_options("full")["bn_momentum"] == 0.99
    with pytest.raises(ValueError, match="^bn_momentum must be"):
        convblock_net(bn_momentum=1.0)


@pytest.mark.parametrize("memory, workers, refused", [("512M", 1, True), ("1G", 2, True), ("2G", 2, False)])
def test_cli_refuses_workers_that_cannot_fit_in_memory(tmp_path, capsys, monkeypatch, memory, workers, refused):
    """LABKIT_MEMORY bounds the sweep's workers (650 MiB each) before any training, as labkit scale's batch."""
    import types
    calls = []
    monkeypatch.setattr(netsweep.sweep, "run_sweep", lambda *a, **kw: calls.append(kw) or types.SimpleNamespace(
        records=[], failed=[], ran=0, skipped=0, wall_s=0.0, startup_s=0.0, out=a[2]))
    monkeypatch.setenv("LABKIT_MEMORY", memory)
    args = ["--workers", str(workers), "--oversubscribe", "--out", str(tmp_path / "r.jsonl"), "--configs",
            "f20_k5_p3", "--no-progress"]
    assert netsweep.cli_main(args) == (2 if refused else 0)
    err = capsys.readouterr().err
    assert (calls == []) == refused and (err.count("\n") == 1) == refused
    if refused:
        assert err.startswith(f"labkit sweep: --workers {workers} cannot fit in memory") and "GiB available" in err


def test_cli_sigterm_is_named_with_its_own_exit_status(tmp_path, capsys, monkeypatch):
    """SIGTERM acts as Ctrl-C (results kept, workers ended) but is reported as itself: exit 143, not 130."""
    import signal

    from labkit.sweep import workerpool

    def run_sweep(*a, **kw):
        workerpool.raise_interrupt(signal.SIGTERM, None)

    monkeypatch.setattr(netsweep.sweep, "run_sweep", run_sweep)
    out = tmp_path / "r.jsonl"
    assert netsweep.cli_main(["--out", str(out), "--configs", "f20_k5_p3", "--no-progress"]) == 143
    assert capsys.readouterr().err == f"labkit sweep: stopped by SIGTERM; 0 finished results kept in {out} " \
                                      "(--resume continues)\n"
    monkeypatch.setattr(netsweep.sweep, "run_sweep", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
    assert netsweep.cli_main(["--out", str(out), "--configs", "f20_k5_p3", "--no-progress"]) == 130
    assert capsys.readouterr().err.startswith("labkit sweep: interrupted; 0 finished")
