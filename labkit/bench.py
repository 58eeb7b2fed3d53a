"""Timing done right, and the convolution benchmark behind `labkit conv-bench` (02_im2col).

Rules every number here follows:
- warm-up calls run first and are not timed (first calls allocate, page in memory, pick kernels);
- each method is timed several times and reported as the median, with the spread (interquartile range);
- methods being compared are timed round-robin, in rotating order, in one process: a load spike from
  another program then hits all of them alike, so the RATIOS are trustworthy even when the absolute
  GFLOP/s of a shared machine are not.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from labkit import config, conv

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
TARGETS = {"im2col_vs_tf_3x3": 0.8, "im2col_vs_gemm_3x3": 0.7, "im2col_vs_naive": 200.0}


# ----------------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """Seconds per call of one method: every timed repeat (warm-up excluded)."""

    times: list
    number: int = 1  # calls per timed repeat (several when one call is too short to time)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def spread(self) -> float:
        """Interquartile range of the repeats, in seconds."""
        q25, q75 = np.percentile(self.times, [25, 75])
        return float(q75 - q25)

    def gflops(self, flops: float) -> float:
        """GFLOP/s at the median time."""
        return flops / self.median / 1e9

    def __str__(self) -> str:
        return f"{self.median * 1e3:.2f} ms ± {self.spread / 2 * 1e3:.2f} ms (median ± IQR/2 of {len(self.times)})"


def _calibrate(fn, warmup: int, min_time: float, clock=time.perf_counter) -> int:
    """Run the warm-up calls; return how many calls one timed repeat needs to last min_time."""
    elapsed = 0.0
    for _ in range(max(warmup, 1)):
        start = clock()
        fn()
        elapsed = clock() - start
    if elapsed >= min_time:
        return 1
    number = 1  # a short call: time growing batches of calls (like timeit.autorange), one preemption can't fool it
    while True:
        batch = _time_once(fn, number, clock) * number
        if batch >= min_time / 5 or number >= 10**6:
            return max(1, math.ceil(min_time * number / max(batch, 1e-9)))
        number *= 10


def _time_once(fn, number: int, clock=time.perf_counter) -> float:
    start = clock()
    for _ in range(number):
        fn()
    return (clock() - start) / number


def timeit(fn, repeats: int = 5, warmup: int = 1, min_time: float = 0.005, clock=time.perf_counter) -> Timing:
    """Time fn(): warm-up calls first (not timed), then `repeats` timed samples of >= min_time s each.

    clock: time.perf_counter (wall-clock, default) or time.process_time (CPU time of all the process's
    threads: what the work cost, hardly moved by other programs competing for the cores)."""
    return compare({"fn": fn}, repeats, warmup, min_time, clock)["fn"]


def compare(fns: dict, repeats: int = 5, warmup: int = 1, min_time: float = 0.005, clock=time.perf_counter) -> dict:
    """Time several callables side by side: {name: Timing}, round-robin in rotating order (02_im2col)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0; got {warmup!r}")
    names = list(fns)
    numbers = {name: _calibrate(fns[name], warmup, min_time, clock) for name in names}
    times = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a garbage collection inside one sample would be charged to whichever method ran
    try:
        for r in range(repeats):
            shift = r % len(names)  # rotate: every method runs after every other one equally often
            for name in names[shift:] + names[:shift]:
                times[name].append(_time_once(fns[name], numbers[name], clock))
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(times[name], numbers[name]) for name in names}


# ----------------------------------------------------------------------------------------------------
# The machine: BLAS, its threads and kernel, and its GEMM rate


def blas_info() -> list:
    """threadpoolctl's view of numpy's BLAS: library, version, kernel ('architecture'), threads."""
    import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]


def openblas_env() -> dict:
    """The OpenBLAS variables that pin its kernel choice: {name: value or None when unset}."""
    return {name: os.environ.get(name) for name in OPENBLAS_VARS}


def describe_machine() -> str:
    """Lines naming the BLAS numpy uses, its kernel and threads, and the OpenBLAS variables."""
    lines = []
    for lib in blas_info():
        lines.append(f"numpy BLAS: {lib.get('internal_api')} {lib.get('version')}, kernel "
                     f"{lib.get('architecture', '?')}, {lib.get('num_threads')} threads "
                     f"({lib.get('threading_layer', '?')}), {os.path.basename(lib.get('filepath', ''))}")
    if not lines:
        lines.append("numpy BLAS: not visible to threadpoolctl")
    env = openblas_env()
    set_vars = {k: v for k, v in env.items() if v is not None}
    if set_vars:
        lines.append("OpenBLAS kernel pinned by " + ", ".join(f"{k}={v}" for k, v in set_vars.items())
                     + " (for a fair run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE labkit conv-bench)")
    else:
        lines.append("OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset: OpenBLAS picked its own kernel")
    lines.append(f"CPU cores: {os.cpu_count()}; TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset)')}")
    return "\n".join(lines)


def gemm_rate(m: int = 2048, k: int = 2048, n: int = 2048, repeats: int = 5, dtype=np.float32,
              clock=time.perf_counter) -> float:
    """This machine's GEMM rate in GFLOP/s: median time of np.matmul on (m x k) @ (k x n)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    return timeit(lambda: np.matmul(a, b, out=out), repeats=repeats, clock=clock).gflops(2.0 * m * k * n)


# ----------------------------------------------------------------------------------------------------
# The conv benchmark: ResNet-50's 3x3 and 1x1 layers


@dataclass(frozen=True)
class ConvLayer:
    name: str
    size: int  # input height = width
    c_in: int
    c_out: int
    kernel: int  # 3 or 1; stride 1, SAME padding

    def geometry(self, batch_size: int) -> conv.ConvGeometry:
        return conv.geometry((batch_size, self.size, self.size, self.c_in), self.kernel, 1, "SAME")


# Each bottleneck block of ResNet-50 (He et al. 2016, Table 1): 1x1 reduce, 3x3, 1x1 expand.
RESNET50_LAYERS = tuple(
    layer
    for stage, size, width in (("conv2_x", 56, 64), ("conv3_x", 28, 128), ("conv4_x", 14, 256), ("conv5_x", 7, 512))
    for layer in (ConvLayer(f"{stage} 3x3", size, width, width, 3),
                  ConvLayer(f"{stage} 1x1 reduce", size, 4 * width, width, 1),
                  ConvLayer(f"{stage} 1x1 expand", size, width, 4 * width, 1))
)

METHODS = ("im2col", "tf", "gemm", "naive")


@dataclass
class LayerResult:
    layer: str
    kernel: int
    input_shape: tuple
    gemm_mkn: tuple  # the GEMM: M x K x N
    gflop: float  # FLOPs of one forward pass at this batch size, in GFLOP
    gflops: dict  # method -> GFLOP/s (naive: at its reduced size, per FLOP)
    median_ms: dict
    spread_ms: dict
    naive_shape: tuple = ()  # (1, H, W, C_in, C_out) the naive loops ran on

    @property
    def ratios(self) -> dict:
        g = self.gflops
        out = {"im2col_vs_tf": g["im2col"] / g["tf"], "im2col_vs_gemm": g["im2col"] / g["gemm"]}
        if g.get("naive"):
            out["im2col_vs_naive"] = g["im2col"] / g["naive"]
        return out


@dataclass
class BenchResult:
    profile: str
    batch_size: int
    repeats: int
    chunk_size: object  # "auto", rows per GEMM, or None (whole batch)
    machine_gemm_gflops: float
    machine: str
    openblas_env: dict
    blas: list
    layers: list = field(default_factory=list)
    load_average: list = field(default_factory=list)  # 1-minute load average before and after the run
    machine_gemm_size: int = 2048
    threads: dict = field(default_factory=dict)  # {"blas": N, "tf_intra_op": M (0: one per core)}
    clock: str = "wall"  # "wall": elapsed time; "cpu": CPU time of all threads (GFLOP/s per busy core)

    def summary(self) -> dict:
        """Geometric-mean ratios over the 3x3 layers and over the 1x1 layers."""
        out = {}
        for kernel in (3, 1):
            rows = [r for r in self.layers if r.kernel == kernel]
            if not rows:
                continue
            keys = rows[0].ratios.keys()
            out[f"{kernel}x{kernel}"] = {k: float(np.exp(np.mean([np.log(r.ratios[k]) for r in rows if k in r.ratios])))
                                         for k in keys}
        return out

    def targets(self) -> dict:
        """The issue's targets: measured (geometric mean over the layers), worst layer, target, met?"""
        out = {}
        for name, key, kernel in (("im2col_vs_tf_3x3", "im2col_vs_tf", 3), ("im2col_vs_gemm_3x3", "im2col_vs_gemm", 3),
                                  ("im2col_vs_naive", "im2col_vs_naive", None)):
            rows = [r for r in self.layers if key in r.ratios and kernel in (None, r.kernel)]
            if not rows:
                continue
            values = [r.ratios[key] for r in rows]
            worst = int(np.argmin(values))
            mean = float(np.exp(np.mean(np.log(values))))
            out[name] = {"measured": mean, "worst": values[worst], "worst_layer": rows[worst].layer,
                         "target": TARGETS[name], "met": mean >= TARGETS[name],
                         "met_by_every_layer": values[worst] >= TARGETS[name]}
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        for row, layer in zip(d["layers"], self.layers):
            row["ratios"] = layer.ratios
        d["summary"] = self.summary()
        d["targets"] = self.targets()
        return d

    def to_dataframe(self):
        import pandas as pd

        rows = []
        for r in self.layers:
            row = {"layer": r.layer, "M x K x N": " x ".join(map(str, r.gemm_mkn)), "GFLOP": round(r.gflop, 3)}
            row.update({f"{m} GFLOP/s": round(v, 2) for m, v in r.gflops.items()})
            row.update({k.replace("_vs_", "/"): round(v, 2) for k, v in r.ratios.items()})
            rows.append(row)
        return pd.DataFrame(rows).set_index("layer")

    def __str__(self) -> str:
        lines = [f"conv-bench: profile={self.profile}, batch_size={self.batch_size}, median of {self.repeats} "
                 f"repeats (warm-up excluded), float32, stride 1, SAME; im2col chunk_size={self.chunk_size}"
                 + ("; timed by CPU time: GFLOP/s per busy core" if self.clock == "cpu" else ""),
                 self.machine,
                 f"this machine's float32 GEMM ({self.machine_gemm_size}^3): {self.machine_gemm_gflops:.1f} GFLOP/s"]
        if self.threads:
            tf_threads = self.threads.get("tf_intra_op")
            lines.append(f"threads: numpy BLAS and im2col workers {self.threads.get('blas')}, TensorFlow intra-op "
                         f"{tf_threads or f'{os.cpu_count()} (one per core)'}")
        if self.load_average:
            busy = max(self.load_average) > 1.5 * (os.cpu_count() or 1)
            lines.append(f"load average (1 min) {' -> '.join(f'{v:.1f}' for v in self.load_average)} on "
                         f"{os.cpu_count()} cores" + (": other programs competed for the CPU; trust the "
                                                      "ratios more than the GFLOP/s" if busy else ""))
        lines.append("")
        head = (f"{'layer':<20} {'M x K x N':>18} {'im2col':>8} {'tf':>8} {'gemm':>8} {'naive':>7}   "
                f"{'im2col/tf':>9} {'im2col/gemm':>11} {'im2col/naive':>12}")
        lines += [head, f"{'':<20} {'':>18} {'---------- GFLOP/s ----------':>42}", "-" * len(head)]
        for r in self.layers:
            g, q = r.gflops, r.ratios
            naive = f"{g['naive']:7.4f}" if g.get("naive") else f"{'-':>7}"
            lines.append(f"{r.layer:<20} {' x '.join(map(str, r.gemm_mkn)):>18} {g['im2col']:8.1f} {g['tf']:8.1f} "
                         f"{g['gemm']:8.1f} {naive}   {q['im2col_vs_tf']:8.2f}x {q['im2col_vs_gemm']:10.2f}x "
                         + (f"{q['im2col_vs_naive']:11.0f}x" if "im2col_vs_naive" in q else f"{'-':>12}"))
        if any(r.naive_shape for r in self.layers):
            shape = next(r.naive_shape for r in self.layers if r.naive_shape)
            lines.append(f"naive: on one {shape[1]}x{shape[2]} image with {shape[4]} filters (its GFLOP/s do not "
                         f"depend on the size), compared per FLOP")
        lines.append("")
        for kind, s in self.summary().items():
            lines.append(f"{kind} layers (geometric mean): " + ", ".join(f"{k.replace('_vs_', '/')} {v:.2f}x" for k, v in s.items()))
        for name, t in self.targets().items():
            lines.append(f"target {name.replace('_vs_', '/')} >= {t['target']:g}x: measured {t['measured']:.2f}x "
                         f"(geometric mean; worst {t['worst']:.2f}x on {t['worst_layer']}) "
                         f"-> {'met' if t['met'] else 'MISSED'}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """Bar chart of GFLOP/s per layer and method, with the machine's GEMM rate as a line."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
        methods = [m for m in ("naive", "im2col", "tf", "gemm") if any(r.gflops.get(m) for r in self.layers)]
        width = 0.8 / len(methods)
        xs = np.arange(len(self.layers))
        for i, m in enumerate(methods):
            ax.bar(xs + (i - (len(methods) - 1) / 2) * width, [r.gflops.get(m) or 0 for r in self.layers],
                   width, label={"tf": "tf.nn.conv2d", "gemm": "bare GEMM", "naive": "naive (loops)"}.get(m, m))
        ax.axhline(self.machine_gemm_gflops, color="k", ls="--", lw=1, label=f"machine GEMM ({self.machine_gemm_size}^3)")
        ax.set_xticks(xs, [r.layer for r in self.layers], fontsize=8, rotation=30, ha="right")
        ax.set_yscale("log")  # the loops are thousands of times slower: a log scale shows every bar
        ax.set_ylabel("GFLOP/s (log scale)")
        ax.set_title(f"ResNet-50 conv layers, batch {self.batch_size}, float32 ({self.profile} profile)", pad=24)
        ax.legend(fontsize=8, ncol=len(methods) + 1, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
        return ax


def default_settings(profile: str | None = None) -> dict:
    """Batch size, repeats, naive input size and GEMM size for the active (or named) profile."""
    return dict(
        batch_size=config.by_profile(quick=2, workshop=8, full=32, name=profile),
        repeats=config.by_profile(quick=5, workshop=9, full=15, name=profile),
        naive_size=config.by_profile(quick=2, workshop=3, full=4, name=profile),
        naive_c_out=config.by_profile(quick=4, workshop=8, full=16, name=profile),
        gemm_size=config.by_profile(quick=1024, workshop=2048, full=4096, name=profile),
    )


def conv_bench(layers=RESNET50_LAYERS, batch_size=None, repeats=None, naive_size=None,
               chunk_size="auto", naive=True, seed=0, progress=None, threads=None, cpu_time=False) -> BenchResult:
    """Time conv2d_im2col, tf.nn.conv2d and a bare GEMM of the same M x K x N side by side on each layer,
    and conv2d_naive on one naive_size x naive_size image with a few filters (its speed per FLOP does not
    depend on the size); defaults come from the profile (02_im2col).

    threads=N runs every method on N threads (BLAS, TensorFlow's intra-op pool, conv2d_im2col's workers);
    threads=1 compares single cores, which stays meaningful on a machine other programs keep busy.
    TensorFlow's pool can only be sized before its first operation in the process. cpu_time=True times
    by the process's CPU time (all threads) instead of wall-clock: GFLOP/s per busy core.
    """
    import tensorflow as tf
    from threadpoolctl import threadpool_limits

    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int or None; got {threads!r}")
        if tf.config.threading.get_intra_op_parallelism_threads() != threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
            except RuntimeError as err:
                raise ValueError(f"threads={threads}: TensorFlow's thread pool is already running in this "
                                 f"process; run `labkit conv-bench --threads {threads}` instead") from err
        with threadpool_limits(limits=threads, user_api="blas"):
            return _conv_bench(layers, batch_size, repeats, naive_size, chunk_size, naive, seed, progress, tf, cpu_time)
    return _conv_bench(layers, batch_size, repeats, naive_size, chunk_size, naive, seed, progress, tf, cpu_time)


def _conv_bench(layers, batch_size, repeats, naive_size, chunk_size, naive, seed, progress, tf,
                cpu_time) -> BenchResult:
    clock = time.process_time if cpu_time else time.perf_counter
    settings = default_settings()
    batch_size = batch_size or settings["batch_size"]
    repeats = repeats or settings["repeats"]
    naive_size = naive_size or settings["naive_size"]
    rng = np.random.default_rng(seed)
    result = BenchResult(profile=config.profile(), batch_size=batch_size, repeats=repeats, chunk_size=chunk_size,
                         machine_gemm_gflops=gemm_rate(*(settings["gemm_size"],) * 3, repeats=repeats, clock=clock),
                         machine=describe_machine(), openblas_env=openblas_env(), blas=blas_info(),
                         load_average=[_load_average()], machine_gemm_size=settings["gemm_size"],
                         threads={"blas": conv.blas_threads(),
                                  "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads()},
                         clock="cpu" if cpu_time else "wall")
    for layer in layers:
        g = layer.geometry(batch_size)
        m, k = g.cols_shape
        n = layer.c_out
        x = rng.standard_normal((batch_size, layer.size, layer.size, layer.c_in)).astype(np.float32)
        w = (rng.standard_normal((layer.kernel, layer.kernel, layer.c_in, n)) / np.sqrt(k)).astype(np.float32)
        xt, wt = tf.constant(x), tf.constant(w)
        a = rng.standard_normal((m, k)).astype(np.float32)  # the bare GEMM: same shapes, no im2col
        b = np.ascontiguousarray(w.reshape(k, n))
        out = np.empty((m, n), np.float32)
        fns = {
            "im2col": lambda: conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=chunk_size),
            "tf": lambda: tf.nn.conv2d(xt, wt, 1, "SAME").numpy(),
            "gemm": lambda: np.matmul(a, b, out=out),
        }
        # the implementations agree before any of them is timed
        np.testing.assert_allclose(fns["im2col"](), fns["tf"](), rtol=1e-3, atol=1e-3)
        timings = compare(fns, repeats=repeats, clock=clock)
        flops = g.flops(n)
        row = LayerResult(layer.name, layer.kernel, (batch_size, layer.size, layer.size, layer.c_in), (m, k, n),
                          flops / 1e9, {name: t.gflops(flops) for name, t in timings.items()},
                          {name: t.median * 1e3 for name, t in timings.items()},
                          {name: t.spread * 1e3 for name, t in timings.items()})
        if naive:  # the loops run ~1e4 times slower: time them on one small image and a few filters
            small = min(naive_size, layer.size)
            xs, ws = x[:1, :small, :small], w[..., : settings["naive_c_out"]]
            t = timeit(lambda: conv.conv2d_naive(xs, ws, 1, "SAME"), repeats=3, min_time=0.0, clock=clock)
            row.gflops["naive"] = t.gflops(conv.geometry(xs.shape, layer.kernel, 1, "SAME").flops(ws.shape[3]))
            row.median_ms["naive"], row.spread_ms["naive"] = t.median * 1e3, t.spread * 1e3
            row.naive_shape = xs.shape + (ws.shape[3],)
        result.layers.append(row)
        if progress:
            progress(row)
    result.load_average.append(_load_average())
    return result


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return float("nan")


def chunk_sweep(layer: ConvLayer = RESNET50_LAYERS[0], chunk_sizes=(64, 256, 1024, "auto", 8192, 32768, None),
                batch_size=None, repeats=None, threads=None):
    """GFLOP/s and im2col buffer memory (MiB) of conv2d_im2col per chunk_size on one layer (02_im2col).

    Returns a pandas DataFrame; chunk_size None is the whole matrix and one GEMM.
    """
    import pandas as pd

    settings = default_settings()
    batch_size = batch_size or settings["batch_size"]
    repeats = repeats or settings["repeats"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch_size, layer.size, layer.size, layer.c_in)).astype(np.float32)
    w = rng.standard_normal((layer.kernel, layer.kernel, layer.c_in, layer.c_out)).astype(np.float32)
    g = layer.geometry(batch_size)
    fns = {cs: (lambda cs=cs: conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=cs, threads=threads))
           for cs in chunk_sizes}
    timings = compare(fns, repeats=repeats)
    rows = []
    for cs, t in timings.items():
        rows_per_chunk = conv._check_chunk_size(cs, g, np.float32)
        chunks, workers = conv.plan(g, rows_per_chunk, threads)
        buffer_rows = max((n1 - n0) * (r1 - r0) * g.w_out for n0, n1, r0, r1 in chunks) * workers
        label = "whole batch" if cs is None else (f"auto ({rows_per_chunk})" if cs == "auto" else cs)
        rows.append({"chunk_size": label, "GEMMs": len(chunks), "threads": workers,
                     "im2col buffer (MiB)": round(buffer_rows * g.cols_shape[1] * 4 / 2**20, 2),
                     "GFLOP/s": round(t.gflops(g.flops(layer.c_out)), 1)})
    return pd.DataFrame(rows).set_index("chunk_size")


# ----------------------------------------------------------------------------------------------------
# labkit conv-bench


def cli_main(argv: list) -> int:
    parser = argparse.ArgumentParser(
        prog="labkit conv-bench",
        description="Time naive loops, im2col + GEMM, tf.nn.conv2d and a bare GEMM on ResNet-50's 3x3 and "
                    "1x1 conv layers (float32, one process, warm-up excluded, median of repeats). "
                    "Batch size and repeats follow LABKIT_PROFILE.",
        epilog="For a fair BLAS: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE labkit conv-bench",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results (GFLOP/s, ratios, machine) as JSON")
    parser.add_argument("--batch-size", type=int, help="images per batch (default: by profile, quick=2, workshop=8)")
    parser.add_argument("--repeats", type=int, help="timed repeats per method (default: by profile)")
    parser.add_argument("--chunk-size", default="auto",
                        help="im2col rows per GEMM: 'auto' (default, about 4 MiB), a number, or 0 = whole batch, one GEMM")
    parser.add_argument("--kernels", default="3,1", help="which layers: '3', '1' or '3,1' (default)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive loops")
    parser.add_argument("--threads", type=int,
                        help="threads for every method (default: BLAS's and TensorFlow's own); 1 compares single "
                             "cores")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by CPU time (all threads) instead of wall-clock: GFLOP/s per busy core, "
                             "hardly moved by other programs; best with --threads 1")
    args = parser.parse_args(argv)
    for name in ("batch_size", "repeats", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.chunk_size != "auto":
        if not args.chunk_size.isdigit():
            parser.error(f"--chunk-size must be 'auto' or a number >= 0; got {args.chunk_size!r}")
        args.chunk_size = int(args.chunk_size) or None
    try:
        kernels = {int(k) for k in args.kernels.split(",")}
    except ValueError:
        parser.error(f"--kernels must be a comma-separated list of 3 and 1; got {args.kernels!r}")
    if not kernels or not kernels <= {1, 3}:
        parser.error(f"--kernels must be a comma-separated list of 3 and 1; got {args.kernels!r}")

    import labkit

    labkit.quiet()
    start = time.perf_counter()
    result = conv_bench(layers=[layer for layer in RESNET50_LAYERS if layer.kernel in kernels],
                        batch_size=args.batch_size, repeats=args.repeats, chunk_size=args.chunk_size,
                        naive=not args.no_naive, threads=args.threads, cpu_time=args.cpu_time,
                        progress=lambda row: print(f"  {row.layer}: done", file=sys.stderr, flush=True))
    print()
    print(result)
    print(f"total wall time {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=1, default=float)
        print(f"wrote {args.json}")
    return 0
