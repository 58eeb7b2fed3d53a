"""labkit.exercises.hvd_harness with what a resume needs recorded, and a run stopped part way, for
labkit.exercises.check_resume (08_training_on_the_cluster).

    LABKIT_RESUME_KILL=1:6 horovodrun -np 2 ... python -m labkit.exercises.resume_harness --script S ... -- ARGS

The scripts run as under labkit.exercises.hvd_harness (its records, its working folders, one launch for several
scripts), and each script's record gains "resume": for every training step begun (up to MAX_STEPS) the epoch
fit is in, the optimizer's step counter, the learning rate, the checksums of the weights and of the optimizer's
slots (None before it creates them); a hash of each batch the model trains on, in order; the checkpoints written
through tf.train.Checkpoint (CheckpointManager's writer too; hvd_harness records Keras's saves) and those read
(tf.train.Checkpoint's restore or read, Model.load_weights); fit's
initial_epoch; the steps done. LABKIT_RESUME_KILL=K:N[,K:N] stops script K (0-based) after N training steps, at
the end of the step on every rank, as a kill would: an exception no `except Exception` catches leaves fit, and
nothing of the script after it runs ("killed_after" says where). TensorFlow runs with op determinism, so two runs
of one script take bit-identical steps. A leaf: no labkit module imports it.
"""
from __future__ import annotations

import hashlib
import os
import sys

import labkit  # noqa: F401  (TF log level before TensorFlow)
from labkit.exercises import hvd_harness
from labkit.exercises.hvd_record import _checksum, _lr_value

KILL_ENV = "LABKIT_RESUME_KILL"
MAX_STEPS = 64  # steps and batches recorded per script
_run_original = hvd_harness.run_script
_count = [0]  # scripts run so far in this process


class Killed(BaseException):
    """The stop after N steps: a BaseException, so that the script's own `except Exception` does not catch it."""


def kills(text: str) -> dict:
    """{script index: steps} from LABKIT_RESUME_KILL's 'K:N,K:N'."""
    out = {}
    for item in filter(None, text.split(",")):
        k, _, n = item.partition(":")
        if not (k.isdigit() and n.isdigit() and int(n) > 0):
            raise ValueError(f"{KILL_ENV} must be SCRIPT:STEPS pairs joined by commas, e.g. 1:6; got {text!r}")
        out[int(k)] = int(n)
    return out


def _slots(opt, model):
    """Checksum of the optimizer's slots (the momentum) of every trainable variable, or None before they exist."""
    from labkit.base import rankstats
    try:
        values = [opt.get_slot(v, name).numpy() for v in model.trainable_variables for name in opt.get_slot_names()]
    except (KeyError, AttributeError, ValueError):
        return None
    return rankstats.weights_checksum(values) if values else None


def _install(rec: dict, kill_after: int | None):
    """Patch fit (a callback last, the batches hashed) and tf.train.Checkpoint's writer; returns the undo."""
    import numpy as np
    import tensorflow as tf

    class Steps(tf.keras.callbacks.Callback):
        epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if len(rec["steps"]) < MAX_STEPS:
                opt = self.model.optimizer
                step = int(opt.iterations.numpy())
                rec["steps"].append({"epoch": self.epoch, "iterations": step, "lr": _lr_value(opt, step),
                                     "weights": _checksum(self.model), "slots": _slots(opt, self.model)})

        def on_train_batch_end(self, batch, logs=None):
            rec["steps_done"] += 1
            if kill_after is not None and rec["steps_done"] >= kill_after:
                rec["killed_after"] = rec["steps_done"]
                raise Killed(f"stopped after {kill_after} steps")

    def note(images):
        if len(rec["batches"]) < MAX_STEPS:
            rec["batches"].append(hashlib.blake2b(np.ascontiguousarray(images.numpy()).tobytes(),
                                                  digest_size=8).hexdigest())
        return np.int64(0)

    def hashed(*element):
        done = tf.py_function(note, [tf.nest.flatten(element)[0]], tf.int64)
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, element if len(element) > 1 else element[0])

    patched = {(tf.keras.Model, "fit"), (tf.train.Checkpoint, "_write"), (tf.train.Checkpoint, "read"),
               (tf.keras.Model, "load_weights")}
    original = {(owner, name): getattr(owner, name) for owner, name in patched}

    def fit(model, x=None, y=None, *args, **kwargs):
        rec["fits"].append({"initial_epoch": kwargs.get("initial_epoch", 0), "epochs": kwargs.get("epochs", 1)})
        if isinstance(x, tf.data.Dataset):
            x = x.map(hashed)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), Steps()]
        return original[tf.keras.Model, "fit"](model, x, y, *args, **kwargs)

    def noting(owner, name, key):
        def call(obj, path, *args, **kwargs):
            rec[key].append(str(path))
            return original[owner, name](obj, path, *args, **kwargs)
        return call

    tf.keras.Model.fit = fit
    tf.train.Checkpoint._write = noting(tf.train.Checkpoint, "_write", "writes")
    tf.train.Checkpoint.read = noting(tf.train.Checkpoint, "read", "reads")  # restore() reads through it
    tf.keras.Model.load_weights = noting(tf.keras.Model, "load_weights", "reads")
    return lambda: [setattr(owner, name, f) for (owner, name), f in original.items()]


def run_script(path, script_args, workdir, *, timing=False, first=True) -> dict:
    """hvd_harness.run_script with the resume's record added (and this script stopped where LABKIT_RESUME_KILL says)."""
    index, _count[0] = _count[0], _count[0] + 1
    kill_after = kills(os.environ.get(KILL_ENV, "")).get(index)
    rec = {"steps": [], "batches": [], "writes": [], "reads": [], "fits": [], "steps_done": 0, "killed_after": None}
    undo = _install(rec, kill_after)
    try:
        record = _run_original(path, script_args, workdir, timing=timing, first=first)
    finally:
        undo()
    if rec["killed_after"] is not None and (record.get("error") or "").startswith("Killed"):
        record["error"] = None  # the stop asked for, not the script's error
        record.pop("traceback", None)
    record["resume"] = rec
    return record


def main(argv=None) -> int:
    import tensorflow as tf
    kills(os.environ.get(KILL_ENV, ""))  # a malformed value: one line before any script runs
    tf.config.experimental.enable_op_determinism()  # two runs of one script: bit-identical steps
    hvd_harness.run_script = run_script  # hvd_harness.main runs every script through it
    return hvd_harness.main(argv)


if __name__ == "__main__":
    sys.exit(main())
