"""Shared pytest set-up: keep TensorFlow quiet and the user's home untouched."""
import contextlib
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before any test imports TensorFlow)

# Everything the suite starts (test processes, kernels, ranks, servers) keeps its temporary files in one folder of
# this run (TMPDIR), removed at its end when the run passed, kept and named when it failed: a process killed on
# purpose (a kernel stopped by SIGKILL, a rank at its timeout: TensorFlow's autograph modules) leaves nothing in
# /tmp. Created once, by the first process (xdist's controller); the test processes inherit it.
_SUITE_TMP = None
if "LABKIT_SUITE_TMP" not in os.environ:
    import tempfile
    _SUITE_TMP = tempfile.mkdtemp(prefix="lk-suite-")  # short: Open MPI's and munged's sockets live under it
    os.chmod(_SUITE_TMP, 0o1777)  # as /tmp: the daemons' users (munge, slurm) and an ordinary learner enter it
    os.environ["LABKIT_SUITE_TMP"] = os.environ["TMPDIR"] = _SUITE_TMP
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
from helpers import ROOT  # noqa: E402  (the repository root, one definition)

# Observations (labkit.base.observe) are asserted in the suite, not only printed: set at import time, so the
# notebook kernels nbval starts inherit it. LABKIT_STRICT_OBSERVATIONS=0 turns it off (another machine shape).
os.environ.setdefault("LABKIT_STRICT_OBSERVATIONS", "1")
# Every horovodrun the suite starts (the notebooks' kernels too) skips Horovod's per-launch check that it was built
# with Gloo, a child that imports TensorFlow (tests/bin/horovodrun.py); a test may point LABKIT_HOROVODRUN elsewhere.
if Path(sys.executable).with_name("horovodrun").exists():
    os.environ.setdefault("LABKIT_HOROVODRUN", str(ROOT / "tests" / "bin" / "horovodrun"))
    os.environ.setdefault("LABKIT_TEST_PYTHON", sys.executable)

# The suite's ranks start from a fork server that has imported TensorFlow once (tests/bin/forkserver.py says how and
# when a rank starts as Python would instead): one per run, started by the first process (xdist's controller) and
# ended with it; every launch's ranks start through its client (LABKIT_RANK_PYTHON, labkit.scale.launch.rank_python).
# LABKIT_SUITE_FORKSERVER=0 runs the suite without it. Tests that watch the ranks' processes themselves (their
# pids, their parents, a kill and what it leaves: REAL_RANKS) start them as Python does.
_FORKSERVER = None
if ("LABKIT_SUITE_FORKSERVER" not in os.environ and os.environ.get("LABKIT_HOROVODRUN", "").startswith(str(ROOT))
        and sys.platform == "linux"):
    import shlex
    import subprocess
    import tempfile
    _path = os.path.join(tempfile.mkdtemp(prefix="forkserver-"), "socket")
    _FORKSERVER = subprocess.Popen([sys.executable, str(ROOT / "tests" / "bin" / "forkserver.py"), "serve", _path],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "PYTHONHASHSEED": "0"})  # labkit.base.config.set_seed(0)
    _client = [sys.executable, "-I", "-S", str(ROOT / "tests" / "bin" / "forkserver.py"), "run"]
    os.environ["LABKIT_SUITE_FORKSERVER"] = _path
    os.environ["LABKIT_RANK_PYTHON"] = shlex.join([*_client, sys.executable])  # labkit.scale.launch.rank_python
    _kernel_spec = Path(_path).parent / "jupyter"  # the notebooks' kernels too: the labkit kernel's spec, the client
    try:                                           # first, in JUPYTER_PATH's first folder
        import json
        import shutil

        from jupyter_client.kernelspec import KernelSpecManager
        _spec = KernelSpecManager().get_kernel_spec("labkit")
        shutil.copytree(_spec.resource_dir, _kernel_spec / "kernels" / "labkit")
        (_kernel_spec / "kernels" / "labkit" / "kernel.json").write_text(json.dumps(
            {**_spec.to_dict(), "argv": [*_client, *_spec.argv]}, indent=1))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(_kernel_spec), os.environ.get("JUPYTER_PATH")]))
    except Exception:  # noqa: BLE001  (no labkit kernel here: nbval's runs say so themselves)
        pass
elif os.environ.get("LABKIT_SUITE_FORKSERVER") == "0":
    del os.environ["LABKIT_SUITE_FORKSERVER"]
# the suite's settings that send ranks and kernels to the server, and what they are without it
_FORKSERVER_VARS = {"LABKIT_SUITE_FORKSERVER": None, "LABKIT_RANK_PYTHON": None,
                    "JUPYTER_PATH": os.pathsep.join(d for d in os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
                                                    if not Path(d).parent.name.startswith("forkserver-")) or None}
REAL_RANKS = ("tests/scale/test_launch.py", "tests/scale/test_resume.py", "tests/cluster/test_elastic.py",
              "tests/deepdive/", "tests/sweep/", "tests/course/test_binder_box.py", "tests/course/test_slurm.py",
              "tests/course/test_lab.py", "tests/course/test_refresh_exit.py",
              "tests/exercises/test_check_hvd.py::test_the_learner_entry_point_runs_the_script_and_prints_one_line",
              "tests/exercises/test_check_resume.py::test_the_learner_s_entry_point_end_to_end")


@pytest.fixture(autouse=True)
def _hash_seed_as_it_was():
    """PYTHONHASHSEED after each test as before it: labkit.base.config.set_seed(n) sets it for the processes this
    one starts, so a test that calls it in-process (set_seed(8)) left it to every later test of its process, whose
    kernels and ranks then started as Python starts them, not from the fork server (22 kernels in one run)."""
    before = os.environ.get("PYTHONHASHSEED")
    yield
    if before is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = before


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


# ------------------------------------------------------------------ test processes (pytest-xdist)
# `make test` runs the suite in three processes (-n 3 --dist loadscope, Makefile JOBS). A file is one unit of work:
# its module fixtures start once and nbval's cells run in order in one kernel. The files that share machine-wide state
# are one unit, run one after the other: the virtual cluster's network namespaces (labkit-node1..N) and the
# test Slurm that starts on them. That unit is the longest, so it goes first (--no-loadscope-reorder keeps
# this order) and is not the tail of the run. The full profile's notebook runs (test_full_smoke.py without its Slurm
# templates) are a unit of their own, second.
# The Binder box's notebook runs must not share their CPUs with another test process, and go last:
# - a 1-CPU box gets a core of its own (marker solo_core): the two units of them (SOLO_CORE_UNITS) run side by side,
#   one per test process, each box on a CPU no other box holds (box_first_cpu), once every other test process has
#   finished or is running such a unit itself;
# - the box that keeps one of its 2 CPUs busy needs the whole machine (marker solo): its unit, sent last, waits
#   until every other test process has finished.
# Each process's state file (under a folder of this run) holds its pid and, once it runs one of these units, "solo".
# With one process (-n 0, -p no:xdist) they simply run in their place, the box on the first CPU.
SERIAL_UNIT, SOLO_UNIT = "cluster", "solo"
SERIAL_FILES = ("tests/course/test_full_smoke.py", "tests/course/test_slurm.py", "tests/deepdive/test_vcluster.py")
FULL_SMOKE = SERIAL_FILES[0]  # its Slurm templates (test names with "_template_") share the test Slurm
BOX_FILE = "tests/course/test_binder_box.py"
CORE_COUNTS = "tests/course/test_core_counts.py"
SOLO_TESTS = {f"{BOX_FILE}::test_04_runs_through_on_two_cpus_with_one_busy": SOLO_UNIT}
SOLO_CORE_UNITS = {f"{BOX_FILE}::test_notebook_runs_through_on_one_cpu[{nb}]": unit for nb, unit in (
    ("01_cnn_basics.ipynb", "solo-core-a"), ("05_network_sweep.ipynb", "solo-core-a"),
    ("04_horovod_scaling.ipynb", "solo-core-b"), ("07_scaling_deep_dive.ipynb", "solo-core-b"))}
_LAST = {**{u: 1 for u in SOLO_CORE_UNITS.values()}, SOLO_UNIT: 2}  # the order the units go out in, at the end


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path == CORE_COUNTS:  # its notebook runs: each its own unit, spread over the test processes
        return nodeid
    if path == FULL_SMOKE and "_template_" not in nodeid:  # its notebook runs need no Slurm: not the serial unit's
        return FULL_SMOKE
    return SERIAL_UNIT if path in SERIAL_FILES else SOLO_TESTS.get(nodeid) or SOLO_CORE_UNITS.get(nodeid) or path


def by_file_scheduler():
    """xdist's LoadScopeScheduling with our units for scopes (xdist's own are classes and modules), where a process
    that has taken one 1-CPU box unit is handed any other unit before a second: xdist hands a process its next unit
    while it still holds two tests (its worker keeps the last one back until it knows what follows), so one process
    took both box units of two tests each and ran them one after the other on one core, while the other process
    waited with the busy box for it to finish."""
    from xdist.scheduler import LoadScopeScheduling

    boxes = set(SOLO_CORE_UNITS.values())

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _unit(nodeid)

        def _assign_work_unit(self, node):
            taken = getattr(self, "_boxes_taken", set())
            self._boxes_taken = taken
            if node in taken:  # another unit first, if there is one
                other = next((scope for scope in self.workqueue if scope not in boxes), None)
                if other is not None:
                    self.workqueue.move_to_end(other, last=False)
            if next(iter(self.workqueue)) in boxes:
                taken.add(node)
            super()._assign_work_unit(node)

    return ByFile


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (-p no:xdist) must still start
def pytest_xdist_make_scheduler(config, log):
    return by_file_scheduler()(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _unit(item.nodeid) == SOLO_UNIT:
            item.add_marker(pytest.mark.solo)
        elif item.nodeid in SOLO_CORE_UNITS:
            item.add_marker(pytest.mark.solo_core)
    if hasattr(config, "workerinput"):  # an xdist worker: what it reports is the order the units go out in
        slow = {_unit(item.nodeid) for item in items if _is_slow(item)}
        items.sort(key=lambda item: _send_order(_unit(item.nodeid), slow))  # stable in a unit


def _is_slow(item) -> bool:
    """A notebook run of nbval's, or a test marked slow (more than a few seconds)."""
    return item.nodeid.startswith("notebooks/") or item.get_closest_marker("slow") is not None


def _send_order(unit: str, slow: set) -> tuple:
    """The order the units go out in: the serial unit, the full profile's notebook runs, then the units with a slow
    test before the others (the short ones fill the end, so the processes finish together and the box units start
    sooner: with files in name order test_launch.py's 2 minutes went out last and the other processes waited
    half a minute for it), the box units last."""
    return unit != SERIAL_UNIT, unit != FULL_SMOKE, _LAST.get(unit, 0), unit not in slow, unit


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


def pytest_sessionfinish(session, exitstatus):
    session.config._labkit_status = int(exitstatus)
    if (mine := _worker_file(session.config)) is not None:
        mine.unlink(missing_ok=True)


def pytest_unconfigure(config):
    import shutil
    if _FORKSERVER is not None:
        _FORKSERVER.terminate()
        _FORKSERVER.wait()
        folder = Path(os.environ["LABKIT_SUITE_FORKSERVER"]).parent
        with contextlib.suppress(OSError):
            print(f"\nthe fork server started {(folder / 'socket.forked').read_text()} ranks")
        shutil.rmtree(folder, ignore_errors=True)
    if hasattr(config, "_labkit_workers"):
        shutil.rmtree(config._labkit_workers, ignore_errors=True)
    if _SUITE_TMP and not hasattr(config, "workerinput"):
        if getattr(config, "_labkit_status", 1) in (0, 5):  # passed, or nothing to run
            if (mp_util := sys.modules.get("multiprocessing.util")) is not None:
                mp_util._run_finalizers()  # its exit clean-up, now: its folder (a sweep's fork server) is in ours
            shutil.rmtree(_SUITE_TMP, ignore_errors=True)
        else:
            print(f"\nthe run's temporary files are kept in {_SUITE_TMP}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's window: waiting is not the test's time
def pytest_runtest_protocol(item, nextitem):
    mine = _worker_file(item.config)
    alone, own_core = item.get_closest_marker("solo"), item.get_closest_marker("solo_core")
    if mine is not None and (alone or own_core):
        mine.write_text(f"{os.getpid()} solo")  # this process now runs only the box's units
        others = [f for f in mine.parent.iterdir() if f != mine and f.suffix != ".claim"]  # not box_first_cpu's
        while any(_in_the_way(f, alone is not None) for f in others):
            time.sleep(1)
    sigint = signal.getsignal(signal.SIGINT)
    if "LABKIT_SUITE_FORKSERVER" in os.environ and item.nodeid.startswith(REAL_RANKS):  # its module's fixtures too
        saved = {name: os.environ.pop(name) for name in _FORKSERVER_VARS if name in os.environ}
        os.environ.update({name: value for name, value in _FORKSERVER_VARS.items() if value is not None})
        try:
            yield
        finally:
            for name in _FORKSERVER_VARS:
                os.environ.pop(name, None)
            os.environ.update(saved)
    else:
        yield
    _keep_ctrl_c(item, sigint)


def _keep_ctrl_c(item, before) -> None:
    """A test that leaves Ctrl-C ignored in its test process gets it back, and is named: every later test's children
    would inherit the ignored signal (a Ctrl-C test of build-horovod.sh saw its script run on, in one run with three
    test processes; the test that left it is not known)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN and before != signal.SIG_IGN:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)
        print(f"\n{item.nodeid} left SIGINT ignored in its test process; restored", file=sys.__stderr__)


def _in_the_way(state: Path, alone: bool) -> bool:
    """Whether the test process of this state file still runs (alone: at all; else: other tests than the box's)."""
    try:
        pid, *phase = state.read_text().split()
        running = Path(f"/proc/{int(pid)}").exists()
    except (OSError, ValueError):  # gone meanwhile, or being written
        return state.exists()
    return running and (alone or phase != ["solo"])


def claim_cpu(folder: Path, cpus: int) -> tuple[int, Path | None]:
    """The lowest CPU index below cpus no other claim in folder holds, and its claim file (made atomically: two
    test processes never get the same one); (0, None) when every CPU is held (the boxes then share the first)."""
    for cpu in range(cpus):
        claim = folder / f"cpu{cpu}.claim"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return cpu, claim
    return 0, None


@pytest.fixture
def box_first_cpu(request):
    """The CPU (index among this machine's) a 1-CPU box of this test process starts at: one no other test
    process's box holds (claim_cpu in the run's folder, given back after the test), so two boxes side by side each
    have a core of their own whatever the number of test processes."""
    mine = _worker_file(request.config)
    if mine is None:  # one test process: nothing beside it
        yield 0
        return
    cpu, claim = claim_cpu(mine.parent, os.cpu_count() or 1)
    try:
        yield cpu
    finally:
        if claim is not None:
            claim.unlink(missing_ok=True)
