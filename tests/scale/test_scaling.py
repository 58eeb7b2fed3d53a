"""labkit.scale.scaling: bookkeeping (summaries, efficiency, the JSON contract), the CLI, and real 2-rank runs.

The launches (marked horovod + slow) start horovodrun with Gloo on this machine: a 2-rank run whose
ranks end with equal weight checksums, and the control without DistributedOptimizer whose ranks drift.
"""
import json

import numpy as np
import pandas as pd
import pytest

from helpers import fake_launch, fake_rank  # noqa: E402
from labkit.scale import scaling
from labkit.scale.launch import horovodrun_path

needs_horovod = pytest.mark.skipif(horovodrun_path() is None, reason="horovodrun not installed")
TINY = dict(batch_size=16, steps=3, repeats=2, warmup_steps=1, num_examples=256)


def test_efficiency_from_throughput():
    df = pd.DataFrame({"np": [1, 2, 4], "images_per_sec": [100.0, 180.0, 300.0]})
    out = scaling.efficiency(df)
    assert list(out["speedup"]) == pytest.approx([1.0, 1.8, 3.0])
    assert list(out["efficiency"]) == pytest.approx([1.0, 0.9, 0.75])
    with pytest.raises(ValueError, match="base_np"):
        scaling.efficiency(df, base_np=3)


def test_summarize_sums_ranks_per_repeat_and_checks_sync():
    row = scaling.summarize([fake_rank(0, 2, [10.0, 12.0], "a"), fake_rank(1, 2, [11.0, 13.0], "a")])
    assert row["images_per_sec"] == pytest.approx(23.0)  # (21 + 25) / 2
    assert row["images_per_sec_std"] == pytest.approx(np.std([21.0, 25.0], ddof=1))
    assert row["in_sync"]
    assert not scaling.summarize([fake_rank(0, 2, [1.0], "a"), fake_rank(1, 2, [1.0], "b")])["in_sync"]


def test_to_json_follows_the_design_contract():
    rows = [scaling.summarize([fake_rank(0, 1, [10.0, 10.0], "x")]),
            scaling.summarize([fake_rank(0, 2, [9.0, 9.0], "y"), fake_rank(1, 2, [9.0, 9.0], "y")])]
    doc = scaling.to_json(scaling.efficiency(pd.DataFrame(rows)), model="small_cnn")
    assert [r["np"] for r in doc["runs"]] == [1, 2]
    assert doc["runs"][0]["efficiency"] == 1.0
    assert doc["runs"][1]["efficiency"] == pytest.approx(0.9)
    assert doc["runs"][1]["checksums"] == ["y", "y"] and doc["all_in_sync"]
    json.dumps(doc)  # plain JSON types only


def test_run_rejects_bad_arguments():
    with pytest.raises(ValueError, match="nps must be"):
        scaling.run([0])
    with pytest.raises(ValueError, match="scaling must be"):
        scaling.run([1], scaling="diagonal")
    with pytest.raises(ValueError, match="divisible"):
        scaling.run([1, 3], scaling="strong", batch_size=64)


def test_cli_help_and_bad_np(capsys):
    with pytest.raises(SystemExit) as e:
        scaling.cli_main(["--help"])
    assert e.value.code == 0
    assert "--np" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        scaling.cli_main(["--np", "1,zero"])
    assert e.value.code == 2
    assert "--np" in capsys.readouterr().err


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_cli_two_rank_gloo_run_ends_with_equal_checksums(tmp_path):
    out = tmp_path / "scale.json"
    rc = scaling.cli_main(["--np", "2", "--batch-size", "16", "--steps", "3", "--repeats", "2",
                           "--warmup-steps", "1", "--json", str(out), "--quiet", "--timeout", "240",
                           "--launcher", "gloo"])  # the default is mpirun where Horovod has MPI (test_launch)
    doc = json.loads(out.read_text())
    assert rc == 0
    assert all(r.get("controller") == "gloo" for r in doc["runs"])  # what the ranks themselves ran
    runs = {r["np"]: r for r in doc["runs"]}
    assert sorted(runs) == [2]
    assert len(runs[2]["checksums"]) == 2 and runs[2]["checksums"][0] == runs[2]["checksums"][1]
    assert runs[2]["global_batch_size"] == 32 and all(r["images_per_sec"] > 0 for r in runs.values())


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_without_distributed_optimizer_the_ranks_drift(tmp_path):
    ckpt = tmp_path / "ckpt"
    df = scaling.run(2, sync=False, progress=False, timeout=240, scale_lr=True, lr_warmup_steps=2, lr=0.01,
                     extra=["--checkpoint-dir", str(ckpt)], **TINY)
    ranks = df["ranks"].iloc[0]
    assert not df["in_sync"].iloc[0]
    assert ranks[0]["checksum"] != ranks[1]["checksum"]
    # each rank trained on its own half of the data (never the whole set twice)
    assert ranks[0]["examples_this_rank"] + ranks[1]["examples_this_rank"] == ranks[0]["examples_total"]
    # linear scaling rule with warmup: lr x 2 once the warmup is over
    assert ranks[0]["lr_final"] == pytest.approx(0.02)
    # rank 0 alone writes the checkpoint and the log: one line per progress report, not two
    assert (ckpt / "weights.h5").is_file()
    lines = (ckpt / "log.jsonl").read_text().splitlines()
    assert len(lines) == TINY["repeats"] and json.loads(lines[-1])["step"] == TINY["steps"] * TINY["repeats"]


def test_p10_and_cpu_efficiency_are_per_image_ratios():
    # strong scaling: np=2 halves the per-rank batch; equal time per image means efficiency 1
    df = pd.DataFrame({"np": [1, 2], "images_per_sec": [100.0, 150.0], "batch_size": [64, 32],
                       "step_time_p10_s": [0.64, 0.40], "cpu_step_time_s": [0.60, 0.30]})
    out = scaling.efficiency(df)
    assert list(out["p10_efficiency"]) == pytest.approx([1.0, 0.8])   # 10 ms/image vs 12.5 ms/image
    assert list(out["cpu_efficiency"]) == pytest.approx([1.0, 1.0])


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing launched

@pytest.fixture
def no_launch(monkeypatch):
    calls = []
    monkeypatch.setattr(scaling, "launch", lambda *a, **k: calls.append((a, k)) or pytest.fail("launched"))
    return calls


@pytest.fixture
def launches(monkeypatch):
    """scaling.launch answers at once (helpers.fake_launch); the list of its calls' (n, args, kw)."""
    calls = []
    monkeypatch.setattr(scaling, "launch", fake_launch(calls))
    return calls


def _devices(launches) -> set:
    """The --device each launch gave its workers (None: no flag)."""
    return {args[args.index("--device") + 1] if "--device" in args else None for _, args, _ in launches}


@pytest.mark.parametrize("args, name", [
    (["--timeout", "nan"], "--timeout"), (["--timeout", "inf"], "--timeout"), (["--timeout", "0"], "--timeout"),
    (["--timeout", "-5"], "--timeout"), (["--threads", "0"], "--threads"), (["--np", "0"], "--np"),
    (["--np", "1,x"], "--np"), (["--np", "1.5"], "--np"), (["--hosts", "a:x"], "hosts"),
    (["--hosts", "a:0"], "hosts"), (["--np", "3", "--hosts", "a:1,b:1"], "np=3"),
    (["--batch-size", "0"], "--batch-size"), (["--warmup-steps", "-1"], "--warmup-steps"),
])
def test_cli_rejects_bad_input_in_one_line(args, name, capsys, no_launch):
    with pytest.raises(SystemExit) as e:
        scaling.cli_main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err and "Traceback" not in err
    assert no_launch == []


def test_cli_checks_the_json_path_and_the_profile_first(tmp_path, capsys, monkeypatch, no_launch):
    for path, says in ((tmp_path / "missing" / "out.json", "does not exist"), (tmp_path, "is a directory")):
        with pytest.raises(SystemExit) as e:
            scaling.cli_main(["--json", str(path)])
        assert e.value.code == 2 and says in capsys.readouterr().err
    monkeypatch.setenv("LABKIT_PROFILE", "fastest")
    with pytest.raises(SystemExit) as e:
        scaling.cli_main([])
    assert e.value.code == 2 and "LABKIT_PROFILE" in capsys.readouterr().err


def test_cli_rejects_an_unknown_model_without_loading_tensorflow(capsys, no_launch):
    import sys
    tf_loaded = "tensorflow" in sys.modules
    with pytest.raises(SystemExit) as e:
        scaling.cli_main(["--model", "no_such_net"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "model must be one of" in err and "resnet50" in err
    assert ("tensorflow" in sys.modules) == tf_loaded


def test_run_rejects_bad_threads_timeout_and_hosts(no_launch):
    with pytest.raises(ValueError, match="threads"):
        scaling.run([1], threads=0)
    with pytest.raises(ValueError, match="timeout"):
        scaling.run([1], timeout=float("nan"))
    with pytest.raises(ValueError, match="hosts"):
        scaling.run([1], hosts=["node1:x"])


def test_help_says_each_worker_owns_a_fixed_share(capsys):
    with pytest.raises(SystemExit):
        scaling.cli_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fixed share" in text and "default 1" in text and "--hosts" in text and "node1:1,node2:1" in text


def test_cli_hands_hosts_and_one_thread_per_worker_to_the_launcher(launches, capsys, tmp_path):
    out = tmp_path / "scale.json"
    assert scaling.cli_main(["--np", "2", "--hosts", "node1:1,node2:1", "--json", str(out), "--quiet"]) == 0
    (n, args, kw), = launches
    assert n == 2 and kw["hosts"] == "node1:1,node2:1"
    assert args[args.index("--threads") + 1] == "1"
    printed = capsys.readouterr().out
    assert printed.startswith("data: an offline synthetic set") and "the ranks trained on: synthetic" in printed
    assert json.loads(out.read_text())["hosts"] == "node1:1,node2:1"


def _paired_rank(rank, size, ips, free_ips, checksum, free_checksum):
    """A `hvd_train --paired` rank result: the synced steps' fields, and the control's under "no_sync"."""
    def timing(v):
        return {"images_per_sec_repeats": v, "step_time_s": 8 / v[0], "cpu_step_time_s": 0.5,
                "step_time_p10_s": 8 / max(v), "step_times_s": [8 / v[0]]}
    return {**fake_rank(rank, size, ips, checksum), **timing(ips), "paired": True,
            "no_sync": {**timing(free_ips), "checksum": free_checksum, "checksums_after_block": [free_checksum]}}


def _paired_launch(calls):
    def fake_launch(n, args, **kw):
        calls.append((n, list(args)))
        free = [100.0 * 2, 100.0 * 2] if n == 2 else [100.0, 100.0]  # without the exchange: perfect scaling
        return [_paired_rank(r, n, [90.0, 90.0] if n == 2 else [100.0, 100.0], free, "same", f"own{r}")
                for r in range(n)]
    return fake_launch


def test_run_paired_takes_both_frames_from_one_launch_per_np(monkeypatch):
    calls = []
    monkeypatch.setattr(scaling, "launch", _paired_launch(calls))
    with_exchange, without = scaling.run_paired([1, 2], progress=False)
    assert [n for n, _ in calls] == [1, 2]  # one launch per worker count, not two
    assert all("--paired" in a and "--no-sync" not in a for _, a in calls)
    # np=2 with the exchange: 2 ranks x 90 images/s against 100 at np=1; without: 2 x 200 against 100
    assert list(with_exchange.efficiency) == pytest.approx([1.0, 0.9])
    assert list(without.efficiency) == pytest.approx([1.0, 2.0])
    assert list(without.images_per_sec) == pytest.approx([100.0, 400.0])
    assert with_exchange.in_sync.all() and not without.in_sync.iloc[1] and without.in_sync.iloc[0]
    assert not without.sync.any() and with_exchange.sync.all()
    assert without.ranks.iloc[1][1]["checksum"] == "own1" and "no_sync" not in without.ranks.iloc[1][1]
    assert set(with_exchange.columns) == set(without.columns)  # run()'s format, both


def test_run_paired_refuses_a_control_flag_in_extra(no_launch):
    for flag in ("--no-sync", "--barrier"):
        with pytest.raises(ValueError, match=f"extra must not hold {flag}"):
            scaling.run_paired([2], extra=[flag])


def test_cli_paired_prints_both_and_their_ratio(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(scaling, "launch", _paired_launch(calls))
    out = tmp_path / "scale.json"
    assert scaling.cli_main(["--np", "1,2", "--paired", "--json", str(out), "--quiet"]) == 0
    assert len(calls) == 2
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("np=2"))
    assert "efficiency 0.90" in line and "without the exchange" in line and "efficiency 2.00" in line
    assert "ratio 0.45" in line and "checksums equal" in line
    doc = json.loads(out.read_text())
    assert doc["paired"] and [r["efficiency"] for r in doc["without_exchange"]] == pytest.approx([1.0, 2.0])
    assert doc["all_in_sync"] and [r["in_sync"] for r in doc["without_exchange"]] == [True, False]


@pytest.mark.parametrize("gpus, profile, nps, flag", [
    ("0", "full", "1,2", None), ("4", "full", "1,2", "cpu"), ("4", "full", "1,2,8", "cpu"),
    ("8", "workshop", "1,2", "cpu")])
def test_every_launch_of_a_run_gets_one_device(monkeypatch, launches, gpus, profile, nps, flag):
    """On a GPU node every launch of the notebooks' runs names the CPU (their lessons measure cores): none leaves
    a worker to a GPU, so no run compares GPU workers with CPU workers; without GPUs no flag is added."""
    monkeypatch.setenv("LABKIT_GPUS", gpus)
    monkeypatch.setenv("LABKIT_PROFILE", profile)
    monkeypatch.setenv("LABKIT_CORES", "16")
    scaling.run([int(n) for n in nps.split(",")], progress=False, launcher="gloo")
    assert _devices(launches) == {flag}, launches


def test_cli_refuses_gpu_workers_a_node_cannot_hold(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "launch", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setenv("LABKIT_CORES", "16")
    monkeypatch.setenv("LABKIT_GPUS", "2")
    with pytest.raises(SystemExit) as stop:
        scaling.cli_main(["--np", "1,4", "--device", "gpu", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and "--device gpu: a launch puts 4 worker(s) on a host with 2 NVIDIA GPU(s)" in err
    monkeypatch.setenv("LABKIT_GPUS", "0")
    with pytest.raises(SystemExit):
        scaling.cli_main(["--np", "1,2", "--device", "gpu", "--quiet"])
    assert "no NVIDIA GPU on this machine" in capsys.readouterr().err


@pytest.mark.parametrize("gpus, nps, device", [("8", "1,2,4,8", "gpu"), ("1", "1", "gpu"), ("4", "1,8", "cpu"),
                                               ("0", "1,2", None)])
def test_labkit_scale_puts_workers_on_gpus_whatever_the_profile(monkeypatch, launches, gpus, nps, device):
    """`labkit scale` in an sbatch on a GPU node (workshop profile by default): one GPU per worker where each
    has one."""
    monkeypatch.setenv("LABKIT_GPUS", gpus)
    monkeypatch.setenv("LABKIT_CORES", "16")
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    assert scaling.cli_main(["--np", nps, "--quiet", "--launcher", "gloo"]) == 0
    assert _devices(launches) == {device}
