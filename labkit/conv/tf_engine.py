"""im2col with TensorFlow's GEMM: conv2d_im2col(..., engine="tf") (02_im2col).

The same method as labkit.conv (one im2col row per output pixel, one GEMM against w.reshape(kh*kw*C_in,
C_out)), with both steps done by TensorFlow inside one tf.function, so the data never leaves TensorFlow
and the GEMM is TensorFlow's matmul (oneDNN's where oneDNN is on):

1. pad the input once and view it as a table of pixels: N*Hp*Wp rows of C_in values;
2. im2col is then a gather: row r of the im2col matrix is the kh*kw pixels listed in patch_index(g)[r],
   one after the other (HWIO order: tap (a, b), then channel), read with one tf.gather per chunk of rows;
3. each chunk is multiplied by the weight matrix at once, while it is still in cache, and the chunks'
   outputs are joined. The chunks do not depend on each other, so TensorFlow's executor runs them
   side by side on its inter-op threads.

A graph is built (traced) once per geometry, output channels, chunk size and dtype, and kept.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from labkit.conv.shapes import ConvGeometry, _as_float_array, _check_chunk_size, _check_conv_args

# an unrolled graph with more chunks than this takes long to trace: larger inputs get larger chunks
MAX_CHUNKS = 256


def patch_index(g: ConvGeometry) -> np.ndarray:
    """(N*H_out*W_out, kh*kw) int32: the pixels of the padded input (numbered n*Hp*Wp + row*Wp + col) that
    each im2col row reads, tap by tap. im2col(x) == pixels[patch_index(g)].reshape(M, kh*kw*C). (02_im2col)"""
    hp, wp = g.padded_hw
    n = np.arange(g.n).reshape(-1, 1, 1, 1, 1)
    i = np.arange(g.h_out).reshape(1, -1, 1, 1, 1)
    j = np.arange(g.w_out).reshape(1, 1, -1, 1, 1)
    a = np.arange(g.kh).reshape(1, 1, 1, -1, 1)
    b = np.arange(g.kw).reshape(1, 1, 1, 1, -1)
    index = (n * hp + i * g.sh + a * g.dh) * wp + j * g.sw + b * g.dw
    if index.size and index.max() >= 2**31:
        raise ValueError(f"input of {g.n * hp * wp} padded pixels is too large for int32 indices; split the batch")
    return index.reshape(-1, g.kh * g.kw).astype(np.int32)


def _bounds(rows_total: int, rows) -> list:
    """Chunk boundaries over the im2col rows: `rows` per chunk (None: one chunk), at most MAX_CHUNKS."""
    rows = rows_total if rows is None else max(int(rows), math.ceil(rows_total / MAX_CHUNKS))
    return list(range(0, rows_total, rows)) + [rows_total]


@functools.lru_cache(maxsize=32)
def _graph(g: ConvGeometry, c_out: int, rows, dtype: str, with_bias: bool):
    """The traced tf.function (x, w[, b]) -> conv output for this geometry."""
    import tensorflow as tf

    bounds = _bounds(g.n * g.h_out * g.w_out, rows)
    k = g.kh * g.kw * g.c
    copy_free = g.kh == g.kw == g.sh == g.sw == 1 and not g.has_padding  # 1x1: the pixels ARE the matrix
    index = None if copy_free else patch_index(g)
    pads = [[0, 0], [g.pad_top, g.pad_bottom], [g.pad_left, g.pad_right], [0, 0]]
    spec = [tf.TensorSpec((g.n, g.h, g.w, g.c), dtype), tf.TensorSpec((g.kh, g.kw, g.c, c_out), dtype)]

    def run(x, w, b=None):
        w_mat = tf.reshape(w, [k, c_out])  # HWIO -> (kh*kw*C_in, C_out)
        pixels = tf.reshape(tf.pad(x, pads) if g.has_padding else x, [-1, g.c])
        outs = []
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            cols = pixels[r0:r1] if copy_free else tf.reshape(tf.gather(pixels, index[r0:r1]), [r1 - r0, k])
            y = tf.linalg.matmul(cols, w_mat)  # the GEMM: (rows, kh*kw*C_in) @ (kh*kw*C_in, C_out)
            outs.append(y + b if with_bias else y)
        y = outs[0] if len(outs) == 1 else tf.concat(outs, 0)
        return tf.reshape(y, [g.n, g.h_out, g.w_out, c_out])

    if with_bias:
        return tf.function(run, input_signature=spec + [tf.TensorSpec((c_out,), dtype)], autograph=False)
    return tf.function(lambda x, w: run(x, w), input_signature=spec, autograph=False)


def _shape_of(a):
    """A zero-copy stand-in with a's shape and dtype for the argument checks (a TF tensor is not copied)."""
    import tensorflow as tf

    if tf.is_tensor(a):
        return np.broadcast_to(np.zeros((), np.dtype(a.dtype.as_numpy_dtype)), tuple(a.shape))
    return a


def conv2d(x, w, strides=1, padding="VALID", dilations=1, b=None, chunk_size="auto") -> np.ndarray:
    """conv2d_im2col(..., engine="tf"): im2col by tf.gather and TensorFlow's GEMM, per chunk of rows.

    x, w (and b) may be numpy arrays or TensorFlow tensors; the result is a numpy array. chunk_size means
    what it means for the numpy engine (rows per GEMM; "auto" about 2 MiB; None one GEMM). (02_im2col)
    """
    import tensorflow as tf

    xs, ws, g, dtype = _check_conv_args(_shape_of(x), _shape_of(w), strides, padding, dilations)
    rows = _check_chunk_size(chunk_size, g, dtype)
    c_out = ws.shape[3]
    out_dtype = np.result_type(xs.dtype, ws.dtype)
    if b is not None:
        bs = _as_float_array(_shape_of(b), "b")
        out_dtype = np.result_type(out_dtype, bs.dtype)
        if bs.shape != (c_out,):
            raise ValueError(f"b must have shape ({c_out},) (one bias per output channel); got {bs.shape}")
    name = np.dtype(dtype).name
    args = [a if tf.is_tensor(a) and a.dtype == name else tf.cast(a, name) for a in (x, w, b) if a is not None]
    y = _graph(g, int(c_out), rows, name, b is not None)(*args).numpy()
    return y.astype(out_dtype, copy=False)
