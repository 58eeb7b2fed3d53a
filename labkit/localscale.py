"""Scaling on one machine, taken apart (04_horovod_scaling): where data-parallel efficiency goes when every
worker owns one core of the same chip.

`decompose()` measures, in one run and for 1 .. cores workers: the machine's own limit (labkit.probe's
single-thread GEMM processes), the training workers without gradient exchange (`--no-sync`) and with
Horovod's exchange. `exchange_cost()` measures what the exchange adds to each step at several batch sizes:
on two busy cores it is a wait per step (Horovod's background cycle and negotiation, its threads waiting for
a core, the slower worker), not a bandwidth cost, so it shrinks as a fraction of a step with more images.
"""
from __future__ import annotations

from labkit import scaling


def decompose(workers=None, *, probe_seconds=2.0, progress=True, **run_kw):
    """Where data-parallel efficiency goes on one machine, measured in one run, for each worker count:

    the machine's own limit (labkit.probe: that many single-thread GEMM processes at once), the training
    workers without gradient exchange (--no-sync: compute on a shared chip) and with Horovod's exchange.
    Every worker owns one thread (threads=1). workers: default 1 .. machine.cores() (at least 2). run_kw: scaling.run's
    (model, batch_size, steps, ...). Returns (table, horovod, no_sync): one row per worker count with GFLOP/s,
    images/s, speedup and efficiency of the three, and the two scaling.run DataFrames.
    """
    import pandas as pd
    from labkit import machine, probe
    if workers is None:
        workers = list(range(1, max(2, machine.cores()) + 1))  # two at least: one exchange to measure
    workers = [workers] if isinstance(workers, int) else list(workers)
    if not workers or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in workers):
        raise ValueError(f"workers must be a positive int or a list of them; got {workers!r}")
    if run_kw.get("threads", 1) != 1:
        raise ValueError(f"threads must be 1 here (each worker owns one core); got {run_kw['threads']!r}")
    run_kw = {**run_kw, "threads": 1}
    workers = sorted(set(workers) | {1})  # one worker is every curve's baseline
    gemm, hvd, free = {}, [], []
    for n in workers:  # interleaved: probe, no exchange, Horovod, then the next worker count
        gemm[n] = probe.gemm_probe(n, probe_seconds, base=gemm[1]["gflops_total"] if n > 1 else None)
        free.append(scaling.run([n], sync=False, progress=False, **run_kw))
        hvd.append(scaling.run([n], sync=True, progress=False, **run_kw))
        if progress:
            print(f"{n} worker(s): GEMM processes {gemm[n]['gflops_total']:.0f} GFLOP/s; training "
                  f"{free[-1]['images_per_sec'].iloc[0]:,.0f} images/s without exchange, "
                  f"{hvd[-1]['images_per_sec'].iloc[0]:,.0f} with Horovod", flush=True)
    free = scaling.efficiency(pd.concat(free, ignore_index=True))
    hvd = scaling.efficiency(pd.concat(hvd, ignore_index=True))
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
    return table, hvd, free


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


def exchange_cost(batches=(64, 256), np_=2, *, barrier=False, progress=False, **run_kw):
    """Per batch size: np_ workers (one thread each) without exchange and with Horovod's gradient exchange,
    one launch each, back to back; barrier=True adds a launch with only a 4-byte allreduce per step
    (hvd_train --barrier: every step waits for the slower worker, no gradients cross).

    Returns one row per batch: step times (median over ranks and steps), the exchange's milliseconds per step
    (Horovod minus no exchange) and, with barrier, what stepping together alone costs, images/s and the ratio of
    Horovod's to no exchange's (= the ratio of the two efficiencies, since both share the one-worker
    baseline)."""
    import pandas as pd
    batches = [batches] if isinstance(batches, int) else list(batches)
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        raise ValueError(f"batches must be a positive int or a list of them; got {batches!r}")
    if not isinstance(np_, int) or isinstance(np_, bool) or np_ < 2:
        raise ValueError(f"np_ must be an int >= 2 (an exchange needs two workers); got {np_!r}")
    run_kw = {**run_kw, "threads": 1}
    extra = tuple(run_kw.pop("extra", ()))
    rows = []
    for b in batches:
        free = scaling.run([np_], batch_size=b, sync=False, progress=progress, extra=extra, **run_kw).iloc[0]
        hvd = scaling.run([np_], batch_size=b, sync=True, progress=progress, extra=extra, **run_kw).iloc[0]
        row = {"batch": b, "no_sync_step_ms": 1e3 * free["step_time_s"], "horovod_step_ms": 1e3 * hvd["step_time_s"],
               "exchange_ms": 1e3 * (hvd["step_time_s"] - free["step_time_s"]),
               "no_sync_images_per_sec": free["images_per_sec"], "horovod_images_per_sec": hvd["images_per_sec"],
               "horovod_vs_no_sync": hvd["images_per_sec"] / free["images_per_sec"], "in_sync": hvd["in_sync"]}
        if barrier:
            wait = scaling.run([np_], batch_size=b, sync=False, progress=progress, extra=extra + ("--barrier",),
                               **run_kw).iloc[0]
            row.update(barrier_step_ms=1e3 * wait["step_time_s"],
                       barrier_ms=1e3 * (wait["step_time_s"] - free["step_time_s"]))
        rows.append(row)
    return pd.DataFrame(rows)
