"""04's Horovod exercise checker: the reference script is correct, the single-process placeholder is 'not answered',
and each mistake is made the way a learner would make it (a broken copy of the reference) and named.

All the variants run in ONE 2-worker launch (labkit.exercises.hvd_harness runs them one after the other, Keras cleared
and the seeds set again in between): TensorFlow's start-up is paid once. Horovod stays up from the first hvd.init()
on, so the scripts that never reach hvd.init() run first. One more
launch goes through the learner's entry point, check_hvd.keras_hvd(path), end to end.
"""
import concurrent.futures
import time

import pytest

from helpers import edited
from labkit.exercises import check_hvd
from labkit.exercises.verdict import CHECKERS

launches = pytest.mark.horovod  # the tests that start horovodrun (the fixture's one launch is shared)

REF = check_hvd.REFERENCE.read_text()


def _broken(*edits):
    """The reference with each (old, new) replaced (helpers.edited: each old text there exactly once)."""
    return edited(REF, *edits)


FIT = "history = model.fit(dataset, "
CALLBACKS = """    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
"""
TF_IMPORT = ("import horovod.tensorflow.keras as hvd\n",
             "import horovod.tensorflow as hvd_tf  # broadcast_variables lives here\n"
             "import horovod.tensorflow.keras as hvd\n")
NO_WARMUP = ("    hvd.callbacks.LearningRateWarmupCallback(", "    # hvd.callbacks.LearningRateWarmupCallback(")
OPT = "opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9))"
NEW_SGD = ("tf.keras.optimizers.legacy.SGD(", "tf.keras.optimizers.SGD(")

# mistake key -> the learner's script with that one mistake (one per key, in the order they are checked)
BROKEN = {
    "not_initialised": _broken(("hvd.init()  #", "#")),
    "init_too_late": _broken(("hvd.init()  #", "#"), ("model = models.get(", "hvd.init()\nmodel = models.get(")),
    "wrong_import": _broken(("import horovod.tensorflow.keras as hvd", "import horovod.tensorflow as hvd")),
    "new_optimizer": _broken(NEW_SGD),
    "optimizer_on_some_ranks": _broken((OPT, "opt = tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9)\n"
                                              "if hvd.rank() == 0:\n    opt = hvd.DistributedOptimizer(opt)")),
    "rank_left": _broken((FIT, "history = None if hvd.rank() == 1 else model.fit(dataset, ")),
    "no_fit": (check_hvd.REFERENCE.parent / "keras_hvd_loop.py").read_text(),  # the custom loop handed in
    "not_broadcast": _broken((CALLBACKS, "")),
    "gradients_not_averaged": _broken(("hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(learning_rate=lr, "
                                       "momentum=0.9))",
                                       "tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9)")),
    "lr_local_size": _broken(("lr = args.lr * hvd.size()", "lr = args.lr * hvd.local_size()")),
    "warmup_not_scaled": _broken(("lr = args.lr * hvd.size()", "lr = args.lr")),
    "lr_not_scaled": _broken(("lr = args.lr * hvd.size()", "lr = args.lr"), NO_WARMUP),
    "no_warmup": _broken(NO_WARMUP),
    "metrics_by_hand": _broken(("    hvd.callbacks.MetricAverageCallback(),", ""), (
        "if hvd.rank() == 0:\n    print(f\"{info.name}: loss {history.history['loss'][-1]:.3f}",
        "loss = float(hvd.allreduce(history.history['loss'][-1]))  # the average over the ranks\n"
        "if hvd.rank() == 0:\n    print(f\"{info.name}: loss {loss:.3f}")),
    "metrics_not_averaged": _broken(("    hvd.callbacks.MetricAverageCallback(),", "")),
    "checkpoint_per_rank": _broken(("if hvd.rank() == 0:  # one writer", "if True:  # one writer"),
                                   ("ModelCheckpoint(args.checkpoint,",
                                    "ModelCheckpoint(f\"ckpt-rank{hvd.rank()}.h5\",")),
    "checkpoint_every_rank": _broken(("if hvd.rank() == 0:  # one writer", "if True:  # one writer")),
    "no_checkpoint": _broken(("callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint, "
                              "save_weights_only=True))", "pass")),
    "data_not_sharded": _broken(("shard=(hvd.rank(), hvd.size()), ", "")),
    "steps_not_divided": _broken(("steps_per_epoch=max(1, args.steps // hvd.size())", "steps_per_epoch=args.steps")),
    "verbose_every_rank": _broken(("verbose=2 if hvd.rank() == 0 else 0", "verbose=2")),
}
# more ways to make the same mistakes: name -> (the mistake it must be named as, the script)
MORE_BROKEN = {
    "wrong_import_keras": ("wrong_import", _broken((CALLBACKS, ""), (FIT, "hvd.broadcast_variables(model.variables, "
                                                                          "root_rank=0)\n" + FIT))),
    "new_optimizer_no_wrapper": ("new_optimizer", _broken(NEW_SGD, ("hvd.DistributedOptimizer(", "("))),
    "rank_exits_early": ("rank_left", _broken(("import argparse\n", "import argparse\nimport sys\n"),
                                              (FIT, "if hvd.rank() == 1:\n    sys.exit(0)\n" + FIT))),
    "steps_multiplied": ("steps_not_divided", _broken(("steps_per_epoch=max(1, args.steps // hvd.size())",
                                                       "steps_per_epoch=args.steps * hvd.size()"))),
    "uneven_steps": ("rank_left", _broken(("steps_per_epoch=max(1, args.steps // hvd.size())",
                                           "steps_per_epoch=(args.steps - hvd.rank()) // hvd.size()"))),
    "warmup_target_unscaled": ("warmup_not_scaled", _broken(("LearningRateWarmupCallback(initial_lr=lr,",
                                                             "LearningRateWarmupCallback(initial_lr=args.lr,"))),
    # the ranks differ only in their last Dense layer: kernel and bias, then the bias alone (the last array)
    "broadcast_all_but_the_head": ("not_broadcast", _broken(TF_IMPORT, (CALLBACKS, ""), (
        FIT, "hvd_tf.broadcast_variables([v for layer in model.layers[:-1] for v in layer.variables], 0)\n" + FIT))),
    "broadcast_all_but_the_last_bias": ("not_broadcast", _broken(TF_IMPORT, (CALLBACKS, ""), (
        FIT, "hvd_tf.broadcast_variables(model.trainable_variables[:-1], root_rank=0)\n" + FIT))),
}
OTHER = {  # not a recognised mistake: the script's own error in one line
    "crash": _broken(("model = models.get(", "model = modells.get(")),
    "dropped_option": _broken(('p.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")\n',
                               "")),
    "crash_on_one_rank": _broken((FIT, "assert hvd.rank() == 0, 'rank 1 is not ready'\n" + FIT)),
}
BROADCAST_ONCE = """class BroadcastOnce(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:  # after the first step, as the custom loop does: the optimizer's variables exist
            hvd_tf.broadcast_variables(self.model.variables, root_rank=0)
            hvd_tf.broadcast_variables(self.model.optimizer.variables(), root_rank=0)


"""
AVERAGE_LOGS = """class AverageLogs(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        for key in logs:
            logs[key] = float(hvd.allreduce(tf.constant(logs[key], tf.float32)))


"""
# correct scripts other than the reference, as learners write them: each must be judged correct
CORRECT = {
    "broadcast_variables_before_fit": _broken(TF_IMPORT, (CALLBACKS, ""), (
        FIT, "hvd_tf.broadcast_variables(model.variables, root_rank=0)  # every rank starts from rank 0's\n" + FIT)),
    "broadcast_after_the_first_batch": _broken(TF_IMPORT, ("callbacks = [\n", BROADCAST_ONCE + "callbacks = [\n"),
                                               (CALLBACKS, "    BroadcastOnce(),\n")),
    "callbacks_reordered_keywords": _broken(
        (CALLBACKS, ""), ("    hvd.callbacks.MetricAverageCallback(),",
                          "    hvd.callbacks.MetricAverageCallback(),\n"
                          "    hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0),"),
        ("verbose=2 if hvd.rank() == 0 else 0", "verbose=1 if hvd.rank() == 0 else 0"),
        ("steps_per_epoch=max(1, args.steps // hvd.size())", "steps_per_epoch=args.steps // hvd.size()")),
    "init_first_checkpoint_after_fit": _broken(
        ("hvd.init()  #", "#"), ("import horovod.tensorflow.keras as hvd\n", "import horovod.tensorflow.keras as hvd\n"
                                 "hvd.init()\n"),
        ("callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint, save_weights_only=True))", "pass"),
        ("if hvd.rank() == 0:\n    print(",
         "if hvd.rank() == 0:\n    model.save_weights(args.checkpoint)\n    print(")),
    "shard_by_hand_warmup_schedule": _broken(
        ("shard=(hvd.rank(), hvd.size()), ", ""),
        ("(x, y), _, info = data.load_dataset()  #", "(x, y), _, info = data.load_dataset()\n"
                                                    "x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]  #"),
        ("    hvd.callbacks.LearningRateWarmupCallback(", "    # hvd.callbacks.LearningRateWarmupCallback("),
        ("SGD(learning_rate=lr,", "SGD(learning_rate=tf.keras.optimizers.schedules.PolynomialDecay("
                                  "lr / hvd.size(), 4, lr, power=1.0),")),
    "horovod_keras_and_full_module_path": _broken(
        ("import horovod.tensorflow.keras as hvd\n", "import horovod.keras as hvd  # Horovod's older Keras module\n"
                                                      "import horovod.tensorflow\n"),
        (CALLBACKS, ""), (FIT, "horovod.tensorflow.broadcast_variables(model.variables, root_rank=0)\n" + FIT)),
    "metrics_averaged_by_hand_in_a_callback": _broken(
        ("callbacks = [\n", AVERAGE_LOGS + "callbacks = [\n"),
        ("    hvd.callbacks.MetricAverageCallback(),", "    AverageLogs(),")),
}


ALONE = ("optimizer_on_some_ranks",)  # its ranks meet in different collectives too: Horovod shuts down


@pytest.fixture(scope="session")
def records(tmp_path_factory):
    """Every variant, the reference and the placeholder run in one launch: {name: [rank 0's, rank 1's record]}.
    A rank that leaves early does not hang the scripts after it (the harness joins the ranks after each): the
    correct variants run after those. Ranks stuck in different collectives (uneven_steps) end in Horovod's
    shutdown after check_hvd.STALL_S seconds, which no later script could survive: it runs last, and each script
    of ALONE (another such shutdown) in a launch of its own."""
    folder = tmp_path_factory.mktemp("hvd_variants")
    paths = {"placeholder": check_hvd.PLACEHOLDER}
    first = ("not_initialised", "init_too_late", "dropped_option")  # no hvd.init() reached: before the others
    last = ("uneven_steps",)
    scripts = {**BROKEN, **{k: src for k, (_, src) in MORE_BROKEN.items()}, **OTHER, **CORRECT}
    for name, src in sorted(scripts.items(), key=lambda item: item[0] not in first):  # `last`: moved below
        if name in ALONE:
            continue
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(src)
    paths["correct"] = check_hvd.REFERENCE
    paths = {**{k: v for k, v in paths.items() if k not in last}, **{k: paths[k] for k in last}}
    # each launch of ALONE runs beside the shared one: most of it is the wait for Horovod's stall shutdown
    alone = {}
    for name in ALONE:
        (folder / f"{name}.py").write_text(scripts[name])
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(ALONE)) as beside:
        for name in ALONE:
            alone[name] = beside.submit(check_hvd.run_scripts, [folder / f"{name}.py"])
        t0 = time.perf_counter()
        runs = check_hvd.run_scripts(list(paths.values()))
        print(f"\n{len(paths)} scripts on 2 workers in one launch: {time.perf_counter() - t0:.1f} s")
        out = dict(zip(paths, runs))
        for name, launch in alone.items():
            (out[name],) = launch.result()
    assert not any(r["horovod_up_before"] for name in first for r in out[name])
    return out


@pytest.fixture(scope="session")
def verdicts(records):
    out = {name: check_hvd.verdict_of(recs) for name, recs in records.items()}
    for name, v in out.items():  # what the learner reads, shown with pytest -s
        print(f"{name:22s} {v.message}")
    return out


@launches
def test_reference_is_correct(verdicts):
    v = verdicts["correct"]
    assert v.status == "correct", v.message
    assert v.message.startswith("Correct!") and "\n" not in v.message


@launches
def test_placeholder_is_not_answered(verdicts):
    v = verdicts["placeholder"]
    assert (v.status, v.message) == ("unanswered", check_hvd.SINGLE_PROCESS)


@pytest.mark.parametrize("key", [k for k, _ in check_hvd.MISTAKES])
@launches
def test_each_mistake_is_named(verdicts, key):
    v = verdicts[key]
    assert (v.status, v.mistake) == ("mistake", key), v.message
    assert v.message.startswith("Not quite: ") and "\n" not in v.message and len(v.message) < 400


@pytest.mark.parametrize("name", sorted(MORE_BROKEN))
@launches
def test_other_ways_to_make_a_mistake_are_named(verdicts, name):
    v = verdicts[name]
    assert (v.status, v.mistake) == ("mistake", MORE_BROKEN[name][0]), v.message


@pytest.mark.parametrize("name", sorted(CORRECT))
@launches
def test_correct_variants_are_judged_correct(verdicts, name):
    v = verdicts[name]
    assert v.status == "correct", v.message


def test_every_mistake_has_a_broken_script():
    assert list(BROKEN) == [k for k, _ in check_hvd.MISTAKES]  # same keys, in the order they are checked


@launches
def test_numbers_in_the_hints(verdicts):
    assert "0.0125" in verdicts["lr_not_scaled"].message and "0.025" in verdicts["lr_not_scaled"].message
    assert "checkpoint-01.h5" in verdicts["checkpoint_every_rank"].message
    assert "hvd.init()" in verdicts["not_initialised"].message


@launches
def test_a_crash_is_one_line_with_the_error(verdicts):
    v = verdicts["crash"]
    assert v.status == "unreadable" and "NameError" in v.message and "modells" in v.message, v.message
    v = verdicts["dropped_option"]
    assert v.status == "unreadable" and "unrecognized arguments: --lr" in v.message, v.message
    v = verdicts["crash_on_one_rank"]  # rank 0 then fails in the broadcast: rank 1's own error is the cause
    assert v.status == "unreadable" and "rank 1" in v.message and "AssertionError: rank 1 is not ready" in v.message


@launches
def test_every_verdict_is_one_line_without_tensorflow_s_trace(verdicts):
    for name, v in verdicts.items():
        assert "\n" not in v.message and len(v.message) < 600, (name, v.message)
        for trace in ("Graph execution error", "Detected at node", "function_node", "[[", "Join"):
            assert trace not in v.message, (name, v.message)


@launches
def test_the_learner_s_words_for_the_new_mistakes(verdicts):
    assert "tf.keras.optimizers.legacy.SGD" in verdicts["new_optimizer"].message
    assert "'float' object has no attribute 'dtype'" in verdicts["new_optimizer"].message
    left = verdicts["rank_left"].message
    assert "every rank must take part in every collective" in left and "rank 1 left without calling model.fit" in left
    assert "rank 1 left after 3 training steps (rank 0 began 4)" in verdicts["uneven_steps"].message
    # the checked script runs its steps eagerly (hvd_harness): the ranks' next collectives differ at once
    assert "Mismatched ALLREDUCE tensor shapes" in verdicts["uneven_steps"].message
    assert "module 'horovod.tensorflow' has no attribute 'callbacks'" in verdicts["wrong_import"].message
    assert "ckpt-rank0.h5, ckpt-rank1.h5" in verdicts["checkpoint_per_rank"].message
    assert "0.0125 x hvd.local_size()" in verdicts["lr_local_size"].message
    some = verdicts["optimizer_on_some_ranks"].message
    assert "every rank must take part in every collective" in some and "only rank 0 wraps" in some
    assert "Horovod has been shut down" not in some
    assert "each rank runs 16 steps of an epoch" in verdicts["steps_multiplied"].message


def _live_children() -> set:
    import psutil
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped by subprocess: not running
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


@launches
def test_the_learner_entry_point_runs_the_script_and_prints_one_line(tmp_path, capsys):
    """check_hvd.keras_hvd(path): its own launch, the reference's path back, no process or file left behind."""
    before = _live_children()
    script = tmp_path / "my_keras_hvd.py"
    script.write_text(BROKEN["not_broadcast"])
    assert check_hvd.keras_hvd(str(script)) == str(check_hvd.REFERENCE)
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "BroadcastGlobalVariablesCallback(0)" in line, line
    deadline = time.monotonic() + 10  # launch's watchdog exits once it has read that the launch cleaned up
    while _live_children() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _live_children() <= before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_keras_hvd.py"]  # checkpoints went elsewhere


def test_answers_that_are_not_a_script_get_a_line_without_a_launch(capsys):
    assert check_hvd.judge(None).message == check_hvd.NOT_ANSWERED
    assert check_hvd.judge(...).status == "unanswered"
    assert "no file 'nosuch.py'" in check_hvd.judge("nosuch.py").message
    assert check_hvd.judge(42).status == "unreadable"
    assert CHECKERS["keras_hvd"] is check_hvd.keras_hvd


@launches
def test_the_custom_loop_form_stays_in_sync(records):
    """keras_hvd_loop.py (handed in as 'no_fit'): both ranks end with the same weights, rank 0 alone saves."""
    r0, r1 = records["no_fit"]
    assert r0["error"] is None and r1["error"] is None
    assert r0["models_end"]["model"] == r1["models_end"]["model"]
    assert [len(r["saves"]) for r in (r0, r1)] == [1, 0]


@launches
def test_sync_rows_of_the_reference(records):
    df = check_hvd.sync_rows(records["correct"])
    assert list(df["rank"]) == [0, 1] and df["checksum_end"].nunique() == 1 and df["loss"].nunique() == 1
    assert df["checksum_first_step"].nunique() == 1 and df["files_written"].tolist() == [["checkpoint-01.h5"], []]
    # each rank initialised its own weights: without a broadcast (the single-process script) they differ
    assert records["placeholder"][0]["checksum_first_step"] != records["placeholder"][1]["checksum_first_step"]


def test_conversion_diff_is_the_lines_that_change():
    diff = check_hvd.conversion_diff()
    added = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert "import horovod.tensorflow.keras as hvd" in added
    assert any(ln.startswith("hvd.init()") for ln in added)
    assert any("hvd.DistributedOptimizer(" in ln for ln in added)
    assert not any('"""' in ln for ln in diff.splitlines())  # docstrings left out
    assert len(added) < 30  # the few lines that change


LEAVES = ("keras_single", "keras_hvd", "keras_hvd_loop", "hvd_harness")


def test_no_labkit_module_imports_the_scripts():
    import ast
    root = check_hvd.REFERENCE.parent
    importers = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[-1] in LEAVES and n.startswith("labkit") for n in names):
                importers.append(path.name)
    assert importers == []


@pytest.mark.slow
def test_the_placeholder_runs_alone(tmp_path):
    """The learner edition's starting point must run single-process, as Run All does (tiny size)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "LABKIT_SMOKE": "1"}
    proc = subprocess.run([sys.executable, str(check_hvd.PLACEHOLDER), "--epochs", "1", "--steps", "2",
                           "--batch-size", "4"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loss" in proc.stdout and (tmp_path / "checkpoint-01.h5").is_file()


def test_error_line_is_the_line_that_names_the_cause():
    """A TensorFlow graph error is a trace of nodes around one line of cause: that line, one line, no node names."""
    from labkit.exercises.hvd_record import error_line

    class UnknownError(Exception):
        pass

    trace = ("Graph execution error:\n\nDetected at node 'DistributedSGD_Allreduce/cond_5/HorovodAllreduce' defined "
             "at (most recent call last):\n  File \"my_keras_hvd.py\", line 44, in <module>\n" * 20 +
             "{{function_node __wrapped__HorovodAllreduce_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
             "Horovod has been shut down. This was caused by an exception on one of the ranks.\n"
             "\t [[{{node DistributedSGD_Allreduce/cond_5/HorovodAllreduce}}]] [Op:__inference_train_function_911]")
    assert error_line(UnknownError(trace)) == ("UnknownError: Horovod has been shut down. This was caused by an "
                                               "exception on one of the ranks.")
    assert error_line(NameError("name 'modells' is not defined")) == "NameError: name 'modells' is not defined"
    assert len(error_line(ValueError("x" * 1000))) == 240


def _record(rank, **fields):
    """A harness record of a script that stopped before fit (the fields a verdict reads)."""
    return {"rank": rank, "size": 2, "imports_horovod": True, "error": None, "compile": [], "fit": [],
            "steps_begun": 0, "calls": ["init"], **fields}


def test_a_typo_in_a_horovod_name_is_not_called_a_wrong_import():
    """hvd.callbaks is in neither module: the error's own line, not the advice to import the other module."""
    error = "AttributeError: module 'horovod.tensorflow.keras' has no attribute 'callbaks'"
    v = check_hvd.verdict_of([_record(0, error=error), _record(1, error=error)])
    assert v.status == "unreadable" and v.message.endswith(error), v.message
    error = "AttributeError: module 'horovod.tensorflow.keras' has no attribute 'DistributedGradientTape'"
    v = check_hvd.verdict_of([_record(0, error=error), _record(1, error=error)])
    assert v.mistake == "wrong_import" and "horovod.tensorflow" in v.message, v.message


def test_a_crash_before_fit_with_the_new_optimizer_is_the_crash():
    """Keras's new optimizer is named only when the script stopped in fit, where Horovod's callbacks use it."""
    compiled = [{"optimizer": "SGD", "legacy": False, "horovod": True, "lr": 0.025}]
    error = "NameError: name 'modells' is not defined"
    v = check_hvd.verdict_of([_record(r, error=error, compile=compiled) for r in (0, 1)])
    assert v.status == "unreadable" and v.message.endswith(error), v.message


def test_a_launch_that_died_is_one_line_without_horovod_s_log():
    from labkit.scale.launch import HorovodRunError
    tail = ["[rank 1] Traceback (most recent call last):", "[rank 1]   File \"my_keras_hvd.py\", line 3, in <module>",
            "[rank 1] MemoryError: Unable to allocate 3.00 GiB", "[rank 0] WARNING:tensorflow:5 out of the last 14 "
            "calls to <function train_function> triggered tf.function retracing." + " x" * 200,
            "[rank 0] [2026-11-26 16:09:57: W horovod/common/stall_inspector.cc:107] One or more tensors were "
            "submitted", "[rank 0] Missing ranks:", "[rank 0] 1: [PartitionedCall/DistributedSGD_Allreduce/cond/"
            "then/_19/HorovodAllreduce_grads_0, ...]"]
    died = check_hvd._launch_failure(HorovodRunError("2 workers: rank 1 exited with code 1", stderr_tail=tail))
    assert died.endswith("the last line it wrote: MemoryError: Unable to allocate 3.00 GiB"), died
    hung = check_hvd._launch_failure(HorovodRunError("2 workers: no result within timeout=300 s",
                                                     stderr_tail=tail[3:], timed_out=True))
    assert "every rank must take part" in hung and "Allreduce" not in hung and "retracing" not in hung, hung
    assert "\n" not in hung and len(hung) < 400


def test_the_scripts_of_one_launch_share_the_offline_set_as_copies(monkeypatch):
    """hvd_harness makes the offline images once per launch; each script gets its own copy, equal to a fresh one."""
    import numpy as np

    from labkit.data import loading
    from labkit.exercises import hvd_harness

    made = []
    original = loading.synthetic
    monkeypatch.setattr(loading, "synthetic", lambda *a, **k: made.append(a or k) or original(*a, **k))
    hvd_harness._share_the_offline_set()
    first, second = (loading.load_dataset("synthetic", n_train=300, n_test=100)[:2] for _ in range(2))
    assert len(made) == 1
    (x, y), (xt, yt) = first
    x[:] = 0  # a script that changes its images in place changes only its own
    fresh = original(300, 100, 0)
    for got, want in zip((*second[0], *second[1]), (*fresh[0], *fresh[1])):
        np.testing.assert_array_equal(got, want)
    loading.load_dataset("synthetic", n_train=200, n_test=100)
    assert len(made) == 2  # another size: made again
