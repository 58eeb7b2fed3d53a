"""What each experiment launches on *this* machine: from the usable cores, memory and load, never 1..cores
blindly. (04_horovod_scaling, 05_network_sweep, 07_scaling_deep_dive; `labkit plan`)

    from labkit.base import plans
    plans.scaling_workers()           # 04's worker counts here, e.g. [1, 2] on 2 cores, [1, 2, 8] on 64
    plans.batch_size()                # 04's and 07's images per worker per step: 64 (128 in full), less where
                                      # memory is short
    print(plans.describe())           # every notebook's launches: workers, processes, peak memory, minutes
    plans.say_if_short("05_network_sweep")  # one line when its largest run would not fit in the free memory
    plans.run_device(2, 4)            # "gpu": where `labkit scale`'s workers go on a 4-GPU node ("cpu" for 8)

Rules: worker counts are log-spaced (1, 2, 4, 8, ...); the quick and workshop profiles make a handful of
launches (04: at most 3 worker counts, 6 launches, 8 workers) on any machine; the full profile goes up to the
whole node, minus the cores other programs keep busy (the load average); no plan needs more memory than the
machine has (machine.memory_available(); LABKIT_MEMORY overrides): worker counts are capped at the profile's
batch, then the batch is halved (to 16 at least) until the largest count fits; on 1 core the lessons that need
two workers run two that share it, and the parallel sweep runs one. Memory and minutes are estimates from the
reference machine (2 cores): a TensorFlow worker takes ~400 MiB and ~10 s of CPU to start, plus twice its
batch's activations (labkit.flops' count; the backward pass keeps them and their gradients).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MiB = 2**20
KERNEL_BYTES = 600 * MiB  # the notebook's own kernel with TensorFlow loaded
TF_WORKER_BYTES = 400 * MiB  # one training worker (Horovod rank): TensorFlow and its model, before its batch
# activations kept per 32x32x3 image for the backward pass: labkit.flops' count (03_flops; tests hold them to it)
IMAGE_BYTES = {"small_cnn": 135_208, "convblock_net": 2_814_504}
BACKWARD = 2  # the backward pass holds the activations and their gradients
BATCH = {"quick": 64, "workshop": 64, "full": 128}  # 04's and 07's images per worker per step, memory allowing
SMOKE_BATCH, MIN_BATCH = 16, 16
ROUNDS = {"quick": 0, "workshop": 2, "full": 3}  # 04's and 07's Gloo vs MPI rounds (CONTROLLER_ROUNDS there)
SWEEP_WORKER_BYTES = 650 * MiB  # one of 05's sweep workers (a TensorFlow process with its data)
PROBE_BYTES = 60 * MiB  # one single-thread numpy GEMM process (labkit.scale.probe)
START_CPU_S = 10.0  # CPU seconds for a TensorFlow worker to import and build its model
WORKSHOP_MAX_WORKERS, WORKSHOP_MAX_COUNTS = 8, 3
PROFILES = ("quick", "workshop", "full")
MODEL = {"quick": "small_cnn", "workshop": "small_cnn", "full": "convblock_net"}  # 04's and 07's MODEL
TRAIN_CPU_S = {"quick": 0.5, "workshop": 2.0, "full": 150.0}  # one worker's timed + warm-up steps, one launch
SWEEP_CPU_S = {"quick": 8.0, "workshop": 8.0, "full": 50.0}  # 05's timed networks, all of them, on one core


@dataclass(frozen=True)
class Machine:
    """What a plan is made for: usable cores, bytes free for new processes, 1-minute load average, and whether
    that load was read from the host (False where LABKIT_CORES names the cores free for labkit)."""

    cores: int
    memory: int
    load: float = 0.0
    load_counted: bool = True
    gpus: int = 0  # NVIDIA GPUs (machine.gpus(); LABKIT_GPUS): shown in the header


@dataclass(frozen=True)
class Experiment:
    """One experiment's launches: worker counts (one group of launches each), how many launches, the most
    processes at once, the peak memory estimate (bytes, the kernel included), a minutes estimate and the
    batch per worker where the plan sets it."""

    notebook: str
    name: str
    workers: tuple
    launches: int
    processes: int
    peak_bytes: int
    minutes: float
    note: str = ""
    batch: int = 0  # images per worker per step (0: the experiment's own, not planned here)


def here() -> Machine:
    """This machine as labkit sees it. LABKIT_CORES / LABKIT_MEMORY override the cores and the memory; with
    LABKIT_CORES set the load average is not counted (the cores named are the ones free for labkit)."""
    import os

    from labkit.base import machine, timing
    named = bool(os.environ.get(machine.CORES_ENV, "").strip())
    load = 0.0 if named else timing.load_average()
    return Machine(machine.cores(), machine.memory_available(), load if math.isfinite(load) else 0.0, not named,
                   machine.gpus())


def _check(m: Machine, profile: str) -> None:
    from labkit.base.checks import check_int, check_number
    check_int(m.cores, "cores", minimum=1)
    check_int(m.memory, "memory", minimum=1)
    check_number(m.load, "load", minimum=0)
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")


def free_cores(m: Machine, profile: str) -> int:
    """Cores a plan may fill: all usable ones, except in the full profile on a loaded node, where the cores
    other programs keep busy (the load average, rounded down) are left to them."""
    return max(1, m.cores - int(m.load)) if profile == "full" else m.cores


def log_spaced(limit: int) -> list:
    """1, 2, 4, ... below limit, then limit itself: [1, 2, 4, 6] for 6."""
    counts, n = [], 1
    while n < limit:
        counts.append(n)
        n *= 2
    return counts + [limit]


def _memory_cap(m: Machine, per_worker: int, extra: int = 0) -> int:
    return max(1, (m.memory - KERNEL_BYTES - extra) // per_worker)


def worker_bytes(model: str, batch: int) -> int:
    """One training worker's memory estimate: TensorFlow and the model, plus its batch's activations twice."""
    return TF_WORKER_BYTES + BACKWARD * batch * IMAGE_BYTES[model]


def scaling_workers(profile: str | None = None, m: Machine | None = None) -> list:
    """04's worker counts (GEMM probe processes and training workers, one thread each) for this machine."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    _check(m, profile)
    limit = min(free_cores(m, profile), _memory_cap(m, worker_bytes(MODEL[profile], BATCH[profile])))
    if profile == "full":
        return log_spaced(max(limit, 2))
    if profile == "quick":
        return [1, 2]
    top = min(limit, WORKSHOP_MAX_WORKERS)
    return sorted({1, 2, top})[:WORKSHOP_MAX_COUNTS]  # two at least: the exchange is the lesson


def run_device(ranks_per_host: int, gpus: int) -> str | None:
    """Where the workers of a run go on a machine with `gpus` NVIDIA GPUs, one device for all of them: "gpu"
    (one each) when every host has a GPU for each of the ranks it runs, "cpu" when it has too few (no rank
    left without one), None without GPUs (nothing to choose). `labkit scale` and hvd_train ask it; the
    notebooks' runs measure cores and stay on the CPU (labkit.scale.scaling)."""
    from labkit.base.checks import check_int
    check_int(ranks_per_host, "ranks_per_host", minimum=1)
    check_int(gpus, "gpus", minimum=0)
    if gpus == 0:
        return None
    return "gpu" if gpus >= ranks_per_host else "cpu"


def batch_size(profile: str | None = None, m: Machine | None = None, workers: int | None = None) -> int:
    """04's and 07's images per worker per step: the profile's (16 at smoke scale), halved down to MIN_BATCH
    while `workers` of them (default: the largest of scaling_workers) would not fit in m's memory."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    _check(m, profile)
    batch = config.by_profile(**BATCH, smoke=SMOKE_BATCH, name=profile)
    workers = max(scaling_workers(profile, m)) if workers is None else workers
    while batch > MIN_BATCH and KERNEL_BYTES + workers * worker_bytes(MODEL[profile], batch) > m.memory:
        batch //= 2
    return batch


def sweep_workers(profile: str | None = None, m: Machine | None = None) -> list:
    """05's parallel-sweep worker counts: 1 on one core, log-spaced up to the cores (+1 in the full profile)."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    _check(m, profile)
    cores = free_cores(m, profile)
    limit = min(cores + (profile == "full"), _memory_cap(m, SWEEP_WORKER_BYTES))
    if cores == 1 or limit == 1:
        return [1]
    if profile == "full":
        return log_spaced(limit)
    return [1, 2]


def _slowdown(busy: float, m: Machine) -> float:
    """How much longer work takes when `busy` cores' worth of it, plus the load of other programs, share m's cores."""
    return max(1.0, (busy + m.load) / m.cores)


def _launch_s(workers: int, m: Machine, profile: str, work_s: float) -> float:
    """Seconds of one launch of `workers` processes: start-up and work, slowed when they and the machine's
    load outnumber its cores."""
    return (START_CPU_S + work_s) * _slowdown(workers, m)


def _shared(m: Machine) -> str:
    return "2 workers share 1 core: no speed-up here" if m.cores == 1 else ""


def _im2col(profile: str, m: Machine) -> list:
    minutes = {"quick": 0.3, "workshop": 0.5, "full": 2.0}[profile] * _slowdown(m.cores, m)
    return [Experiment("02_im2col", "im2col timings and the chunk sweep (in the kernel)", (1,), 0, 1,
                       KERNEL_BYTES + 300 * MiB, minutes, f"BLAS on {m.cores} thread{'s' * (m.cores > 1)}")]


def _scaling(profile: str, m: Machine) -> list:
    """04: the GEMM probe and training per worker count, then the 2-worker sync run and Gloo vs MPI rounds."""
    counts, work = scaling_workers(profile, m), 2 * TRAIN_CPU_S[profile]
    batch = batch_size(profile, m, max(counts))  # one batch for every launch of the notebook
    worker = worker_bytes(MODEL[profile], batch)
    pairs = 1 + 2 * ROUNDS[profile]
    return [Experiment("04_horovod_scaling", "where the time goes: GEMM probe + training, per worker count",
                       tuple(counts), 2 * len(counts), max(counts), KERNEL_BYTES + max(counts) * worker,
                       sum(2.0 + _launch_s(n, m, profile, work) for n in counts) / 60, _shared(m), batch),
            Experiment("04_horovod_scaling", "sync run + Gloo vs tuned MPI", (2,), pairs, 2,
                       KERNEL_BYTES + 2 * worker, pairs * _launch_s(2, m, profile, work) / 60, _shared(m), batch)]


def _sweep(profile: str, m: Machine) -> list:
    sweep, repeats = sweep_workers(profile, m), {"quick": 1, "workshop": 2, "full": 3}[profile]
    return [Experiment("05_network_sweep", "parallel sweep workers", tuple(sweep), len(sweep) * repeats,
                       max(sweep), KERNEL_BYTES + max(sweep) * SWEEP_WORKER_BYTES,
                       sum(repeats * _launch_s(n, m, profile, SWEEP_CPU_S[profile] / n) for n in sweep) / 60,
                       "one core: the sweep runs one worker" if m.cores == 1 else "")]


def _deep_dive(profile: str, m: Machine) -> list:
    """07: every launch has 1 or 2 workers (exchange cost, controllers, the variants)."""
    launches = 2 if profile == "quick" else 2 * 3 + 4 * ROUNDS[profile] + 4
    batch = batch_size(profile, m, 2)
    return [Experiment("07_scaling_deep_dive", "exchange cost, controllers, variants (2 workers)", (1, 2), launches, 2,
                       KERNEL_BYTES + 2 * worker_bytes(MODEL[profile], batch),
                       launches * _launch_s(2, m, profile, 2 * TRAIN_CPU_S[profile]) / 60, _shared(m), batch)]


def experiments(profile: str | None = None, m: Machine | None = None) -> list:
    """Every measuring notebook's experiments on machine m (default: here) in the profile (default: current)."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    _check(m, profile)
    return _im2col(profile, m) + _scaling(profile, m) + _sweep(profile, m) + _deep_dive(profile, m)


def fits(plan: list, m: Machine) -> bool:
    """True when every experiment's peak memory estimate fits in m.memory."""
    return all(e.peak_bytes <= m.memory for e in plan)


def memory_line(notebook: str, profile: str | None = None, m: Machine | None = None, running: int = 0) -> str:
    """One line, before any launch, when the notebook's largest run is estimated above the memory free here
    (such a run would be stopped for lack of memory); '' when it fits or the notebook launches nothing planned.
    running: bytes of the estimate already in use and outside m.memory (the notebook's own kernel, once started)."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    peak = max((e.peak_bytes for e in experiments(profile, m) if e.notebook == notebook), default=0)
    if peak - running <= m.memory:
        return ""
    return (f"This machine has {m.memory / 2**30:.1f} GiB of memory free and this notebook's largest run is estimated "
            f"to need {(peak - running) / 2**30:.1f} GiB{' beyond its kernel' if running else ''} (`labkit plan` lists "
            "each run): shut down other notebooks' kernels and close other programs first, or the run may be stopped "
            "for lack of memory.")


def say_if_short(notebook: str) -> None:
    """Print memory_line(notebook) from the notebook's kernel (a measuring notebook's first cell) when memory is
    short; nothing otherwise."""
    from labkit.base import machine
    m = here()
    # the free memory is the whole machine's (a cgroup's limit, LABKIT_MEMORY) with the kernel in it, or what the
    # system has left, the running kernel already out of it
    counted = m.memory >= machine.memory()
    line = memory_line(notebook, m=m, running=0 if counted else KERNEL_BYTES)
    if line:
        print(line)


def _header(profile: str, m: Machine) -> str:
    import os

    from labkit.base import machine
    memory = " (LABKIT_MEMORY)" if os.environ.get(machine.MEMORY_ENV, "").strip() else ""
    load = (f"load average {m.load:.2f}" if m.load_counted else
            "host load not counted (LABKIT_CORES names the cores free for labkit)")
    gpus = ""
    if m.gpus:
        gpus = (f"; {m.gpus} NVIDIA GPU{'s' * (m.gpus > 1)}: the notebooks' workers run on the CPU (`labkit scale` "
                f"gives each worker a GPU, up to {m.gpus} per node)")
    return f"profile {profile}; {m.cores} usable cores, {m.memory / 2**30:.1f} GiB free{memory}, {load}{gpus}"


def describe(profile: str | None = None, m: Machine | None = None) -> str:
    """A table of the launches each notebook would make on machine m (default: here)."""
    from labkit.base import config
    profile, m = profile or config.profile(), m or here()
    plan = experiments(profile, m)
    lines = [_header(profile, m),
             f"{'notebook':<22} {'experiment':<60} {'workers':<18} {'batch':>5} {'launches':>8} {'peak MiB':>9} "
             f"{'minutes':>8}"]
    for e in plan:
        lines.append(f"{e.notebook:<22} {e.name:<60} {','.join(map(str, e.workers)):<18} {e.batch or '-':>5} "
                     f"{e.launches:>8} {e.peak_bytes / MiB:>9,.0f} {e.minutes:>8.1f}"
                     + (f"  {e.note}" if e.note else ""))
    if not fits(plan, m):
        lines.append("warning: an experiment's peak memory estimate exceeds the free memory")
    return "\n".join(lines)


def cli_main(argv=None) -> int:
    """`labkit plan`: the launches each notebook would make here (LABKIT_CORES / LABKIT_MEMORY to ask elsewhere)."""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="labkit plan", description=cli_main.__doc__)
    p.add_argument("--profile", choices=PROFILES, help="default: LABKIT_PROFILE (workshop)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args(argv)
    m = here()
    if args.json:
        doc = {"machine": asdict(m), "experiments": [asdict(e) for e in experiments(args.profile, m)]}
        print(json.dumps(doc, indent=1))
    else:
        print(describe(args.profile, m))
    return 0
