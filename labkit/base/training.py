"""Training as the seeds do it: SGD with momentum, piecewise LR, L2; a live progress plot; resume; evaluation.

MATLAB's trainingOptions('sgdm', ...) in Keras terms:
  InitialLearnRate lr, Momentum 0.9          -> tf.keras.optimizers.SGD(lr, momentum=0.9)
  LearnRateSchedule 'piecewise', DropFactor f, DropPeriod p -> PiecewiseLR: lr * f ** floor(epoch / p)
  L2Regularization l2                        -> loss + l2/2 * sum(w**2) over conv/dense kernels (MATLAB's
                                                convention; biases are not decayed, as MATLAB's BiasL2Factor 0)
  Plots 'training-progress'                  -> LiveProgress
A run killed mid-way (a lease expiring, as Das's Chameleon slides warn) resumes from its last finished epoch:
fit(..., backup_dir=D). Each network's options as its source trained it: labkit.models.recipes.
(01_cnn_basics)
"""
from __future__ import annotations

import io
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from labkit.base.checks import check_int, check_number
from labkit.base.progress import in_jupyter


def scaled_lr(base_lr: float, batch_size: int, base_batch_size: int = 256) -> float:
    """Linear scaling rule (Goyal et al.; MATLAB's cloud-training example's LR 0.1 x batch/256): LR grows with the
    batch size."""
    check_int(batch_size, "batch_size", minimum=1)
    check_int(base_batch_size, "base_batch_size", minimum=1)
    return base_lr * batch_size / base_batch_size


def warmup_lr(step, lr: float, scale: float = 1.0, warmup_steps: int = 0):
    """Goyal et al. 2017: the LR ramps linearly from lr to lr x scale over warmup_steps, then stays there.

    warmup_steps=0: lr x scale from the first step. `step`: a number or a tensor (an optimizer's iteration
    counter). The one warmup schedule (hvd_train, large_batch, WarmupLR). (04_horovod_scaling)"""
    check_number(lr, "lr", above=0)
    check_number(scale, "scale", minimum=1)  # the number of workers, or the batch multiple
    check_int(warmup_steps, "warmup_steps", minimum=0)
    if warmup_steps == 0:
        return lr * scale
    frac = min(1.0, float(step) / warmup_steps) if isinstance(step, (int, float, np.number)) else \
        tf.minimum(1.0, tf.cast(step, tf.float32) / float(warmup_steps))  # a tensor
    return lr * (1.0 + (scale - 1.0) * frac)


@tf.keras.utils.register_keras_serializable(package="labkit")
class WarmupLR(tf.keras.optimizers.schedules.LearningRateSchedule):
    """warmup_lr as a Keras schedule (the optimizer's step counter drives it). (04_horovod_scaling)"""

    def __init__(self, lr, scale=1.0, warmup_steps=0):
        warmup_lr(0, lr, scale, warmup_steps)  # checks the arguments now, not at the first step
        self.lr, self.scale, self.warmup_steps = lr, scale, warmup_steps

    def __call__(self, step):
        return warmup_lr(step, self.lr, self.scale, self.warmup_steps)

    def get_config(self):
        return {"lr": self.lr, "scale": self.scale, "warmup_steps": self.warmup_steps}


def make_train_step(model, optimizer, loss_fn, tape_wrapper=None, *, jit_compile=None):
    """The one training step, a tf.function (forward, loss, gradients, update) returning the loss.

    tape_wrapper wraps the GradientTape: hvd_train passes hvd.DistributedGradientTape (gradients averaged
    over all ranks). A LossScaleOptimizer (mixed precision, labkit.scale.gpu.loss_scaled) gets its loss scaled and
    its gradients unscaled. jit_compile: tf.function's (None: TensorFlow's default).
    Traced without AutoGraph: the step has no Python control flow on tensors, so AutoGraph would build the same
    graph (same weights, bit for bit: tested), after rewriting the Python of Horovod's DistributedGradientTape at
    every start, 3.8 s of CPU per worker here. (04_horovod_scaling)"""
    if tape_wrapper is not None and not callable(tape_wrapper):
        raise TypeError(f"tape_wrapper must be callable (e.g. hvd.DistributedGradientTape); got {tape_wrapper!r}")
    variables, scaling = model.trainable_variables, isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))  # float16 outputs under mixed precision
            scaled = optimizer.get_scaled_loss(loss) if scaling else loss
        if tape_wrapper is not None:
            tape = tape_wrapper(tape)
        grads = tape.gradient(scaled, variables)
        optimizer.apply_gradients(zip(optimizer.get_unscaled_gradients(grads) if scaling else grads, variables))
        return loss

    return tf.function(step, jit_compile=jit_compile, autograph=False)


def from_rank0(hvd, variables):
    """A function setting every variable to rank 0's value on every rank: Horovod's broadcast_variables (the
    same broadcasts, assigned in one traced function) traced without AutoGraph, which would rewrite its loop at
    every start for the same graph (1.2 s of CPU per rank here). hvd: horovod.tensorflow.
    (04_horovod_scaling)"""
    variables = list(variables)

    def assign_all():
        for v in variables:
            v.assign(hvd.broadcast(v, root_rank=0))

    return tf.function(assign_all, autograph=False)


@tf.keras.utils.register_keras_serializable(package="labkit")
class PiecewiseLR(tf.keras.optimizers.schedules.LearningRateSchedule):
    """MATLAB's 'piecewise' schedule: lr * drop_factor ** floor(epoch / drop_period), with optional warmup.

    Counted in optimizer steps, so a resumed run (whose optimizer step is restored) continues on schedule.
    warmup_epochs > 0 ramps linearly from warmup_from * lr to lr over those epochs (Goyal et al.'s gradual
    warmup; 04_horovod_scaling).
    """

    def __init__(self, lr, steps_per_epoch, drop_factor=0.1, drop_period=30, warmup_epochs=0, warmup_from=0.0):
        self.lr, self.steps_per_epoch = check_number(lr, "lr", above=0), check_int(steps_per_epoch, "steps_per_epoch",
                                                                                    minimum=1)
        self.drop_factor = check_number(drop_factor, "drop_factor", above=0, maximum=1)
        self.drop_period = check_int(drop_period, "drop_period", minimum=1)  # epochs
        check_number(warmup_epochs, "warmup_epochs", minimum=0)
        self.warmup_epochs, self.warmup_from = warmup_epochs, check_number(warmup_from, "warmup_from", minimum=0,
                                                                           maximum=1)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        epoch = tf.floor(step / self.steps_per_epoch)
        lr = self.lr * tf.pow(self.drop_factor, tf.floor(epoch / self.drop_period))
        if self.warmup_epochs:
            ramp = tf.minimum(1.0, (step + 1.0) / (self.warmup_epochs * self.steps_per_epoch))
            lr = lr * (self.warmup_from + (1.0 - self.warmup_from) * ramp)
        return lr

    def at_epoch(self, epoch: float) -> float:
        """The LR at a (fractional) epoch, in plain Python: for plots and tests."""
        return float(self(int(round(epoch * self.steps_per_epoch))))

    def get_config(self):
        return {"lr": self.lr, "steps_per_epoch": self.steps_per_epoch, "drop_factor": self.drop_factor,
                "drop_period": self.drop_period, "warmup_epochs": self.warmup_epochs, "warmup_from": self.warmup_from}


def _kernels(model):
    return [layer.kernel for layer in model.submodules
            if isinstance(layer, (tf.keras.layers.Conv2D, tf.keras.layers.Dense)) and hasattr(layer, "kernel")]


def l2_penalty(model, l2: float):
    """MATLAB's L2 term: l2 / 2 * sum of squared conv and dense kernels (biases excluded)."""
    return 0.5 * l2 * tf.add_n([tf.reduce_sum(tf.square(k)) for k in _kernels(model)])


def compile_sgdm(model, lr=0.001, momentum=0.9, l2=0.004, *, steps_per_epoch=None, drop_factor=0.1,
                 drop_period=30, warmup_epochs=0, warmup_from=0.0, metrics=("accuracy",)):
    """Compile with MATLAB's 'sgdm': SGD + momentum, piecewise LR (when steps_per_epoch is given), L2.

    lr may also be any Keras schedule. Calling it again replaces the L2 strength; the model must end in a
    softmax (labkit's models do). Returns the model. (01_cnn_basics)
    """
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1); got {momentum!r}")
    if not l2 >= 0:
        raise ValueError(f"l2 must be >= 0; got {l2!r}")
    if steps_per_epoch is not None and not isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        lr = PiecewiseLR(lr, steps_per_epoch, drop_factor, drop_period, warmup_epochs, warmup_from)
    elif not isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule) and not lr > 0:
        raise ValueError(f"lr must be > 0; got {lr!r}")
    if not _kernels(model):
        raise ValueError("model has no Conv2D or Dense kernels to regularise; build it before compile_sgdm")
    # the penalty reads model._labkit_l2 when the train step is traced, so a recompile can change it
    if not hasattr(model, "_labkit_l2"):
        model.add_loss(lambda: l2_penalty(model, model._labkit_l2) if model._labkit_l2 else 0.0)
    model._labkit_l2 = float(l2)
    model.compile(optimizer=tf.keras.optimizers.SGD(lr, momentum=momentum),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(), metrics=list(metrics))
    return model


# ---------------------------------------------------------------------------------------------------------
# Live progress


def schedule_of(optimizer):
    """The optimizer's LR schedule (PiecewiseLR after compile_sgdm with steps_per_epoch), or None."""
    lr = getattr(optimizer, "_learning_rate", None)
    return lr if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule) else None


def current_lr(optimizer) -> float:
    """The LR the optimizer used in its last step (its first, before any step)."""
    schedule = schedule_of(optimizer)
    if schedule is not None:
        return float(schedule(tf.maximum(optimizer.iterations - 1, 0)))
    return float(tf.keras.backend.get_value(optimizer.learning_rate))




class LiveProgress(tf.keras.callbacks.Callback):
    """Loss and accuracy, train and validation, as MATLAB's training-progress plot.

    In Jupyter: ONE figure, redrawn in place through a display handle (at most every `interval` seconds and
    at each epoch's end), so nothing flickers or piles up. Elsewhere: one plain line per epoch on `stream`.
    mode: "auto" | "plot" | "text". (01_cnn_basics)
    """

    def __init__(self, mode="auto", interval=3.0, stream=None, title="training progress"):
        super().__init__()
        if mode not in ("auto", "plot", "text"):
            raise ValueError(f"mode must be 'auto', 'plot' or 'text'; got {mode!r}")
        self.mode = ("plot" if in_jupyter() else "text") if mode == "auto" else mode
        self.interval, self.stream, self.title = interval, stream, title
        self.batches, self.epochs_log, self.handle, self.redraws = [], [], None, 0

    def _lr(self):
        return current_lr(self.model.optimizer)

    def on_train_begin(self, logs=None):
        self.batches, self.epochs_log = [], []
        self.start, self.last_draw = time.perf_counter(), 0.0
        self.total_epochs = self.params.get("epochs")
        self.steps = self.params.get("steps") or 1
        if self.mode == "plot":
            from IPython.display import display

            self.handle = display(self._image(), display_id=True)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        # Keras passes the running mean over the epoch so far; plot it against fractional epochs
        self.batches.append((self.epoch + (batch + 1) / self.steps, logs.get("loss"), logs.get("accuracy")))
        if self.mode == "plot" and time.perf_counter() - self.last_draw > self.interval:
            self._redraw()

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        row = {"epoch": epoch + 1, "lr": self._lr(), "time_s": time.perf_counter() - self.start, **logs}
        self.epochs_log.append(row)
        if self.mode == "plot":
            self._redraw()
        else:
            parts = [f"epoch {epoch + 1:>3}/{self.total_epochs}"]
            for key, label in (("loss", "loss"), ("accuracy", "acc"), ("val_loss", "val_loss"),
                               ("val_accuracy", "val_acc")):
                if key in logs:
                    value = logs[key]
                    parts.append(f"{label} {value:.1%}" if "acc" in key else f"{label} {value:.4f}")
            parts.append(f"lr {row['lr']:.3g}")
            parts.append(f"{row['time_s']:.1f} s")
            print("  ".join(parts), file=self.stream or sys.stdout, flush=True)

    def on_train_end(self, logs=None):
        if self.mode == "plot":
            self._redraw()

    def _redraw(self):
        self.last_draw = time.perf_counter()
        self.redraws += 1
        if self.handle is not None:
            self.handle.update(self._image())

    def figure(self):
        """The progress figure as it stands (a matplotlib Figure, not registered with pyplot)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.6), dpi=80)
        axes = fig.subplots(1, 2)
        b = np.array([r for r in self.batches if r[1] is not None], dtype=float).reshape(-1, 3)
        e = self.epochs_log
        for ax, key, label in ((axes[0], "loss", "loss"), (axes[1], "accuracy", "accuracy")):
            col = 1 if key == "loss" else 2
            if len(b):
                ax.plot(b[:, 0], b[:, col], color="tab:blue", lw=1, alpha=0.6, label="train (running)")
            if e and key in e[0]:
                ax.plot([r["epoch"] for r in e], [r[key] for r in e], "o-", color="tab:blue", label="train (epoch)")
            if e and f"val_{key}" in e[0]:
                ax.plot([r["epoch"] for r in e], [r[f"val_{key}"] for r in e], "s--", color="black",
                        label="validation")
            ax.set_xlabel("epoch")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if self.total_epochs:
                ax.set_xlim(0, self.total_epochs)
            if len(b) or e:
                ax.legend(loc="best", fontsize=8)
        axes[1].set_ylim(0, 1)
        elapsed = time.perf_counter() - self.start if hasattr(self, "start") else 0.0
        done = e[-1]["epoch"] if e else 0
        fig.suptitle(f"{self.title}: epoch {done}/{self.total_epochs}, {elapsed:.0f} s")
        fig.tight_layout()
        return fig

    def _image(self):
        from IPython.display import Image

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png")
        return Image(data=buf.getvalue(), format="png")


# ---------------------------------------------------------------------------------------------------------
# Resumable training


class TrainingInterrupted(RuntimeError):
    """Raised by SimulatedKill: stands in for a job killed when its lease or wall-time ends."""


class SimulatedKill(tf.keras.callbacks.Callback):
    """Stops training with TrainingInterrupted after `after_epochs` epochs, as a killed job would."""

    def __init__(self, after_epochs: int):
        super().__init__()
        self.after_epochs = check_int(after_epochs, "after_epochs", minimum=1)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.after_epochs:
            raise TrainingInterrupted(f"simulated kill after epoch {epoch + 1}")


def fit(model, train, *, epochs, validation_data=None, backup_dir=None, callbacks=(), progress=True, verbose=0):
    """model.fit with resume and live progress: with backup_dir, a killed run restarts from its last epoch.

    The backup (tf.keras.callbacks.BackupAndRestore: weights, optimizer state and epoch) is written at every
    epoch's end and deleted once training finishes. Returns Keras's History; history.epoch lists the epochs
    this call ran. (01_cnn_basics)
    """
    check_int(epochs, "epochs", minimum=1)
    cbs = []
    if backup_dir is not None:
        # first, so its epoch-end save happens before any later callback can stop the run
        cbs.append(tf.keras.callbacks.BackupAndRestore(str(backup_dir), save_freq="epoch", delete_checkpoint=True))
    cbs.extend(callbacks)
    if progress is True:
        cbs.append(LiveProgress())
    elif progress:
        cbs.append(progress)
    return model.fit(train, epochs=epochs, validation_data=validation_data, callbacks=cbs, verbose=verbose)


# ---------------------------------------------------------------------------------------------------------
# Evaluation


@dataclass
class Evaluation:
    """Test results: accuracy (fraction), confusion[true, predicted] counts, and the predictions."""

    accuracy: float
    confusion: np.ndarray
    y_true: np.ndarray
    y_pred: np.ndarray

    def misclassified(self) -> np.ndarray:
        """Indices of the examples the model got wrong."""
        return np.flatnonzero(self.y_true != self.y_pred)

    def __str__(self):
        return f"test accuracy {self.accuracy:.1%} on {len(self.y_true)} images"


def predict(model, x, batch_size=256) -> np.ndarray:
    """Class probabilities; uint8 images are normalised as make_dataset does, floats are used as given."""
    from labkit.base.pixels import normalize

    batch_size = check_int(batch_size, "batch_size", minimum=1)
    x = np.asarray(x)
    x = normalize(x) if x.dtype == np.uint8 else x.astype(np.float32)
    return model.predict(x, batch_size=batch_size, verbose=0)


def evaluate(model, x, y, batch_size=256, classes=None) -> Evaluation:
    """Test accuracy and confusion matrix (rows: true class, columns: predicted). (01_cnn_basics)"""
    y = np.asarray(y).reshape(-1).astype(np.int64)
    if len(y) != len(x):
        raise ValueError(f"y must have one label per image: {len(x)} images but {len(y)} labels")
    probs = predict(model, x, batch_size)
    classes = probs.shape[-1] if classes is None else classes
    pred = probs.argmax(-1)
    confusion = np.bincount(y * classes + pred, minlength=classes * classes).reshape(classes, classes)
    return Evaluation(float((pred == y).mean()), confusion, y, pred)


# ---------------------------------------------------------------------------------------------------------
# Plots for the notebook


def plot_confusion(evaluation: Evaluation, class_names=None, ax=None, note: str = ""):
    """Confusion matrix as a heat map with counts (rows true, columns predicted); note (e.g. the data set and
    profile) joins the title."""
    import matplotlib.pyplot as plt

    cm = evaluation.confusion
    names = class_names or [str(i) for i in range(len(cm))]
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 5.5))
    im = ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(cm)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(cm)), names)
    for i in range(len(cm)):
        for j in range(len(cm)):
            ax.text(j, i, cm[i, j], ha="center", va="center", fontsize=8,
                    color="white" if cm[i, j] > cm.max() / 2 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"confusion matrix ({evaluation.accuracy:.1%} correct{'; ' + note if note else ''})")
    ax.figure.colorbar(im, ax=ax, label="images")
    return ax


def plot_misclassified(x, evaluation: Evaluation, class_names=None, n=12):
    """The first n misclassified test images, titled 'true -> predicted'."""
    import matplotlib.pyplot as plt

    idx = evaluation.misclassified()[:n]
    names = class_names or [str(i) for i in range(evaluation.confusion.shape[0])]
    cols = min(6, max(len(idx), 1))
    rows = max(1, math.ceil(len(idx) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.5 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, i in zip(axes.flat, idx):
        ax.imshow(x[i])
        ax.set_title(f"{names[evaluation.y_true[i]]}\n-> {names[evaluation.y_pred[i]]}", fontsize=8)
    fig.suptitle("misclassified test images (true -> predicted)")
    fig.tight_layout()
    return fig


def filter_smoothness(w) -> np.ndarray:
    """Per filter of an HWIO kernel: the correlation between horizontally and vertically neighbouring weights
    (about 0 for random noise, near 1 for smooth bands and blobs, -1 for a checkerboard). (01_cnn_basics)"""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 4 or w.shape[0] < 2 or w.shape[1] < 2:
        raise ValueError(f"w must be an HWIO kernel of at least 2x2; got shape {w.shape}")
    out = []
    for k in np.moveaxis(w, -1, 0):  # one filter (kh, kw, c_in) at a time
        a = np.concatenate([k[1:].ravel(), k[:, 1:].ravel()])
        b = np.concatenate([k[:-1].ravel(), k[:, :-1].ravel()])
        out.append(np.corrcoef(a, b)[0, 1])
    return np.array(out)


def plot_filters(model, layer=None, note: str = ""):
    """First-layer (or the named Conv2D layer's) filters as small RGB images, each scaled to [0, 1]; note (e.g. the
    data set and profile) joins the title."""
    import matplotlib.pyplot as plt

    convs = [lay for lay in model.layers if isinstance(lay, tf.keras.layers.Conv2D)]
    conv = model.get_layer(layer) if layer else convs[0]
    w = conv.kernel.numpy()  # (kh, kw, c_in, c_out)
    if w.shape[2] != 3:
        w = w.mean(axis=2, keepdims=True).repeat(3, axis=2)
    n = w.shape[-1]
    cols = min(10, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.0 * cols, 1.05 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            f = w[..., i]
            ax.imshow((f - f.min()) / (np.ptp(f) + 1e-12), interpolation="nearest")
    fig.suptitle(f"{conv.name}: {n} learned {w.shape[0]}x{w.shape[1]} filters{f' ({note})' if note else ''}")
    fig.tight_layout()
    return fig
