"""Convolution three ways: plain loops, im2col + one GEMM, and the GEMM-based backward pass (02_im2col).

Layout is TensorFlow's: x is NHWC (batch, height, width, channels), w is HWIO (kernel height, kernel
width, input channels, output channels), and `strides`, `padding`, `dilations` mean what they mean in
`tf.nn.conv2d`:

- strides, dilations: an int or a pair (vertical, horizontal), each >= 1.
- padding: "VALID" (no padding), "SAME" (output = ceil(input / stride); when the total padding is odd
  the extra row/column goes at the bottom/right, TensorFlow's asymmetric rule), or explicit pairs
  [(top, bottom), (left, right)] (TensorFlow's 4-pair NHWC form [[0, 0], [t, b], [l, r], [0, 0]] too).

The im2col matrix has one row per output pixel (N * H_out * W_out rows) and one column per weight of a
filter (kh * kw * C_in columns, in HWIO order), so `im2col(x) @ w.reshape(-1, C_out)` IS the convolution.
The sizes (conv.geometry) and the argument checks live in labkit.conv.shapes.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from labkit.conv.shapes import (  # noqa: F401  (conv.geometry, conv.ConvGeometry: part of this API)
    CHUNK_BYTES,
    MIN_CHUNK_ROWS,
    PADDING_HELP,
    ConvGeometry,
    _as_float_array,
    _check_chunk_size,
    _check_conv_args,
    _check_not_empty,
    _check_rank4,
    geometry,
)

# with threads=None, worker threads are used only when each gets at least this many rows; smaller
# problems run as one GEMM on BLAS's own threads (splitting a short matrix only repeats B's packing)
PARALLEL_MIN_ROWS = 512


# ----------------------------------------------------------------------------------------------------
# 1. Plain loops: the definition, written to be read.


def conv2d_naive(x, w, strides=1, padding="VALID", dilations=1) -> np.ndarray:
    """The definition, one multiply-add at a time (02_im2col):

    out[n, i, j, o] = sum over a, b, c of x_padded[n, i*sh + a*dh, j*sw + b*dw, c] * w[a, b, c, o]
    """
    x, w, g, dtype = _check_conv_args(x, w, strides, padding, dilations)
    out_dtype = np.result_type(x.dtype, w.dtype)
    xp = np.pad(x.astype(dtype), ((0, 0), (g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right), (0, 0)))
    w = w.astype(dtype)
    c_out = w.shape[3]
    out = np.zeros((g.n, g.h_out, g.w_out, c_out), dtype)
    for n in range(g.n):  # every image,
        for i in range(g.h_out):  # output row,
            for j in range(g.w_out):  # output column
                for o in range(c_out):  # and filter:
                    total = 0.0
                    for a in range(g.kh):  # sum over the kernel's taps
                        for b in range(g.kw):
                            for c in range(g.c):  # and the input channels
                                total += xp[n, i * g.sh + a * g.dh, j * g.sw + b * g.dw, c] * w[a, b, c, o]
                    out[n, i, j, o] = total
    return out.astype(out_dtype, copy=False)


# ----------------------------------------------------------------------------------------------------
# 2. im2col: one row per output pixel, one column per filter weight.
#
# Row (n, i, j) of the matrix is x_padded[n, i*sh + a*dh, j*sw + b*dw, c] for a < kh, b < kw, c < C:
# a 6-D strided VIEW of the padded input (no data moves). One copy of that view into a preallocated
# buffer makes it the matrix a GEMM needs. The copy is done per chunk of output rows, so the buffer
# stays small enough to be read back by the GEMM from cache rather than from memory. The padded input
# is made once per call (a slice of the view per chunk is then all the bookkeeping a chunk needs).


def _split(total: int, parts: int) -> list:
    """Boundaries cutting range(total) into `parts` nearly equal pieces."""
    return [round(k * total / parts) for k in range(parts + 1)]


def _chunks(g: ConvGeometry, chunk_size, workers: int = 1) -> list:
    """[(n0, n1, r0, r1)]: images n0:n1, output rows r0:r1, each at most chunk_size im2col rows
    (but at least one output row), in a number of chunks that `workers` threads can share evenly."""
    per_image, total = g.h_out * g.w_out, g.n * g.h_out * g.w_out
    target = total if chunk_size is None else min(chunk_size, total)
    target = min(target, math.ceil(total / workers))
    if target >= per_image:  # whole images per chunk
        parts = math.ceil(g.n / (target // per_image))
        parts = min(g.n, math.ceil(parts / workers) * workers)
        cuts = _split(g.n, parts)
        return [(cuts[k], cuts[k + 1], 0, g.h_out) for k in range(parts)]
    parts = math.ceil(g.h_out / max(1, target // g.w_out))  # pieces of rows of one image per chunk
    if g.n < workers:  # e.g. one image, two threads: an even number of pieces
        parts = min(g.h_out, math.ceil(parts / workers) * workers)
    cuts = _split(g.h_out, parts)
    return [(n, n + 1, cuts[k], cuts[k + 1]) for n in range(g.n) for k in range(parts)]


_local = threading.local()
WORKSPACE_BYTES = 32 * 2**20  # largest scratch buffer kept between calls, per thread


def _workspace(kind: str, shape: tuple, dtype) -> np.ndarray:
    """This thread's reusable scratch array: no fresh allocation (and page faults) on every call."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if size * dtype.itemsize > WORKSPACE_BYTES:
        return np.empty(shape, dtype)
    buffers = _local.__dict__.setdefault("buffers", {})
    buf = buffers.get((kind, dtype))
    if buf is None or buf.size < size:
        buf = buffers[(kind, dtype)] = np.empty(size, dtype)
    return buf[:size].reshape(shape)


def _padded(x: np.ndarray, g: ConvGeometry, dtype) -> np.ndarray:
    """x with the zero padding around every image (x itself when there is none)."""
    if not g.has_padding:
        return x
    xp = _workspace("padded", (g.n, *g.padded_hw, g.c), dtype)
    xp[:, : g.pad_top] = 0  # padding rows above and below the images
    xp[:, g.pad_top + g.h:] = 0
    xp[:, :, : g.pad_left] = 0  # padding columns left and right
    xp[:, :, g.pad_left + g.w:] = 0
    xp[:, g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w] = x
    return xp


def _patches(xp: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """Every receptive field of the padded input xp as a 6-D strided VIEW (no data moves):
    patches[n, i, j, a, b, c] = xp[n, i*sh + a*dh, j*sw + b*dw, c]."""
    s_n, s_h, s_w, s_c = xp.strides
    return np.lib.stride_tricks.as_strided(xp, (g.n, g.h_out, g.w_out, g.kh, g.kw, g.c),
                                           (s_n, g.sh * s_h, g.sw * s_w, g.dh * s_h, g.dw * s_w, s_c), writeable=False)


class _ColumnBuilder:
    """Builds the im2col rows of one chunk at a time: a slice of the patches view, copied into a reusable buffer."""

    def __init__(self, x: np.ndarray, g: ConvGeometry, chunks: list, dtype, padded=None):
        self.x, self.g = x, g
        self.copy_free = g.kh == g.kw == g.sh == g.sw == 1 and not g.has_padding
        if self.copy_free:  # a 1x1, stride-1 convolution: the input already IS the im2col matrix
            return
        self.patches = _patches(_padded(x, g, dtype) if padded is None else padded, g)  # padded: shared by workers
        rows = max((n1 - n0) * (r1 - r0) for n0, n1, r0, r1 in chunks) * g.w_out
        self.cols = _workspace("cols", (rows, g.kh * g.kw * g.c), dtype)

    def columns(self, n0, n1, r0, r1) -> np.ndarray:
        """im2col rows for output rows r0:r1 of images n0:n1, shape (m, kh*kw*C) (a view of the buffer)."""
        if self.copy_free:
            return self.x[n0:n1, r0:r1].reshape(-1, self.g.c)
        part = self.patches[n0:n1, r0:r1]  # [n, i, j, a, b, c]: still a view
        cols = self.cols[: part.shape[0] * part.shape[1] * part.shape[2]]
        np.copyto(cols.reshape(part.shape), part)  # the only data movement of im2col
        return cols


def im2col(x, kernel_size, strides=1, padding="VALID", dilations=1) -> np.ndarray:
    """The (N*H_out*W_out, kh*kw*C) matrix whose row r is output pixel r's receptive field (02_im2col)."""
    x = _as_float_array(x, "x")
    _check_rank4(x, "x", "NHWC (batch, height, width, channels)")
    _check_not_empty(x)
    g = geometry(x.shape, kernel_size, strides, padding, dilations)
    chunks = _chunks(g, None)
    return np.array(_ColumnBuilder(x, g, chunks, x.dtype).columns(*chunks[0]), copy=True)


def col2im(cols, input_shape, kernel_size, strides=1, padding="VALID", dilations=1) -> np.ndarray:
    """The adjoint of im2col: adds every row of cols back onto the pixels it came from (02_im2col).

    Overlapping patches sum, so <im2col(x), y> == <x, col2im(y)> for every x, y: exactly what the
    gradient of a convolution with respect to its input needs.
    """
    cols = _as_float_array(cols, "cols")
    g = geometry(tuple(input_shape), kernel_size, strides, padding, dilations)
    if cols.shape != g.cols_shape:
        raise ValueError(f"cols must have shape {g.cols_shape} (N*H_out*W_out, kh*kw*C) for input_shape "
                         f"{tuple(input_shape)}; got {cols.shape}")
    hp, wp = g.padded_hw
    xp = np.zeros((g.n, hp, wp, g.c), cols.dtype)
    _scatter_add(xp, cols.reshape(g.n, g.h_out, g.w_out, g.kh, g.kw, g.c), g, 0, g.h_out)
    return xp[:, g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w].copy()


def _scatter_add(xp, patches, g: ConvGeometry, r0, r1):
    """xp[padded rows that output rows r0:r1 read] += patches (N, r1-r0, W_out, kh, kw, C).

    One strided add per kernel offset (a, b): overlapping patches must add up, which one copy of a
    strided view (as in im2col) cannot do.
    """
    top0 = r0 * g.sh
    for a in range(g.kh):
        for b in range(g.kw):
            top, left = top0 + a * g.dh, b * g.dw
            xp[:, top: top + (r1 - r0 - 1) * g.sh + 1: g.sh,
               left: left + (g.w_out - 1) * g.sw + 1: g.sw, :] += patches[:, :, :, a, b, :]


# ----------------------------------------------------------------------------------------------------
# 3. Convolution = im2col + one GEMM, forward and backward.

_blas = None  # threadpoolctl's handle on numpy's BLAS, made on first use
_pools: dict = {}


_cores_limit = None  # threadpoolctl's limit that sets numpy's BLAS to machine.cores(), kept for the process


def _blas_controller():
    """threadpoolctl's handle on numpy's BLAS; on first use it sets BLAS to machine.cores() threads (LABKIT_CORES
    honoured, a container's CPU quota too), as many as this engine's workers."""
    global _blas, _cores_limit
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        from labkit.base import machine

        _blas = ThreadpoolController().select(user_api="blas")
        _cores_limit = _blas.limit(limits=machine.cores())
    return _blas


def blas_threads() -> int:
    """How many threads numpy's BLAS uses now (threadpoolctl; 1 when it cannot tell): machine.cores() from this
    engine's first use, fewer inside a narrower threadpoolctl limit (conv_bench's threads), and never above what
    the BLAS was built for (OpenBLAS: 64 in numpy's wheels). (02_im2col)"""
    info = _blas_controller().info()
    return max([int(lib.get("num_threads") or 1) for lib in info] or [1])


def _run_parallel(work, workers: int):
    """work() in `workers` threads with BLAS single-threaded (numpy releases the GIL in copies and GEMMs)."""
    if workers == 1:
        work()
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = _pools.get(workers) or _pools.setdefault(workers, ThreadPoolExecutor(workers, "labkit-conv"))
    with _blas_controller().limit(limits=1):
        for future in [pool.submit(work) for _ in range(workers)]:
            future.result()


def plan(g: ConvGeometry, chunk_size, threads=None) -> tuple:
    """(chunks, workers) conv2d_im2col uses: chunk_size already resolved to rows or None."""
    if threads is not None and (isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer))
                                or threads < 1):
        raise ValueError(f"threads must be a positive int or None; got {threads!r}")
    if chunk_size is None:  # the textbook version: the whole matrix, one GEMM on BLAS's own threads
        return [(0, g.n, 0, g.h_out)], 1
    if threads is None:  # machine.cores(), or a narrower BLAS limit in force (conv_bench's threads)
        from labkit.base import machine

        threads = max(1, min(machine.cores(), blas_threads(), g.cols_shape[0] // PARALLEL_MIN_ROWS))
    chunks = _chunks(g, chunk_size, threads)
    return chunks, min(threads, len(chunks))


ENGINES = ("numpy", "tf")


def conv2d_im2col(x, w, strides=1, padding="VALID", dilations=1, b=None, chunk_size="auto",
                  threads=None, engine="numpy") -> np.ndarray:
    """tf.nn.conv2d as im2col(x) @ w.reshape(kh*kw*C_in, C_out), plus an optional bias b (02_im2col).

    chunk_size bounds the im2col buffer to that many rows (output pixels; at least one output row):
    kh*kw*C_in*chunk_size values per thread instead of kh*kw times the whole input (plus one zero-padded
    copy of the input when there is padding), and a buffer that stays in cache. "auto" (default) picks
    about 2 MiB (at least 1024 rows when the weights take 1 MiB or more); None builds the whole matrix and
    runs exactly one GEMM. With chunks, `threads` workers (default: as many as BLAS uses, when the batch is
    large enough) each take the next chunk, build its rows and multiply them with a single-threaded BLAS,
    so the copying runs in parallel too (meanwhile numpy's BLAS is set to one thread, process-wide).

    engine="numpy" (default) is the code above: numpy copies, numpy's BLAS. engine="tf" does the same
    method inside TensorFlow (labkit.conv.tf_engine: im2col by tf.gather, TensorFlow's matmul, chunks run side
    by side by TensorFlow's own thread pools, so `threads` must stay None); x and w may then be tensors.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be 'numpy' or 'tf'; got {engine!r}")
    if engine == "tf":
        if threads is not None:
            raise ValueError(f"threads must be None with engine='tf' (TensorFlow's thread pools run it; size them "
                             f"with labkit.base.machine.limit_threads); got {threads!r}")
        from labkit.conv import tf_engine as conv_tf

        return conv_tf.conv2d(x, w, strides, padding, dilations, b=b, chunk_size=chunk_size)
    x, w, g, dtype = _check_conv_args(x, w, strides, padding, dilations)
    c_out = w.shape[3]
    chunk_size = _check_chunk_size(chunk_size, g, dtype, c_out)
    out_dtype = np.result_type(x.dtype, w.dtype)
    if b is not None:
        b = _as_float_array(b, "b")
        out_dtype = np.result_type(out_dtype, b.dtype)
        if b.shape != (c_out,):
            raise ValueError(f"b must have shape ({c_out},) (one bias per output channel); got {b.shape}")
        b = b.astype(dtype, copy=False)
    chunks, workers = plan(g, chunk_size, threads)
    wmat = np.ascontiguousarray(w.reshape(-1, c_out), dtype=dtype)  # HWIO -> (kh*kw*C_in, C_out)
    x = np.ascontiguousarray(x, dtype=dtype)
    padded = _padded(x, g, dtype)  # once per call, read by every worker
    out = np.empty((g.n, g.h_out, g.w_out, c_out), dtype)
    todo = iter(chunks)  # shared by the workers: whoever is free takes the next chunk

    def work():
        builder = _ColumnBuilder(x, g, chunks, dtype, padded)  # one buffer per worker
        for n0, n1, r0, r1 in todo:
            y = out[n0:n1, r0:r1].reshape(-1, c_out)  # contiguous: whole images, or rows of one image
            np.matmul(builder.columns(n0, n1, r0, r1), wmat, out=y)
            if b is not None:
                y += b  # while the chunk is still in cache

    _run_parallel(work, workers)
    return out.astype(out_dtype, copy=False)


def conv2d_im2col_backward(dy, x, w, strides=1, padding="VALID", dilations=1, chunk_size="auto") -> tuple:
    """Gradients (dx, dw) of sum(dy * conv2d(x, w)) by two GEMMs and col2im per chunk (02_im2col).

    dw = im2col(x).T @ dy_mat and dx = col2im(dy_mat @ w_mat.T), with dy_mat = dy.reshape(-1, C_out).
    The bias gradient, if there is a bias, is dy.sum(axis=(0, 1, 2)).
    """
    x, w, g, dtype = _check_conv_args(x, w, strides, padding, dilations)
    c_out = w.shape[3]
    chunk_size = _check_chunk_size(chunk_size, g, dtype, c_out)
    dy = _as_float_array(dy, "dy")
    out_dtype = np.result_type(x.dtype, w.dtype, dy.dtype)
    if dy.shape != (g.n, g.h_out, g.w_out, c_out):
        raise ValueError(f"dy must have the output's shape {(g.n, g.h_out, g.w_out, c_out)}; got {dy.shape}")
    wmat = np.ascontiguousarray(w.reshape(-1, c_out), dtype=dtype)
    x = np.ascontiguousarray(x, dtype=dtype)
    dy = np.ascontiguousarray(dy, dtype=dtype)
    hp, wp = g.padded_hw
    dxp = np.zeros((g.n, hp, wp, g.c), dtype)
    dwmat = np.zeros_like(wmat)
    chunks = _chunks(g, chunk_size)
    builder = _ColumnBuilder(x, g, chunks, dtype)
    for n0, n1, r0, r1 in chunks:
        dy_mat = dy[n0:n1, r0:r1].reshape(-1, c_out)
        dwmat += builder.columns(n0, n1, r0, r1).T @ dy_mat
        dcols = dy_mat @ wmat.T
        _scatter_add(dxp[n0:n1], dcols.reshape(n1 - n0, r1 - r0, g.w_out, g.kh, g.kw, g.c), g, r0, r1)
    dx = dxp[:, g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w]
    return dx.astype(out_dtype), dwmat.reshape(w.shape).astype(out_dtype, copy=False)
