"""Per-layer parameters, MACs, FLOPs and activation memory of any built Keras model (03_flops).

Conventions (the papers'; every number is per image, i.e. batch size 1):
  MAC    one multiply-add. Only convolutions and dense layers have MACs:
           Conv (1D/2D/3D)   output elements x kernel area x input channels / groups
           DepthwiseConv2D   output elements x kernel area
           SeparableConv     its depthwise part + its 1x1 pointwise part
           ConvTranspose     input elements x kernel area x filters
           Dense             output elements x input features
  FLOP   a floating-point operation: FLOPs = 2 x MACs for convolutions and dense layers ("FLOPs" in He et
         al. 2016 and the lecture are multiply-adds, hence the 2x disagreements 03_flops explains).
  Off by default, each switched on by an option, the costs the papers leave out (the TF profiler's rules
  where it has one, so tests can check them):
    count_bias         1 FLOP per output element of a layer with a bias (TF: BiasAdd)
    count_bn           normalisation: BatchNormalization 2 per element (inference: scale and shift),
                       local response / cross-channel normalisation 2n+3 per element (n = window),
                       LayerNormalization 7
    count_activations  1 per element (ReLU, sigmoid, tanh, ...), softmax 5 per element (TF: Softmax);
                       includes activations fused into Conv/Dense (activation="relu")
    count_pooling      window size per output element (TF: MaxPool/AvgPool); global pooling 1 per input
                       element (TF: Mean)
    count_elementwise  Add/Subtract/Multiply/...: 1 per output element per extra input (TF: AddV2);
                       Average adds a divide; Rescaling/Normalization 2 per element
  Free (0 FLOPs, known): Input, Flatten, Reshape, Permute, Dropout and noise layers, ZeroPadding,
  Cropping, Concatenate. A layer type not listed here is reported in `report.unknown`, warned about
  (UnknownLayerWarning), and makes `report.complete` False: it is never silently counted as zero.
  params       every weight, trainable or not (as model.count_params(); Keras BN keeps 4 per channel,
               PyTorch counts 2, so `trainable_params` is the number torchvision tables quote)
  activations  output elements of a layer (per image); activation memory uses 4 bytes each.
Nested models are counted layer by layer, rows named "outer/inner".

Memory (float32, 4 bytes per value, as the MATLAB paper's footprint): `report.param_bytes`; activation
memory per image `report.activation_bytes(training)`, where training keeps every layer's output for the
backward pass (views such as Flatten excluded) and inference needs the largest input + output pair of one
layer; `training_state_bytes` adds gradients and optimizer slots; `max_batch_size` divides what is left of
a GPU's memory by the activations per image. Training FLOPs ~ 3 x forward (`training_flops`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import warnings
from dataclasses import asdict, dataclass, field

from labkit.base.checks import check_int, check_number

BYTES_PER_VALUE = 4  # float32, as the MATLAB paper's memory footprint
_OPTIONS = ("count_bias", "count_bn", "count_activations", "count_pooling", "count_elementwise")
ALL_COSTS = {option: True for option in _OPTIONS}  # count(model, **ALL_COSTS): every rule on


class UnknownLayerWarning(UserWarning):
    """A layer type labkit.flops has no rule for: its FLOPs are missing from the totals."""


@dataclass(frozen=True)
class LayerCount:
    """One row of a report: a layer applied once (a shared layer gets a row per call)."""

    name: str
    type: str
    kind: str  # conv, dense, norm, activation, pool, elementwise, free, unknown
    output_shape: tuple
    params: int
    macs: int
    flops: int
    activations: int  # output elements
    inputs: int  # input elements (for memory traffic in the roofline)


@dataclass
class FlopsReport:
    """Per-layer rows and totals for one model; see the module docstring for conventions."""

    model: str
    input_shape: tuple
    rows: list
    trainable_params: int
    options: dict = field(default_factory=dict)
    unknown: list = field(default_factory=list)  # (name, type) of layers without a rule

    @property
    def params(self) -> int:
        return sum(r.params for r in self.rows)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.rows)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def activations(self) -> int:
        return sum(r.activations for r in self.rows)

    @property
    def complete(self) -> bool:
        return not self.unknown

    @property
    def param_bytes(self) -> int:
        """Memory of all weights at 4 bytes each (the MATLAB paper's memory footprint)."""
        return BYTES_PER_VALUE * self.params

    def activation_bytes(self, training: bool = False) -> int:
        """Activation memory per image: training keeps every layer's output for the backward pass;
        inference needs only the largest input+output pair of one layer (perfect buffer reuse)."""
        if training:
            kept = sum(r.activations for r in self.rows if r.kind != "free" or r.type == "Dropout")
            return BYTES_PER_VALUE * (_prod(self.input_shape) + kept)
        return BYTES_PER_VALUE * max((r.inputs + r.activations for r in self.rows), default=0)

    def by_kind(self):
        """DataFrame of params, MACs, FLOPs and activations summed per kind (conv, dense, ...)."""
        df = self.to_dataframe()
        return df.groupby("kind")[["params", "macs", "flops", "activations"]].sum()

    def to_dataframe(self):
        """One row per layer: name, type, kind, output_shape, params, macs, flops, activations, inputs."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows],
                            columns=[f for f in LayerCount.__dataclass_fields__])

    def to_dict(self) -> dict:
        """JSON-ready: model, params, macs, flops, layers (the `labkit flops --json` contract) and more."""
        return {
            "model": self.model, "params": self.params, "macs": self.macs, "flops": self.flops,
            "trainable_params": self.trainable_params, "activations": self.activations,
            "input_shape": list(self.input_shape), "options": dict(self.options),
            "unknown_layers": [list(u) for u in self.unknown],
            "layers": [{**asdict(r), "output_shape": list(r.output_shape)} for r in self.rows],
        }

    def __str__(self) -> str:
        text = (f"{self.model} {self.input_shape}: {self.params:,} params ({self.param_bytes / 1e6:,.1f} MB), "
                f"{self.macs / 1e9:.2f} G MACs, {self.flops / 1e9:.2f} GFLOPs per image")
        if self.unknown:
            text += f"; INCOMPLETE, no rule for {', '.join(f'{n} ({t})' for n, t in self.unknown)}"
        return text


def _prod(shape) -> int:
    return int(math.prod(int(d) for d in shape))


# ---------------------------------------------------------------- per-layer rules
# Each rule gets (layer, input shapes, output shapes, options) without the batch axis and returns
# (kind, macs, extra_flops) where extra_flops are the optional costs already filtered by the options.

def _activation_flops(name: str, elements: int) -> int:
    if name in (None, "linear"):
        return 0
    return 5 * elements if name == "softmax" else elements


def _fused_extras(layer, out_elems, opts):
    extra = out_elems if (opts["count_bias"] and getattr(layer, "use_bias", False)) else 0
    if opts["count_activations"]:
        extra += _activation_flops(getattr(getattr(layer, "activation", None), "__name__", None), out_elems)
    return extra


def _channels(shape, layer):
    return shape[0] if getattr(layer, "data_format", "channels_last") == "channels_first" else shape[-1]


def _conv(layer, ins, outs, opts):
    out = _prod(outs[0])
    macs = out * _prod(layer.kernel_size) * (_channels(ins[0], layer) // layer.groups)
    return "conv", macs, _fused_extras(layer, out, opts)


def _conv_transpose(layer, ins, outs, opts):
    macs = _prod(ins[0]) * _prod(layer.kernel_size) * layer.filters
    return "conv", macs, _fused_extras(layer, _prod(outs[0]), opts)


def _depthwise(layer, ins, outs, opts):
    out = _prod(outs[0])
    return "conv", out * _prod(layer.kernel_size), _fused_extras(layer, out, opts)


def _separable(layer, ins, outs, opts):
    out_shape = outs[0]
    channels_first = getattr(layer, "data_format", "channels_last") == "channels_first"
    spatial = _prod(out_shape[1:] if channels_first else out_shape[:-1])
    mid = _channels(ins[0], layer) * layer.depth_multiplier
    macs = spatial * mid * _prod(layer.kernel_size) + spatial * mid * layer.filters
    return "conv", macs, _fused_extras(layer, _prod(out_shape), opts)


def _dense(layer, ins, outs, opts):
    out = _prod(outs[0])
    return "dense", out * ins[0][-1], _fused_extras(layer, out, opts)


def _norm(per_element):
    def rule(layer, ins, outs, opts):
        n = per_element(layer) if callable(per_element) else per_element
        return "norm", 0, n * _prod(outs[0]) if opts["count_bn"] else 0
    return rule


def _lrn_per_element(layer):
    # a square and an add per channel in the window, then add bias, power and divide
    window = getattr(layer, "window", None) or 2 * layer.depth_radius + 1
    return 2 * window + 3


def _activation(layer, ins, outs, opts):
    if not opts["count_activations"]:
        return "activation", 0, 0
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    if type(layer).__name__ == "Softmax":
        name = "softmax"
    return "activation", 0, _activation_flops(name or type(layer).__name__.lower(), _prod(outs[0]))


def _pool(layer, ins, outs, opts):
    return "pool", 0, _prod(outs[0]) * _prod(layer.pool_size) if opts["count_pooling"] else 0


def _global_pool(layer, ins, outs, opts):
    return "pool", 0, _prod(ins[0]) if opts["count_pooling"] else 0


def _merge(layer, ins, outs, opts):
    if not opts["count_elementwise"]:
        return "elementwise", 0, 0
    out = _prod(outs[0])
    return "elementwise", 0, (len(ins) - 1) * out + (out if type(layer).__name__ == "Average" else 0)


def _scale_shift(layer, ins, outs, opts):
    return "elementwise", 0, 2 * _prod(outs[0]) if opts["count_elementwise"] else 0


def _free(layer, ins, outs, opts):
    return "free", 0, 0


_RULES = {
    "Conv1DTranspose": _conv_transpose, "Conv2DTranspose": _conv_transpose, "Conv3DTranspose": _conv_transpose,
    "DepthwiseConv1D": _depthwise, "DepthwiseConv2D": _depthwise,
    "SeparableConv1D": _separable, "SeparableConv2D": _separable,
    "Conv1D": _conv, "Conv2D": _conv, "Conv3D": _conv,
    "Dense": _dense,
    "BatchNormalization": _norm(2), "LayerNormalization": _norm(7),
    "LocalResponseNormalization": _norm(_lrn_per_element), "CrossChannelNormalization": _norm(_lrn_per_element),
    "Activation": _activation, "ReLU": _activation, "LeakyReLU": _activation, "PReLU": _activation,
    "ELU": _activation, "Softmax": _activation, "ThresholdedReLU": _activation,
    "MaxPooling1D": _pool, "MaxPooling2D": _pool, "MaxPooling3D": _pool,
    "AveragePooling1D": _pool, "AveragePooling2D": _pool, "AveragePooling3D": _pool,
    "GlobalAveragePooling1D": _global_pool, "GlobalAveragePooling2D": _global_pool,
    "GlobalAveragePooling3D": _global_pool, "GlobalMaxPooling1D": _global_pool,
    "GlobalMaxPooling2D": _global_pool, "GlobalMaxPooling3D": _global_pool,
    "Add": _merge, "Subtract": _merge, "Multiply": _merge, "Average": _merge, "Maximum": _merge,
    "Minimum": _merge, "Rescaling": _scale_shift, "Normalization": _scale_shift,
    **{name: _free for name in (
        "InputLayer", "Flatten", "Reshape", "Permute", "Dropout", "SpatialDropout1D", "SpatialDropout2D",
        "SpatialDropout3D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization",
        "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D", "Cropping1D", "Cropping2D", "Cropping3D",
        "Concatenate")},
}


def _rule_for(layer):
    """The rule of the layer's class or its nearest Keras ancestor (a subclass of Conv2D is a Conv2D)."""
    for cls in type(layer).__mro__:
        if cls.__name__ in _RULES:
            return _RULES[cls.__name__]
    return None


def _is_model(obj) -> bool:
    import tensorflow as tf

    return isinstance(obj, tf.keras.Model)


def _shapes(tensors):
    import tensorflow as tf

    return [tuple(t.shape[1:]) for t in tf.nest.flatten(tensors)]


def _count_into(model, prefix, rows, unknown, seen_params, opts):
    if not hasattr(model, "_network_nodes"):
        raise ValueError(f"model {model.name!r} is a subclassed Keras model; count() needs a functional or "
                         "Sequential model whose layers' shapes are known (build it from keras.Input)")
    for layer in model.layers:
        nodes = [node for i, node in enumerate(layer._inbound_nodes)
                 if f"{layer.name}_ib-{i}" in model._network_nodes]
        if _is_model(layer):  # a nested model: its own layers, once per call in this model
            for _ in nodes:
                _count_into(layer, f"{prefix}{layer.name}/", rows, unknown, seen_params, opts)
            continue
        for node in nodes:
            ins, outs = _shapes(node.keras_inputs), _shapes(node.outputs)
            if any(d is None for s in ins + outs for d in s):
                raise ValueError(f"layer {prefix}{layer.name} has an undefined size {ins} -> {outs}; build the "
                                 "model with a fixed input_shape (height, width, channels) to count it")
            params = 0 if id(layer) in seen_params else layer.count_params()
            seen_params.add(id(layer))
            rule = _rule_for(layer)
            if rule is None:
                kind, macs, extra = "unknown", 0, 0
                unknown.append((prefix + layer.name, type(layer).__name__))
            else:
                kind, macs, extra = rule(layer, ins, outs, opts)
            rows.append(LayerCount(
                name=prefix + layer.name, type=type(layer).__name__, kind=kind,
                output_shape=outs[0] if len(outs) == 1 else tuple(outs), params=int(params),
                macs=int(macs), flops=int(2 * macs + extra), activations=sum(_prod(s) for s in outs),
                inputs=sum(_prod(s) for s in ins)))


def count(model, *, count_bias=False, count_bn=False, count_activations=False, count_pooling=False,
          count_elementwise=False) -> FlopsReport:
    """Count params, MACs, FLOPs and output elements of every layer of a built Keras model, per image.

    Only conv and dense work is counted by default (FLOPs = 2 x MACs); the count_* options add the
    other costs with the rules in this module's docstring. Unknown layer types are listed in
    `report.unknown` and warned about. Introduced in 03_flops.
    """
    if not _is_model(model):
        raise TypeError(f"model must be a built tf.keras Model; got {type(model).__name__}")
    import tensorflow as tf

    if not model.built or not model.inputs:
        if not isinstance(model, tf.keras.Sequential) and not hasattr(model, "_network_nodes"):
            raise ValueError(f"model {model.name!r} is a subclassed Keras model; count() needs a functional or "
                             "Sequential model built from keras.Input(shape)")
        raise ValueError(f"model {model.name!r} is not built: build it from keras.Input(shape) first")
    opts = dict(count_bias=bool(count_bias), count_bn=bool(count_bn), count_activations=bool(count_activations),
                count_pooling=bool(count_pooling), count_elementwise=bool(count_elementwise))
    rows, unknown = [], []
    _count_into(model, "", rows, unknown, set(), opts)
    input_shape = _shapes(model.inputs)[0]
    trainable = sum(_prod(w.shape) for w in model.trainable_weights)
    report = FlopsReport(model=model.name, input_shape=input_shape, rows=rows, trainable_params=int(trainable),
                         options=opts, unknown=unknown)
    if unknown:
        listed = ", ".join(f"{n} ({t})" for n, t in unknown)
        warnings.warn(f"labkit.flops.count: no FLOP rule for {len(unknown)} layer(s): {listed}; their FLOPs are "
                      "missing from the totals (report.unknown lists them)", UnknownLayerWarning, stacklevel=2)
    return report


@contextlib.contextmanager
def shapes_only():
    """Build Keras models in a throwaway TF1-style graph in inference phase: shapes without weight values.

    Counting needs only shapes; VGG-16's 138 M weights would otherwise be allocated and initialised
    (seconds and half a GB each). The models built inside cannot be run; count() them in the block.
    """
    import tensorflow as tf

    with tf.Graph().as_default():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # learning_phase_scope is deprecated, and the only way to say it
            scope = tf.keras.backend.learning_phase_scope(0)
            scope.__enter__()
        try:
            yield
        finally:
            scope.__exit__(None, None, None)


_NAMED_CACHE: dict = {}
_SHAPE_MODELS: dict = {}  # (name, input_size, classes) -> a weightless model from shapes_only()


def count_named(name: str, input_size: int | None = None, classes: int = 1000, **options) -> FlopsReport:
    """Build labkit.models.get(name, classes=classes) at input_size x input_size (None: its default), count it.

    Models are built with shapes_only() and kept (they hold no weight values), so counting the same
    network with other options is instant; reports are cached too.
    """
    from labkit import models

    if input_size is not None:
        input_size = check_int(input_size, "input_size", minimum=1)
    bad = sorted(set(options) - set(_OPTIONS))
    if bad:
        raise TypeError(f"count_named got unknown options {bad}; valid: {', '.join(_OPTIONS)}")
    key = (name, input_size, classes, tuple(bool(options.get(o, False)) for o in _OPTIONS))
    if key not in _NAMED_CACHE:
        if key[:3] not in _SHAPE_MODELS:
            shape = None if input_size is None else (input_size, input_size, 3)
            with shapes_only():
                _SHAPE_MODELS[key[:3]] = models.get(name, input_shape=shape, classes=classes)
        _NAMED_CACHE[key] = count(_SHAPE_MODELS[key[:3]], **options)
    return _NAMED_CACHE[key]


# ---------------------------------------------------------------- memory
def training_state_bytes(report: FlopsReport, optimizer_slots: int = 1) -> int:
    """Weights + gradients + optimizer slots (SGD momentum 1, Adam 2) at 4 bytes per value."""
    optimizer_slots = check_int(optimizer_slots, "optimizer_slots", minimum=0)
    return report.param_bytes + BYTES_PER_VALUE * report.trainable_params * (1 + optimizer_slots)


def max_batch_size(report: FlopsReport, memory_bytes: float, *, training: bool = True,
                   optimizer_slots: int = 1, reserve_bytes: float = 0) -> int:
    """Largest batch whose weights (+ gradients and optimizer slots when training) and activations fit.

    A model-only estimate: framework workspace and fragmentation are what reserve_bytes is for.
    Returns 0 when not even the weights fit.
    """
    check_number(memory_bytes, "memory_bytes", above=0)
    check_number(reserve_bytes, "reserve_bytes", minimum=0)
    fixed = training_state_bytes(report, optimizer_slots) if training else report.param_bytes
    per_image = report.activation_bytes(training=training)
    free = memory_bytes - reserve_bytes - fixed
    return max(0, int(free // per_image)) if per_image else 0


def memory_table(report: FlopsReport, optimizer_slots: int = 1) -> dict:
    """Parameter memory, training state, activation memory per image (inference and training), in bytes."""
    return {
        "param_bytes": report.param_bytes,
        "training_state_bytes": training_state_bytes(report, optimizer_slots),
        "inference_activation_bytes_per_image": report.activation_bytes(training=False),
        "training_activation_bytes_per_image": report.activation_bytes(training=True),
    }


def training_flops(report: FlopsReport, images: int, epochs: int = 1) -> float:
    """FLOPs of training: forward + backward ~ 3 x forward (backward computes gradients for both inputs
    and weights, each as costly as the forward pass), per image, times images x epochs."""
    check_number(images, "images", above=0), check_number(epochs, "epochs", above=0)
    return 3.0 * report.flops * images * epochs


# ---------------------------------------------------------------- CLI
def cli_main(argv: list[str]) -> int:
    """`labkit flops NAME [--input-size N] [--json]`."""
    parser = argparse.ArgumentParser(  # --help must answer without TensorFlow: no model list here
        prog="labkit flops",
        description="Per-layer params, MACs and FLOPs (= 2 x MACs, conv and dense only) of a named model, "
                    "per image. An unknown NAME lists the models.")
    parser.add_argument("name", help="model name, e.g. vgg16, resnet50, alexnet_grouped")
    parser.add_argument("--input-size", type=int, default=None, metavar="N",
                        help="square input N x N x 3 (default: the model's own, 224 or 227)")
    parser.add_argument("--classes", type=int, default=1000, metavar="K",
                        help="output classes (default 1000, ImageNet; the CIFAR-10 models want 10)")
    parser.add_argument("--json", action="store_true",
                        help='print {"model", "params", "macs", "flops", "layers": [...]} as JSON')
    for option in _OPTIONS:
        parser.add_argument("--" + option.replace("_", "-"), action="store_true",
                            help=f"also count {option[6:]} FLOPs (off by default, as the papers)")
    args = parser.parse_args(argv)
    if args.input_size is not None and args.input_size < 1:
        parser.error(f"--input-size must be a positive int; got {args.input_size}")
    if args.classes < 1:
        parser.error(f"--classes must be a positive int; got {args.classes}")
    from labkit import models

    if args.name not in models.names():
        parser.error(f"unknown model {args.name!r}; choose from: {', '.join(models.names())}")
    import labkit

    labkit.quiet()
    try:
        report = count_named(args.name, args.input_size, args.classes, **{o: getattr(args, o) for o in _OPTIONS})
    except ValueError as err:
        print(f"labkit flops: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    import pandas as pd

    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(report.to_dataframe().drop(columns=["inputs"]).to_string(index=False))
    print(report)
    return 0
