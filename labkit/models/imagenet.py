"""ImageNet classifiers the course counts and times: AlexNet, VGG, ResNet (03_flops).

Every builder has the signature `builder(input_shape=None, classes=1000, **kwargs)` and returns an
uninitialised-for-ImageNet Keras model (weights=None); `labkit.models.get(name)` finds them in MODELS.

  alexnet          single tower, 64-192-384-256-256 filters, as torchvision's (Krizhevsky 2014, "one weird
                   trick"); 224x224 input. torchvision's adaptive 6x6 average pool is the identity at 224 and
                   is left out, so other input sizes change the size of fc6.
  alexnet_grouped  Krizhevsky, Sutskever & Hinton 2012: 96-256-384-384-256 filters, conv2/4/5 split in two
                   groups (the two GPUs), local response normalisation after conv1 and conv2; 227x227 input
                   (the paper's "224" does not give its 55x55 conv1 output; Caffe's 227 does).
  vgg11..vgg19     Simonyan & Zisserman 2015, configurations A, B, D, E; layer names as keras.applications.
  resnet18/34      He et al. 2016, basic blocks, projection shortcuts where the shape changes, bias-free
                   convolutions (as torchvision); built here since keras.applications has none.
  resnet50/101/152 keras.applications (ResNet v1: stride 2 in the first 1x1 convolution of a stage).
  resnet50_v1.5    the same network with the stride on the 3x3 convolution (torchvision, NVIDIA): the
                   variant most published throughput numbers use; 4.09 vs 3.86 G MACs (03_flops).
"""
from __future__ import annotations

import tensorflow as tf

layers = tf.keras.layers

DEFAULT_SIZE = 224


def _alexnet_lrn(name):
    """Krizhevsky 2012's normalisation, b = a / (2 + 1e-4 * sum over 5 channels of a^2)^0.75.

    The one LRN layer is labkit.models.cifar's CrossChannelNormalization, in MATLAB's convention (alpha is
    divided by the window), so the paper's alpha x 5 is passed.
    """
    from labkit.models.cifar import CrossChannelNormalization
    return CrossChannelNormalization(window=5, alpha=5 * 1e-4, beta=0.75, k=2.0, name=name)


def _input_shape(input_shape, default_size):
    """Validate input_shape (H, W, C); None gives the network's default square RGB input."""
    if input_shape is None:
        return (default_size, default_size, 3)
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"input_shape must be (height, width, channels) of positive ints; got {input_shape!r}")
    return shape


def _build(name, builder, input_shape):
    """Run a graph builder; a too-small input becomes an error that names input_shape."""
    try:
        return builder()
    except ValueError as err:
        raise ValueError(f"input_shape {input_shape} is too small for {name}: {err}") from None


# ---------------------------------------------------------------- AlexNet
_ALEXNET_REMOVABLE = ("conv3", "conv4", "fc6", "fc7")


def _check_without(without):
    without = tuple(without)
    bad = [w for w in without if w not in _ALEXNET_REMOVABLE]
    if bad:
        raise ValueError(f"without may name {', '.join(_ALEXNET_REMOVABLE)}; got {bad!r}")
    return without


def _alexnet_head(x, classes, without, dropout):
    x = layers.Flatten(name="flatten")(x)
    for name in ("fc6", "fc7"):
        if name in without:
            continue
        if dropout:
            x = layers.Dropout(0.5, name=f"drop{name[2:]}")(x)
        x = layers.Dense(4096, activation="relu", name=name)(x)
    return layers.Dense(classes, activation="softmax", name="fc8")(x)


def alexnet(input_shape=None, classes=1000, without=()):
    """Single-tower AlexNet as torchvision: 61,100,840 parameters, 0.71 G MACs at 224x224.

    without: names among conv3, conv4, fc6, fc7 to remove (the lecture's depth-reduction experiment).
    """
    shape, without = _input_shape(input_shape, DEFAULT_SIZE), _check_without(without)

    def build():
        inputs = layers.Input(shape, name="input")
        x = layers.ZeroPadding2D(2, name="conv1_pad")(inputs)
        x = layers.Conv2D(64, 11, strides=4, activation="relu", name="conv1")(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool1")(x)
        x = layers.Conv2D(192, 5, padding="same", activation="relu", name="conv2")(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool2")(x)
        for name, filters in (("conv3", 384), ("conv4", 256), ("conv5", 256)):
            if name not in without:
                x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=name)(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool5")(x)
        # torchvision puts dropout before fc6 and fc7
        outputs = _alexnet_head(x, classes, without, dropout=True)
        suffix = "" if not without else "_without_" + "_".join(without)
        return tf.keras.Model(inputs, outputs, name="alexnet" + suffix)

    return _build("alexnet", build, shape)


def alexnet_grouped(input_shape=None, classes=1000, without=()):
    """Krizhevsky et al. 2012's two-GPU AlexNet: 60,965,224 parameters, 0.72 G MACs at 227x227.

    conv2, conv4 and conv5 have groups=2 (each GPU's half sees only its own half of the channels).
    without: names among conv3, conv4, fc6, fc7 to remove (the lecture's depth-reduction experiment).
    """
    shape, without = _input_shape(input_shape, 227), _check_without(without)

    def build():
        inputs = layers.Input(shape, name="input")
        x = layers.Conv2D(96, 11, strides=4, activation="relu", name="conv1")(inputs)
        x = _alexnet_lrn("norm1")(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool1")(x)
        x = layers.Conv2D(256, 5, padding="same", groups=2, activation="relu", name="conv2")(x)
        x = _alexnet_lrn("norm2")(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool2")(x)
        for name, filters, groups in (("conv3", 384, 1), ("conv4", 384, 2), ("conv5", 256, 2)):
            if name not in without:
                x = layers.Conv2D(filters, 3, padding="same", groups=groups, activation="relu", name=name)(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool5")(x)
        x = layers.Flatten(name="flatten")(x)
        for name in ("fc6", "fc7"):  # the paper: dropout after the first two fully connected layers
            if name not in without:
                x = layers.Dense(4096, activation="relu", name=name)(x)
                x = layers.Dropout(0.5, name=f"drop{name[2:]}")(x)
        outputs = layers.Dense(classes, activation="softmax", name="fc8")(x)
        suffix = "" if not without else "_without_" + "_".join(without)
        return tf.keras.Model(inputs, outputs, name="alexnet_grouped" + suffix)

    return _build("alexnet_grouped", build, shape)


# ---------------------------------------------------------------- VGG
# filters per 3x3 convolution, block by block (Simonyan & Zisserman 2015, Table 1)
_VGG_BLOCKS = {
    11: ((64,), (128,), (256, 256), (512, 512), (512, 512)),
    13: ((64, 64), (128, 128), (256, 256), (512, 512), (512, 512)),
    16: ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)),
    19: ((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4),
}


def vgg(depth, input_shape=None, classes=1000):
    """VGG-11/13/16/19 with keras.applications' layer names (VGG-16: 138,357,544 parameters)."""
    if depth not in _VGG_BLOCKS:
        raise ValueError(f"depth must be one of {sorted(_VGG_BLOCKS)}; got {depth!r}")
    shape = _input_shape(input_shape, DEFAULT_SIZE)

    def build():
        inputs = layers.Input(shape, name="input")
        x = inputs
        for b, block in enumerate(_VGG_BLOCKS[depth], start=1):
            for c, filters in enumerate(block, start=1):
                x = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"block{b}_conv{c}")(x)
            x = layers.MaxPooling2D(2, strides=2, name=f"block{b}_pool")(x)
        x = layers.Flatten(name="flatten")(x)
        x = layers.Dense(4096, activation="relu", name="fc1")(x)
        x = layers.Dense(4096, activation="relu", name="fc2")(x)
        outputs = layers.Dense(classes, activation="softmax", name="predictions")(x)
        return tf.keras.Model(inputs, outputs, name=f"vgg{depth}")

    return _build(f"vgg{depth}", build, shape)


# ---------------------------------------------------------------- ResNet built here
def _conv_bn(x, filters, kernel_size, strides, name, relu=True):
    """conv (bias-free, explicit symmetric padding as torchvision) -> BN -> optional ReLU."""
    pad = kernel_size // 2
    if pad and strides > 1:
        x = layers.ZeroPadding2D(pad, name=name + "_pad")(x)
        padding = "valid"
    else:
        padding = "same"
    x = layers.Conv2D(filters, kernel_size, strides=strides, padding=padding, use_bias=False,
                      name=name + "_conv")(x)
    x = layers.BatchNormalization(epsilon=1e-5, name=name + "_bn")(x)
    return layers.Activation("relu", name=name + "_relu")(x) if relu else x


def _basic_block(x, filters, strides, name):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:  # projection shortcut (option B)
        shortcut = _conv_bn(x, filters, 1, strides, name + "_0", relu=False)
    x = _conv_bn(x, filters, 3, strides, name + "_1")
    x = _conv_bn(x, filters, 3, 1, name + "_2", relu=False)
    x = layers.Add(name=name + "_add")([shortcut, x])
    return layers.Activation("relu", name=name + "_out")(x)


def _bottleneck_v1_5(x, filters, strides, name):
    shortcut = x
    if strides != 1 or x.shape[-1] != 4 * filters:
        shortcut = _conv_bn(x, 4 * filters, 1, strides, name + "_0", relu=False)
    x = _conv_bn(x, filters, 1, 1, name + "_1")
    x = _conv_bn(x, filters, 3, strides, name + "_2")  # v1.5: the stride sits on the 3x3 convolution
    x = _conv_bn(x, 4 * filters, 1, 1, name + "_3", relu=False)
    x = layers.Add(name=name + "_add")([shortcut, x])
    return layers.Activation("relu", name=name + "_out")(x)


def _resnet(name, block, blocks_per_stage, input_shape, classes):
    shape = _input_shape(input_shape, DEFAULT_SIZE)

    def build():
        inputs = layers.Input(shape, name="input")
        x = _conv_bn(inputs, 64, 7, 2, "conv1")
        x = layers.ZeroPadding2D(1, name="pool1_pad")(x)
        x = layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)
        for stage, (filters, count) in enumerate(zip((64, 128, 256, 512), blocks_per_stage), start=2):
            for i in range(count):
                strides = 2 if (i == 0 and stage > 2) else 1
                x = block(x, filters, strides, f"conv{stage}_block{i + 1}")
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        outputs = layers.Dense(classes, activation="softmax", name="predictions")(x)
        return tf.keras.Model(inputs, outputs, name=name.replace(".", "_"))

    return _build(name, build, shape)


def resnet18(input_shape=None, classes=1000):
    """ResNet-18 (He et al. 2016 Table 1): 11,689,512 trainable parameters, 1.8 G multiply-adds."""
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2), input_shape, classes)


def resnet34(input_shape=None, classes=1000):
    """ResNet-34 (He et al. 2016 Table 1): 21,797,672 trainable parameters, 3.6 G multiply-adds."""
    return _resnet("resnet34", _basic_block, (3, 4, 6, 3), input_shape, classes)


def resnet50_v1_5(input_shape=None, classes=1000):
    """ResNet-50 v1.5 (stride on the 3x3 conv, bias-free): 25,557,032 trainable parameters, 4.09 G MACs."""
    return _resnet("resnet50_v1.5", _bottleneck_v1_5, (3, 4, 6, 3), input_shape, classes)


def _keras_resnet(depth):
    def builder(input_shape=None, classes=1000):
        shape = _input_shape(input_shape, DEFAULT_SIZE)
        app = getattr(tf.keras.applications, f"ResNet{depth}")
        return _build(f"resnet{depth}", lambda: app(weights=None, include_top=True, input_shape=shape,
                                                    classes=classes), shape)

    builder.__name__ = f"resnet{depth}"
    builder.__doc__ = f"keras.applications.ResNet{depth} (ResNet v1), weights=None."
    return builder


resnet50, resnet101, resnet152 = _keras_resnet(50), _keras_resnet(101), _keras_resnet(152)


def _vgg_builder(depth):
    def builder(input_shape=None, classes=1000):
        return vgg(depth, input_shape=input_shape, classes=classes)

    builder.__name__ = f"vgg{depth}"
    builder.__doc__ = f"VGG-{depth} (Simonyan & Zisserman 2015), built here with keras.applications' names."
    return builder


MODELS = {
    "alexnet": alexnet,
    "alexnet_grouped": alexnet_grouped,
    **{f"vgg{d}": _vgg_builder(d) for d in (11, 13, 16, 19)},
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "resnet50_v1.5": resnet50_v1_5,
    "resnet101": resnet101,
    "resnet152": resnet152,
}
