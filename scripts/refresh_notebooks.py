"""Re-execute notebooks in place and report wall time and peak memory per notebook.

    make refresh                                    # every notebook, workshop profile, outputs written
    LABKIT_PROFILE=quick .venv/bin/python scripts/refresh_notebooks.py --no-write   # suite budget check

Instructors use it as the dry run before a workshop: a notebook that fails here fails in the room.
Peak memory is the kernel's with its children (e.g. horovodrun's ranks), sampled every 0.2 s, two ways:
RSS summed over the processes (counts shared libraries once per process, so it overstates a process tree)
and PSS (proportional set size: shared pages split between their users), the better estimate of what a
memory limit such as Binder's 2 GB sees.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent.parent


class PeakRSS(threading.Thread):
    """Samples the memory of a process tree until stopped; .peak (RSS) and .peak_pss in bytes."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak, self.peak_pss = pid, interval, 0, 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root] + root.children(recursive=True)
                rss = pss = 0
                for p in procs:
                    try:
                        info = p.memory_full_info()  # PSS where the OS reports it (Linux)
                        rss += info.rss
                        pss += getattr(info, "pss", info.rss)
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, rss)
                self.peak_pss = max(self.peak_pss, pss)
            except psutil.Error:
                pass
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join()


def run_notebook(path: Path, write: bool, timeout: int) -> tuple[float, int, int]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="labkit",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    monitor = None
    with client.setup_kernel():
        monitor = PeakRSS(client.km.provisioner.process.pid)
        monitor.start()
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
        finally:
            monitor.stop()
    elapsed = time.perf_counter() - start
    if write:
        nbformat.write(nb, path)
    return elapsed, monitor.peak, monitor.peak_pss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--no-write", action="store_true", help="execute only; leave the files as they are")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((HERE / "notebooks").glob("[0-9]*.ipynb"))
    import os
    print(f"profile: {os.environ.get('LABKIT_PROFILE', 'workshop')}")
    print(f"{'notebook':<32} {'wall time':>10} {'peak RSS':>10} {'peak PSS':>10}")
    total, failed = 0.0, []
    for path in paths:
        try:
            elapsed, peak, peak_pss = run_notebook(path, write=not args.no_write, timeout=args.timeout)
        except Exception as err:  # report and go on: the dry run should list every broken notebook
            failed.append(path.name)
            # nbclient's CellExecutionError carries the kernel's exception name and value
            what = f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}"
            print(f"{path.name:<32} FAILED: {what}")
            continue
        total += elapsed
        print(f"{path.name:<32} {elapsed:>8.1f} s {peak / 2**20:>6.0f} MiB {peak_pss / 2**20:>6.0f} MiB", flush=True)
    print(f"{'total':<32} {total:>8.1f} s")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
