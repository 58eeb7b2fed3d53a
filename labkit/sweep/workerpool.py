"""Worker processes for labkit.sweep: spawned, a thread budget each, and dying with the process that started them.

A notebook kernel or a `labkit sweep` killed with SIGKILL cannot clean up after itself, so each worker watches
its parent: on Linux the kernel kills it (prctl PR_SET_PDEATHSIG), everywhere (macOS) a daemon thread polling
os.getppid() does. Without this, two ~530 MB TensorFlow workers would wait forever for work that never comes.
(05_network_sweep)
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


def _worker_init(threads: int, tensorflow: bool, parent_pid: int, tmp: str | None = None) -> None:
    die_with_parent(parent_pid)
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
    """A spawn-context pool whose workers are pinned to `threads` threads each and die with this process.
    (05_network_sweep)"""
    tmp = None
    with contextlib.suppress(OSError):  # no writable temporary folder: the workers keep the default
        _sweep_orphans(Path(tempfile.gettempdir()))
        tmp = tempfile.mkdtemp(prefix=f"labkit-pool-{os.getpid()}-")
    pool = cf.ProcessPoolExecutor(max_workers=num_workers, mp_context=mp.get_context("spawn"),
                                  initializer=_worker_init, initargs=(threads, tensorflow, os.getpid(), tmp))
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
