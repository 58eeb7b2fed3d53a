"""The course's Keras scripts never write over a complete checkpoint: the custom loop writes under a temporary name
and renames; the model.fit scripts write a new file each epoch. A kill mid-write keeps the last complete one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ENV, ROOT  # noqa: E402

# Model.save_weights wrapped in the child: every file it is asked to write is recorded
_RECORD_WRITES = """
import runpy, sys
import tensorflow as tf
real, record = tf.keras.Model.save_weights, sys.argv[1] + ".opened"
def save_weights(model, path, *a, **k):
    with open(record, "a") as log:
        log.write(str(path) + "\\n")
    return real(model, path, *a, **k)
tf.keras.Model.save_weights = save_weights
script, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.slow
def test_the_loops_checkpoint_is_renamed_into_place_never_written_in_place(tmp_path):
    checkpoint = tmp_path / "checkpoint.h5"
    script = ROOT / "labkit/scale/keras_hvd_loop.py"
    done = subprocess.run([sys.executable, "-c", _RECORD_WRITES, str(checkpoint), str(script), "--epochs", "2",
                           "--steps", "2", "--batch-size", "8", "--checkpoint", str(checkpoint)],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    opened = (tmp_path / "checkpoint.h5.opened").read_text().split()
    assert len(opened) == 2 and str(checkpoint) not in opened  # one write per epoch, each to another name
    assert checkpoint.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.h5",
                                                                                   "checkpoint.h5.opened"]


def _fit_script_writes(tmp_path, name, *args):
    """The files keras_single.py / keras_hvd.py (one process) asked save_weights for, with 2 epochs."""
    record = tmp_path / "writes"
    script = ROOT / "labkit/scale" / name
    done = subprocess.run([sys.executable, "-c", _RECORD_WRITES, str(record), str(script), "--epochs", "2",
                           "--steps", "2", "--batch-size", "8", *args],
                          capture_output=True, text=True, env={**ENV, "LABKIT_SMOKE": "1"}, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [os.path.basename(p) for p in (tmp_path / "writes.opened").read_text().split()]


@pytest.mark.slow
def test_the_fit_scripts_write_a_new_checkpoint_each_epoch(tmp_path):
    for name in ("keras_single.py", "keras_hvd.py"):
        folder = tmp_path / name
        folder.mkdir()
        opened = _fit_script_writes(folder, name)
        assert opened == ["checkpoint-01.h5", "checkpoint-02.h5"], (name, opened)  # never the same file twice
        assert {p.name for p in folder.glob("checkpoint-*.h5")} == set(opened)
