"""How an experiment's launches are fitted to *this* machine: from the usable cores, memory and load, never
1..cores blindly. The mechanism only; each lesson's own launches live in its room's `plan` module
(labkit.conv.plan for 02, labkit.scale.plan for 04, labkit.sweep.plan for 05, labkit.deepdive.plan for 07),
and labkit/plan.py hands them all to describe() for `labkit plan`. (04_horovod_scaling, 05_network_sweep,
07_scaling_deep_dive)

    from labkit.base import plans
    m = plans.here()                  # cores, free memory, load average (NaN where the system has none), GPUs
    plans.log_spaced(6)               # [1, 2, 4, 6]: the worker counts of a full-profile curve
    plans.memory_cap(m, per_worker)   # how many such workers fit beside the notebook's kernel
    plans.fit_batch(64, 8, image_bytes, m)  # the batch, halved until 8 workers of it fit
    plans.say_if_short(lesson.experiments)  # one line when the lesson's largest run would not fit
    plans.run_device(2, 4)            # "gpu": where `labkit scale`'s workers go on a 4-GPU node ("cpu" for 8)
    pace = plans.Pace(measured_s=180, planned_s=46, notebook="04")  # the first experiment, timed
    rounds, why = pace.fit(2, "the comparison runs {n} round(s) instead of {full}")  # 1 round, and the line saying so

Rules: worker counts are log-spaced (1, 2, 4, 8, ...); the full profile goes up to the whole node, minus the
cores other programs keep busy (the load average; none counted where the system has no load average); no plan
needs more memory than the machine has (machine.memory_available(); LABKIT_MEMORY overrides): worker counts are
capped by the memory, then the batch is halved (to 16 at least) until the largest count fits. Memory and
minutes are estimates from the reference machine (2 cores): a TensorFlow worker takes ~400 MiB and ~10 s of CPU
to start, plus twice its batch's activations (labkit.flops' count; the backward pass keeps them and their
gradients).

A plan counts the load once, before any launch; a shared or slow core shows only in how long the launches take.
So a notebook times its first experiment against the plan's estimate for it on quiet cores of the same number
(a Pace); when it ran more than ALLOWANCE times slower (measured / planned = ratio), each later experiment keeps
ALLOWANCE / ratio of its rounds, epochs or repeats, and the notebook prints one line saying what it cut and why.
The reference machine runs the first experiment faster than planned: nothing is cut there and nothing printed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

MiB = 2**20
KERNEL_BYTES = 600 * MiB  # the notebook's own kernel with TensorFlow loaded
TF_WORKER_BYTES = 400 * MiB  # one training worker (Horovod rank): TensorFlow and its model, before its batch
BACKWARD = 2  # the backward pass holds the activations and their gradients
SMOKE_BATCH, MIN_BATCH = 16, 16
START_CPU_S = 10.0  # CPU seconds for a TensorFlow worker to import and build its model
PROFILES = ("quick", "workshop", "full")
# times its plan a notebook's first experiment may take before the later ones are cut (Pace): 04 already fills its
# slot on the reference machine (0.79x the plan there; 0.91x alone in a 1-CPU box, 1.6-2.5x in one shared with a
# busy process)
ALLOWANCE = 1.5


@dataclass(frozen=True)
class Machine:
    """What a plan is made for: usable cores, bytes free for new processes, 1-minute load average (NaN where the
    system keeps none), and whether that load was read from the host (False where LABKIT_CORES names the cores
    free for labkit)."""

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
    LABKIT_CORES set the load is not counted (the cores named are the ones free for labkit). The load is
    timing.busy()'s cores' worth (a CPU-limited container's own use, else the load average), NaN where unknown
    (no load average on this system): counted as 0."""
    from labkit.base import machine, timing
    named = machine.setting(machine.CORES_ENV) is not None
    return Machine(machine.cores(), machine.memory_available(), 0.0 if named else timing.busy().cores, not named,
                   machine.gpus())


def load(m: Machine) -> float:
    """The load other programs put on m's cores: its load average, 0 where unknown (NaN)."""
    return m.load if math.isfinite(m.load) else 0.0


def resolve(profile: str | None = None, m: Machine | None = None) -> tuple[str, Machine]:
    """The profile (default: LABKIT_PROFILE's) and the machine (default: here()), checked: one ValueError line
    naming what is wrong."""
    from labkit.base import config
    from labkit.base.checks import check_int, check_number
    profile, m = profile or config.profile(), m or here()
    check_int(m.cores, "cores", minimum=1)
    check_int(m.memory, "memory", minimum=1)
    if not math.isnan(m.load):  # NaN: no load average on this system, unknown
        check_number(m.load, "load", minimum=0)
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    return profile, m


def free_cores(m: Machine, profile: str) -> int:
    """Cores a plan may fill: all usable ones, except in the full profile on a loaded node, where the cores
    other programs keep busy (the load average, rounded down) are left to them."""
    return max(1, m.cores - int(load(m))) if profile == "full" else m.cores


def log_spaced(limit: int) -> list:
    """1, 2, 4, ... below limit, then limit itself: [1, 2, 4, 6] for 6."""
    counts, n = [], 1
    while n < limit:
        counts.append(n)
        n *= 2
    return counts + [limit]


def memory_cap(m: Machine, per_worker: int) -> int:
    """How many processes of per_worker bytes fit in m's memory beside the notebook's kernel (1 at least)."""
    return max(1, (m.memory - KERNEL_BYTES) // per_worker)


def worker_bytes(image_bytes: int, batch: int) -> int:
    """One training worker's memory estimate: TensorFlow and the model, plus its batch's activations
    (image_bytes per image, labkit.flops' count) twice."""
    return TF_WORKER_BYTES + BACKWARD * batch * image_bytes


def fit_batch(batch: int, workers: int, image_bytes: int, m: Machine) -> int:
    """batch halved down to MIN_BATCH while `workers` training workers of it (and the kernel) would not fit in
    m's memory."""
    while batch > MIN_BATCH and KERNEL_BYTES + workers * worker_bytes(image_bytes, batch) > m.memory:
        batch //= 2
    return batch


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


def slowdown(busy: float, m: Machine) -> float:
    """How much longer work takes when `busy` cores' worth of it, plus the load of other programs, share m's cores."""
    return max(1.0, (busy + load(m)) / m.cores)


def launch_s(workers: int, m: Machine, work_s: float) -> float:
    """Seconds of one launch of `workers` TensorFlow processes: start-up and work_s of CPU each, slowed when
    they and the machine's load outnumber its cores."""
    return (START_CPU_S + work_s) * slowdown(workers, m)


def quiet(m: Machine) -> Machine:
    """m without other programs' load: what a Pace compares a measured launch with."""
    return replace(m, load=0.0)


@dataclass(frozen=True)
class Pace:
    """How this machine ran a notebook's first experiment: its measured seconds against the plan's estimate for
    it on quiet cores of the same number (quiet(m)); later experiments fit() their sizes to it. The default
    (nothing measured: the experiment was skipped) cuts nothing. (04_horovod_scaling)"""

    measured_s: float = 0.0
    planned_s: float = 1.0
    notebook: str = "this notebook"  # the words after 'to keep': "04"

    def __post_init__(self):
        from labkit.base.checks import check_number
        check_number(self.measured_s, "measured_s", minimum=0)
        check_number(self.planned_s, "planned_s", above=0)

    @property
    def ratio(self) -> float:
        """Measured over planned seconds: 1.0 as planned, 5.8 for a launch 5.8 times slower."""
        return self.measured_s / self.planned_s

    @property
    def share(self) -> float:
        """The share of its planned size a later experiment keeps: 1 while the ratio is within ALLOWANCE, else
        ALLOWANCE / ratio (so that the later launches take about ALLOWANCE times their plan)."""
        return 1.0 if self.ratio <= ALLOWANCE else ALLOWANCE / self.ratio

    def fit(self, full: int, what: str, minimum: int = 1) -> tuple[int, str]:
        """A later experiment's size (rounds, epochs, repeats: its time in proportion) for this pace, and the line
        saying what was cut and why ('' when nothing was): full times share, rounded down, `minimum` at least (and
        full at most). what: the cut, with {n} and {full} in it ("the comparison runs {n} round(s) instead of
        {full}")."""
        from labkit.base.checks import check_int
        check_int(full, "full", minimum=0)
        check_int(minimum, "minimum", minimum=0)
        n = min(full, max(minimum, math.floor(full * self.share + 1e-9)))
        if n == full:
            return full, ""
        return n, self.why(what.format(n=n, full=full))

    def why(self, cut: str) -> str:
        """The line a notebook prints for a cut: how much slower than planned the first launches ran, and the cut."""
        return (f"The first launches ran {self.ratio:.1f}x slower than planned (a shared or slow core): {cut}, "
                f"to keep {self.notebook} within its slot.")


def shared(m: Machine) -> str:
    """The note of a two-worker experiment on one core ('' on two or more)."""
    return "2 workers share 1 core: no speed-up here" if m.cores == 1 else ""


def experiments(planners, profile: str | None = None, m: Machine | None = None) -> list:
    """The experiments of every planner (a lesson's experiments(profile, m)) on machine m (default: here) in the
    profile (default: current), in the planners' order."""
    profile, m = resolve(profile, m)
    return [e for planner in planners for e in planner(profile, m)]


def fits(plan: list, m: Machine) -> bool:
    """True when every experiment's peak memory estimate fits in m.memory."""
    return all(e.peak_bytes <= m.memory for e in plan)


def memory_line(planner, profile: str | None = None, m: Machine | None = None, running: int = 0) -> str:
    """One line, before any launch, when the largest run of a lesson's planner is estimated above the memory
    free here (such a run would be stopped for lack of memory); '' when it fits or it launches nothing.
    running: bytes of the estimate already in use and outside m.memory (the notebook's own kernel, once started)."""
    profile, m = resolve(profile, m)
    peak = max((e.peak_bytes for e in planner(profile, m)), default=0)
    if peak - running <= m.memory:
        return ""
    return (f"This machine has {m.memory / 2**30:.1f} GiB of memory free and this notebook's largest run is estimated "
            f"to need {(peak - running) / 2**30:.1f} GiB{' beyond its kernel' if running else ''} (`labkit plan` lists "
            "each run): shut down other notebooks' kernels and close other programs first, or the run may be stopped "
            "for lack of memory.")


def say_if_short(planner) -> None:
    """Print memory_line(planner) from the notebook's kernel (a measuring notebook's first cell, through its
    lesson's plan.say_if_short()) when memory is short; nothing otherwise."""
    from labkit.base import machine
    m = here()
    # the free memory is the whole machine's (a cgroup's limit, LABKIT_MEMORY) with the kernel in it, or what the
    # system has left, the running kernel already out of it
    counted = m.memory >= machine.memory()
    line = memory_line(planner, m=m, running=0 if counted else KERNEL_BYTES)
    if line:
        print(line)


def _header(profile: str, m: Machine) -> str:
    from labkit.base import machine
    memory = " (LABKIT_MEMORY)" if machine.setting(machine.MEMORY_ENV) is not None else ""
    if not m.load_counted:
        seen = "host load not counted (LABKIT_CORES names the cores free for labkit)"
    elif math.isnan(m.load):
        seen = "load unknown (this system keeps no load average; none counted)"
    else:
        seen = f"load average {m.load:.2f}"
    gpus = ""
    if m.gpus:
        gpus = (f"; {m.gpus} NVIDIA GPU{'s' * (m.gpus > 1)}: the notebooks' workers run on the CPU (`labkit scale` "
                f"gives each worker a GPU, up to {m.gpus} per node)")
    cores = machine.count_text(m.cores, "usable core")
    return f"profile {profile}; {cores}, {m.memory / 2**30:.1f} GiB free{memory}, {seen}{gpus}"


def describe(planners, profile: str | None = None, m: Machine | None = None) -> str:
    """A table of the launches of every planner's notebook on machine m (default: here)."""
    profile, m = resolve(profile, m)
    plan = experiments(planners, profile, m)
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


def main(argv, planners) -> int:
    """`labkit plan` over the planners (labkit/plan.py hands it every lesson's): the table, or --json."""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="labkit plan", description="`labkit plan`: the launches each notebook would "
                                "make here (LABKIT_CORES / LABKIT_MEMORY to ask elsewhere).")
    p.add_argument("--profile", choices=PROFILES, help="default: LABKIT_PROFILE (workshop)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args(argv)
    m = here()
    if args.json:
        machine_doc = dict(asdict(m), load=m.load if math.isfinite(m.load) else None)  # null: unknown
        doc = {"machine": machine_doc, "experiments": [asdict(e) for e in experiments(planners, args.profile, m)]}
        print(json.dumps(doc, indent=1))
    else:
        print(describe(planners, args.profile, m))
    return 0
