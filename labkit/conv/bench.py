"""The convolution benchmark behind `labkit conv-bench` (02_im2col).

On each of ResNet-50's 3x3 and 1x1 layers it times, side by side in one process (labkit.base.timing's rules:
warm-up excluded, round-robin repeats), conv2d_im2col with both engines (numpy's im2col + numpy's BLAS;
tf.gather + TensorFlow's matmul), tf.nn.conv2d (TensorFlow's own kernels: oneDNN's direct convolution
where oneDNN is on), a bare GEMM of the same M x K x N with numpy's BLAS and with TensorFlow's matmul
(each engine's own GEMM), and the naive loops on a small image. It prints
GFLOP/s and ratios beside the machine (labkit.base.machine.describe) and the load average; judging them is
the reader's business.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from labkit import conv
from labkit.base import config, machine
from labkit.base.checks import check_int
from labkit.base.timing import Timing, busy, compare, gemm_rate, load_average, timeit  # noqa: F401, E501  (bench.timeit in 02_im2col)
from labkit.conv.shapes import _check_chunk_size

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


# Each bottleneck block of ResNet-50 (He et al. 2016, "Deep Residual Learning for Image Recognition",
# Table 1): 1x1 reduce, 3x3, 1x1 expand.
RESNET50_LAYERS = tuple(
    layer
    for stage, size, width in (("conv2_x", 56, 64), ("conv3_x", 28, 128), ("conv4_x", 14, 256), ("conv5_x", 7, 512))
    for layer in (ConvLayer(f"{stage} 3x3", size, width, width, 3),
                  ConvLayer(f"{stage} 1x1 reduce", size, 4 * width, width, 1),
                  ConvLayer(f"{stage} 1x1 expand", size, width, 4 * width, 1))
)

METHODS = ("im2col", "im2col_tf", "tf", "gemm", "tf_gemm", "naive")
LABELS = {"im2col": "im2col + numpy GEMM", "im2col_tf": "im2col + TensorFlow GEMM", "tf": "tf.nn.conv2d",
          "gemm": "bare GEMM (numpy)", "tf_gemm": "bare GEMM (tf.linalg.matmul)", "naive": "naive (loops)"}
# ratio name -> (numerator, denominator): each im2col engine against TF's conv and against its own bare GEMM,
# and how far a bare GEMM (numpy's or TensorFlow's) is from TensorFlow's convolution kernel
RATIOS = {"im2col_vs_tf": ("im2col", "tf"), "im2col_vs_gemm": ("im2col", "gemm"),
          "im2col_tf_vs_tf": ("im2col_tf", "tf"), "im2col_tf_vs_tf_gemm": ("im2col_tf", "tf_gemm"),
          "gemm_vs_tf": ("gemm", "tf"), "tf_gemm_vs_tf": ("tf_gemm", "tf"), "im2col_vs_naive": ("im2col", "naive")}
# the printed table: (method, title, width, format) per GFLOP/s column, (ratio, title, width) per ratio column
_COLUMNS = (("im2col", "im2col", 7, "7.1f"), ("im2col_tf", "im2tf", 6, "6.1f"), ("tf", "tf", 6, "6.1f"),
            ("gemm", "gemm", 6, "6.1f"), ("tf_gemm", "tfgemm", 6, "6.1f"), ("naive", "naive", 7, "7.4f"))
_RATIO_COLUMNS = (("im2col_vs_tf", "im2col/tf", 9), ("im2col_vs_gemm", "im2col/gemm", 11),
                  ("im2col_tf_vs_tf", "im2tf/tf", 8), ("im2col_tf_vs_tf_gemm", "im2tf/tfgemm", 12),
                  ("gemm_vs_tf", "gemm/tf", 7), ("tf_gemm_vs_tf", "tfgemm/tf", 9),
                  ("im2col_vs_naive", "im2col/naive", 12))


# the short names the notebook and the printed table use: im2tf = the tf engine, tfgemm = TensorFlow's bare GEMM
SHORT = {"im2col": "im2col", "im2col_tf": "im2tf", "tf": "tf", "gemm": "gemm", "tf_gemm": "tfgemm", "naive": "naive"}
# the ratios 02_im2col's text reads: the copy's cost, each GEMM engine against TF's conv, the loops
READ_RATIOS = ("im2col_vs_tf", "im2col_vs_gemm", "gemm_vs_tf", "tf_gemm_vs_tf", "im2col_tf_vs_tf_gemm",
               "im2col_vs_naive")


def ratio_name(key: str) -> str:
    """'im2col_tf_vs_tf_gemm' -> 'im2tf/tfgemm': a ratio of RATIOS as the printed table heads it."""
    top, bottom = RATIOS[key]
    return f"{SHORT[top]}/{SHORT[bottom]}"


@dataclass
class LayerResult:
    layer: str
    kernel: int
    input_shape: tuple
    gemm_mkn: tuple  # the GEMM: M x K x N
    gflop: float  # FLOPs of one forward pass at this batch size, in GFLOP
    gflops: dict  # method -> GFLOP/s at the bench's statistic (naive: at its reduced size, per FLOP)
    median_ms: dict
    spread_ms: dict
    naive_shape: tuple = ()  # (1, H, W, C_in, C_out) the naive loops ran on
    best_ms: dict = field(default_factory=dict)
    times_ms: dict = field(default_factory=dict)  # method -> ms per call in each round-robin round
    paired: dict = field(default_factory=dict)  # stat="paired": ratio name -> median over rounds of that round's ratio

    @property
    def ratios(self) -> dict:
        g = self.gflops
        out = {name: g[top] / g[bottom] for name, (top, bottom) in RATIOS.items() if g.get(top) and g.get(bottom)}
        out.update(self.paired)
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
    load_average: list = field(default_factory=list)  # timing.busy()'s cores' worth before and after the run
    cores: int = 0  # machine.cores() during the run (0: not recorded)
    machine_gemm_size: int = 2048
    threads: dict = field(default_factory=dict)  # {"blas": N, "tf_intra_op": M, "tf_inter_op": L (0: one per core)}
    clock: str = "wall"  # "wall": elapsed time; "cpu": CPU time of all threads (GFLOP/s per busy core)
    stat: str = "best"  # GFLOP/s and ratios at the fastest repeat ("best"), at the median, or "paired" (see conv_bench)
    onednn: object = None  # whether TensorFlow ran its oneDNN kernels (None: not known)
    methods: tuple = METHODS  # the methods timed (--methods); the table shows only their columns

    def summary(self) -> dict:
        """Per kernel size ("3x3", "1x1"), per ratio: geometric mean over the layers, worst value and layer."""
        out = {}
        for kernel in (3, 1):
            rows = [r for r in self.layers if r.kernel == kernel]
            if not rows:
                continue
            out[f"{kernel}x{kernel}"] = kinds = {}
            for key in RATIOS:
                values = [(r.ratios[key], r.layer) for r in rows if key in r.ratios]
                if values:
                    worst = min(values)
                    kinds[key] = {"geomean": float(np.exp(np.mean([np.log(v) for v, _ in values]))),
                                  "worst": worst[0], "worst_layer": worst[1]}
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        for row, layer in zip(d["layers"], self.layers):
            row["ratios"] = layer.ratios
        d["summary"] = self.summary()
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

    def header(self) -> str:
        """The run's configuration: profile, statistic, machine, GEMM rate, threads and load (what __str__ starts
        with)."""
        return str(self).split("\n\nengines:", 1)[0]

    def ratio_table(self, ratios=READ_RATIOS):
        """One row per layer: its GEMM's M x K x N and the chosen ratios, named as the notebook names them
        (02_im2col)."""
        import pandas as pd

        unknown = [k for k in ratios if k not in RATIOS]
        if unknown:
            raise ValueError(f"ratios must be names from bench.RATIOS ({', '.join(RATIOS)}); got {unknown}")
        rows = []
        for r in self.layers:
            row = {"layer": r.layer, "M x K x N": " x ".join(map(str, r.gemm_mkn))}
            row.update({ratio_name(k): (round(r.ratios[k]) if k == "im2col_vs_naive" else round(r.ratios[k], 2))
                        for k in ratios if k in r.ratios})
            rows.append(row)
        return pd.DataFrame(rows).set_index("layer")

    def plot_ratios(self, ratios=("im2col_vs_gemm", "im2col_tf_vs_tf_gemm", "gemm_vs_tf", "tf_gemm_vs_tf"), ax=None):
        """Bar chart of speed ratios per layer on a linear axis, with 1 (equal speed) as a line (02_im2col)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
        width = 0.8 / len(ratios)
        xs = np.arange(len(self.layers))
        for i, key in enumerate(ratios):
            ax.bar(xs + (i - (len(ratios) - 1) / 2) * width, [r.ratios.get(key, np.nan) for r in self.layers],
                   width, label=ratio_name(key))
        ax.axhline(1.0, color="k", ls="--", lw=1, label="1 = equal speed")
        ax.set_xticks(xs, [r.layer for r in self.layers], fontsize=8, rotation=30, ha="right")
        ax.set_ylabel("speed ratio (x)")
        ax.set_title(f"ResNet-50 conv layers on random tensors, batch {self.batch_size}, float32 ({self.profile} "
                     f"profile): speed ratios", pad=24)
        ax.legend(fontsize=8, ncol=len(ratios) + 1, loc="lower center", bbox_to_anchor=(0.5, 1.02), frameon=False)
        return ax

    def __str__(self) -> str:
        stat = {"best": "fastest", "paired": "ratios: median over rounds of each round's ratio, GFLOP/s: median"}.get(
            self.stat, "median")
        onednn = {True: "on", False: "off"}.get(self.onednn, "unknown")
        lines = [f"conv-bench: profile={self.profile}, batch_size={self.batch_size}, {stat} of {self.repeats} "
                 f"repeats (warm-up excluded), float32, stride 1, SAME; im2col chunk_size={self.chunk_size}; "
                 f"TensorFlow's oneDNN kernels {onednn}"
                 + ("; timed by CPU time: GFLOP/s per busy core" if self.clock == "cpu" else ""),
                 self.machine,
                 f"this machine's float32 GEMM (numpy, {self.machine_gemm_size}^3): "
                 f"{self.machine_gemm_gflops:.1f} GFLOP/s"]
        if self.threads:
            per_core = f"{machine.cores()} (one per core)"
            lines.append(f"threads: numpy BLAS and im2col workers {self.threads.get('blas')}, TensorFlow intra-op "
                         f"{self.threads.get('tf_intra_op') or per_core}, inter-op "
                         f"{self.threads.get('tf_inter_op') or per_core}")
        if self.load_average:
            cores = self.cores or machine.cores()
            busy = max(self.load_average) > 0.5 * cores
            lines.append(f"other work (cores' worth; the load average, or a CPU-limited container's own use) "
                         f"{' -> '.join(f'{v:.1f}' for v in self.load_average)} on "
                         f"{machine.count_text(cores, 'usable core')}" + (": other programs competed for the CPU; "
                                                                         "trust the ratios more than the GFLOP/s"
                                                                         if busy else ""))
        lines.append("")
        if {"im2col_tf", "gemm", "tf_gemm"} & set(self.methods):
            lines.append("engines: im2col = numpy's im2col + numpy GEMM; im2tf = conv2d_im2col(engine='tf'), "
                         "tf.gather + TensorFlow GEMM; gemm, tfgemm = a bare GEMM of the same M x K x N with numpy, "
                         "with TensorFlow")
        shown = [c for c in _COLUMNS if c[0] in self.methods or (c[0] == "naive" and self.methods == METHODS)]
        ratios = [c for c in _RATIO_COLUMNS if set(RATIOS[c[0]]) <= set(self.methods)]
        head = (f"{'layer':<20} {'M x K x N':>18} " + " ".join(f"{title:>{width}}" for _, title, width, _ in shown)
                + "  " + " ".join(f"{title:>{width}}" for _, title, width in ratios))
        span = sum(width + 1 for _, _, width, _ in shown) + 1
        banner = ("--------------- GFLOP/s ---------------" if len(shown) == len(_COLUMNS)
                  else f"{' GFLOP/s ':-^{span - 2}}")
        lines += [head.rstrip(), f"{'':<20} {'':>18} {banner:>{span}}", "-" * len(head.rstrip())]
        nan = float("nan")
        for r in self.layers:
            g, q = r.gflops, r.ratios
            cells = [format(g[m], fmt) if g.get(m) else f"{'-':>{width}}" if m == "naive"
                     else format(g.get(m, nan), fmt) for m, _, width, fmt in shown]
            cells2 = [format(q[key], f"{width - 1}.{0 if key == 'im2col_vs_naive' else 2}f") + "x" if key in q
                      else f"{'-':>{width}}" for key, _, width in ratios]
            lines.append(f"{r.layer:<20} {' x '.join(map(str, r.gemm_mkn)):>18} " + " ".join(cells) + "  "
                         + " ".join(cells2))
        if any(r.naive_shape for r in self.layers):
            shape = next(r.naive_shape for r in self.layers if r.naive_shape)
            lines.append(f"naive: on one {shape[1]}x{shape[2]} image with {shape[4]} filters (its GFLOP/s do not "
                         f"depend on the size), compared per FLOP")
        lines.append("")
        for kind, ratios in self.summary().items():
            lines.append(f"{kind} layers, geometric mean (worst layer): " + ", ".join(
                f"{k.replace('_vs_', '/')} {v['geomean']:.2f}x ({v['worst']:.2f}x {v['worst_layer']})"
                for k, v in ratios.items() if k != "im2col_vs_naive"))
        return "\n".join(lines)

    def plot(self, ax=None):
        """Bar chart of GFLOP/s per layer and method, with the machine's GEMM rate as a line."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
        methods = [m for m in ("naive", "im2col", "im2col_tf", "tf", "gemm", "tf_gemm")
                   if any(r.gflops.get(m) for r in self.layers)]
        width = 0.8 / len(methods)
        xs = np.arange(len(self.layers))
        for i, m in enumerate(methods):
            ax.bar(xs + (i - (len(methods) - 1) / 2) * width, [r.gflops.get(m) or 0 for r in self.layers],
                   width, label=LABELS[m])
        ax.axhline(self.machine_gemm_gflops, color="k", ls="--", lw=1, label=f"numpy GEMM ({self.machine_gemm_size}^3)")
        ax.set_xticks(xs, [r.layer for r in self.layers], fontsize=8, rotation=30, ha="right")
        ax.set_yscale("log")  # the loops are thousands of times slower: a log scale shows every bar
        ax.set_ylabel("GFLOP/s (log scale)")
        ax.set_title(f"ResNet-50 conv layers, batch {self.batch_size}, float32 ({self.profile} profile)", pad=24)
        ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.04), frameon=False)
        return ax


def default_settings(profile: str | None = None) -> dict:
    """Batch size, repeats, naive input size and GEMM size for the active (or named) profile."""
    return dict(
        batch_size=config.by_profile(quick=2, workshop=8, full=32, smoke=1, name=profile),
        repeats=config.by_profile(quick=5, workshop=9, full=15, smoke=2, name=profile),
        naive_size=config.by_profile(quick=2, workshop=3, full=4, smoke=1, name=profile),
        naive_c_out=config.by_profile(quick=4, workshop=8, full=16, smoke=2, name=profile),
        gemm_size=config.by_profile(quick=1024, workshop=2048, full=4096, smoke=512, name=profile),
    )


def conv_bench(layers=RESNET50_LAYERS, batch_size=None, repeats=None, naive_size=None,
               chunk_size="auto", naive=True, seed=0, progress=None, threads=None, cpu_time=False,
               stat="best", methods=METHODS) -> BenchResult:
    """Time conv2d_im2col (both engines), tf.nn.conv2d and bare GEMMs of the same M x K x N (numpy's and TensorFlow's)
    side by side on each layer, and conv2d_naive on one naive_size x naive_size image with a few filters
    (its speed per FLOP does not depend on the size); defaults come from the profile (02_im2col).

    threads=N runs every method on N threads (BLAS, TensorFlow's intra-op and inter-op pools, conv2d_im2col's workers);
    threads=1 compares single cores, which stays meaningful on a machine other programs keep busy.
    TensorFlow's pool can only be sized before its first operation in the process. cpu_time=True times
    by the process's CPU time (all threads) instead of wall-clock: GFLOP/s per busy core. stat="best"
    (default) reports GFLOP/s and ratios at each method's fastest repeat, "median" at the median; "paired"
    takes each ratio within every round-robin round (the two methods ran back to back, under the same load)
    and reports the median of those, with GFLOP/s at the median. methods: which of METHODS to time (e.g.
    ("im2col", "tf"): only those alternate, so each pair runs back to back); naive=False drops "naive".
    """
    if stat not in ("best", "median", "paired"):
        raise ValueError(f"stat must be 'best', 'median' or 'paired'; got {stat!r}")
    methods = _check_methods(methods)
    for name, value in (("threads", threads), ("batch_size", batch_size), ("repeats", repeats),
                        ("naive_size", naive_size)):
        if value is not None:
            check_int(value, name, minimum=1)
    import labkit

    labkit.quiet()
    import tensorflow as tf
    from threadpoolctl import threadpool_limits

    args = (layers, batch_size, repeats, naive_size, chunk_size, naive, seed, progress, tf, cpu_time, stat, methods)
    conv.blas_threads()  # numpy's BLAS set to machine.cores() threads (its first use) before any narrower limit
    if threads is not None:
        if (tf.config.threading.get_intra_op_parallelism_threads() != threads
                or tf.config.threading.get_inter_op_parallelism_threads() != threads):
            try:  # inter-op too: the tf engine's chunks run side by side on it
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(threads)
            except RuntimeError as err:
                raise ValueError(f"threads={threads}: TensorFlow's thread pool is already running in this "
                                 f"process; run `labkit conv-bench --threads {threads}` instead") from err
        with threadpool_limits(limits=threads, user_api="blas"):
            return _conv_bench(*args)
    if tf.config.threading.get_intra_op_parallelism_threads() == 0:  # TF's default: one per core it sees
        try:  # machine.cores() (LABKIT_CORES, a container's quota), where TF's pools are not running yet
            tf.config.threading.set_intra_op_parallelism_threads(machine.cores())
            tf.config.threading.set_inter_op_parallelism_threads(machine.cores())
        except RuntimeError:
            pass
    return _conv_bench(*args)


def _check_methods(methods) -> tuple:
    """methods as a tuple in METHODS' order: a non-empty collection of its names."""
    if isinstance(methods, str) or not methods or not set(methods) <= set(METHODS):
        raise ValueError(f"methods must be a non-empty list of {', '.join(METHODS)}; got {methods!r}")
    return tuple(m for m in METHODS if m in methods)


def _conv_bench(layers, batch_size, repeats, naive_size, chunk_size, naive, seed, progress, tf, cpu_time,
                stat, methods) -> BenchResult:
    clock = time.process_time if cpu_time else time.perf_counter
    settings = default_settings()
    batch_size = batch_size or settings["batch_size"]
    repeats = repeats or settings["repeats"]
    naive_size = naive_size or settings["naive_size"]
    rng = np.random.default_rng(seed)
    result = BenchResult(profile=config.profile(), batch_size=batch_size, repeats=repeats, chunk_size=chunk_size,
                         machine_gemm_gflops=gemm_rate(*(settings["gemm_size"],) * 3, repeats=repeats, clock=clock),
                         machine=machine.describe(), openblas_env=machine.openblas_env(), blas=machine.blas_info(),
                         load_average=[busy().cores], cores=machine.cores(), machine_gemm_size=settings["gemm_size"],
                         threads={"blas": conv.blas_threads(),
                                  "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                                  "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads()},
                         clock="cpu" if cpu_time else "wall", stat=stat, onednn=machine.tf_onednn_enabled(),
                         methods=methods)
    for layer in layers:
        g = layer.geometry(batch_size)
        m, k = g.cols_shape
        n = layer.c_out
        x = rng.standard_normal((batch_size, layer.size, layer.size, layer.c_in)).astype(np.float32)
        w = (rng.standard_normal((layer.kernel, layer.kernel, layer.c_in, n)) / np.sqrt(k)).astype(np.float32)
        a = rng.standard_normal((m, k)).astype(np.float32)  # the bare GEMM: same shapes, no im2col
        b = np.ascontiguousarray(w.reshape(k, n))
        fns = _methods(x, w, a, b, chunk_size)
        # the implementations agree before any of them is timed
        expected = fns["tf"]()
        for name in ("im2col", "im2col_tf"):
            if name in methods:
                np.testing.assert_allclose(fns[name](), expected, rtol=1e-3, atol=1e-3)
        timings = compare({name: fn for name, fn in fns.items() if name in methods}, repeats=repeats, clock=clock)
        flops = g.flops(n)
        row = LayerResult(layer.name, layer.kernel, (batch_size, layer.size, layer.size, layer.c_in), (m, k, n),
                          flops / 1e9, {name: t.gflops(flops, "best" if stat == "best" else "median")
                                        for name, t in timings.items()},
                          {name: t.median * 1e3 for name, t in timings.items()},
                          {name: t.spread * 1e3 for name, t in timings.items()},
                          best_ms={name: t.best * 1e3 for name, t in timings.items()},
                          times_ms={name: [v * 1e3 for v in t.times] for name, t in timings.items()})
        if stat == "paired":  # speed ratio top/bottom in round r = time of bottom / time of top in that round
            row.paired = {name: float(np.median(np.divide(timings[bottom].times, timings[top].times)))
                          for name, (top, bottom) in RATIOS.items() if top in timings and bottom in timings}
        if naive and "naive" in methods:  # ~1e4 times slower: time them on one small image and a few filters
            _time_naive(row, x[:1, :min(naive_size, layer.size), :min(naive_size, layer.size)],
                        w[..., : settings["naive_c_out"]], clock, stat)
        result.layers.append(row)
        if progress:
            progress(row)
    result.load_average.append(busy().cores)
    return result


def _methods(x, w, a, b, chunk_size) -> dict:
    """The timed methods on one layer's input x, weights w and its bare GEMM's a @ b: each hands back a numpy
    array, as conv2d_im2col's contract says."""
    import tensorflow as tf
    xt, wt, at, bt = tf.constant(x), tf.constant(w), tf.constant(a), tf.constant(b)
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    return {
        "im2col": lambda: conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=chunk_size),
        "im2col_tf": lambda: conv.conv2d_im2col(xt, wt, 1, "SAME", chunk_size=chunk_size, engine="tf"),
        "tf": lambda: tf.nn.conv2d(xt, wt, 1, "SAME").numpy(),
        "gemm": lambda: np.matmul(a, b, out=out),
        "tf_gemm": lambda: tf.linalg.matmul(at, bt).numpy(),
    }


def _time_naive(row, xs, ws, clock, stat) -> None:
    """The naive loops on xs (one small image) and ws (a few filters), into row."""
    t = timeit(lambda: conv.conv2d_naive(xs, ws, 1, "SAME"), repeats=3, min_time=0.0, clock=clock)
    row.gflops["naive"] = t.gflops(conv.geometry(xs.shape, ws.shape[0], 1, "SAME").flops(ws.shape[3]),
                                   "best" if stat == "best" else "median")
    row.median_ms["naive"], row.spread_ms["naive"] = t.median * 1e3, t.spread * 1e3
    row.best_ms["naive"] = t.best * 1e3
    row.naive_shape = xs.shape + (ws.shape[3],)


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
        rows_per_chunk = _check_chunk_size(cs, g, np.float32, layer.c_out)
        label = "whole batch" if cs is None else (f"auto ({rows_per_chunk})" if cs == "auto" else cs)
        rows.append({"chunk_size": label, **chunk_buffer(g, rows_per_chunk, threads),
                     "GFLOP/s": round(t.gflops(g.flops(layer.c_out)), 1)})
    return pd.DataFrame(rows).set_index("chunk_size")


def chunk_buffer(g, rows_per_chunk, threads=None) -> dict:
    """conv2d_im2col's plan for geometry g at rows_per_chunk (None: the whole batch): its GEMMs, its threads (None:
    conv.plan's default, from machine.cores()) and the im2col buffer of all its threads together in float32 MiB,
    rounded to 0.01 (each thread holds one chunk's). chunk_sweep's columns. (02_im2col)"""
    chunks, workers = conv.plan(g, rows_per_chunk, threads)
    buffer_rows = max((n1 - n0) * (r1 - r0) * g.w_out for n0, n1, r0, r1 in chunks) * workers
    return {"GEMMs": len(chunks), "threads": workers,
            "im2col buffer (MiB)": round(buffer_rows * g.cols_shape[1] * 4 / 2**20, 2)}


# ----------------------------------------------------------------------------------------------------
