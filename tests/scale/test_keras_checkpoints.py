"""The course's custom-loop Horovod script writes its checkpoint whole under a temporary name and renames it: the
checkpoint file itself is never written in place, so a kill mid-write keeps the last complete one."""
from __future__ import annotations

import subprocess
import sys

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
