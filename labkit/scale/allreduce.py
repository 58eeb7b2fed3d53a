"""The ring-allreduce cost model, its calibration here, and the extrapolation to many GPUs (04_horovod_scaling).

1. Ring allreduce: T(n, p) = 2(p-1) alpha + 2 (p-1)/p n beta (+ (p-1)/p n gamma for the reduction),
   applied per fusion buffer (Horovod's tensor fusion packs many small gradients into one buffer,
   paying alpha once). `calibrate_allreduce()` measures alpha and beta here with 2 ranks.
2. A step-time model: compute time (measured, or FLOPs / (peak x utilisation) for a GPU) plus the part of
   the communication that does not overlap it, giving throughput and efficiency for 1..512 GPUs.
   GPU peaks come from labkit.flops.hardware, model MACs and parameters from labkit.flops.
   It is a model, not a measurement: `published()` holds the measured numbers it is set beside.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from labkit.base.checks import check_int, check_number

MiB = 2**20
# Horovod 0.28.1's tensor-fusion buffer when HOROVOD_FUSION_THRESHOLD is unset: 128 * 1024 * 1024 bytes, set in
# BackgroundThreadLoop (horovod/common/operations.cc); its docs/tensor-fusion.rst and `horovodrun --help` say 128 MB
# too (since v0.24.0)
FUSION_THRESHOLD = 128 * MiB


# ----------------------------------------------------------------------------------------------
# 1. the ring-allreduce cost model

def ring_allreduce_time(n_bytes, p: int, alpha: float, beta: float, gamma: float = 0.0):
    """Ring allreduce of n_bytes on p workers: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.

    alpha: seconds per message (latency), beta: seconds per byte on the wire, gamma: seconds per byte
    to add (the reduction). Reduce-scatter then allgather: 2(p-1) steps, each moving n/p bytes.
    """
    check_int(p, "p", minimum=1)  # workers
    for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        check_number(value, name, minimum=0)
    if np.any(np.asarray(n_bytes) < 0):
        raise ValueError("n_bytes must be >= 0")
    if p == 1:
        return 0.0 * np.asarray(n_bytes, dtype=float) if np.ndim(n_bytes) else 0.0
    frac = (p - 1) / p
    return 2 * (p - 1) * alpha + 2 * frac * np.asarray(n_bytes, dtype=float) * beta \
        + frac * np.asarray(n_bytes, dtype=float) * gamma


def fusion_buffers(tensor_bytes, threshold: float = FUSION_THRESHOLD) -> list[int]:
    """Horovod's tensor fusion: pack ready gradients, in order, into buffers of at most `threshold` bytes.

    threshold=0 turns fusion off (one allreduce per tensor); a tensor bigger than the threshold
    travels alone. Default: Horovod's own (FUSION_THRESHOLD, 128 MiB).
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 bytes; got {threshold}")
    buffers, cur = [], 0
    for t in tensor_bytes:
        t = int(t)
        if threshold == 0 or t >= threshold:
            if cur:
                buffers.append(cur)
                cur = 0
            buffers.append(t)
        elif cur + t > threshold:
            buffers.append(cur)
            cur = t
        else:
            cur += t
    if cur:
        buffers.append(cur)
    return buffers


@dataclass
class AllreduceModel:
    """alpha (s/message), beta (s/byte) and gamma (s/byte, reduction) for one network; see ring_allreduce_time."""
    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""

    def time(self, n_bytes, p):
        return ring_allreduce_time(n_bytes, p, self.alpha, self.beta, self.gamma)

    def fused_time(self, tensor_bytes, p, threshold=FUSION_THRESHOLD) -> float:
        """Total time of the allreduces one step needs after tensor fusion."""
        return float(sum(self.time(b, p) for b in fusion_buffers(tensor_bytes, threshold)))

    @property
    def bandwidth(self) -> float:
        """bytes/s the wire term corresponds to (1 / beta)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf


def fit_alpha_beta(n_bytes, times, p: int = 2, name="calibrated") -> AllreduceModel:
    """Fit T = 2(p-1) alpha + 2(p-1)/p n beta to measured allreduce times (relative least squares).

    With one p the reduction term cannot be told apart from the wire term: it is folded into beta.
    """
    n = np.asarray(n_bytes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("need at least two (n_bytes, time) pairs of equal length")
    if p < 2:
        raise ValueError(f"calibration needs p >= 2 workers; got {p}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"times must be finite and > 0 seconds; got {t.tolist()}")
    if not np.all(np.isfinite(n)) or np.any(n < 0):
        raise ValueError(f"n_bytes must be finite and >= 0; got {n.tolist()}")
    w = 1.0 / t  # relative errors: small and large messages count alike
    A = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return AllreduceModel(alpha=max(float(alpha), 0.0), beta=max(float(beta), 1e-15), name=name)


def calibrate_allreduce(np_: int = 2, sizes=(4, 4096, 65536, 262144, 1048576, 4 * MiB), repeats=5,
                        chain=20, threads=1, launcher="auto", timeout=180, env_extra=None):
    """Time hvd.allreduce over message sizes on np_ ranks; returns (DataFrame, fitted AllreduceModel)."""
    import pandas as pd

    from labkit.scale.launch import launch
    args = ["--bench-allreduce", "--sizes", ",".join(str(int(s)) for s in sizes), "--repeats", repeats,
            "--chain", chain, "--threads", threads]
    ranks = launch(np_, args, launcher=launcher, timeout=timeout, progress=False, env_extra=env_extra,
                   label=f"allreduce np={np_}")
    # a collective finishes when the slowest rank does: take the max over ranks per size
    df = pd.DataFrame([{"bytes": row["bytes"], "rank": r["rank"], "time_s": row["time_s"]}
                       for r in ranks for row in r["allreduce"]])
    df = df.groupby("bytes", as_index=False)["time_s"].max()
    model = fit_alpha_beta(df["bytes"], df["time_s"], p=np_, name=f"this machine ({np_} ranks)")
    df["model_s"] = model.time(df["bytes"].to_numpy(), np_)
    return df, model


# ----------------------------------------------------------------------------------------------
# 2. step-time model and extrapolation

def step_time(p: int, compute_s: float, tensor_bytes, net: AllreduceModel, overlap: float = 0.0,
              threshold=FUSION_THRESHOLD) -> float:
    """Compute time plus the communication that does not hide behind it.

    overlap in [0, 1]: the fraction of the allreduce that runs during backprop (Horovod starts reducing
    the last layers' gradients while earlier layers still compute). Hidden time never exceeds compute.
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1]; got {overlap}")
    if compute_s < 0:
        raise ValueError(f"compute_s must be >= 0; got {compute_s}")
    comm = net.fused_time(tensor_bytes, p, threshold)
    return compute_s + comm - min(overlap * comm, compute_s)


# The networks the published results ran (labkit.models names); inception_v3 is keras.applications'.
MODELS = ("alexnet", "vgg16", "resnet50", "resnet101", "inception_v3")
# Network per GPU-to-GPU hop: alpha (s, per message incl. software) and bandwidth (bytes/s, one direction).
NETWORKS = {
    "10GbE (TCP)": AllreduceModel(alpha=30e-6, beta=1 / 1.1e9, name="10GbE (TCP)"),
    "25GbE (RoCE)": AllreduceModel(alpha=8e-6, beta=1 / 2.9e9, name="25GbE (RoCE)"),
    "50GbE (RoCE)": AllreduceModel(alpha=8e-6, beta=1 / 5.8e9, name="50GbE (RoCE)"),
    "100Gb InfiniBand EDR": AllreduceModel(alpha=3e-6, beta=1 / 11.5e9, name="100Gb InfiniBand EDR"),
    "PCIe 3 x16 (in node)": AllreduceModel(alpha=5e-6, beta=1 / 10e9, name="PCIe 3 x16 (in node)"),
    "NVLink V100 (in node)": AllreduceModel(alpha=5e-6, beta=1 / 130e9, name="NVLink V100 (in node)"),
}
GPUS_PER_NODE = 8


@functools.cache
def model_spec(model: str) -> dict:
    """MACs per image, parameters and gradient bytes (4 x trainable parameters) of a network, counted by
    labkit.flops on its builder at its native input size (ResNet-101: 7.57 G MACs, as 03_flops shows).
    Counting builds the network's shapes only (no weights); the result is kept for the process."""
    from labkit import flops, models
    if not isinstance(model, str):
        raise ValueError(f"model must be a model name; got {model!r}")
    if model == "inception_v3":  # not a labkit.models network: keras.applications' own builder
        import tensorflow as tf
        with flops.shapes_only():
            report = flops.count(tf.keras.applications.InceptionV3(weights=None))
    else:
        if model not in models.names():
            raise ValueError(f"model must be one of {', '.join(MODELS)} or a labkit.models name "
                             f"(or give compute_s and grad_bytes); got {model!r}")
        report = flops.count_named(model)
    return {"macs": int(report.macs), "params": int(report.params),
            "grad_bytes": 4 * int(report.trainable_params), "input_shape": tuple(report.input_shape[1:])}


def gpu_peak_tflops(gpu: str) -> float:
    """FP32 peak of a GPU (TFLOP/s), from labkit.flops.hardware's device table (datasheet peaks)."""
    from labkit.flops import hardware
    return float(hardware.get_device(gpu).fp32_tflops)


def _as_network(network) -> AllreduceModel:
    if isinstance(network, AllreduceModel):
        return network
    if network not in NETWORKS:
        raise ValueError(f"network must be an AllreduceModel or one of {', '.join(NETWORKS)}; got {network!r}")
    return NETWORKS[network]


def predict(gpus=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), *, model="resnet101", gpu="P100",
            network="25GbE (RoCE)", intra_node="PCIe 3 x16 (in node)", batch_per_gpu=64,
            utilization=0.5, overlap=0.0, threshold=FUSION_THRESHOLD, compute_s=None, grad_bytes=None,
            gpus_per_node=GPUS_PER_NODE):
    """Predicted step time, images/s and efficiency of synchronous data parallelism (a model, not a run).

    compute_s per step = batch x 3 x 2 x MACs / (peak x utilization) unless given; gradient bytes =
    4 x trainable parameters unless given (both from model_spec). Up to gpus_per_node the ring runs over
    intra_node links, beyond that the slowest link (the network between nodes) sets alpha and beta.
    """
    import pandas as pd
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1]; got {utilization}")
    checks = [("batch_per_gpu", batch_per_gpu), ("gpus_per_node", gpus_per_node), *(("gpus", g) for g in gpus)]
    for name, value in checks:
        check_int(value, name, minimum=1)
    if compute_s is not None and not 0 < compute_s < math.inf:
        raise ValueError(f"compute_s must be a finite number of seconds > 0; got {compute_s!r}")
    inter, intra = _as_network(network), _as_network(intra_node)
    if compute_s is None or grad_bytes is None:
        spec = model_spec(model)
    if compute_s is None:
        compute_s = batch_per_gpu * 6 * spec["macs"] / (gpu_peak_tflops(gpu) * 1e12 * utilization)
    if grad_bytes is None:
        grad_bytes = spec["grad_bytes"]
    tensors = [grad_bytes] if np.ndim(grad_bytes) == 0 else list(grad_bytes)
    rows = []
    for p in gpus:
        net = intra if p <= gpus_per_node else AllreduceModel(
            alpha=max(inter.alpha, intra.alpha), beta=max(inter.beta, intra.beta), name=inter.name)
        comm = net.fused_time(tensors, p, threshold)
        t = step_time(p, compute_s, tensors, net, overlap, threshold)
        rows.append({"gpus": p, "compute_s": compute_s, "comm_s": comm, "step_s": t,
                     "images_per_sec": p * batch_per_gpu / t, "efficiency": compute_s / t})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# 3. the published results the model is set beside (typed in from the sources)

PUBLISHED = [
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "resnet101", "gpus": 512,
     "efficiency": 0.90, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "inception_v3", "gpus": 512,
     "efficiency": 0.90, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "vgg16", "gpus": 512,
     "efficiency": 0.68, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Goyal et al. 2017", "model": "resnet50", "gpus": 256, "efficiency": 0.90,
     "setup": "P100, 8 per server, 50GbE, Caffe2, 32 images/GPU"},
    {"source": "Das 2017, Accelerating Machine Learning on Chameleon Cloud (MXNet)", "model": "resnet50",
     "gpus": 2, "efficiency": 389.81 / 194.86 / 2,
     "setup": "1 GPU per node, SSH, synthetic data: 194.86 -> 389.81 images/s"},
    {"source": "Das 2017, Accelerating Machine Learning on Chameleon Cloud (MXNet)", "model": "resnet50",
     "gpus": 8, "efficiency": 1466.31 / 194.86 / 8,
     "setup": "1 GPU per node: 194.86 -> 1466.31 images/s (7.5x)"},
    {"source": "MathWorks white paper Deep Learning with MATLAB and Multiple GPUs (p2.8xlarge)",
     "model": "alexnet", "gpus": 8, "efficiency": 1.7 ** 3 / 8,
     "setup": "8 K80 GPUs in one machine, ~70% more images/s per doubling"},
]

# Das 2017 (Chameleon slides), "Impact of batch size": images/s on one GPU, typed in.
CHAMELEON_BATCH = {
    "batch_size": [1, 2, 4, 8, 16, 32],
    "AlexNet": [1067.86, 1442.78, 1861.16, 2168.15, 2296.58, 1960.96],
    "Inception V3": [19.06, 34.19, 56.37, 81.78, 108.00, 125.26],
    "ResNet-152": [10.15, 18.92, 33.11, 48.74, 65.57, 77.46],
}


def chameleon_batch_table():
    """The Chameleon slides' images/s vs batch size table (one GPU) as a DataFrame indexed by batch size."""
    import pandas as pd
    return pd.DataFrame(CHAMELEON_BATCH).set_index("batch_size")


def published():
    """The published scaling numbers as a DataFrame (source, model, gpus, efficiency, setup)."""
    import pandas as pd
    return pd.DataFrame(PUBLISHED)
