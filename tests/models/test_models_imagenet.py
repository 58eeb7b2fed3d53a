"""labkit.models.imagenet: parameter counts typed from the papers, torchvision and Keras documentation."""
from __future__ import annotations

import pytest

import labkit  # noqa: F401
import labkit.models
from labkit.flops import counter as flops

# torchvision's model documentation (trainable parameters; Keras also counts BN's moving mean/variance)
TORCHVISION_PARAMS = {
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg13": 133_047_848,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50_v1.5": 25_557_032,  # torchvision's resnet50 is v1.5
}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_trainable_params_match_torchvision(name):
    assert flops.count_named(name).trainable_params == TORCHVISION_PARAMS[name]


def test_keras_resnet50_params_match_keras_applications():
    # keras.applications documentation / ResNet50().count_params(): 25,636,712 (with BN moving statistics)
    assert flops.count_named("resnet50").params == 25_636_712


@pytest.mark.slow
@pytest.mark.parametrize("name,millions", [("resnet101", 44.7), ("resnet152", 60.4)])
def test_keras_deep_resnets_params_match_keras_table(name, millions):
    # the keras.applications table prints millions with one decimal
    assert round(flops.count_named(name).params / 1e6, 1) == millions


def test_alexnet_grouped_params_by_hand_from_the_paper():
    # Krizhevsky et al. 2012, Figure 2: conv2/4/5 see half of the previous layer's channels
    conv = [(11, 3, 96), (5, 48, 256), (3, 256, 384), (3, 192, 384), (3, 192, 256)]
    fc = [(6 * 6 * 256, 4096), (4096, 4096), (4096, 1000)]
    expected = sum(k * k * c_in * c_out + c_out for k, c_in, c_out in conv) + sum(i * o + o for i, o in fc)
    report = flops.count_named("alexnet_grouped")
    assert report.params == expected
    assert abs(report.params - 61e6) / 61e6 < 0.01  # "about 61 M" (the lecture: "60 M weights")


def test_alexnet_grouped_shapes_follow_the_paper():
    rows = {r.name: r for r in flops.count_named("alexnet_grouped").rows}
    assert rows["input"].output_shape == (227, 227, 3)
    assert rows["conv1"].output_shape == (55, 55, 96)  # the paper's 55x55x96 first layer
    assert rows["pool2"].output_shape == (13, 13, 256)
    assert rows["pool5"].output_shape == (6, 6, 256)
    assert rows["norm1"].kind == "norm"


def test_alexnet_grouped_groups_are_on_conv2_4_5():
    model = labkit.models.get("alexnet_grouped", input_shape=(67, 67, 3), classes=10)
    groups = {layer.name: layer.groups for layer in model.layers if layer.name.startswith("conv")}
    assert groups == {"conv1": 1, "conv2": 2, "conv3": 1, "conv4": 2, "conv5": 2}
    assert model.output_shape == (None, 10)


def test_without_removes_layers_and_their_parameters():
    full = flops.count_named("alexnet_grouped")
    from labkit.models import imagenet

    model = imagenet.alexnet_grouped(without=("fc6", "fc7"))
    names = {layer.name for layer in model.layers}
    assert "fc6" not in names and "fc7" not in names
    # fc8 now reads the 9216 pooled features directly
    expected = full.params - (9216 * 4096 + 4096) - (4096 * 4096 + 4096) - (4096 * 1000 + 1000) + 9216 * 1000 + 1000
    assert model.count_params() == expected


def test_classes_and_input_shape_are_used():
    model = labkit.models.get("resnet18", input_shape=(64, 48, 3), classes=7)
    assert model.input_shape == (None, 64, 48, 3)
    assert model.output_shape == (None, 7)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="vgg16") as info:
        labkit.models.get("vgg17")
    assert "resnet152" in str(info.value) and "alexnet_grouped" in str(info.value)


@pytest.mark.parametrize("shape", [(224, 224), (224, 224, 0), "224", (224.0, 224, 3)])
def test_bad_input_shape_names_the_parameter(shape):
    with pytest.raises(ValueError, match="input_shape"):
        labkit.models.get("vgg11", input_shape=shape)


def test_too_small_input_names_the_parameter():
    with pytest.raises(ValueError, match="input_shape"):
        labkit.models.get("alexnet", input_shape=(16, 16, 3))


def test_without_rejects_unknown_layers():
    from labkit.models import imagenet

    with pytest.raises(ValueError, match="without"):
        imagenet.alexnet(without=("conv1",))


def test_alexnet_lrn_is_the_papers_formula_by_tensorflow():
    # one LRN layer in labkit (cifar.CrossChannelNormalization, MATLAB's alpha / window convention);
    # AlexNet's norm layers must compute Krizhevsky 2012's n=5, k=2, alpha=1e-4, beta=0.75, and
    # tf.nn.local_response_normalization (alpha not divided by n) is the oracle
    import numpy as np
    import tensorflow as tf

    from labkit.models import cifar
    model = labkit.models.get("alexnet_grouped")  # the 2012 paper's network, with its two norm layers
    x = tf.constant(np.random.default_rng(0).normal(0, 30, size=(2, 5, 5, 12)).astype("float32"))
    want = tf.nn.local_response_normalization(x, depth_radius=2, bias=2.0, alpha=1e-4, beta=0.75).numpy()
    for name in ("norm1", "norm2"):
        layer = model.get_layer(name)
        assert isinstance(layer, cifar.CrossChannelNormalization)
        np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-5)
