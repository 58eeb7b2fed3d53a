"""labkit.models.cifar: parameter counts from hand-written formulas, shapes, MATLAB's cross-channel norm."""
from __future__ import annotations

import numpy as np
import pytest

import labkit  # noqa: F401
import labkit.models
from labkit.models import cifar


def conv_params(k, c_in, c_out):
    return (k * k * c_in + 1) * c_out  # MATLAB's num2dConvolutionParameters: (prod(FilterSize)*C + 1) * F


def pooled(size, pool):
    return (size - pool) // 2 + 1  # MATLAB pools with stride 2 and no padding


def sweep_expected(f, k, p, extra):
    side = pooled(pooled(32, p), p)
    return (conv_params(k, 3, f) + (conv_params(k, f, f) if extra else 0) + conv_params(k, f, 2 * f)
            + (side * side * 2 * f + 1) * 10)


def test_sweep_net_default_by_hand():
    # 5x5x3x20+20, 5x5x20x40+40, 7*7*40*10+10 with 32 -> 15 -> 7 after two 3x3/2 pools
    assert cifar.sweep_net().count_params() == 1520 + 20040 + 19610


@pytest.mark.parametrize("cfg", cifar.SWEEP_GRID,
                         ids=lambda c: "f{filters}-k{filter_size}-p{pool_size}-{extra_conv}".format(**c))
def test_sweep_net_sweep_param_counts(cfg):
    model = cifar.sweep_net(**cfg)
    expected = sweep_expected(cfg["filters"], cfg["filter_size"], cfg["pool_size"], cfg["extra_conv"])
    assert model.count_params() == expected
    assert cifar.memory_footprint(model) == 4 * expected  # seed 000: 4 bytes per learnable parameter
    assert model.output_shape == (None, 10)


def test_sweep_has_the_16_distinct_configurations():
    keys = {tuple(sorted(c.items())) for c in cifar.SWEEP_GRID}
    assert len(cifar.SWEEP_GRID) == 16 == len(keys)
    assert {c["filters"] for c in cifar.SWEEP_GRID} == {20, 32}
    assert {c["filter_size"] for c in cifar.SWEEP_GRID} == {5, 3}
    assert {c["pool_size"] for c in cifar.SWEEP_GRID} == {3, 2}


def test_convblock_param_count_by_hand():
    total, c_in = 0, 3
    for width in (32, 64, 128):
        for _ in range(4):
            total += conv_params(3, c_in, width) + 4 * width  # BN: gamma, beta (+ moving mean, variance)
            c_in = width
    total += 128 * 10 + 10
    model = cifar.convblock_net()
    assert model.count_params() == total
    assert model.output_shape == (None, 10)
    shapes = {layer.name: layer.output_shape for layer in model.layers}
    assert shapes["pool1"] == (None, 16, 16, 32) and shapes["pool2"] == (None, 8, 8, 64)
    assert shapes["avgpool"] == (None, 1, 1, 128)


def test_registry_builds_both():
    assert {"sweep_net", "convblock_net"} <= set(labkit.models.names())
    m = labkit.models.get("sweep_net", classes=10, filters=32, filter_size=3, pool_size=2, extra_conv=True)
    assert m.count_params() == sweep_expected(32, 3, 2, True)
    assert labkit.models.get("convblock_net", classes=7).output_shape == (None, 7)
    assert labkit.models.get("sweep_net", input_shape=(32, 32, 1), classes=10).input_shape == (None, 32, 32, 1)


def test_cross_channel_norm_matches_matlab_formula():
    # MATLAB: y = x / (K + alpha * ss / windowSize)^beta, ss = sum of squares over the window of channels
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 3, 7)).astype(np.float32) * 3
    layer = cifar.CrossChannelNormalization(window=5, alpha=0.01, beta=0.75, k=1.0)
    y = layer(x).numpy()
    expected = np.empty_like(x)
    for c in range(7):
        lo, hi = max(0, c - 2), min(7, c + 3)
        ss = (x[..., lo:hi] ** 2).sum(-1)
        expected[..., c] = x[..., c] / (1.0 + 0.01 * ss / 5) ** 0.75
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    clone = cifar.CrossChannelNormalization.from_config(layer.get_config())
    np.testing.assert_allclose(clone(x).numpy(), y)


@pytest.mark.parametrize("kwargs, word", [({"filters": 0}, "filters"), ({"filter_size": 2.5}, "filter_size"),
                                          ({"pool_size": -1}, "pool_size"), ({"extra_conv": "yes"}, "extra_conv"),
                                          ({"input_shape": (32, 32)}, "input_shape"), ({"classes": 0}, "classes")])
def test_sweep_net_bad_input_names_the_parameter(kwargs, word):
    with pytest.raises(ValueError, match=word):
        cifar.sweep_net(**kwargs)


def test_bad_window_is_rejected():
    with pytest.raises(ValueError, match="window"):
        cifar.CrossChannelNormalization(window=4)


def test_small_cnn_by_hand_and_registered():
    import tensorflow as tf

    m = labkit.models.get("small_cnn")
    # conv 3x3x3x16 + 16, conv 3x3x16x32 + 32, dense (8*8*32) x 10 + 10, counted by hand
    assert m.count_params() == (27 * 16 + 16) + (9 * 16 * 32 + 32) + (8 * 8 * 32 * 10 + 10)
    assert cifar.memory_footprint(m) == 4 * m.count_params()
    p = m(tf.zeros([2, 32, 32, 3])).numpy()  # ends in softmax, as every labkit model
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    assert m.layers[-1].activation.__name__ == "softmax"




@pytest.mark.parametrize("name, kwargs, side, minimum", [
    ("sweep_net", {}, 6, 7), ("sweep_net", {"pool_size": 2}, 3, 4), ("convblock_net", {}, 3, 4),
    ("small_cnn", {}, 3, 4)])
def test_too_small_an_input_names_input_shape_and_the_minimum(name, kwargs, side, minimum):
    with pytest.raises(ValueError, match=f"input_shape must be at least {minimum}x{minimum}"):
        labkit.models.get(name, input_shape=(side, side, 3), **kwargs)
    # the minimum itself builds (the oracle: Keras accepts it and gives 10 probabilities)
    m = labkit.models.get(name, input_shape=(minimum, minimum, 3), **kwargs)
    assert m.output_shape == (None, 10)
