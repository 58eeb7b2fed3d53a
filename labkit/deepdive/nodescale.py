"""Weak scaling over node counts on the virtual cluster: does the ring-allreduce model fitted on 2 nodes
predict 3 and 4?

In a ring allreduce each node sends and receives 2(p-1)/p x n bytes, whatever the node count p, so the
exchange grows only from n (2 nodes) towards 2n. `by_nodes()` launches labkit.deepdive.linkbench on 2, 3, ... nodes
of scripts/vcluster.sh's cluster at each link rate (one launch each: allreduce calibration, then steps with
and without the gradient exchange), and predicts every synced step from the fewest nodes' alpha and beta.
`table()` and `plot()` show it; the committed run is notebooks/results/vcluster_nodes.json.
TensorFlow is never imported here. Introduced in notebooks/07_scaling_deep_dive.ipynb.
"""
from __future__ import annotations

import time

from labkit.base.checks import check_ints
from labkit.deepdive import vcluster

RESULTS = vcluster.RESULTS.parent / "vcluster_nodes.json"


def by_nodes(nodes=(2, 3, 4), rates=("1gbit", "50mbit"), model="convblock_net", batch_size=4, progress=print,
             **kw) -> dict:
    """Weak scaling over node counts: at each link rate and node count p, one launch that calibrates the
    allreduce and times the steps (compute alone, synced). The model fitted on the fewest nodes then predicts
    the others: alpha and beta belong to the link, p only to the ring's formula."""
    from labkit.base import machine
    from labkit.scale import allreduce
    nodes = tuple(nodes)
    if len(nodes) < 2:
        raise ValueError(f"nodes must be two or more node counts >= 2; got {nodes!r}")
    nodes = tuple(check_ints(nodes, "nodes", minimum=2))
    if vcluster.nodes_up() < max(nodes):
        raise RuntimeError(f"need a virtual cluster of {max(nodes)} nodes: scripts/vcluster.sh up --nodes {max(nodes)}")
    rows = []
    for rate in rates:
        base = None
        for p in sorted(nodes):
            res = vcluster.run_setting(rate, model, batch_size, np_=p, variants="compute,sync", **kw)
            cal = res["calibration"]
            base = base or allreduce.AllreduceModel(alpha=cal["alpha_s"], beta=cal["beta_s_per_byte"])
            compute, synced = res["predicted"]["compute_s"], res["steps"]["sync"]["median_s"]
            res.update(nodes=p, efficiency=compute / synced,  # the step model vcluster.summarize uses, with base's fit
                       predicted_from_fewest_s=allreduce.step_time(p, compute, [res["grad_bytes"]], base))
            progress(f"{rate}, {p} nodes: step {synced * 1e3:.0f} ms measured, "
                     f"{res['predicted_from_fewest_s'] * 1e3:.0f} ms predicted from {min(nodes)} nodes' fit "
                     f"(compute alone {compute * 1e3:.0f} ms; efficiency {compute / synced:.0%})")
            rows.append(res)
    return {"model": model, "batch_size_per_rank": batch_size, "nodes": sorted(nodes), "machine": machine.describe(),
            "date": time.strftime("%Y-%m-%d"), "settings": rows}


def table(results: dict):
    """One row per (link rate, node count): compute alone, synced step measured and predicted, efficiency."""
    import pandas as pd
    return pd.DataFrame([{"link": s["rate"], "nodes": s["nodes"],
                          "compute alone (ms)": s["predicted"]["compute_s"] * 1e3,
                          "measured step (ms)": s["steps"]["sync"]["median_s"] * 1e3,
                          "predicted, own fit (ms)": s["predicted"]["sync_s"] * 1e3,
                          f"predicted, {results['nodes'][0]}-node fit (ms)": s["predicted_from_fewest_s"] * 1e3,
                          "efficiency": s["efficiency"]} for s in results["settings"]]).set_index(["link", "nodes"])


def plot(results: dict, ax=None):
    """The exchange's share of a step (synced minus compute alone) against nodes: measured and predicted."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6, 3.8))[1]
    rates = sorted({s["rate"] for s in results["settings"]}, key=vcluster.rate_bits, reverse=True)
    for i, rate in enumerate(rates):
        rows = sorted((s for s in results["settings"] if s["rate"] == rate), key=lambda s: s["nodes"])
        p = [s["nodes"] for s in rows]
        compute = [s["predicted"]["compute_s"] for s in rows]
        ax.plot(p, [(s["steps"]["sync"]["median_s"] - c) * 1e3 for s, c in zip(rows, compute)], "s-", color=f"C{i}",
                label=f"{rate}: measured")
        ax.plot(p, [(s["predicted_from_fewest_s"] - c) * 1e3 for s, c in zip(rows, compute)], "o--", color=f"C{i}",
                label=f"{rate}: ring model fitted on {p[0]} nodes")
    ax.set_xticks(results["nodes"])
    ax.set_xlabel("nodes (one rank each)")
    ax.set_ylabel("exchange per step (ms)\n(synced step - compute alone)")
    ax.set_yscale("log")
    ax.set_title(f"{results['model']}, batch {results['batch_size_per_rank']} per node")
    ax.legend(fontsize=8)
    return ax


def main(argv=None) -> int:
    import re
    p = vcluster.parser("python -m labkit.deepdive.nodescale",
                        "Weak scaling over node counts on the virtual cluster, against the ring model.")
    p.add_argument("--nodes", default="2,3,4", help="node counts, e.g. 2,3,4")
    p.add_argument("--out", default=None, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)

    def check():
        if not re.fullmatch(r"\d+(,\d+)*", args.nodes) or min(map(int, args.nodes.split(","))) < 2:
            raise ValueError(f"--nodes must be node counts >= 2 separated by commas, e.g. 2,3,4; got {args.nodes!r}")
    nodes = sorted({int(n) for n in args.nodes.split(",") if n.isdigit()}) or [2]
    return vcluster.run_cli("nodescale", args, max(nodes),
                            lambda rates: by_nodes(nodes, rates, args.model, args.batch_size),
                            args.out or RESULTS, table, check)


if __name__ == "__main__":
    import sys
    sys.exit(main())
