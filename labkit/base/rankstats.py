"""Per-rank results of a data-parallel run: the weights checksum and the step-time summary (04_horovod_scaling).

No TensorFlow here: labkit.scale.launch and labkit.scale.scaling read rank results without importing it.
(04_horovod_scaling)
"""
from __future__ import annotations

import hashlib

import numpy as np


def weights_checksum(weights) -> str:
    """SHA-256 (first 16 hex digits) over the raw bytes of a list of arrays: equal iff bit-identical.

    Equal checksums on every rank prove that data-parallel workers stayed in sync. (04_horovod_scaling)
    """
    h = hashlib.sha256()
    for w in weights:
        a = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def summarize_times(step_times, batch_size: int, steps: int) -> dict:
    """images/s per repeat (repeats are consecutive blocks of `steps` timed steps), mean and spread.

    Also the median, mean and 10th-percentile step time in s (the p10 is the step when no other program
    took the core, on a shared machine). (04_horovod_scaling)
    """
    t = np.asarray(step_times, dtype=float)
    if steps < 1 or t.size < steps:
        raise ValueError(f"need at least one block of steps={steps} timed steps; got {t.size}")
    blocks = t[: t.size // steps * steps].reshape(-1, steps)
    ips = batch_size * steps / blocks.sum(axis=1)
    return {
        "images_per_sec": float(ips.mean()),
        "images_per_sec_std": float(ips.std(ddof=1)) if ips.size > 1 else 0.0,
        "images_per_sec_repeats": [float(v) for v in ips],
        "step_time_s": float(np.median(t)),
        "step_time_mean_s": float(t.mean()),
        "step_time_p10_s": float(np.percentile(t, 10)),
    }
