"""Re-execute notebooks in place and report wall time, peak memory and load average per notebook.

    make refresh                                    # every notebook, workshop profile, outputs written
    make refresh FORCE=1                            # ... even on a busy machine (says so)
    LABKIT_STRICT_OBSERVATIONS=1 make refresh       # the committed outputs: on the reference machine, every
                                                    # observation the prose states must hold (else the notebook fails)
    LABKIT_PROFILE=quick .venv/bin/python scripts/refresh_notebooks.py --no-write   # suite budget check

Instructors use it as the dry run before a workshop: a notebook that fails here fails in the room.
Committed outputs are measurements, so the refresh refuses to start when the 1-minute load average is above
MAX_LOAD_PER_CORE x cores (--force overrides it and says so). It runs every notebook in one pass, with one
kernel per notebook and the one Horovod build it names in its header, records the load before and after
each notebook in the notebook's metadata (labkit.refresh) and the cells' execution timestamps (which
labkit.exercises.schedule reads), and saves each notebook in the format JupyterLab writes, so opening it changes
nothing. Any cell that raises fails the run (exit status 1, the notebook and the cell named): the asserts
that only run outside the quick profile (`profile() != "quick"`, `smoke=False`) bind here.
Peak memory is the kernel's with its children (e.g. horovodrun's ranks), sampled every 0.2 s, two ways:
RSS summed over the processes (counts shared libraries once per process, so it overstates a process tree)
and PSS (proportional set size: shared pages split between their users), the better estimate of what a
memory limit such as Binder's 2 GB sees.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

from kernel_client import SlicedWaitKernelManager  # scripts/, this script's own folder

HERE = Path(__file__).resolve().parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # this checkout's labkit
MAX_LOAD_PER_CORE = 0.3  # above it, other programs would slow the measurements the outputs commit
# between the course's notebooks, when a pass writes them: the last one's load decays (1-min average)
SETTLE_LOAD_PER_CORE, SETTLE_MAX_S = 0.5, 150


def settle(cores: int, *, load=None, sleep=time.sleep, clock=time.monotonic, limit_s: float = SETTLE_MAX_S) -> float:
    """Wait, at most limit_s seconds, until the 1-minute load average is at most SETTLE_LOAD_PER_CORE x cores: the
    notebook before left it high (its own launches), and a measuring notebook's first cell reads it to say whether
    the machine is busy. Returns the seconds waited."""
    load = load or load_average
    start = clock()
    while load() > SETTLE_LOAD_PER_CORE * cores and clock() - start < limit_s:
        sleep(2.0)
    return clock() - start


class CellFailed(Exception):
    """A cell raised while its notebook ran; ename/evalue as nbclient's CellExecutionError, the cell named."""

    def __init__(self, notebook: str, index: int, source: str, err: Exception):
        first = next((line for line in source.splitlines() if line.strip()), "")
        self.notebook, self.index = notebook, index
        self.ename = getattr(err, "ename", type(err).__name__)
        self.evalue = f"{getattr(err, 'evalue', err)} (cell {index}: {first[:80]!r})"
        super().__init__(f"{notebook}: cell {index} raised {self.ename}: {self.evalue}")


class Stopped(BaseException):
    """Ctrl-C or SIGTERM while a notebook ran: its kernel is shut down and nothing is written for it (a
    BaseException, so the pass's `except Exception` does not go on to the next notebook)."""

    def __init__(self, signum: int, notebook: str):
        self.signum = signum
        super().__init__(f"refresh: stopped by {signal.Signals(signum).name} during {notebook}; its kernel was "
                         "shut down and nothing was written for it")


def _stop_cells_on_signal(client, stopped: list) -> None:
    """Ctrl-C and SIGTERM cancel the cell that runs (nbclient's own handlers only shut the kernel down, and the
    cell then waits for a reply until its timeout): the signal is kept in stopped, the kernel cleaned up by
    setup_kernel's exit."""
    from jupyter_core.utils import ensure_event_loop
    loop = ensure_event_loop()  # the loop nbclient's calls run on (jupyter_core's run_sync), not the thread's own

    def stop(signum):
        stopped.append(signum)
        for task in asyncio.all_tasks(loop):
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(signum, stop, signum)


class ChangedOnDisk(Exception):
    """The notebook's file changed while it ran (an edit in JupyterLab): it is kept, nothing is written over it."""

    def __init__(self, path: Path):
        super().__init__(f"{path.name}: changed on disk while it ran (an edit was saved meanwhile); kept the edit "
                         "and wrote nothing for it: run it again to refresh its outputs")


class PeakRSS(threading.Thread):
    """Samples the memory of a process tree until stopped; .peak (RSS) and .peak_pss in bytes.

    RSS every `interval` seconds; PSS, which the kernel counts by walking each process's page tables (about 14 ms
    for one TensorFlow process, 43 ms for a kernel and its two workers), at most every `pss_interval` seconds.
    Sampled both every 0.2 s, the monitor took a fifth of a core, and in a 1-CPU box (scripts/binder_box.py) it took
    that from the notebook it was measuring."""

    def __init__(self, pid: int, interval: float = 0.2, pss_interval: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.interval, self.pss_interval, self.peak, self.peak_pss = pid, interval, pss_interval, 0, 0
        self._stop_event = threading.Event()

    def run(self):
        next_pss = 0.0
        while not self._stop_event.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root] + root.children(recursive=True)
                with_pss = time.monotonic() >= next_pss
                rss = pss = 0
                for p in procs:
                    try:
                        if with_pss:
                            info = p.memory_full_info()  # PSS where the OS reports it (Linux)
                            pss += getattr(info, "pss", info.rss)
                        else:
                            info = p.memory_info()
                        rss += info.rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, rss)
                if with_pss:
                    self.peak_pss = max(self.peak_pss, pss)
                    next_pss = time.monotonic() + self.pss_interval
            except psutil.Error:
                pass
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join()


def load_average() -> float:
    from labkit.base import timing
    return timing.load_average()


def jupyterlab_format(nb, language_info: dict):
    """The notebook as JupyterLab 4 saves it, so that opening it marks nothing modified; returns nb.

    JupyterLab fills metadata.language_info from the kernel as soon as one connects: a notebook saved with
    less (nbclient's per-cell execution never sets it) shows the "modified" dot on opening. It also writes
    nbformat 4.5 with an id on every cell; the bytes are nbformat.writes' (indent 1, sorted keys)."""
    if not isinstance(language_info, dict) or not language_info.get("name"):
        raise ValueError(f"language_info must be the kernel's language_info dict; got {language_info!r}")
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
    for cell in nb.cells:
        if not cell.get("id"):
            cell["id"] = uuid.uuid4().hex[:8]
    nb.metadata["language_info"] = dict(language_info)
    return nb


STALL_FLOOR_S, STALL_FACTOR = 180, 10  # a cell gets 10x its committed run time, 3 minutes at least


def committed_seconds(cell) -> float | None:
    """The seconds a code cell took in the committed run (its execution timestamps), or None where not recorded."""
    from datetime import datetime
    times = cell.get("metadata", {}).get("execution", {})
    try:
        start, end = times["iopub.execute_input"], times["shell.execute_reply"]
        parse = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (start, end)]
    except (KeyError, ValueError, AttributeError):
        return None
    return max(0.0, (parse[1] - parse[0]).total_seconds())


def cell_timeouts(nb, cap: int, profile: str):
    """nbclient's timeout_func: a cell that stalls (a kernel's reply lost, as once seen after a widget cell) fails
    in STALL_FACTOR x its committed run time (STALL_FLOOR_S at least, cap at most) instead of the whole cap, when
    the notebook's committed outputs come from the workshop profile and this pass runs it or the quick one; else cap."""
    committed = nb.metadata.get("labkit", {}).get("refresh", {}).get("profile")
    if committed != "workshop" or profile not in ("quick", "workshop"):
        return lambda cell: cap
    def bound(cell):
        seconds = committed_seconds(cell)
        return cap if seconds is None else int(min(cap, max(STALL_FLOOR_S, STALL_FACTOR * seconds)))
    bounds = {id(cell): bound(cell) for cell in nb.cells}  # now: the run rewrites the timestamps as it goes
    return lambda cell: bounds.get(id(cell), cap)


def run_notebook(path: Path, write: bool, timeout: int, record: dict | None = None,
                 kernel_stderr=None, notes: dict | None = None, stall_bounds: bool = True) -> tuple[float, int, int]:
    """Execute every cell; raises CellFailed naming the first cell that raised, or ChangedOnDisk when the file
    changed while it ran (nothing is written then).

    record, if given, receives what the run measured (load before/after, wall time): it also goes into the
    notebook's metadata as labkit.refresh, with notes (what the pass knows of the machine, e.g. generic_blas).
    stall_bounds: each cell fails in its bound (cell_timeouts); False: in `timeout` (a run at another shape, many
    times slower than the committed one by design)."""
    original = path.read_bytes()  # compared before the write: an edit saved meanwhile is never overwritten
    nb = nbformat.reads(original.decode("utf-8"), as_version=4)
    # record_timing (nbclient's default, stated): the cells' timestamps are the committed run time
    profile = os.environ.get("LABKIT_PROFILE", "workshop")
    client = NotebookClient(nb, timeout=timeout, kernel_name="labkit", record_timing=True,
                            kernel_manager_class=SlicedWaitKernelManager,  # a reply's lost wake-up costs 1 s
                            timeout_func=cell_timeouts(nb, timeout, profile) if stall_bounds else None,
                            resources={"metadata": {"path": str(path.parent)}})
    info = {"load_before": round(load_average(), 2)}
    start = time.perf_counter()
    monitor, stopped = None, []
    # the kernel's own stderr (ipykernel's transport warning; a ZMQError traceback when it is shut down mid-cell)
    # goes to kernel_stderr, a file, or nowhere: the cells' errors come back through the notebook protocol
    with contextlib.ExitStack() as stack:
        if kernel_stderr is None:
            kernel_stderr = stack.enter_context(tempfile.TemporaryFile())
        figures_file = stack.enter_context(_figures_record())  # what each observation saw (the reference file)
        stack.enter_context(client.setup_kernel(stderr=kernel_stderr))
        _stop_cells_on_signal(client, stopped)
        monitor = PeakRSS(client.km.provisioner.process.pid)
        monitor.start()
        try:
            language_info = client.wait_for_reply(client.kc.kernel_info())["content"]["language_info"]
            for index, cell in enumerate(nb.cells):
                try:
                    client.execute_cell(cell, index)
                except asyncio.CancelledError:
                    raise Stopped(stopped[0] if stopped else signal.SIGINT, path.name) from None
                except Exception as err:  # an assert, an error, a dead kernel: name the cell
                    if stopped:
                        raise Stopped(stopped[0], path.name) from None
                    raise CellFailed(path.name, index, cell.source, err) from err
        finally:
            monitor.stop()
        from labkit.base import reference
        figures = reference.read_record(figures_file)  # before the with removes the file
    elapsed = time.perf_counter() - start
    info.update(load_after=round(load_average(), 2), wall_s=round(elapsed, 1), date=reference.today())
    nb.metadata.setdefault("labkit", {})["refresh"] = dict(info, profile=os.environ.get("LABKIT_PROFILE", "workshop"),
                                                           **(notes or {}), figures=figures)
    jupyterlab_format(nb, language_info)
    if record is not None:
        record.update(info)
    if write:
        from labkit.base import resultsfile
        if path.read_bytes() != original:
            raise ChangedOnDisk(path)
        resultsfile.write_notebook(path, nb)  # atomic: a failed or killed refresh leaves the committed notebook
    return elapsed, monitor.peak, monitor.peak_pss


def horovod_build() -> str:
    """The one Horovod build every notebook of the pass uses, in words."""
    from labkit.scale import horovod_info as horovod
    build = horovod.horovod_build()
    if not build:
        return "none found (the Horovod cells will say so)"
    return f"{build['version']} (controllers: {', '.join(build.get('controllers', [])) or 'none'})"


def load_gate(force: bool, load: float, cores: int) -> str | None:
    """None when the machine is quiet enough to measure; else the one line that says why not (or that --force ran)."""
    limit = MAX_LOAD_PER_CORE * cores
    if not load > limit:  # NaN (no load average on this platform) passes
        return None
    busy = (f"load average {load:.2f} (1 min) is above {MAX_LOAD_PER_CORE} x {cores} cores = {limit:.2f}: "
            "other programs would slow the measurements these outputs commit")
    return f"--force: starting anyway; {busy}" if force else \
        f"refresh: {busy}. Wait until the machine is quiet, or run with --force (make refresh FORCE=1)"


@contextlib.contextmanager
def _figures_record():
    """A temporary file the kernel's observations append their figures to (RECORD_ENV set while the kernel
    starts, so the kernel inherits it); yields its path."""
    from labkit.base import reference
    with tempfile.TemporaryDirectory(prefix="labkit-figures-") as folder:
        where = Path(folder) / "figures.jsonl"
        old = os.environ.get(reference.RECORD_ENV)
        os.environ[reference.RECORD_ENV] = str(where)
        try:
            yield where
        finally:
            if old is None:
                os.environ.pop(reference.RECORD_ENV, None)
            else:
                os.environ[reference.RECORD_ENV] = old


def write_reference(paths=None) -> Path:
    """notebooks/results/reference.json from the committed notebooks (reference.from_notebooks: the one builder,
    called after a pass that wrote outputs, and by hand before the first such pass)."""
    from labkit.base import reference
    paths = paths or sorted((HERE / "notebooks").glob("[0-9]*.ipynb"))
    return reference.write(reference.from_notebooks(paths))


def generic_blas() -> str | None:
    """The one line saying numpy's BLAS runs a generic kernel on a CPU that has better; None when it does not."""
    from labkit.base import blas
    return blas.generic_blas_line()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--no-write", action="store_true", help="execute only; leave the files as they are")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    parser.add_argument("--force", action="store_true",
                        help=f"run even when the load average is above {MAX_LOAD_PER_CORE} x cores "
                        "(and on a generic BLAS kernel)")
    parser.add_argument("--allow-generic-blas", action="store_true",
                        help="run even when numpy's BLAS runs a generic kernel on this CPU (recorded in each notebook)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((HERE / "notebooks").glob("[0-9]*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"notebooks: no such file: {', '.join(missing)}")
    from labkit.base import machine
    load, cores = load_average(), machine.cores()
    gate = load_gate(args.force, load, cores)
    if gate and not args.force:
        print(gate, file=sys.stderr)
        return 2
    if gate:
        print(gate, flush=True)
    slow_blas = generic_blas()
    if slow_blas and not (args.force or args.allow_generic_blas):
        print(f"refresh: {slow_blas}; the committed numpy figures would understate a learner's machine. Run where "
              "OpenBLAS picks its own kernel, or with --allow-generic-blas (recorded in each notebook)",
              file=sys.stderr)
        return 2
    if slow_blas:
        print(f"generic BLAS allowed, recorded in each notebook: {slow_blas}", flush=True)
    profile = os.environ.get("LABKIT_PROFILE", "workshop")
    from labkit.base import observe
    strict = "asserted" if observe.strict() else "reported (LABKIT_STRICT_OBSERVATIONS=1 asserts them)"
    print(f"profile: {profile}  cores: {cores}  load average at the start: {load:.2f}  Horovod: {horovod_build()}"
          f"  observations: {strict}")
    if profile == "quick":
        print("quick profile: the asserts guarded by profile() != 'quick' do not run in this pass")
    print(f"{'notebook':<32} {'wall time':>10} {'peak RSS':>10} {'peak PSS':>10} {'load before -> after':>21}",
          flush=True)
    total, failed = 0.0, []
    ours = all(p.resolve().parent == HERE / "notebooks" for p in paths)  # the course's notebooks, not a test's
    for i, path in enumerate(paths):
        record = {}
        if i and ours and not args.no_write and (waited := settle(cores)) >= 1:
            print(f"(waited {waited:.0f} s for the load average to settle: {load_average():.2f})", flush=True)
        try:
            elapsed, peak, peak_pss = run_notebook(path, write=not args.no_write, timeout=args.timeout, record=record,
                                                   notes={"generic_blas": slow_blas})
        except Exception as err:  # report and go on: the dry run should list every broken notebook
            failed.append(str(err) if isinstance(err, (CellFailed, ChangedOnDisk))
                          else f"{path.name}: {type(err).__name__}: {err}")
            print(f"{path.name:<32} FAILED: {failed[-1]}", flush=True)
            continue
        total += elapsed
        print(f"{path.name:<32} {elapsed:>8.1f} s {peak / 2**20:>6.0f} MiB {peak_pss / 2**20:>6.0f} MiB "
              f"{record['load_before']:>11.2f} -> {record['load_after']:.2f}", flush=True)
    print(f"{'total':<32} {total:>8.1f} s   load average at the end: {load_average():.2f}")
    if not args.no_write and total and ours:
        print(f"reference run written: {write_reference().relative_to(HERE)}")
    if failed:
        print(f"FAILED: {len(failed)} of {len(paths)} notebooks; nothing was written for them:", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
    return 1 if failed else 0


def _stop_on_sigterm(signum, frame):
    raise Stopped(signum, "the start")


OWN_PREFIX = "labkit-refresh-"


def own_temp_folder() -> Path:
    """This run's temporary folder, named after its pid (the kernels' connection files, the figures record and the
    kernel's stderr go there: tempfile.tempdir; the kernels' own temporary files too: TMPDIR); the folders of runs
    killed with -9 (their pid gone) are removed first, as binder_box sweeps its own."""
    for d in Path(tempfile.gettempdir()).glob(f"{OWN_PREFIX}*"):
        pid = d.name.removeprefix(OWN_PREFIX).split("-")[0]
        if pid.isdigit() and d.is_dir() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{OWN_PREFIX}{os.getpid()}-"))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # outside a notebook's run (its own handlers take over there)
    own = own_temp_folder()
    tempfile.tempdir = str(own)  # nbclient writes each kernel's connection file to the temporary folder
    os.environ["TMPDIR"] = str(own)  # and the kernels keep theirs there (scratch, TensorFlow's autograph modules)
    try:
        sys.exit(main())
    except Stopped as err:  # one line, no traceback; the kernel was shut down on the way out
        print(err, file=sys.stderr)
        sys.exit(128 + err.signum)
    except KeyboardInterrupt:
        print("refresh: stopped by SIGINT; nothing was written for the notebook that was running", file=sys.stderr)
        sys.exit(130)
    finally:
        shutil.rmtree(own, ignore_errors=True)
