"""labkit.scaling: cost model against hand-computed values, bookkeeping, and real Horovod launches.

The launches (marked horovod + slow) start horovodrun with Gloo on this machine: a 2-rank run whose
ranks end with equal weight checksums, the control without DistributedOptimizer whose ranks drift,
a crashed rank and a hung rank, both of which must leave no process behind.
"""
import json
import time
import uuid

import numpy as np
import pandas as pd
import psutil
import pytest

from labkit import scaling
from labkit.scaling import AllreduceModel, fusion_buffers, ring_allreduce_time


# ---------------------------------------------------------------- cost model (hand-computed oracles)

def test_ring_allreduce_matches_hand_computed_values():
    # p=4, alpha=10 us, beta=1 ns/B, n=1 MB: 2*3*10e-6 + 2*(3/4)*1e6*1e-9 = 60 us + 1.5 ms
    assert ring_allreduce_time(1e6, 4, 1e-5, 1e-9) == pytest.approx(1.56e-3)
    # reduction term: (3/4) * 1e6 * 2e-10 = 150 us
    assert ring_allreduce_time(1e6, 4, 1e-5, 1e-9, gamma=2e-10) == pytest.approx(1.71e-3)
    # p=2: 2 alpha + n beta
    assert ring_allreduce_time(4096, 2, 1e-3, 1e-9) == pytest.approx(2e-3 + 4096e-9)
    assert ring_allreduce_time(1e9, 1, 1.0, 1.0) == 0.0  # one worker sends nothing
    # the wire term tends to 2 n beta as p grows: the ring's bandwidth optimality
    assert ring_allreduce_time(1e6, 10**6, 0.0, 1e-9) == pytest.approx(2e-3, rel=1e-5)


def test_ring_allreduce_rejects_bad_input():
    with pytest.raises(ValueError, match="p must be"):
        ring_allreduce_time(10, 0, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="n_bytes"):
        ring_allreduce_time(-1, 2, 1e-6, 1e-9)


def test_tensor_fusion_packs_in_order_up_to_the_threshold():
    assert fusion_buffers([10, 20, 30, 100], threshold=50) == [30, 30, 100]
    assert fusion_buffers([10, 20, 30], threshold=0) == [10, 20, 30]  # fusion off
    assert fusion_buffers([10, 20, 30], threshold=64 * 2**20) == [60]
    with pytest.raises(ValueError, match="threshold"):
        fusion_buffers([1], threshold=-1)


def test_fusion_saves_latency_not_bandwidth():
    net = AllreduceModel(alpha=1e-3, beta=1e-9)
    tensors = [1000] * 10
    unfused = net.fused_time(tensors, 2, threshold=0)   # 10 x (2 alpha + 1000 beta)
    fused = net.fused_time(tensors, 2)                  # 1 x (2 alpha + 10000 beta)
    assert unfused == pytest.approx(10 * (2e-3 + 1000e-9))
    assert fused == pytest.approx(2e-3 + 10000e-9)


def test_fit_recovers_alpha_and_beta():
    true = AllreduceModel(alpha=4e-4, beta=2.5e-9)
    sizes = np.array([4, 1024, 65536, 2**20, 2**22])
    fit = scaling.fit_alpha_beta(sizes, true.time(sizes, 2), p=2)
    assert fit.alpha == pytest.approx(4e-4, rel=1e-6)
    assert fit.beta == pytest.approx(2.5e-9, rel=1e-6)
    with pytest.raises(ValueError, match="p >= 2"):
        scaling.fit_alpha_beta(sizes, true.time(sizes, 2), p=1)


def test_step_time_overlap_hides_at_most_the_compute():
    net = AllreduceModel(alpha=0.0, beta=1e-9)  # 1e8 bytes on 2 ranks: 0.1 s of communication
    assert scaling.step_time(2, 0.5, [1e8], net, overlap=0.0) == pytest.approx(0.6)
    assert scaling.step_time(2, 0.5, [1e8], net, overlap=0.5) == pytest.approx(0.55)
    assert scaling.step_time(2, 0.05, [1e8], net, overlap=1.0) == pytest.approx(0.1)  # comm-bound
    with pytest.raises(ValueError, match="overlap"):
        scaling.step_time(2, 0.5, [1e8], net, overlap=1.5)


def test_prediction_compute_term_and_trends():
    # ResNet-50 (4.1 GMACs), 32 images on a P100 (10.6 TFLOP/s) at 50%: 32*6*4.1e9 / 5.3e12 s
    df = scaling.predict([1, 8, 512], model="resnet50", gpu="P100", batch_per_gpu=32, utilization=0.5)
    assert df["compute_s"].iloc[0] == pytest.approx(32 * 6 * 4.1e9 / 5.3e12)
    assert df["efficiency"].iloc[0] == pytest.approx(1.0)
    assert df["efficiency"].is_monotonic_decreasing
    # the Horovod paper's ordering at 512 GPUs: VGG-16 (138M parameters) scales worse than ResNet-101
    vgg = scaling.predict([512], model="vgg16")["efficiency"].iloc[0]
    resnet = scaling.predict([512], model="resnet101")["efficiency"].iloc[0]
    assert vgg < resnet < 1.0
    with pytest.raises(ValueError, match="model must be"):
        scaling.predict([2], model="no_such_net")
    with pytest.raises(ValueError, match="network must be"):
        scaling.predict([2], network="carrier pigeon")


def test_published_numbers_typed_from_the_seeds():
    pub = scaling.published()
    row = lambda src, gpus: pub[(pub["source"] == src) & (pub["gpus"] == gpus)]["efficiency"].item()  # noqa
    chameleon = row("seed 003 (Chameleon, MXNet)", 8)
    assert chameleon * 8 == pytest.approx(7.525, rel=1e-3)  # 1466.31 / 194.86 images/s on 8 vs 1 node
    matlab = row("seed 001 (MATLAB, p2.8xlarge)", 8)
    assert matlab == pytest.approx(0.614, abs=1e-3)  # +70% per doubling, three doublings


# ---------------------------------------------------------------- bookkeeping

def test_efficiency_from_throughput():
    df = pd.DataFrame({"np": [1, 2, 4], "images_per_sec": [100.0, 180.0, 300.0]})
    out = scaling.efficiency(df)
    assert list(out["speedup"]) == pytest.approx([1.0, 1.8, 3.0])
    assert list(out["efficiency"]) == pytest.approx([1.0, 0.9, 0.75])
    with pytest.raises(ValueError, match="base_np"):
        scaling.efficiency(df, base_np=3)


def _fake_rank(rank, size, ips, checksum):
    return {"rank": rank, "size": size, "batch_size": 8, "global_batch_size": 8 * size,
            "images_per_sec_repeats": ips, "step_time_s": 0.1, "final_loss": 1.0, "checksum": checksum,
            "threads": 1, "model": "small_cnn", "data": "synthetic", "sync": True}


def test_summarize_sums_ranks_per_repeat_and_checks_sync():
    row = scaling.summarize([_fake_rank(0, 2, [10.0, 12.0], "a"), _fake_rank(1, 2, [11.0, 13.0], "a")])
    assert row["images_per_sec"] == pytest.approx(23.0)  # (21 + 25) / 2
    assert row["images_per_sec_std"] == pytest.approx(np.std([21.0, 25.0], ddof=1))
    assert row["in_sync"]
    assert not scaling.summarize([_fake_rank(0, 2, [1.0], "a"), _fake_rank(1, 2, [1.0], "b")])["in_sync"]


def test_to_json_follows_the_design_contract():
    rows = [scaling.summarize([_fake_rank(0, 1, [10.0, 10.0], "x")]),
            scaling.summarize([_fake_rank(0, 2, [9.0, 9.0], "y"), _fake_rank(1, 2, [9.0, 9.0], "y")])]
    doc = scaling.to_json(scaling.efficiency(pd.DataFrame(rows)), model="small_cnn")
    assert [r["np"] for r in doc["runs"]] == [1, 2]
    assert doc["runs"][0]["efficiency"] == 1.0
    assert doc["runs"][1]["efficiency"] == pytest.approx(0.9)
    assert doc["runs"][1]["checksums"] == ["y", "y"] and doc["all_in_sync"]
    json.dumps(doc)  # plain JSON types only


def test_build_command_for_each_launcher(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd = scaling.build_command(2, ["--steps", "3"], launcher="gloo")
    assert cmd[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert cmd[-4:] == ["-m", "labkit.hvd_train", "--steps", "3"]
    assert "--mpi" in scaling.build_command(2, launcher="mpi")
    assert scaling.build_command(3, launcher="srun")[:3] == ["srun", "--ntasks", "3"]
    with pytest.raises(ValueError, match="launcher"):
        scaling.build_command(2, launcher="ssh")
    with pytest.raises(ValueError, match="np must be"):
        scaling.build_command(0)


def test_slurm_allocation_gives_the_hosts():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "nodeA,nodeB", "SLURM_NTASKS_PER_NODE": "4"}
    assert scaling.slurm_hosts(env) == ["nodeA:4", "nodeB:4"]
    assert scaling.slurm_hosts({}) == []
    env2 = {"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert scaling.slurm_hosts(env2) == ["n1:2", "n2:2"]
    cmd = scaling.build_command(8, launcher="auto", env=env)
    assert cmd[cmd.index("-H") + 1] == "nodeA:4,nodeB:4"


def test_run_rejects_bad_arguments():
    with pytest.raises(ValueError, match="np must be"):
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


# ---------------------------------------------------------------- real launches

needs_horovod = pytest.mark.skipif(scaling.horovodrun_path() is None, reason="horovodrun not installed")
launches = [pytest.mark.horovod, pytest.mark.slow, needs_horovod]
TINY = dict(batch_size=16, steps=3, repeats=2, warmup_steps=1, num_examples=256)


def _leftovers(marker, token):
    """Processes of one launch still alive: by the launch's marker, and independently by command line."""
    by_marker = scaling.marked_processes(marker)
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
def test_cli_two_rank_gloo_run_ends_with_equal_checksums(tmp_path):
    out = tmp_path / "scale.json"
    rc = scaling.cli_main(["--np", "2", "--batch-size", "16", "--steps", "3", "--repeats", "2",
                           "--warmup-steps", "1", "--json", str(out), "--quiet", "--timeout", "240"])
    doc = json.loads(out.read_text())
    assert rc == 0
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


@pytest.mark.horovod
@pytest.mark.slow
@needs_horovod
def test_crashed_rank_gives_its_traceback_and_leaves_no_process(tmp_path):
    marker = uuid.uuid4().hex
    args = scaling.train_args(**TINY, extra=["--fail-rank", "1", "--fault-at-step", "1"])
    with pytest.raises(scaling.HorovodRunError) as e:
        scaling.launch(2, args, timeout=240, progress=False, out_dir=tmp_path, marker=marker)
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
    with pytest.raises(scaling.HorovodRunError) as e:
        scaling.launch(2, args, timeout=timeout, progress=False, out_dir=tmp_path, marker=marker)
    assert time.perf_counter() - t0 < timeout + 15
    assert e.value.timed_out and "timeout=20" in str(e.value)
    assert _leftovers(marker, str(tmp_path)) == []


def test_failing_rank_is_the_cause_not_the_victim():
    tails = {0: ["Traceback (most recent call last):", "tensorflow.errors.UnknownError: Horovod has been shut down",
                 "[[{{node DistributedSGD_Allreduce/HorovodAllreduce_grads_0}}]]"],
             1: ["Traceback (most recent call last):", "RuntimeError: injected failure on rank 1"]}
    # Horovod names whichever exit it noticed first (here rank 0); the root cause is rank 1
    assert scaling._failing_rank(["Process name: 0", "Exit code: 1"], tails) == 1
    assert scaling._failing_rank(["Process name: 3"], {}) == 3
    assert scaling._failing_rank([], {}) is None


def test_p10_and_cpu_efficiency_are_per_image_ratios():
    # strong scaling: np=2 halves the per-rank batch; equal time per image means efficiency 1
    df = pd.DataFrame({"np": [1, 2], "images_per_sec": [100.0, 150.0], "batch_size": [64, 32],
                       "step_time_p10_s": [0.64, 0.40], "cpu_step_time_s": [0.60, 0.30]})
    out = scaling.efficiency(df)
    assert list(out["p10_efficiency"]) == pytest.approx([1.0, 0.8])   # 10 ms/image vs 12.5 ms/image
    assert list(out["cpu_efficiency"]) == pytest.approx([1.0, 1.0])


def test_explorer_widget_reports_the_model(capsys):
    pytest.importorskip("ipywidgets")
    box = scaling.explorer()
    out = box.children[-1]
    # in a kernel the text lands in the Output widget; without one, ipywidgets passes it to stdout
    text = "".join(o.get("text", "") for o in out.outputs) + capsys.readouterr().out
    row = scaling.predict([64], model="resnet101", gpu="P100", network="25GbE (RoCE)").iloc[0]
    assert f"efficiency {row.efficiency:.0%}" in text


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
        scaling.launch(2, args, timeout=240, progress=stop_button, out_dir=tmp_path, marker=marker)
    assert _leftovers(marker, str(tmp_path)) == []


def test_missing_horovod_says_what_to_do(monkeypatch):
    monkeypatch.setattr(scaling, "horovodrun_path", lambda: None)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(FileNotFoundError, match="make setup"):
        scaling.build_command(2, launcher="gloo")
    assert scaling.build_command(2, launcher="srun")[0] == "srun"  # srun needs no horovodrun


def test_take_slots_hands_horovodrun_exactly_np_slots():
    # horovodrun --gloo starts a rank in every slot it is given: np=1 on a 2-slot node must get node:1
    assert scaling.take_slots(["node1:2"], 1) == ["node1:1"]
    assert scaling.take_slots(["node1:2", "node2:2"], 3) == ["node1:2", "node2:1"]
    assert scaling.take_slots(["node1:4"], 4) == ["node1:4"]
    assert scaling.take_slots(["node1"], 1) == ["node1:1"]
    with pytest.raises(ValueError, match="np=5"):
        scaling.take_slots(["node1:2", "node2:2"], 5)
