"""Train many network configs in parallel worker processes, save each result as it lands, resume; Pareto front.

The white paper behind seed 000 trains 16 CIFAR-10 networks with MATLAB's parfor and keeps the ones on
the accuracy-vs-memory Pareto front. Here the workers are processes (spawned, so TensorFlow starts clean
in each), each pinned to its own thread budget so K workers do not fight over the same cores.

    from labkit import sweep
    run = sweep.run_sweep(sweep.seed000_configs(), sweep.Seed000Trainer(epochs=1), "runs/sweep.jsonl",
                          num_workers=2)
    df = run.to_dataframe(); front = sweep.pareto_front(zip(df.memory_bytes, df.accuracy))

Results file: JSON lines, one record per config, rewritten whole through a temporary file and os.replace
after every result, so a kill at any moment leaves the previous complete file. (05_network_sweep)
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from labkit import config

BYTES_PER_PARAM = 4  # single precision, as the white paper's getMemoryFootprint
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
_RUNNER_KEYS = ("key", "name", "config", "status", "error", "accuracy", "params", "memory_bytes",
                "train_time_s", "wall_time_s", "cpu_time_s", "worker_pid", "threads", "finished_at")


# ----------------------------------------------------------------------------- configs
def seed000_configs() -> list[dict]:
    """Seed 000's 16 networks: filters {20, 32} x filter size {5, 3} x pool {3, 2} x extra conv {no, yes}."""
    from labkit.models.cifar import SEED000_SWEEP  # the model module owns the grid

    return [dict(c) for c in SEED000_SWEEP]


def config_name(cfg: dict) -> str:
    """Short readable name: f20_k5_p3 (+ _x with the extra conv layer); other dicts: k=v joined."""
    if set(cfg) == {"filters", "filter_size", "pool_size", "extra_conv"}:
        return f"f{cfg['filters']}_k{cfg['filter_size']}_p{cfg['pool_size']}" + ("_x" if cfg["extra_conv"] else "")
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def config_key(cfg: dict) -> str:
    """The identity of a config in the results file (canonical JSON, keys sorted)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"configs must be dicts of JSON values; got {type(cfg).__name__}: {cfg!r}")
    try:
        return json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    except TypeError as err:
        raise ValueError(f"configs must be dicts of JSON values; {cfg!r}: {err}") from None


def matlab_param_count(cfg: dict, input_shape=(32, 32, 3), classes: int = 10, include_mean_image=False) -> int:
    """Learnable parameters of a seed 000 network by the white paper's own formulas (getMemoryFootprint).

    conv: (prod(FilterSize) * NumChannels + 1) * NumFilters; fully connected: (InputSize + 1) * OutputSize;
    pooling without padding: out = floor((in - pool) / 2) + 1. MATLAB also counts the input layer's
    zero-centring mean image (prod(InputSize) values); include_mean_image=True adds it.
    """
    h, w, c = input_shape
    f, k, p = cfg["filters"], cfg["filter_size"], cfg["pool_size"]
    params = (k * k * c + 1) * f
    h, w = (h - p) // 2 + 1, (w - p) // 2 + 1
    if cfg["extra_conv"]:
        params += (k * k * f + 1) * f
    params += (k * k * f + 1) * 2 * f
    h, w = (h - p) // 2 + 1, (w - p) // 2 + 1
    params += (h * w * 2 * f + 1) * classes
    return params + (input_shape[0] * input_shape[1] * c if include_mean_image else 0)


def count_params(model) -> int:
    """Learnable (trainable) parameters of a built Keras model."""
    return int(sum(int(math.prod(w.shape)) for w in model.trainable_weights))


# ----------------------------------------------------------------------------- Pareto front
def pareto_front(points) -> list[int]:
    """Indices of the (memory, accuracy) points no other point beats, ordered by memory.

    A point is beaten when another has less or equal memory and higher or equal accuracy, one strictly.
    Exact duplicates do not beat each other, so both stay on the front (or both leave it).
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
def available_cores() -> int:
    """CPU cores this process may run on (affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


_THREADPOOL_LIMITS = None  # keeps threadpoolctl's limit alive for the worker's lifetime


def limit_threads(threads: int, tensorflow: bool = True) -> None:
    """Pin this process to `threads` compute threads: OpenMP/BLAS pools and, if asked, TensorFlow's.

    Call before TensorFlow runs its first op (a spawned worker's start-up); afterwards TF's pools are fixed.
    """
    global _THREADPOOL_LIMITS
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int; got {threads!r}")
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits

        _THREADPOOL_LIMITS = threadpool_limits(limits=threads)
    except ImportError:  # the environment variables still apply to libraries loaded later
        pass
    if tensorflow:
        import labkit  # noqa: F401  (TF log level before TF)
        import tensorflow as tf

        labkit.quiet()
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def thread_report() -> dict:
    """What this process's thread limits are now: env vars, BLAS pools, TensorFlow's pools (if imported)."""
    report = {var: os.environ.get(var) for var in THREAD_ENV_VARS}
    try:
        from threadpoolctl import threadpool_info

        report["blas_threads"] = [info["num_threads"] for info in threadpool_info()]
    except ImportError:
        report["blas_threads"] = []
    if "tensorflow" in sys.modules:
        tf = sys.modules["tensorflow"]
        report["tf_intra_op"] = tf.config.threading.get_intra_op_parallelism_threads()
        report["tf_inter_op"] = tf.config.threading.get_inter_op_parallelism_threads()
    return report


def _worker_init(threads: int, tensorflow: bool) -> None:
    limit_threads(threads, tensorflow=tensorflow)


def _warm(train_fn) -> int:
    """Start-up task: load what the train function caches (data), so timing starts with ready workers."""
    prepare = getattr(train_fn, "prepare", None)
    if callable(prepare):
        prepare()
    time.sleep(0.05)
    return os.getpid()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_config(train_fn, cfg: dict, threads=None) -> dict:
    """Train one config (in a worker) and return its record; an exception becomes status="error"."""
    record = {"key": config_key(cfg), "name": config_name(cfg), "config": cfg, "worker_pid": os.getpid(),
              "threads": threads}
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        out = train_fn(dict(cfg))
        if not isinstance(out, dict) or "accuracy" not in out or "params" not in out:
            raise TypeError(f"train function must return a dict with 'accuracy' and 'params'; got {out!r}")
        wall = time.perf_counter() - start
        params = int(out["params"])
        extra = {k: v for k, v in out.items() if k not in _RUNNER_KEYS}
        record.update(extra)
        record.update(status="ok", error=None, accuracy=float(out["accuracy"]), params=params,
                      memory_bytes=BYTES_PER_PARAM * params,
                      train_time_s=float(out.get("train_time_s", wall)), wall_time_s=wall,
                      cpu_time_s=time.process_time() - start_cpu)
    except Exception as err:  # recorded, never raised: one bad config must not stop the sweep
        tb = traceback.format_exc().strip().splitlines()
        record.update(status="error", error=f"{type(err).__name__}: {err}", traceback=tb[-6:],
                      accuracy=None, params=None, memory_bytes=None, train_time_s=None,
                      wall_time_s=time.perf_counter() - start)
    record["finished_at"] = _now()
    json.dumps(record)  # fail here, in the worker, on values the results file cannot hold
    return record


# ----------------------------------------------------------------------------- results file
def load_results(path) -> list[dict]:
    """Records in a results file (JSON lines); [] if it does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"results file {path} line {lineno} is not JSON ({err}); fix or delete that line, "
                             "or start over with resume=False / --overwrite") from None
        if not isinstance(rec, dict) or "key" not in rec:
            raise ValueError(f"results file {path} line {lineno} is not a sweep record (no 'key')")
        records.append(rec)
    return records


def write_results(path, records) -> None:
    """Write all records at once: temp file in the same directory, fsync, os.replace (atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# ----------------------------------------------------------------------------- the runner
@dataclass
class SweepRun:
    """What run_sweep did: every config's record (in the order given) and how long it took."""

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


def records_dataframe(records):
    """Records as a pandas DataFrame: one row per config, config keys as columns, memory in KB."""
    import pandas as pd

    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k not in ("config", "traceback")}
        row.update(r.get("config") or {})
        rows.append(row)
    df = pd.DataFrame(rows)
    if "memory_bytes" in df:
        df["memory_kb"] = df["memory_bytes"] / 1e3
    return df


def _new_pool(num_workers, threads, tensorflow):
    return cf.ProcessPoolExecutor(max_workers=num_workers, mp_context=mp.get_context("spawn"),
                                  initializer=_worker_init, initargs=(threads, tensorflow))


def _kill_pool(pool) -> None:
    # the workers are our own children; terminate them so an interrupt does not leave training running
    for proc in list(getattr(pool, "_processes", {}).values()):
        try:
            proc.terminate()
        except Exception:
            pass
    pool.shutdown(wait=False, cancel_futures=True)


def run_sweep(configs, train_fn, out, *, num_workers: int = 1, threads_per_worker: int | None = None,
              resume: bool = True, retry_failed: bool = True, max_new: int | None = None,
              tensorflow: bool = True, warmup: bool = True, progress: bool = True) -> SweepRun:
    """Train each config with train_fn(config) -> {"accuracy", "params", ...} in num_workers processes.

    out: JSON-lines results file, rewritten atomically after every result. resume=True skips configs
    that already have an "ok" record there (and failed ones too if retry_failed=False); resume=False
    starts the file over. threads_per_worker: default cores // num_workers (at least 1). max_new: train at
    most this many configs in this call (a lease that ends early). tensorflow: workers import TensorFlow
    and pin its thread pools at start-up. train_fn must be picklable (a module-level function or an
    object such as Seed000Trainer); if it has a prepare() method, each worker calls it before timing starts.
    Workers are spawned, so a script that calls run_sweep needs the `if __name__ == "__main__":` guard
    (notebooks and the `labkit sweep` command do not).
    """
    configs = list(configs)
    keys = [config_key(c) for c in configs]
    seen = set()
    for c, k in zip(configs, keys):
        if k in seen:
            raise ValueError(f"configs must be unique; {c!r} appears twice")
        seen.add(k)
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int; got {num_workers!r}")
    threads = threads_per_worker if threads_per_worker is not None else max(1, available_cores() // num_workers)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads_per_worker must be a positive int; got {threads_per_worker!r}")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
        raise ValueError(f"max_new must be a non-negative int or None; got {max_new!r}")
    out = Path(out)

    done = {}  # key -> record, in file order; records of other configs in the file are kept untouched
    if resume:
        for rec in load_results(out):
            done[rec["key"]] = rec
    else:
        write_results(out, [])

    def finished(key):
        rec = done.get(key)
        return rec is not None and (rec.get("status") == "ok" or not retry_failed)

    todo = [c for c, k in zip(configs, keys) if not finished(k)]
    skipped = len(configs) - len(todo)
    if max_new is not None:
        todo = todo[:max_new]
    run = SweepRun(records=[], out=out, num_workers=num_workers, threads_per_worker=threads, skipped=skipped)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(configs), initial=skipped, desc=f"sweep ({num_workers} workers)", unit="config")

    def land(rec):
        done[rec["key"]] = rec  # a retried config replaces its old record
        write_results(out, list(done.values()))
        run.ran += 1
        if bar is not None:
            bar.set_postfix_str(f"{rec['name']}: {rec['status']}", refresh=False)
            bar.update(1)

    if todo:
        pool = _new_pool(num_workers, threads, tensorflow)
        try:
            t0 = time.perf_counter()
            if warmup:
                _warm_pool(pool, train_fn, num_workers)
            run.startup_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            pool = _drive(pool, todo, train_fn, num_workers, threads, tensorflow, land, run)
            run.wall_s = time.perf_counter() - t1
        except BaseException:
            _kill_pool(pool)
            if bar is not None:
                bar.close()
            raise
        pool.shutdown(wait=True)
    if bar is not None:
        bar.close()
    run.records = [done[k] for k in keys if k in done]
    return run


def _warm_pool(pool, train_fn, num_workers) -> None:
    """Wait until every worker has started (ran its initializer and train_fn.prepare())."""
    pids = set()
    for _ in range(20):
        pids.update(f.result() for f in [pool.submit(_warm, train_fn) for _ in range(num_workers)])
        if len(pids) >= num_workers:
            return


def _drive(pool, todo, train_fn, num_workers, threads, tensorflow, land, run):
    """Keep num_workers configs in flight; a worker that dies takes only its own config down.

    When a worker process dies (killed, out of memory), the pool fails every config in flight; those are
    re-run one at a time in a fresh pool so the config that kills its worker is found and recorded as an
    error, and the others are trained normally.
    """
    queue, isolate, inflight = deque(todo), deque(), {}
    while queue or isolate or inflight:
        if isolate:
            if not inflight:
                cfg = isolate.popleft()
                inflight[pool.submit(run_config, train_fn, cfg, threads)] = (cfg, True)
        else:
            while queue and len(inflight) < num_workers:
                cfg = queue.popleft()
                inflight[pool.submit(run_config, train_fn, cfg, threads)] = (cfg, False)
        done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
        crashed = []
        for fut in done:
            cfg, alone = inflight.pop(fut)
            try:
                land(fut.result())
            except BrokenProcessPool:
                crashed.append((cfg, alone))
        if crashed:
            # the pool is gone: every config still in flight fails the same way
            for fut, (cfg, alone) in list(inflight.items()):
                try:
                    land(fut.result())
                except BrokenProcessPool:
                    crashed.append((cfg, alone))
            inflight.clear()
            run.crashed_workers += 1
            pool.shutdown(wait=True)
            pool = _new_pool(num_workers, threads, tensorflow)
            for cfg, alone in crashed:
                if alone or (len(crashed) == 1 and not isolate):
                    land({"key": config_key(cfg), "name": config_name(cfg), "config": cfg, "status": "error",
                          "error": "worker process died while training this config (killed or out of memory)",
                          "accuracy": None, "params": None, "memory_bytes": None, "train_time_s": None,
                          "wall_time_s": None, "worker_pid": None, "threads": threads, "finished_at": _now()})
                else:
                    isolate.append(cfg)
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
    """
    import statistics
    import tempfile

    import pandas as pd

    workers = list(workers)
    if not workers or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in workers):
        raise ValueError(f"workers must be positive ints; got {workers!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be a positive int; got {repeats!r}")
    runs = {k: [] for k in workers}
    with tempfile.TemporaryDirectory(prefix="labkit-speedup-") as tmp:
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


# ----------------------------------------------------------------------------- tables and the pick
def config_table(configs=None):
    """The networks before training: params (Keras and the paper's formula), memory, MACs per image.

    MACs come from labkit.flops (conv and dense multiply-adds); the embedded processor pays them per frame.
    """
    import warnings

    import pandas as pd

    from labkit import flops
    from labkit.models.cifar import seed000_net

    rows = []
    for cfg in configs or seed000_configs():
        model = seed000_net(**cfg)
        with warnings.catch_warnings():  # the normalisation layer has no MAC rule; it has no MACs either
            warnings.simplefilter("ignore")
            macs = flops.count(model).macs
        params = count_params(model)
        rows.append({"name": config_name(cfg), **cfg, "params": params, "params_paper": matlab_param_count(cfg),
                     "memory_kb": BYTES_PER_PARAM * params / 1e3, "mmacs": macs / 1e6})
    return pd.DataFrame(rows)


def with_pareto(df):
    """Successful rows sorted by memory, with a boolean `pareto` column (on the front or not)."""
    ok = df[df.status == "ok"].sort_values(["memory_bytes", "name"]).reset_index(drop=True)
    front = set(pareto_front(zip(ok.memory_bytes, ok.accuracy)))
    ok["pareto"] = [i in front for i in range(len(ok))]
    return ok


def recommend(df, max_accuracy_drop: float = 0.02, memory_budget_bytes: int | None = None):
    """The network to ship: the smallest on the Pareto front within max_accuracy_drop of the best.

    memory_budget_bytes, if given, first removes networks that do not fit. Returns the chosen row.
    """
    if not 0 <= max_accuracy_drop <= 1:
        raise ValueError(f"max_accuracy_drop must be in [0, 1] (a fraction, 0.02 = 2 points); got {max_accuracy_drop!r}")
    front = with_pareto(df)
    front = front[front.pareto]
    if memory_budget_bytes is not None:
        front = front[front.memory_bytes <= memory_budget_bytes]
        if front.empty:
            raise ValueError(f"no network fits memory_budget_bytes={memory_budget_bytes}; the smallest needs "
                             f"{int(with_pareto(df).memory_bytes.min())} bytes")
    good = front[front.accuracy >= front.accuracy.max() - max_accuracy_drop]
    return good.sort_values("memory_bytes").iloc[0]


# ----------------------------------------------------------------------------- plots
def plot_pareto(df, ax=None, label_points=True):
    """Accuracy vs memory footprint (KB), the Pareto front drawn as a staircase (05_network_sweep)."""
    import matplotlib.pyplot as plt

    ok = df[df.status == "ok"].reset_index(drop=True)
    front = pareto_front(zip(ok.memory_bytes, ok.accuracy))
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    on = ok.index.isin(front)
    ax.scatter(ok.memory_kb[~on], 100 * ok.accuracy[~on], color="tab:gray", label="dominated")
    ax.scatter(ok.memory_kb[on], 100 * ok.accuracy[on], color="tab:red", zorder=3, label="Pareto front")
    f = ok.loc[front]
    ax.step(f.memory_kb, 100 * f.accuracy, where="post", color="tab:red", alpha=0.6)
    if label_points:
        for _, r in ok.iterrows():
            ax.annotate(r["name"], (r.memory_kb, 100 * r.accuracy), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("memory footprint (KB, 4 bytes x learnable parameters)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy against memory footprint")
    ax.legend(loc="best")
    return ax


def plot_speedup(df, ax=None, cores=None):
    """Measured speedup vs workers with the ideal (linear) line and the core count (05_network_sweep)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5, 4))[1]
    k = list(df.workers)
    ax.plot(k, k, "--", color="tab:gray", label="ideal (speedup = workers)")
    ax.plot(k, df.speedup, "o-", color="tab:blue", label="measured")
    cores = cores or available_cores()
    ax.axvline(cores, color="tab:orange", alpha=0.5, label=f"{cores} cores")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("speedup (x)")
    ax.set_xticks(k)
    ax.legend()
    return ax


# ----------------------------------------------------------------------------- the real train function
_DATA_CACHE = {}


@dataclass(frozen=True)
class Seed000Trainer:
    """Trains one seed 000 network and returns its test accuracy (picklable, for worker processes).

    Data: labkit.data.load_dataset() (CIFAR-10 when present, else the offline synthetic set) with train_size /
    test_size images. Training: labkit.training.compile_sgdm, seed 000's SGDM + piecewise LR + L2.
    """

    epochs: int = 1
    train_size: int | None = None
    test_size: int | None = None
    batch_size: int = 100
    lr: float = 0.01
    l2: float = 0.004
    seed: int = 0

    @classmethod
    def for_profile(cls, name=None, **overrides):
        """Settings scaled to the profile: quick (seconds per network), workshop (~20 s), full (seed 000's)."""
        from labkit import training

        opts = training.seed000_options(name)
        settings = dict(lr=opts["lr"], l2=opts["l2"], batch_size=opts["batch_size"])
        settings.update(config.by_profile(
            quick=dict(epochs=1, train_size=1000, test_size=500, batch_size=25),
            workshop=dict(epochs=3, train_size=2000, test_size=1000, batch_size=25),
            full=dict(epochs=opts["epochs"], train_size=opts["n_train"], test_size=opts["n_test"]),
            name=name))
        settings.update(overrides)
        return cls(**settings)

    def prepare(self):
        """Load, normalise and cache (in this process) the data."""
        key = (self.train_size, self.test_size)
        if key not in _DATA_CACHE:
            from labkit import data

            (x_train, y_train), (x_test, y_test), info = data.load_dataset(n_train=self.train_size,
                                                                            n_test=self.test_size)
            _DATA_CACHE[key] = (data.normalize(x_train), y_train, data.normalize(x_test), y_test, info.name)
        return _DATA_CACHE[key]

    def __call__(self, cfg: dict) -> dict:
        from labkit import training
        from labkit.models.cifar import memory_footprint, seed000_net

        x_train, y_train, x_test, y_test, dataset = self.prepare()
        config.set_seed(self.seed)
        model = seed000_net(**cfg, input_shape=tuple(x_train.shape[1:]), classes=int(y_train.max()) + 1)
        steps = -(-len(x_train) // self.batch_size)
        # seed 000 drops the LR x0.1 at 3/4 of its epochs (30 of 40); runs of a few epochs never get far
        # enough for a drop to help, so they keep the LR constant
        drop_period = (3 * self.epochs) // 4 if self.epochs >= 8 else self.epochs
        training.compile_sgdm(model, lr=self.lr, momentum=0.9, l2=self.l2, steps_per_epoch=steps,
                              drop_period=drop_period)
        start = time.perf_counter()
        model.fit(x_train, y_train, batch_size=self.batch_size, epochs=self.epochs, verbose=0, shuffle=True)
        train_time = time.perf_counter() - start
        _, accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
        return {"accuracy": float(accuracy), "params": count_params(model),
                "memory_bytes_keras": memory_footprint(model), "train_time_s": train_time,
                "dataset": dataset, "epochs": self.epochs, "train_images": int(len(x_train)),
                "test_images": int(len(x_test))}


# ----------------------------------------------------------------------------- CLI
def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labkit sweep",
        description="Train seed 000's 16 CIFAR-10 networks in parallel worker processes; each result is "
                    "saved as it lands, so an interrupted sweep resumes where it stopped.",
        epilog="Example: labkit sweep --workers 2 --out runs/sweep.jsonl --resume")
    parser.add_argument("--workers", type=_positive_int, default=1, help="worker processes (default 1)")
    parser.add_argument("--threads-per-worker", type=_positive_int, default=None,
                        help="compute threads per worker (default: cores // workers)")
    parser.add_argument("--out", type=Path, default=Path("runs/sweep.jsonl"),
                        help="results file, JSON lines (default runs/sweep.jsonl)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip configs already finished in --out")
    mode.add_argument("--overwrite", action="store_true", help="start --out over, discarding its results")
    parser.add_argument("--configs", default=None,
                        help="comma-separated config names to run (e.g. f20_k5_p3,f32_k3_p2_x); default all 16")
    parser.add_argument("--epochs", type=_positive_int, default=None, help="epochs per network (default: profile)")
    parser.add_argument("--train-size", type=_positive_int, default=None, help="training images (default: profile)")
    parser.add_argument("--test-size", type=_positive_int, default=None, help="test images (default: profile)")
    parser.add_argument("--list", action="store_true", help="list the configs with parameters and memory; train nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def cli_main(argv: list[str]) -> int:
    """`labkit sweep [--workers K] [--out FILE] [--resume]` (05_network_sweep)."""
    args = build_parser().parse_args(argv)
    configs = seed000_configs()
    if args.configs:
        by_name = {config_name(c): c for c in configs}
        wanted = [n.strip() for n in args.configs.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            print(f"labkit sweep: --configs has unknown names {', '.join(unknown)}; choose from "
                  f"{', '.join(by_name)}", file=sys.stderr)
            return 2
        configs = [by_name[n] for n in wanted]
    if args.list:
        print(f"{'config':<14} {'params':>8} {'memory (KB)':>12}")
        for c in configs:
            p = matlab_param_count(c)
            print(f"{config_name(c):<14} {p:>8} {BYTES_PER_PARAM * p / 1e3:>12.1f}")
        return 0
    if args.out.exists() and load_results(args.out) and not (args.resume or args.overwrite):
        print(f"labkit sweep: {args.out} already holds results; pass --resume to skip finished configs "
              "or --overwrite to start over", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("epochs", args.epochs), ("train_size", args.train_size),
                                   ("test_size", args.test_size)) if v is not None}
    trainer = Seed000Trainer.for_profile(**overrides)
    print(config.describe())
    print(f"{len(configs)} configs, {args.workers} workers, trainer {trainer}", flush=True)
    run = run_sweep(configs, trainer, args.out, num_workers=args.workers, threads_per_worker=args.threads_per_worker,
                    resume=not args.overwrite, progress=not args.no_progress)
    ok = [r for r in run.records if r["status"] == "ok"]
    front = {ok[i]["key"] for i in pareto_front([(r["memory_bytes"], r["accuracy"]) for r in ok])}
    print(f"{'config':<14} {'memory (KB)':>12} {'accuracy':>9} {'train (s)':>10}  pareto")
    for r in sorted(run.records, key=lambda r: (r["memory_bytes"] is None, r["memory_bytes"] or 0)):
        if r["status"] != "ok":
            print(f"{r['name']:<14} FAILED: {r['error']}")
            continue
        print(f"{r['name']:<14} {r['memory_bytes'] / 1e3:>12.1f} {r['accuracy']:>9.3f} {r['train_time_s']:>10.1f}"
              f"  {'*' if r['key'] in front else ''}")
    print(f"trained {run.ran}, skipped {run.skipped} finished, failed {len(run.failed)}; "
          f"sweep {run.wall_s:.1f} s (+{run.startup_s:.1f} s worker start-up); results in {run.out}")
    return 1 if run.failed else 0
