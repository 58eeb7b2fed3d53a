"""The sizes of a convolution by TensorFlow's rules, the argument checks of labkit.conv, and its chunk size (02_im2col).

`geometry(input_shape, kernel_size, strides, padding, dilations)` gives every size of one convolution:
input, kernel, strides, dilations, the padding on each side (SAME's odd one out at the bottom/right, as
TensorFlow) and the output. Every check names the parameter and says what would be accepted.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

PADDING_HELP = "padding must be 'VALID', 'SAME' or pairs [(top, bottom), (left, right)]"


class ConvGeometry(NamedTuple):
    """Every size of one convolution: input, kernel, strides, dilations, padding and output."""

    n: int
    h: int
    w: int
    c: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    h_out: int
    w_out: int

    @property
    def out_shape(self) -> tuple:
        """Output shape without C_out: (N, H_out, W_out)."""
        return (self.n, self.h_out, self.w_out)

    @property
    def cols_shape(self) -> tuple:
        """Shape of the im2col matrix: (N * H_out * W_out, kh * kw * C_in)."""
        return (self.n * self.h_out * self.w_out, self.kh * self.kw * self.c)

    @property
    def has_padding(self) -> bool:
        return any((self.pad_top, self.pad_bottom, self.pad_left, self.pad_right))

    @property
    def padded_hw(self) -> tuple:
        return (self.h + self.pad_top + self.pad_bottom, self.w + self.pad_left + self.pad_right)

    def flops(self, c_out: int) -> int:
        """FLOPs of the convolution = of its GEMM: 2 * M * K * N (one multiply + one add per MAC)."""
        m, k = self.cols_shape
        return 2 * m * k * int(c_out)


# ----------------------------------------------------------------------------------------------------
# Argument checks: every error names the parameter and says what would be accepted.


def _int_pair(value, name: str) -> tuple:
    """An int or a pair of ints, each >= 1, as a pair."""
    items = value if isinstance(value, (tuple, list, np.ndarray)) else (value,)
    if len(items) == 1:
        items = (items[0], items[0])
    if len(items) != 2:
        raise ValueError(f"{name} must be an int or a pair (vertical, horizontal); got {value!r}")
    out = []
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise TypeError(f"{name} must be an int or a pair of ints; got {value!r}")
        if item < 1:
            raise ValueError(f"{name} must be >= 1; got {value!r}")
        out.append(int(item))
    return tuple(out)


def _explicit_padding(padding) -> tuple:
    """[(top, bottom), (left, right)] or TF's [[0, 0], [t, b], [l, r], [0, 0]] -> (t, b, l, r)."""
    try:
        pairs = [tuple(p) for p in padding]
    except TypeError:
        raise ValueError(f"{PADDING_HELP}; got {padding!r}") from None
    if len(pairs) == 4:  # TensorFlow's NHWC form: batch and channel entries must be zero
        if any(len(p) != 2 for p in pairs) or pairs[0] != (0, 0) or pairs[3] != (0, 0):
            raise ValueError(f"padding in 4-pair NHWC form must have (0, 0) for batch and channels; got {padding!r}")
        pairs = pairs[1:3]
    if len(pairs) != 2 or any(len(p) != 2 for p in pairs):
        raise ValueError(f"{PADDING_HELP}; got {padding!r}")
    flat = [v for p in pairs for v in p]
    for v in flat:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"padding amounts must be ints; got {padding!r}")
        if v < 0:
            raise ValueError(f"padding amounts must be >= 0; got {padding!r}")
    return tuple(int(v) for v in flat)


def _as_float_array(a, name: str) -> np.ndarray:
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be a float array (float16/32/64); got dtype {a.dtype}. "
                        f"Convert with {name}.astype(np.float32).")
    return a


def _check_rank4(a: np.ndarray, name: str, layout: str):
    if a.ndim != 4:
        raise ValueError(f"{name} must be a 4-D {layout} array; got shape {a.shape} ({a.ndim}-D)")


def geometry(input_shape, kernel_size, strides=1, padding="VALID", dilations=1) -> ConvGeometry:
    """All sizes of a convolution of an NHWC input_shape with a (kh, kw) kernel, TF's rules (02_im2col)."""
    if len(input_shape) != 4:
        raise ValueError(f"x must be a 4-D NHWC array; got shape {tuple(input_shape)}")
    n, h, w, c = (int(v) for v in input_shape)
    kh, kw = _int_pair(kernel_size, "kernel_size")
    sh, sw = _int_pair(strides, "strides")
    dh, dw = _int_pair(dilations, "dilations")
    eff_h, eff_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1  # the dilated kernel's footprint
    if isinstance(padding, str):
        if padding in ("VALID", "valid"):
            pads = (0, 0, 0, 0)
        elif padding in ("SAME", "same"):
            # TF: output = ceil(input / stride); pad what that needs, the odd one out at the bottom/right
            pads = []
            for size, stride, eff in ((h, sh, eff_h), (w, sw, eff_w)):
                total = max((math.ceil(size / stride) - 1) * stride + eff - size, 0)
                pads += [total // 2, total - total // 2]
            pads = tuple(pads)
        else:
            raise ValueError(f"{PADDING_HELP}; got {padding!r}")
    else:
        pads = _explicit_padding(padding)
    pt, pb, pl, pr = pads
    hp, wp = h + pt + pb, w + pl + pr
    if eff_h > hp or eff_w > wp:
        raise ValueError(
            f"kernel_size {kh}x{kw} with dilations ({dh}, {dw}) spans {eff_h}x{eff_w} pixels, larger than "
            f"the padded input {hp}x{wp}; use a smaller kernel or dilation, or more padding")
    h_out, w_out = (hp - eff_h) // sh + 1, (wp - eff_w) // sw + 1
    return ConvGeometry(n, h, w, c, kh, kw, sh, sw, dh, dw, pt, pb, pl, pr, h_out, w_out)


def _check_not_empty(x: np.ndarray, w: np.ndarray | None = None):
    """Refuse empty batches and channels. TensorFlow refuses a filter with a zero dimension ("filter must not
    have zero elements"); for N = 0 its oneDNN kernel returns an array with the wrong channel count."""
    if x.shape[0] < 1:
        raise ValueError(f"x must hold at least one image: N = x.shape[0] must be >= 1; got shape {x.shape}")
    if x.shape[3] < 1:
        raise ValueError(f"x must have at least one channel: C = x.shape[3] must be >= 1; got shape {x.shape}")
    if w is not None and w.shape[3] < 1:
        raise ValueError(f"w must have at least one filter: C_out = w.shape[3] must be >= 1; got shape {w.shape}")


def _check_conv_args(x, w, strides, padding, dilations):
    x = _as_float_array(x, "x")
    w = _as_float_array(w, "w")
    _check_rank4(x, "x", "NHWC (batch, height, width, channels)")
    _check_rank4(w, "w", "HWIO (kernel height, kernel width, in channels, out channels)")
    _check_not_empty(x, w)
    if w.shape[2] != x.shape[3]:
        raise ValueError(f"channel mismatch: w has {w.shape[2]} input channels (w.shape[2]) but x has "
                         f"{x.shape[3]} (x.shape[3])")
    g = geometry(x.shape, w.shape[:2], strides, padding, dilations)
    return x, w, g, np.result_type(x.dtype, w.dtype, np.float32)  # float16 is computed in float32


# chunk_size="auto": as many im2col rows as fit in CHUNK_BYTES, but at least MIN_CHUNK_ROWS when the weight
# matrix takes LARGE_WEIGHTS_BYTES or more. A 2 MiB buffer stays in cache while it is written and read back by
# the GEMM. Every chunk's GEMM packs the whole weight matrix again: cheap while it sits in a core's cache
# (1 MiB of L2 on the AMD EPYC measured), costly from memory, so large weights (ResNet-50's conv4_x and
# conv5_x 3x3: 2.3 and 9 MiB) get 1024+ rows per chunk. Measured single-core by CPU time on ResNet-50's 3x3
# layers (labkit conv-bench --threads 1 --cpu-time): 2 MiB was as fast as 4 MiB or faster on every layer;
# on conv3_x (576 KiB of weights) 392-row chunks (1.7 MiB) beat the 1024-row minimum's 784 (3.4 MiB) by 7%
# (single core and two threads, 21 interleaved rounds). The chunk-size sweep in 02_im2col shows the trade-off.
CHUNK_BYTES = 2 * 2**20
MIN_CHUNK_ROWS = 1024
LARGE_WEIGHTS_BYTES = 2**20


def _check_chunk_size(chunk_size, g: ConvGeometry, dtype, c_out=None):
    """chunk_size as rows of the im2col matrix per GEMM, or None for the whole matrix (c_out: output
    channels, which size the weight matrix; None counts it as large)."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, str):
        if chunk_size != "auto":
            raise ValueError(f"chunk_size must be 'auto', an int >= 1 or None; got {chunk_size!r}")
        k, itemsize = g.kh * g.kw * g.c, np.dtype(dtype).itemsize
        rows = CHUNK_BYTES // (k * itemsize)
        if c_out is None or k * c_out * itemsize >= LARGE_WEIGHTS_BYTES:
            rows = max(MIN_CHUNK_ROWS, rows)
        return rows
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)):
        raise TypeError(f"chunk_size must be 'auto', an int (rows of the im2col matrix per GEMM) or None; "
                        f"got {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (or None for one GEMM over the whole batch); got {chunk_size!r}")
    return int(chunk_size)
