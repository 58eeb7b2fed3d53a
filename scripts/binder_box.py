"""Run notebooks inside a box like Binder's (2 GiB of memory, 2 CPUs) and report wall time and peak memory.

    sudo .venv/bin/python scripts/binder_box.py               # every notebook, workshop profile, files untouched
    .venv/bin/python scripts/binder_box.py notebooks/00_welcome.ipynb --profile quick
    .venv/bin/python scripts/binder_box.py --write            # the final refresh: outputs written back
    .venv/bin/python scripts/binder_box.py --alloc-test 3     # proves the limit bites: 3 GiB -> killed
    sudo .venv/bin/python scripts/binder_box.py --cpus 1      # a 1-CPU Binder session
    sudo .venv/bin/python scripts/binder_box.py --busy 1      # 2 CPUs, one kept busy by another program
    sudo .venv/bin/python scripts/binder_box.py --shapes      # every notebook in each shape: one table

Each notebook's row counts the observations that did not hold there (labkit.base.observe: speeds and
accuracies that differ from the reference machine's, printed as one line each in the notebook).

The box is a Linux control group (cgroup v1 memory + cpuset, or v2 memory.max + cpuset.cpus), which needs
root. This process moves itself into the group, so the notebook kernel it starts (and every child, such as
horovodrun's ranks) is inside; a process that allocates past the limit is killed by the kernel's OOM
killer (exit 137), as on Binder. The honest peak is the group's own high-water mark (v1
memory.max_usage_in_bytes, v2 memory.peak): every page charged to the box, this runner's own included
(Binder's box holds the Jupyter server too). Pages of shared libraries that a process outside the
box loaded first are charged outside it, so on a busy machine the box peak can read below PSS: take the
larger. The RSS/PSS columns are refresh_notebooks' samples of the
kernel's process tree.

The group, the busy processes, the kernel's connection files and the observations folder (both in this run's
own temporary folder) are removed on every path: success, error, Ctrl-C and SIGTERM (one line, no traceback).
The busy and allocating children die with this process (PR_SET_PDEATHSIG); what a `kill -9` of it leaves (its
cgroups, the kernel in them, its temporary folder) is removed by its reaper, a small process outside the box that
outlives it (start_reaper), and else by the next binder_box run.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
V1_MEMORY, V1_CPUSET = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/cpuset")
V2_ROOT = Path("/sys/fs/cgroup")
GiB = 2**30
PR_SET_PDEATHSIG = 1  # linux/prctl.h
OWNED = re.compile(r"labkit-box-(\d+)-")  # a box's cgroup or temporary folder, named after the process that owns it


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived: unwind (the box, its processes and files removed), then exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOPPING: list[int] = []  # the signal that stops this run, once one has arrived


def _stop(signum, frame):
    if STOPPING:  # a second Ctrl-C while the box is being removed: let the removal finish
        return
    STOPPING.append(signum)
    raise Stopped(signum)


def _parse_size(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    t = text.strip().lower()
    t = t[:-2] if t.endswith("ib") else t[:-1] if t.endswith("b") else t
    try:
        size = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        size = math.nan
    if not math.isfinite(size) or size <= 0:  # inf and nan parse as floats
        raise ValueError(f"memory: expected a positive size such as 2G, 2048M or bytes, got {text!r}")
    return int(size)


def cpus_here() -> int:
    """The CPUs this process may run on (a box can hold no more)."""
    return len(os.sched_getaffinity(0))


def die_with_parent() -> None:
    """In a child (preexec_fn): SIGKILL when the process that started it dies, even by `kill -9`."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


def _alive(pid: int) -> bool:
    """Whether pid runs: it exists and is not a zombie (a process killed by SIGKILL that its parent has not
    waited for yet keeps its /proc entry)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_reaper() -> int:
    """A process outside the box that outlives this one (its own session, stdio on the null device): when this
    process ends, however it ends (kill -9 included), it sweeps what this run left (sweep_orphans: the box's cgroups
    with the processes still in them, the temporary folder). Returns the pipe end this process keeps open: the
    reaper wakes when the pipe closes, that is when every holder of this end is gone."""
    r, w = os.pipe()
    if os.fork() == 0:  # the reaper
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, r)  # nothing of the owner's held open (a pipe its caller reads to the end)
            os.closerange(r + 1, 65536)
            owner = os.getppid()
            while os.read(r, 1):
                pass
            for _ in range(100):  # the owner may linger a moment as a zombie
                if not _alive(owner):
                    break
                time.sleep(0.05)
            sweep_orphans()
        finally:
            os._exit(0)
    os.close(r)
    return w


def sweep_orphans() -> list[str]:
    """Remove what binder_box runs that were killed (kill -9) left: their cgroups, with every process still in
    them (a kernel), and their temporary folders. Boxes whose owner still runs are left alone. The names removed."""
    swept = []
    for root in (V1_MEMORY, V1_CPUSET, V2_ROOT):
        for d in root.glob("labkit-box-*") if root.is_dir() else ():
            m = OWNED.match(d.name)
            if not (m and d.is_dir()) or _alive(int(m.group(1))):
                continue
            for pid in (d / "cgroup.procs").read_text().split() if (d / "cgroup.procs").exists() else ():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                try:
                    d.rmdir()
                    swept.append(str(d))
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
    for d in Path(tempfile.gettempdir()).glob("labkit-box-*"):
        m = OWNED.match(d.name)
        if m and d.is_dir() and not _alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
            swept.append(str(d))
    return swept


def unavailable_reason() -> str | None:
    """None when a box can be made here; else one line saying why not."""
    if not sys.platform.startswith("linux"):
        return f"cgroups are Linux-only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    if (V1_MEMORY / "memory.limit_in_bytes").exists():
        return None if os.access(V1_MEMORY, os.W_OK) else f"{V1_MEMORY} is not writable"
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return None if os.access(V2_ROOT, os.W_OK) else f"{V2_ROOT} is not writable"
    return "no cgroup memory controller is mounted (neither v1 nor v2)"


def own_cgroups() -> dict:
    """This process's cgroup in each hierarchy (/proc/self/cgroup): controller -> path, "" for cgroup v2's."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            out.update({name: path for name in (controllers.split(",") if controllers else [""])})
    except (OSError, ValueError):
        pass
    return out


class Box:
    """A memory + CPU limited cgroup; `with Box(...) as box: box.enter()` puts this process in it."""

    def __init__(self, memory: int = 2 * GiB, cpus: int = 2, first_cpu: int = 0):
        if memory < 64 * 2**20:
            raise ValueError(f"memory: expected at least 64 MiB, got {memory} bytes")
        if not 1 <= cpus <= cpus_here():
            raise ValueError(f"cpus: expected 1 to {cpus_here()} (the CPUs here), got {cpus}")
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        if not 0 <= first_cpu < cpus_here():
            raise ValueError(f"first-cpu: expected 0 to {cpus_here() - 1} (the CPUs here), got {first_cpu}")
        self.memory, self.cpus, self.first_cpu = memory, cpus, first_cpu
        self.name = f"labkit-box-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self.v1 = (V1_MEMORY / "memory.limit_in_bytes").exists()
        self.dirs: list[Path] = []
        self._home: list[Path] = []  # cgroup.procs files of the groups this process came from (enter(), close())
        self._entered = False

    # -- set up / tear down ----------------------------------------------------------------------------
    def _cpu_list(self, allowed: str) -> str:
        cpus = []
        for part in allowed.strip().split(","):
            lo, _, hi = part.partition("-")
            cpus += list(range(int(lo), int(hi or lo) + 1))
        cpus = cpus[self.first_cpu % len(cpus):] + cpus[: self.first_cpu % len(cpus)]  # from the first_cpu-th on
        return ",".join(str(c) for c in cpus[: self.cpus])

    def __enter__(self):
        origin = own_cgroups()  # where close() puts this process back: its own groups, not the hierarchies' roots
        try:
            if self.v1:
                mem = V1_MEMORY / self.name
                mem.mkdir()
                self.dirs.append(mem)
                (mem / "memory.limit_in_bytes").write_text(str(self.memory))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(self.memory))
                self._home.append(V1_MEMORY / origin.get("memory", "/").lstrip("/") / "cgroup.procs")
                if V1_CPUSET.exists():
                    cs = V1_CPUSET / self.name
                    cs.mkdir()
                    self.dirs.append(cs)
                    (cs / "cpuset.cpus").write_text(self._cpu_list((V1_CPUSET / "cpuset.cpus").read_text()))
                    (cs / "cpuset.mems").write_text((V1_CPUSET / "cpuset.mems").read_text().strip())
                    self._home.append(V1_CPUSET / origin.get("cpuset", "/").lstrip("/") / "cgroup.procs")
            else:
                grp = V2_ROOT / self.name
                grp.mkdir()
                self.dirs.append(grp)
                (grp / "memory.max").write_text(str(self.memory))
                if (grp / "memory.swap.max").exists():
                    (grp / "memory.swap.max").write_text("0")
                if (grp / "cpuset.cpus").exists():
                    (grp / "cpuset.cpus").write_text(self._cpu_list((V2_ROOT / "cpuset.cpus.effective").read_text()))
                self._home.append(V2_ROOT / origin.get("", "/").lstrip("/") / "cgroup.procs")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _procs_file(self, d: Path) -> Path:
        return d / "cgroup.procs"

    def pids(self) -> list[int]:
        out = set()
        for d in self.dirs:
            try:
                out |= {int(p) for p in self._procs_file(d).read_text().split()}
            except OSError:
                pass
        return sorted(out)

    def close(self):
        """Move this process out, end what it left behind in the box (its own children), remove the group."""
        me = os.getpid()
        for home in self._home if self._entered else ():  # a process that never entered stays where it is
            try:
                home.write_text(str(me))
            except OSError:
                pass
        for pid in self.pids():  # only processes this runner started can be in the box
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                print(f"binder_box: could not remove {d}", file=sys.stderr)
        self.dirs = []

    # -- use ---------------------------------------------------------------------------------------------
    def enter(self, pid: int | None = None):
        """Put a process (default: this one) into the box; its future children start inside."""
        self._entered = self._entered or pid in (None, os.getpid())
        for d in self.dirs:
            self._procs_file(d).write_text(str(pid or os.getpid()))

    def _mem(self, v1_name: str, v2_name: str) -> Path:
        return self.dirs[0] / (v1_name if self.v1 else v2_name)

    def reset_peak(self):
        if self.v1:
            self._mem("memory.max_usage_in_bytes", "").write_text("0")
        # v2's memory.peak can be reset only on newer kernels (write to it); try, else keep the running max
        elif (p := self._mem("", "memory.peak")).exists():
            try:
                p.write_text("reset")
            except OSError:
                pass

    def peak(self) -> int | None:
        p = self._mem("memory.max_usage_in_bytes", "memory.peak")
        return int(p.read_text()) if p.exists() else None

    def oom_kills(self) -> int:
        p = self._mem("memory.oom_control", "memory.events")
        if not p.exists():
            return 0
        for line in p.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


def start_hogs(box: Box, count: int) -> list:
    """`count` busy processes in the box, each spinning on one of its CPUs (the last ones): the other
    programs of a shared machine. The caller stops them (stop_hogs); closing the box kills them too."""
    hogs = []
    for i in range(count):
        def pin(i=i):  # in the child: into the box, whose cpuset now bounds its CPUs, then onto one of them
            die_with_parent()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops binder_box, which stops this quietly
            box.enter()
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[-1 - i % len(cpus)]})

        hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin))
    return hogs


def stop_hogs(hogs: list) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def alloc_test(box: Box, gib: float) -> int:
    """Start a child in the box that touches `gib` GiB; return its exit status (137 = OOM-killed)."""
    code = (f"import sys; b = bytearray({int(gib * GiB)}); b[::4096] = b'x' * len(b[::4096]); "
            "print('allocated', len(b) >> 20, 'MiB'); sys.exit(0)")
    def start():
        die_with_parent()
        box.enter()

    child = subprocess.Popen([sys.executable, "-c", code], preexec_fn=start)
    rc = child.wait()
    return 128 - rc if rc < 0 else rc  # a signal -N reads as 128+N, as a shell reports it


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--memory", default="2G", help="memory limit (default 2G, Binder's)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs in the box (default 2)")
    parser.add_argument("--first-cpu", type=int, default=0, metavar="K",
                        help="the box's CPUs start at the K-th CPU this process may use (default 0): two boxes side "
                             "by side each get a core of their own")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N of the box's CPUs kept busy by a spinning process, as on a shared machine (default 0)")
    parser.add_argument("--profile", default=None,
                        help="LABKIT_PROFILE for the kernels (default: $LABKIT_PROFILE or workshop)")
    parser.add_argument("--write", action="store_true", help="write the executed notebooks back (final refresh)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    parser.add_argument("--shapes", action="store_true",
                        help="run the notebooks in each of SHAPES (a fresh box each) and print one table")
    parser.add_argument("--alloc-test", type=float, metavar="GIB",
                        help="only check that the limit bites: a child allocates GIB GiB in the box")
    args = parser.parse_args(argv)
    # Ctrl-C and SIGTERM (a scheduler, `kill`) unwind alike: the box, its processes and files are removed
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop)
    try:
        return _main(args)
    except (Stopped, KeyboardInterrupt) as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"binder_box: stopped by {signal.Signals(signum).name}; box and its files removed", file=sys.stderr)
        return 128 + signum


def _main(args) -> int:
    try:
        memory = _parse_size(args.memory)
        box = Box(memory, args.cpus, args.first_cpu)  # --cpus checked before --busy, which is read against it
        if not 0 <= args.busy <= args.cpus:
            raise ValueError(f"busy: expected 0 to --cpus ({args.cpus}) busy CPUs, got {args.busy}")
    except (ValueError, RuntimeError) as err:
        print(f"binder_box: {err}", file=sys.stderr)
        return 2
    missing = [str(p) for p in args.notebooks if not p.exists()]
    if missing:
        print(f"binder_box: notebooks: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    for name in sweep_orphans():
        print(f"binder_box: removed {name}, left by a binder_box that was killed", file=sys.stderr)
    start_reaper()  # its pipe end stays open until this process ends
    if args.shapes:
        return shapes_table(args)
    with box:
        cpus = f"{args.cpus} CPU{'' if args.cpus == 1 else 's'}"
        print(f"box: {memory / GiB:.2f} GiB memory, {cpus}, cgroup {'v1' if box.v1 else 'v2'} "
              f"({box.name})", flush=True)
        hogs = []
        try:
            hogs = start_hogs(box, args.busy)
            if hogs:
                spinning = f"{len(hogs)} spinning process{'' if len(hogs) == 1 else 'es'}"
                print(f"busy: {spinning}, pid {' '.join(str(h.pid) for h in hogs)}", flush=True)
            return _in_box(box, args, memory)
        finally:
            stop_hogs(hogs)


# the machine shapes a learner brings (issue text: a 1-CPU Binder session, a 2-CPU laptop with a busy core),
# beside the reference shape: (label, CPUs, of them busy)
SHAPES = (("2 CPUs (reference)", 2, 0), ("1 CPU", 1, 0), ("2 CPUs, 1 busy", 2, 1))


def shapes_table(args) -> int:
    """Run the notebooks once per shape (each in a fresh box of --memory, observations printed, not asserted)
    and print one table: notebook x shape -> wall time, box peak, observations that did not hold."""
    rows, failed = [], False
    for label, cpus, busy in SHAPES:
        cmd = [sys.executable, str(Path(__file__).resolve()), *map(str, args.notebooks), "--memory", args.memory,
               "--cpus", str(cpus), "--busy", str(busy), "--timeout", str(args.timeout)]
        if args.profile:
            cmd += ["--profile", args.profile]
        env = {**os.environ, "LABKIT_STRICT_OBSERVATIONS": "0"}
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as child:  # its stderr shown as is
            try:
                out = child.communicate()[0]
            except BaseException:  # stopped: the child cleans up its own box on SIGTERM
                child.terminate()
                child.wait()
                raise
        done = subprocess.CompletedProcess(cmd, child.returncode, out)
        print(done.stdout, end="", flush=True)
        failed |= done.returncode != 0
        for line in done.stdout.splitlines():
            parts = line.split()
            if parts and parts[0].endswith(".ipynb"):
                ok = parts[1] != "FAILED"
                rows.append((parts[0], label, f"{parts[1]} s" if ok else "FAILED", f"{parts[3]} MiB" if ok else "",
                             parts[-1] if ok else ""))
    print(f"\n{'notebook':<28} {'shape':<20} {'wall time':>10} {'box peak':>10} {'not held':>9}")
    for name, label, wall, peak, not_held in sorted(rows):
        print(f"{name:<28} {label:<20} {wall:>10} {peak:>10} {not_held:>9}")
    return 1 if failed else 0


def _in_box(box: Box, args, memory: int) -> int:
    """What main does inside the box: the allocation test, or every notebook with its wall time and peaks."""
    if args.alloc_test is not None:
        rc = alloc_test(box, args.alloc_test)
        print(f"allocating {args.alloc_test:g} GiB in the box: exit {rc}"
              f"{' (OOM-killed)' if rc == 137 else ''}, OOM kills counted {box.oom_kills()}")
        return 0 if (rc == 137) == (args.alloc_test * GiB > memory) else 1
    if args.profile:
        os.environ["LABKIT_PROFILE"] = args.profile
    os.environ.setdefault("LABKIT_PROFILE", "workshop")
    sys.path.insert(0, str(HERE / "scripts"))
    box.enter()
    paths = args.notebooks or sorted((HERE / "notebooks").glob("[0-9]*.ipynb"))
    print(f"profile: {os.environ['LABKIT_PROFILE']}  write: {'yes' if args.write else 'no'}")
    print(f"{'notebook':<28} {'wall time':>10} {'box peak':>10} {'peak RSS':>10} {'peak PSS':>10} {'not held':>9}",
          flush=True)
    # this run's own folder (named after it, so a run killed with -9 is swept by the next): the observations
    # logs, and the kernels' connection files, so that none is left in the user's Jupyter runtime folder
    own = Path(tempfile.mkdtemp(prefix=f"labkit-box-{os.getpid()}-"))
    tempfile.tempdir = str(own)  # nbclient writes each kernel's connection file to the temporary folder
    tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(own)  # and the kernels keep theirs there (scratch, TensorFlow's autograph modules)
    try:
        return _run_notebooks(box, args, paths, own)
    finally:
        tempfile.tempdir = None
        os.environ.pop("TMPDIR") if tmpdir is None else os.environ.update(TMPDIR=tmpdir)
        shutil.rmtree(own, ignore_errors=True)
        os.environ.pop("LABKIT_OBSERVATIONS_LOG", None)


def _run_notebooks(box: Box, args, paths: list, logs: Path) -> int:
    """Each notebook in the box: one row of wall time, peaks and observations that did not hold."""
    import refresh_notebooks  # the one notebook executor

    failed = []
    for path in paths:
        box.reset_peak()
        kills = box.oom_kills()
        log = logs / f"{path.stem}.txt"
        os.environ["LABKIT_OBSERVATIONS_LOG"] = str(log)  # the kernel inherits it: observe appends what did not hold
        kernel_log = logs / f"{path.stem}.kernel.log"  # shown when the notebook fails, not after a Ctrl-C
        try:
            with open(kernel_log, "w") as stderr:
                elapsed, rss, pss = refresh_notebooks.run_notebook(path, write=args.write, timeout=args.timeout,
                                                                   kernel_stderr=stderr)
        except refresh_notebooks.Stopped as stop:  # its own Ctrl-C/SIGTERM handling while a notebook runs
            raise Stopped(stop.signum) from None
        except Exception as err:
            if STOPPING:  # not the notebook's failure: the kernel's clean-up failed on the way out (ZMQError)
                raise Stopped(STOPPING[0]) from None
            failed.append(path.name)
            sys.stderr.write("".join(kernel_log.read_text().splitlines(keepends=True)[-20:]))
            oom = box.oom_kills() > kills
            what = ("OOM-killed past the box's limit" if oom else
                    f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}")
            peak = box.peak()
            print(f"{path.name:<28} FAILED ({what}); box peak {peak / 2**20:.0f} MiB" if peak else
                  f"{path.name:<28} FAILED ({what})", flush=True)
            continue
        peak = box.peak()
        not_held = log.read_text().splitlines() if log.exists() else []
        print(f"{path.name:<28} {elapsed:>8.1f} s {(peak or 0) / 2**20:>6.0f} MiB "
              f"{rss / 2**20:>6.0f} MiB {pss / 2**20:>6.0f} MiB {len(not_held):>9}", flush=True)
        for line in not_held:
            print(f"    {line}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
