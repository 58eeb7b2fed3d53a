"""Data-parallel scaling: launch Horovod, measure honestly, model the allreduce, extrapolate (04_horovod_scaling).

Three parts, in the order the notebook teaches them:

1. Launch and measure. `run(np=[1, 2])` starts `horovodrun -np N -H localhost:N --gloo python -m
   labkit.hvd_train ...` once per worker count (`--mpi`, or `srun` / horovodrun over the nodes of a Slurm
   allocation when SLURM_JOB_ID is set), streams rank 0's progress while it runs, and returns a pandas
   DataFrame with one row per worker count: total images/s (mean and spread over timed repeats), speedup,
   efficiency, each rank's weight checksum. A timeout, an interrupt or a crashed rank kills every process
   the launch started (found by process tree and by an environment marker, so nothing is orphaned) and
   raises HorovodRunError with the failing rank's last stderr lines.
2. The ring-allreduce cost model: T(n, p) = 2(p-1) alpha + 2 (p-1)/p n beta (+ (p-1)/p n gamma for the
   reduction), applied per fusion buffer (Horovod's tensor fusion packs many small gradients into one
   buffer, paying alpha once). `calibrate_allreduce()` measures alpha and beta here with 2 ranks.
3. A step-time model: compute time (measured, or FLOPs / (peak x utilisation) for a GPU) plus the part of
   the communication that does not overlap it, giving throughput and efficiency for 1..512 GPUs.
   It is a model, not a measurement: the notebook sets it beside published numbers.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MARKER_ENV = "LABKIT_RUN_ID"  # every process of one launch carries this, so none can escape the cleanup
PROGRESS_TAG = "LABKIT_PROGRESS"
_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
MiB = 2**20


class HorovodRunError(RuntimeError):
    """A launch failed, crashed or timed out; .rank, .returncode and .stderr_tail say where and why."""

    def __init__(self, message, *, rank=None, returncode=None, stderr_tail=(), timed_out=False):
        super().__init__(message)
        self.rank, self.returncode, self.timed_out = rank, returncode, timed_out
        self.stderr_tail = list(stderr_tail)


# ----------------------------------------------------------------------------------------------
# 1. launching

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


def train_args(*, model="small_cnn", batch_size=64, steps=20, repeats=3, warmup_steps=5, data="synthetic",
               num_examples=None, lr=0.01, scale_lr=False, lr_warmup_steps=0, threads=1, sync=True,
               seed=0, extra=()) -> list[str]:
    """hvd_train's command-line arguments for the given settings."""
    if num_examples is None:  # enough for every rank to take a few batches of its shard
        num_examples = max(1024, 8 * batch_size * 2)
    a = ["--model", model, "--batch-size", batch_size, "--steps", steps, "--repeats", repeats,
         "--warmup-steps", warmup_steps, "--data", data, "--num-examples", num_examples, "--lr", lr,
         "--lr-warmup-steps", lr_warmup_steps, "--threads", threads, "--seed", seed]
    if scale_lr:
        a.append("--scale-lr")
    if not sync:
        a.append("--no-sync")
    return [str(v) for v in a] + [str(v) for v in extra]


def summarize(ranks: list[dict]) -> dict:
    """One row from the ranks of one launch: total images/s over ranks, per timed repeat, mean and spread."""
    per_repeat = np.sum([r["images_per_sec_repeats"] for r in ranks], axis=0)
    checks = [r["checksum"] for r in ranks]
    r0 = ranks[0]
    return {
        "np": r0["size"], "batch_size": r0["batch_size"], "global_batch_size": r0["global_batch_size"],
        "images_per_sec": float(per_repeat.mean()),
        "images_per_sec_std": float(per_repeat.std(ddof=1)) if per_repeat.size > 1 else 0.0,
        "images_per_sec_per_rank": float(per_repeat.mean()) / r0["size"],
        "step_time_s": float(np.median([r["step_time_s"] for r in ranks])),
        "cpu_step_time_s": float(np.median([r.get("cpu_step_time_s", np.nan) for r in ranks])),
        # a synchronous step ends when the slowest rank's does: the max over ranks
        "step_time_p10_s": float(np.max([r.get("step_time_p10_s", np.nan) for r in ranks])),
        "final_loss": r0["final_loss"], "checksums": checks, "in_sync": len(set(checks)) == 1,
        "threads": r0["threads"], "model": r0["model"], "data": r0["data"], "sync": r0["sync"],
        "wall_s": r0.get("wall_s"), "ranks": ranks,
    }


def efficiency(df, base_np=None):
    """Add speedup (throughput vs the smallest np) and efficiency (speedup / (np / base np)) columns."""
    df = df.copy()
    base = df["np"].min() if base_np is None else base_np
    ref = df.loc[df["np"] == base]
    if ref.empty:
        raise ValueError(f"base_np={base} is not among the measured np values {list(df['np'])}")
    ips1 = float(ref["images_per_sec"].iloc[0])
    df["speedup"] = df["images_per_sec"] / ips1
    df["efficiency"] = df["speedup"] / (df["np"] / base)
    for col, out in (("step_time_p10_s", "p10_efficiency"), ("cpu_step_time_s", "cpu_efficiency")):
        if col in df and "batch_size" in df:
            # per-rank time per image at np=base over the same at np (weak or strong scaling alike):
            # p10 = the uncontended steps of a shared machine; cpu = work done, not time spent waiting
            per_image = df[col] / df["batch_size"]
            df[out] = float(per_image[df["np"] == base].iloc[0]) / per_image
    return df


def run(np=(1, 2), *, model="small_cnn", batch_size=64, steps=20, repeats=3, warmup_steps=5,
        scaling="weak", data="synthetic", num_examples=None, lr=0.01, scale_lr=False, lr_warmup_steps=0,
        threads=1, sync=True, seed=0, launcher="auto", timeout=300, progress=True, env_extra=None,
        extra=()):
    """Train with Horovod once per worker count; returns a DataFrame (one row per np) with efficiency.

    scaling="weak": batch_size images per rank per step (the work grows with np);
    scaling="strong": batch_size images per step in total, split over the ranks (fixed work).
    Each row keeps every rank's result dict in column "ranks"; `per_rank(df)` unfolds them.
    """
    import pandas as pd
    nps = [np] if isinstance(np, int) else list(np)
    if not nps or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in nps):
        raise ValueError(f"np must be a positive int or a list of them; got {np!r}")
    if scaling not in ("weak", "strong"):
        raise ValueError(f"scaling must be 'weak' or 'strong'; got {scaling!r}")
    bad = [n for n in nps if scaling == "strong" and batch_size % n]
    if bad:
        raise ValueError(f"strong scaling splits batch_size={batch_size} over np={bad[0]}: "
                         f"choose a batch_size divisible by every np")
    rows = []
    for n in nps:
        per_rank = batch_size // n if scaling == "strong" else batch_size
        args = train_args(model=model, batch_size=per_rank, steps=steps, repeats=repeats,
                          warmup_steps=warmup_steps, data=data, num_examples=num_examples, lr=lr,
                          scale_lr=scale_lr, lr_warmup_steps=lr_warmup_steps, threads=threads, sync=sync,
                          seed=seed, extra=extra)
        ranks = launch(n, args, launcher=launcher, timeout=timeout, progress=progress, env_extra=env_extra)
        row = summarize(ranks)
        row["scaling"] = scaling
        rows.append(row)
    return efficiency(pd.DataFrame(rows))


def per_rank(df):
    """One row per rank of every launch in a run() DataFrame (np, rank, images/s, checksum, ...)."""
    import pandas as pd
    keep = ("rank", "size", "pid", "threads", "batch_size", "images_per_sec", "images_per_sec_std",
            "step_time_s", "final_loss_local", "final_loss", "checksum", "examples_this_rank")
    rows = [{k: r[k] for k in keep} for ranks in df["ranks"] for r in ranks]
    return pd.DataFrame(rows).rename(columns={"size": "np"})


def to_json(df, **extra) -> dict:
    """The `labkit scale --json` document (DESIGN.md contract), plus the settings in extra."""
    import pandas as pd
    runs = []
    for _, r in df.iterrows():
        runs.append({"np": int(r["np"]), "images_per_sec": float(r["images_per_sec"]),
                     "images_per_sec_std": float(r["images_per_sec_std"]),
                     "efficiency": float(r["efficiency"]), "speedup": float(r["speedup"]),
                     "checksums": list(r["checksums"]), "in_sync": bool(r["in_sync"]),
                     "batch_size": int(r["batch_size"]), "global_batch_size": int(r["global_batch_size"]),
                     "step_time_s": float(r["step_time_s"]), "final_loss": float(r["final_loss"]),
                     "threads": int(r["threads"])})
        for extra_key in ("p10_efficiency", "cpu_efficiency", "step_time_p10_s", "cpu_step_time_s"):
            if extra_key in r and pd.notna(r[extra_key]):
                runs[-1][extra_key] = float(r[extra_key])
    return {"runs": runs, "all_in_sync": all(x["in_sync"] for x in runs), **extra}


# ----------------------------------------------------------------------------------------------
# plots

def plot_scaling(df, ax=None, what="throughput", label=None):
    """Throughput (images/s) or efficiency vs workers, with the ideal (linear) line."""
    import matplotlib.pyplot as plt
    if what not in ("throughput", "efficiency"):
        raise ValueError(f"what must be 'throughput' or 'efficiency'; got {what!r}")
    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    n = df["np"].to_numpy()
    base = n.min()
    if what == "throughput":
        ips = df["images_per_sec"].to_numpy()
        ax.errorbar(n, ips, yerr=df["images_per_sec_std"], marker="o", capsize=3, label=label or "measured")
        ax.plot(n, ips[n == base][0] * n / base, "k--", label="ideal (linear)")
        ax.set_ylabel("images/s (all workers)")
    else:
        ax.plot(n, df["efficiency"], marker="o", label=label or "measured")
        ax.axhline(1.0, color="k", ls="--", label="ideal")
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("efficiency")
    ax.set_xlabel("workers (np)")
    ax.set_xticks(n)
    ax.legend()
    return ax


# ----------------------------------------------------------------------------------------------
# 2. the ring-allreduce cost model

def ring_allreduce_time(n_bytes, p: int, alpha: float, beta: float, gamma: float = 0.0):
    """Ring allreduce of n_bytes on p workers: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.

    alpha: seconds per message (latency), beta: seconds per byte on the wire, gamma: seconds per byte
    to add (the reduction). Reduce-scatter then allgather: 2(p-1) steps, each moving n/p bytes.
    """
    if p < 1:
        raise ValueError(f"p must be >= 1; got {p}")
    if np.any(np.asarray(n_bytes) < 0):
        raise ValueError("n_bytes must be >= 0")
    if p == 1:
        return 0.0 * np.asarray(n_bytes, dtype=float) if np.ndim(n_bytes) else 0.0
    frac = (p - 1) / p
    return 2 * (p - 1) * alpha + 2 * frac * np.asarray(n_bytes, dtype=float) * beta \
        + frac * np.asarray(n_bytes, dtype=float) * gamma


def fusion_buffers(tensor_bytes, threshold: float = 64 * MiB) -> list[int]:
    """Horovod's tensor fusion: pack ready gradients, in order, into buffers of at most `threshold` bytes.

    threshold=0 turns fusion off (one allreduce per tensor); a tensor bigger than the threshold
    travels alone. Default 64 MiB = HOROVOD_FUSION_THRESHOLD's default.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 bytes; got {threshold}")
    buffers, cur = [], 0
    for t in tensor_bytes:
        t = int(t)
        if threshold == 0 or t >= threshold:
            if cur:
                buffers.append(cur)
                cur = 0
            buffers.append(t)
        elif cur + t > threshold:
            buffers.append(cur)
            cur = t
        else:
            cur += t
    if cur:
        buffers.append(cur)
    return buffers


@dataclass
class AllreduceModel:
    """alpha (s/message), beta (s/byte) and gamma (s/byte, reduction) for one network; see ring_allreduce_time."""
    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""

    def time(self, n_bytes, p):
        return ring_allreduce_time(n_bytes, p, self.alpha, self.beta, self.gamma)

    def fused_time(self, tensor_bytes, p, threshold=64 * MiB) -> float:
        """Total time of the allreduces one step needs after tensor fusion."""
        return float(sum(self.time(b, p) for b in fusion_buffers(tensor_bytes, threshold)))

    @property
    def bandwidth(self) -> float:
        """bytes/s the wire term corresponds to (1 / beta)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf


def fit_alpha_beta(n_bytes, times, p: int = 2, name="calibrated") -> AllreduceModel:
    """Fit T = 2(p-1) alpha + 2(p-1)/p n beta to measured allreduce times (relative least squares).

    With one p the reduction term cannot be told apart from the wire term: it is folded into beta.
    """
    n = np.asarray(n_bytes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("need at least two (n_bytes, time) pairs of equal length")
    if p < 2:
        raise ValueError(f"calibration needs p >= 2 workers; got {p}")
    w = 1.0 / t  # relative errors: small and large messages count alike
    A = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    return AllreduceModel(alpha=max(float(alpha), 0.0), beta=max(float(beta), 1e-15), name=name)


def calibrate_allreduce(np_: int = 2, sizes=(4, 4096, 65536, 262144, 1048576, 4 * MiB), repeats=5,
                        chain=20, threads=1, launcher="auto", timeout=180, env_extra=None):
    """Time hvd.allreduce over message sizes on np_ ranks; returns (DataFrame, fitted AllreduceModel)."""
    import pandas as pd
    args = ["--bench-allreduce", "--sizes", ",".join(str(int(s)) for s in sizes), "--repeats", repeats,
            "--chain", chain, "--threads", threads]
    ranks = launch(np_, args, launcher=launcher, timeout=timeout, progress=False, env_extra=env_extra,
                   label=f"allreduce np={np_}")
    # a collective finishes when the slowest rank does: take the max over ranks per size
    df = pd.DataFrame([{"bytes": row["bytes"], "rank": r["rank"], "time_s": row["time_s"]}
                       for r in ranks for row in r["allreduce"]])
    df = df.groupby("bytes", as_index=False)["time_s"].max()
    model = fit_alpha_beta(df["bytes"], df["time_s"], p=np_, name=f"this machine ({np_} ranks)")
    df["model_s"] = model.time(df["bytes"].to_numpy(), np_)
    return df, model


# ----------------------------------------------------------------------------------------------
# 3. step-time model and extrapolation

def step_time(p: int, compute_s: float, tensor_bytes, net: AllreduceModel, overlap: float = 0.0,
              threshold=64 * MiB) -> float:
    """Compute time plus the communication that does not hide behind it.

    overlap in [0, 1]: the fraction of the allreduce that runs during backprop (Horovod starts reducing
    the last layers' gradients while earlier layers still compute). Hidden time never exceeds compute.
    """
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1]; got {overlap}")
    if compute_s < 0:
        raise ValueError(f"compute_s must be >= 0; got {compute_s}")
    comm = net.fused_time(tensor_bytes, p, threshold)
    return compute_s + comm - min(overlap * comm, compute_s)


# Published numbers used when labkit.hardware / labkit.flops are not available. Forward pass,
# one image at the model's native size: multiply-accumulates (GMACs) and parameters (millions).
MODEL_SPECS = {
    "alexnet": {"gmacs": 0.72, "mparams": 61.1, "image": 224},     # Krizhevsky et al. 2012 (single tower)
    "vgg16": {"gmacs": 15.5, "mparams": 138.4, "image": 224},      # Simonyan & Zisserman 2015
    "resnet50": {"gmacs": 4.1, "mparams": 25.6, "image": 224},     # He et al. 2016, Table 1 ("FLOPs" = MACs)
    "resnet101": {"gmacs": 7.8, "mparams": 44.5, "image": 224},
    "inception_v3": {"gmacs": 5.7, "mparams": 23.8, "image": 299},  # Szegedy et al. 2016
}
# FP32 peak (TFLOP/s) per GPU (vendor data sheets; K80: one of the board's two GK210 dies, boost clock).
GPU_SPECS = {"K80": 4.4, "P100": 10.6, "V100": 15.7, "A100": 19.5, "H100": 67.0}
# Network per GPU-to-GPU hop: alpha (s, per message incl. software) and bandwidth (bytes/s, one direction).
NETWORKS = {
    "10GbE (TCP)": AllreduceModel(alpha=30e-6, beta=1 / 1.1e9, name="10GbE (TCP)"),
    "25GbE (RoCE)": AllreduceModel(alpha=8e-6, beta=1 / 2.9e9, name="25GbE (RoCE)"),
    "50GbE (RoCE)": AllreduceModel(alpha=8e-6, beta=1 / 5.8e9, name="50GbE (RoCE)"),
    "100Gb InfiniBand EDR": AllreduceModel(alpha=3e-6, beta=1 / 11.5e9, name="100Gb InfiniBand EDR"),
    "PCIe 3 x16 (in node)": AllreduceModel(alpha=5e-6, beta=1 / 10e9, name="PCIe 3 x16 (in node)"),
    "NVLink V100 (in node)": AllreduceModel(alpha=5e-6, beta=1 / 130e9, name="NVLink V100 (in node)"),
}
GPUS_PER_NODE = 8


def gpu_peak_tflops(gpu: str) -> float:
    """FP32 peak of a GPU: labkit.hardware's table when present, else GPU_SPECS."""
    try:
        from labkit import hardware  # issue 4's device table (datasheet peaks)
        return float(hardware.get_device(gpu).fp32_tflops)
    except Exception:  # noqa: BLE001 - absent, or a name it does not know: fall back to our own numbers
        pass
    if gpu not in GPU_SPECS:
        raise ValueError(f"gpu must be one of {', '.join(GPU_SPECS)}; got {gpu!r}")
    return GPU_SPECS[gpu]


def _as_network(network) -> AllreduceModel:
    if isinstance(network, AllreduceModel):
        return network
    if network not in NETWORKS:
        raise ValueError(f"network must be an AllreduceModel or one of {', '.join(NETWORKS)}; got {network!r}")
    return NETWORKS[network]


def predict(gpus=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), *, model="resnet101", gpu="P100",
            network="25GbE (RoCE)", intra_node="PCIe 3 x16 (in node)", batch_per_gpu=64,
            utilization=0.5, overlap=0.0, threshold=64 * MiB, compute_s=None, grad_bytes=None,
            gpus_per_node=GPUS_PER_NODE):
    """Predicted step time, images/s and efficiency of synchronous data parallelism (a model, not a run).

    compute_s per step = batch x 3 x 2 x MACs / (peak x utilization) unless given; gradient bytes =
    4 x parameters unless given. Up to gpus_per_node the ring runs over intra_node links, beyond that
    the slowest link (the network between nodes) sets alpha and beta.
    """
    import pandas as pd
    spec = MODEL_SPECS.get(model)
    if spec is None and (compute_s is None or grad_bytes is None):
        raise ValueError(f"model must be one of {', '.join(MODEL_SPECS)} (or give compute_s and grad_bytes); "
                         f"got {model!r}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1]; got {utilization}")
    if compute_s is None:
        compute_s = batch_per_gpu * 6 * spec["gmacs"] * 1e9 / (gpu_peak_tflops(gpu) * 1e12 * utilization)
    if grad_bytes is None:
        grad_bytes = 4 * spec["mparams"] * 1e6
    tensors = [grad_bytes] if np.ndim(grad_bytes) == 0 else list(grad_bytes)
    inter, intra = _as_network(network), _as_network(intra_node)
    rows = []
    for p in gpus:
        net = intra if p <= gpus_per_node else AllreduceModel(
            alpha=max(inter.alpha, intra.alpha), beta=max(inter.beta, intra.beta), name=inter.name)
        comm = net.fused_time(tensors, p, threshold)
        t = step_time(p, compute_s, tensors, net, overlap, threshold)
        rows.append({"gpus": p, "compute_s": compute_s, "comm_s": comm, "step_s": t,
                     "images_per_sec": p * batch_per_gpu / t, "efficiency": compute_s / t})
    return pd.DataFrame(rows)


# Published scaling results the notebook sets beside the model (typed in from the sources).
PUBLISHED = [
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "resnet101", "gpus": 512,
     "efficiency": 0.90, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "inception_v3", "gpus": 512,
     "efficiency": 0.90, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Horovod paper (Sergeev & Del Balso 2018)", "model": "vgg16", "gpus": 512,
     "efficiency": 0.68, "setup": "Pascal GPUs, 25GbE RoCE, TensorFlow + Horovod"},
    {"source": "Goyal et al. 2017", "model": "resnet50", "gpus": 256, "efficiency": 0.90,
     "setup": "P100, 8 per server, 50GbE, Caffe2, 32 images/GPU"},
    {"source": "seed 003 (Chameleon, MXNet)", "model": "resnet50", "gpus": 2, "efficiency": 389.81 / 194.86 / 2,
     "setup": "1 GPU per node, SSH, synthetic data: 194.86 -> 389.81 images/s"},
    {"source": "seed 003 (Chameleon, MXNet)", "model": "resnet50", "gpus": 8, "efficiency": 1466.31 / 194.86 / 8,
     "setup": "1 GPU per node: 194.86 -> 1466.31 images/s (7.5x)"},
    {"source": "seed 001 (MATLAB, p2.8xlarge)", "model": "alexnet", "gpus": 8, "efficiency": 1.7 ** 3 / 8,
     "setup": "8 K80 GPUs in one machine, ~70% more images/s per doubling"},
]


# Seed 003 (Chameleon slides), "Impact of batch size": images/s (+- spread) on one GPU, typed in.
CHAMELEON_BATCH = {
    "batch_size": [1, 2, 4, 8, 16, 32],
    "AlexNet": [1067.86, 1442.78, 1861.16, 2168.15, 2296.58, 1960.96],
    "Inception V3": [19.06, 34.19, 56.37, 81.78, 108.00, 125.26],
    "ResNet-152": [10.15, 18.92, 33.11, 48.74, 65.57, 77.46],
}


def chameleon_batch_table():
    """Seed 003's images/s vs batch size table (one GPU) as a DataFrame indexed by batch size."""
    import pandas as pd
    return pd.DataFrame(CHAMELEON_BATCH).set_index("batch_size")


def published():
    """The published scaling numbers as a DataFrame (source, model, gpus, efficiency, setup)."""
    import pandas as pd
    return pd.DataFrame(PUBLISHED)


def explorer():
    """A widget: GPUs x model x GPU type x network x overlap -> predicted efficiency and images/s."""
    import ipywidgets as W

    out = W.Output()
    gpus = W.SelectionSlider(options=[2 ** k for k in range(10)], value=64, description="GPUs")
    model = W.Dropdown(options=list(MODEL_SPECS), value="resnet101", description="model")
    gpu = W.Dropdown(options=list(GPU_SPECS), value="P100", description="GPU")
    net = W.Dropdown(options=[k for k in NETWORKS if "in node" not in k], value="25GbE (RoCE)",
                     description="network")
    overlap = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.1, description="overlap")

    def update(*_):
        row = predict([gpus.value], model=model.value, gpu=gpu.value, network=net.value,
                      overlap=overlap.value).iloc[0]
        with out:
            out.clear_output(wait=True)
            print(f"{gpus.value} x {gpu.value}, {model.value}, {net.value}, overlap {overlap.value:.0%}: "
                  f"efficiency {row.efficiency:.0%}, {row.images_per_sec:,.0f} images/s "
                  f"(compute {row.compute_s * 1e3:.0f} ms + exposed comm "
                  f"{(row.step_s - row.compute_s) * 1e3:.0f} ms per step)")

    for w in (gpus, model, gpu, net, overlap):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([gpus, model]), W.HBox([gpu, net]), overlap, out])


# ----------------------------------------------------------------------------------------------
# single-process experiments (no Horovod): batch size vs throughput, LR scaling and warmup

def _local_setup(threads):
    import labkit  # noqa: F401
    import tensorflow as tf
    labkit.quiet()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already started in this process: keep its pools
            pass
    return tf


def _train_step_fn(tf, model, opt):
    from labkit.hvd_train import _ends_in_softmax
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=not _ends_in_softmax(model))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def throughput_vs_batch(batch_sizes=(1, 2, 4, 8, 16, 32, 64), *, model="small_cnn", steps=10, repeats=3,
                        warmup_steps=2, threads=None, seed=0):
    """Training images/s of one worker for each batch size (seed 003's table, on this CPU)."""
    import pandas as pd
    from labkit.hvd_train import build_model, summarize_times
    tf = _local_setup(threads)
    rows = []
    for b in batch_sizes:
        if b < 1:
            raise ValueError(f"batch sizes must be >= 1; got {b}")
        tf.random.set_seed(seed)
        net = build_model(model)
        opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
        step = _train_step_fn(tf, net, opt)
        x = tf.random.normal([b, *net.input_shape[1:]], seed=seed)
        y = tf.zeros([b], tf.int32)
        for _ in range(warmup_steps):
            float(step(x, y))
        times = []
        for _ in range(steps * repeats):
            t0 = time.perf_counter()
            float(step(x, y))
            times.append(time.perf_counter() - t0)
        s = summarize_times(times, b, steps)
        rows.append({"batch_size": b, "images_per_sec": s["images_per_sec"],
                     "images_per_sec_std": s["images_per_sec_std"], "step_time_s": s["step_time_s"]})
    return pd.DataFrame(rows)


def lr_scaling_curves(*, batch_size=32, k=8, lr=0.02, epochs=4, warmup_epochs=1, num_examples=4096,
                      data="synthetic", threads=None, seed=0, evals_per_epoch=4):
    """Training loss vs epochs for: batch b at lr; batch k*b at lr (naive); at k*lr (linear scaling);
    at k*lr with gradual warmup (Goyal et al.). One process: the k*b batch is what k workers of b would
    average, computed at once (exact for SGD on the same examples). Returns a long DataFrame.
    """
    import pandas as pd
    from labkit.hvd_train import build_model, scaled_lr, synthetic_data
    if k < 1 or batch_size < 1 or epochs < 1:
        raise ValueError("k, batch_size and epochs must be >= 1")
    tf = _local_setup(threads)
    if data == "synthetic":
        x, y = synthetic_data(num_examples, seed=seed)
        name = "synthetic"
    else:
        from labkit import data as lkdata
        (x, y), _, info = lkdata.load_dataset(None if data == "auto" else data, n_train=num_examples)
        x, y = lkdata.normalize(x), np.asarray(y).reshape(-1).astype("int32")
        name = str(getattr(info, "name", info))
    configs = [
        (f"b={batch_size}, lr={lr:g}", batch_size, 1.0, 0),
        (f"b={k * batch_size}, lr={lr:g} (no scaling)", k * batch_size, 1.0, 0),
        (f"b={k * batch_size}, lr={k * lr:g} (linear scaling)", k * batch_size, float(k), 0),
        (f"b={k * batch_size}, lr={k * lr:g} + warmup", k * batch_size, float(k), -1),
    ]
    rows = []
    for label, b, scale, warm in configs:
        tf.random.set_seed(seed)
        net = build_model("small_cnn", x.shape[1:])
        steps_per_epoch = len(x) // b
        warm_steps = warmup_epochs * steps_per_epoch if warm < 0 else 0
        sched = lambda step, s=scale, w=warm_steps: scaled_lr(step, lr, s, w)  # noqa: E731
        opt = tf.keras.optimizers.legacy.SGD(learning_rate=lambda: sched(opt.iterations), momentum=0.9)
        step = _train_step_fn(tf, net, opt)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(b, drop_remainder=True)
        every = max(1, steps_per_epoch // evals_per_epoch)
        i, run_loss = 0, []
        for epoch in range(epochs):
            for xb, yb in ds:
                loss = float(step(xb, yb))
                run_loss.append(loss if np.isfinite(loss) else 1e3)
                i += 1
                if i % every == 0:
                    rows.append({"config": label, "batch_size": b, "lr_peak": lr * scale,
                                 "epoch": i / steps_per_epoch, "loss": float(np.mean(run_loss)),
                                 "data": name})
                    run_loss = []
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# CLI

def _int_list(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2; got {text!r}")
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1; got {text!r}")
    return vals


def cli_main(argv=None) -> int:
    """`labkit scale --np 1,2 [--model M] [--batch-size B] [--steps S] --json FILE`."""
    p = argparse.ArgumentParser(prog="labkit scale",
                                description="Run Horovod data-parallel training once per worker count and "
                                            "report images/s, efficiency and each rank's weight checksum.")
    p.add_argument("--np", type=_int_list, default=[1, 2], help="worker counts, e.g. 1,2 (default 1,2)")
    p.add_argument("--model", default="small_cnn", help="small_cnn or a labkit.models name")
    p.add_argument("--batch-size", type=int, default=64, help="images per step: per worker (weak scaling) or in total (strong)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps before timing")
    p.add_argument("--scaling", choices=["weak", "strong"], default="weak",
                   help="weak: fixed work per worker (default); strong: fixed work per step, split")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per worker (default 0: the node's cores / workers on it)")
    p.add_argument("--data", choices=["synthetic", "auto", "cifar10"], default="synthetic")
    p.add_argument("--launcher", choices=["auto", "gloo", "mpi", "srun"], default="auto")
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch before everything is killed")
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.steps < 1 or a.repeats < 1:
        p.error("--batch-size, --steps and --repeats must be >= 1")
    try:
        df = run(a.np, model=a.model, batch_size=a.batch_size, steps=a.steps, repeats=a.repeats,
                 warmup_steps=a.warmup_steps, scaling=a.scaling, data=a.data, threads=a.threads,
                 launcher=a.launcher, timeout=a.timeout, progress=not a.quiet)
    except (HorovodRunError, FileNotFoundError, ValueError) as err:
        print(f"labkit scale: {err}", file=sys.stderr)
        return 1
    doc = to_json(df, model=a.model, scaling=a.scaling, steps=a.steps, repeats=a.repeats,
                  warmup_steps=a.warmup_steps, data=str(df["data"].iloc[0]), launcher=a.launcher)
    for r in doc["runs"]:
        print(f"np={r['np']}: {r['images_per_sec']:.1f} +- {r['images_per_sec_std']:.1f} images/s, "
              f"efficiency {r['efficiency']:.2f} (uncontended steps: {r.get('p10_efficiency', float('nan')):.2f}), "
              f"checksums {'equal' if r['in_sync'] else 'DIFFER'}")
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(doc, indent=2))
    return 0 if doc["all_in_sync"] else 3
