"""Worker processes for labkit.sweep: spawned, a thread budget each, and dying with the process that started them.

A notebook kernel or a `labkit sweep` killed with SIGKILL cannot clean up after itself, so each worker watches
its parent: on Linux the kernel kills it (prctl PR_SET_PDEATHSIG), everywhere (macOS) a daemon thread polling
os.getppid() does. Without this, two ~530 MB TensorFlow workers would wait forever for work that never comes.
(05_network_sweep)
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

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


def _worker_init(threads: int, tensorflow: bool, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the sweep's process, which ends the workers
    machine.limit_threads(threads, tensorflow=tensorflow)



def new_pool(num_workers: int, threads: int, tensorflow: bool = True) -> cf.ProcessPoolExecutor:
    """A spawn-context pool whose workers are pinned to `threads` threads each and die with this process.
    (05_network_sweep)"""
    return cf.ProcessPoolExecutor(max_workers=num_workers, mp_context=mp.get_context("spawn"),
                                  initializer=_worker_init, initargs=(threads, tensorflow, os.getpid()))


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


def raise_interrupt(signum, frame):
    """Signal handler: SIGTERM treated as Ctrl-C (install it with signal.signal in the main thread).
    (05_network_sweep)"""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
