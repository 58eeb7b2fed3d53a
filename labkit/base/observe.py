"""Two kinds of check in the notebooks: invariants and observations. (00_welcome)

An *invariant* holds on every machine (ranks' checksums equal, FLOP counts, im2col == tf.nn.conv2d, a
verdict): the notebooks check it with a plain `assert`. An *observation* depends on the machine (speed-ups,
efficiencies, which kernel is faster): `observation(...)` says in one line what this machine showed, what the
reference machine showed and the likely reason when it does not hold, and never raises in a learner's kernel.
Where LABKIT_STRICT_OBSERVATIONS=1 (the test suite and the refresh of the committed outputs, on the
reference machine) it raises AssertionError instead, so the committed outputs still bind the prose.

    from labkit.base import observe
    observe.say_if_busy()                           # one line when other programs keep the cores busy
    observe.observation(two > one, "two workers beat one", here=f"{two / one:.2f}x")  # reference: the reference file
    observe.one_core("two workers must share it", "the workers stay in sync")   # printed on 1 core only
"""
from __future__ import annotations

import math
import os
from pathlib import Path

STRICT_ENV = "LABKIT_STRICT_OBSERVATIONS"
LOG_ENV = "LABKIT_OBSERVATIONS_LOG"  # a file: each observation that did not hold is appended to it, one line
# the machine the committed outputs and the prose come from
REFERENCE = "2 cores, 24 GB, no GPU, idle"
BUSY_SHARE = 0.75  # load average per usable core above which timings are called noisy
# why an accuracy from a short training run differs between machines (01, 06: the workshop sizes)
SHORT_TRAINING = ("a short training run lands a few points apart on another CPU or thread count (its "
                  "floating-point sums run in another order); longer training settles it")


def strict() -> bool:
    """True where observations are asserted: LABKIT_STRICT_OBSERVATIONS is 1/true/yes (the test suite sets it)."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


def _busy(load: float | None):
    """timing.busy() here, or `load` (cores' worth, as a load average reads) where given."""
    from labkit.base import timing
    if load is None:
        return timing.busy()
    return timing.Busy(load, "load average", f"load average {load:.1f}" if math.isfinite(load) else "no load average")


def likely_reason(cores: int | None = None, load: float | None = None) -> str:
    """Why this machine may differ from the reference one: too few cores, other programs' load, or the hardware."""
    from labkit.base import machine
    cores = machine.cores() if cores is None else cores
    if cores < 2:
        return "this machine has 1 usable core, the reference machine 2: parallel workers share it"
    busy = _busy(load)
    if math.isfinite(busy.cores) and busy.cores > BUSY_SHARE * cores:
        return (f"this machine is busy ({busy.text} on {machine.count_text(cores, 'core')}): "
                f"{busy.others.lower()} take the cores")
    return (f"a different CPU, BLAS or memory system ({machine.count_text(cores, 'core')} here): single runs of a few "
            "seconds also vary from run to run")


def observation(holds, what: str, here: str = "", reference: str = "", why: str | None = None) -> None:
    """Check an observation: silent when it holds; else one printed line (this machine, the reference machine,
    the likely reason), or AssertionError where strict() (the suite on the reference machine). Returns None, so
    a notebook cell that ends with it shows nothing more. The reference machine's figure is the reference file's
    for `what` (labkit.base.reference) unless `reference` says it in words."""
    if not isinstance(what, str) or not what:
        raise ValueError(f"what must be a non-empty str naming the observation; got {what!r}")
    from labkit.base import reference as reference_run
    reference_run.record(what, here)  # the refresh keeps what this run saw: the reference file's figures
    if bool(holds):
        return None
    reference = reference or reference_run.figure(what)
    shown = [f"here: {here}" if here else "", f"the reference machine ({REFERENCE}): {reference}" if reference else ""]
    shown = "; ".join(s for s in shown if s)
    line = f"Not seen on this machine: {what}{f' ({shown})' if shown else ''}. Likely why: {why or likely_reason()}."
    if strict():
        raise AssertionError(line)
    print(line)
    log = os.environ.get(LOG_ENV, "").strip()
    if log:  # scripts/binder_box.py counts them per notebook and machine shape
        from labkit.base import resultsfile
        with resultsfile.locked(log):  # notebooks run side by side append to one log: none may lose another's line
            old = Path(log).read_text(encoding="utf-8") if Path(log).is_file() else ""
            resultsfile.write_text(log, old + line + "\n")
    return None


def busy_line(cores: int | None = None, load: float | None = None, busy=None) -> str:
    """One line saying the timings will be noisy and why, when other work takes more than 3/4 of the usable
    cores (timing.busy(): the container's own CPU use where a quota limits it, else the load average; `load`: a
    load average to judge instead, `busy`: a timing.Busy); '' on a quiet machine."""
    from labkit.base import machine
    cores = machine.cores() if cores is None else cores
    busy = _busy(load) if busy is None else busy
    if not math.isfinite(busy.cores) or busy.cores <= BUSY_SHARE * cores:
        return ""
    text = f"load average {busy.cores:.1f}" if busy.source == "load average" else busy.text
    return (f"This machine is busy: {text} against {machine.count_text(cores, 'usable core')}. {busy.others} "
            "compete for the cores, so the timings below will be noisy and slower than on an idle machine.")


def say_if_busy() -> None:
    """Print busy_line() when the machine is busy (a measuring notebook's first cell); nothing when quiet."""
    line = busy_line()
    if line:
        print(line)


def conditions(cores: int | None = None, load: float | None = None) -> str:
    """How busy the usable cores are (busy_line's reading), with busy_line() above it when timings will be noisy."""
    from labkit.base import machine
    cores = machine.cores() if cores is None else cores
    busy = _busy(load)
    usable = machine.count_text(cores, "usable core")
    if not math.isfinite(busy.cores):
        return f"{usable}; {busy.text} (timings may be noisy if other programs run)"
    text = f"load average {busy.cores:.2f} (1 min)" if busy.source == "load average" else busy.text
    warn = busy_line(cores, busy=busy)
    return f"{warn}\n{text} on {usable}" if warn else f"{text} on {usable}: quiet enough for the timings below"


def one_core(what: str, still: str, cores: int | None = None) -> None:
    """On 1 usable core print what the lesson cannot show here, what still holds and where to go; nothing on
    2 or more cores."""
    from labkit.base import machine
    cores = machine.cores() if cores is None else cores
    if cores > 1:
        return
    # the deep dive's virtual cluster needs root and Linux's network namespaces: no advice where it cannot run
    cluster = ", or on the virtual cluster of the deep dive (2-4 nodes)" if machine.namespaces_problem() is None else ""
    print(f"This machine gives this notebook 1 core: {what}. What still holds here: {still}. For the speed-up "
          f"itself, run this notebook on a machine with 2 or more cores{cluster}.")
