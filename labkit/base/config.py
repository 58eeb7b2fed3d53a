"""Run profile, seeds and data directory: the course's whole configuration (00_welcome).

One environment variable, LABKIT_PROFILE, scales every experiment:
  quick    - CI: seconds per notebook, tiny data
  workshop - default; a laptop or Binder: minutes per notebook
  full     - GPU / HPC: the real experiment
"""
from __future__ import annotations

import os
import random
from pathlib import Path

from labkit.base.checks import check_int

PROFILES = ("quick", "workshop", "full")
DEFAULT_PROFILE = "workshop"


def profile() -> str:
    """The active profile, read from LABKIT_PROFILE each call; unknown values raise ValueError."""
    value = os.environ.get("LABKIT_PROFILE", "").strip()
    if not value:
        return DEFAULT_PROFILE
    if value not in PROFILES:
        raise ValueError(
            f"LABKIT_PROFILE must be one of {', '.join(PROFILES)}; got {value!r}. "
            f"Fix: export LABKIT_PROFILE={DEFAULT_PROFILE} (or unset it)."
        )
    return value


SMOKE_NOTE = "SMOKE SCALE: sizes shrunk to seconds; these numbers are not results"
_NO_SMOKE = object()


def smoke_scale() -> bool:
    """True when LABKIT_SMOKE=1: every size shrinks to seconds, every code path of the profile stays. (00_welcome)"""
    value = os.environ.get("LABKIT_SMOKE", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"LABKIT_SMOKE must be 1 (smoke scale) or 0/unset; got {value!r}")
    return value == "1"


def by_profile(*, quick, workshop, full, smoke=_NO_SMOKE, name: str | None = None):
    """Pick the value for the active profile: by_profile(quick=1, workshop=5, full=40).

    smoke= is the size used at smoke scale (LABKIT_SMOKE=1) whatever the profile; give it only for sizes
    (images, epochs, steps, repeats, batch lists), never for choices such as a model or data set, which then
    stay the profile's. A part the profile leaves out (its value 0, empty, False or None: no rounds, no batch
    sizes) stays out at smoke scale, which keeps the profile's code paths and shrinks only what they run on.
    (00_welcome)
    """
    # name (or the active profile) selects; the keyword form keeps all three visible at the call site
    chosen = {"quick": quick, "workshop": workshop, "full": full}[name or profile()]
    if smoke is not _NO_SMOKE and smoke_scale() and not _left_out(chosen):
        return smoke
    return chosen


def _left_out(value) -> bool:
    """A profile's value that leaves a part out: 0, an empty sequence or mapping, False, None."""
    try:
        return not value
    except (TypeError, ValueError):  # a value without a truth of its own (an array): a size, not an omission
        return False


def data_dir() -> Path:
    """Where labkit keeps data sets: $LABKIT_DATA, else ~/.labkit/data (created on demand)."""
    env = os.environ.get("LABKIT_DATA", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".labkit" / "data"


def data_dir_problem() -> str | None:
    """Why $LABKIT_DATA cannot be used (it names a file, a broken link or a symlink loop), in one line; else None."""
    env = os.environ.get("LABKIT_DATA", "").strip()
    where = Path(env).expanduser() if env else None
    if where is None or not os.path.lexists(where) or where.is_dir():
        return None
    return (f"LABKIT_DATA={env} is not a folder (a file, a broken link or a symlink loop), so no data set can be "
            "found or kept there; point LABKIT_DATA at a folder (export LABKIT_DATA=~/labkit-data) or unset it")


def check_data_dir() -> Path:
    """data_dir(), or ValueError with data_dir_problem()'s line: a bad setting is named, never read as 'no data'."""
    problem = data_dir_problem()
    if problem:
        raise ValueError(problem)
    return data_dir()


OWNER_FILE = ".labkit-owner"


SCRATCH_PREFIX = "labkit-"  # every labkit scratch folder whose name starts so is swept by any later call
_SCRATCH: list[Path] = []  # this process's scratch folders, removed at exit or on SIGTERM


def scratch_dir(prefix: str) -> Path:
    """A new private folder in the system's temporary directory for one notebook's checkpoints or results,
    removed with everything in it when this Python process (the notebook's kernel) exits, or is stopped by
    SIGTERM (a Jupyter server's or jupyter_client's stop: exit handlers do not run then, so a handler removes the
    folders and then lets the signal end the process as before). A kernel killed outright (SIGKILL) cannot clean
    up: its folder records the kernel's pid, and the next scratch_dir call (any notebook's: the prefix or
    labkit-*) removes this user's folders whose process is gone. (01, 05)"""
    import atexit
    import shutil
    import tempfile
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise ValueError(f"prefix must be a non-empty name without '/'; got {prefix!r}")
    tmp = Path(tempfile.gettempdir())
    for old in {*tmp.glob(f"{prefix}*"), *tmp.glob(f"{SCRATCH_PREFIX}*")}:
        if _orphaned(old):
            shutil.rmtree(old, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    from labkit.base import resultsfile
    resultsfile.write_text(path / OWNER_FILE, str(os.getpid()))
    if not _SCRATCH:
        atexit.register(_remove_scratch)
        _remove_on_sigterm()
    _SCRATCH.append(path)
    return path


def _remove_scratch():
    import shutil
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


def _remove_on_sigterm():
    """On SIGTERM, remove this process's scratch folders, then do what SIGTERM did before (the handler that was
    there, or the default: the process ends by the signal). Left alone where SIGTERM is ignored, or off the main
    thread (Python sets handlers there only)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    before = signal.getsignal(signal.SIGTERM)
    if before == signal.SIG_IGN or before is None:  # ignored, or set outside Python: leave it as it is
        return

    def on_sigterm(signum, frame):
        _remove_scratch()
        if callable(before):
            return before(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _orphaned(path: Path) -> bool:
    """True for a scratch folder of this user whose recorded process no longer exists."""
    try:
        if path.is_symlink() or path.stat().st_uid != os.getuid():
            return False
        pid = int((path / OWNER_FILE).read_text().strip())
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):  # no owner file (not ours), unreadable, or alive under another user
        return False
    return False


def set_seed(seed: int = 42, deterministic: bool = False) -> int:
    """Seed Python, numpy and TensorFlow; deterministic=True also asks TF for deterministic ops.

    All three are needed for the same initial weights: Keras 2 draws the seed of an initializer created
    without one from Python's `random`, so tf.random.set_seed alone gives new weights in every process.

    Returns the seed so notebooks can print what produced their numbers.
    """
    seed = check_int(seed, "seed", minimum=0)
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses this process starts
    import numpy as np

    np.random.seed(seed)
    try:
        import tensorflow as tf
    except ImportError:
        return seed
    tf.random.set_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    return seed


def shown_path(path) -> str:
    """A path as a notebook's output may show it: under the home directory as ~/..., so no machine's path is kept."""
    path, home = Path(path).expanduser(), Path.home()
    try:
        return str(Path("~") / path.relative_to(home))
    except ValueError:  # outside home (a site's shared data folder): the site's own path is what to show
        return str(path)


def describe() -> str:
    """A notebook's header: which profile and data directory produced these numbers, and how busy the machine was."""
    from labkit.base import machine, timing  # here: config is imported first and stays light
    line = f"profile={profile()} (LABKIT_PROFILE), data_dir={shown_path(data_dir())} (LABKIT_DATA)"
    # measured numbers depend on what else runs: the load shows it beside them (scripts/refresh_notebooks.py)
    line += f"\n{timing.busy().text} on {machine.count_text(machine.cores(), 'core')}"
    return f"{line}\n{SMOKE_NOTE} (LABKIT_SMOKE=1)" if smoke_scale() else line
