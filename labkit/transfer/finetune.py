"""Transfer learning offline: per-layer learning-rate factors for Keras 2.15, freezing, the MATLAB multi-GPU white
paper's recipe.

The MATLAB multi-GPU white paper keeps all but AlexNet's last three layers, adds a new fully connected layer with
10x weight and 20x bias learning-rate factors, and trains with a lower learning rate for fewer epochs. Keras 2.15 has no
per-layer learning rates; FactorSGD scales each variable's gradient before the update, which for SGD (with
or without momentum) is exactly a per-variable learning rate: every step is linear in the gradient.

Without ImageNet weights the course pretrains its own base in-suite on five classes and transfers it to the
other five; imagenet_base() loads keras.applications weights when they are staged locally. (06_transfer_learning)
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from labkit.base import config
from labkit.base.checks import check_int, check_number

STRATEGIES = ("frozen", "finetune", "scratch")
STRATEGY_LABELS = {"frozen": "(a) frozen base + new head", "finetune": "(b) fine-tune all, head LR x10/x20",
                   "scratch": "(c) from scratch"}
HEAD = "new_fc"
HEAD_LR_FACTORS = {"kernel": 10.0, "bias": 20.0}  # WeightLearnRateFactor, BiasLearnRateFactor


# ----------------------------------------------------------------------------- learning-rate factors
def _all_layers(model):
    """Every layer, nested models flattened (a base model used as a layer contributes its own layers)."""
    for layer in model.layers:
        if isinstance(layer, tf.keras.Model):
            yield from _all_layers(layer)
        else:
            yield layer


def _weight_key(variable) -> str:
    return variable.name.split("/")[-1].split(":")[0]  # "new_fc/kernel:0" -> "kernel"


def _check_factor(where, value) -> float:
    return check_number(value, f"learning-rate factor for {where}", minimum=0)


def variable_factors(model, factors: dict) -> dict:
    """{variable name: factor} for a model from {layer name: factor or {"kernel": f, "bias": f, ...}}.

    Unnamed layers and weights keep factor 1. Unknown layer or weight names raise ValueError listing the
    valid ones, so a typo cannot silently leave a layer at the base learning rate.
    """
    if not isinstance(factors, dict):
        raise ValueError(f"factors must be a dict {{layer name: factor}}; got {factors!r}")
    layers = {layer.name: layer for layer in _all_layers(model)}
    names = [v.name for v in model.trainable_variables]
    out = {}
    for layer_name, spec in factors.items():
        if layer_name not in layers:
            raise ValueError(f"factors names layer {layer_name!r}, which is not in the model; layers: "
                             f"{', '.join(layers)}")
        weights = {_weight_key(v): v for v in layers[layer_name].trainable_weights}
        if isinstance(spec, dict):
            unknown = set(spec) - set(weights)
            if unknown:
                raise ValueError(f"factors for layer {layer_name!r} name weights {sorted(unknown)}; its trainable "
                                 f"weights are {sorted(weights)}")
            for key, value in spec.items():
                out[weights[key].name] = _check_factor(f"{layer_name}/{key}", value)
        else:
            value = _check_factor(layer_name, spec)
            for v in weights.values():
                out[v.name] = value
    for name in out:
        if names.count(name) > 1:
            raise ValueError(f"variable name {name!r} occurs {names.count(name)} times in the model, so a factor "
                             "for it is ambiguous; give the layers unique names")
    return out


class FactorSGD(tf.keras.optimizers.SGD):
    """SGD (momentum, nesterov) with a learning-rate factor per variable: Keras's missing LearnRateFactor.

    lr_factors: {variable name: factor}, e.g. from variable_factors(model, {"new_fc": {"kernel": 10,
    "bias": 20}}); variables not listed use factor 1. Factor 0 leaves a variable exactly where it is.
    The gradient is scaled before the update, so with plain SGD a factor k moves a variable k times as far,
    and with momentum the velocity (a sum of past gradients) is scaled by k too. (06_transfer_learning)
    """

    def __init__(self, lr_factors=None, learning_rate=0.01, momentum=0.0, nesterov=False, name="FactorSGD",
                 **kwargs):
        if kwargs.get("weight_decay"):
            raise ValueError("weight_decay is applied outside the gradient, so it would still move layers with "
                             "factor 0; use L2 regularizers on the layers instead")
        super().__init__(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, name=name, **kwargs)
        self.lr_factors = {str(k): _check_factor(k, v) for k, v in (lr_factors or {}).items()}

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        scaled = []
        for grad, var in grads_and_vars:
            factor = self.lr_factors.get(var.name, 1.0)
            if grad is not None and factor != 1.0:
                if isinstance(grad, tf.IndexedSlices):
                    grad = tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
                else:
                    grad = grad * tf.cast(factor, grad.dtype)
            scaled.append((grad, var))
        return super().apply_gradients(scaled, *args, **kwargs)

    def get_config(self):
        return {**super().get_config(), "lr_factors": dict(self.lr_factors)}


def sgd_with_lr_factors(model, factors: dict, learning_rate=0.01, momentum=0.9, **kwargs) -> FactorSGD:
    """FactorSGD for `model` from per-layer factors: {"new_fc": {"kernel": 10, "bias": 20}} (the MATLAB multi-GPU
    white paper)."""
    return FactorSGD(variable_factors(model, factors), learning_rate=learning_rate, momentum=momentum, **kwargs)


def measure_factors(model, factors: dict, x, y, learning_rate: float = 0.01) -> dict:
    """How far one training step moves each variable with `factors`, relative to plain SGD (ratio per name).

    Two copies of the model take the same step through Keras's own train step, one with stock SGD and one
    with FactorSGD (both without momentum): a correct helper gives exactly the factors back.
    """
    moved = []
    for optimizer_for in (lambda m: tf.keras.optimizers.SGD(learning_rate),
                          lambda m: sgd_with_lr_factors(m, factors, learning_rate=learning_rate, momentum=0.0)):
        m = copy_model(model)
        before = {v.name: v.numpy() for v in m.trainable_variables}
        m.compile(optimizer=optimizer_for(m), loss="sparse_categorical_crossentropy")
        m.train_on_batch(x, y)
        moved.append({v.name: float(np.linalg.norm(v.numpy() - before[v.name])) for v in m.trainable_variables})
    plain, scaled = moved
    return {name: scaled[name] / plain[name] for name in plain if plain[name] > 0}


# ----------------------------------------------------------------------------- freezing and new heads
def freeze(model, keep=()):
    """Make every layer non-trainable except those named in keep; returns the model. Compile afterwards.

    Keras reads `trainable` when the model is compiled, and frozen BatchNormalization layers run in
    inference mode (their moving statistics stay put too).
    """
    keep = [keep] if isinstance(keep, str) else list(keep)
    names = {layer.name for layer in _all_layers(model)}
    unknown = [k for k in keep if k not in names]
    if unknown:
        raise ValueError(f"keep names layers {unknown} that are not in the model; layers: {', '.join(names)}")
    model.trainable = True  # sets every sublayer too, so do it first; containers stay trainable
    for layer in _all_layers(model):
        layer.trainable = layer.name in keep
    return model


def param_counts(model) -> dict:
    """{"trainable": n, "frozen": n} learnable parameters of a model as it is now."""
    from labkit.models.cifar import count_params
    return {"trainable": count_params(model.trainable_weights), "frozen": count_params(model.non_trainable_weights)}


def feature_extractor(model):
    """The model without its classifier: input -> the input of the last Dense layer (the MATLAB multi-GPU white
    paper's 'end-3')."""
    layer = model.layers[-1]
    while isinstance(layer, (tf.keras.layers.Activation, tf.keras.layers.Softmax, tf.keras.layers.Dropout)):
        layer = layer._inbound_nodes[0].inbound_layers
    if not isinstance(layer, tf.keras.layers.Dense):
        raise ValueError(f"model must end in a Dense classifier (optionally + softmax/dropout); its last layer "
                         f"is {layer.name!r} ({type(layer).__name__})")
    return tf.keras.Model(model.inputs, layer.input, name=f"{model.name}_features")


def copy_model(model):
    """An independent copy with the same weights (so one pretrained base serves every experiment)."""
    clone = tf.keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    return clone


def transfer_model(base, classes: int, *, freeze_base: bool = False, head_name: str = HEAD):
    """Copy of `base` without its classifier, plus a new softmax Dense(classes) head named head_name."""
    classes = check_int(classes, "classes", minimum=1)
    features = feature_extractor(copy_model(base))
    x = features.output
    if len(x.shape) > 2:
        x = tf.keras.layers.Flatten(name=f"{head_name}_flatten")(x)
    outputs = tf.keras.layers.Dense(classes, activation="softmax", name=head_name)(x)
    model = tf.keras.Model(features.inputs, outputs, name=f"{base.name}_transfer")
    if freeze_base:
        freeze(model, keep=[head_name])
    return model


# ----------------------------------------------------------------------------- data split
def split_classes(x, y, classes):
    """Images of the given classes, relabelled 0..len(classes)-1 in the order given."""
    classes = list(classes)
    y = np.asarray(y).reshape(-1)
    mask = np.isin(y, classes)
    lookup = {c: i for i, c in enumerate(classes)}
    return x[mask], np.array([lookup[c] for c in y[mask]], dtype=np.int32)


def per_class_subset(x, y, n_per_class: int, seed: int = 0):
    """The first n_per_class images of each class after a fixed shuffle (balanced small target sets)."""
    n_per_class = check_int(n_per_class, "n_per_class", minimum=1)
    order = np.random.default_rng(seed).permutation(len(y))
    picks = np.concatenate([order[y[order] == c][:n_per_class] for c in np.unique(y)])
    picks.sort()
    return x[picks], y[picks]


# ----------------------------------------------------------------------------- training
class _EpochClock(tf.keras.callbacks.Callback):
    """Training seconds per epoch, and test accuracy after each epoch evaluated off the clock."""

    def __init__(self, x_test=None, y_test=None):
        super().__init__()
        self.x_test, self.y_test, self.train_s, self.curve = x_test, y_test, 0.0, []

    def on_epoch_begin(self, epoch, logs=None):
        self._t = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.train_s += time.perf_counter() - self._t
        if self.x_test is not None:
            _, acc = self.model.evaluate(self.x_test, self.y_test, batch_size=500, verbose=0)
            self.curve.append((self.train_s, float(acc)))


def fit(model, optimizer, x, y, x_test, y_test, *, epochs: int, batch_size: int = 100, curve=False, seed=0):
    """Compile, train, evaluate: {"accuracy", "train_time_s", "curve": [(seconds, accuracy) per epoch]}."""
    config.set_seed(seed)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    clock = _EpochClock(x_test, y_test) if curve else _EpochClock()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True, callbacks=[clock])
    accuracy = clock.curve[-1][1] if curve else float(model.evaluate(x_test, y_test, batch_size=500, verbose=0)[1])
    return {"accuracy": accuracy, "train_time_s": clock.train_s, "curve": clock.curve,
            "trainable_params": param_counts(model)["trainable"]}


def pretrain(x, y, *, build=None, epochs: int = 2, lr: float = 0.01, batch_size: int = 100, seed: int = 0):
    """Train the base network on the source classes (what ImageNet pretraining is in the paper).

    build: a function classes -> Keras model; default the MATLAB cloud white paper's network with 32 first-layer
    filters.
    Returns (model, seconds).
    """
    from labkit.models.cifar import sweep_net

    classes = int(np.max(y)) + 1
    config.set_seed(seed)
    model = (build or (lambda c: sweep_net(filters=32, filter_size=5, pool_size=3, classes=c)))(classes)
    model.compile(optimizer=tf.keras.optimizers.SGD(lr, momentum=0.9), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
    return model, time.perf_counter() - start


def make_strategy(strategy: str, base, classes: int, *, lr: float = 0.01, transfer_lr_drop: float = 10.0,
                  head_factors=None, momentum: float = 0.9, seed: int = 0):
    """(model, optimizer) for one of STRATEGIES, following the MATLAB multi-GPU white paper's recipe.

    frozen:   base frozen, new head trained at lr / transfer_lr_drop x head_factors (10x weights, 20x biases)
    finetune: everything trainable at lr / transfer_lr_drop, the new head at head_factors times that
    scratch:  the same architecture, fresh random weights, everything at lr
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    check_number(lr, "lr", above=0), check_number(transfer_lr_drop, "transfer_lr_drop", above=0)
    if head_factors is not None and not isinstance(head_factors, dict):
        raise ValueError(f"head_factors must be a dict {{'kernel': f, 'bias': f}}; got {head_factors!r}")
    head_factors = dict(HEAD_LR_FACTORS if head_factors is None else head_factors)
    for key, value in head_factors.items():
        _check_factor(f"{HEAD}/{key}", value)
    config.set_seed(seed)
    if strategy == "scratch":
        # the transfer network's architecture with fresh random weights (clone_model re-initialises)
        model = tf.keras.models.clone_model(transfer_model(base, classes))
        return model, tf.keras.optimizers.SGD(lr, momentum=momentum)
    model = transfer_model(base, classes, freeze_base=strategy == "frozen")
    optimizer = sgd_with_lr_factors(model, {HEAD: head_factors}, learning_rate=lr / transfer_lr_drop,
                                    momentum=momentum)
    return model, optimizer


def compare_strategies(base, x, y, x_test, y_test, *, sizes, strategies=STRATEGIES, epochs: int = 3,
                       lr: float = 0.01, batch_size: int = 50, curve_size=None, seed: int = 0, progress=True):
    """Train every strategy on n_per_class target images for each n in sizes; a DataFrame, one row per run.

    Columns: strategy, n_per_class, n_train, accuracy, train_time_s, trainable_params, curve (for
    n_per_class == curve_size: test accuracy after each epoch against cumulative training seconds).
    """
    import pandas as pd

    classes = int(np.max(y)) + 1
    rows = []
    runs = [(n, s) for n in sizes for s in strategies]
    bar = None
    if progress:
        from labkit.base import progress as progress_bars

        bar = progress_bars.bar(len(runs), "transfer runs", "run")
    for n, strategy in runs:
        xs, ys = per_class_subset(x, y, n, seed=seed)
        model, optimizer = make_strategy(strategy, base, classes, lr=lr, seed=seed)
        result = fit(model, optimizer, xs, ys, x_test, y_test, epochs=epochs, batch_size=batch_size,
                     curve=n == curve_size, seed=seed)
        rows.append({"strategy": strategy, "n_per_class": n, "n_train": len(ys), **result})
        if bar is not None:
            bar.set_postfix_str(f"{strategy} n={n}: {result['accuracy']:.2f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- plots
def plot_accuracy_vs_data(df, ax=None):
    """Test accuracy vs target images per class, one line per strategy (06_transfer_learning)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5.5, 4))[1]
    for strategy, group in df.groupby("strategy", sort=False):
        ax.plot(group.n_per_class, 100 * group.accuracy, "o-", label=STRATEGY_LABELS.get(strategy, strategy))
    ax.set_xscale("log")
    ax.set_xlabel("target training images per class")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=8)
    return ax


def plot_accuracy_vs_time(df, ax=None):
    """Test accuracy after each epoch against cumulative training seconds (06_transfer_learning)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(5.5, 4))[1]
    for _, row in df[df.curve.map(len) > 0].iterrows():
        t, a = zip(*row.curve)
        ax.plot(t, 100 * np.array(a), "o-", label=STRATEGY_LABELS.get(row.strategy, row.strategy))
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=8, loc="best")
    return ax


# ----------------------------------------------------------------------------- real ImageNet weights
# keras.applications name and the weights file it downloads (include_top=False) into ~/.keras/models
IMAGENET_WEIGHTS = {
    "resnet50": ("ResNet50", "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"),
    "vgg16": ("VGG16", "vgg16_weights_tf_dim_ordering_tf_kernels_notop.h5"),
    "mobilenet_v2": ("MobileNetV2", "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5"),
}


def _weights_dirs(weights_dir=None) -> list[Path]:
    dirs = [Path(weights_dir).expanduser()] if weights_dir is not None else []
    dirs.append(config.data_dir() / "models")
    dirs.append(Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")).expanduser() / "models")
    return dirs


def imagenet_weights_path(name: str, weights_dir=None) -> Path | None:
    """The locally staged ImageNet weights file for a keras.applications base, or None."""
    if name not in IMAGENET_WEIGHTS:
        raise ValueError(f"name must be one of {', '.join(IMAGENET_WEIGHTS)}; got {name!r}")
    for d in _weights_dirs(weights_dir):
        path = d / IMAGENET_WEIGHTS[name][1]
        if path.is_file():
            return path
    return None


def prestage_hint(name: str) -> str:
    """How to put ImageNet weights where imagenet_base() finds them, for machines without internet."""
    app, fname = IMAGENET_WEIGHTS[name]
    return (f"On a machine with internet run\n"
            f"  python -c \"import tensorflow as tf; tf.keras.applications.{app}(weights='imagenet', "
            f"include_top=False)\"\n"
            f"which saves ~/.keras/models/{fname}; copy that file to ~/.keras/models/ or "
            f"$LABKIT_DATA/models/ on the offline machine.")


def imagenet_base(name: str = "resnet50", input_shape=(224, 224, 3), weights_dir=None, pooling="avg"):
    """A keras.applications base (include_top=False) with ImageNet weights loaded from a local file.

    Never downloads: if the file is not staged, FileNotFoundError says how to stage it. Put a new head
    on it with transfer_model-style code, or pass it to freeze(). (06_transfer_learning)
    """
    path = imagenet_weights_path(name, weights_dir)
    if path is None:
        looked = ", ".join(str(d) for d in _weights_dirs(weights_dir))
        raise FileNotFoundError(f"ImageNet weights for {name} not found (looked in {looked}). "
                                + prestage_hint(name))
    app = getattr(tf.keras.applications, IMAGENET_WEIGHTS[name][0])
    return app(weights=str(path), include_top=False, input_shape=tuple(input_shape), pooling=pooling)
