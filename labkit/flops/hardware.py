"""GPUs and interconnects the course talks about, and a roofline estimate of CNN time on them (03_flops).

Device numbers are the vendor's datasheet peaks (boost clocks, dense math; sparsity figures halved):
  K80   NVIDIA Tesla K80 datasheet (2014, BD-07317): 8.73 TFLOP/s FP32, 24 GB GDDR5, 480 GB/s per board
        of two GK210 GPUs; frameworks see each GK210 as one GPU, so DEVICES["K80"] is half a board.
  P100  NVIDIA Tesla P100 datasheet (2016), SXM2/NVLink: 10.6 TFLOP/s FP32, 21.2 FP16 (no tensor cores),
        16 GB HBM2, 732 GB/s, NVLink 1 160 GB/s.
  V100  NVIDIA Tesla V100 datasheet (2017), SXM2 16 GB: 15.7 TFLOP/s FP32, 125 tensor (FP16), 900 GB/s,
        NVLink 2 300 GB/s (the GPU of DGX-1 and of the measurement we check against).
  A100  NVIDIA A100 Tensor Core GPU datasheet (2020), SXM4 40 GB: 19.5 TFLOP/s FP32, 156 TF32 tensor,
        312 FP16/BF16 tensor, 1,555 GB/s, NVLink 3 600 GB/s.
  H100  NVIDIA H100 Tensor Core GPU datasheet (2022), SXM5 80 GB: 67 TFLOP/s FP32, 989 TF32 and 1,979
        FP16 tensor "with sparsity" (494.7 and 989.4 dense), 3.35 TB/s, NVLink 4 900 GB/s.
  H200  NVIDIA H200 Tensor Core GPU datasheet (2024), SXM 141 GB HBM3e: 4.8 TB/s, the H100 SXM's compute
        (67 TFLOP/s FP32, 494.7 TF32 and 989.4 FP16/BF16 tensor dense), NVLink 4 900 GB/s.
BF16 runs on the same tensor cores as FP16 at the same peak (A100, H100 and H200 datasheets list one figure for
both), so precision "fp16" stands for either here (2 bytes per value in the roofline).
Interconnects, per direction (datasheets quote NVLink and PCIe both directions added):
  PCIe 3/4/5 x16   8/16/32 GT/s per lane, 128b/130b coding (PCI-SIG base specifications 3.0, 4.0, 5.0)
  NVLink 2/3/4     6/12/18 links x 25 GB/s (V100, A100, H100 datasheets: 300/600/900 GB/s total)
  InfiniBand       EDR 100, HDR 200, NDR 400 Gb/s per 4x port (NVIDIA ConnectX-5/-6/-7 adapter datasheets)

The roofline (Williams, Waterman & Patterson 2009): a layer takes max(FLOPs / peak, bytes / bandwidth),
where bytes = its input + output activations for the batch + its weights, each read or written once.
Training ~ 3 x forward (backward computes gradients for inputs and weights, each ~ one forward), plus an
SGD-momentum update that reads weights, gradients, momentum and writes weights and momentum. It is an
upper bound on speed: real kernels reach part of the peak, and the check against NVIDIA's measured
ResNet-50 throughput (PUBLISHED) shows how much. MEASURED_H200 and MEASURED_H100 hold the figures the project
measured on one H200 and one H100 SXM (with PyTorch, not TensorFlow): GEMM rates, ResNet-50 training and
explicit im2col against cuDNN. MEASURED lists both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.base.checks import check_int, check_number

PRECISIONS = ("fp32", "tf32", "fp16")
_VIEWS = ("InputLayer", "Flatten", "Reshape", "Dropout")  # no data moves at inference


@dataclass(frozen=True)
class Device:
    """One GPU as frameworks see it; peaks in TFLOP/s, memory in GB (1e9 bytes), bandwidth in GB/s."""

    name: str
    model: str
    year: int
    fp32_tflops: float
    tf32_tflops: float | None  # tensor-core TF32, dense (A100 on)
    fp16_tflops: float | None  # tensor-core FP16 dense where there are tensor cores; P100: plain FP16
    tensor_cores: bool
    memory_gb: float
    bandwidth_gbs: float
    interconnect: str
    source: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def peak_flops(self, precision: str = "fp32") -> float:
        """Peak FLOP/s for fp32, tf32 (falls back to fp32 where there is no TF32) or fp16."""
        _check_precision(precision)
        tflops = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops or self.fp32_tflops,
                  "fp16": self.fp16_tflops or self.fp32_tflops}[precision]
        return tflops * 1e12

    def ridge_point(self, precision: str = "fp32") -> float:
        """Arithmetic intensity (FLOP/byte) above which a kernel can be compute-bound."""
        return self.peak_flops(precision) / (self.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class Link:
    """An interconnect; bandwidth per direction in GB/s."""

    name: str
    gbytes_per_s: float
    source: str

    def seconds(self, nbytes: float) -> float:
        """Time to move nbytes one way at the link's peak bandwidth (latency left out)."""
        check_number(nbytes, "nbytes", minimum=0)
        return nbytes / (self.gbytes_per_s * 1e9)


DEVICES = {d.name: d for d in (
    Device("K80", "Tesla K80 (one GK210 of the board)", 2014, 8.73 / 2, None, None, False, 24 / 2, 480 / 2,
           "PCIe 3.0", "NVIDIA Tesla K80 datasheet (2014): board 8.73 TFLOP/s FP32 boost, 24 GB, 480 GB/s"),
    Device("P100", "Tesla P100 SXM2 16 GB", 2016, 10.6, None, 21.2, False, 16, 732,
           "NVLink 1", "NVIDIA Tesla P100 datasheet (2016), NVLink version"),
    Device("V100", "Tesla V100 SXM2 16 GB", 2017, 15.7, None, 125, True, 16, 900,
           "NVLink 2", "NVIDIA Tesla V100 datasheet (2017), SXM2 version"),
    Device("A100", "A100 SXM4 40 GB", 2020, 19.5, 156, 312, True, 40, 1555,
           "NVLink 3", "NVIDIA A100 Tensor Core GPU datasheet (2020), SXM4 40 GB"),
    Device("H100", "H100 SXM5 80 GB", 2022, 67, 494.7, 989.4, True, 80, 3350,
           "NVLink 4",
           "NVIDIA H100 Tensor Core GPU datasheet (2022), SXM5; dense tensor peaks (half the sparsity figures)"),
    Device("H200", "H200 SXM 141 GB", 2024, 67, 494.7, 989.4, True, 141, 4800,
           "NVLink 4", "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM 141 GB HBM3e; dense tensor peaks "
           "(half the sparsity figures), the H100 SXM's compute"),
)}

INTERCONNECTS = {link.name: link for link in (
    Link("PCIe 3.0 x16", 8 * 16 * 128 / 130 / 8, "PCI-SIG PCI Express Base Specification 3.0 (8 GT/s per lane)"),
    Link("PCIe 4.0 x16", 16 * 16 * 128 / 130 / 8, "PCI-SIG PCI Express Base Specification 4.0 (16 GT/s)"),
    Link("PCIe 5.0 x16", 32 * 16 * 128 / 130 / 8, "PCI-SIG PCI Express Base Specification 5.0 (32 GT/s)"),
    Link("NVLink 2", 300 / 2, "NVIDIA Tesla V100 datasheet: NVLink 300 GB/s (6 links, both directions)"),
    Link("NVLink 3", 600 / 2, "NVIDIA A100 datasheet: NVLink 600 GB/s (12 links, both directions)"),
    Link("NVLink 4", 900 / 2, "NVIDIA H100 datasheet: NVLink 900 GB/s (18 links, both directions)"),
    Link("InfiniBand EDR", 100 / 8, "NVIDIA ConnectX-5 datasheet: EDR 100 Gb/s per port"),
    Link("InfiniBand HDR", 200 / 8, "NVIDIA ConnectX-6 datasheet: HDR 200 Gb/s per port"),
    Link("InfiniBand NDR", 400 / 8, "NVIDIA ConnectX-7 datasheet: NDR 400 Gb/s per port"),
)}


@dataclass(frozen=True)
class Measurement:
    """A published, measured training throughput to hold the roofline estimate against."""

    model: str  # a labkit.models name
    device: str
    precision: str
    batch_size: int
    images_per_s: float
    source: str


PUBLISHED = (
    Measurement("resnet50_v1.5", "V100", "fp32", 128, 412,
                "NVIDIA DeepLearningExamples, TensorFlow ResNet-50 v1.5 README, training performance, "
                "1x V100 16GB (DGX-1), FP32 + XLA, TF 20.06-tf1 container"),
    Measurement("resnet50_v1.5", "A100", "tf32", 256, 909,
                "NVIDIA DeepLearningExamples, TensorFlow ResNet-50 v1.5 README, training performance, "
                "1x A100 40GB (DGX A100), TF32 + XLA, TF 20.06-tf1 container"),
)


# the roofline precision whose peak and bytes per value a measured precision uses (see the module docstring)
PEAK_PRECISION = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "fp16"}


@dataclass(frozen=True)
class MeasuredGPU:
    """Figures measured on one real GPU, and how; set beside its datasheet peaks and the roofline (03_flops)."""

    device: str  # a DEVICES name
    gemm_tflops: tuple  # (precision, TFLOP/s of a large dense matrix multiply)
    training: tuple  # Measurement rows
    im2col_vs_cudnn: tuple  # (precision, slowest, fastest) speed of explicit im2col over cuDNN's, per layer
    im2col_layers: str  # what the im2col comparison ran on
    gemm_at_cudnn_rate: int | None  # of those layers, how many the bare matmul ran at cuDNN's speed (None: unrecorded)
    source: str

    def gemm_flops(self, precision: str) -> float:
        """Measured GEMM FLOP/s in one precision."""
        rates = dict(self.gemm_tflops)
        if precision not in rates:
            raise ValueError(f"precision must be one of {', '.join(rates)}; got {precision!r}")
        return rates[precision] * 1e12

    def run(self, precision: str, batch_size: int) -> Measurement:
        """The training measurement at one precision and batch size."""
        for m in self.training:
            if (m.precision, m.batch_size) == (precision, batch_size):
                return m
        known = ", ".join(f"{m.precision} at batch {m.batch_size}" for m in self.training)
        raise ValueError(f"precision and batch_size must name a measured run ({known}); "
                         f"got {precision!r}, {batch_size!r}")

    def step_seconds(self, precision: str = "bf16", batch_size: int = 256) -> float:
        """Seconds per training step of a measured run: batch size / images per second."""
        m = self.run(precision, batch_size)
        return m.batch_size / m.images_per_s


_H200_HOW = ("measured with PyTorch 2.11 (cuDNN 9.19) on one NVIDIA H200, channels-last, synthetic data, "
             "November 2026 — not with this course's TensorFlow")
MEASURED_H200 = MeasuredGPU(
    device="H200",
    gemm_tflops=(("bf16", 806), ("tf32", 422), ("fp32", 50.5)),
    training=tuple(Measurement("resnet50_v1.5", "H200", precision, batch, ips, _H200_HOW + ", "
                               + ("bf16 autocast" if precision == "bf16" else "TF32 matmuls and convolutions"))
                   for precision, batch, ips in (("bf16", 256, 4710), ("tf32", 256, 3187), ("bf16", 64, 3846))),
    im2col_vs_cudnn=(("fp32", 0.16, 0.21), ("bf16", 0.10, 0.16)),
    im2col_layers="ResNet-50's four 3x3 convolutions (conv2_x..conv5_x) at batch 64, unfold + one matmul",
    gemm_at_cudnn_rate=3,
    source=_H200_HOW,
)


_H100_HOW = ("measured with PyTorch 2.11 (cuDNN 9.19) on one NVIDIA H100 80GB HBM3, channels-last, synthetic data, "
             "November 2026 — not with this course's TensorFlow")
MEASURED_H100 = MeasuredGPU(
    device="H100",  # the 80 GB HBM3 card is the SXM5 one (the PCIe card has HBM2e): DEVICES["H100"]'s datasheet
    gemm_tflops=(("bf16", 786.7), ("tf32", 398.9), ("fp32", 51.1)),
    training=tuple(Measurement("resnet50_v1.5", "H100", precision, batch, ips, _H100_HOW + ", "
                               + ("bf16 autocast" if precision == "bf16" else "TF32 matmuls and convolutions"))
                   for precision, batch, ips in (("bf16", 256, 3977), ("tf32", 256, 2528), ("bf16", 64, 2737))),
    im2col_vs_cudnn=(("fp32", 0.16, 0.21), ("bf16", 0.10, 0.17)),
    im2col_layers="ResNet-50's four 3x3 convolutions (conv2_x..conv5_x) at batch 64, unfold + one matmul",
    gemm_at_cudnn_rate=None,
    source=_H100_HOW,
)
MEASURED = {m.device: m for m in (MEASURED_H200, MEASURED_H100)}


def _check_measured(measured):
    if not isinstance(measured, MeasuredGPU):
        raise ValueError(f"measured must be a MeasuredGPU (e.g. MEASURED_H200); got {type(measured).__name__}")


def _check_report(report):
    try:
        check_number(getattr(report, "macs", None), "report.macs", above=0)
    except ValueError:
        raise ValueError(f"report must be a labkit.flops report with macs > 0; got {report!r:.60}") from None


def model_flop_rate(report, images_per_s: float) -> float:
    """Training FLOP/s a model does at images_per_s: 6 x forward MACs per image (2 FLOPs per MAC, 3 x forward)."""
    _check_report(report)
    check_number(images_per_s, "images_per_s", above=0)
    return 6 * report.macs * images_per_s


def gemm_vs_peak(measured=MEASURED_H200):
    """DataFrame per precision: datasheet peak, measured GEMM rate (TFLOP/s) and the fraction of the peak reached."""
    import pandas as pd

    _check_measured(measured)
    device = get_device(measured.device)
    peak = {precision: device.peak_flops(PEAK_PRECISION[precision]) for precision, _ in measured.gemm_tflops}
    rows = [{"precision": precision, "datasheet peak TFLOP/s": peak[precision] / 1e12,
             "measured GEMM TFLOP/s": tflops, "% of peak": round(100 * tflops * 1e12 / peak[precision], 1)}
            for precision, tflops in measured.gemm_tflops]
    return pd.DataFrame(rows).set_index("precision")


def measured_vs_roofline(report, measured=MEASURED_H200):
    """DataFrame per measured training run: images/s, model TFLOP/s, % of the measured GEMM rate and of the
    peak, and the roofline estimate (estimate() on report) for the same device, batch and precision."""
    import pandas as pd

    _check_measured(measured)
    _check_report(report)
    device = get_device(measured.device)
    rows = []
    for m in measured.training:
        rate = model_flop_rate(report, m.images_per_s)
        roof = estimate(report, device, m.batch_size, PEAK_PRECISION[m.precision])["training_images_per_s"]
        rows.append({"precision": m.precision, "batch": m.batch_size, "images/s": m.images_per_s,
                     "ms/step": round(1e3 * measured.step_seconds(m.precision, m.batch_size), 1),
                     "model TFLOP/s": round(rate / 1e12, 1),
                     "% of measured GEMM": round(100 * rate / measured.gemm_flops(m.precision), 1),
                     "% of peak": round(100 * rate / device.peak_flops(PEAK_PRECISION[m.precision]), 1),
                     "roofline images/s": round(roof), "measured / roofline": round(m.images_per_s / roof, 2)})
    return pd.DataFrame(rows)


def _check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def get_device(name) -> Device:
    """A Device by name (K80, P100, V100, A100, H100, H200; case-insensitive) or a Device itself."""
    if isinstance(name, Device):
        return name
    for key, device in DEVICES.items():
        if isinstance(name, str) and key.lower() == name.strip().lower():
            return device
    raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {name!r}")


def device_table():
    """DataFrame of the devices: peaks (TFLOP/s), memory (GB), bandwidth (GB/s), ridge point, source."""
    import pandas as pd

    rows = [{"device": d.name, "model": d.model, "year": d.year, "FP32 TFLOP/s": d.fp32_tflops,
             "TF32 tensor TFLOP/s": d.tf32_tflops, "FP16 TFLOP/s": d.fp16_tflops, "tensor cores": d.tensor_cores,
             "memory GB": d.memory_gb, "bandwidth GB/s": d.bandwidth_gbs,
             "FP32 ridge FLOP/byte": round(d.ridge_point("fp32"), 1), "interconnect": d.interconnect,
             "source": d.source} for d in DEVICES.values()]
    return pd.DataFrame(rows).set_index("device")


def interconnect_table():
    """DataFrame of the interconnects: GB/s per direction and the time to move 100 MB of gradients."""
    import pandas as pd

    return pd.DataFrame([{"link": link.name, "GB/s per direction": round(link.gbytes_per_s, 2),
                          "ms per 100 MB": round(1e3 * link.seconds(100e6), 2), "source": link.source}
                         for link in INTERCONNECTS.values()]).set_index("link")


def layer_roofline(report, device, batch_size: int = 1, precision: str = "fp32"):
    """Per-layer forward roofline at a batch size: FLOPs, bytes, arithmetic intensity, time and the bound.

    report: a labkit.flops report (count it with every count_* option on to include elementwise FLOPs;
    the bytes of those layers are included either way).
    """
    import pandas as pd

    device = get_device(device)
    _check_precision(precision)
    check_int(batch_size, "batch_size", minimum=1)
    bpv = 2 if precision == "fp16" else 4
    peak, bandwidth = device.peak_flops(precision), device.bandwidth_gbs * 1e9
    rows = []
    for r in report.rows:
        moved = 0 if r.type in _VIEWS else batch_size * (r.inputs + r.activations) + r.params
        nbytes, nflops = bpv * moved, batch_size * r.flops
        t_compute, t_memory = nflops / peak, nbytes / bandwidth
        rows.append({"name": r.name, "kind": r.kind, "flops": nflops, "bytes": nbytes,
                     "intensity": nflops / nbytes if nbytes else math.inf,
                     "attainable_tflops": min(peak, (nflops / nbytes if nbytes else math.inf) * bandwidth) / 1e12,
                     "time_s": max(t_compute, t_memory),
                     "bound": "compute" if t_compute >= t_memory else "memory"})
    return pd.DataFrame(rows)


def estimate(report, device, batch_size: int = 32, precision: str = "fp32", optimizer_slots: int = 1) -> dict:
    """Roofline time of a forward pass and of a training step (3 x forward + SGD-momentum update).

    Returns seconds per batch and per image, training images/s, the share of forward time in
    compute-bound layers, and whether the batch fits the device memory (labkit.flops.max_batch_size).
    """
    from labkit import flops as _flops

    optimizer_slots = check_int(optimizer_slots, "optimizer_slots", minimum=0)
    device = get_device(device)
    table = layer_roofline(report, device, batch_size, precision)
    forward = float(table["time_s"].sum())
    bpv = 2 if precision == "fp16" else 4
    # the update reads weight, gradient and optimizer slots, writes weight and slots
    update_bytes = bpv * report.trainable_params * (2 + 2 * optimizer_slots + 1)
    step = 3 * forward + update_bytes / (device.bandwidth_gbs * 1e9)
    max_batch = _flops.max_batch_size(report, device.memory_bytes, optimizer_slots=optimizer_slots)
    return {
        "device": device.name, "precision": precision, "batch_size": batch_size,
        "forward_s": forward, "training_step_s": step,
        "forward_ms_per_image": 1e3 * forward / batch_size,
        "training_ms_per_image": 1e3 * step / batch_size,
        "training_images_per_s": batch_size / step,
        "compute_bound_share": float(table.loc[table["bound"] == "compute", "time_s"].sum() / forward)
        if forward else 0.0,
        "max_batch_size": max_batch, "fits": batch_size <= max_batch,
    }


def compare_published(report_for) -> list:
    """Roofline estimate vs each PUBLISHED measurement; report_for(model_name) gives the report."""
    out = []
    for m in PUBLISHED:
        est = estimate(report_for(m.model), m.device, m.batch_size, m.precision)
        out.append({"model": m.model, "device": m.device, "precision": m.precision, "batch_size": m.batch_size,
                    "measured_images_per_s": m.images_per_s,
                    "roofline_images_per_s": round(est["training_images_per_s"], 1),
                    "measured_over_roofline": round(m.images_per_s / est["training_images_per_s"], 2),
                    "source": m.source})
    return out


def roofline_plot(report, device, batch_size: int = 32, precision: str = "fp32", ax=None):
    """Log-log roofline of one device with every layer of report as a point (size ~ its time)."""
    import matplotlib.pyplot as plt
    import numpy as np

    device = get_device(device)
    table = layer_roofline(report, device, batch_size, precision)
    table = table[(table["bytes"] > 0) & (table["flops"] > 0)]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    peak, bandwidth = device.peak_flops(precision) / 1e12, device.bandwidth_gbs * 1e9 / 1e12
    x = np.logspace(-1, 4, 200)
    ax.plot(x, np.minimum(peak, x * bandwidth), "k-", lw=1.5, label=f"{device.name} {precision} roof")
    colors = {"conv": "tab:blue", "dense": "tab:orange", "norm": "tab:green", "activation": "tab:red",
              "pool": "tab:purple", "elementwise": "tab:brown", "free": "tab:gray"}
    share = table["time_s"] / table["time_s"].sum()
    for kind, group in table.groupby("kind"):
        ax.scatter(group["intensity"], group["attainable_tflops"], s=10 + 400 * share[group.index],
                   alpha=0.6, color=colors.get(kind, "k"), label=kind)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"{report.model}, batch {batch_size}, on {device.name} (point size ~ share of time)")
    ax.legend(fontsize=8, loc="lower right")
    return ax


# ---------------------------------------------------------------- the 03_flops explorer
INPUT_SIZES = (96, 128, 160, 192, 224, 227, 256, 299, 320, 384)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def step_time(model_name: str, input_size: int | None, device, batch_size: int, precision: str = "fp32") -> str:
    """One line: roofline time of a training step of a named model on a device, and whether it fits."""
    from labkit import flops as _flops

    report = _flops.count_named(model_name, input_size, **_flops.ALL_COSTS)
    est = estimate(report, device, batch_size, precision)
    size = report.input_shape[0]
    fits = "fits" if est["fits"] else "does NOT fit"
    return (f"{model_name} at {size}x{size}, batch {batch_size}, {est['device']} {precision}: "
            f"{1e3 * est['training_step_s']:.1f} ms per training step = {est['training_images_per_s']:,.0f} "
            f"images/s (forward {est['forward_ms_per_image']:.3f} ms per image); "
            f"{fits} in {get_device(device).memory_gb:g} GB (largest batch {est['max_batch_size']})")


def step_time_explorer(model_name: str = "resnet50_v1.5", input_size: int = 224, device: str = "V100",
                       batch_size: int = 64, precision: str = "fp32"):
    """ipywidgets: model x input size x GPU x batch x precision -> estimated time per training step."""
    import ipywidgets as widgets

    from labkit.models.imagenet import MODELS

    controls = {
        "model_name": widgets.Dropdown(options=list(MODELS), value=model_name, description="model"),
        "input_size": widgets.Dropdown(options=INPUT_SIZES, value=input_size, description="input"),
        "device": widgets.Dropdown(options=list(DEVICES), value=get_device(device).name, description="GPU"),
        "batch_size": widgets.SelectionSlider(options=BATCH_SIZES, value=batch_size, description="batch"),
        "precision": widgets.ToggleButtons(options=PRECISIONS, value=precision, description="precision"),
    }
    out = widgets.Output()

    def show(**kwargs):
        with out:
            out.clear_output(wait=True)
            print(step_time(**kwargs))

    widgets.interactive_output(show, controls)
    return widgets.VBox([widgets.HBox([controls["model_name"], controls["input_size"], controls["device"]]),
                         widgets.HBox([controls["batch_size"], controls["precision"]]), out])
