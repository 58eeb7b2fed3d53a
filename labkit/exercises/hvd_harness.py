"""Run a learner's Keras + Horovod script on one rank and record what it did, for labkit.exercises.check_hvd
(04_horovod_scaling).

    horovodrun -np 2 ... python -m labkit.exercises.hvd_harness --script S [--script S2 ...] -- SCRIPT_ARGS --out DIR

labkit.exercises.check_hvd starts it through labkit.scale.launch. Each script runs with runpy as `__main__` in a fresh
working folder of its own rank (DIR/work/s<script>/rank<R>: a file that every rank writes cannot make one of
them crash; the records say who wrote what), with the same seeds on every rank, so that two ranks fed the same
data see the same batches. What the script does is recorded by patching Keras (labkit.exercises.hvd_record), so any
way of writing it is judged by its effect:
  weights: each rank initialises its own, as real ranks do (they share no seed): every trainable weight gets a
           small rank-dependent nudge the moment a layer creates it, before any of the script's code can
           broadcast it, so that only a broadcast (callback, broadcast_variables before fit or after the first
           batch, in any form) makes the ranks equal (a seed the script sets on every rank does not: the nudge
           comes after it, as a checkpoint restored on rank 0 only would);
  compile: the optimizer (class, Horovod's or not, legacy or Keras 2.11+'s), its learning rate (a schedule:
           its first values);
  fit:     the callbacks (Horovod's are named), steps per epoch, verbose, the first batches' examples
           (a hash per image), the weights' checksum after the first step and at the end, the steps begun,
           the learning rate at each of the first steps, the metrics each epoch ends with;
  save / save_weights / tf.train.Checkpoint: the files each rank writes.
Whether the script imported Horovod, called hvd.init() (hvd.rank(), hvd.size(), hvd.local_size()) and how it
failed (the error's line that names the cause) are recorded too. Each rank is told it runs on a node of its
own (hvd.local_rank() 0, hvd.local_size() 1, as on a cluster with one worker per node), so that a script that
counts the workers with local_size() shows it. Several scripts can share one launch (the tests do): before
each, Keras is cleared and the seeds set again, as in a fresh process; after each, every rank calls hvd.join(),
so that a rank that left a collective early (skipped fit, stopped, ran fewer steps) cannot hang the next
script: the ranks still inside answer with an error or finish, and all start the next script together. But
Horovod stays up from the first hvd.init() of the launch on (a second Gloo rendezvous after hvd.shutdown()
races: a rank may dial its peer's old port), so a script that forgets hvd.init() is only caught before the first
script that calls it ("horovod_up_before" says which case it is).
rank{R}.json holds {"scripts": [record, ...]}.

`--timing` records instead per-step wall times of model.fit (labkit.exercises.fitbench), with no other patch.
`--script S --with=A,B,C` gives S its own arguments (`{workdir}` is its folder); a script run with `--out D`
(labkit.scale.hvd_train) has its D/rank{R}.json kept in its record as "result": fit and the custom loop can then
alternate in one launch, in the same processes.
A leaf: no labkit module imports it (it imports labkit.exercises.hvd_record).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import labkit  # noqa: F401  (TF log level before TensorFlow)
from labkit.exercises.hvd_record import (
    SEED,
    Recorder,
    Timer,
    called_names,
    error_line,
    imports_horovod,
    lr_uses_local_size,
    model_checksums,
)


def env_rank() -> tuple[int, int]:
    """(rank, size) as the launcher set them, whatever the script did with Horovod."""
    for r, s in (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ.get(s, "1"))
    return 0, 1


class _Tee:
    """sys.stderr that also keeps the last lines written (argparse's message, the script's warnings)."""

    def __init__(self, stream):
        self.stream, self.text = stream, ""

    def write(self, s):
        self.text = (self.text + s)[-4000:]
        return self.stream.write(s)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _reset(seed: int):
    """Before each script: the start of a fresh process (the same seeds, an empty Keras session)."""
    import random

    import numpy as np
    import tensorflow as tf
    tf.keras.backend.clear_session()
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


def _share_the_offline_set() -> None:
    """The scripts of one launch load the same offline images (labkit.data.loading.synthetic, deterministic in its
    arguments): made for the first script, copied for the next (each would spend 0.3 s of CPU per rank on them).
    One set is kept, the last asked for."""
    from labkit.data import loading
    made, original = {}, loading.synthetic

    def synthetic(n_train=50000, n_test=10000, seed=0):
        key = (n_train, n_test, seed)
        if key not in made:
            made.clear()
            made[key] = original(n_train, n_test, seed)
        (x, y), (xt, yt) = made[key]
        return (x.copy(), y.copy()), (xt.copy(), yt.copy())

    synthetic.__doc__ = original.__doc__
    loading.synthetic = synthetic


def _eagerly(on: bool) -> None:
    """A checked script's tf.functions (Keras's train step among them) run eagerly: a check judges what the script
    does (weights, collectives, files), not how fast, and tracing each script's step would cost seconds of CPU per
    script and rank. --timing measures model.fit as it runs, traced."""
    import tensorflow as tf
    tf.config.run_functions_eagerly(on)


_SET_ONCE = (("threading", "set_intra_op_parallelism_threads"), ("threading", "set_inter_op_parallelism_threads"),
             ("", "set_visible_devices"), ("experimental", "set_memory_growth"))


def _allow_second_setup():
    """After the first script of a launch TensorFlow's runtime is up: its one-time settings (threads, visible
    GPUs) cannot change any more, so the next scripts' identical calls are let through as no-ops."""
    import tensorflow as tf
    undo = []
    for sub, name in _SET_ONCE:
        owner = getattr(tf.config, sub) if sub else tf.config
        original = getattr(owner, name)

        def tolerant(*args, _original=original, **kwargs):
            try:
                return _original(*args, **kwargs)
            except RuntimeError as err:
                if "initializ" not in str(err):
                    raise

        setattr(owner, name, tolerant)
        undo.append((owner, name, original))
    return lambda: [setattr(o, n, f) for o, n, f in undo]


def _horovod_state() -> dict:
    if "horovod.tensorflow" not in sys.modules:
        return {"initialized": False}
    import horovod.tensorflow as hvd
    if not hvd.is_initialized():
        return {"initialized": False}
    return {"initialized": True, "hvd_rank": hvd.rank(), "hvd_size": hvd.size(), "hvd_local_size": hvd.local_size()}


def _one_node_per_rank():
    """Tell the scripts each rank has a node of its own (hvd.local_rank() 0, local_size() 1, cross_rank() the
    rank): a cluster's layout, on which local_size() and size() differ. Horovod itself keeps the real one."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd_keras

    def local_rank():
        hvd_tf.rank()  # raises as the real one does before hvd.init()
        return 0

    def local_size():
        hvd_tf.size()
        return 1

    for module in (hvd_tf, hvd_keras):
        module.local_rank, module.local_size = local_rank, local_size
        module.cross_rank, module.cross_size = hvd_tf.rank, hvd_tf.size


def _join() -> None:
    """hvd.join() when Horovod is up: wait until every rank has finished the script (a rank still inside a collective
    gets an answer meanwhile)."""
    if "horovod.tensorflow" not in sys.modules:
        return
    import horovod.tensorflow as hvd
    try:
        if hvd.is_initialized():
            hvd.join()
    except Exception:  # a script that shut Horovod down itself
        pass


def run_script(path: str, script_args: list[str], workdir: Path, *, timing: bool = False, first: bool = True) -> dict:
    """Run one script as __main__ in workdir with the recorder installed; its record (never raises).

    first=False: an earlier script of this process has started TensorFlow's runtime (see _allow_second_setup)."""
    rank, size = env_rank()
    src = Path(path).read_text()
    record = {"script": str(path), "rank": rank, "size": size, "imports_horovod": imports_horovod(src),
              "calls": called_names(src), "lr_uses_local_size": lr_uses_local_size(src)}
    _reset(SEED)
    _eagerly(not timing)
    record["horovod_up_before"] = _horovod_state()["initialized"]  # an earlier script of this launch called hvd.init()
    watcher = Timer() if timing else Recorder(rank)
    watcher.install()
    restore_setup = (lambda: None) if first else _allow_second_setup()
    argv, cwd, stderr = sys.argv, os.getcwd(), sys.stderr
    workdir.mkdir(parents=True, exist_ok=True)
    before = {p for p in workdir.rglob("*")}
    t0 = time.perf_counter()
    try:
        os.chdir(workdir)
        sys.argv = [str(path), *script_args]
        sys.stderr = _Tee(stderr)
        sys.path.insert(0, str(Path(path).resolve().parent))  # as `python SCRIPT` does: its folder first
        names = runpy.run_path(str(path), run_name="__main__")
        record["error"] = None
        record["models_end"] = model_checksums(names)
    except SystemExit as stop:  # argparse's exit, or the script's own sys.exit
        code = stop.code
        record["error"] = None if code in (None, 0) else f"SystemExit({code!r})"
        record["exit_code"] = code
    except BaseException as err:  # the learner's bug: recorded, reported in one line by the checker
        record["error"] = error_line(err)
        record["traceback"] = traceback.format_exc()[-3000:]
    finally:
        record["stderr_tail"] = sys.stderr.text.strip().splitlines()[-5:] if isinstance(sys.stderr, _Tee) else []
        sys.argv, sys.stderr = argv, stderr
        if sys.path and sys.path[0] == str(Path(path).resolve().parent):
            del sys.path[0]
        os.chdir(cwd)
        watcher.undo()
        restore_setup()
        _eagerly(False)
    record["wall_s"] = time.perf_counter() - t0
    record.update(_horovod_state())
    _join()
    record.update(watcher.rec)
    record["new_files"] = sorted(str(p.relative_to(workdir)) for p in set(workdir.rglob("*")) - before)
    return record


WITH = "--with="  # --script PATH --with=A,B,C: this script's own arguments instead of the common ones
WORKDIR = "{workdir}"  # in --with: the script's working folder (e.g. labkit.scale.hvd_train's --out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m labkit.exercises.hvd_harness [--timing] --script S [--with=A,B] [--script S2 ...] -- "
              "SCRIPT_ARGS --out DIR",
              file=sys.stderr)
        return 2
    i = argv.index("--")
    own, script_args = argv[:i], argv[i + 1:]
    out = None
    if script_args[-2:-1] == ["--out"]:  # labkit.scale.launch appends --out DIR to every command
        out, script_args = Path(script_args[-1]), script_args[:-2]
    scripts = []  # (path, its own arguments or None for the common ones)
    for j, a in enumerate(own):
        if a == "--script":
            mine = own[j + 2] if j + 2 < len(own) and own[j + 2].startswith(WITH) else None
            scripts.append((own[j + 1], mine[len(WITH):].split(",") if mine else None))
    if not scripts:
        print("labkit.exercises.hvd_harness: give at least one --script PATH", file=sys.stderr)
        return 2
    timing = "--timing" in own
    rank, size = env_rank()
    if not timing and size > 1:
        _one_node_per_rank()
    workroot = (out or Path.cwd()) / "work"
    if len(scripts) > 1:
        _share_the_offline_set()
    records = []
    for k, (path, mine) in enumerate(scripts):
        workdir = workroot / f"s{k}" / f"rank{rank}"
        args = script_args if mine is None else [workdir.as_posix() if a == WORKDIR else a for a in mine]
        records.append(run_script(path, args, workdir, timing=timing, first=k == 0))
        if "--out" in args[:-1]:  # a script that writes rank{R}.json itself (labkit.scale.hvd_train): keep it
            result = Path(args[args.index("--out") + 1]) / f"rank{rank}.json"
            records[-1]["result"] = json.loads(result.read_text()) if result.is_file() else None
    if "horovod.tensorflow" in sys.modules:  # shut down here, not at exit, before the result is written
        import horovod.tensorflow as hvd
        if hvd.is_initialized():
            hvd.shutdown()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        from labkit.base import resultsfile
        # atomic: launch never reads half a file
        resultsfile.write_json(out / f"rank{rank}.json", {"rank": rank, "scripts": records}, indent=None)
    else:
        print(json.dumps({"rank": rank, "scripts": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
