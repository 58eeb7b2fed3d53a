"""Shared pytest set-up: keep TensorFlow quiet and the user's home untouched."""
import os
import stat
import sys
import time
from pathlib import Path

import pytest

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before any test imports TensorFlow)
from helpers import ROOT  # noqa: E402  (the repository root, one definition)

# Observations (labkit.base.observe) are asserted in the suite, not only printed: set at import time, so the
# notebook kernels nbval starts inherit it. LABKIT_STRICT_OBSERVATIONS=0 turns it off (another machine shape).
os.environ.setdefault("LABKIT_STRICT_OBSERVATIONS", "1")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def venv_bin() -> Path:
    """The bin/ folder of the interpreter running the tests (the project's .venv under `make test`)."""
    return Path(sys.executable).parent


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """HOME and Jupyter's dirs in tmp, so a test writes nothing to the real home."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
           "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
           "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"),
           "IPYTHONDIR": str(home / ".ipython")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return home


@pytest.fixture
def fake_launchers(tmp_path):
    """LABKIT_HOROVODRUN and LABKIT_MPIRUN (labkit.scale.horovod_info / labkit.scale.mpi's overrides) pointing at
    scripts that write their name and arguments into a marker file when run, then exit 1: a launch on either path
    (horovodrun --gloo, or mpirun, the default on one machine where Horovod has MPI) leaves the marker.
    `mpirun --version` (how labkit names the MPI) answers as Open MPI does and starts nothing.
    Gives (env_extra, marker); tests/course/test_bad_inputs.py checks that a launch does reach the fakes."""
    marker = tmp_path / "ranks-started"
    env = {}
    for name, var in (("horovodrun", "LABKIT_HOROVODRUN"), ("mpirun", "LABKIT_MPIRUN")):
        exe = tmp_path / name
        version = ('if [ "$1" = --version ]; then echo "mpirun (Open MPI) 5.0.0"; exit 0; fi\n'
                   if name == "mpirun" else "")
        exe.write_text(f'#!/bin/sh\n{version}echo "{name} $*" >> {marker}\nexit 1\n')
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        env[var] = str(exe)
    return env, marker


def pytest_configure(config):
    os.environ.setdefault("MPLBACKEND", "Agg")


# ------------------------------------------------------------------ two test processes (pytest-xdist)
# `make test` runs the suite in two processes (-n 2 --dist loadscope). A file is one unit of work: its module
# fixtures start once and nbval's cells run in order in one kernel. The files that share machine-wide state
# are one unit, run one after the other: the virtual cluster's network namespaces (labkit-node1..N) and the
# test Slurm that starts on them. That unit is the longest, so it goes first (--no-loadscope-reorder keeps
# this order) and is not the tail of the run.
# The files that measure or need the whole machine (the Binder box pins notebooks to its first CPU, or keeps
# one busy) are marked solo and are one unit sent last; its first test waits until every other test process
# has finished its work (each one's state file, under a folder of this run, is gone or its process is), so no
# other test shares their CPUs. With one process (-n 0, -p no:xdist) they simply run in their place.
SERIAL_UNIT, SOLO_UNIT = "cluster", "solo"
SERIAL_FILES = ("tests/course/test_full_smoke.py", "tests/course/test_slurm.py", "tests/deepdive/test_vcluster.py")
SOLO_FILES = ("tests/course/test_binder_box.py",)


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SERIAL_UNIT if path in SERIAL_FILES else SOLO_UNIT if path in SOLO_FILES else path


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (-p no:xdist) must still start
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):  # xdist's own scopes are classes and modules; ours files and the units
        def _split_scope(self, nodeid):
            return _unit(nodeid)

    return ByFile(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _unit(item.nodeid) == SOLO_UNIT:
            item.add_marker(pytest.mark.solo)
    if hasattr(config, "workerinput"):  # an xdist worker: what it reports is the order the units go out in
        items.sort(key=lambda item: (_unit(item.nodeid) != SERIAL_UNIT, _unit(item.nodeid) == SOLO_UNIT))  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """In the controller, per worker: the folder where the workers say they still run (one per run)."""
    import tempfile
    config = node.config
    if not hasattr(config, "_labkit_workers"):
        config._labkit_workers = tempfile.mkdtemp(prefix="labkit-xdist-")
    node.workerinput["labkit_workers"] = config._labkit_workers


def _worker_file(config) -> Path | None:
    folder = getattr(config, "workerinput", {}).get("labkit_workers")
    return Path(folder) / config.workerinput["workerid"] if folder else None


def pytest_sessionstart(session):
    if (mine := _worker_file(session.config)) is not None:  # this worker runs (until its session finishes)
        mine.write_text(str(os.getpid()))


def pytest_sessionfinish(session):
    if (mine := _worker_file(session.config)) is not None:
        mine.unlink(missing_ok=True)


def pytest_unconfigure(config):
    if hasattr(config, "_labkit_workers"):
        import shutil
        shutil.rmtree(config._labkit_workers, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's window: waiting is not the test's time
def pytest_runtest_protocol(item, nextitem):
    mine = _worker_file(item.config)
    if mine is not None and item.get_closest_marker("solo") and not getattr(item.config, "_labkit_alone", False):
        while any(_running(f) for f in mine.parent.iterdir() if f != mine):
            time.sleep(1)
        item.config._labkit_alone = True  # the others have finished: they take no more work
    yield


def _running(state: Path) -> bool:
    try:
        return Path(f"/proc/{int(state.read_text())}").exists()
    except (OSError, ValueError):  # gone meanwhile, or being written
        return state.exists()
