"""The GPU path checked without a GPU: TensorFlow's CUDA wheels resolve, Horovod's build picks NCCL only with
nvcc and a GPU, each rank pins the GPU of its local rank, mixed precision trains, MFU is computed right."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import labkit  # noqa: F401  (sets TF's log level before TensorFlow loads)
from helpers import ROOT  # noqa: E402  (the repository root, one definition)
from labkit.scale import gpu


# ------------------------------------------------------------------ rank -> GPU pinning
class FakeConfig:
    """Records what pin_to_local_rank asks of tf.config."""

    def __init__(self):
        self.visible, self.growth = [], []


@pytest.fixture
def fake_tf_config(monkeypatch):
    import tensorflow as tf

    rec = FakeConfig()
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda devices, kind=None: rec.visible.append((devices, kind)))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda dev, on: rec.growth.append((dev, on)))
    return rec


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_each_local_rank_sees_only_its_own_gpu(fake_tf_config, local_rank):
    gpus = [f"/physical_device:GPU:{i}" for i in range(4)]
    assert gpu.pin_to_local_rank(local_rank, gpus) == gpus[local_rank]
    assert fake_tf_config.visible == [(gpus[local_rank], "GPU")]
    assert fake_tf_config.growth == [(g, True) for g in gpus]


def test_no_gpu_changes_nothing(fake_tf_config):
    assert gpu.pin_to_local_rank(0, []) is None
    assert fake_tf_config.visible == [] and fake_tf_config.growth == []


def test_more_ranks_than_gpus_is_refused_before_anything_changes(fake_tf_config):
    with pytest.raises(ValueError, match="local_rank 2 .*2 GPU"):
        gpu.pin_to_local_rank(2, ["gpu0", "gpu1"])
    assert fake_tf_config.visible == []


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True, None])
def test_bad_local_rank(bad):
    with pytest.raises(ValueError, match="local_rank"):
        gpu.pin_to_local_rank(bad, ["gpu0"])


def test_default_device_list_is_tensorflows(fake_tf_config, monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["g0", "g1"] if kind == "GPU" else [])
    assert gpu.pin_to_local_rank(1) == "g1"


# ------------------------------------------------------------------ mixed precision on the CPU
def _tiny():
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                                tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10),
                                tf.keras.layers.Softmax()])


def test_two_mixed_precision_steps_on_cpu_train_in_float16_with_float32_variables():
    import tensorflow as tf

    before = tf.keras.mixed_precision.global_policy().name
    r = gpu.images_per_sec(_tiny, batch_size=4, steps=2, mixed=True, warmup_steps=0, image_shape=(8, 8, 3))
    assert np.isfinite(r["loss"])
    assert (r["compute_dtype"], r["variable_dtype"]) == ("float16", "float32")
    assert tf.keras.mixed_precision.global_policy().name == before  # the policy comes back
    plain = gpu.images_per_sec(_tiny, batch_size=4, steps=2, mixed=False, warmup_steps=0, image_shape=(8, 8, 3))
    assert (plain["compute_dtype"], plain["variable_dtype"]) == ("float32", "float32")


def test_loss_scaling_only_under_float16():
    import tensorflow as tf

    sgd = tf.keras.optimizers.SGD(0.1)
    assert gpu.loss_scaled(sgd) is sgd
    with gpu.mixed_precision(True) as policy:
        assert policy == "mixed_float16"
        wrapped = gpu.loss_scaled(tf.keras.optimizers.SGD(0.1))
        assert isinstance(wrapped, tf.keras.mixed_precision.LossScaleOptimizer)
        assert gpu.loss_scaled(wrapped) is wrapped
    with gpu.mixed_precision(False) as policy:
        assert policy == tf.keras.mixed_precision.global_policy().name != "mixed_float16"


def test_mixed_precision_wants_a_bool():
    with pytest.raises(TypeError, match="enabled"):
        with gpu.mixed_precision("yes"):
            pass


# ------------------------------------------------------------------ MFU
def test_mfu_by_hand():
    # 2 GFLOP forward per image, 100 images/s -> 3 x 2e9 x 100 = 6e11 FLOP/s of training; peak 1.2e12 -> 0.5
    assert gpu.mfu(100, 2e9, 1.2e12) == pytest.approx(0.5)
    # nanoGPT's example scale: an H100's 989.4 TFLOP/s fp16 dense peak, 40 % used
    assert gpu.mfu(1000, 0.4 * 989.4e12 / 3000, 989.4e12) == pytest.approx(0.4)


@pytest.mark.parametrize("kwargs", [dict(images_per_sec=0), dict(forward_flops_per_image=-1),
                                    dict(peak_flops=float("nan")), dict(images_per_sec=True)])
def test_mfu_bad_input_names_the_parameter(kwargs):
    args = dict(images_per_sec=10.0, forward_flops_per_image=1e9, peak_flops=1e12) | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        gpu.mfu(**args)


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "fp16", 989.4),      # H100 datasheet, dense tensor FP16
    ("NVIDIA A100-SXM4-40GB", "tf32", 156),         # A100 datasheet, TF32 tensor
    ("Tesla V100-SXM2-16GB", "fp32", 15.7),         # V100 datasheet, FP32
])
def test_peak_of_a_named_gpu_is_its_datasheet(name, precision, tflops):
    peak, source = gpu.peak_flops(name, precision)
    assert peak == pytest.approx(tflops * 1e12) and "datasheet" in source


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="not in labkit.flops.hardware"):
        gpu.peak_flops("Radeon 9700")


# ------------------------------------------------------------------ Horovod's build flags
def _fake_bin(d: Path, nvcc: bool, smi: str | None) -> Path:
    d.mkdir()
    if nvcc:
        (d / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.2, V12.2.140'\n")
    if smi == "gpu":
        (d / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    elif smi == "no-driver":  # the tool is installed, the driver/GPU is not
        (d / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no NVIDIA driver' >&2\nexit 9\n")
    for f in d.iterdir():
        f.chmod(0o755)
    return d


@pytest.mark.parametrize("nvcc, smi, nccl", [
    (True, "gpu", True),           # a GPU node with the CUDA toolkit: NCCL
    (True, "no-driver", False),    # this kind of machine: nvcc installed, no GPU
    (False, "gpu", False),         # a GPU without a toolkit: no CUDA build possible, CPU ops only
    (False, None, False),          # a laptop
])
def test_build_horovod_picks_nccl_only_with_nvcc_and_a_gpu(tmp_path, nvcc, smi, nccl):
    fake = _fake_bin(tmp_path / "bin", nvcc, smi)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PATH=f"{fake}:/usr/bin:/bin", PYTHON=sys.executable)  # /usr/local/bin (a real nvcc) left out
    proc = subprocess.run(["bash", str(ROOT / "scripts/build-horovod.sh"), "--print-flags"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    flags = dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)
    assert flags.get("HOROVOD_WITH_GLOO") == "1" and flags.get("HOROVOD_WITH_TENSORFLOW") == "1"
    assert (flags.get("HOROVOD_GPU_OPERATIONS") == "NCCL") is nccl
    assert ("nccl" in flags["ops"]) is nccl
    if smi == "gpu" and not nvcc:
        assert "nvcc" in proc.stderr  # says why the GPU is not used


# ------------------------------------------------------------------ TensorFlow's CUDA wheels
def test_tensorflow_and_cuda_resolves_for_manylinux_x86_64(tmp_path):
    """pip's resolver finds tensorflow[and-cuda]==2.15.1 and all its CUDA wheels for a Linux x86-64 GPU node
    (resolved only: nothing is installed)."""
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "tensorflow", "--retries", "0",
                            "--timeout", "15"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or "2.15.1" not in probe.stdout:
        pytest.skip("the package index cannot be reached (offline?): pip cannot be asked which wheels exist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--target", str(tmp_path / "t"),
         "--report", str(tmp_path / "report.json"), "--quiet", "tensorflow[and-cuda]==2.15.1"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
           for i in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert got["tensorflow"] == "2.15.1"
    for wheel in ("nvidia-cudnn-cu12", "nvidia-nccl-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"):
        assert wheel in got, f"{wheel} missing from tensorflow[and-cuda]'s resolution"
    assert got["nvidia-cudnn-cu12"].startswith("8.9")  # TF 2.15 is built against cuDNN 8.9 (TF's tested builds)


# ------------------------------------------------------------------ one device per run, never a mix
def test_a_rank_on_the_cpu_hides_every_gpu(fake_tf_config):
    gpus = ["g0", "g1"]
    assert gpu.place_rank(0, 4, None, gpus) is None  # 4 ranks on a 2-GPU node: the CPU for all, no failure
    assert fake_tf_config.visible == [([], "GPU")]
    assert gpu.place_rank(1, 2, None, gpus) == "g1"  # a GPU for each: the local rank's
    assert gpu.place_rank(0, 2, "cpu", gpus) is None and fake_tf_config.visible[-1] == ([], "GPU")
    with pytest.raises(ValueError, match="local_rank 2 .*2 GPU"):
        gpu.place_rank(2, 4, "gpu", gpus)  # asked for: refused with the reason
    with pytest.raises(ValueError, match="device 'gpu': TensorFlow sees no GPU"):
        gpu.place_rank(0, 1, "gpu", [])
    with pytest.raises(ValueError, match="^device must be"):
        gpu.place_rank(0, 1, "tpu", gpus)
    assert gpu.place_rank(0, 1, None, []) is None  # no GPU: nothing changes


def test_cpu_peak_is_tensorflows_own_matmul_not_numpys(monkeypatch):
    from labkit.base import timing
    monkeypatch.setattr(timing, "gemm_rate", lambda *a, **k: pytest.fail("the CPU peak read numpy's GEMM"))
    peak, source = gpu.peak_flops("CPU", gemm_size=256)
    assert 1e8 < peak < 1e13 and "TensorFlow" in source


def test_tf_gemm_rate_times_the_product():
    """n = 1024 does 512x the FLOPs of n = 128: its time per call must grow far more than 4x (it is not skipped)."""
    small, large = gpu.tf_gemm_rate(128, repeats=3), gpu.tf_gemm_rate(1024, repeats=3)
    assert 2 * 1024 ** 3 / large > 4 * (2 * 128 ** 3 / small)
    with pytest.raises(ValueError, match="repeats"):
        gpu.tf_gemm_rate(64, repeats=0)


def test_mfu_above_100_percent_says_the_peak_is_not_one():
    fine = gpu.mfu_line(100, 2e9, 1.2e12, "test")
    assert fine == "MFU = 50 % of 1,200 GFLOP/s (test)"
    over = gpu.mfu_line(10424, 102.7e9 / 3 / 10424, 63e9, "numpy's GEMM")  # 07's committed output: 163 %
    assert over.startswith("MFU = 163 %") and "not this device's peak" in over and "\n" not in over


@pytest.mark.slow
def test_small_cnn_training_stays_below_tensorflows_matmul_peak():
    """The claim of 07's MFU cell: with the peak measured by the engine the training uses, MFU < 100 %."""
    from labkit import flops, models
    rate = gpu.images_per_sec(lambda: models.get("small_cnn"), batch_size=64, steps=5)
    peak, _ = gpu.peak_flops("CPU")
    assert gpu.mfu(rate["images_per_sec"], flops.count(models.get("small_cnn")).flops, peak) < 1
