"""CIFAR-10 networks of the sources: the MATLAB cloud white paper's 16-network sweep family and the
conv-block network of MATLAB's cloud-training example.

MATLAB white paper "Deep Learning in the Cloud with MATLAB R2016b" (Moulder et al.):
  input 32x32x3 -> conv(k, F, same) -> ReLU -> maxpool(p, stride 2)
  -> [extra: conv(k, F, same) -> ReLU -> cross-channel normalisation]
  -> conv(k, 2F, same) -> ReLU -> maxpool(p, stride 2) -> dense(10) -> softmax
  F in {20, 32}, k in {5, 3}, p in {3, 2}, extra in {no, yes}: 16 networks (SWEEP_GRID).
  MATLAB pools without padding, so a 3x3/2 pool maps 32 -> 15 -> 7 and a 2x2/2 pool 32 -> 16 -> 8.
MATLAB example "Train Network in the Cloud Using Automatic Parallel Support" (0.8938 test accuracy):
  4 x (3x3 conv, batch norm, ReLU) at widths 32 / 64 / 128, 2x2 max pools between the blocks, an 8x8 average pool,
  dense(10), softmax.

Every model ends in a softmax (MATLAB's softmaxLayer), so losses take probabilities, not logits.
(01_cnn_basics, 05_network_sweep)
"""
from __future__ import annotations

import itertools

import tensorflow as tf

from labkit.base.checks import check_int, check_number

CIFAR_SHAPE = (32, 32, 3)


def _check_shape(input_shape, minimum=1, name="this network"):
    shape = CIFAR_SHAPE if input_shape is None else tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"input_shape must be (height, width, channels) of positive ints; got {input_shape!r}")
    if min(shape[:2]) < minimum:
        raise ValueError(f"input_shape must be at least {minimum}x{minimum} for {name}; got {input_shape!r}")
    return shape


@tf.keras.utils.register_keras_serializable(package="labkit")
class CrossChannelNormalization(tf.keras.layers.Layer):
    """MATLAB's crossChannelNormalizationLayer: x / (k + alpha * sum_window(x^2) / window)^beta.

    tf.nn.local_response_normalization divides alpha by nothing, so alpha / window is passed to it.
    """

    def __init__(self, window=5, alpha=1e-4, beta=0.75, k=1.0, **kwargs):
        super().__init__(**kwargs)
        check_int(window, "window", minimum=1)
        if window % 2 != 1:
            raise ValueError(f"window must be odd (a channel and its neighbours each side); got {window}")
        self.window, self.alpha, self.beta, self.k = window, float(alpha), float(beta), float(k)

    def call(self, x):
        return tf.nn.local_response_normalization(
            x, depth_radius=(self.window - 1) // 2, bias=self.k, alpha=self.alpha / self.window, beta=self.beta
        )

    def get_config(self):
        return {**super().get_config(), "window": self.window, "alpha": self.alpha, "beta": self.beta, "k": self.k}


def sweep_net(filters=20, filter_size=5, pool_size=3, extra_conv=False, input_shape=CIFAR_SHAPE, classes=10,
                dropout=0.0):
    """The CIFAR-10 network of the MATLAB cloud white paper; the four arguments are the white paper's sweep parameters.

    dropout > 0 adds a Dropout layer before the dense layer (not in the paper: the cure for overfitting that
    05 tries; 0, the default, builds the paper's network). (01_cnn_basics)
    """
    check_number(dropout, "dropout", minimum=0, below=1)
    for name, value in (("filters", filters), ("filter_size", filter_size), ("pool_size", pool_size),
                        ("classes", classes)):
        check_int(value, name, minimum=1)
    if not isinstance(extra_conv, bool):
        raise ValueError(f"extra_conv must be True or False; got {extra_conv!r}")
    shape = _check_shape(input_shape)
    L = tf.keras.layers
    inputs = tf.keras.Input(shape=shape, name="image")
    x = L.Conv2D(filters, filter_size, padding="same", name="conv1")(inputs)
    x = L.ReLU(name="relu1")(x)
    x = L.MaxPooling2D(pool_size, strides=2, name="pool1")(x)
    if extra_conv:
        x = L.Conv2D(filters, filter_size, padding="same", name="conv_extra")(x)
        x = L.ReLU(name="relu_extra")(x)
        x = CrossChannelNormalization(5, name="norm_extra")(x)
    x = L.Conv2D(2 * filters, filter_size, padding="same", name="conv2")(x)
    x = L.ReLU(name="relu2")(x)
    x = L.MaxPooling2D(pool_size, strides=2, name="pool2")(x)
    x = L.Flatten(name="flatten")(x)
    if dropout:
        x = L.Dropout(dropout, name="dropout")(x)
    outputs = L.Dense(classes, activation="softmax", name="fc")(x)
    name = f"sweep_f{filters}_k{filter_size}_p{pool_size}" + ("_extra" if extra_conv else "")
    return tf.keras.Model(inputs, outputs, name=name)


def convblock_net(width=32, block_depth=4, input_shape=CIFAR_SHAPE, classes=10, bn_momentum=0.99):
    """The conv-block network of MATLAB's cloud-training example: 3 stages of block_depth x (3x3 conv, BN, ReLU).

    bn_momentum: Keras's BatchNormalization momentum for the moving statistics used at test time (0.99, Keras's
    default, needs several hundred steps to forget its initial values; a run of ~100 steps needs ~0.9).
    (01_cnn_basics)
    """
    check_number(bn_momentum, "bn_momentum", minimum=0, below=1)
    for name, value in (("width", width), ("block_depth", block_depth), ("classes", classes)):
        check_int(value, name, minimum=1)
    shape = _check_shape(input_shape)
    L = tf.keras.layers
    inputs = tf.keras.Input(shape=shape, name="image")
    x = inputs
    for stage, mult in enumerate((1, 2, 4), start=1):
        if stage > 1:
            x = L.MaxPooling2D(2, strides=2, name=f"pool{stage - 1}")(x)
        for i in range(1, block_depth + 1):
            x = L.Conv2D(mult * width, 3, padding="same", name=f"conv{stage}_{i}")(x)
            x = L.BatchNormalization(momentum=bn_momentum, name=f"bn{stage}_{i}")(x)
            x = L.ReLU(name=f"relu{stage}_{i}")(x)
    # MATLAB's averagePooling2dLayer(8): on a 32x32 input the last stage is 8x8, so this is a global average
    x = L.AveragePooling2D(8, name="avgpool")(x) if x.shape[1] == 8 == x.shape[2] else L.GlobalAveragePooling2D(
        keepdims=True, name="avgpool")(x)
    x = L.Flatten(name="flatten")(x)
    outputs = L.Dense(classes, activation="softmax", name="fc")(x)
    return tf.keras.Model(inputs, outputs, name=f"convblock_w{width}_d{block_depth}")


def small_cnn(input_shape=CIFAR_SHAPE, classes=10, width=16):
    """The Horovod lab's default model: conv(3x3, w)-ReLU-pool, conv(3x3, 2w)-ReLU-pool, dense, softmax.

    About 30k parameters at 32x32: small enough that one CPU step is milliseconds. (04_horovod_scaling)
    """
    shape = _check_shape(input_shape, 4, "small_cnn's two 2x2 pools")
    check_int(width, "width", minimum=1)
    check_int(classes, "classes", minimum=1)
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Input(shape=shape),
        L.Conv2D(width, 3, padding="same", activation="relu"),
        L.MaxPooling2D(2),
        L.Conv2D(2 * width, 3, padding="same", activation="relu"),
        L.MaxPooling2D(2),
        L.Flatten(),
        L.Dense(classes, activation="softmax"),
    ], name="small_cnn")


# the MATLAB cloud white paper's 16 sweep configurations, in the white paper's order of parameters
SWEEP_GRID = [
    {"filters": f, "filter_size": k, "pool_size": p, "extra_conv": e}
    for f, k, p, e in itertools.product((20, 32), (5, 3), (3, 2), (False, True))
]


def count_params(weights) -> int:
    """Number of scalars in a list of weights (model.trainable_weights, non_trainable_weights, ...)."""
    return int(sum(int(tf.size(w)) for w in weights))


def memory_footprint(model) -> int:
    """Memory footprint as the MATLAB cloud white paper counts it: 4 bytes (single precision) x learnable parameters,
    in bytes."""
    return 4 * count_params(model.trainable_weights)


def _sweep_builder(input_shape=None, classes=10, **kwargs):
    p = kwargs.get("pool_size", 3)
    # two p x p pools of stride 2 without padding: the second needs p rows, so the input needs 3p - 2
    minimum = 3 * p - 2 if isinstance(p, int) and not isinstance(p, bool) and p >= 1 else 1
    shape = _check_shape(input_shape, minimum, f"sweep_net with pool_size={p}")
    return sweep_net(input_shape=shape, classes=classes, **kwargs)


def _convblock_builder(input_shape=None, classes=10, **kwargs):
    return convblock_net(input_shape=_check_shape(input_shape, 4, "convblock_net's two 2x2 pools"), classes=classes,
                       **kwargs)


def _small_cnn_builder(input_shape=None, classes=10, **kwargs):
    return small_cnn(input_shape=_check_shape(input_shape), classes=classes, **kwargs)


MODELS = {"sweep_net": _sweep_builder, "convblock_net": _convblock_builder, "small_cnn": _small_cnn_builder}
