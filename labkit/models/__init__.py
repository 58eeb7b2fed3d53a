"""Model zoo: every network the course builds, by name (03_flops, 01_cnn_basics).

`get(name, input_shape=None, classes=1000)` builds a Keras model with weights=None. The builders live in
submodules that each register theirs in a dict called MODELS:
  labkit.models.imagenet - AlexNet (2012 grouped and single-tower), VGG-11..19, ResNet-18..152, resnet50_v1.5
  labkit.models.cifar    - the MATLAB cloud white paper's sweep family and MATLAB's cloud-training example's
                           conv-block network
  labkit.models.recipes  - how the sources trained those two networks (their training options), by profile
"""
from __future__ import annotations

import importlib

from labkit.base.checks import check_int

__all__ = ["get", "names", "registry"]

_SUBMODULES = ("labkit.models.imagenet", "labkit.models.cifar")


def registry() -> dict:
    """name -> builder(input_shape=None, classes=...) over every submodule present."""
    models = {}
    for module_name in _SUBMODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:  # a real missing dependency inside the module: say so
                raise
            continue
        models.update(module.MODELS)
    return models


def names() -> list[str]:
    """Every model name get() accepts, sorted."""
    return sorted(registry())


def get(name: str, input_shape=None, classes: int | None = None, **kwargs):
    """Build the named model (weights=None). Unknown names raise ValueError listing the valid ones.

    classes=None keeps the model's own default: 1000 for the ImageNet networks, 10 for the CIFAR-10 ones.
    """
    models = registry()
    if not isinstance(name, str) or name not in models:
        raise ValueError(f"model name must be one of {', '.join(sorted(models))}; got {name!r}")
    if classes is None:
        return models[name](input_shape=input_shape, **kwargs)
    check_int(classes, "classes", minimum=1)
    return models[name](input_shape=input_shape, classes=classes, **kwargs)
