"""labkit.flops.hardware: datasheet numbers typed from NVIDIA's datasheets, the roofline by hand, a measured check."""
from __future__ import annotations

import math

import pytest

import labkit  # noqa: F401
from labkit.flops import counter as flops
from labkit.flops import hardware

tf = pytest.importorskip("tensorflow")
L = tf.keras.layers
ALL = dict(count_bias=True, count_bn=True, count_activations=True, count_pooling=True, count_elementwise=True)

# (FP32 TFLOP/s, memory GB, GB/s) per GPU as frameworks see it; K80's board numbers halved
DATASHEETS = {"K80": (8.73 / 2, 12, 240), "P100": (10.6, 16, 732), "V100": (15.7, 16, 900),
              "A100": (19.5, 40, 1555), "H100": (67, 80, 3350),
              "H200": (67, 141, 4800)}


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_devices_match_datasheets(name):
    device = hardware.get_device(name)
    tflops, memory_gb, bandwidth = DATASHEETS[name]
    assert device.peak_flops("fp32") == pytest.approx(tflops * 1e12)
    assert device.memory_bytes == pytest.approx(memory_gb * 1e9)
    assert device.bandwidth_gbs == bandwidth
    assert "datasheet" in device.source


def test_tensor_core_peaks():
    assert hardware.get_device("V100").peak_flops("fp16") == pytest.approx(125e12)
    assert hardware.get_device("A100").peak_flops("tf32") == pytest.approx(156e12)
    assert hardware.get_device("A100").peak_flops("fp16") == pytest.approx(312e12)
    assert hardware.get_device("H100").peak_flops("fp16") == pytest.approx(1979e12 / 2, rel=1e-3)  # dense
    # no TF32 before Ampere, no fast FP16 on Kepler: the FP32 peak applies
    assert hardware.get_device("V100").peak_flops("tf32") == pytest.approx(15.7e12)
    assert hardware.get_device("k80").peak_flops("fp16") == pytest.approx(8.73e12 / 2)
    assert hardware.get_device("V100").ridge_point() == pytest.approx(15.7e12 / 900e9)


def test_interconnects():
    links = hardware.INTERCONNECTS
    assert links["PCIe 3.0 x16"].gbytes_per_s == pytest.approx(15.75, abs=0.01)
    assert links["PCIe 5.0 x16"].gbytes_per_s == pytest.approx(4 * links["PCIe 3.0 x16"].gbytes_per_s)
    for name, total in (("NVLink 2", 300), ("NVLink 3", 600), ("NVLink 4", 900)):
        assert 2 * links[name].gbytes_per_s == total
    assert [links[f"InfiniBand {g}"].gbytes_per_s for g in ("EDR", "HDR", "NDR")] == [12.5, 25, 50]
    assert links["InfiniBand EDR"].seconds(100e6) == pytest.approx(8e-3)
    assert len(hardware.interconnect_table()) == 9 and len(hardware.device_table()) == 6


def test_roofline_by_hand():
    x = tf.keras.Input((1000,))
    model = tf.keras.Model(x, L.Dense(1000, use_bias=False, name="d")(x))  # 1e6 MACs, 1e6 weights
    report = flops.count(model)
    v100 = hardware.get_device("V100")
    row = hardware.layer_roofline(report, v100, batch_size=8).set_index("name").loc["d"]
    assert row["flops"] == 8 * 2e6
    assert row["bytes"] == 4 * (8 * 2000 + 1e6)
    assert row["time_s"] == pytest.approx(max(16e6 / 15.7e12, 4 * (16000 + 1e6) / 900e9))
    assert row["bound"] == "memory"  # 3.9 FLOP/byte is below V100's ridge of 17.4
    big = hardware.layer_roofline(report, v100, batch_size=4096).set_index("name").loc["d"]
    assert big["bound"] == "compute" and big["intensity"] > v100.ridge_point()
    est = hardware.estimate(report, v100, batch_size=8)
    update = 4 * 1e6 * 5 / 900e9  # read weight, gradient, momentum; write weight, momentum
    assert est["training_step_s"] == pytest.approx(3 * row["time_s"] + update)
    assert est["training_images_per_s"] == pytest.approx(8 / est["training_step_s"])


def test_newer_gpus_are_faster_and_hold_bigger_batches():
    report = flops.count_named("resnet50_v1.5", **ALL)
    estimates = [hardware.estimate(report, name, batch_size=32)
                 for name in ("K80", "P100", "V100", "A100", "H100", "H200")]
    speeds = [e["training_images_per_s"] for e in estimates]
    assert speeds == sorted(speeds)
    batches = [e["max_batch_size"] for e in estimates]
    assert batches == sorted(batches) and batches[0] >= 32


def test_estimate_against_nvidias_measured_resnet50_throughput():
    # NVIDIA DeepLearningExamples: 412 img/s (V100, FP32) and 909 img/s (A100, TF32), ResNet-50 v1.5 training
    rows = hardware.compare_published(lambda name: flops.count_named(name, **ALL))
    assert {(r["device"], r["measured_images_per_s"]) for r in rows} == {("V100", 412), ("A100", 909)}
    report = flops.count_named("resnet50_v1.5")
    for r in rows:
        # no measurement beats pure compute at peak: 3 x forward FLOPs / peak FLOP/s
        compute_only = hardware.get_device(r["device"]).peak_flops(r["precision"]) / (3 * report.flops)
        assert r["measured_images_per_s"] < compute_only
        # and the roofline estimate lands within 2x of what NVIDIA measured
        assert 0.5 <= r["measured_over_roofline"] <= 1.1


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="device"):
        hardware.get_device("T4")
    with pytest.raises(ValueError, match="precision"):
        hardware.get_device("V100").peak_flops("fp64")
    report = flops.count_named("resnet18")
    with pytest.raises(ValueError, match="batch_size"):
        hardware.estimate(report, "V100", batch_size=0)
    assert math.isfinite(hardware.estimate(report, "V100", batch_size=1)["forward_s"])
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="optimizer_slots"):
            hardware.estimate(report, "V100", batch_size=8, optimizer_slots=bad)
        with pytest.raises(ValueError, match="batch_size"):
            hardware.layer_roofline(report, "V100", batch_size=bad if bad != 1.5 else 0)
    with pytest.raises(ValueError, match="nbytes"):
        hardware.INTERCONNECTS["NVLink 2"].seconds(-5)


def test_roofline_plot_draws_every_kind():
    import matplotlib

    matplotlib.use("Agg")
    ax = hardware.roofline_plot(flops.count_named("resnet18", **ALL), "V100", batch_size=16)
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"conv", "dense", "norm"} <= labels


def test_step_time_line_and_explorer():
    line = hardware.step_time("resnet18", 64, "K80", 8)
    assert line.startswith("resnet18 at 64x64, batch 8, K80 fp32:") and "fits in 12 GB" in line
    assert "does NOT fit" in hardware.step_time("vgg16", None, "K80", 512)
    widget = hardware.step_time_explorer("resnet18", 128, "A100", 16, "tf32")
    assert len(widget.children) == 3
