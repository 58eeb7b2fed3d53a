"""Bad input is refused before any work, in one clear line that names the parameter: a ValueError/TypeError
for functions, for `labkit` commands one line on stderr and exit status 2 (no traceback).

One test per defect found in review. The functions belong to several modules; each test states the contract,
not the current wording: the parameter's name must appear in the message."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labkit  # noqa: F401  (quiet TensorFlow before anything imports it)
from helpers import labkit_cli  # noqa: E402


def refuses(fn, word: str, *args, **kwargs):
    """fn(*args, **kwargs) raises ValueError or TypeError whose message names `word`."""
    with pytest.raises((ValueError, TypeError)) as err:
        fn(*args, **kwargs)
    assert word in str(err.value), f"the message does not name {word!r}: {err.value}"
    return err.value


def assert_clear_cli(proc, word: str):
    """Exit 2, no traceback, and the last stderr line (argparse puts its usage above it) names `word`."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines and word in lines[-1], f"the error line does not name {word!r}: {proc.stderr[-1000:]}"


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A path no one can create, root included: its parent is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return blocker / "results.json"


@pytest.mark.parametrize("launcher", ["auto", "gloo"])
def test_the_fake_launchers_stand_where_a_launch_looks(fake_launchers, launcher):
    """Good input does reach a fake: the markers below can tell a launch on either path."""
    from labkit.scale import mpi

    env, marker = fake_launchers
    proc = labkit_cli("scale", "--np", "1", "--steps", "1", "--launcher", launcher, env_extra=env)
    assert proc.returncode != 0, "the fake launcher exits 1"
    expected = "mpirun" if launcher == "auto" and mpi.horovod_has_mpi() else "horovodrun"
    assert marker.exists() and marker.read_text().startswith(expected + " "), \
        f"{expected} was not run: {marker.read_text() if marker.exists() else 'no marker'}\n{proc.stderr[-1500:]}"


# --- labkit scale ------------------------------------------------------------------------------------------


def test_scale_timeout_nan(fake_launchers):
    env, marker = fake_launchers
    assert_clear_cli(labkit_cli("scale", "--np", "1", "--timeout", "nan", env_extra=env), "--timeout")
    assert not marker.exists(), marker.read_text()


def test_scale_unwritable_json(fake_launchers, unwritable):
    env, marker = fake_launchers
    assert_clear_cli(labkit_cli("scale", "--np", "1", "--json", str(unwritable), env_extra=env), "--json")
    assert not marker.exists(), marker.read_text()


def test_scale_unknown_model_before_ranks_start(fake_launchers):
    env, marker = fake_launchers
    assert_clear_cli(labkit_cli("scale", "--np", "1", "--model", "resnet51", env_extra=env), "model")
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_scale_bad_threads_before_ranks_start(fake_launchers, threads):
    env, marker = fake_launchers
    assert_clear_cli(labkit_cli("scale", "--np", "1", "--threads", threads, env_extra=env), "--threads")
    assert not marker.exists(), marker.read_text()


# --- labkit conv-bench, sweep, data ------------------------------------------------------------------------


def test_conv_bench_unwritable_json(unwritable):
    assert_clear_cli(labkit_cli("conv-bench", "--json", str(unwritable)), "--json")


def test_sweep_unwritable_out(unwritable):
    assert_clear_cli(labkit_cli("sweep", "--out", str(unwritable.with_suffix(".jsonl"))), "--out")


@pytest.mark.parametrize("argv", [["data", "where"], ["conv-bench"], ["sweep"]], ids=" ".join)
def test_bogus_profile(argv):
    proc = labkit_cli(*argv, env_extra={"LABKIT_PROFILE": "bogus"})
    assert_clear_cli(proc, "LABKIT_PROFILE")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_data_fetch_into_unwritable_dir(unwritable):
    proc = labkit_cli("data", "fetch", "cifar10", "--dir", str(unwritable.parent / "data"))
    assert_clear_cli(proc, "--dir")
    assert proc.stderr.count("\n") == 1


def test_sweep_resume_with_other_settings(tmp_path):
    from labkit.sweep import networks as netsweep
    from labkit.sweep import runner as sweep

    out = tmp_path / "sweep.jsonl"
    cfg = netsweep.network_configs()[0]
    made_with = netsweep.NetworkTrainer.for_profile("quick", epochs=1).settings()
    record = sweep.run_config(lambda c: {"accuracy": 0.5, "memory_bytes": 1000}, cfg,
                              name=netsweep.network_name(cfg), settings=made_with)
    out.write_text(json.dumps(record) + "\n")
    proc = labkit_cli("sweep", "--out", str(out), "--resume", "--epochs", "2", "--configs", netsweep.network_name(cfg))
    assert_clear_cli(proc, "--resume")
    assert "epochs" in proc.stderr


# --- functions -----------------------------------------------------------------------------------------------


def test_training_flops_negative_images():
    from labkit.flops import counter as flops

    report = flops.FlopsReport(model="test", input_shape=(32, 32, 3), rows=[], trainable_params=0)
    refuses(flops.training_flops, "images", report, images=-5)


def _allreduce():
    from labkit.scale import allreduce
    return allreduce


def test_ring_allreduce_negative_alpha():
    refuses(_allreduce().ring_allreduce_time, "alpha", 1e6, 4, alpha=-1, beta=1e-9)


def test_fit_alpha_beta_on_zero_times():
    refuses(_allreduce().fit_alpha_beta, "times", [1e3, 1e6, 1e7], [0.0, 0.0, 0.0], p=2)


def _netsweep():
    from labkit.sweep import networks as netsweep
    return netsweep


def test_matlab_param_count_negative_filters():
    refuses(_netsweep().matlab_param_count, "filters", {"filters": -5, "filter_size": 3, "pool_size": 2})


def test_network_trainer_zero_epochs():
    ns = _netsweep()
    trainer = ns.NetworkTrainer
    refuses(trainer, "epochs", epochs=0)


@pytest.mark.parametrize("x_shape, w_shape, word", [((0, 8, 8, 3), (3, 3, 3, 4), "N"),
                                                    ((1, 8, 8, 0), (3, 3, 0, 4), "C"),
                                                    ((1, 8, 8, 3), (3, 3, 3, 0), "C_out")])
def test_conv2d_im2col_empty_dimensions(x_shape, w_shape, word):
    from labkit.conv import numpy_engine as conv

    refuses(conv.conv2d_im2col, word, np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32))


def test_allreduce_predict_batch_per_gpu_zero():
    refuses(_allreduce().predict, "batch_per_gpu", (1, 2, 4), batch_per_gpu=0)


def test_predict_batch_size_zero():
    import tensorflow as tf

    from labkit.base import training

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, activation="softmax")])
    refuses(training.predict, "batch_size", model, np.zeros((3, 4), np.float32), batch_size=0)


def test_take_slots_non_numeric_slots():
    from labkit.scale.launch import take_slots
    refuses(take_slots, "a:x", ["a:x"], 1)


def test_models_get_input_too_small():
    from labkit import models

    refuses(models.get, "input_shape", "resnet50", input_shape=(4, 4, 3))
