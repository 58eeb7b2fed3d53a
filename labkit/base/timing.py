"""Timing done right (02_im2col).

Rules every number here follows:
- warm-up calls run first and are not timed (first calls allocate, page in memory, pick kernels);
- each method is timed several times: the median and the spread (interquartile range) say what a run
  costs, the fastest repeat (`best`) what the code costs when no other program got in its way (other
  programs only ever slow a repeat down, as the timeit module's documentation says);
- methods being compared are timed round-robin, in rotating order, in one process: a load spike from
  another program then hits all of them alike, so the RATIOS are trustworthy even when the absolute
  GFLOP/s of a shared machine are not.
"""
from __future__ import annotations

import gc
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from labkit.base.checks import check_int


@dataclass
class Timing:
    """Seconds per call of one method: every timed repeat (warm-up excluded)."""

    times: list
    number: int = 1  # calls per timed repeat (several when one call is too short to time)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def best(self) -> float:
        """The fastest repeat, in seconds: the least disturbed by other programs."""
        return float(min(self.times))

    @property
    def spread(self) -> float:
        """Interquartile range of the repeats, in seconds."""
        q25, q75 = np.percentile(self.times, [25, 75])
        return float(q75 - q25)

    def gflops(self, flops: float, stat: str = "median") -> float:
        """GFLOP/s at the median time (stat="median") or at the fastest repeat (stat="best")."""
        if stat not in ("median", "best"):
            raise ValueError(f"stat must be 'median' or 'best'; got {stat!r}")
        return flops / getattr(self, stat) / 1e9

    def __str__(self) -> str:
        return f"{self.median * 1e3:.2f} ms ± {self.spread / 2 * 1e3:.2f} ms (median ± IQR/2 of {len(self.times)})"


def _calibrate(fn, warmup: int, min_time: float, clock=time.perf_counter) -> int:
    """Run the warm-up calls; return how many calls one timed repeat needs to last min_time."""
    elapsed = 0.0
    for _ in range(max(warmup, 1)):
        start = clock()
        fn()
        elapsed = clock() - start
    if elapsed >= min_time:
        return 1
    number = 1  # a short call: time growing batches of calls (like timeit.autorange), one preemption can't fool it
    while True:
        batch = _time_once(fn, number, clock) * number
        if batch >= min_time / 5 or number >= 10**6:
            return max(1, math.ceil(min_time * number / max(batch, 1e-9)))
        number *= 10


def _time_once(fn, number: int, clock=time.perf_counter) -> float:
    start = clock()
    for _ in range(number):
        fn()
    return (clock() - start) / number


def timeit(fn, repeats: int = 5, warmup: int = 1, min_time: float = 0.005, clock=time.perf_counter) -> Timing:
    """Time fn(): warm-up calls first (not timed), then `repeats` timed samples of >= min_time s each.

    clock: time.perf_counter (wall-clock, default) or time.process_time (CPU time of all the process's
    threads: what the work cost, hardly moved by other programs competing for the cores)."""
    return compare({"fn": fn}, repeats, warmup, min_time, clock)["fn"]


def compare(fns: dict, repeats: int = 5, warmup: int = 1, min_time: float = 0.005, clock=time.perf_counter) -> dict:
    """Time several callables side by side: {name: Timing}, round-robin in rotating order (02_im2col)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0; got {warmup!r}")
    names = list(fns)
    numbers = {name: _calibrate(fns[name], warmup, min_time, clock) for name in names}
    times = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a garbage collection inside one sample would be charged to whichever method ran
    try:
        for r in range(repeats):
            shift = r % len(names)  # rotate: every method runs after every other one equally often
            for name in names[shift:] + names[:shift]:
                times[name].append(_time_once(fns[name], numbers[name], clock))
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing(times[name], numbers[name]) for name in names}


def gemm_rate(m: int = 2048, k: int = 2048, n: int = 2048, repeats: int = 5, dtype=np.float32,
              clock=time.perf_counter) -> float:
    """This machine's GEMM rate in GFLOP/s: median time of np.matmul on (m x k) @ (k x n). (02_im2col)"""
    m, k, n = (check_int(v, name, minimum=1) for v, name in ((m, "m"), (k, "k"), (n, "n")))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    return timeit(lambda: np.matmul(a, b, out=out), repeats=repeats, clock=clock).gflops(2.0 * m * k * n)


def load_average() -> float:
    """The 1-minute load average (NaN where the platform has none): how busy other programs kept the CPU."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


@dataclass(frozen=True)
class Busy:
    """How busy the cores this process may use are: `cores`' worth of work other processes put on them (NaN:
    unknown), where it was read (`source`) and the reading in words (`text`). (00_welcome)"""

    cores: float
    source: str  # "load average" (the node's), "container" (its cgroup's CPU use), "pressure" (its PSI), "unknown"
    text: str

    @property
    def others(self) -> str:
        """Who takes the cores, as the learner can act on it."""
        if self.source == "load average":
            return "Other programs"
        return "Processes in this container (other notebooks' kernels, programs started from a terminal)"


BUSY_WINDOW_S = 0.2  # how long busy() watches a CPU-limited container's use


def busy(root=None, window: float = BUSY_WINDOW_S, sleep=time.sleep) -> Busy:
    """How busy this process's cores are. Under a cgroup CPU quota (a container such as Binder's): the cores'
    worth its processes used over `window` seconds (cpu.stat; the kernel calling this sleeps meanwhile), else
    the share of the last 10 s they waited for a core (cpu.pressure) times the quota; the node's load average
    only where no quota limits this process (it counts other containers' work, on cores this one cannot use).
    root: the cgroup folder (default machine's). (00_welcome)"""
    from labkit.base import machine
    root = machine._CGROUP_ROOT if root is None else root
    quota = machine.cgroup_cpu_limit(root)
    if quota is None:
        load = load_average()
        text = f"load average {load:.2f} (1 min)" if math.isfinite(load) else "no load average on this system"
        return Busy(load, "load average", text)
    limit = f"within its limit of {quota:g} core{'' if quota == 1 else 's'}"
    before = machine.cgroup_cpu_seconds(root)
    if before is not None:
        sleep(window)
        after = machine.cgroup_cpu_seconds(root)
        used = max(0.0, (after - before) / window) if after is not None else float("nan")
        return Busy(used, "container", f"this container's processes use {used:.2f} cores' worth {limit}")
    pressure = machine.cgroup_cpu_pressure(root)
    if pressure is not None:
        return Busy(pressure / 100 * quota, "pressure",
                    f"this container's processes waited for a core {pressure:.0f} % of the last 10 s {limit}")
    return Busy(float("nan"), "unknown", f"this container's CPU use is unreadable ({limit})")
