"""What 07_scaling_deep_dive launches on this machine: every launch has 1 or 2 workers, at 04's model, batch
and rounds (labkit.scale.plans). (07_scaling_deep_dive)

    from labkit.deepdive import plans
    plans.batch_size()        # images per worker per step of two workers: 64 (128 in full), less where memory is short
    plans.say_if_short()      # one line when 07's largest run would not fit in the free memory
    pace = plans.pace(seconds)  # how its first paired launches ran against the plan (labkit.base.plans.Pace)
"""
from __future__ import annotations

from labkit.base import plans as base
from labkit.base.plans import KERNEL_BYTES, Experiment, Machine
from labkit.scale import plans as scale

AS_PLANNED = base.Pace(notebook="07")  # 07's pace before (or without) its first launches: nothing is cut


def batch_size(profile: str | None = None, m: Machine | None = None, workers: int = 2) -> int:
    """07's images per worker per step: 04's batch for two workers (`workers` of them). (07_scaling_deep_dive)"""
    return scale.batch_size(profile, m, workers)


def experiments(profile: str, m: Machine) -> list:
    """07: exchange cost, controllers and the variants, 1 or 2 workers each."""
    launches = 2 if profile == "quick" else 2 * 3 + 4 * scale.ROUNDS[profile] + 4
    batch = batch_size(profile, m)
    return [Experiment("07_scaling_deep_dive", "exchange cost, controllers, variants (2 workers)", (1, 2), launches, 2,
                       KERNEL_BYTES + 2 * scale.worker_bytes(scale.MODEL[profile], batch),
                       launches * base.launch_s(2, m, 2 * scale.TRAIN_CPU_S[profile]) / 60, base.shared(m), batch)]


def pace(measured_s: float, profile: str | None = None, m: Machine | None = None) -> base.Pace:
    """How 07's first launches ran here: measured_s, the seconds of its paired launch of 1 and of 2 workers,
    against the plan's seconds for them on quiet cores of m's number (default: here). The later experiments fit
    their batch sizes and rounds to it. (07_scaling_deep_dive)"""
    profile, m = base.resolve(profile, m)
    work = 2 * scale.TRAIN_CPU_S[profile]
    return base.Pace(measured_s, sum(base.launch_s(n, base.quiet(m), work) for n in (1, 2)), "07")


def say_if_short() -> None:
    """One printed line when 07's largest run would not fit in the free memory; nothing otherwise.
    (07_scaling_deep_dive)"""
    base.say_if_short(experiments)
