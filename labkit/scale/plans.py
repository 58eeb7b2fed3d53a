"""What 04_horovod_scaling launches on this machine: its worker counts, the batch per worker, its experiments
for `labkit plan`. (04_horovod_scaling)

    from labkit.scale import plans
    plans.scaling_workers()   # 04's worker counts here, e.g. [1, 2] on 2 cores, [1, 2, 8] on 64
    plans.batch_size()        # images per worker per step: 64 (128 in full), less where memory is short
    plans.say_if_short()      # one line when 04's largest run would not fit in the free memory
    pace = plans.pace(seconds, counts)  # how decompose's launches ran against the plan (labkit.base.plans.Pace)

The quick and workshop profiles make a handful of launches on any machine (at most 3 worker counts, 6
launches, 8 workers); the full profile goes up to the whole node (labkit.base.plans' rules); on 1 core the two
workers the lesson needs share it.
"""
from __future__ import annotations

from labkit.base import plans as base
from labkit.base.plans import KERNEL_BYTES, Experiment, Machine
from labkit.scale.probe import WINDOW_S

# activations kept per 32x32x3 image for the backward pass: labkit.flops' count (03_flops), typed here so that
# `labkit plan` does not load TensorFlow (tests/base/test_plans.py holds them to scaling.training_bytes)
IMAGE_BYTES = {"small_cnn": 135_208, "convblock_net": 2_814_504}
STATE_BYTES = {"small_cnn": 306_936, "convblock_net": 8_138_488}  # weights + gradients + momentum, the same way
MODEL = {"quick": "small_cnn", "workshop": "small_cnn", "full": "convblock_net"}  # 04's and 07's MODEL
BATCH = {"quick": 64, "workshop": 64, "full": 128}  # 04's and 07's images per worker per step, memory allowing
ROUNDS = {"quick": 0, "workshop": 2, "full": 3}  # 04's and 07's Gloo vs MPI rounds (their CONTROLLER_ROUNDS)
TRAIN_CPU_S = {"quick": 0.5, "workshop": 2.0, "full": 150.0}  # one worker's timed + warm-up steps, one launch
WORKSHOP_MAX_WORKERS, WORKSHOP_MAX_COUNTS = 8, 3
AS_PLANNED = base.Pace(notebook="04")  # 04's pace before (or without) its first experiment: nothing is cut


def worker_bytes(model: str, batch: int) -> int:
    """One training worker's memory estimate for a model of IMAGE_BYTES at a batch (labkit.base.plans')."""
    return base.worker_bytes(IMAGE_BYTES[model], batch)


def scaling_workers(profile: str | None = None, m: Machine | None = None) -> list:
    """04's worker counts (GEMM probe processes and training workers, one thread each) for this machine.
    (04_horovod_scaling)"""
    profile, m = base.resolve(profile, m)
    limit = min(base.free_cores(m, profile), base.memory_cap(m, worker_bytes(MODEL[profile], BATCH[profile])))
    if profile == "full":
        return base.log_spaced(max(limit, 2))
    if profile == "quick":
        return [1, 2]
    top = min(limit, WORKSHOP_MAX_WORKERS)
    return sorted({1, 2, top})[:WORKSHOP_MAX_COUNTS]  # two at least: the exchange is the lesson


def batch_size(profile: str | None = None, m: Machine | None = None, workers: int | None = None) -> int:
    """04's and 07's images per worker per step: the profile's (16 at smoke scale), halved down to 16 while
    `workers` of them (default: the largest of scaling_workers) would not fit in m's memory. (04_horovod_scaling)"""
    from labkit.base import config
    profile, m = base.resolve(profile, m)
    batch = config.by_profile(**BATCH, smoke=base.SMOKE_BATCH, name=profile)
    workers = max(scaling_workers(profile, m)) if workers is None else workers
    return base.fit_batch(batch, workers, IMAGE_BYTES[MODEL[profile]], m)


def where_s(counts, profile: str, m: Machine) -> float:
    """The plan's seconds for 04's first experiment (localscale.decompose: a 2 s GEMM probe and a paired launch
    per worker count) on m."""
    work = 2 * TRAIN_CPU_S[profile]
    return sum(WINDOW_S + base.launch_s(n, m, work) for n in counts)


def experiments(profile: str, m: Machine) -> list:
    """04: the GEMM probe and training per worker count, then the 2-worker sync run and Gloo vs MPI rounds."""
    counts, work = scaling_workers(profile, m), 2 * TRAIN_CPU_S[profile]
    batch = batch_size(profile, m, max(counts))  # one batch for every launch of the notebook
    worker = worker_bytes(MODEL[profile], batch)
    pairs = 1 + 2 * ROUNDS[profile]
    return [Experiment("04_horovod_scaling", "where the time goes: GEMM probe + training, per worker count",
                       tuple(counts), 2 * len(counts), max(counts), KERNEL_BYTES + max(counts) * worker,
                       where_s(counts, profile, m) / 60, base.shared(m), batch),
            Experiment("04_horovod_scaling", "sync run + Gloo vs tuned MPI", (2,), pairs, 2,
                       KERNEL_BYTES + 2 * worker, pairs * base.launch_s(2, m, work) / 60, base.shared(m), batch)]


def pace(measured_s: float, counts, profile: str | None = None, m: Machine | None = None) -> base.Pace:
    """How 04's first experiment ran here: measured_s, the seconds localscale.decompose took over the worker
    counts, against the plan's seconds for them on quiet cores of m's number (default: here). The later
    experiments fit their rounds and epochs to it. (04_horovod_scaling)"""
    from labkit.base.checks import check_ints
    profile, m = base.resolve(profile, m)
    counts = sorted(set(check_ints(counts, "counts", minimum=1)) | {1})  # decompose adds the one-worker baseline
    return base.Pace(measured_s, where_s(counts, profile, base.quiet(m)), "04")


def say_if_short() -> None:
    """One printed line when 04's largest run would not fit in the free memory; nothing otherwise.
    (04_horovod_scaling)"""
    base.say_if_short(experiments)
