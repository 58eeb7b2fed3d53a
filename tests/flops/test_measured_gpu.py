"""labkit.flops.hardware's H200: datasheet peaks, the project's measurement and what the lesson derives from it."""
from __future__ import annotations

import pytest

import labkit  # noqa: F401
from labkit.flops import counter as flops
from labkit.flops import hardware

tf = pytest.importorskip("tensorflow")

# NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100 SXM's compute (dense), 141 GB HBM3e at 4.8 TB/s
H200_PEAKS = {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12}
# what the project measured with PyTorch on one H200 (typed in from its run notes, not from the module)
GEMM = {"bf16": 806e12, "tf32": 422e12, "fp32": 50.5e12}
RESNET50_V15_MACS = 4.09e9  # torchvision's resnet50 (v1.5), the network PyTorch trained


@pytest.fixture(scope="module")
def report():
    return flops.count_named("resnet50_v1.5", **flops.ALL_COSTS)


def test_h200_is_the_datasheet():
    h200 = hardware.get_device("h200")
    for precision, peak in H200_PEAKS.items():
        assert h200.peak_flops(precision) == pytest.approx(peak)
    assert (h200.memory_gb, h200.bandwidth_gbs, h200.interconnect) == (141, 4800, "NVLink 4")
    assert hardware.get_device("H100").peak_flops("fp16") == h200.peak_flops("fp16")  # same compute
    assert h200.ridge_point("fp16") == pytest.approx(989.4e12 / 4.8e12)
    assert "H200 Tensor Core GPU datasheet" in h200.source


def test_gemm_fraction_of_peak():
    table = hardware.gemm_vs_peak()
    for precision, rate in GEMM.items():
        peak = H200_PEAKS["fp16" if precision == "bf16" else precision]  # bf16 runs at the FP16 tensor peak
        assert table.loc[precision, "% of peak"] == pytest.approx(100 * rate / peak, abs=0.05)
    assert table.loc["bf16", "% of peak"] == pytest.approx(81.5, abs=0.1)  # 806 / 989.4


def test_resnet50_counts_as_the_course_teaches(report):
    # 03_flops and torchvision: ResNet-50 v1.5 is 4.09 G MACs (v1: 3.86 G)
    assert report.macs == pytest.approx(RESNET50_V15_MACS, rel=1e-3)
    assert hardware.model_flop_rate(report, 4710) == pytest.approx(4710 * 6 * 4.09e9, rel=1e-3)  # ~1.156e14
    assert hardware.model_flop_rate(report, 4710) == pytest.approx(1.156e14, rel=2e-3)


def test_measured_against_gemm_peak_and_roofline(report):
    table = hardware.measured_vs_roofline(report).set_index(["precision", "batch"])
    bf16 = table.loc[("bf16", 256)]
    assert bf16["ms/step"] == pytest.approx(54.4, abs=0.05)  # 256 images / 4,710 images/s
    assert hardware.MEASURED_H200.step_seconds("bf16", 256) == pytest.approx(256 / 4710)
    assert bf16["model TFLOP/s"] == pytest.approx(115.6, abs=0.1)
    assert bf16["% of measured GEMM"] == pytest.approx(100 * 4710 * 6 * 4.09e9 / 806e12, abs=0.1)  # ~14 %
    assert bf16["% of peak"] == pytest.approx(100 * 4710 * 6 * 4.09e9 / 989.4e12, abs=0.1)  # ~12 %
    tf32 = table.loc[("tf32", 256)]
    assert tf32["% of measured GEMM"] == pytest.approx(100 * 3187 * 6 * 4.09e9 / 422e12, abs=0.1)
    # the roofline: the H200 has the H100's compute and more bandwidth, so it is faster, by at most the
    # bandwidth ratio; and an upper bound, so above every measurement
    h100 = hardware.estimate(report, "H100", 256, "fp16")["training_images_per_s"]
    assert h100 < bf16["roofline images/s"] <= h100 * 4800 / 3350
    assert (table["measured / roofline"] < 1).all()
    # no run beats pure compute at the measured GEMM rate: 6 x MACs per image
    assert (table["images/s"] < 806e12 / (6 * 4.09e9)).all()


def test_im2col_record():
    h200 = hardware.MEASURED_H200
    assert {p: (lo, hi) for p, lo, hi in h200.im2col_vs_cudnn} == {"fp32": (0.16, 0.21), "bf16": (0.10, 0.16)}
    assert h200.gemm_at_cudnn_rate == 3 and "four 3x3" in h200.im2col_layers
    for text in ("PyTorch 2.11", "cuDNN 9.19", "NVIDIA H200", "channels-last", "synthetic data", "November 2026",
                 "not with this course's TensorFlow"):
        assert text in h200.source


def test_bad_arguments_name_the_parameter(report):
    h200 = hardware.MEASURED_H200
    for bad in (0, -5, float("nan"), "4710", True):
        with pytest.raises(ValueError, match="images_per_s"):
            hardware.model_flop_rate(report, bad)
    with pytest.raises(ValueError, match="report"):
        hardware.model_flop_rate(object(), 10)
    with pytest.raises(ValueError, match="measured"):
        hardware.gemm_vs_peak("H200")
    with pytest.raises(ValueError, match="measured"):
        hardware.measured_vs_roofline(report, measured=None)
    with pytest.raises(ValueError, match="report"):
        hardware.measured_vs_roofline(None)
    with pytest.raises(ValueError, match="precision"):
        h200.gemm_flops("fp16")
    with pytest.raises(ValueError, match="precision and batch_size"):
        h200.step_seconds("fp32", 256)


# the H100 (80GB HBM3: the SXM5 card), measured the same way (typed in from the run notes, not from the module)
H100_GEMM = {"bf16": 786.7e12, "tf32": 398.9e12, "fp32": 51.1e12}
H100_RUNS = {("bf16", 256): 3977, ("tf32", 256): 2528, ("bf16", 64): 2737}


def test_h100_record_beside_the_h200(report):
    h100 = hardware.MEASURED_H100
    assert hardware.MEASURED == {"H200": hardware.MEASURED_H200, "H100": h100}
    assert (hardware.get_device(h100.device).memory_gb, hardware.get_device(h100.device).bandwidth_gbs) == (80, 3350)
    gemm = hardware.gemm_vs_peak(h100)
    for precision, rate in H100_GEMM.items():
        peak = H200_PEAKS["fp16" if precision == "bf16" else precision]  # the H100 SXM's datasheet: the same peaks
        assert gemm.loc[precision, "% of peak"] == pytest.approx(100 * rate / peak, abs=0.05)
    assert gemm.loc["bf16", "% of peak"] == pytest.approx(79.5, abs=0.05)  # 786.7 / 989.4
    runs = hardware.measured_vs_roofline(report, h100).set_index(["precision", "batch"])
    for key, ips in H100_RUNS.items():
        assert runs.loc[key, "images/s"] == ips
    bf16 = runs.loc[("bf16", 256)]
    assert bf16["ms/step"] == 64.4  # the run notes: 64.4 ms a step (256 / 3,977)
    assert bf16["model TFLOP/s"] == 97.6  # the run notes: 97.6 TFLOP/s of model FLOPs (6 x 4.09 G x 3,977)
    assert bf16["% of measured GEMM"] == pytest.approx(100 * 97.6e12 / 786.7e12, abs=0.1)  # ~12 %
    assert (runs["measured / roofline"] < 1).all() and (runs["images/s"] < 786.7e12 / (6 * 4.09e9)).all()
    # the H200 trains 1.18x faster at the same compute (GEMM within 3 %): its memory bandwidth, 4.8 against 3.35 TB/s
    assert round(4710 / 3977, 2) == 1.18 and abs(806 / 786.7 - 1) < 0.03
    assert {p: (lo, hi) for p, lo, hi in h100.im2col_vs_cudnn} == {"fp32": (0.16, 0.21), "bf16": (0.10, 0.17)}
    assert h100.gemm_at_cudnn_rate is None and "four 3x3" in h100.im2col_layers
    for text in ("PyTorch 2.11", "cuDNN 9.19", "NVIDIA H100 80GB HBM3", "channels-last", "synthetic data",
                 "November 2026", "not with this course's TensorFlow"):
        assert text in h100.source
    assert all(m.device == "H100" and h100.source in m.source for m in h100.training)
