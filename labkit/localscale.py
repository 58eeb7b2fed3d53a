"""Scaling on one machine, taken apart (04_horovod_scaling): where data-parallel efficiency goes when every
worker owns one core of the same chip.

`decompose()` measures, in one run and for 1 .. cores workers: the machine's own limit (labkit.probe's
single-thread GEMM processes), the training workers without gradient exchange (`--no-sync`) and with
Horovod's exchange. `exchange_cost()` measures what the exchange adds to each step at several batch sizes,
beside a barrier that only makes the workers step together, Horovod sending the gradients as one group and
TensorFlow's own MultiWorkerMirroredStrategy, with the CPU time per step of each: on two busy cores the
exchange costs the CPU time of Horovod's own threads, which the computing threads then lack, not bandwidth.
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


def _comm_threads(name, launch) -> dict:
    """{name_gloo_cpu_ms, name_hvd_thread_cpu_ms}: the workers' mean CPU ms per step of Gloo's network threads
    and Horovod's background thread, from hvd_train's per-thread report; {} when a worker has none."""
    per_rank = [r.get("thread_cpu_ms_per_step") or {} for r in launch.get("ranks") or []]
    if not per_rank or not all("gloo_network" in r for r in per_rank):  # no report, or no split (no /proc, no wchan)
        return {}
    mean = lambda role: sum(r[role] for r in per_rank) / len(per_rank)  # noqa: E731
    return {f"{name}_gloo_cpu_ms": mean("gloo_network"), f"{name}_hvd_thread_cpu_ms": mean("horovod_background")}


EXCHANGE_VARIANTS = ("barrier", "one_group", "tf_distribute")


def exchange_cost(batches=(64, 256), np_=2, *, variants=(), progress=False, **run_kw):
    """Per batch size: np_ workers (one thread each) without exchange and with Horovod's gradient exchange,
    one launch each, back to back, plus one launch per name in variants:

    * "barrier": no gradients cross, but every step ends with a 4-byte allreduce issued after the update
      (hvd_train --no-sync --barrier): what stepping together costs, the wait for the slower worker included;
    * "one_group": Horovod with the gradients sent as one group once backprop is done
      (DistributedGradientTape(num_groups=1)) instead of tensor by tensor as they are produced;
    * "tf_distribute": the same model and batch under TensorFlow's MultiWorkerMirroredStrategy on this
      machine (labkit.tfdist_train.run_local), TensorFlow's own collective allreduce.

    The workers train on one fixed batch of random images unless run_kw says otherwise (data=...), as
    tf.distribute's always do: the input pipeline stays out of the comparison. Returns one row per batch:
    step times in ms (median over ranks and steps), what each adds to the step without exchange (X_ms), CPU
    milliseconds per step of one worker's process (X_cpu_ms, all its threads: time on a core, not waiting
    for one), the share of the exchange-free speed each keeps (X_vs_no_sync = step time without exchange /
    with) and whether the workers' weights ended equal. Where the workers report their threads' CPU time
    (Linux), the Horovod launches add X_gloo_cpu_ms and X_hvd_thread_cpu_ms: milliseconds per step of Gloo's
    network threads and of Horovod's background thread, the mean of the workers (hvd_train's
    thread_cpu_ms_per_step)."""
    import pandas as pd
    batches = [batches] if isinstance(batches, int) else list(batches)
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        raise ValueError(f"batches must be a positive int or a list of them; got {batches!r}")
    if not isinstance(np_, int) or isinstance(np_, bool) or np_ < 2:
        raise ValueError(f"np_ must be an int >= 2 (an exchange needs two workers); got {np_!r}")
    variants = [variants] if isinstance(variants, str) else list(variants)
    bad = [v for v in variants if v not in EXCHANGE_VARIANTS]
    if bad:
        raise ValueError(f"variants must be names from {EXCHANGE_VARIANTS}; got {bad[0]!r}")
    run_kw = {"data": "random", **run_kw, "threads": 1}
    extra = tuple(run_kw.pop("extra", ()))
    launches = {"horovod": dict(sync=True), "barrier": dict(sync=False, extra=extra + ("--barrier",)),
                "one_group": dict(sync=True, extra=extra + ("--num-groups", "1"))}
    rows = []
    for b in batches:
        free = scaling.run([np_], batch_size=b, sync=False, progress=progress, extra=extra, **run_kw).iloc[0]
        row = {"batch": b, "no_sync_step_ms": 1e3 * free["step_time_s"], "no_sync_cpu_ms": 1e3 * free["cpu_step_time_s"],
               **_comm_threads("no_sync", free)}
        for name in ["horovod", *variants]:
            if name == "tf_distribute":
                from labkit import tfdist_train
                workers = tfdist_train.run_local(np_, model=run_kw.get("model", scaling.DEFAULT_MODEL), batch_size=b,
                                                 steps=run_kw.get("steps", 20) * run_kw.get("repeats", 3),
                                                 timeout=run_kw.get("timeout", 300))
                step = max(w["median_step_s"] for w in workers)
                cpu = float(sorted(w["cpu_step_time_s"] for w in workers)[len(workers) // 2])
                in_sync = len({w["checksum_trainable"] for w in workers}) == 1
            else:
                kw = {"extra": extra, **launches[name]}
                r = scaling.run([np_], batch_size=b, progress=progress, **kw, **run_kw).iloc[0]
                step, cpu, in_sync = r["step_time_s"], r["cpu_step_time_s"], bool(r["in_sync"])
                row.update(_comm_threads(name, r))
            row.update({f"{name}_step_ms": 1e3 * step, f"{name}_ms": 1e3 * step - row["no_sync_step_ms"],
                        f"{name}_cpu_ms": 1e3 * cpu, f"{name}_vs_no_sync": row["no_sync_step_ms"] / (1e3 * step)})
            if name != "barrier":  # the barrier's workers drift apart by design: nothing to compare
                row[f"{name}_in_sync"] = in_sync
        row["exchange_ms"] = row["horovod_ms"]
        rows.append(row)
    return pd.DataFrame(rows)
