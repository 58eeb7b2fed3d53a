"""scripts/vcluster.sh: a virtual 2-node cluster (network namespaces, shaped links, sshd, Slurm) on this machine.

Root and Linux only; skips naming the reason elsewhere, or when a virtual cluster is already up (an
instructor's: the tests will not take it down). Bad-input checks run everywhere. Checks: up/down leaves
nothing behind; Horovod across two nodes keeps the ranks in sync and its bytes cross the shaped links;
hpc/multi_node.sbatch on the cluster's Slurm; the ring-allreduce model calibrated at two link rates
predicts a real training step across the nodes (marked slow).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.deepdive import nodescale, vcluster

pytestmark = [pytest.mark.slow]

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

SCRIPT = ROOT / "scripts" / "vcluster.sh"
VENV = str(Path(sys.executable).parent.parent)
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def sh(*args, timeout=180, env=None):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or dict(os.environ, PATH=SBIN_PATH))


def snapshot() -> dict:
    """What the cluster could leave behind: namespaces, links, marked lines and files, its processes."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    procs = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "labkit-vcluster" in cmd or "labkit-node" in cmd:
            procs.append(cmd)
    return {"netns": sorted(re.findall(r"^(labkit-node\d+)", netns, re.M)),
            "links": sorted(re.findall(r"^\d+: (lkv\d+n?|labkit-br0)[@:]", links, re.M)),
            "hosts": [ln for ln in Path("/etc/hosts").read_text().splitlines() if "labkit-vcluster" in ln],
            "files": [str(p) for p in (Path("/run/labkit-vcluster"), Path("/etc/ssh/ssh_config.d/labkit-vcluster.conf"))
                      if p.exists()],
            "procs": procs}


EMPTY = {"netns": [], "links": [], "hosts": [], "files": [], "procs": []}


@pytest.mark.parametrize("args, expected", [
    (["up", "--nodes", "two"], "--nodes must be an integer 1..32; got 'two'"),
    (["up", "--rate", "fast"], "--rate must be a tc rate such as 1gbit or 100mbit; got 'fast'"),
    (["up", "--delay", "soon"], "--delay must be a tc time such as 0.2ms or 50us (or 0 for none); got 'soon'"),
    (["up", "--colour", "red"], "up: unknown option '--colour'"),
    (["shape"], "--rate must be a tc rate"),
    (["sideways"], "unknown command 'sideways'"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    res = sh(*args)
    assert res.returncode == 2, res
    assert expected in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("args, expected", [
    (["--rates", "fast"], "vcluster: rate must be a tc rate such as '1gbit' or '100mbit'; got 'fast'"),
    (["--batch-size", "0"], "vcluster: --batch-size must be >= 1; got 0"),
    (["--rates", "50mbit+soon"], "vcluster: delay must be a tc time such as '5ms' or '200us' (or '0'); got 'soon'"),
    (["--nodes", "2"], "vcluster: unrecognized arguments"),  # node counts are nodescale's
    (["nodescale", "--nodes", "1,2"], "nodescale: --nodes must be node counts >= 2 separated by commas, e.g. 2,3,4; "
                                      "got '1,2'"),
    (["nodescale", "--rates", "fast"], "nodescale: rate must be a tc rate such as '1gbit' or '100mbit'; got 'fast'"),
])
def test_measure_cli_bad_input_is_one_line_and_exit_2(args, expected):
    module = "labkit.deepdive.nodescale" if args[0] == "nodescale" else "labkit.deepdive.vcluster"
    args = args[1:] if args[0] == "nodescale" else args
    res = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60)
    if expected.endswith("unrecognized arguments"):  # argparse's own refusal: usage line + error line
        assert res.returncode == 2 and "unrecognized arguments: --nodes 2" in res.stderr, res
        return
    assert res.returncode == 2 and res.stderr.strip() == expected, res


@pytest.mark.parametrize("module", ["vcluster", "nodescale"])
def test_an_unknown_model_is_refused_before_the_cluster_comes_up(module, monkeypatch, capsys, tmp_path):
    import importlib

    from labkit.deepdive import vcluster
    monkeypatch.setattr(vcluster, "why_not", lambda: None)  # as on a machine that can build the cluster
    monkeypatch.setattr(vcluster, "up", lambda *a, **k: pytest.fail("the cluster came up before --model was checked"))
    monkeypatch.setattr(vcluster, "nodes_up", lambda: 0)
    main = importlib.import_module(f"labkit.deepdive.{module}").main
    assert main(["--model", "no_such_net", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{module}: --model must be one of" in err and "no_such_net" in err


def test_modules_import_without_tensorflow():
    code = ("import sys, labkit.deepdive.vcluster, labkit.deepdive.nodescale, labkit.deepdive.timeline; "
            "print('tensorflow' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "False", res


def test_by_nodes_predicts_more_nodes_from_the_fewest_nodes_fit(monkeypatch):
    """by_nodes fits alpha/beta on the fewest nodes and predicts the rest with the ring formula. Faked
    launches whose allreduce follows T = 2(p-1) alpha + 2(p-1)/p n beta (the published ring cost, Thakur et al.
    2005) with a link of 50 Mbit/s: the 2-node fit must predict 3 and 4 nodes' synced steps exactly."""
    alpha, beta, grad = 1e-3, 8 / 50e6, 2_700_000
    ring = lambda n, p: 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta  # noqa: E731
    seen = []

    def fake_run_setting(rate, model, batch_size, np_, variants, **kw):
        seen.append((rate, np_))
        sizes = [4096, 65536, 1 << 20, 4 << 20]
        ranks = [{"allreduce": [{"bytes": n, "times_s": [ring(n, np_)] * 3} for n in sizes],
                  "step_times_s": {"compute": [0.08 * np_] * 5, "sync": [0.08 * np_ + ring(grad, np_)] * 5},
                  "grad_tensors": [grad // 2, grad // 2], "checksum_trainable": 1.0, "host": f"n{r}"}
                 for r in range(np_)]
        return {**vcluster.summarize(ranks, np_), "rate": rate, "rate_bits": vcluster.rate_bits(rate)}

    monkeypatch.setattr(vcluster, "run_setting", fake_run_setting)
    monkeypatch.setattr(vcluster, "nodes_up", lambda: 4)
    res = nodescale.by_nodes((4, 2, 3), rates=("50mbit",), progress=lambda *_: None)
    assert seen == [("50mbit", 2), ("50mbit", 3), ("50mbit", 4)]
    for s in res["settings"]:
        p = s["nodes"]
        assert s["predicted_from_fewest_s"] == pytest.approx(0.08 * p + ring(grad, p), rel=1e-6)
        assert s["efficiency"] == pytest.approx(0.08 * p / (0.08 * p + ring(grad, p)), rel=1e-6)
    table = nodescale.table(res)
    assert list(table.index) == [("50mbit", 2), ("50mbit", 3), ("50mbit", 4)]
    monkeypatch.setattr(vcluster, "nodes_up", lambda: 2)
    with pytest.raises(RuntimeError, match="need a virtual cluster of 4 nodes"):
        nodescale.by_nodes((2, 4), rates=("50mbit",))
    for bad in ((1, 2), (2, "3"), (2,)):
        with pytest.raises(ValueError,
                           match="^nodes must be (two or more node counts|a non-empty list of ints) >= 2; got "):
            nodescale.by_nodes(bad)


@pytest.mark.parametrize("link, expected", [("1gbit", ("1gbit", "0")), ("50mbit+5ms", ("50mbit", "5ms")),
                                            ("100Mbit+200us", ("100mbit", "200us"))])
def test_parse_link_splits_rate_and_delay(link, expected):
    assert vcluster.parse_link(link) == expected


def test_delay_s_follows_tc_units():
    assert [vcluster.delay_s(d) for d in ("0", "5ms", "200us", "0.5s")] == pytest.approx([0, 0.005, 0.0002, 0.5])


def test_rate_bits_follows_tc_units():
    assert vcluster.rate_bits("1gbit") == 1e9
    assert vcluster.rate_bits("100mbit") == 1e8
    assert vcluster.rate_bits("1mbps") == 8e6  # tc: bps = bytes per second
    with pytest.raises(ValueError, match="rate must be a tc rate"):
        vcluster.rate_bits("fast")


def test_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_timeline_phases_from_a_hand_made_trace(tmp_path):
    """Horovod's trace format (begin/end per tensor, nested activities, unterminated file) read back exactly."""
    from labkit.deepdive import timeline
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad/conv1"}},
          {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "grad/fc"}}]
    for base in (1000, 5000):  # microseconds
        ev += [{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": base, "pid": 1},
               {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": base + 200, "pid": 2},
               {"ph": "E", "ts": base + 1000, "pid": 1}, {"ph": "E", "ts": base + 1000, "pid": 2},
               {"name": "ALLREDUCE", "ph": "B", "ts": base + 1000, "pid": 1},
               {"name": "GLOO_ALLREDUCE", "ph": "B", "ts": base + 1100, "pid": 1},
               {"ph": "E", "ts": base + 2600, "pid": 1}, {"ph": "E", "ts": base + 3000, "pid": 1}]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in ev) + ",\n")  # as Horovod leaves it mid-run
    df = timeline.phases(path)
    one = df[(df.tensor == "grad/conv1") & (df.step == 1)].set_index("phase")
    assert one.loc["NEGOTIATE_ALLREDUCE", "dur_ms"] == pytest.approx(1.0)
    assert one.loc["ALLREDUCE", "dur_ms"] == pytest.approx(2.0)
    assert one.loc["GLOO_ALLREDUCE", "dur_ms"] == pytest.approx(1.5)
    assert one.loc["GLOO_ALLREDUCE", "depth"] == 1 and one.loc["ALLREDUCE", "depth"] == 0
    assert one.loc["ALLREDUCE", "start_ms"] == pytest.approx(5.0)  # (6000 - 1000) us after the first event
    assert df[df.tensor == "grad/fc"].dur_ms.tolist() == pytest.approx([0.8, 0.8])
    total = timeline.summary(df).set_index("phase")["total_ms"]
    assert total["NEGOTIATE_ALLREDUCE"] == pytest.approx(2 * (1.0 + 0.8))


def test_timeline_labels_drop_the_model_name_every_gradient_shares():
    from labkit.deepdive import timeline
    names = ["DistributedGradientTape/HorovodAllreduce_gradient_tape_convblock_w32_d4_fc_MatMul_0",
             "DistributedGradientTape/HorovodAllreduce_gradient_tape_convblock_w32_d4_conv1_1_BiasAdd_0",
             "DistributedGradientTape/HorovodAllreduce_gradient_tape_convblock_w32_d4_conv1_2_BiasAdd_0"]
    assert timeline.labels(names) == ["fc_MatMul_0", "conv1_1_BiasAdd_0", "conv1_2_BiasAdd_0"]
    # rows drawn from a step: the shared start is taken over all of its tensors, so conv1's rows keep 'conv1_'
    assert timeline.labels(names[1:], among=names) == ["conv1_1_BiasAdd_0", "conv1_2_BiasAdd_0"]
    assert timeline.labels(names[:1]) == ["convblock_w32_d4_fc_MatMul_0"]  # one name: nothing is shared
    assert timeline.labels(names, width=5) == ["fc_Ma", "conv1", "conv1"]


def _skip_unless_cluster_possible():
    reason = vcluster.why_not()
    if reason:
        pytest.skip(reason)
    if snapshot() != EMPTY:
        pytest.skip("a virtual cluster (or part of one) is already up here; scripts/vcluster.sh down first")


def test_up_twice_down_twice_leaves_nothing():
    _skip_unless_cluster_possible()
    try:
        first = sh("up", "--nodes", "2", "--rate", "1gbit")
        assert first.returncode == 0, first.stderr
        again = sh("up", "--nodes", "2", "--rate", "1gbit")
        assert again.returncode == 0 and "already up" in again.stdout, again
        for i in (1, 2):
            assert re.search(rf"labkit-node{i}\s+10\.\d+\.\d+\.{i}\b", first.stdout), first.stdout
        state = snapshot()
        assert state["netns"] == ["labkit-node1", "labkit-node2"]
        assert {"labkit-br0", "lkv1", "lkv2"} <= set(state["links"])
        assert len(state["hosts"]) == 2
        # every node answers ssh under its name, with its own hostname, and Slurm sees both idle
        for i in (1, 2):
            res = subprocess.run(["ssh", "-o", "BatchMode=yes", f"labkit-node{i}", "hostname"],
                                 capture_output=True, text=True, timeout=30)
            assert res.stdout.strip() == f"labkit-node{i}", res
        env = dict(os.environ, PATH=SBIN_PATH, SLURM_CONF="/run/labkit-vcluster/etc/slurm.conf")
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env)
        assert sorted(sinfo.stdout.splitlines()) == ["labkit-node1 idle", "labkit-node2 idle"], sinfo
    finally:
        down = sh("down")
        again = sh("down")
    assert down.returncode == 0 and again.returncode == 0, (down, again)
    time.sleep(0.5)  # let init reap the daemons
    assert snapshot() == EMPTY


# The cluster's timing tests compare a measured step with the ring model's prediction; in `make test` two other test
# processes load the 2 cores (load averages of 5-6), and a rank that waits on the link gives its core away and waits
# again for it: twice in about thirty runs a step took 1.4-1.7 x the prediction. The cluster runs ahead of the rest of
# the suite instead: its daemons, and so the ranks that sshd and slurmd start, at this niceness (root: the cluster
# needs it anyway). Its bounds are unchanged.
AHEAD = -10


@pytest.fixture(scope="module")
def cluster():
    """A 2-node virtual cluster for this module's runs, ahead of the suite's other processes (AHEAD), taken down
    (and checked empty) afterwards."""
    _skip_unless_cluster_possible()
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, AHEAD)  # what this process starts from here on inherits it
        vcluster.up(2, "100mbit")
        yield vcluster
    finally:
        vcluster.down()
        os.setpriority(os.PRIO_PROCESS, 0, before)
        time.sleep(0.5)
        assert snapshot() == EMPTY


def test_the_cluster_s_ranks_run_ahead_of_the_suite(cluster):
    """What a node's sshd starts (horovodrun's ranks) runs at AHEAD's niceness, as the timing tests need."""
    for i in (1, 2):
        res = subprocess.run(["ssh", "-o", "BatchMode=yes", f"labkit-node{i}", "nice"], capture_output=True,
                             text=True, timeout=30)
        assert res.stdout.strip() == str(AHEAD), res


def test_horovod_two_nodes_in_sync_over_the_shaped_link(cluster):
    steps = 6
    run = cluster.hvd_run(2, ["--steps", steps, "--repeats", 1, "--warmup-steps", 1, "--batch-size", 16,
                              "--threads", 1, "--num-examples", 256])
    ranks = run["ranks"]
    assert [r["host"] for r in ranks] == ["labkit-node1", "labkit-node2"]
    assert [r["size"] for r in ranks] == [2, 2] and [r["local_size"] for r in ranks] == [1, 1]
    assert ranks[0]["checksum"] == ranks[1]["checksum"], "data-parallel ranks must end with the same weights"
    # a 2-rank ring allreduce sends half the gradient and receives the other half back: n bytes out per step
    grad = ranks[0]["grad_bytes"]
    for link in ("lkv1", "lkv2"):
        sent = run["link_bytes"][link]["rx"]  # host end's rx = what the node sent
        assert sent >= (steps + 1) * grad, (link, sent, grad)


def test_multi_node_sbatch_runs_two_ranks_on_two_nodes(cluster, tmp_path):
    env = dict(os.environ, PATH=SBIN_PATH, SLURM_CONF="/run/labkit-vcluster/etc/slurm.conf", LABKIT_VENV=VENV,
               LABKIT_RESULTS=str(tmp_path / "hvd"), LABKIT_STEPS="3", LABKIT_PROFILE="quick", LABKIT_NIC="eth0",
               LABKIT_BATCH_SIZE="16")
    log = tmp_path / "job-%j.out"
    job = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--gres=none",
                          f"--output={log}", f"--chdir={ROOT}", str(ROOT / "hpc/multi_node.sbatch")],
                         capture_output=True, text=True, env=env, timeout=30)
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip()
    deadline, state = time.time() + 180, ""
    while time.time() < deadline:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=env).stdout
        state = dict(re.findall(r"(\w+)=(\S*)", out)).get("JobState", "")
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    text = Path(str(log).replace("%j", job_id)).read_text(errors="replace")
    assert state == "COMPLETED", f"job {job_id}: {state}\n{text[-3000:]}"
    assert "nodes: labkit-node[1-2], 2 ranks (1 per node)" in text
    assert "2 ranks on 2 node(s)" in text and "all ranks hold the same weights" in text
    ranks = [json.loads((tmp_path / "hvd" / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["host"] for r in ranks) == ["labkit-node1", "labkit-node2"]


@pytest.mark.parametrize("rate", ["200mbit", "100mbit"])
def test_allreduce_model_fitted_at_the_link_rate_predicts_the_training_step(cluster, rate):
    """Calibrate hvd.allreduce across the nodes, fit alpha/beta, predict a real synced step (compute + ring).

    The oracle is tc's rate: the fitted bandwidth must be near it, and compute alone (measured in the same
    launch, interleaved) plus the model's allreduce time near the measured step. The 15% the notebook reports
    is a measurement on a quiet machine (notebooks/results/vcluster.json); this test runs beside whatever
    else loads the 2 cores, so it allows 35%, and it sets the steps the suite disturbed least against each other:
    the fastest synced step against the fastest compute step plus the model's allreduce (each the fastest of 9,
    the p10 of labkit.deepdive.vcluster.summarize). A synced step waits for both ranks, so every moment either
    one loses its core adds to it: at load 5.9 the median synced step came out 46% over the median-based model
    (483 ms against 330). On the recorded quiet runs (notebooks/results/vcluster*.json) the fastest steps give
    0.92-1.27 of the model. Still far from what a model without the bandwidth term (about 3x) or a link without
    shaping (about 0.35x) would give at 100 Mbit/s.
    """
    res = cluster.run_setting(rate, steps=3, repeats=3, variants="compute,sync", chain=2, calib_repeats=3,
                              sizes=(4096, 65536, 262144, 1 << 20, 4 << 20))
    cal, steps, pred = res["calibration"], res["steps"], res["predicted"]
    fastest = steps["sync"]["p10_s"]  # the fastest of 9 synced steps
    model = steps["compute"]["p10_s"] + pred["comm_s"]  # the fastest of 9 compute steps, plus the allreduce
    detail = (f"{rate}: fitted {cal['bandwidth_bits'] / 1e6:.0f} Mbit/s, alpha {cal['alpha_s'] * 1e6:.0f} us; "
              f"fastest step {fastest * 1e3:.0f} ms against {model * 1e3:.0f} ms (compute "
              f"{steps['compute']['p10_s'] * 1e3:.0f} + allreduce {pred['comm_s'] * 1e3:.0f}); medians "
              f"{steps['sync']['median_s'] * 1e3:.0f} against {pred['sync_s'] * 1e3:.0f} ms; "
              f"load {res['load_average']:.1f}")
    print(detail)
    assert len(steps["sync"]["times_s"]) == len(steps["compute"]["times_s"]) == 9, detail
    assert cal["bandwidth_bits"] == pytest.approx(res["rate_bits"], rel=0.35), detail
    assert 0 < cal["alpha_s"] < 5e-3, detail  # Horovod's per-message software latency, no added delay
    assert fastest / model == pytest.approx(1.0, abs=0.35), detail
    assert res["checksums"][0] == res["checksums"][1], detail
    assert min(b["rx"] for b in res["link_bytes"].values()) > res["grad_bytes"], detail


UDP_ECHO = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1] == "serve":
    s.bind((sys.argv[2], 9999)); s.settimeout(20)
    d, a = s.recvfrom(100)
    while d != b"end":
        s.sendto(d, a); d, a = s.recvfrom(100)
else:
    s.settimeout(5); rtts = []
    for _ in range(15):
        t = time.perf_counter(); s.sendto(b"x", (sys.argv[2], 9999)); s.recvfrom(100)
        rtts.append(time.perf_counter() - t)
    s.sendto(b"end", (sys.argv[2], 9999)); print(min(rtts))
"""


def _udp_rtt(src: str, dst_node: str, dst_ip: str) -> float:
    env = dict(os.environ, PATH=SBIN_PATH)
    server = subprocess.Popen(["ip", "netns", "exec", dst_node, sys.executable, "-c", UDP_ECHO, "serve", dst_ip],
                              env=env)
    try:
        time.sleep(1.0)
        out = subprocess.run(["ip", "netns", "exec", src, sys.executable, "-c", UDP_ECHO, "ask", dst_ip],
                             capture_output=True, text=True, timeout=60, check=True, env=env).stdout
        return float(out)
    finally:
        server.wait(timeout=30)


def test_link_delay_adds_its_latency_to_every_allreduce(cluster):
    """--delay holds every packet leaving a node (tc netem, or scripts/delay_relay.py where the kernel lacks it).

    Oracles: a UDP round trip between the nodes takes 2 x the one-way delay (+ the relay's own time, under 1.5 ms
    in the fastest of 15 trips; the median was 11.2 ms at 5 ms on one slower host);
    a 2-rank ring allreduce crosses the link at least twice in sequence, so the fitted latency per message
    (T = 2 alpha + ...) grows by at least the delay; the bandwidth stays the tc rate and the model still
    predicts the synced training step."""
    delay = 0.005
    node2_ip = re.search(r"labkit-node2\s+(\S+)", sh("status").stdout)[1]
    try:
        cluster.shape("100mbit", "5ms")
        rtt = _udp_rtt("labkit-node1", "labkit-node2", node2_ip)
        assert 2 * delay <= rtt < 2 * delay + 1.5e-3, f"fastest UDP round trip {rtt * 1e3:.2f} ms at 5 ms each way"
        res = cluster.run_setting("100mbit+5ms", steps=3, repeats=3, variants="compute,sync", chain=2,
                                  calib_repeats=3, sizes=(4096, 65536, 262144, 1 << 20, 4 << 20))
    finally:
        cluster.shape("100mbit")
    cal = res["calibration"]
    detail = (f"alpha {cal['alpha_s'] * 1e3:.1f} ms, {cal['bandwidth_bits'] / 1e6:.0f} Mbit/s, "
              f"step measured/predicted {res['ratio']:.2f}, load {res['load_average']:.1f}")
    assert res["delay_s"] == delay and res["link"] == "100mbit+5ms"
    assert delay < cal["alpha_s"] < 8 * delay, detail
    assert cal["bandwidth_bits"] == pytest.approx(res["rate_bits"], rel=0.35), detail
    assert res["ratio"] == pytest.approx(1.0, abs=0.35), detail
    assert res["checksums"][0] == res["checksums"][1], detail
    assert _udp_rtt("labkit-node1", "labkit-node2", node2_ip) < 1e-3, "the delay went away with the shape"


def test_labkit_scale_with_hosts_runs_across_the_nodes(cluster, tmp_path):
    """`labkit scale --hosts labkit-node1:1,labkit-node2:1`, started on a node as a job would be."""
    out = tmp_path / "scale.json"
    venv_bin = Path(sys.executable).parent
    before = cluster.link_bytes()
    res = subprocess.run(["bash", str(SCRIPT), "exec", "labkit-node1", str(venv_bin / "labkit"), "scale", "--np", "2",
                          "--hosts", "labkit-node1:1,labkit-node2:1", "--threads", "1", "--steps", "4",
                          "--repeats", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT,
                         env=dict(os.environ, PATH=f"{venv_bin}:{SBIN_PATH}", LABKIT_PROFILE="quick"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    after = cluster.link_bytes()
    run = json.loads(out.read_text())["runs"][0]
    assert run["np"] == 2 and run["checksums"][0] == run["checksums"][1]
    for link in ("lkv1", "lkv2"):  # both nodes sent gradients over their shaped links
        assert after[link]["rx"] - before[link]["rx"] > 100_000, (link, before, after)
