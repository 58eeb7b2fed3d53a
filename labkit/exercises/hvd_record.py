"""What a checked script did on one rank, for labkit.exercises.hvd_harness: Keras patched to record it, its source read.

Recorder patches Keras for one script (each rank's own initialisation, compile, fit, the saves: the list is in
labkit.exercises.hvd_harness); Timer records model.fit's batch-end times for labkit.exercises.fitbench; the source
functions read what the script calls; error_line turns an exception into the one line that names its cause.
Imported only by labkit.exercises.hvd_harness, inside the ranks. (04_horovod_scaling)
"""
from __future__ import annotations

import ast
import hashlib
import re
import time

SEED = 1234  # the same on every rank (data order); each rank's weights get a stream of their own
FIRST_BATCHES = 3  # batches whose examples are hashed
NUDGE = 1e-3  # relative size of the rank-dependent nudge given to each trainable weight when it is created
LR_CURVE = 64  # steps at which a learning-rate schedule's values are recorded


def imports_horovod(source: str) -> bool:
    """Whether the script's source imports horovod (any of its modules)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "horovod" in source
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "horovod" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "horovod":
            return True
    return False


def called_names(source: str) -> list[str]:
    """The names the script calls (hvd.init() -> "init"): how the checker tells a late hvd.init() from none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = (node.func for node in ast.walk(tree) if isinstance(node, ast.Call))
    return sorted({f.attr if isinstance(f, ast.Attribute) else f.id for f in calls
                   if isinstance(f, (ast.Attribute, ast.Name))})


def lr_uses_local_size(source: str) -> bool:
    """Whether a statement that names a learning rate (lr, learning_rate) also calls local_size()."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for stmt in ast.walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)):
            continue
        nodes = list(ast.walk(stmt))
        names = {n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.arg
                 for n in nodes if isinstance(n, (ast.Name, ast.Attribute, ast.keyword))}
        if "local_size" in names and any(name and ("lr" in name.lower() or "learning_rate" in name) for name in names):
            return True
    return False


def _checksum(model) -> str:
    from labkit.base import rankstats
    return rankstats.weights_checksum([w.numpy() for w in model.trainable_weights])


def _lr_value(opt, step=0):
    """The optimizer's learning rate now (a schedule: its value at `step`), as a float; None if unreadable."""
    import tensorflow as tf
    try:
        lr = getattr(opt, "learning_rate", None)
        if lr is None:
            lr = opt.lr
        if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
            return float(lr(step))
        return float(tf.keras.backend.get_value(lr))
    except Exception:  # an exotic optimizer: the checker then says it cannot read the LR
        return None


def _describe_optimizer(opt) -> dict:
    """What compile was given: the optimizer's class, whether Horovod wraps it, legacy or not, its learning rate."""
    import tensorflow as tf
    lr = getattr(opt, "learning_rate", None)
    schedule = isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule)
    return {"optimizer": type(opt).__name__, "module": type(opt).__module__,
            "horovod": type(opt).__module__.startswith("horovod"),
            "legacy": isinstance(opt, tf.keras.optimizers.legacy.Optimizer), "lr": _lr_value(opt),
            "lr_curve": [_lr_value(opt, s) for s in range(LR_CURVE)] if schedule else None}


def _describe_callback(cb) -> dict:
    d = {"class": type(cb).__name__, "module": type(cb).__module__}
    if hasattr(cb, "initial_lr"):
        d["initial_lr"] = None if cb.initial_lr is None else float(cb.initial_lr)
    if hasattr(cb, "end_epoch"):
        d["warmup_epochs"] = cb.end_epoch
    if hasattr(cb, "filepath"):
        d["filepath"] = str(cb.filepath)
    return d


def _floats(logs) -> dict:
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def error_line(err: BaseException) -> str:
    """The exception as one line: its type and the line of its message that names the cause (a TensorFlow graph
    error's is its last line, under the trace of the graph's nodes), at most 240 characters."""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(err))  # TensorFlow's name of the op that failed
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    noise = ("Detected at node", "File ", "[[", "[Op:", "Graph execution error", "defined at", "in user code")
    causes = [ln for ln in lines if not ln.startswith(noise) and not ln.endswith(":")]
    line = (causes[-1] if causes and lines[0].startswith(("Graph execution error", "in user code")) else
            causes[0] if causes else lines[0] if lines else "")
    text = f"{type(err).__name__}: {line}" if line else type(err).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def _watch(rec: dict):
    """The callback fit gets last: it sees the weights and logs after the script's own callbacks (the broadcast)."""
    import tensorflow as tf

    class Watch(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            rec["steps_begun"] += 1
            if len(rec["lr_steps"]) < 8:
                rec["lr_steps"].append(_lr_value(self.model.optimizer, len(rec["lr_steps"])))

        def on_train_batch_end(self, batch, logs=None):
            if rec["checksum_first_step"] is None:
                rec["checksum_first_step"] = _checksum(self.model)

        def on_epoch_end(self, epoch, logs=None):
            rec["epoch_logs"].append(_floats(logs))

        def on_train_end(self, logs=None):
            rec["checksum_end"] = _checksum(self.model)

    return Watch()


class Recorder:
    """Patches Keras for one script and collects what the rank did."""

    def __init__(self, rank: int):
        self.rank = rank
        self.rec = {"compile": [], "fit": [], "saves": [], "batches": [], "lr_steps": [], "steps_begun": 0,
                    "checksum_first_step": None, "checksum_end": None, "epoch_logs": []}
        self._undo = []
        self._created = 0  # weights nudged so far: each its own random stream

    def _patch(self, owner, name, make):
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original))

    def undo(self):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def _nudge(self, v):
        """Shift a new trainable weight by a small rank-dependent amount (rank 0 too; zeros and ones as well, so
        that a broadcast that leaves any array out shows): this rank's own initialisation."""
        import numpy as np
        import tensorflow as tf
        if not getattr(v, "trainable", False) or not hasattr(v, "assign_add"):
            return
        rng = np.random.default_rng([SEED, self.rank, self._created])
        self._created += 1
        with tf.init_scope():  # a layer built inside fit's tf.function: nudged once, eagerly, not at every step
            scale = NUDGE * (float(np.abs(v.numpy()).mean()) or 1.0)
            v.assign_add(rng.normal(0, scale, v.shape).astype(v.dtype.as_numpy_dtype))

    def _record_data(self, x):
        """Hash the images of the first batches that reach the training step (a tf.data pipeline is mapped)."""
        import numpy as np
        import tensorflow as tf
        batches = self.rec["batches"]

        def hashes(images):
            arr = np.asarray(images)
            return [hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest() for a in arr]

        if isinstance(x, tf.data.Dataset):
            def note(images):
                if len(batches) < FIRST_BATCHES:
                    batches.append(hashes(images.numpy()))
                return np.int64(0)

            def record(*element):
                images = tf.nest.flatten(element)[0]
                done = tf.py_function(note, [images], tf.int64)
                with tf.control_dependencies([done]):
                    return tf.nest.map_structure(tf.identity, element if len(element) > 1 else element[0])

            return x.map(record)
        if isinstance(x, np.ndarray):  # arrays: fit shuffles them itself; what matters is which examples
            batches.append(hashes(x[:4096]))
        return x

    def install(self):
        import tensorflow as tf
        rec, recorder = self.rec, self
        model_cls = tf.keras.Model

        def add_weight_(original):
            def add_weight(layer, *args, **kwargs):
                v = original(layer, *args, **kwargs)
                if not isinstance(layer, tf.keras.metrics.Metric):
                    recorder._nudge(v)
                return v
            return add_weight

        def compile_(original):
            def compile(model, *args, **kwargs):
                out = original(model, *args, **kwargs)
                rec["compile"].append(_describe_optimizer(model.optimizer))
                return out
            return compile

        def fit_(original):
            def fit(model, x=None, y=None, *args, **kwargs):
                callbacks = list(kwargs.pop("callbacks", None) or [])
                verbose = kwargs.get("verbose", "auto")
                rec["fit"].append({"callbacks": [_describe_callback(c) for c in callbacks],
                                   "steps_per_epoch": kwargs.get("steps_per_epoch"),
                                   "epochs": kwargs.get("epochs", 1), "verbose": verbose})
                x = recorder._record_data(x)
                return original(model, x, y, *args, callbacks=[*callbacks, _watch(rec)], **kwargs)
            return fit

        def saver(kind):
            def make(original):
                def save(obj, path, *args, **kwargs):
                    rec["saves"].append({"how": kind, "path": str(path)})
                    return original(obj, path, *args, **kwargs)
                return save
            return make

        self._patch(tf.keras.layers.Layer, "add_weight", add_weight_)
        self._patch(model_cls, "compile", compile_)
        self._patch(model_cls, "fit", fit_)
        self._patch(model_cls, "save", saver("Model.save"))
        self._patch(model_cls, "save_weights", saver("Model.save_weights"))
        self._patch(tf.train.Checkpoint, "save", saver("Checkpoint.save"))
        self._patch(tf.train.Checkpoint, "write", saver("Checkpoint.write"))


class Timer:
    """--timing: wall-clock and process CPU time at the end of every training batch of model.fit (with its batch
    index: under steps_per_execution=k Keras calls the hook once per k steps), nothing else patched."""

    def __init__(self):
        self.rec = {"batch_end_s": [], "batch_cpu_s": [], "batch_index": [], "fit": []}
        self._undo = None

    def install(self):
        import tensorflow as tf
        rec, model_cls = self.rec, tf.keras.Model
        original = model_cls.fit

        class _Clock(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                rec["batch_end_s"].append(time.perf_counter())
                rec["batch_cpu_s"].append(time.process_time())  # all threads: work done, not time waited for a core
                rec["batch_index"].append(batch)

        def fit(model, *args, **kwargs):
            rec["fit"].append({"steps_per_epoch": kwargs.get("steps_per_epoch"), "epochs": kwargs.get("epochs", 1),
                               "callbacks": [type(c).__name__ for c in kwargs.get("callbacks") or []]})
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _Clock()]
            return original(model, *args, **kwargs)

        model_cls.fit = fit
        self._undo = (model_cls, original)

    def undo(self):
        if self._undo:
            self._undo[0].fit = self._undo[1]


def model_checksums(names: dict) -> dict:
    """{global name: weights checksum} of the Keras models a script left in its globals (fit or custom loop)."""
    import tensorflow as tf
    return {k: _checksum(v) for k, v in names.items() if isinstance(v, tf.keras.Model) and v.built}
