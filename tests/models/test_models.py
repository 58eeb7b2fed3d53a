"""labkit.models.get: one registry over the ImageNet and CIFAR-10 model submodules."""
import pytest

import labkit.models as models


def test_registry_has_every_contract_name():
    names = set(models.names())
    required = {"alexnet", "alexnet_grouped", "vgg11", "vgg13", "vgg16", "vgg19", "resnet18", "resnet34",
                "resnet50", "resnet101", "resnet152", "sweep_net", "convblock_net"}
    assert required <= names


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as err:
        models.get("resnet51")
    assert "'resnet51'" in str(err.value) and "resnet50" in str(err.value) and "sweep_net" in str(err.value)


def test_default_classes_follow_the_model():
    assert models.get("sweep_net").output_shape == (None, 10)  # a CIFAR-10 network
    assert models.get("resnet18", input_shape=(32, 32, 3)).output_shape == (None, 1000)  # an ImageNet one
    assert models.get("sweep_net", classes=4).output_shape == (None, 4)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "10"])
def test_bad_classes(bad):
    with pytest.raises(ValueError, match="classes must be an int >= 1"):
        models.get("sweep_net", classes=bad)
