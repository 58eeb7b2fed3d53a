"""labkit.conv against TensorFlow: forward vs tf.nn.conv2d, backward vs tf.GradientTape (micrograd's pattern).

Tolerance (float32): every output is a sum of K = kh*kw*C_in products of values of order 1, so the two
summation orders differ by about K * 2**-24 * |terms|; with K <= 60 here, atol = rtol = 1e-4 is ~50x
that bound and still catches any wrong index (which moves results by order 1). float64 checks
between labkit's own two implementations use 1e-10.
"""
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import labkit  # noqa: F401  (before TensorFlow: quiet C++ logs)
from labkit.base import machine
from labkit.conv import numpy_engine as conv

labkit.quiet()
TOL32 = dict(rtol=1e-4, atol=1e-4)
TOL64 = dict(rtol=1e-10, atol=1e-10)

# (x shape NHWC, w shape HWIO, strides, padding, dilations): every feature the issue names at least once
CASES = [
    ((2, 9, 11, 3), (3, 5, 3, 4), (2, 1), "SAME", 1),            # non-square kernel, stride (2, 1), batch > 1
    ((2, 9, 11, 3), (3, 5, 3, 4), 1, "VALID", (1, 2)),            # dilation (1, 2)
    ((1, 8, 8, 2), (2, 2, 2, 5), 1, "SAME", 1),                   # SAME with odd total padding: extra at bottom/right
    ((2, 8, 10, 3), (3, 3, 3, 2), 2, "SAME", 1),                  # stride 2 on even sizes: asymmetric SAME
    ((1, 7, 8, 4), (2, 3, 4, 3), (1, 2), [(1, 2), (0, 3)], (2, 1)),  # explicit, uneven padding
    ((3, 6, 6, 5), (1, 1, 5, 7), 1, "VALID", 1),                  # 1x1, C_in != C_out (the copy-free path)
    ((2, 7, 7, 4), (1, 1, 4, 2), 2, "SAME", 1),                   # strided 1x1 (ResNet's downsampling)
    ((2, 11, 9, 2), (3, 2, 2, 3), (2, 3), "SAME", (2, 2)),        # strides and dilations together
    ((1, 5, 5, 1), (5, 5, 1, 1), 1, "VALID", 1),                  # kernel = whole image: 1x1 output
    ((2, 6, 5, 3), (3, 3, 3, 4), 1, [[0, 0], [2, 0], [1, 1], [0, 0]], 1),  # TF's 4-pair padding form
]


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def tf_padding(padding):
    """Our [(t, b), (l, r)] -> TF's [[0, 0], [t, b], [l, r], [0, 0]]; strings and 4-pair forms unchanged."""
    if isinstance(padding, str) or len(padding) == 4:
        return padding
    return [[0, 0], list(padding[0]), list(padding[1]), [0, 0]]


def tf_conv(x, w, strides, padding, dilations):
    return tf.nn.conv2d(x, w, strides, tf_padding(padding), dilations=dilations).numpy()


def tf_grads(dy, x, w, strides, padding, dilations):
    """(dx, dw) of sum(dy * conv(x, w)) from tf.GradientTape.

    TF's CPU kernels have no dilated backward pass, so the dilated kernel is written out with zeros
    between its taps (the definition of dilation) and differentiated with dilations=1.
    """
    dh, dw_ = (dilations, dilations) if isinstance(dilations, int) else dilations
    kh, kw = w.shape[:2]
    w_full = np.zeros(((kh - 1) * dh + 1, (kw - 1) * dw_ + 1) + w.shape[2:], w.dtype)
    w_full[::dh, ::dw_] = w
    xt, wt = tf.constant(x), tf.constant(w_full)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = tf.nn.conv2d(xt, wt, strides, tf_padding(padding))
        loss = tf.reduce_sum(y * dy)
    # the written-out kernel is the same convolution as TF's own dilated one
    np.testing.assert_allclose(y.numpy(), tf_conv(x, w, strides, padding, dilations), **TOL32)
    gx, gw = tape.gradient(loss, [xt, wt])
    return gx.numpy(), gw.numpy()[::dh, ::dw_]


def case_id(case):
    xs, ws, s, p, d = case
    return f"x{'x'.join(map(str, xs))}-k{ws[0]}x{ws[1]}-s{s}-{p if isinstance(p, str) else 'explicit'}-d{d}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("chunk_size,threads", [(None, None), (1, 1), (7, 2), ("auto", None), ("auto", 2)])
def test_im2col_forward_matches_tf(case, chunk_size, threads):
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 0), rand(ws, 1)
    expected = tf_conv(x, w, strides, padding, dilations)
    got = conv.conv2d_im2col(x, w, strides, padding, dilations, chunk_size=chunk_size, threads=threads)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, **TOL32)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("chunk_size,as_tensors", [(None, False), (1, False), (7, True), ("auto", True)])
def test_im2col_tf_engine_matches_tf(case, chunk_size, as_tensors):
    """engine="tf" (tf.gather + TensorFlow's matmul) over the same grid as the numpy engine."""
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 0), rand(ws, 1)
    expected = tf_conv(x, w, strides, padding, dilations)
    args = (tf.constant(x), tf.constant(w)) if as_tensors else (x, w)
    got = conv.conv2d_im2col(*args, strides, padding, dilations, chunk_size=chunk_size, engine="tf")
    assert isinstance(got, np.ndarray) and got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, **TOL32)


def test_tf_engine_bias_dtypes_and_patch_index():
    from labkit.conv import tf_engine as conv_tf

    x, w, b = rand((2, 7, 6, 3), 13), rand((3, 2, 3, 4), 14), rand((4,), 15)
    expected = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b).numpy()
    np.testing.assert_allclose(conv.conv2d_im2col(x, w, 1, "SAME", b=b, chunk_size=4, engine="tf"), expected, **TOL32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    got = conv.conv2d_im2col(x64, w64, 2, "VALID", engine="tf")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, tf.nn.conv2d(x64, w64, 2, "VALID").numpy(), **TOL64)
    # the gather index reproduces the strided-view im2col, padding and dilation included
    g = conv.geometry(x.shape, (3, 2), (2, 1), [(1, 2), (0, 1)], (1, 2))
    padded = np.pad(x, ((0, 0), (1, 2), (0, 1), (0, 0))).reshape(-1, 3)
    np.testing.assert_array_equal(padded[conv_tf.patch_index(g)].reshape(g.cols_shape),
                                  conv.im2col(x, (3, 2), (2, 1), [(1, 2), (0, 1)], (1, 2)))
    # large inputs get larger chunks: the unrolled graph never has more than MAX_CHUNKS GEMMs
    assert len(conv_tf._bounds(10**6, 1)) - 1 <= conv_tf.MAX_CHUNKS


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_im2col_backward_matches_gradient_tape(case, chunk_size):
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 2), rand(ws, 3)
    dy = rand(tf_conv(x, w, strides, padding, dilations).shape, 4)
    dx, dw = conv.conv2d_im2col_backward(dy, x, w, strides, padding, dilations, chunk_size=chunk_size)
    gx, gw = tf_grads(dy, x, w, strides, padding, dilations)
    assert dx.shape == x.shape and dw.shape == w.shape
    np.testing.assert_allclose(dx, gx, **TOL32)
    np.testing.assert_allclose(dw, gw, **TOL32)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_naive_matches_tf(case):
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 5), rand(ws, 6)
    np.testing.assert_allclose(conv.conv2d_naive(x, w, strides, padding, dilations),
                               tf_conv(x, w, strides, padding, dilations), **TOL32)


@pytest.mark.parametrize("case", CASES[:5], ids=[case_id(c) for c in CASES[:5]])
def test_float64_naive_equals_im2col(case):
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 7, np.float64), rand(ws, 8, np.float64)
    got = conv.conv2d_im2col(x, w, strides, padding, dilations, chunk_size=5)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, conv.conv2d_naive(x, w, strides, padding, dilations), **TOL64)


@st.composite
def conv_problems(draw):
    n, h, w, c_in, c_out = (draw(st.integers(1, hi)) for hi in (3, 9, 9, 4, 4))
    kh, kw, sh, sw, dh, dw = (draw(st.integers(1, hi)) for hi in (4, 4, 3, 3, 3, 3))
    padding = draw(st.one_of(st.sampled_from(["VALID", "SAME"]),
                             st.tuples(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                                       st.tuples(st.integers(0, 2), st.integers(0, 2)))))
    if not isinstance(padding, str):
        padding = [list(padding[0]), list(padding[1])]
    pads = padding if not isinstance(padding, str) else [[0, 0], [0, 0]]
    assume((kh - 1) * dh + 1 <= h + sum(pads[0]) and (kw - 1) * dw + 1 <= w + sum(pads[1]))
    chunk_size = draw(st.sampled_from([None, 1, 5, 64]))
    return (n, h, w, c_in), (kh, kw, c_in, c_out), (sh, sw), padding, (dh, dw), chunk_size


@settings(max_examples=40, deadline=None)
@given(conv_problems(), st.integers(0, 2**16))
def test_hypothesis_forward_and_backward_match_tf(problem, seed):
    xs, ws, strides, padding, dilations, chunk_size = problem
    x, w = rand(xs, seed), rand(ws, seed + 1)
    expected = tf_conv(x, w, strides, padding, dilations)
    got = conv.conv2d_im2col(x, w, strides, padding, dilations, chunk_size=chunk_size)
    np.testing.assert_allclose(got, expected, **TOL32)
    dy = rand(expected.shape, seed + 2)
    dx, dw = conv.conv2d_im2col_backward(dy, x, w, strides, padding, dilations, chunk_size=chunk_size)
    gx, gw = tf_grads(dy, x, w, strides, padding, dilations)
    np.testing.assert_allclose(dx, gx, **TOL32)
    np.testing.assert_allclose(dw, gw, **TOL32)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_im2col_matrix_times_weights_is_the_convolution(case):
    xs, ws, strides, padding, dilations = case
    x, w = rand(xs, 9), rand(ws, 10)
    cols = conv.im2col(x, ws[:2], strides, padding, dilations)
    expected = tf_conv(x, w, strides, padding, dilations)
    n, h_out, w_out, c_out = expected.shape
    assert cols.shape == (n * h_out * w_out, ws[0] * ws[1] * ws[2])
    np.testing.assert_allclose(cols @ w.reshape(-1, c_out), expected.reshape(-1, c_out), **TOL32)


def test_im2col_row_is_the_receptive_field():
    x = np.arange(2 * 5 * 6 * 2, dtype=np.float64).reshape(2, 5, 6, 2)
    cols = conv.im2col(x, (2, 3), strides=(2, 1), padding="VALID", dilations=(1, 2))
    # output (n=1, i=1, j=0) reads rows 2..3 and columns 0, 2, 4 of image 1
    row = cols[1 * 2 * 2 + 1 * 2 + 0]
    np.testing.assert_array_equal(row, x[1, 2:4, 0:5:2, :].ravel())


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_col2im_is_the_adjoint_of_im2col(case):
    xs, ws, strides, padding, dilations = case
    x = rand(xs, 11, np.float64)
    cols = conv.im2col(x, ws[:2], strides, padding, dilations)
    y = rand(cols.shape, 12, np.float64)
    back = conv.col2im(y, xs, ws[:2], strides, padding, dilations)
    assert back.shape == x.shape
    assert np.isclose(np.vdot(cols, y), np.vdot(x, back), rtol=1e-12)


def test_col2im_counts_overlaps():
    # col2im(ones) = how many patches cover each pixel: 3x3 stride 1 VALID on 4x4 covers a corner once
    counts = conv.col2im(np.ones((4, 9)), (1, 4, 4, 1), 3)[0, :, :, 0]
    np.testing.assert_array_equal(counts, [[1, 2, 2, 1], [2, 4, 4, 2], [2, 4, 4, 2], [1, 2, 2, 1]])


def test_bias_matches_tf_bias_add():
    x, w, b = rand((2, 7, 6, 3), 13), rand((3, 2, 3, 4), 14), rand((4,), 15)
    expected = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b).numpy()
    np.testing.assert_allclose(conv.conv2d_im2col(x, w, 1, "SAME", b=b, chunk_size=4), expected, **TOL32)


def test_geometry_matches_tf_output_shapes_and_flops():
    g = conv.geometry((2, 9, 11, 3), (3, 5), (2, 1), "SAME", 1)
    assert (g.h_out, g.w_out) == tf_conv(rand((2, 9, 11, 3), 0), rand((3, 5, 3, 1), 0), (2, 1), "SAME", 1).shape[1:3]
    assert (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right) == (1, 1, 2, 2)
    # SAME, stride 2, even size: total padding 1 goes to the bottom/right (TF's rule)
    g = conv.geometry((1, 8, 8, 1), 3, 2, "SAME")
    assert (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right) == (0, 1, 0, 1)
    # ResNet-50 conv2_x 3x3: 56x56x64 -> 64; GEMM M x K x N = 3136 x 576 x 64 per image
    g = conv.geometry((1, 56, 56, 64), 3, 1, "SAME")
    assert g.cols_shape == (3136, 576) and g.flops(64) == 2 * 3136 * 576 * 64


def test_chunks_bound_the_buffer_and_cover_every_output_row():
    g = conv.geometry((3, 10, 7, 2), (3, 3), 1, "SAME")
    for chunk_size, threads in [(1, 1), (7, 2), (20, 1), (70, 2), (1000, 1), (None, 1)]:
        chunks = conv._chunks(g, chunk_size, threads)
        covered = sorted((n, r) for n0, n1, r0, r1 in chunks for n in range(n0, n1) for r in range(r0, r1))
        assert covered == [(n, r) for n in range(3) for r in range(10)]
        rows = max((n1 - n0) * (r1 - r0) * g.w_out for n0, n1, r0, r1 in chunks)
        assert rows <= max(chunk_size or 210, g.w_out)  # at least one output row per chunk


def test_chunk_size_bounds_peak_memory():
    import tracemalloc

    x, w = rand((4, 32, 32, 16), 16), rand((3, 3, 16, 16), 17)
    full_cols = 4 * 32 * 32 * 9 * 16 * 4  # bytes of the whole im2col matrix
    tracemalloc.start()
    try:
        conv._local.__dict__.pop("buffers", None)  # no scratch buffers kept from earlier calls: count them all
        conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=256, threads=1)
        peak_chunked = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        conv._local.__dict__.pop("buffers", None)
        conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=None)
        peak_whole = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_whole >= full_cols
    # chunked: the output, one zero-padded copy of the input and a 256-row buffer, no more (with 10% slack)
    budget = 4 * 32 * 32 * 16 * 4 + 4 * 34 * 34 * 16 * 4 + 256 * 9 * 16 * 4
    assert peak_chunked < 1.1 * budget < full_cols / 3


def test_auto_chunk_size_is_about_2_mib_of_rows():
    g = conv.geometry((8, 56, 56, 8), 3, 1, "SAME")  # K = 72 columns of float32
    assert conv._check_chunk_size("auto", g, np.float32) == 2 * 2**20 // (72 * 4)
    g = conv.geometry((8, 7, 7, 512), 3, 1, "SAME")  # K = 4608: never fewer than 1024 rows
    assert conv._check_chunk_size("auto", g, np.float32) == 1024
    assert conv._check_chunk_size("auto", g, np.float32, 512) == 1024  # 9 MiB of weights
    # ResNet-50 conv3_x 3x3: 1152 x 128 weights (576 KiB) fit in cache, so 2 MiB of rows (455), no minimum:
    # the batch's 28 output rows per image go in pieces of 14 (392 im2col rows, 1.7 MiB)
    g = conv.geometry((8, 28, 28, 128), 3, 1, "SAME")
    assert conv._check_chunk_size("auto", g, np.float32, 128) == 2 * 2**20 // (1152 * 4) == 455
    chunks, _ = conv.plan(g, 455, 2)
    assert {(n1 - n0, r1 - r0) for n0, n1, r0, r1 in chunks} == {(1, 14)} and len(chunks) == 16
    g = conv.geometry((8, 14, 14, 1024), 1, 1, "SAME")  # conv4_x 1x1 reduce: 1024 x 256 weights, exactly 1 MiB
    assert conv._check_chunk_size("auto", g, np.float32, 256) == 1024


def test_small_problems_use_blas_threads_large_ones_worker_threads(monkeypatch):
    monkeypatch.setattr(conv, "blas_threads", lambda: 2)
    small = conv.geometry((2, 7, 7, 512), 3, 1, "SAME")  # 98 rows: one GEMM on BLAS's own threads
    assert conv.plan(small, 256)[1] == 1
    large = conv.geometry((8, 56, 56, 64), 3, 1, "SAME")
    chunks, workers = conv.plan(large, 1820)
    assert workers == 2 and len(chunks) % 2 == 0
    assert conv.plan(large, None) == ([(0, 8, 0, 56)], 1)  # chunk_size=None: exactly one GEMM
    assert conv.plan(large, None, threads=2) == ([(0, 8, 0, 56)], 1)
    assert conv.plan(small, 20, threads=2)[1] == 2  # explicit threads are honoured


def test_reused_buffers_keep_padding_zero():
    # two geometries whose padded strips have the same shape but different padding columns, in turn:
    # the second must not see image values the first left in its reused buffer
    x1, x2 = rand((1, 6, 5, 2), 20) + 10, rand((1, 6, 4, 2), 21)
    w1, w2 = rand((3, 3, 2, 2), 22), rand((3, 4, 2, 2), 23)
    for _ in range(2):
        for x, w, pads in ((x1, w1, [(1, 1), (1, 1)]), (x2, w2, [(1, 1), (2, 1)])):
            got = conv.conv2d_im2col(x, w, 1, pads, chunk_size=6, threads=1)
            np.testing.assert_allclose(got, tf_conv(x, w, 1, pads, 1), **TOL32)


def test_threads_do_not_change_the_result():
    x, w = rand((3, 12, 12, 8), 18), rand((3, 3, 8, 8), 19)
    one = conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=50, threads=1)
    np.testing.assert_array_equal(one, conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=50, threads=2))
    np.testing.assert_array_equal(one, conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=50, threads=3))


# ---------------------------------------------------------------------------------------------------
# The forward pass's paths, each against tf.nn.conv2d: chunks whose boundaries do not divide the batch or
# the rows evenly, the copy-free 1x1 stride-1 path, and one image shared by several workers.


@pytest.mark.parametrize("chunk_size,threads", [(33, 1), (33, 2), (160, 1), (60, 3)])
def test_uneven_chunk_boundaries_match_tf(chunk_size, threads):
    x, w = rand((3, 13, 11, 5), 30), rand((3, 2, 5, 6), 31)  # 7 x 11 output pixels per image
    g = conv.geometry(x.shape, (3, 2), (2, 1), "SAME")
    chunks, _ = conv.plan(g, chunk_size, threads)
    assert len({(n1 - n0) * (r1 - r0) for n0, n1, r0, r1 in chunks}) > 1  # the chunks really differ in size
    got = conv.conv2d_im2col(x, w, (2, 1), "SAME", chunk_size=chunk_size, threads=threads)
    np.testing.assert_allclose(got, tf_conv(x, w, (2, 1), "SAME", 1), **TOL32)


@pytest.mark.parametrize("chunk_size,threads", [("auto", 1), (40, 2), (None, None)])
def test_1x1_stride_1_multiplies_the_input_itself(chunk_size, threads, monkeypatch):
    import tracemalloc

    copied, real_copyto = [], np.copyto  # every im2col copy goes through np.copyto: count the values it moves
    monkeypatch.setattr(np, "copyto", lambda dst, src, **kw: (copied.append(np.size(dst)), real_copyto(dst, src, **kw)))
    x, w = rand((2, 16, 16, 64), 32), rand((1, 1, 64, 2), 33)  # 128 KiB in, 8 KiB out
    expected = tf_conv(x, w, 1, "SAME", 1)  # SAME pads nothing around a 1x1 kernel
    got = conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=chunk_size, threads=threads)
    np.testing.assert_allclose(got, expected, **TOL32)
    assert sum(copied) == 0  # no im2col copy of the input
    if threads != 2:  # one worker, this thread (tracemalloc is not safe to stop while other threads allocate)
        conv._local.__dict__.pop("buffers", None)  # no scratch buffers kept from earlier calls: count them all
        tracemalloc.start()
        try:
            conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=chunk_size, threads=threads)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < x.nbytes / 4  # the output only
    # with padding a 1x1 kernel reads zeros too: the copying path, still equal to TensorFlow
    pads = [(1, 0), (0, 2)]
    np.testing.assert_allclose(conv.conv2d_im2col(x, w, 1, pads, chunk_size=chunk_size, threads=threads),
                               tf_conv(x, w, 1, pads, 1), **TOL32)
    assert sum(copied) >= 2 * 17 * 18 * 64  # the copying path did copy (the oracle above can fail)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_image_shared_by_workers_matches_tf(threads):
    x, w = rand((1, 17, 9, 4), 34), rand((3, 3, 4, 5), 35)
    chunks, workers = conv.plan(conv.geometry(x.shape, 3, 1, "SAME"), 20, threads)
    assert workers == threads and len(chunks) % threads == 0  # pieces of rows of the one image, shared evenly
    got = conv.conv2d_im2col(x, w, 1, "SAME", chunk_size=20, threads=threads)
    np.testing.assert_allclose(got, tf_conv(x, w, 1, "SAME", 1), **TOL32)


def test_resnet50_conv2_x_at_batch_1_with_the_defaults():
    """A real layer (56x56x64, 3x3, SAME) with chunk_size='auto': the image is cut into pieces of rows."""
    x, w = rand((1, 56, 56, 64), 36), rand((3, 3, 64, 64), 37) / 24  # weights ~ 1/sqrt(K): outputs of order 1
    g = conv.geometry(x.shape, 3, 1, "SAME")
    assert len(conv.plan(g, conv._check_chunk_size("auto", g, np.float32))[0]) > 1
    np.testing.assert_allclose(conv.conv2d_im2col(x, w, 1, "SAME"), tf_conv(x, w, 1, "SAME", 1), **TOL32)


# ---------------------------------------------------------------------------------------------------
# Bad input: the error type, and the parameter named in the message.

X, W = rand((1, 5, 5, 2), 0), rand((3, 3, 2, 4), 1)
FORWARD = {
    "naive": conv.conv2d_naive,
    "im2col": conv.conv2d_im2col,
    "im2col_tf": lambda x, w, *a, **k: conv.conv2d_im2col(x, w, *a, engine="tf", **k),
    "im2col_tf_tensors": lambda x, w, *a, **k: conv.conv2d_im2col(tf.constant(x), tf.constant(w), *a, engine="tf", **k),
    "backward": lambda x, w, *a, **k: conv.conv2d_im2col_backward(np.zeros((1, 3, 3, 4), np.float32), x, w, *a, **k),
}
BAD = [
    # (x, w, kwargs, error, text the message must contain)
    (X[0], W, {}, ValueError, "x must be a 4-D"),
    (X[None], W, {}, ValueError, "x must be a 4-D"),
    (X, W[0], {}, ValueError, "w must be a 4-D"),
    (X, rand((3, 3, 3, 4), 1), {}, ValueError, "channel mismatch"),
    (X, rand((6, 3, 2, 4), 1), {}, ValueError, "kernel_size"),
    (X, W, {"dilations": 3}, ValueError, "kernel_size"),
    (X, W, {"padding": [(0, 0), (0, 0)], "dilations": (1, 3)}, ValueError, "kernel_size"),
    (X, W, {"strides": 0}, ValueError, "strides"),
    (X, W, {"strides": (1, -2)}, ValueError, "strides"),
    (X, W, {"strides": (1, 1, 1)}, ValueError, "strides"),
    (X, W, {"strides": 1.5}, TypeError, "strides"),
    (X, W, {"strides": True}, TypeError, "strides"),
    (X, W, {"dilations": 0}, ValueError, "dilations"),
    (X, W, {"dilations": (-1, 1)}, ValueError, "dilations"),
    (X, W, {"dilations": "2"}, TypeError, "dilations"),
    (X, W, {"padding": "same "}, ValueError, "padding"),
    (X, W, {"padding": "FULL"}, ValueError, "padding"),
    (X, W, {"padding": "Same"}, ValueError, "padding"),
    (X, W, {"padding": [(1, 1)]}, ValueError, "padding"),
    (X, W, {"padding": [(1, 1), (1,)]}, ValueError, "padding"),
    (X, W, {"padding": [(1, -1), (0, 0)]}, ValueError, "padding"),
    (X, W, {"padding": [(1, 1.5), (0, 0)]}, TypeError, "padding"),
    (X, W, {"padding": [[1, 0], [1, 1], [1, 1], [0, 0]]}, ValueError, "padding"),
    (X, W, {"padding": 1}, ValueError, "padding"),
    (X.astype(np.int32), W, {}, TypeError, "x must be a float"),
    (X, W.astype(np.int64), {}, TypeError, "w must be a float"),
    ([[[[1, 2]]]], W, {}, TypeError, "x must be a float"),
    (X.astype(bool), W, {}, TypeError, "x must be a float"),
]


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("x,w,kwargs,error,text", BAD, ids=[f"{b[3].__name__}-{b[4]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_parameter(name, x, w, kwargs, error, text):
    with pytest.raises(error, match=text):
        FORWARD[name](x, w, **kwargs)


@pytest.mark.parametrize("kwargs,error,text", [
    ({"kernel_size": 0}, ValueError, "kernel_size"),
    ({"kernel_size": (2, 2, 2)}, ValueError, "kernel_size"),
    ({"kernel_size": 6}, ValueError, "kernel_size"),
    ({"kernel_size": 3, "strides": 0}, ValueError, "strides"),
    ({"kernel_size": 3, "padding": "full"}, ValueError, "padding"),
])
def test_im2col_bad_input(kwargs, error, text):
    with pytest.raises(error, match=text):
        conv.im2col(X, **kwargs)
    with pytest.raises(TypeError, match="x must be a float"):
        conv.im2col(X.astype(np.int8), 3)
    with pytest.raises(ValueError, match="x must be a 4-D"):
        conv.im2col(X[0], 3)


def test_other_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="cols must have shape"):
        conv.col2im(np.zeros((8, 18)), X.shape, 3)
    with pytest.raises(TypeError, match="cols must be a float"):
        conv.col2im(np.zeros((9, 18), int), X.shape, 3)
    with pytest.raises(ValueError, match="b must have shape"):
        conv.conv2d_im2col(X, W, b=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="b must be a float"):
        conv.conv2d_im2col(X, W, b=np.zeros(4, int))
    for bad in (0, -5):
        with pytest.raises(ValueError, match="chunk_size"):
            conv.conv2d_im2col(X, W, chunk_size=bad)
    with pytest.raises(TypeError, match="chunk_size"):
        conv.conv2d_im2col(X, W, chunk_size=2.5)
    with pytest.raises(ValueError, match="chunk_size"):
        conv.conv2d_im2col(X, W, chunk_size="big")
    with pytest.raises(ValueError, match="threads"):
        conv.conv2d_im2col(X, W, threads=0)
    with pytest.raises(ValueError, match="engine"):
        conv.conv2d_im2col(X, W, engine="torch")
    with pytest.raises(ValueError, match="threads must be None with engine='tf'"):
        conv.conv2d_im2col(X, W, threads=2, engine="tf")
    with pytest.raises(ValueError, match="b must have shape"):
        conv.conv2d_im2col(X, W, b=np.zeros(3, np.float32), engine="tf")
    with pytest.raises(ValueError, match="chunk_size"):
        conv.conv2d_im2col(X, W, chunk_size=0, engine="tf")
    with pytest.raises(ValueError, match="dy must have the output's shape"):
        conv.conv2d_im2col_backward(np.zeros((1, 3, 3, 3), np.float32), X, W)
    with pytest.raises(TypeError, match="dy must be a float"):
        conv.conv2d_im2col_backward(np.zeros((1, 3, 3, 4), int), X, W)


@pytest.mark.parametrize("x_shape, w_shape, word", [((0, 8, 8, 3), (3, 3, 3, 4), "N = x.shape[0]"),
                                                    ((1, 8, 8, 0), (3, 3, 0, 4), "C = x.shape[3]"),
                                                    ((1, 8, 8, 3), (3, 3, 3, 0), "C_out = w.shape[3]")])
def test_empty_batch_or_channels_are_refused_like_tensorflow(x_shape, w_shape, word):
    x, w = np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32)
    for fn in (conv.conv2d_im2col, conv.conv2d_naive, FORWARD["im2col_tf"]):
        with pytest.raises(ValueError, match=re.escape(word)):
            fn(x, w, 1, "SAME")
    # the oracle: TensorFlow refuses a filter with a zero dimension too, with one exception: its Eigen kernel
    # (oneDNN off) returns an empty output for zero output channels, where labkit refuses as oneDNN's does
    if 0 in w_shape:
        if w_shape[3] == 0 and not machine.tf_onednn_enabled():
            assert tf.nn.conv2d(x, w, 1, "SAME").shape == (*x_shape[:3], 0)
        else:
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.nn.conv2d(x, w, 1, "SAME")
    if x_shape[0] == 0 or x_shape[3] == 0:
        with pytest.raises(ValueError, match=re.escape(word)):
            conv.im2col(x, 3)
