"""Worker processes for labkit.sweep: a thread budget each, and dying with the process that started them.

How they start (start_method): on Linux, forked from multiprocessing's fork server, one process per sweeping
process that imports TensorFlow and the sweep's code once, before any TensorFlow op runs; every worker of every
pool is forked from it (0.05 s instead of 2-3 s and 3 CPU-seconds of TensorFlow's import each, and the workers
share the imported code's memory: 2 workers and the server took 431 MiB PSS here against 2 spawned workers' 604).
Elsewhere (macOS: forking a process that has loaded TensorFlow and Apple's frameworks is not safe) spawned, each
importing TensorFlow itself. Either way a worker gets the environment its pool was made in (_worker_init); what a
forked worker cannot take over (the hash seed, TensorFlow's import-time settings, the CPUs) is handled when a
pool's settings differ from those the server started with: the server starts again with the pool's when no worker
of the old one is left, and the pool is spawned while one still runs. The server is stopped a minute after the last
sweep that used it (one_server), so no process holding TensorFlow outlives the sweeps by more.

A notebook kernel or a `labkit sweep` killed with SIGKILL cannot clean up after itself, so each worker watches
its parent: on Linux the kernel kills it (prctl PR_SET_PDEATHSIG), everywhere (macOS) a daemon thread polling
os.getppid() does. A forked worker's parent is the fork server, which lives on while any of its workers does: such
a worker also watches the process that made its pool (its pid and start time, so a reused pid is not taken for it)
and ends itself within a second of it; the server then exits too. Without this, two ~530 MB TensorFlow workers
would wait forever for work that never comes. (05_network_sweep)
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from labkit.base import machine


def die_with_parent(parent_pid: int) -> None:
    """Make this process die when its parent dies, however it dies (SIGKILL included).

    Linux: the kernel sends SIGKILL when the parent exits (prctl PR_SET_PDEATHSIG). Everywhere (macOS): a
    daemon thread polls os.getppid() and kills this process once the parent is gone. (05_network_sweep)"""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watchdog below still works
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=watch_parent, args=(parent_pid,), daemon=True, name="labkit-parent-watch").start()


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    while True:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(interval_s)


# what the fork server imports before it forks the first worker (labkit first: TensorFlow's log level); a server
# started for workers without TensorFlow (tensorflow=False) imports only labkit's sweep
PRELOAD = ["labkit", "tensorflow", "labkit.sweep.runner", "labkit.sweep.networks"]
PRELOAD_WITHOUT_TF = ["labkit", "labkit.sweep.runner"]


def start_method() -> str:
    """'forkserver' on Linux with /proc (a forked worker watches its pool's process there), 'spawn' elsewhere (the
    module's docstring says why). (05_network_sweep)"""
    return "forkserver" if sys.platform.startswith("linux") and start_time(os.getpid()) else "spawn"


# What a forked worker cannot take from its pool, being fixed when its server started: the hash seed, the settings
# TensorFlow reads at import, the CPUs. A pool made when these differ from the server's start is spawned instead.
_FIXED_AT_START = ("PYTHONHASHSEED", "TF_", "KERAS_", "ONEDNN_", "CUDA_")
_server = {"started_with": None, "users": 0, "timer": None}  # the fork server this process started, the sweeps
# using it, and the timer that stops it when idle
_server_lock = threading.RLock()  # held while a server stops: no sweep starts one meanwhile


def _fixed_at_start() -> tuple:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_FIXED_AT_START))
    return tuple(env), tuple(sorted(os.sched_getaffinity(0)))


def _context(tensorflow: bool = True):
    from multiprocessing import forkserver

    def running() -> bool:
        return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None

    method = start_method()
    if method == "forkserver":
        with _server_lock:
            wanted = _fixed_at_start()
            if running() and _server["started_with"] not in (None, wanted):
                # no worker of its pools left: it stops, and this pool starts it again below with its own settings
                # (one TensorFlow import instead of one per worker: 05's speed-up made 3 such pools per repeat,
                # after a network trained in the kernel had set the hash seed); else this pool is spawned
                before = _server["started_with"]
                _stop_server()
                if running():  # a worker left, or its stop timed out: its settings are still before's
                    _server["started_with"] = before
                    return mp.get_context("spawn")
            if not running() or _server["started_with"] is None:  # this pool starts it: its settings are the server's
                _server["started_with"] = wanted
                mp.set_forkserver_preload(PRELOAD if tensorflow else PRELOAD_WITHOUT_TF)
    return mp.get_context(method)


SERVER_IDLE_S = 60  # a fork server no sweep has used for this long is stopped (one_server)


@contextlib.contextmanager
def one_server():
    """A sweep's block (run_sweep, measure_speedup): its pools share one fork server, which is stopped once no such
    block has used it for SERVER_IDLE_S seconds and no worker is left, so that no process holding TensorFlow
    outlives the sweeps by more (an idle server would keep its memory, some 150-280 MiB, for the rest of a notebook
    kernel's life); sweeps run back to back, as a notebook's cells run, share it. (05_network_sweep)"""
    with _server_lock:
        _server["users"] += 1
        if _server["timer"] is not None:
            _server["timer"].cancel()
            _server["timer"] = None
    try:
        yield
    finally:
        with _server_lock:
            _server["users"] -= 1
            if _server["users"] == 0:
                _server["timer"] = threading.Timer(SERVER_IDLE_S, _stop_if_idle)
                _server["timer"].daemon = True
                _server["timer"].start()


def _stop_if_idle() -> None:
    with _server_lock:
        _server["timer"] = None
        if _server["users"] == 0:
            _stop_server()


def _stop_server(timeout_s: float = 10.0) -> None:
    """multiprocessing's fork server stopped (its own _stop: the end of the pipe that keeps it alive closed, then
    waited for) when no worker of any pool still runs: a worker holds that pipe too, and the server would wait for
    it. Waits at most timeout_s; a server that is not this process's, or a Python without _stop, is left running."""
    from multiprocessing import forkserver
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None or not hasattr(server, "_stop"):
        return
    if any(proc.is_alive() for proc in mp.active_children()):
        return
    stopper = threading.Thread(target=server._stop, daemon=True, name="labkit-forkserver-stop")
    stopper.start()
    stopper.join(timeout_s)
    with _server_lock:
        _server["started_with"] = None


def start_time(pid: int) -> str | None:
    """When process pid started, as Linux counts it (/proc/PID/stat, field 22); None where it is gone, a zombie
    that its parent has not reaped yet included (or where there is no /proc). With the pid it names one process,
    even after the pid is given to another."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # from field 3, the state
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def watch_process(pid: int, started: str, interval_s: float = 1.0) -> None:
    """Kill this process once process pid (that started at `started`) is gone. (05_network_sweep)"""
    while start_time(pid) == started:
        time.sleep(interval_s)
    os.kill(os.getpid(), signal.SIGKILL)


def _worker_init(threads: int, tensorflow: bool, parent_pid: int, tmp: str | None = None,
                 env: dict | None = None, parent_started: str | None = None) -> None:
    if os.getppid() == parent_pid:  # spawned: the process that made the pool is its parent
        die_with_parent(parent_pid)
    else:  # forked by the fork server: its parent, which outlives the pool's process while a worker lives
        die_with_parent(os.getppid())
        if parent_started is None or start_time(parent_pid) != parent_started:  # gone already
            os._exit(1)
        threading.Thread(target=watch_process, args=(parent_pid, parent_started), daemon=True,
                         name="labkit-pool-watch").start()
    if env is not None:  # the fork server has the environment of its own start: the pool's replaces it
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # read from TMPDIR again: the server's was cached at its own start
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the sweep's process, which ends the workers
    if tmp:  # a worker ended by kill_pool skips its own clean-up: its temporary files go with the pool's folder
        os.environ["TMPDIR"] = tempfile.tempdir = tmp
    machine.limit_threads(threads, tensorflow=tensorflow)


_POOL_TMP = re.compile(r"labkit-pool-(\d+)-")


def _sweep_orphans(parent: Path) -> None:
    """Remove the temporary folders of pools whose process is gone (a kernel killed with -9)."""
    for old in parent.glob("labkit-pool-*"):
        match = _POOL_TMP.match(old.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except OSError:  # alive, another user's
            pass



def new_pool(num_workers: int, threads: int, tensorflow: bool = True) -> cf.ProcessPoolExecutor:
    """A pool whose workers (started as start_method() says) are pinned to `threads` threads each, see this
    process's environment as it is now, and die with this process. (05_network_sweep)"""
    tmp = None
    with contextlib.suppress(OSError):  # no writable temporary folder: the workers keep the default
        _sweep_orphans(Path(tempfile.gettempdir()))
        tmp = tempfile.mkdtemp(prefix=f"labkit-pool-{os.getpid()}-")
    pool = cf.ProcessPoolExecutor(max_workers=num_workers, mp_context=_context(tensorflow), initializer=_worker_init,
                                  initargs=(threads, tensorflow, os.getpid(), tmp, dict(os.environ),
                                            start_time(os.getpid())))
    if tmp:  # removed once the pool is shut down and dropped, or at exit
        weakref.finalize(pool, shutil.rmtree, tmp, True)
    pool.labkit_tmp = tmp
    return pool


def kill_pool(pool) -> None:
    """End the workers now (an interrupt must not leave training running) and wait until they are gone.
    (05_network_sweep)"""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        try:
            proc.terminate()
        except Exception:
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    if getattr(pool, "labkit_tmp", None):  # the workers' temporary files, left by the kill
        shutil.rmtree(pool.labkit_tmp, ignore_errors=True)


class Interrupted(KeyboardInterrupt):
    """A signal treated as Ctrl-C (raise_interrupt); signum says which, for the exit status 128 + signum.
    (05_network_sweep)"""

    def __init__(self, signum: int):
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = signum


def raise_interrupt(signum, frame):
    """Signal handler: SIGTERM treated as Ctrl-C (install it with signal.signal in the main thread); raises
    Interrupted, a KeyboardInterrupt naming the signal. (05_network_sweep)"""
    raise Interrupted(signum)
