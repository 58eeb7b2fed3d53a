"""Horovod across the virtual cluster of scripts/vcluster.sh: runs, link bytes, calibration, prediction.

scripts/vcluster.sh (root, Linux) makes nodes labkit-node1..N as network namespaces joined by tc-shaped
links. This module launches labkit.scale.hvd_train on them the way a job does (horovodrun started on the first
node, ranks reached by ssh), reads the bytes that crossed each node's link, calibrates the ring-allreduce
model of labkit.scale.allreduce (alpha: latency per message, beta: seconds per byte) at a link setting, and
checks how well that model predicts the step time of a real training run across the nodes.

`measure(rates)` does the whole experiment and returns one JSON-able dict; `load_results()` reads the
committed copy (notebooks/results/vcluster.json) for machines where the cluster cannot be built.
TensorFlow is never imported here: the ranks import it. Introduced in notebooks/07_scaling_deep_dive.ipynb.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.base import machine, resultsfile
from labkit.scale import launch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vcluster.sh"
RESULTS = ROOT / "notebooks" / "results" / "vcluster.json"
PREFIX = launch.NODE_PREFIX
STATE_DIR = Path(os.environ.get("LABKIT_VCLUSTER_DIR", "/run/labkit-vcluster"))
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def rate_bits(rate: str) -> float:
    """tc's rate string in bits/s: '1gbit' -> 1e9, '100mbit' -> 1e8 (tc's units: k = 1000)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?(?:bit|bps))", str(rate).strip().lower())
    if not m:
        raise ValueError(f"rate must be a tc rate such as '1gbit' or '100mbit'; got {rate!r}")
    return float(m[1]) * RATE_UNITS[m[2]]


def parse_link(link: str) -> tuple[str, str]:
    """A link setting: a tc rate, optionally '+' a one-way delay in tc's time syntax: '1gbit' -> ('1gbit', '0'),
    '50mbit+5ms' -> ('50mbit', '5ms')."""
    rate, _, delay = str(link).strip().lower().partition("+")
    rate_bits(rate)
    delay = delay or "0"
    delay_s(delay)
    return rate, delay


def delay_s(delay: str) -> float:
    """tc's time string in seconds: '0' -> 0, '5ms' -> 0.005, '200us' -> 0.0002."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", str(delay).strip())
    if str(delay).strip() == "0":
        return 0.0
    if not m:
        raise ValueError(f"delay must be a tc time such as '5ms' or '200us' (or '0'); got {delay!r}")
    return float(m[1]) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m[2]]


def why_not() -> str | None:
    """None when this machine can build the virtual cluster, else the reason in one line."""
    problem = machine.namespaces_problem()
    if problem:
        return f"the virtual cluster needs {problem}"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [c for c in ("ip", "tc", "nsenter", "sshd", "munged", "slurmctld", "slurmd")
               if shutil.which(c, path=path) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (apt-get install iproute2 openssh-server "
                "slurmctld slurmd slurm-client munge)")
    return None


def _script(*args, timeout=180, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"vcluster.sh {' '.join(args)} -> {res.returncode}: {res.stderr.strip()[-2000:]}")
    return res


def up(nodes: int = 2, rate: str = "1gbit") -> str:
    """Bring the cluster up (or leave a matching one as it is); returns vcluster.sh's listing."""
    rate_bits(rate)
    return _script("up", "--nodes", str(int(nodes)), "--rate", rate).stdout


def shape(rate: str, delay: str = "0") -> None:
    """Set every node's link to `rate` (both directions) and a one-way `delay` on each node's way out."""
    rate_bits(rate)
    delay_s(delay)
    _script("shape", "--rate", rate, "--delay", delay)


def down() -> None:
    _script("down")


def nodes_up() -> int:
    try:
        return int((STATE_DIR / "nodes").read_text())
    except (OSError, ValueError):
        return 0


def link_bytes() -> dict:
    """{'lkv1': {'rx': ..., 'tx': ...}, ...}: the host ends of the nodes' links (rx = what the node sent)."""
    out = {}
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, fields = line.partition(":")
        name = name.strip()
        if re.fullmatch(r"lkv\d+", name):
            f = fields.split()
            out[name] = {"rx": int(f[0]), "tx": int(f[8])}
    return out


def _run_group(cmd, timeout, env) -> subprocess.CompletedProcess:
    """Run cmd in its own process group; past the timeout, SIGTERM the group (horovodrun then stops its
    remote ranks), SIGKILL what is left, and raise TimeoutError."""
    import signal
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        raise TimeoutError(f"{' '.join(map(str, cmd[3:6]))} ... still running after {timeout:.0f} s: stopped") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def hvd_run(np_: int, rank_args, *, hosts=None, timeout: float = 300, env_extra=None,
            module: str = "labkit.scale.hvd_train") -> dict:
    """horovodrun -np np_ across the nodes (one rank per node unless hosts says otherwise).

    Returns {"ranks": [rank JSON ...], "link_bytes": {link: {"rx", "tx"} sent during the run},
    "wall_s": ...}. rank_args go to `python -m <module>` (labkit.scale.hvd_train or labkit.deepdive.linkbench).
    """
    n = nodes_up()
    if n < 1:
        raise RuntimeError("no virtual cluster is up: scripts/vcluster.sh up (as root)")
    hosts = hosts or ",".join(f"{PREFIX}{i + 1}:1" for i in range(np_))
    venv_bin = Path(sys.executable).parent
    out = Path(tempfile.mkdtemp(prefix="labkit-vc-"))
    cmd = ["bash", str(SCRIPT), "exec", f"{PREFIX}1", str(venv_bin / "horovodrun"), "--gloo", "-np", str(np_),
           "-H", hosts, "--network-interface", "eth0",
           str(venv_bin / "python"), "-m", module, "--out", str(out), *map(str, rank_args)]
    # the launcher's allow-listed environment: no JUPYTER_TOKEN or other secret reaches a rank or `ps`
    env = launch.child_env({"PATH": f"{venv_bin}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin", **(env_extra or {})})
    before, t0 = link_bytes(), time.perf_counter()
    try:
        res = _run_group(cmd, timeout, env)
        wall, after = time.perf_counter() - t0, link_bytes()
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if res.returncode != 0 or len(ranks) != np_:
        errors = [ln for ln in (res.stdout + res.stderr).splitlines() if "Error" in ln or "error:" in ln]
        tail = "\n".join(errors[-5:] + res.stderr.splitlines()[-10:])
        raise RuntimeError(f"horovodrun on {hosts} -> exit {res.returncode}, {len(ranks)} of {np_} rank files\n{tail}")
    moved = {k: {d: after[k][d] - before.get(k, {}).get(d, 0) for d in ("rx", "tx")} for k in after}
    return {"ranks": sorted(ranks, key=lambda r: r["rank"]), "link_bytes": moved, "wall_s": wall}


def tfdist_run(np_: int = 2, model="convblock_net", batch_size=4, steps=12, port=23456, timeout=300) -> dict:
    """tf.distribute.MultiWorkerMirroredStrategy across np_ nodes: one labkit.deepdive.tfdist_train per node."""
    from labkit.deepdive import tfdist_train
    if nodes_up() < np_:
        raise RuntimeError(f"need a virtual cluster of {np_} nodes: scripts/vcluster.sh up --nodes {np_}")
    before, t0 = link_bytes(), time.perf_counter()
    workers_out = tfdist_train.run_workers(
        [f"{PREFIX}{i + 1}:{port}" for i in range(np_)],
        wrap=lambda i: ["bash", str(SCRIPT), "exec", f"{PREFIX}{i + 1}"],
        model=model, batch_size=batch_size, steps=steps, timeout=timeout)
    wall, after = time.perf_counter() - t0, link_bytes()
    moved = {k: {d: after[k][d] - before.get(k, {}).get(d, 0) for d in ("rx", "tx")} for k in after}
    return {"workers": workers_out, "link_bytes": moved, "wall_s": wall,
            "step_s": max(w["median_step_s"] for w in workers_out)}


def tfdist_vs_horovod(rates=("1gbit", "50mbit"), model="convblock_net", batch_size=4, steps=12, repeats=2,
                      progress=print) -> dict:
    """Synced step time of the same model and batch with Horovod and with MultiWorkerMirroredStrategy,
    alternating launches (repeats per rate) so machine-load changes hit both; medians over launches."""
    rows = []
    for rate in rates:
        shape(rate)
        hv, tfd, sums = [], [], []
        for _ in range(repeats):
            run = hvd_run(2, ["--model", model, "--batch-size", batch_size, "--steps", steps, "--repeats", 1,
                              "--sizes", "4096", "--chain", 1, "--calib-repeats", 1, "--variants", "sync"],
                          module="labkit.deepdive.linkbench")
            hv.append(max(r["median_step_s"]["sync"] for r in run["ranks"]))
            t = tfdist_run(2, model, batch_size, steps)
            tfd.append(t["step_s"])
            sums.append({"horovod": [r["checksum_trainable"] for r in run["ranks"]],
                         "tf.distribute": [w["checksum_trainable"] for w in t["workers"]]})
        rows.append({"rate": rate, "rate_bits": rate_bits(rate), "horovod_step_s": _median(hv),
                     "tfdist_step_s": _median(tfd), "horovod_launches_s": hv, "tfdist_launches_s": tfd,
                     "checksums": sums})
        progress(f"{rate}: Horovod {_median(hv) * 1e3:.0f} ms, MultiWorkerMirroredStrategy {_median(tfd) * 1e3:.0f} ms")
    from labkit.deepdive import tfdist_train
    return {"model": model, "batch_size_per_rank": batch_size, "np": 2, "date": time.strftime("%Y-%m-%d"),
            "settings": rows, "tfdist_distributed_lines": tfdist_train.distributed_lines(),
            "horovod_distributed_lines": 4}  # hvd.init, DistributedGradientTape, 2 x broadcast_variables


def _median(xs):
    xs = sorted(xs)
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else 0.5 * (xs[k - 1] + xs[k])


def summarize(ranks, p: int) -> dict:
    """Calibration fit and step times from linkbench's rank files (a collective ends with its slowest rank)."""
    from labkit.scale import allreduce
    by_size = {}
    for r in ranks:
        for row in r["allreduce"]:
            by_size[row["bytes"]] = max(by_size.get(row["bytes"], 0.0), _median(row["times_s"]))
    n = sorted(by_size)
    fit = allreduce.fit_alpha_beta(n, [by_size[b] for b in n], p=p)
    cal = {"bytes": n, "time_s": [by_size[b] for b in n], "alpha_s": fit.alpha, "beta_s_per_byte": fit.beta,
           "bandwidth_bits": 8.0 / fit.beta, "model_s": [float(fit.time(b, p)) for b in n]}
    steps = {}
    for v in ranks[0]["step_times_s"]:
        per_step = [max(r["step_times_s"][v][i] for r in ranks) for i in range(len(ranks[0]["step_times_s"][v]))]
        steps[v] = {"median_s": _median(per_step), "p10_s": sorted(per_step)[len(per_step) // 10],
                    "times_s": per_step}
    tensors = ranks[0]["grad_tensors"]
    compute = steps["compute"]["median_s"]
    pred = {"compute_s": compute, "comm_s": fit.fused_time(tensors, p),
            "comm_fp16_s": fit.fused_time([t / 2 for t in tensors], p)}
    pred["sync_s"] = allreduce.step_time(p, compute, tensors, fit)
    pred["sync_fp16_s"] = allreduce.step_time(p, compute, [t / 2 for t in tensors], fit)
    return {"calibration": cal, "steps": steps, "predicted": pred, "grad_bytes": sum(tensors),
            "grad_tensors": len(tensors), "checksums": [r["checksum_trainable"] for r in ranks],
            "hosts": [r["host"] for r in ranks]}


def run_setting(link: str, model="convblock_net", batch_size=4, steps=3, repeats=4, np_=2, env_extra=None,
                sizes=(4096, 65536, 262144, 1 << 20, 4 << 20), variants="compute,sync,sync_fp16", chain=3,
                calib_repeats=5) -> dict:
    """Shape the links to `link` (a rate, or rate+delay: see parse_link), then one launch of labkit.deepdive.linkbench
    across np_ nodes, summarised."""
    rate, delay = parse_link(link)
    shape(rate, delay)
    run = hvd_run(np_, ["--model", model, "--batch-size", batch_size, "--steps", steps, "--repeats", repeats,
                        "--sizes", ",".join(map(str, sizes)), "--variants", variants, "--chain", chain,
                        "--calib-repeats", calib_repeats],
                  module="labkit.deepdive.linkbench", env_extra=env_extra)
    res = summarize(run["ranks"], np_)
    res.update(link=link, rate=rate, rate_bits=rate_bits(rate), delay_s=delay_s(delay), link_bytes=run["link_bytes"],
               wall_s=run["wall_s"], load_average=os.getloadavg()[0], env=dict(env_extra or {}))
    res["ratio"] = res["steps"]["sync"]["median_s"] / res["predicted"]["sync_s"]
    return res


def measure(rates=("1gbit", "200mbit", "50mbit"), model="convblock_net", batch_size=4, np_=2, progress=print,
            **kw) -> dict:
    """The whole experiment at each link setting (a rate, or rate+delay: see parse_link): calibration, fit,
    interleaved training variants, prediction."""
    from labkit.base import machine
    rows = []
    for rate in rates:
        res = run_setting(rate, model, batch_size, np_=np_, **kw)
        cal, st, pr = res["calibration"], res["steps"], res["predicted"]
        progress(f"{rate}: alpha {cal['alpha_s'] * 1e6:.0f} us, fitted {cal['bandwidth_bits'] / 1e6:.0f} Mbit/s; "
                 f"step measured {st['sync']['median_s'] * 1e3:.0f} ms, predicted {pr['sync_s'] * 1e3:.0f} ms "
                 f"(compute alone {pr['compute_s'] * 1e3:.0f} ms)")
        rows.append(res)
    # tensor fusion off (one allreduce per gradient tensor) at the slowest link, beside the default
    slow = min((r for r in rates if parse_link(r)[1] == "0"), key=lambda r: rate_bits(parse_link(r)[0]),
               default=rates[0])
    no_fusion = run_setting(slow, model, batch_size, np_=np_, env_extra={"HOROVOD_FUSION_THRESHOLD": "0"},
                            variants="compute,sync", sizes=(4096, 65536), **kw)
    progress(f"{slow}, fusion off: step {no_fusion['steps']['sync']['median_s'] * 1e3:.0f} ms "
             f"(compute alone {no_fusion['predicted']['compute_s'] * 1e3:.0f} ms)")
    return {"model": model, "batch_size_per_rank": batch_size, "np": np_, "machine": machine.describe(),
            "date": time.strftime("%Y-%m-%d"), "settings": rows, "fusion_off": no_fusion}


def load_results(path=RESULTS) -> dict:
    """The committed measurement (for machines where the cluster cannot be built)."""
    return json.loads(Path(path).read_text())


def table(results: dict):
    """One row per link setting: tc rate and one-way delay, fitted bandwidth and latency, measured vs predicted
    step time."""
    import pandas as pd
    rows = []
    for s in results["settings"]:
        cal = s["calibration"]
        rows.append({"link (tc rate)": s.get("link", s["rate"]), "one-way delay (ms)": s.get("delay_s", 0.0) * 1e3,
                     "fitted bandwidth (Mbit/s)": cal["bandwidth_bits"] / 1e6,
                     "fitted / tc rate": cal["bandwidth_bits"] / s["rate_bits"],
                     "latency alpha (us)": cal["alpha_s"] * 1e6,
                     "compute alone (ms)": s["predicted"]["compute_s"] * 1e3,
                     "allreduce, model (ms)": s["predicted"]["comm_s"] * 1e3,
                     "predicted step (ms)": s["predicted"]["sync_s"] * 1e3,
                     "measured step (ms)": s["steps"]["sync"]["median_s"] * 1e3,
                     "measured / predicted": s["ratio"]})
    return pd.DataFrame(rows).set_index("link (tc rate)")


def plot(results: dict, ax=None):
    """Measured vs predicted step time against link speed (settings without added delay), the compute part
    shaded."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6, 3.8))[1]
    settings = sorted((s for s in results["settings"] if not s.get("delay_s")), key=lambda s: s["rate_bits"])
    x = [s["rate_bits"] / 1e6 for s in settings]
    ax.plot(x, [s["predicted"]["sync_s"] * 1e3 for s in settings], "o--", label="predicted (compute + allreduce model)")
    ax.plot(x, [s["steps"]["sync"]["median_s"] * 1e3 for s in settings], "s-", label="measured, 2 nodes")
    ax.plot(x, [s["predicted"]["compute_s"] * 1e3 for s in settings], ":", color="gray",
            label="compute alone (no gradient sync)")
    ax.set_xscale("log")
    ax.set_xlabel("link speed (Mbit/s)")
    ax.set_ylabel("time per training step (ms)")
    when = f", recorded {results['date']}" if results.get("date") else ""  # the course's run, not this machine's
    ax.set_title(f"{results['model']}, batch {results['batch_size_per_rank']} per node, {results['np']} nodes{when}")
    ax.legend(fontsize=8)
    return ax


def plot_calibration(results: dict, ax=None):
    """hvd.allreduce time against message size at each link setting: measured points, fitted model lines."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6, 3.8))[1]
    for s in sorted(results["settings"], key=lambda s: (-s["rate_bits"], s.get("delay_s", 0.0))):
        cal = s["calibration"]
        kb = [b / 1e3 for b in cal["bytes"]]
        line, = ax.plot(kb, [t * 1e3 for t in cal["time_s"]], "o", label=s.get("link", s["rate"]))
        ax.plot(kb, [t * 1e3 for t in cal["model_s"]], "-", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (kB)")
    ax.set_ylabel("hvd.allreduce time (ms)")
    ax.legend(fontsize=8, title="link (+ one-way delay)", title_fontsize=8)
    return ax


def parser(prog: str, description: str):
    """The measurement's command line, shared by this module and labkit.deepdive.nodescale."""
    import argparse
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--rates", default="1gbit,200mbit,50mbit",
                   help="comma-separated link settings: tc rates, each optionally +DELAY (one way), e.g. 50mbit+5ms")
    p.add_argument("--model", default="convblock_net")
    p.add_argument("--batch-size", type=int, default=4)
    return p


def run_cli(name: str, args, nodes: int, experiment, out: Path, table_of, check=None) -> int:
    """Check the arguments (plus `check()`, raising ValueError; --model as the ranks will build it), start a cluster
    of `nodes` if none is up, run `experiment(rates)`, write its results to `out` and print `table_of(results)`."""
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    try:
        for r in rates:
            parse_link(r)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1; got {args.batch_size}")
        if check:
            check()
        from labkit.scale import scaling
        scaling.check_model(args.model, "--model")  # before the cluster comes up, not in its ranks
    except (ValueError, RuntimeError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    reason = why_not()
    if reason:
        print(f"{name}: {reason}", file=sys.stderr)
        return 2
    out = Path(out)
    try:  # room for the results file now, not after the cluster runs
        out.parent.mkdir(parents=True, exist_ok=True)
        resultsfile.check_space(out, resultsfile.RESULTS_RESERVE_BYTES, "--out")
    except (OSError, ValueError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2
    started = nodes_up() < nodes
    if started:
        up(nodes, parse_link(rates[0])[0])
    try:
        res = experiment(rates)
    finally:
        if started:
            down()
    resultsfile.write_json(out, res)
    print(table_of(res).round(3).to_string())
    print("written:", out)
    return 0


def main(argv=None) -> int:
    p = parser("python -m labkit.deepdive.vcluster", "Calibrate and check the allreduce model on the virtual cluster "
               "(2 nodes; over node counts: python -m labkit.deepdive.nodescale).")
    p.add_argument("--out", default=None, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)
    return run_cli("vcluster", args, 2, lambda rates: measure(rates, args.model, args.batch_size),
                   args.out or RESULTS, table)


if __name__ == "__main__":
    sys.exit(main())
