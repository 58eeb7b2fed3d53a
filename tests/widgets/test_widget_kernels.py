"""labkit.widgets.kernels: the hand convolution against tf.nn.conv2d on a real dataset image, and the widget."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import labkit  # noqa: F401
from labkit.data import loading as data
from labkit.widgets import kernels


@pytest.fixture(scope="module")
def gray():
    (x, _), _ = data.synthetic(3, 0)
    return kernels.to_gray(x[0])


@pytest.mark.parametrize("name", list(kernels.KERNELS))
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_apply_kernel_equals_tf_conv2d(gray, name, padding):
    k = kernels.kernel(name)
    ref = tf.nn.conv2d(gray[None, :, :, None], k[:, :, None, None], strides=1, padding=padding)[0, :, :, 0]
    np.testing.assert_allclose(kernels.apply_kernel(gray, k, padding), ref.numpy(), atol=1e-5)


def test_non_square_even_kernel_same_padding(gray):
    k = np.arange(8, dtype=np.float32).reshape(2, 4) - 3  # TensorFlow pads the extra row/column after
    ref = tf.nn.conv2d(gray[None, :, :, None], k[:, :, None, None], strides=1, padding="SAME")[0, :, :, 0]
    np.testing.assert_allclose(kernels.apply_kernel(gray, k, "SAME"), ref.numpy(), atol=1e-5)


def test_sobel_x_finds_vertical_edges():
    img = np.zeros((8, 8), np.float32)
    img[:, 4:] = 1.0  # a vertical step edge
    out = kernels.apply_kernel(img, kernels.kernel("sobel x (vertical edges)"), "VALID")
    assert np.allclose(out[:, [2, 3]], 4.0) and np.allclose(out[:, [0, 1, 4, 5]], 0.0)
    assert np.allclose(kernels.apply_kernel(img, kernels.kernel("sobel y (horizontal edges)"), "VALID"), 0.0)


def test_to_gray_uses_luminance_weights():
    px = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]]], np.uint8)
    np.testing.assert_allclose(kernels.to_gray(px)[0], [0.299, 0.587, 0.114], rtol=1e-5)


@pytest.mark.parametrize("call, word", [
    (lambda: kernels.kernel("nope"), "kernel name"),
    (lambda: kernels.apply_kernel(np.zeros((4, 4, 3)), np.ones((3, 3))), "image"),
    (lambda: kernels.apply_kernel(np.zeros((4, 4)), np.ones((5, 5))), "kernel"),
    (lambda: kernels.apply_kernel(np.zeros((4, 4)), np.ones((3, 3)), "FULL"), "padding"),
    (lambda: kernels.to_gray(np.zeros((4, 4))), "image"),
])
def test_bad_input_names_the_parameter(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_explorer_switches_kernels_and_goes_custom_when_edited(capsys):
    import matplotlib

    matplotlib.use("Agg")
    (x, y), _ = data.synthetic(4, 0)
    box = kernels.kernel_explorer(x, list(data.SYNTHETIC_CLASSES), y)
    choice, index = box.children[0].children
    cells = box.children[2].children
    choice.value = "sharpen"
    assert [c.value for c in cells] == pytest.approx(kernels.kernel("sharpen").ravel())
    cells[4].value = 9.0
    assert choice.value == "custom"
    index.value = 3
    choice.value = "blur (box)"
    assert cells[0].value == pytest.approx(1 / 9)
