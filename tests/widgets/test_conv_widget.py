"""labkit.widgets.im2col: its numbers against tf.nn.conv2d and labkit.conv.im2col; the widget without a browser."""
import matplotlib
import numpy as np
import pytest
import tensorflow as tf

import labkit  # noqa: F401
from labkit.conv import numpy_engine as conv
from labkit.widgets import im2col as explorer

matplotlib.use("Agg")
labkit.quiet()

CASES = [  # (image size, kernel, strides, padding, dilations)
    ((7, 7), 3, 1, "VALID", 1),
    ((6, 7), (3, 2), (2, 1), "SAME", (1, 2)),
    ((8, 5), (2, 3), 2, 1, 1),  # an int: explicit padding on every side
    ((5, 5), 1, 1, "SAME", 1),
    ((9, 9), 3, 3, [(0, 2), (1, 0)], 2),
]


def tf_padding(p):
    if isinstance(p, str):
        return p
    if isinstance(p, int):
        return [[0, 0], [p, p], [p, p], [0, 0]]
    return [[0, 0], list(p[0]), list(p[1]), [0, 0]]


@pytest.mark.parametrize("size,kernel,strides,padding,dilations", CASES)
def test_explain_matches_tf_and_im2col(size, kernel, strides, padding, dilations):
    c_in, c_out, n = 3, 5, 2
    info = explorer.explain(size, kernel, strides, padding, dilations, c_in=c_in, c_out=c_out, batch_size=n)
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    x = np.random.default_rng(0).standard_normal((n, *size, c_in)).astype(np.float32)
    w = np.ones((kh, kw, c_in, c_out), np.float32)
    expected = tf.nn.conv2d(x, w, strides, tf_padding(padding), dilations=dilations)
    assert info["output_shape"] == tuple(expected.shape)
    m, k = info["im2col_shape"]
    assert (m, k) == (n * expected.shape[1] * expected.shape[2], kh * kw * c_in)
    assert info["weights_shape"] == (k, c_out)
    assert info["flops"] == 2 * m * k * c_out == 2 * info["macs"]
    assert info["blowup"] == pytest.approx(m * k / x.size)


@pytest.mark.parametrize("size,kernel,strides,padding,dilations", CASES)
def test_taps_are_the_rows_of_im2col(size, kernel, strides, padding, dilations):
    info = explorer.explain(size, kernel, strides, padding, dilations)
    g = info["geometry"]
    padded = np.zeros(g.padded_hw)
    padded[g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w] = np.arange(1, g.h * g.w + 1).reshape(g.h, g.w)
    image = padded[g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w]
    pad = padding if not isinstance(padding, int) else [(padding, padding)] * 2
    cols = conv.im2col(image[None, :, :, None].astype(float), kernel, strides, pad, dilations)
    taps = info["taps"].reshape(-1, g.kh * g.kw, 2)
    np.testing.assert_array_equal(cols, padded[taps[..., 0], taps[..., 1]])


def test_blowup_of_a_3x3_same_convolution_is_nine():
    assert explorer.explain((56, 56), 3, 1, "SAME", c_in=64, c_out=64)["blowup"] == 9


def test_bad_settings_raise_naming_the_parameter():
    with pytest.raises(ValueError, match="kernel_size"):
        explorer.explain((4, 4), 5)
    with pytest.raises(ValueError, match="strides"):
        explorer.explain((4, 4), 3, strides=0)


def test_summary_and_drawing():
    info = explorer.explain((6, 7), (3, 2), (2, 1), "SAME", (1, 2), c_in=64, c_out=32)
    text = explorer.summary_text(info)
    assert "21 x 384" in text and "(1, 3, 7, 32)" in text and f"{2 * 21 * 384 * 32:,} FLOPs" in text
    axes = explorer.draw(info, pixel=(1, 2))
    assert "row 9" in axes[1].get_title()  # output (1, 2) of a 7-wide output is row 1*7 + 2
    matplotlib.pyplot.close("all")


def test_explorer_widget_updates_without_a_browser():
    box = explorer.im2col_explorer(c_in=64, c_out=64)
    c = box.controls
    assert "(1, 5, 5, 64)" in box.text.value  # 7x7, 3x3 VALID
    c["padding"].value = "SAME"
    assert "(1, 7, 7, 64)" in box.text.value and "49 x 576" in box.text.value
    assert c["pixel"].max == 48
    c["stride"].value = 2
    assert "(1, 4, 4, 64)" in box.text.value
    c["padding"].value = "VALID"
    c["dilation"].value = 3
    c["kh"].value = 5  # spans 13 rows of a 7-row image: an error message, not an exception
    assert "kernel_size" in box.text.value
    matplotlib.pyplot.close("all")
