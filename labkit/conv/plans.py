"""What 02_im2col runs on this machine, for `labkit plan` and the notebook's first cell: its timings and chunk
sweep run in the notebook's own kernel, on every core's BLAS thread. (02_im2col)"""
from __future__ import annotations

from labkit.base import plans as base
from labkit.base.plans import KERNEL_BYTES, Experiment, Machine, MiB

WORK_BYTES = 300 * MiB  # the largest im2col matrices and chunk buffers the notebook holds beside its kernel
MINUTES = {"quick": 0.3, "workshop": 0.5, "full": 2.0}  # on the reference machine, idle


def experiments(profile: str, m: Machine) -> list:
    """02's one experiment on machine m in the profile: no launch, the kernel's BLAS on every core."""
    return [Experiment("02_im2col", "im2col timings and the chunk sweep (in the kernel)", (1,), 0, 1,
                       KERNEL_BYTES + WORK_BYTES, MINUTES[profile] * base.slowdown(m.cores, m),
                       f"BLAS on {m.cores} thread{'s' * (m.cores > 1)}")]


def say_if_short() -> None:
    """One printed line when 02's largest run would not fit in the free memory; nothing otherwise. (02_im2col)"""
    base.say_if_short(experiments)
