"""labkit.scale.hvd_train, the leaf script: argument checks (one line, exit 2, before TensorFlow builds anything),
no labkit module importing it, and one real single-rank run under Horovod."""
import ast
import json
import pathlib
import subprocess
import sys

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)
from labkit.scale import hvd_train as ht


def test_no_labkit_module_imports_hvd_train():
    importers = []
    for path in (ROOT / "labkit").rglob("*.py"):
        if path.name == "hvd_train.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "labkit.scale.hvd_train":
                importers.append(str(path.relative_to(ROOT)))
            elif isinstance(node, ast.ImportFrom) and node.module == "labkit" and \
                    any(a.name == "hvd_train" for a in node.names):
                importers.append(str(path.relative_to(ROOT)))
            elif isinstance(node, ast.Import) and any(a.name == "labkit.scale.hvd_train" for a in node.names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == [], importers


def test_arguments_parse():
    a = ht.parse_args(["--steps", "3", "--scale-lr"])
    assert a.steps == 3 and a.scale_lr and a.model == ht.DEFAULT_MODEL


@pytest.mark.parametrize("argv, word", [
    (["--batch-size", "0"], "--batch-size"), (["--threads", "-1"], "--threads"),
    (["--model", "nosuchnet"], "--model"), (["--data", "synthetic", "--image-size", "224"], "--data synthetic"),
    (["--barrier"], "--barrier needs --no-sync"), (["--num-groups", "-1"], "--num-groups"),
    (["--paired", "--no-sync"], "--paired cannot be combined with --no-sync"),
    (["--paired", "--barrier"], "--paired cannot be combined with --barrier"),
])
def test_bad_arguments_exit_2_with_one_line_before_any_model(argv, word):
    proc = subprocess.run([sys.executable, "-m", "labkit.scale.hvd_train", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert word in last and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_one_rank_trains_and_writes_its_result(tmp_path):
    pytest.importorskip("horovod.tensorflow")
    proc = subprocess.run([sys.executable, "-m", "labkit.scale.hvd_train", "--steps", "2", "--repeats", "2",
                           "--warmup-steps", "1", "--batch-size", "16", "--num-examples", "64", "--threads", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads((tmp_path / "rank0.json").read_text())
    assert r["size"] == 1 and r["model"] == "small_cnn" and r["data"] == "synthetic"
    assert len(r["step_times_s"]) == 4 and len(r["images_per_sec_repeats"]) == 2
    assert all(v == v and v > 0 for v in r["loss_local"])  # finite, positive cross-entropy


@pytest.mark.parametrize("argv, word", [(["--peer", "/nonexistent/peer.py"], "--peer"),
                                        (["--rounds", "0"], "--rounds"), (["--variant", "noequals"], "--variant")])
def test_peer_bench_bad_input_one_line_exit_2(argv, word):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_hvd_peer.py"), *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and word in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr


def test_barrier_mode_waits_each_step_but_leaves_the_weights_apart():
    """--no-sync --barrier on 2 ranks: a 4-byte allreduce per step (the control of 04's exchange cost), no
    gradient exchange, so the ranks' weights drift apart as with --no-sync alone."""
    pytest.importorskip("horovod.tensorflow")
    from labkit.scale import scaling
    df = scaling.run([2], sync=False, extra=("--barrier",), steps=2, repeats=1, warmup_steps=1, batch_size=16,
                     progress=False)
    ranks = df.ranks.iloc[0]
    assert [r["barrier"] for r in ranks] == [True, True] and not any(r["sync"] for r in ranks)
    assert not bool(df.in_sync.iloc[0])  # the barrier does not average anything


def test_one_group_changes_when_the_gradients_travel_not_what_arrives():
    """--num-groups 1 sends all gradients in one grouped allreduce after backprop instead of tensor by tensor:
    the averages are the same numbers (a + b of two ranks, in either order), so the same run ends with the
    same weights, and in sync."""
    pytest.importorskip("horovod.tensorflow")
    from labkit.scale import scaling
    kw = dict(steps=3, repeats=1, warmup_steps=1, batch_size=16, data="random", progress=False)
    default = scaling.run([2], **kw)
    grouped = scaling.run([2], extra=("--num-groups", "1"), **kw)
    assert [r["num_groups"] for r in grouped.ranks.iloc[0]] == [1, 1]
    assert bool(grouped.in_sync.iloc[0]) and bool(default.in_sync.iloc[0])
    assert grouped.checksums.iloc[0] == default.checksums.iloc[0]


def test_thread_cpu_by_role_sorts_threads_by_who_started_them():
    """hvd.init started threads 11 (Horovod's loop) and 12 (Gloo's, seen in epoll at the end only); 1 is
    Python's, 20 a TensorFlow thread started after the first snapshot: it counts from zero."""
    start = {1: (1.0, ""), 11: (0.5, "futex_wait_queue"), 12: (0.2, "")}
    end = {1: (1.5, ""), 11: (0.6, "hrtimer_nanosleep"), 12: (0.5, "do_epoll_wait"), 20: (0.3, "futex_wait_queue")}
    got = ht.thread_cpu_by_role(start, end, comm_tids={11, 12}, steps=100)
    assert got == pytest.approx({"training": (0.5 + 0.3) * 10, "horovod_background": 0.1 * 10,
                                 "gloo_network": 0.3 * 10})  # ms per step: s / 100 steps * 1000
    assert ht.thread_cpu_by_role({}, end, {11}, 10) == {}  # no /proc: nothing to say
    # a kernel that hides wait channels: Horovod's and Gloo's threads are summed, not guessed apart
    hidden = {tid: (sec, "") for tid, (sec, _) in end.items()}
    got = ht.thread_cpu_by_role({t: (sec, "") for t, (sec, _) in start.items()}, hidden, {11, 12}, 100)
    assert got == pytest.approx({"training": 8.0, "communication": 4.0})
    older = {**end, 12: (0.5, "ep_poll")}  # the wait's name before Linux 6
    assert ht.thread_cpu_by_role(start, older, {11, 12}, 100)["gloo_network"] == pytest.approx(3.0)
    # under the MPI controller the threads in epoll are Open MPI's event threads, and are named so
    got = ht.thread_cpu_by_role(start, end, {11, 12}, 100, network_role="mpi_events")
    assert got == pytest.approx({"training": 8.0, "horovod_background": 1.0, "mpi_events": 3.0})


def test_two_ranks_report_their_threads_cpu_time():
    """Each rank splits its CPU time per step among its training threads, Horovod's background thread and
    Gloo's network threads; the three add up to the process's own CPU time per step (time.process_time)."""
    pytest.importorskip("horovod.tensorflow")
    if not pathlib.Path("/proc/self/task").is_dir():
        pytest.skip("per-thread CPU time is read from Linux's /proc")
    from labkit.scale import scaling
    df = scaling.run([2], steps=10, repeats=1, warmup_steps=2, batch_size=16, data="random", progress=False,
                     launcher="gloo")  # the roles named here are Gloo's (launches default to mpirun where there is MPI)
    for r in df.ranks.iloc[0]:
        roles = r["thread_cpu_ms_per_step"]
        # the three roles, or two where the kernel hides which thread waits in epoll
        assert set(roles) in (set(ht.THREAD_ROLES), {"training", "communication"}) and roles["training"] > 0
        mean_cpu_ms = 1e3 * sum(r["cpu_step_times_s"]) / len(r["cpu_step_times_s"])
        assert sum(roles.values()) == pytest.approx(mean_cpu_ms, rel=0.2)


def test_paired_schedule_alternates_abba_after_both_warmups():
    assert ht.schedule(2, 3, 1) == [("main", 1, False), ("main", 6, True)]
    assert ht.schedule(2, 3, 1, paired=True) == [
        ("no_sync", 1, False), ("main", 1, False),
        ("no_sync", 2, True), ("main", 2, True), ("main", 2, True), ("no_sync", 2, True),
        ("no_sync", 2, True), ("main", 2, True)]
    assert ht.schedule(5, 1, 0, paired=True) == [("no_sync", 5, True), ("main", 5, True)]  # no empty blocks


def test_thread_cpu_over_blocks_sums_what_one_span_would_count():
    """Three snapshots s0, s1, s2: blocks (s0, s1) and (s1, s2) count what the one span (s0, s2) counts; a
    thread seen in epoll only at the middle snapshot is still Gloo's."""
    s0 = {1: (1.0, ""), 11: (0.5, ""), 12: (0.2, "")}
    s1 = {1: (1.2, ""), 11: (0.55, ""), 12: (0.3, "do_epoll_wait"), 20: (0.1, "")}
    s2 = {1: (1.5, ""), 11: (0.6, ""), 12: (0.5, ""), 20: (0.3, "")}
    whole = ht.thread_cpu_by_role(s0, {**s2, 12: (0.5, "do_epoll_wait")}, {11, 12}, 100)
    assert ht.thread_cpu_over_blocks([(s0, s1), (s1, s2)], {11, 12}, 100) == pytest.approx(whole)
    assert whole == pytest.approx({"training": 8.0, "horovod_background": 1.0, "gloo_network": 3.0})
    # only some blocks: the gap between them does not count
    assert ht.thread_cpu_over_blocks([(s0, s1)], {11, 12}, 10) == pytest.approx(
        {"training": 30.0, "horovod_background": 5.0, "gloo_network": 10.0})
    assert ht.thread_cpu_over_blocks([], {11}, 10) == {} and ht.thread_cpu_over_blocks([({}, s1)], {11}, 10) == {}


def test_paired_launch_times_both_and_skips_the_exchange_in_the_control():
    """--paired on 2 ranks: per repeat one block of synced steps and one of the same steps without the
    exchange. The ranks train on different data, so after each control block their weights differ (no
    gradient was averaged: were both blocks the synced step, they would be equal), while the weights reported
    (the state after the last synced block; with 2 repeats the last block run is a control block, undone at
    the end) are equal on both ranks."""
    pytest.importorskip("horovod.tensorflow")
    from labkit.scale import scaling
    seen = []
    steps, repeats = 2, 2
    # --data random: each rank its own fixed batch (seeded by rank), and no data set to build
    with_exchange, without = scaling.run_paired([2], steps=steps, repeats=repeats, warmup_steps=1, batch_size=16,
                                                data="random", progress=seen.append)
    ranks = with_exchange.ranks.iloc[0]
    for r in ranks:
        assert r["paired"] and r["sync"] and "no_sync" in r
        assert len(r["step_times_s"]) == steps * repeats == len(r["no_sync"]["step_times_s"])
        assert len(r["cpu_step_times_s"]) == len(r["no_sync"]["cpu_step_times_s"]) == steps * repeats
        assert len(r["images_per_sec_repeats"]) == len(r["no_sync"]["images_per_sec_repeats"]) == repeats
        assert len(r["loss_local"]) == 2 * (1 + steps * repeats)  # both warm-ups and both kinds of blocks
        assert len(r["no_sync"]["checksums_after_block"]) == repeats
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and bool(with_exchange.in_sync.iloc[0])
    for a, b in zip(ranks[0]["no_sync"]["checksums_after_block"], ranks[1]["no_sync"]["checksums_after_block"]):
        assert a != b  # the control blocks exchanged nothing
    assert not bool(without.in_sync.iloc[0]) and not bool(without.sync.iloc[0])
    assert without.ranks.iloc[0][0]["step_times_s"] == ranks[0]["no_sync"]["step_times_s"]
    # rank 0's progress counts the timed steps of both kinds
    assert seen and seen[-1]["step"] == seen[-1]["steps"] == 2 * steps * repeats
