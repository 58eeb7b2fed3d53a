"""Train many configs in parallel worker processes, save each result as it lands, resume; Pareto front.

The generic runner: it knows configs (dicts of JSON values) and a train function, nothing about networks.
Workers are processes (each starts TensorFlow's runtime itself: forked before any op ran, or spawned; see
labkit.sweep.workerpool), each pinned to its own thread budget so K workers do not fight over the same cores, and
each dies with the process that started it.

    from labkit import sweep
    run = sweep.run_sweep(configs, train_fn, "runs/sweep.jsonl", num_workers=2)
    df = run.to_dataframe(); front = sweep.pareto_front(zip(df.memory_bytes, df.accuracy))

train_fn(config) returns {"accuracy": ..., "memory_bytes": ..., ...}; if it has settings(), those are
stored in every record and a resume refuses a file made with other settings. Results file: JSON lines,
one record per config, merged into the file under its lock and rewritten through labkit.base.resultsfile's atomic
writer after every result, so a kill at any moment leaves the previous complete file, and two sweeps writing
the same file keep every record of both. labkit.sweep.networks uses it for the MATLAB white
paper's 16 networks. (05_network_sweep)
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from labkit.base import machine
from labkit.base.checks import check_int, check_ints
from labkit.base.resultsfile import locked
from labkit.sweep.store import (
    ResultsNotSaved,
    check_writable,
    load_results,
    merge_records,
    records_dataframe,
    settings_mismatch,
    write_results,
)
from labkit.sweep.workerpool import kill_pool, new_pool, one_server, raise_interrupt

_RUNNER_KEYS = ("key", "name", "config", "settings", "status", "error", "accuracy", "memory_bytes",
                "train_time_s", "wall_time_s", "cpu_time_s", "worker_pid", "threads", "finished_at")


def config_key(cfg: dict) -> str:
    """The identity of a config in the results file (canonical JSON, keys sorted). (05_network_sweep)"""
    if not isinstance(cfg, dict):
        raise ValueError(f"configs must be dicts of JSON values; got {type(cfg).__name__}: {cfg!r}")
    try:
        return json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    except TypeError as err:
        raise ValueError(f"configs must be dicts of JSON values; {cfg!r}: {err}") from None


def config_name(cfg: dict) -> str:
    """A readable name for any config: k=v pairs joined, keys sorted (a train function's name() wins).
    (05_network_sweep)"""
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


# ----------------------------------------------------------------------------- Pareto front
def pareto_front(points) -> list[int]:
    """Indices of the (memory, accuracy) points no other point beats, ordered by memory.

    A point is beaten when another has less or equal memory and higher or equal accuracy, one strictly.
    Exact duplicates do not beat each other, so both stay on the front (or both leave it). (05_network_sweep)
    """
    pts = []
    for i, p in enumerate(points):
        try:
            m, a = (float(v) for v in p)
        except (TypeError, ValueError):
            raise ValueError(f"points must be (memory, accuracy) pairs of numbers; point {i} is {p!r}") from None
        if not (math.isfinite(m) and math.isfinite(a)):
            raise ValueError(f"points must be finite (drop failed configs first); point {i} is {p!r}")
        pts.append((m, a, i))
    # memory ascending, accuracy descending: every point that could beat p comes before p's group
    pts.sort(key=lambda t: (t[0], -t[1], t[2]))
    front, best_before = [], -math.inf  # best accuracy among points with strictly smaller memory
    j = 0
    while j < len(pts):
        m = pts[j][0]
        group = [t for t in pts[j:] if t[0] == m]
        top = group[0][1]
        if top > best_before:  # equal accuracy at smaller memory would beat it
            front.extend(t[2] for t in group if t[1] == top)
        best_before = max(best_before, top)
        j += len(group)
    return front


# ----------------------------------------------------------------------------- worker side
def _warm(train_fn) -> int:
    """Start-up task: load what the train function caches (data), so timing starts with ready workers."""
    prepare = getattr(train_fn, "prepare", None)
    if callable(prepare):
        prepare()
    time.sleep(0.05)
    return os.getpid()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_config(train_fn, cfg: dict, threads=None, name=None, settings=None) -> dict:
    """Train one config (in a worker) and return its record; an exception becomes status="error". (05_network_sweep)"""
    record = {"key": config_key(cfg), "name": name or config_name(cfg), "config": cfg, "worker_pid": os.getpid(),
              "threads": threads}
    if settings is not None:
        record["settings"] = settings
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        out = train_fn(dict(cfg))
        if not isinstance(out, dict) or "accuracy" not in out or "memory_bytes" not in out:
            raise TypeError(f"train function must return a dict with 'accuracy' and 'memory_bytes'; got {out!r}")
        wall = time.perf_counter() - start
        record.update({k: v for k, v in out.items() if k not in _RUNNER_KEYS})
        record.update(status="ok", error=None, accuracy=float(out["accuracy"]), memory_bytes=int(out["memory_bytes"]),
                      train_time_s=float(out.get("train_time_s", wall)), wall_time_s=wall,
                      cpu_time_s=time.process_time() - start_cpu)
    except Exception as err:  # recorded, never raised: one bad config must not stop the sweep
        tb = traceback.format_exc().strip().splitlines()
        record.update(status="error", error=f"{type(err).__name__}: {err}", traceback=tb[-6:],
                      accuracy=None, memory_bytes=None, train_time_s=None, wall_time_s=time.perf_counter() - start)
    record["finished_at"] = _now()
    json.dumps(record)  # fail here, in the worker, on values the results file cannot hold
    return record


# ----------------------------------------------------------------------------- the runner
@dataclass
class SweepRun:
    """What run_sweep did: every config's record (in the order given) and how long it took. (05_network_sweep)"""

    records: list
    out: Path
    num_workers: int
    threads_per_worker: int
    ran: int = 0  # configs trained by this call
    skipped: int = 0  # configs already finished in the results file
    wall_s: float = 0.0  # from the first config submitted to the last result (workers already started)
    startup_s: float = 0.0  # starting the workers (TF import, data load)
    crashed_workers: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> list:
        return [r for r in self.records if r.get("status") != "ok"]

    def to_dataframe(self):
        return records_dataframe(self.records)


def run_sweep(configs, train_fn, out, *, num_workers: int = 1, threads_per_worker: int | None = None,
              resume: bool = True, retry_failed: bool = True, max_new: int | None = None,
              tensorflow: bool = True, warmup: bool = True, progress: bool = True) -> SweepRun:
    """Train each config with train_fn(config) -> {"accuracy", "memory_bytes", ...} in num_workers processes.

    out: JSON-lines results file; each result is merged into it under its lock and the file rewritten
    atomically (another sweep on the same file keeps its records). resume=True skips configs
    that already have an "ok" record there (and failed ones too if retry_failed=False), and refuses a file
    made with other train_fn.settings(); resume=False starts the file over when its first new result lands (a
    sweep stopped before then leaves the file as it was). threads_per_worker: default
    cores // num_workers (at least 1). max_new: train at most this many configs in this call (a lease
    that ends early). tensorflow: workers import TensorFlow and pin its thread pools at start-up.
    train_fn must be picklable (a module-level function or an object such as netsweep.NetworkTrainer);
    optional methods: prepare() (each worker calls it before timing starts), name(config), settings().
    Workers die with this process (even on SIGKILL); SIGTERM acts like Ctrl-C: the results so far stay in
    out, the workers end, KeyboardInterrupt is raised. Workers load the calling script as spawned processes
    do, so a script that calls run_sweep needs the `if __name__ == "__main__":` guard (notebooks and
    `labkit sweep` do not). (05_network_sweep)
    """
    configs, keys, threads = _checked(configs, num_workers, threads_per_worker, max_new)
    out = Path(out)
    check_writable(out)
    namer = getattr(train_fn, "name", None)
    names = [namer(c) if callable(namer) else config_name(c) for c in configs]
    settings = train_fn.settings() if callable(getattr(train_fn, "settings", None)) else None
    done = _previous(out, resume, settings)  # key -> record; records of other configs in the file are kept
    starting_over = [not resume]  # the file is emptied by the first result that lands, not before

    def finished(key):
        rec = done.get(key)
        return rec is not None and (rec.get("status") == "ok" or not retry_failed)

    todo = [(c, n) for c, k, n in zip(configs, keys, names) if not finished(k)]
    skipped = len(configs) - len(todo)
    if max_new is not None:
        todo = todo[:max_new]
    run = SweepRun(records=[], out=out, num_workers=num_workers, threads_per_worker=threads, skipped=skipped)
    bar = _bar(len(configs), num_workers, skipped) if progress else None

    def land(rec):
        # merged under the results file's lock: records another sweep wrote to out meanwhile are kept
        try:
            if starting_over[0]:
                with locked(out):
                    write_results(out, [rec])
                merged, starting_over[0] = [rec], False
            else:
                merged = merge_records(out, [rec])
        except OSError as err:  # the trained result is not lost: said with the file's name, printed first
            print(json.dumps(rec, sort_keys=True), file=sys.stderr, flush=True)
            raise ResultsNotSaved(out, err, [rec]) from None
        for m in merged:
            done[m["key"]] = m
        run.ran += 1
        if bar is not None:
            bar.set_postfix_str(f"{rec['name']}: {rec['status']}", refresh=False)
            bar.update(1)

    try:
        with one_server():  # the workers' fork server ends with the last sweep that uses it
            _train(todo, train_fn, run, land, threads, tensorflow, warmup, settings)
    finally:
        if bar is not None:
            bar.close()
    run.records = [done[k] for k in keys if k in done]
    return run


def _bar(total, num_workers, skipped):
    from labkit.base import progress as progress_bars  # networks done / total, rate and time left

    return progress_bars.bar(total, f"sweep ({num_workers} workers)", "config", initial=skipped)


def check_workers(num_workers, name: str = "num_workers", *, oversubscribe: bool = True) -> int:
    """The sweep's worker count as an int >= 1 and, unless oversubscribe, no more than this machine's cores
    (machine.refuse_more_than_cores, as `labkit scale --np`); else ValueError naming name. (05_network_sweep)"""
    num_workers = check_int(num_workers, name, minimum=1)
    if not oversubscribe:
        machine.refuse_more_than_cores(num_workers, name, "worker processes", "nothing would finish for minutes")
    return num_workers


def _checked(configs, num_workers, threads_per_worker, max_new):
    """(configs as a list, their keys, threads per worker), or ValueError naming the bad argument."""
    configs = list(configs)
    keys = [config_key(c) for c in configs]
    seen = set()
    for c, k in zip(configs, keys):
        if k in seen:
            raise ValueError(f"configs must be unique; {c!r} appears twice")
        seen.add(k)
    check_workers(num_workers)
    threads = check_int(threads_per_worker if threads_per_worker is not None else
                        max(1, machine.cores() // num_workers), "threads_per_worker", minimum=1)
    if max_new is not None:
        check_int(max_new, "max_new", minimum=0)
    return configs, keys, threads


def _previous(out: Path, resume: bool, settings) -> dict:
    """The records already in out, by key (resume), after checking their settings; {} otherwise (the file is left
    as it is until the first new result replaces it)."""
    if not resume:
        return {}
    done = {rec["key"]: rec for rec in load_results(out)}
    if settings is not None:
        why = settings_mismatch(done.values(), settings, out)
        if why:
            raise ValueError(f"resume: {why}; resume with the same settings, start over with resume=False, "
                             "or use another out file")
    return done


def _train(todo, train_fn, run, land, threads, tensorflow, warmup, settings) -> None:
    """Start the pool, train todo, end the workers on any exit (SIGTERM acts as Ctrl-C meanwhile)."""
    if not todo:
        return
    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, raise_interrupt)  # SIGTERM = Ctrl-C: keep results, end workers
    try:
        pool = new_pool(run.num_workers, threads, tensorflow)
        try:
            t0 = time.perf_counter()
            if warmup:
                _warm_pool(pool, train_fn, run.num_workers)
            run.startup_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            pool = _drive(pool, todo, train_fn, run.num_workers, threads, tensorflow, land, run, settings)
            run.wall_s = time.perf_counter() - t1
        except BaseException:
            kill_pool(pool)
            raise
        pool.shutdown(wait=True)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _warm_pool(pool, train_fn, num_workers) -> None:
    """Wait until every worker has started (ran its initializer and train_fn.prepare())."""
    pids = set()
    for _ in range(20):
        pids.update(f.result() for f in [pool.submit(_warm, train_fn) for _ in range(num_workers)])
        if len(pids) >= num_workers:
            return


def _drive(pool, todo, train_fn, num_workers, threads, tensorflow, land, run, settings):
    """Keep num_workers configs in flight; a worker that dies takes only its own config down.

    When a worker process dies (killed, out of memory), the pool fails every config in flight; those are
    re-run one at a time in a fresh pool so the config that kills its worker is found and recorded as an
    error, and the others are trained normally.
    """
    queue, isolate, inflight = deque(todo), deque(), {}
    while queue or isolate or inflight:
        if isolate:
            if not inflight:
                cfg, name = isolate.popleft()
                inflight[pool.submit(run_config, train_fn, cfg, threads, name, settings)] = (cfg, name, True)
        else:
            while queue and len(inflight) < num_workers:
                cfg, name = queue.popleft()
                inflight[pool.submit(run_config, train_fn, cfg, threads, name, settings)] = (cfg, name, False)
        finished, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
        crashed = []
        for fut in finished:
            cfg, name, alone = inflight.pop(fut)
            try:
                land(fut.result())
            except BrokenProcessPool:
                crashed.append((cfg, name, alone))
        if crashed:
            # the pool is gone: every config still in flight fails the same way
            for fut, (cfg, name, alone) in list(inflight.items()):
                try:
                    land(fut.result())
                except BrokenProcessPool:
                    crashed.append((cfg, name, alone))
            inflight.clear()
            run.crashed_workers += 1
            pool.shutdown(wait=True)
            pool = new_pool(num_workers, threads, tensorflow)
            for cfg, name, alone in crashed:
                if alone or (len(crashed) == 1 and not isolate):
                    rec = {"key": config_key(cfg), "name": name, "config": cfg, "status": "error",
                           "error": "worker process died while training this config (killed or out of memory)",
                           "accuracy": None, "memory_bytes": None, "train_time_s": None, "wall_time_s": None,
                           "worker_pid": None, "threads": threads, "finished_at": _now()}
                    if settings is not None:
                        rec["settings"] = settings
                    land(rec)
                else:
                    isolate.append((cfg, name))
    return pool


# ----------------------------------------------------------------------------- speedup vs workers
def measure_speedup(configs, train_fn, workers=(1, 2), out_dir=None, threads_per_worker=None, repeats: int = 1,
                    tensorflow: bool = True, progress: bool = False):
    """Train the same configs with each worker count; DataFrame of wall time, speedup, efficiency.

    Workers are started (and their data loaded) before the clock starts, so wall_s is the sweep itself.
    repeats > 1 runs the worker counts interleaved (1, 2, 1, 2, ...) and keeps the median, so a machine
    whose load drifts does not favour one count. cores_used = the workers' CPU seconds / wall seconds: how
    many cores' worth of compute the sweep really got (low on a busy shared machine).
    threads_per_worker: default cores // workers (the fair split); pass a number to oversubscribe on purpose.
    (05_network_sweep)
    """
    import statistics
    import tempfile

    import pandas as pd

    workers = check_ints(workers, "workers", minimum=1)
    repeats = check_int(repeats, "repeats", minimum=1)
    runs = {k: [] for k in workers}
    with tempfile.TemporaryDirectory(prefix="labkit-speedup-") as tmp, one_server():  # one for all the counts
        base = Path(out_dir) if out_dir is not None else Path(tmp)
        for rep in range(repeats):
            for k in workers:
                runs[k].append(run_sweep(configs, train_fn, base / f"speedup_{k}_workers_{rep}.jsonl",
                                         num_workers=k, threads_per_worker=threads_per_worker, resume=False,
                                         tensorflow=tensorflow, warmup=True, progress=progress))
    rows = []
    for k in workers:
        walls = [r.wall_s for r in runs[k]]
        cpu = [sum(rec.get("cpu_time_s") or 0.0 for rec in r.records) / max(r.wall_s, 1e-9) for r in runs[k]]
        rows.append({"workers": k, "threads_per_worker": runs[k][0].threads_per_worker, "configs": len(configs),
                     "failed": max(len(r.failed) for r in runs[k]), "wall_s": statistics.median(walls),
                     "wall_s_min": min(walls), "startup_s": statistics.median(r.startup_s for r in runs[k]),
                     "cores_used": statistics.median(cpu)})
    df = pd.DataFrame(rows)
    reference = df.loc[df.workers == min(workers), "wall_s"].iloc[0]
    df["speedup"] = reference / df["wall_s"] * min(workers)  # relative to one worker (scaled if 1 absent)
    df["efficiency"] = df["speedup"] / df["workers"]
    return df


def plot_speedup(df, ax=None, cores=None):
    """Measured speedup vs workers with the ideal (linear) line and the core count (05_network_sweep)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5, 4))[1]
    k = list(df.workers)
    ax.plot(k, k, "--", color="tab:gray", label="ideal (speedup = workers)")
    ax.plot(k, df.speedup, "o-", color="tab:blue", label="measured")
    cores = cores or machine.cores()
    ax.axvline(cores, color="tab:orange", alpha=0.5, label=f"{cores} cores")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("speedup (x)")
    ax.set_xticks(k)
    ax.legend()
    return ax
