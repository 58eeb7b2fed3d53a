"""Start Horovod ranks and bring their results back: command lines, hosts, streaming, kill-tree (04_horovod_scaling).

`launch(np_, script_args)` starts `horovodrun -np N -H localhost:N --gloo python -m labkit.hvd_train ...`
(`--mpi`, or `srun` / horovodrun over the nodes of a Slurm allocation when SLURM_JOB_ID is set), streams
rank 0's progress while it runs, and returns each rank's result dict. A timeout, an interrupt or a
crashed rank kills every process the launch started (found by process tree and by an environment
marker, so nothing is orphaned) and raises HorovodRunError with the failing rank's last stderr lines.
labkit.scaling turns the results into throughput and efficiency tables.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

MARKER_ENV = "LABKIT_RUN_ID"  # every process of one launch carries this, so none can escape the cleanup
PROGRESS_TAG = "LABKIT_PROGRESS"
_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


class HorovodRunError(RuntimeError):
    """A launch failed, crashed or timed out; .rank, .returncode and .stderr_tail say where and why."""

    def __init__(self, message, *, rank=None, returncode=None, stderr_tail=(), timed_out=False):
        super().__init__(message)
        self.rank, self.returncode, self.timed_out = rank, returncode, timed_out
        self.stderr_tail = list(stderr_tail)





def horovodrun_path() -> str | None:
    """$LABKIT_HOROVODRUN (a site's module-loaded Horovod), else the horovodrun of this Python environment
    (next to sys.executable), else the one on PATH; None when there is none."""
    override = os.environ.get("LABKIT_HOROVODRUN", "").strip()
    if override:
        return override if Path(override).exists() else None
    local = Path(sys.executable).with_name("horovodrun")
    return str(local) if local.exists() else shutil.which("horovodrun")


def slurm_hosts(env=None) -> list[str]:
    """'host:slots' for each node of the current Slurm allocation (empty outside Slurm)."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return []
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        names = [n for n in nodelist.split(",") if n and "[" not in n]
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": take the first node's count
    per_node = (env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
                or env.get("SLURM_CPUS_ON_NODE", "1"))
    slots = int(per_node) if per_node.isdigit() else 1
    return [f"{n}:{slots}" for n in names]


def take_slots(hosts, np_: int) -> list[str]:
    """The first np_ slots of 'host:slots' entries.

    horovodrun's Gloo launcher starts a rank in EVERY slot it is given, whatever -np says, so np=1 inside
    a 2-task allocation must be handed 'node:1', not 'node:2'.
    """
    taken, left = [], np_
    for entry in hosts:
        name, _, slots = entry.rpartition(":")
        n = min(int(slots) if name else 1, left)
        if n > 0:
            taken.append(f"{name or slots}:{n}")
            left -= n
    if left > 0:
        raise ValueError(f"np={np_} needs more slots than the hosts offer ({','.join(hosts)})")
    return taken


def build_command(np_: int, script_args=(), *, launcher: str = "auto", hosts=None, python=None,
                  env=None) -> list[str]:
    """The command line that starts np_ ranks of labkit.hvd_train.

    launcher: "gloo" | "mpi" (horovodrun with that controller), "srun" (Slurm starts the ranks; needs a
    Horovod built with MPI), or "auto": gloo, over the allocation's nodes when SLURM_JOB_ID is set.
    """
    if not isinstance(np_, int) or isinstance(np_, bool) or np_ < 1:
        raise ValueError(f"np must be a positive int; got {np_!r}")
    if launcher not in ("auto", "gloo", "mpi", "srun"):
        raise ValueError(f"launcher must be 'auto', 'gloo', 'mpi' or 'srun'; got {launcher!r}")
    python = python or sys.executable
    worker = [python, "-m", "labkit.hvd_train", *map(str, script_args)]
    if launcher == "srun":
        return ["srun", "--ntasks", str(np_), "--kill-on-bad-exit=1", *worker]
    exe = horovodrun_path()
    if exe is None:
        raise FileNotFoundError("horovodrun not found next to this Python or on PATH; "
                                "build Horovod with `make setup` (see `labkit doctor`)")
    if hosts is None:
        hosts = slurm_hosts(env) or [f"localhost:{np_}"]
    hosts = take_slots(hosts, np_)
    return [exe, "-np", str(np_), "-H", ",".join(hosts), "--mpi" if launcher == "mpi" else "--gloo", *worker]


def _reader(stream, name, q):
    for line in iter(stream.readline, ""):
        q.put((name, line.rstrip("\n")))
    q.put((name, None))


def marked_processes(marker: str) -> list:
    """Live processes whose environment carries MARKER_ENV=marker (what one launch started)."""
    import psutil
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(MARKER_ENV) == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _kill_and_wait(procs, grace: float) -> None:
    """SIGKILL each of procs (already gone is fine) and wait up to grace seconds for them."""
    import psutil
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=grace)


def kill_tree(proc, marker: str | None = None, grace: float = 3.0) -> int:
    """Terminate proc, its process group, all its descendants and every marked process; returns how many."""
    import psutil
    procs = {}
    try:
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            procs[p.pid] = p
    except psutil.Error:
        pass
    if marker:
        for p in marked_processes(marker):
            procs[p.pid] = p
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher's own session (start_new_session=True)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    for p in procs.values():
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    _kill_and_wait(alive, grace)
    if marker:  # anything started while we were killing (a middleman's late child)
        _kill_and_wait(marked_processes(marker), grace)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()
    return len(procs)


# Lines that mark a rank as a victim of another rank's failure rather than its cause.
_SECONDARY = ("Horovod has been shut down", "HorovodAllreduce", "HorovodBroadcast", "Connection closed",
              "Connection reset", "gloo", "Gloo", "peer")


def _failing_rank(lines, tails) -> int | None:
    """Which rank failed first: a rank whose traceback is its own (not a collective torn down under it),
    else the rank Horovod names, else the first rank with a traceback."""
    with_tb = [r for r in sorted(tails) if any("Traceback" in t or "Error" in t for t in tails[r])]
    own = [r for r in with_tb if not any(m in t for t in tails[r] for m in _SECONDARY)]
    if own:
        return own[0]
    for line in lines:
        m = re.search(r"Process (?:name: )?(\d+)(?: exit with status code| *$)", line)
        if m:
            return int(m.group(1))
    return with_tb[0] if with_tb else None


def launch(np_: int, script_args=(), *, launcher="auto", timeout: float = 300, progress=True,
           env_extra=None, out_dir=None, tail_lines: int = 15, label: str | None = None,
           marker: str | None = None) -> list[dict]:
    """Run labkit.hvd_train on np_ ranks and return the ranks' result dicts (sorted by rank).

    Streams rank 0's progress lines (progress=True prints them; a callable receives each parsed dict).
    On timeout, KeyboardInterrupt or a non-zero exit every process of the launch is killed and
    HorovodRunError is raised with the failing rank's last `tail_lines` stderr lines. Every process
    carries MARKER_ENV=marker (a fresh id unless given), which is how stragglers are found and killed.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds; got {timeout}")
    own_dir = out_dir is None
    out = Path(tempfile.mkdtemp(prefix="labkit-scale-")) if own_dir else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    args = [*map(str, script_args), "--out", str(out)]
    cmd = build_command(np_, args, launcher=launcher)
    marker = marker or uuid.uuid4().hex
    env = dict(os.environ)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", MARKER_ENV: marker})
    if launcher == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.update({k: str(v) for k, v in (env_extra or {}).items()})
    env[MARKER_ENV] = marker
    label = label or f"np={np_}"
    tails = collections.defaultdict(lambda: collections.deque(maxlen=tail_lines))
    launcher_lines = collections.deque(maxlen=tail_lines)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, bufsize=1)
    q = queue.Queue()
    readers = [threading.Thread(target=_reader, args=(s, n, q), daemon=True)
               for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in readers:
        t.start()
    open_streams, timed_out = 2, False
    try:
        while open_streams:
            remaining = timeout - (time.perf_counter() - start)
            if remaining <= 0:
                timed_out = True
                break
            try:
                name, line = q.get(timeout=min(0.5, remaining))
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            m = _LINE.match(line)
            if not m:
                launcher_lines.append(line)
                continue
            rank, stream, text = int(m.group(1)), m.group(2), m.group(3)
            if stream == "stderr":
                tails[rank].append(text)
            elif text.startswith(PROGRESS_TAG):
                try:
                    info = json.loads(text[len(PROGRESS_TAG):])
                except ValueError:
                    continue
                if callable(progress):
                    progress(info)
                elif progress:
                    print(f"{label}: step {info['step']}/{info['steps']}  loss {info['loss']:.3f}  "
                          f"({info['elapsed_s']:.1f} s)", flush=True)
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, timeout - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                timed_out = True
    except BaseException:  # KeyboardInterrupt (the notebook's stop button) included
        kill_tree(proc, marker)
        raise
    finally:
        if proc.poll() is None or marked_processes(marker):
            kill_tree(proc, marker)
    wall = time.perf_counter() - start
    if timed_out:
        rank = next((r for r in sorted(tails) if tails[r]), None)
        detail = "\n".join(f"  [rank {r}] {t}" for r in sorted(tails) for t in tails[r]) or "  (no stderr)"
        raise HorovodRunError(f"{label}: no result within timeout={timeout:g} s; every process was killed. "
                              f"Last stderr lines:\n{detail}", rank=rank, returncode=proc.returncode,
                              stderr_tail=[t for r in sorted(tails) for t in tails[r]], timed_out=True)
    if proc.returncode != 0:
        rank = _failing_rank(launcher_lines, tails)
        tail = list(tails.get(rank, [])) if rank is not None else list(launcher_lines)
        where = f"rank {rank}" if rank is not None else "the launcher"
        body = "\n".join(f"  {t}" for t in tail) or "  (no stderr)"
        raise HorovodRunError(f"{label}: {where} failed (exit code {proc.returncode}) after {wall:.1f} s; "
                              f"all processes were stopped. Last stderr lines of {where}:\n{body}",
                              rank=rank, returncode=proc.returncode, stderr_tail=tail)
    results = []
    for r in range(np_):
        f = out / f"rank{r}.json"
        if not f.is_file():
            raise HorovodRunError(f"{label}: rank {r} exited cleanly but wrote no {f.name}", rank=r,
                                  returncode=proc.returncode)
        results.append(json.loads(f.read_text()))
    for res in results:
        res["wall_s"] = wall
    if own_dir:
        shutil.rmtree(out, ignore_errors=True)
    return results
