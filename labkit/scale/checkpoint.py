"""A Horovod run's checkpoint: one file every rank can resume from, and its checks (04_horovod_scaling).

Rank 0 of labkit.scale.hvd_train writes `checkpoint.npz` in the run's checkpoint folder through labkit's one
writer (whole or not at all): every model variable, every optimizer variable (the step counter, which drives the
LR schedule, and the momentum slots), and a JSON "meta" entry: the settings the run must keep to continue it
(RUN_KEYS), the global step reached, which is also how many batches each rank has consumed of its shard, and the
run's total steps. On --resume rank 0 reads it and broadcasts it to every rank. `problem(folder, run, resume)` is
the one-line refusal (a checkpoint of another model, worker count, batch or seed; --resume with none; a folder
holding a run not asked to resume), asked by `labkit scale` before any launch and by each rank before any
training. Needs numpy only, never TensorFlow.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

FILE = "checkpoint.npz"
FORMAT = 1
# what a resumed run must share with the checkpoint's: the rest (steps, threads, the launcher) may change
RUN_KEYS = ("model", "size", "batch_size", "seed", "data", "num_examples", "image_size", "classes", "lr",
            "scale_lr", "lr_warmup_steps", "momentum")
# how each RUN_KEY is named to the user (hvd_train's and labkit scale's option)
_OPTION = {"size": "worker count (--np)", "num_examples": "--num-examples", "image_size": "--image-size",
           "batch_size": "--batch-size", "lr_warmup_steps": "--lr-warmup-steps", "scale_lr": "--scale-lr"}


def path(folder) -> Path:
    """The checkpoint file in a run's checkpoint folder."""
    return Path(folder) / FILE


def write(folder, meta: dict, arrays) -> Path:
    """arrays (model then optimizer variables, in order) and meta as folder/checkpoint.npz, atomically."""
    from labkit.base import resultsfile
    buf = io.BytesIO()  # built in memory first: the file on disk is replaced in one step by the one writer
    np.savez(buf, meta=np.array(json.dumps({**meta, "format": FORMAT})),
             **{f"v{i}": np.asarray(a) for i, a in enumerate(arrays)})
    return resultsfile.write_bytes(path(folder), buf.getvalue())


def read_meta(folder) -> dict | None:
    """The checkpoint's meta (its settings, step and total steps), or None where the folder holds none.
    ValueError in one line where the file is not a readable checkpoint."""
    f = path(folder)
    if not f.is_file():
        return None
    try:
        with np.load(f, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"--checkpoint: {f.name} in {folder} is not a readable checkpoint ({err}); "
                         "remove it or choose another folder") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"--checkpoint: {f.name} in {folder} has format {meta.get('format')!r}, not {FORMAT}; "
                         "remove it or choose another folder")
    return meta


def read_arrays(folder) -> list:
    """The checkpoint's arrays, in the order they were written."""
    with np.load(path(folder), allow_pickle=False) as z:
        n = sum(1 for k in z.files if k != "meta")
        return [z[f"v{i}"] for i in range(n)]


def problem(folder, run: dict, resume: bool) -> str | None:
    """Why this run (its RUN_KEYS' values, and total_steps) cannot start with this checkpoint folder, in one
    line, or None: --resume with no checkpoint there, or a checkpoint of another run; a checkpoint there but no
    --resume (a new run would overwrite it); a resumed step past the run's total steps."""
    try:
        meta = read_meta(folder)
    except ValueError as err:
        return str(err)
    if meta is None:
        return (f"--resume: no checkpoint in {folder} to resume from; run once without --resume to start it"
                if resume else None)
    if not resume:
        done = "a finished run" if meta["step"] >= meta["total_steps"] else f"a run stopped at step {meta['step']}"
        return (f"--checkpoint: {folder} already holds {done} of {meta['total_steps']} steps; add --resume to "
                "continue it, or choose another folder")
    for key in RUN_KEYS:
        if key in run and meta.get(key) != run[key]:
            return (f"--resume: the checkpoint in {folder} is of another run: its {_OPTION.get(key, '--' + key)} "
                    f"is {meta.get(key)!r}, this run's is {run[key]!r}")
    if "total_steps" in run and meta["step"] > run["total_steps"]:
        return (f"--resume: the checkpoint in {folder} is at step {meta['step']}, past this run's "
                f"{run['total_steps']} steps (warm-up + steps x repeats); ask for more steps")
    return None


def estimate_bytes(params: int, slots: int = 1) -> int:
    """A checkpoint's size on disk: the weights and the optimizer's slots (float32), plus room for its header."""
    return 4 * params * (1 + slots) + 64 * 1024


def status(folder) -> str:
    """'none' (no checkpoint in folder), 'stopped' (a run to resume) or 'done' (its last step is in it)."""
    meta = read_meta(folder)
    return "none" if meta is None else "done" if meta["step"] >= meta["total_steps"] else "stopped"


if __name__ == "__main__":  # `python -m labkit.scale.checkpoint DIR`: its status, for job scripts (hpc/)
    import sys
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.scale.checkpoint DIR (prints none, stopped or done)")
    try:
        print(status(sys.argv[1]))
    except ValueError as err:
        sys.exit(f"labkit.scale.checkpoint: {err}")
