"""labkit.deepdive.tfdist_train: MultiWorkerMirroredStrategy workers on this machine (07_scaling_deep_dive's
tf.distribute comparison; the virtual cluster runs the same workers one per node)."""
from __future__ import annotations

import subprocess

import pytest

from labkit.deepdive import tfdist_train


def test_two_local_workers_train_in_sync():
    workers = tfdist_train.run_local(2, model="small_cnn", batch_size=8, steps=3, timeout=240)
    assert [w["index"] for w in workers] == [0, 1] and all(w["size"] == 2 for w in workers)
    # different random batches per worker, one set of weights: the allreduce made them equal
    assert workers[0]["checksum_trainable"] == workers[1]["checksum_trainable"]
    for w in workers:
        assert len(w["step_times_s"]) == 3 and w["median_step_s"] > 0 and w["cpu_step_time_s"] > 0


def test_failing_workers_raise_with_their_lines_and_leave_nothing_running():
    with pytest.raises(RuntimeError, match="0 of 2 tf.distribute workers") as err:
        tfdist_train.run_local(2, model="nosuchnet", steps=1, timeout=240)
    assert "nosuchnet" in str(err.value)
    # this test's workers only (by their model): the suite runs other tf.distribute launches beside it
    left = subprocess.run(["pgrep", "-f", "labkit.deepdive.tfdist_train.*--model nosuchnet"], capture_output=True,
                          text=True).stdout
    assert not left.strip()


def test_free_ports_are_distinct():
    ports = tfdist_train.free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= p < 65536 for p in ports)


@pytest.mark.parametrize("call, word", [
    (lambda: tfdist_train.run_local(1), "np_"),
    (lambda: tfdist_train.run_workers(["127.0.0.1:1"]), "workers"),
])
def test_bad_input_names_the_parameter(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_the_distributed_part_is_counted_from_this_file():
    """vcluster.tfdist_vs_horovod's line count (it read the file at a path two moves old): the 21 lines
    notebooks/results/tfdist.json holds, as 07 prints them."""
    import json
    from pathlib import Path
    saved = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "results" / "tfdist.json").read_text())
    assert tfdist_train.distributed_lines() == saved["tfdist_distributed_lines"] == 21
