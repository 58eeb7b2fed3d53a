"""Start Horovod ranks and bring their results back: command lines, hosts, streaming, kill-tree (04_horovod_scaling).

`launch(np_, script_args)` starts `python -m labkit.scale.hvd_train ...` on N ranks: by default with `mpirun` where
Horovod was built with MPI (Open MPI's settings that measured fastest on one machine, `choose_launcher`),
else `horovodrun --gloo` (also over the nodes of a Slurm allocation or other hosts), or `srun`; streams
rank 0's progress while it runs, and returns each rank's result dict. A timeout, an interrupt or a
crashed rank kills every process the launch started (found by process tree and by an environment
marker, so nothing is orphaned) and raises HorovodRunError with the failing rank's last stderr lines.
Where the ranks run (hosts, slots, the launcher's choice, core binding) is labkit.scale.hosts'; progress=True
prints rank 0's progress lines, a callable receives each as a dict. labkit.scale.scaling turns the results into
throughput and efficiency tables.

Shared-machine hygiene: the ranks get an allow-listed environment (child_env), never the caller's whole
one (Horovod's Gloo launcher writes every variable into each rank's command line, visible in `ps`); and a
watchdog process outlives the launcher to kill the launch's processes and remove its temporary folder if
the launcher dies without cleaning up (SIGKILL, a Jupyter kernel restart).
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

from labkit.base.checks import check_int, check_number
from labkit.scale.horovod_info import horovodrun_path
from labkit.scale.hosts import (  # noqa: F401  (where the ranks run: the launcher's inputs)
    FAST_MPI_SETTINGS,
    NODE_PREFIX,
    LauncherChoice,
    check_launcher,
    choose_launcher,
    core_binding,
    launch_problem,
    local_transports,
    parse_hosts,
    slurm_hosts,
    take_slots,
)

WORKER = "labkit.scale.hvd_train"  # the module every rank runs unless a launch names another
RANK_PYTHON_ENV = "LABKIT_RANK_PYTHON"  # the command that starts each rank's Python (rank_python)
MARKER_ENV = "LABKIT_RUN_ID"  # every process of one launch carries this, so none can escape the cleanup
PROGRESS_TAG = "LABKIT_PROGRESS"
# a rank's output line: horovodrun's "[1]<stdout>:text", mpirun --tag-output's "[1,1]<stdout>:text" (Open MPI 4)
# or "[1,1]<stdout>: text" (Open MPI 5): job id, rank
_LINE = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>: ?(.*)$")
# The environment a launch hands on: these names and prefixes, minus anything that looks like a credential.
ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "HOSTNAME",
             "TMPDIR", "TMP", "TEMP", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "KERAS_HOME",
             "XDG_CACHE_HOME", "MPLBACKEND", "MPLCONFIGDIR", "SSH_AUTH_SOCK")  # ssh to other hosts: a path
ENV_ALLOW_PREFIXES = ("LC_", "PYTHON", "CUDA_", "NVIDIA_", "NCCL_", "HOROVOD_", "GLOO_", "OMP_", "MKL_",
                      "KMP_", "OPENBLAS_", "BLIS_", "TF_", "XLA_", "SLURM_", "OMPI_", "PMIX_", "PMI_", "LABKIT_")
_ENV_DENY = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|COOKIE|(^|_)(API_?)?KEY($|_)", re.IGNORECASE)


class HorovodRunError(RuntimeError):
    """A launch failed, crashed or timed out; .rank, .returncode and .stderr_tail say where and why."""

    def __init__(self, message, *, rank=None, returncode=None, stderr_tail=(), timed_out=False):
        super().__init__(message)
        self.rank, self.returncode, self.timed_out = rank, returncode, timed_out
        self.stderr_tail = list(stderr_tail)



def build_command(np_: int, script_args=(), *, launcher: str = "auto", hosts=None, python=None,
                  env=None, export=(), module: str = WORKER, threads: int | None = None) -> list[str]:
    """The command line that starts np_ ranks of `python -m module` (labkit.scale.hvd_train by default).

    launcher: "gloo" (horovodrun --gloo), "mpi" (the mpirun of the MPI Horovod links, Open MPI 4 and 5 alike;
    export: the names of the variables it hands each rank, with -x, never their values), "srun" (Slurm
    starts the ranks; needs a Horovod built with MPI), "auto" or a LauncherChoice (choose_launcher's). threads:
    compute threads per rank, for mpirun's placement (core_binding; its transports: local_transports). python:
    the ranks' Python (default rank_python(): $LABKIT_RANK_PYTHON, else this Python).
    """
    check_int(np_, "np", minimum=1)
    launcher = choose_launcher(launcher, hosts, env).launcher
    worker = [*([python] if python else rank_python(env)), "-m", module, *map(str, script_args)]
    if launcher == "srun":
        if hosts is not None:
            raise ValueError("hosts cannot be given with launcher='srun': srun starts the ranks on its allocation")
        return ["srun", "--ntasks", str(np_), "--kill-on-bad-exit=1", *worker]
    if launcher == "mpi":
        from labkit.scale import mpi
        exe = mpi.mpirun_path()
        if exe is None:
            raise FileNotFoundError("mpirun not found: Horovod's MPI controller needs the mpirun of the Open MPI "
                                    "it was built against; `make setup` installs Open MPI from PyPI and builds "
                                    "Horovod with it (see `labkit doctor`), or use launcher='gloo'")
        placement = [*core_binding(np_, threads, hosts, env), *local_transports(hosts, env)]
        hosts = take_slots(hosts if hosts is not None else slurm_hosts(env) or [f"localhost:{np_}"], np_)
        # Open MPI 5's spelling (double dashes), which Open MPI 4 accepts too: horovodrun --mpi writes Open
        # MPI 4's single-dash `-bind-to none -map-by slot`, which Open MPI 5's mpirun refuses
        cmd = [exe, *placement, "-np", str(np_), "-H", ",".join(hosts), "--tag-output"]
        for name in export:
            cmd += ["-x", name]
        return cmd + worker
    exe = horovodrun_path()
    if exe is None:
        raise FileNotFoundError("horovodrun not found next to this Python or on PATH; "
                                "build Horovod with `make setup` (see `labkit doctor`)")
    if hosts is None:
        hosts = slurm_hosts(env) or [f"localhost:{np_}"]
    hosts = take_slots(hosts, np_)
    return [exe, "-np", str(np_), "-H", ",".join(hosts), "--gloo", *worker]


def rank_python(env=None) -> list[str]:
    """The command that starts each rank's Python: $LABKIT_RANK_PYTHON split as a shell splits it (a cluster
    whose ranks run in a container: `apptainer exec --nv course.sif python3`), else this Python. A first word
    that is not a program here is refused in one line, before anything starts."""
    import shlex
    import shutil
    text = (os.environ if env is None else env).get(RANK_PYTHON_ENV, "").strip()
    if not text:
        return [sys.executable]
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise ValueError(f"{RANK_PYTHON_ENV}: expected a command as a shell would split it; got {text!r} ({err})") \
            from None
    if shutil.which(words[0]) is None:
        raise ValueError(f"{RANK_PYTHON_ENV}: expected a command that starts Python, its first word a program "
                         f"here; got {text!r} ({words[0]!r} not found)")
    return words


def display_command(cmd) -> str:
    """A command line as a reader sees it: each program by its name, not the path it has on this machine."""
    import shlex
    if isinstance(cmd, str) or not all(isinstance(a, (str, os.PathLike)) for a in cmd):
        raise ValueError(f"cmd must be a list of arguments (str or path); got {cmd!r}")
    return " ".join(shlex.quote(Path(a).name if os.path.isabs(a) else str(a)) for a in cmd)


def child_env(env_extra=None, marker: str | None = None, base=None) -> dict:
    """The environment a launch hands to horovodrun and the ranks: the ENV_ALLOW names and prefixes of
    base (default os.environ) minus credential-like names (_ENV_DENY), then env_extra, then the marker.
    JUPYTER_TOKEN and other secrets never reach a rank, its command line or `ps`."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items()
           if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)) and not _ENV_DENY.search(k)}
    env.update({"TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2"), "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in (env_extra or {}).items()})
    if marker:
        env[MARKER_ENV] = marker
    return env


# Run by the launcher's child before it execs horovodrun: die with the launcher (Linux PR_SET_PDEATHSIG).
_PDEATHSIG = ("import ctypes, os, signal, sys\n"
              "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
              "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
              "os.execvp(sys.argv[2], sys.argv[2:])")


def _die_with_parent(cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", _PDEATHSIG, str(os.getpid()), *cmd] if sys.platform == "linux" else cmd


def _start_watchdog(marker: str, pgid: int, cleanup_dir: Path | None):
    """A process in its own session that waits on a pipe from the launcher. The launcher writes 'done'
    when it has cleaned up; end-of-file without it (the launcher died) makes the watchdog kill the
    launch's process group and marked processes and remove cleanup_dir. Returns the pipe's write end."""
    read_fd, write_fd = os.pipe()
    args = [sys.executable, "-m", "labkit.scale.launch", "--watchdog", marker, str(pgid), str(cleanup_dir or "")]
    try:
        subprocess.Popen(args, stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=child_env(), start_new_session=True, close_fds=True)
    finally:
        os.close(read_fd)
    return os.fdopen(write_fd, "w")


def _watchdog_main(marker: str, pgid: int, cleanup_dir: str) -> None:
    if sys.stdin.read() == "done":  # blocks until the launcher closes its end, however it ends
        return
    for _ in range(3):  # a middleman may start a late child while we kill: sweep again
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        _kill_and_wait(marked_processes(marker), 1.0)
        time.sleep(0.2)
    if cleanup_dir:
        shutil.rmtree(cleanup_dir, ignore_errors=True)


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


def _kill_and_wait(procs, grace: float, how: str = "kill") -> list:
    """Signal each of procs (how: "kill" or "terminate"; already gone is fine), wait up to grace seconds
    for them, return the ones still alive."""
    import psutil
    for p in procs:
        try:
            getattr(p, how)()
        except psutil.Error:
            pass
    return psutil.wait_procs(procs, timeout=grace)[1]


def kill_tree(proc, marker: str | None = None, grace: float = 3.0) -> int:
    """Terminate proc, its process group, all its descendants and every marked process; returns how many."""
    import psutil
    procs = {}
    try:
        root = psutil.Process(proc.pid)
        procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
    except psutil.Error:
        pass
    procs.update({p.pid: p for p in (marked_processes(marker) if marker else [])})
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher's own session (start_new_session=True)
    except OSError:
        pass
    _kill_and_wait(_kill_and_wait(list(procs.values()), grace, "terminate"), grace)
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
    """Which rank failed first: a rank whose traceback is its own (not a collective torn down under it), else a
    rank killed by SIGKILL (the word "Killed" in its stderr, as the shell reports it: kill -9, the out-of-memory
    killer; the others' errors follow from it, and Horovod may name one of them first when it sees their exits
    before that one's), else the rank Horovod names, else the first rank with a traceback."""
    with_tb = [r for r in sorted(tails) if any("Traceback" in t or "Error" in t for t in tails[r])]
    own = [r for r in with_tb if not any(m in t for t in tails[r] for m in _SECONDARY)]
    if own:
        return own[0]
    killed = [r for r in sorted(tails) if any(re.search(r"(?:^|\s)Killed(?:\s|$)", t) for t in tails[r])]
    if killed:
        return killed[0]
    for line in lines:
        # horovodrun: "Process 1 exit with status code 1" / "Process name: 1"; mpirun: "Process name: [[63841,1],1]"
        # (Open MPI 4) or "Process name: [prterun-host-1234@1,1]" (Open MPI 5): the rank is the last number
        m = (re.search(r"Process (?:name: )?(\d+)(?: exit with status code| *$)", line)
             or re.search(r"Process name: \[(?:\[[^\]]*\]|[^\],]+),(\d+)\]", line))
        if m:
            return int(m.group(1))
    return with_tb[0] if with_tb else None


def _stream(proc, timeout, start, progress, label, tail_lines):
    """Read horovodrun's prefixed output until it exits or timeout: (timed_out, rank stderr tails, other lines)."""
    tails = collections.defaultdict(lambda: collections.deque(maxlen=tail_lines))
    launcher_lines = collections.deque(maxlen=tail_lines)
    q = queue.Queue()
    for stream, name in ((proc.stdout, "out"), (proc.stderr, "err")):
        threading.Thread(target=_reader, args=(stream, name, q), daemon=True).start()
    open_streams = 2
    while open_streams:
        remaining = timeout - (time.perf_counter() - start)
        if remaining <= 0:
            return True, tails, launcher_lines
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
    try:
        proc.wait(timeout=max(0.1, timeout - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        return True, tails, launcher_lines
    return False, tails, launcher_lines


def _failure(label, timeout, wall, proc, timed_out, tails, launcher_lines) -> HorovodRunError:
    if timed_out:
        rank = next((r for r in sorted(tails) if tails[r]), None)
        detail = "\n".join(f"  [rank {r}] {t}" for r in sorted(tails) for t in tails[r]) or "  (no stderr)"
        return HorovodRunError(f"{label}: no result within timeout={timeout:g} s; every process was killed. "
                               f"Last stderr lines:\n{detail}", rank=rank, returncode=proc.returncode,
                               stderr_tail=[t for r in sorted(tails) for t in tails[r]], timed_out=True)
    rank = _failing_rank(launcher_lines, tails)
    tail = list(tails.get(rank, [])) if rank is not None else list(launcher_lines)
    where = f"rank {rank}" if rank is not None else "the launcher"
    body = "\n".join(f"  {t}" for t in tail) or "  (no stderr)"
    # SIGKILL (exit 137, or -9) with nothing said: what the kernel's out-of-memory killer leaves behind
    killed = proc.returncode in (137, -9) or any(re.search(r"(status code|Exit code:|exited with code) *(137|-9)\b"
                                                            r"|signal 9 \(Killed\)", line) for line in launcher_lines)
    if killed:
        body = (f"  {where} was killed by SIGKILL (exit code 137), most likely by the kernel's out-of-memory "
                "killer: the step needed more memory than the machine had. Lower --batch-size or the number "
                "of ranks (`dmesg | grep -i oom` shows it)" + "".join(f"\n  {t}" for t in tail))
    return HorovodRunError(f"{label}: {where} failed (exit code {proc.returncode}) after {wall:.1f} s; "
                           f"all processes were stopped. Last stderr lines of {where}:\n{body}",
                           rank=rank, returncode=proc.returncode, stderr_tail=tail)


def _launch_env(chosen: str, settings: dict, env_extra, marker: str) -> dict:
    """The ranks' environment: child_env with the launcher's settings, then the caller's, and the marker."""
    env = child_env({**settings, **(env_extra or {})}, marker)
    if chosen == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI 4's names, which Open MPI 5 (PRRTE) honours too
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _results(out: Path, np_: int, label: str, proc, wall: float) -> list[dict]:
    """Each rank's rank{R}.json, in rank order, with the launch's wall time; HorovodRunError if one is missing."""
    results = []
    for r in range(np_):
        f = out / f"rank{r}.json"
        if not f.is_file():
            raise HorovodRunError(f"{label}: rank {r} exited cleanly but wrote no {f.name}", rank=r,
                                  returncode=proc.returncode)
        results.append({**json.loads(f.read_text()), "wall_s": wall})
    return results


def _stream_and_clean(proc, marker, state: dict, timeout, start, progress, label, tail_lines):
    """_stream(proc), then kill every process of the launch left behind (all of them on a timeout or an
    interrupt); state["cleaned"] is True once that is done (else the watchdog finishes it)."""
    try:
        return _stream(proc, timeout, start, progress, label, tail_lines)
    except BaseException:  # KeyboardInterrupt (the notebook's stop button, SIGTERM in the CLI) included
        kill_tree(proc, marker)
        raise
    finally:
        if proc.poll() is None or marked_processes(marker):
            kill_tree(proc, marker)
        state["cleaned"] = True  # not reached if a second signal interrupts the cleanup


def launch(np_: int, script_args=(), *, launcher="auto", hosts=None, timeout: float = 300, progress=True,
           env_extra=None, out_dir=None, tail_lines: int = 15, label: str | None = None,
           marker: str | None = None, module: str = WORKER, threads: int | None = None) -> list[dict]:
    """Run `python -m module` (hvd_train) on np_ ranks: their results, or HorovodRunError with every process killed.
    launcher: a name, "auto", or a LauncherChoice made once for several launches (scaling.run's)."""
    check_number(timeout, "timeout", above=0)
    own_dir = out_dir is None
    out = Path(tempfile.mkdtemp(prefix="labkit-scale-")) if own_dir else Path(out_dir)
    watchdog, state = None, {"cleaned": False}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("rank*.json"):
            old.unlink()
        choice = choose_launcher(launcher, hosts, env_extra=env_extra)
        if launcher == "auto" and progress:  # a LauncherChoice was said by whoever made it
            print(choice.note, flush=True)
        marker = marker or uuid.uuid4().hex
        env = _launch_env(choice.launcher, choice.settings, env_extra, marker)
        if "TMPDIR" not in (env_extra or {}):  # the ranks' temporary files (TensorFlow's autograph modules) go
            scratch = out / f".tmp-{marker}"  # with the launch's folder, even from a rank killed mid-step
            scratch.mkdir()
            env["TMPDIR"] = str(scratch)
        cmd = build_command(np_, [*map(str, script_args), "--out", str(out)], launcher=choice, hosts=hosts,
                            export=sorted(env) if choice.launcher == "mpi" else (), module=module, threads=threads,
                            env=env)  # the environment mpirun runs in: the caller's transports, the allocation
        label, start = label or f"np={np_}", time.perf_counter()
        proc = subprocess.Popen(_die_with_parent(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True, bufsize=1)
        watchdog = _start_watchdog(marker, proc.pid, out if own_dir else None)
        timed_out, tails, launcher_lines = _stream_and_clean(proc, marker, state, timeout, start, progress, label,
                                                             tail_lines)
        wall = time.perf_counter() - start
        if timed_out or proc.returncode != 0:
            raise _failure(label, timeout, wall, proc, timed_out, tails, launcher_lines)
        return _results(out, np_, label, proc, wall)
    finally:
        if own_dir:
            shutil.rmtree(out, ignore_errors=True)
        elif marker is not None:
            shutil.rmtree(out / f".tmp-{marker}", ignore_errors=True)
        if watchdog is not None:
            try:
                watchdog.write("done" if state["cleaned"] else "")
                watchdog.close()
            except OSError:
                pass


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    _watchdog_main(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
