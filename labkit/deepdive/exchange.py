"""What Horovod's gradient exchange adds to a step on one machine, taken apart (07_scaling_deep_dive).

`exchange_cost()`: per batch size, the workers with and without the exchange in one launch
(labkit.scale.scaling.run_paired), beside a barrier that only makes them step together, Horovod sending the
gradients as one group and TensorFlow's own MultiWorkerMirroredStrategy, with the CPU time per step of each.
"""
from __future__ import annotations

from labkit.base.checks import check_int, check_ints
from labkit.scale import scaling


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
    """Per batch size, the step with and without Horovod's exchange (one launch), beside each of variants."""
    import pandas as pd
    batches = check_ints([batches] if isinstance(batches, int) else batches, "batches", minimum=1)
    check_int(np_, "np_", minimum=2)  # an exchange needs two workers
    variants = [variants] if isinstance(variants, str) else list(variants)
    bad = [v for v in variants if v not in EXCHANGE_VARIANTS]
    if bad:
        raise ValueError(f"variants must be names from {EXCHANGE_VARIANTS}; got {bad[0]!r}")
    run_kw = {"data": "random", **run_kw, "threads": 1}
    extra = tuple(run_kw.pop("extra", ()))
    rows = []
    for b in batches:
        hvd, free = (df.iloc[0] for df in scaling.run_paired([np_], batch_size=b, progress=progress, extra=extra,
                                                             **run_kw))
        row = {"batch": b, "no_sync_step_ms": 1e3 * free["step_time_s"],
               "no_sync_cpu_ms": 1e3 * free["cpu_step_time_s"], **_comm_threads("no_sync", free)}
        for name in ["horovod", *variants]:
            step, cpu, in_sync, comm = _variant(name, np_, b, hvd, extra, progress, run_kw)
            row.update({**comm, f"{name}_step_ms": 1e3 * step, f"{name}_ms": 1e3 * step - row["no_sync_step_ms"],
                        f"{name}_cpu_ms": 1e3 * cpu, f"{name}_vs_no_sync": row["no_sync_step_ms"] / (1e3 * step)})
            if name != "barrier":  # the barrier's workers drift apart by design: nothing to compare
                row[f"{name}_in_sync"] = in_sync
        row["exchange_ms"] = row["horovod_ms"]
        rows.append(row)
    return pd.DataFrame(rows)


def _variant(name, np_, b, hvd, extra, progress, run_kw):
    """(step s, CPU s per step, weights equal, the comm threads' columns) of one variant at batch b; "horovod" is
    the paired launch's row hvd, the others a launch of their own."""
    if name == "tf_distribute":
        from labkit.deepdive import tfdist_train
        workers = tfdist_train.run_local(np_, model=run_kw.get("model", scaling.DEFAULT_MODEL), batch_size=b,
                                         steps=run_kw.get("steps", 20) * run_kw.get("repeats", 3),
                                         timeout=run_kw.get("timeout", 300))
        return (max(w["median_step_s"] for w in workers),
                float(sorted(w["cpu_step_time_s"] for w in workers)[len(workers) // 2]),
                len({w["checksum_trainable"] for w in workers}) == 1, {})
    launches = {"barrier": dict(sync=False, extra=extra + ("--barrier",)),
                "one_group": dict(sync=True, extra=extra + ("--num-groups", "1"))}
    r = hvd if name == "horovod" else scaling.run([np_], batch_size=b, progress=progress, **launches[name],
                                                  **run_kw).iloc[0]
    return r["step_time_s"], r["cpu_step_time_s"], bool(r["in_sync"]), _comm_threads(name, r)
