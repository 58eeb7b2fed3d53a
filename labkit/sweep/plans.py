"""What 05_network_sweep launches on this machine: the parallel sweep's worker counts and its experiments for
`labkit plan`. (05_network_sweep)

    from labkit.sweep import plans
    plans.sweep_workers()     # 1 on one core, [1, 2] in the workshop, log-spaced to the cores + 1 in full
    plans.say_if_short()      # one line when 05's largest run would not fit in the free memory
    plans.pace(72.0, 6, 24_000, 2)  # how the first lease ran against its plan: the speed-up runs fit to it
"""
from __future__ import annotations

from labkit.base import plans as base
from labkit.base.plans import KERNEL_BYTES, Experiment, Machine, MiB

WORKER_BYTES = 650 * MiB  # one sweep worker: a TensorFlow process with its data
CPU_S = {"quick": 8.0, "workshop": 8.0, "full": 50.0}  # the timed networks, all of them, on one core
REPEATS = {"quick": 1, "workshop": 2, "full": 3}  # launches per worker count
# CPU seconds per training image one sweep network sees (the 16 networks' mean, quiet core): the reference
# machine's workshop refresh trained 6 networks of 8 epochs x 3,000 images on 2 workers in 69 s (+3 s starting
# them) at load 1.7, 0.96 ms per image under that load
IMAGE_CPU_S = 0.8e-3


def sweep_workers(profile: str | None = None, m: Machine | None = None) -> list:
    """05's parallel-sweep worker counts: 1 on one core, log-spaced up to the cores (+1 in the full profile).
    (05_network_sweep)"""
    profile, m = base.resolve(profile, m)
    cores = base.free_cores(m, profile)
    limit = min(cores + (profile == "full"), base.memory_cap(m, WORKER_BYTES))
    if cores == 1 or limit == 1:
        return [1]
    if profile == "full":
        return base.log_spaced(limit)
    return [1, 2]


def experiments(profile: str, m: Machine) -> list:
    """05: the timed networks once per worker count, REPEATS times."""
    sweep, repeats = sweep_workers(profile, m), REPEATS[profile]
    return [Experiment("05_network_sweep", "parallel sweep workers", tuple(sweep), len(sweep) * repeats,
                       max(sweep), KERNEL_BYTES + max(sweep) * WORKER_BYTES,
                       sum(repeats * base.launch_s(n, m, CPU_S[profile] / n) for n in sweep) / 60,
                       "one core: the sweep runs one worker" if m.cores == 1 else "")]


def pace(measured_s: float, networks: int, images: int, workers: int, m: Machine | None = None) -> base.Pace:
    """How 05's first lease ran here: measured_s, its seconds (start-up included) for `networks` networks of
    `images` training images each (epochs x images) on `workers` workers, against the plan's seconds for them
    on quiet cores of m's number (default: here). The speed-up runs fit their repeats to it. (05_network_sweep)"""
    from labkit.base.checks import check_int
    check_int(networks, "networks", minimum=1)
    check_int(images, "images", minimum=1)
    check_int(workers, "workers", minimum=1)
    _, m = base.resolve(None, m)
    work = networks * images * IMAGE_CPU_S / workers
    return base.Pace(measured_s, base.launch_s(workers, base.quiet(m), work), "05")


def say_if_short() -> None:
    """One printed line when 05's largest run would not fit in the free memory; nothing otherwise.
    (05_network_sweep)"""
    base.say_if_short(experiments)
