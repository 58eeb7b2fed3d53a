"""Data-parallel scaling, measured: per worker count, images/s, speedup and efficiency (04_horovod_scaling).

`run([1, 2], batch_size=32)` launches labkit.scale.hvd_train through labkit.scale.launch once per worker count,
with a RunSettings (labkit.scale.settings) or its fields by keyword, and returns a pandas DataFrame with one row
per worker count: total images/s (mean and spread over timed repeats), speedup, efficiency, each rank's weight
checksum. `run_paired` times the same steps with and without the gradient exchange in alternating blocks of one
launch per worker count (two such DataFrames). `per_rank` unfolds the ranks, `to_json` writes the `labkit scale
--json` document, `plot_scaling` draws it. The cost model that explains the numbers is labkit.scale.allreduce;
the explorer widget is labkit.widgets.scaling.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from labkit.base import config, machine, plans, resultsfile
from labkit.scale import settings
from labkit.scale.launch import HorovodRunError, child_env, choose_launcher, launch, launch_problem, take_slots
from labkit.scale.records import ScaleDocument, ScaleRun
from labkit.scale.settings import (  # noqa: F401  (check_model, model_names: also reachable as scaling's)
    CLI_TIMEOUT,
    DEFAULT_MODEL,
    DEVICES,
    LAUNCHERS,
    SCALINGS,
    RunSettings,
    check_model,
    check_nps,
    model_names,
)

STOPPED = 75  # `labkit scale --checkpoint`'s exit status when a signal stopped the run at a checkpoint (EX_TEMPFAIL)
JSON_OWN = resultsfile.json_document("runs")  # what --json holds (records.ScaleDocument): no other file replaced


def train_args(**settings) -> list[str]:
    """hvd_train's command line for the given settings (RunSettings' names and defaults): RunSettings(...).argv()."""
    return RunSettings(**settings).argv()


def summarize(ranks: list[dict]) -> dict:
    """One row from the ranks of one launch: total images/s over ranks, per timed repeat, mean and spread."""
    per_repeat = np.sum([r["images_per_sec_repeats"] for r in ranks], axis=0)
    checks = [r["checksum"] for r in ranks]
    r0 = ranks[0]
    mean = float(per_repeat.mean()) if per_repeat.size else float("nan")  # a --checkpoint launch stopped early
    return {
        "np": r0["size"], "batch_size": r0["batch_size"], "global_batch_size": r0["global_batch_size"],
        "images_per_sec": mean,
        "images_per_sec_std": float(per_repeat.std(ddof=1)) if per_repeat.size > 1 else 0.0,
        "images_per_sec_per_rank": mean / r0["size"],
        "step_time_s": float(np.median([r["step_time_s"] for r in ranks])),
        "cpu_step_time_s": float(np.median([r.get("cpu_step_time_s", np.nan) for r in ranks])),
        # a synchronous step ends when the slowest rank's does: the max over ranks
        "step_time_p10_s": float(np.max([r.get("step_time_p10_s", np.nan) for r in ranks])),
        "final_loss": r0["final_loss"], "checksums": checks, "in_sync": len(set(checks)) == 1,
        "threads": r0["threads"], "model": r0["model"], "data": r0["data"], "sync": r0["sync"],
        "controller": r0.get("controller"), "tuning": r0.get("tuning", {}),
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


def data_note(data: str) -> str:
    """Which data set the ranks will train on, and why (said before a launch; the ranks report it too)."""
    from labkit import data as lkdata
    if data == "synthetic":
        return "data: an offline synthetic set (--data synthetic: images/s does not depend on pixel values)"
    if data not in ("auto", "cifar10"):
        raise ValueError(f"data must be 'synthetic', 'auto' or 'cifar10'; got {data!r}")
    if lkdata.cifar10_available():
        return f"data: CIFAR-10, found in {lkdata.find_cifar10() or 'the data directory (as an archive)'}"
    if data == "cifar10":
        raise ValueError("data='cifar10' but CIFAR-10 is not on disk here (LABKIT_DATA, the Keras cache); "
                         "run `labkit data fetch cifar10` first, or use --data auto")
    return ("data: labkit's offline synthetic set, because CIFAR-10 was not found (LABKIT_DATA, the Keras "
            "cache); `labkit data fetch cifar10` gets it")


def run(nps=(1, 2), settings: RunSettings | None = None, **overrides):
    """Train with Horovod once per worker count; returns a DataFrame (one row per np) with efficiency.

    settings: a RunSettings (default: its defaults), with any of its fields overridden by keyword, e.g.
    run([1, 2], batch_size=32, scaling="strong"). Each row keeps every rank's result dict in column "ranks";
    `per_rank(df)` unfolds them.
    """
    import pandas as pd
    s = dataclasses.replace(settings or RunSettings(), **overrides)
    return efficiency(pd.DataFrame([{**summarize(ranks), "scaling": s.scaling} for ranks in _launches(nps, s)]))


def without_exchange(rank: dict) -> dict:
    """A `--paired` rank result as if its exchange-free blocks had been a `--no-sync` launch of their own: its
    "no_sync" timing and checksum in place of the synced steps', sync False (what summarize reads)."""
    part = rank["no_sync"]
    return {**{k: v for k, v in rank.items() if k != "no_sync"},
            **{k: v for k, v in part.items() if k != "checksums_after_block"}, "sync": False}


def run_paired(nps=(1, 2), settings: RunSettings | None = None, **overrides):
    """(with_exchange, without): run()'s two DataFrames from ONE launch per worker count (hvd_train --paired)."""
    import pandas as pd
    s = dataclasses.replace(settings or RunSettings(), **overrides)
    bad = [a for a in map(str, s.extra) if a in ("--no-sync", "--barrier", "--paired")]
    if bad or not s.sync:
        raise ValueError(f"{'extra must not hold ' + bad[0] if bad else 'sync must be True'}: run_paired times "
                         "the exchange and its control itself")
    with_rows, without_rows = [], []
    for ranks in _launches(nps, dataclasses.replace(s, extra=(*s.extra, "--paired"))):
        with_rows.append({**summarize(ranks), "scaling": s.scaling})
        without_rows.append({**summarize([without_exchange(r) for r in ranks]), "scaling": s.scaling})
    return efficiency(pd.DataFrame(with_rows)), efficiency(pd.DataFrame(without_rows))


def _launches(nps, settings: RunSettings) -> list:
    """The settings checked, then one launch per worker count: a list of each launch's rank results, in np order."""
    nps = check_nps(nps)
    s = settings.check(nps)
    s = _with_device(s, nps)
    # chosen once for every launch: "auto" is mpirun with Open MPI's tuned settings where Horovod has MPI
    choice = choose_launcher(s.launcher, s.hosts, env_extra=s.env_extra)
    if s.progress:
        print(choice.note, flush=True)
    return [launch(n, s.argv(n), launcher=choice, hosts=s.hosts, timeout=s.timeout, progress=s.progress,
                   env_extra=s.env_extra, threads=s.threads) for n in nps]


def per_rank(df):
    """One row per rank of every launch in a run() DataFrame (np, rank, images/s, checksum, ...)."""
    import pandas as pd
    keep = ("rank", "size", "pid", "threads", "batch_size", "images_per_sec", "images_per_sec_std",
            "step_time_s", "final_loss_local", "final_loss", "checksum", "examples_this_rank")
    rows = [{k: r[k] for k in keep} for ranks in df["ranks"] for r in ranks]
    return pd.DataFrame(rows).rename(columns={"size": "np"})


def to_json(df, **extra) -> ScaleDocument:
    """The `labkit scale --json` document (its schema and contract: labkit.scale.records), plus the settings in
    extra."""
    import pandas as pd
    runs = []
    for _, r in df.iterrows():
        run = ScaleRun(np=int(r["np"]), images_per_sec=float(r["images_per_sec"]),
                       images_per_sec_std=float(r["images_per_sec_std"]),
                       efficiency=float(r["efficiency"]), speedup=float(r["speedup"]),
                       checksums=list(r["checksums"]), in_sync=bool(r["in_sync"]),
                       batch_size=int(r["batch_size"]), global_batch_size=int(r["global_batch_size"]),
                       step_time_s=float(r["step_time_s"]), final_loss=float(r["final_loss"]),
                       threads=int(r["threads"]))
        if "controller" in r and isinstance(r["controller"], str):  # what the ranks themselves ran
            run["controller"], run["tuning"] = r["controller"], dict(r["tuning"] or {})
        for extra_key in ("p10_efficiency", "cpu_efficiency", "step_time_p10_s", "cpu_step_time_s"):
            if extra_key in r and pd.notna(r[extra_key]):
                run[extra_key] = float(r[extra_key])
        runs.append(run)
    return ScaleDocument(runs=runs, all_in_sync=all(x["in_sync"] for x in runs), **extra)


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
# CLI

def _int_list(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers like 1,2; got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1; got {text!r}")
    return vals


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block: "labkit scale: error: --np: ..."
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) arrived: handled like Ctrl-C, so the launch cleans up before the exit."""


def _check_json_path(path: str, own=None) -> None:
    """The results file must be writable, with room for it, now, not after minutes of training; an existing file
    must be one of labkit's own kind (own: resultsfile.json_document("runs") for labkit scale's), never a device."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--json must be a file path; {path} is a directory")
    if not target.parent.is_dir():
        raise ValueError(f"--json: the directory {target.parent} does not exist")
    from labkit.base import resultsfile
    resultsfile.check_target(path, "--json", own=own)
    resultsfile.check_space(path, resultsfile.RESULTS_RESERVE_BYTES, "--json")  # room and rights, now


def check_cores(nps, hosts=None, oversubscribe: bool = False, env=None) -> None:
    """ValueError (one line, naming --np) when a launch on this machine would start more ranks than it has
    cores, unless oversubscribe: each rank would get a slice of a core and the run could take the whole
    timeout. Hosts given (or a Slurm allocation) are the user's own count of slots, checked by take_slots."""
    env = os.environ if env is None else env
    if oversubscribe or hosts is not None or env.get("SLURM_JOB_ID"):
        return
    machine.refuse_more_than_cores(max(nps), "--np", "ranks", "the run may last the whole --timeout")


def _with_device(s: RunSettings, nps, choose: bool = False) -> RunSettings:
    """s with one device for every launch of nps, so that no run compares GPU workers with CPU workers; s itself
    where it names one. Otherwise, on a machine with GPUs: the CPU (the notebooks' runs measure cores), or with
    choose (`labkit scale`) plans.run_device's choice, a GPU per worker where every host has one for each."""
    if s.device is not None:
        return s
    gpus = machine.gpus()
    device = plans.run_device(ranks_per_host(s.hosts, max(nps)), gpus) if choose else "cpu" if gpus else None
    return dataclasses.replace(s, device=device)


def check_gpus(nps, device, hosts=None) -> None:
    """ValueError (one line, naming --device) when --device gpu asks for more GPUs than a host has (this
    machine's count, machine.gpus(); other hosts are taken to be alike)."""
    have = machine.gpus()  # a bad LABKIT_GPUS is said here, before any launch, whatever the device
    if device != "gpu":
        return
    most = ranks_per_host(hosts, max(nps))
    if have < most:
        raise ValueError(f"--device gpu: a launch puts {most} worker(s) on a host with {have} NVIDIA GPU(s) "
                         f"(one each); use --np of at most {have} per host, or --device cpu" if have else
                         "--device gpu: no NVIDIA GPU on this machine (`labkit doctor` says what TensorFlow sees); "
                         "leave --device out or use --device cpu")


def training_bytes(model: str) -> tuple[int, int]:
    """(activation bytes per image kept for the backward pass, weights + gradients + momentum bytes) of model
    on the ranks' 32x32x3 images, 10 classes: labkit.flops' counts (03_flops). Loads TensorFlow."""
    import warnings

    from labkit import flops, models
    with warnings.catch_warnings():  # a layer without a MAC rule still has its outputs counted
        warnings.simplefilter("ignore")
        report = flops.count(models.get(model, input_shape=(32, 32, 3), classes=10))
    return report.activation_bytes(training=True), flops.training_state_bytes(report, optimizer_slots=1)


@functools.cache
def _child_bytes(model: str) -> tuple[int, int]:
    """training_bytes(model): the course's models' counts from labkit.scale.plans' tables (held to training_bytes by
    tests/base/test_plans.py), else asked of a child Python unless TensorFlow is loaded here (`labkit scale` never
    loads it itself)."""
    from labkit.scale import plans
    if model in plans.IMAGE_BYTES and model in plans.STATE_BYTES:
        return plans.IMAGE_BYTES[model], plans.STATE_BYTES[model]
    if "tensorflow" in sys.modules:
        return training_bytes(model)
    code = f"import json; from labkit.scale import scaling; print(json.dumps(scaling.training_bytes({model!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"could not count {model}'s memory: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    per_image, state = json.loads(out.stdout.strip().splitlines()[-1])
    return int(per_image), int(state)


def check_memory(model: str, batch_size: int, ranks_here: int, available=None) -> None:
    """ValueError (one line, naming --batch-size, with the estimate) when ranks_here ranks training model on
    batch_size images each cannot fit in this machine's available memory (machine.memory_available, so
    LABKIT_MEMORY is honoured; other hosts are taken to be alike).
    The estimate is training_bytes: a floor, since TensorFlow needs more (gradients of the activations,
    workspace), so a batch refused here could never have run."""
    per_image, state = _child_bytes(model)
    available = machine.memory_available() if available is None else available  # LABKIT_MEMORY honoured
    per_rank = batch_size * per_image + state
    if ranks_here * per_rank <= available:
        return
    fits = max(0, int((available / ranks_here - state) // per_image))
    raise ValueError(f"--batch-size {batch_size} cannot fit in memory: {ranks_here} rank(s) x "
                     f"{per_rank / 2**30:.2f} GiB "
                     f"({model}: {per_image / 1e6:.3f} MB of activations per image x {batch_size} images + "
                     f"{state / 1e6:.1f} MB of weights, gradients and momentum; labkit.flops' estimate) > "
                     f"{available / 2**30:.2f} GiB available. Use --batch-size {fits} or less, or fewer ranks")


def ranks_per_host(hosts, np_: int) -> int:
    """The most ranks one host runs in a launch of np_ (all of them on this machine when hosts is None)."""
    if hosts is None:
        return np_
    return max(int(entry.rpartition(":")[2]) for entry in take_slots(hosts, np_))


def _parser() -> _Parser:
    """`labkit scale`'s options: --np, one per setting it offers (settings.add_arguments), then its own."""
    p = _Parser(prog="labkit scale",
                description="Run Horovod data-parallel training once per worker count and report images/s, "
                            "efficiency and each rank's weight checksum. Each worker owns a fixed share of "
                            "the machine (--threads, default 1), as each GPU or node does.")
    p.add_argument("--np", dest="nps", type=_int_list, default=[1, 2], help="worker counts, e.g. 1,2 (default 1,2)")
    settings.add_arguments(p, "scale")
    p.add_argument("--paired", action="store_true",
                   help="also time the same steps without the gradient exchange, in alternating blocks of the "
                        "same launch (run_paired): efficiency with and without the exchange, and their ratio")
    p.add_argument("--json", dest="json_path", default=None,
                   help="write the results here (their schema: labkit.scale.records.ScaleDocument)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than this machine has cores (each gets a slice of a core)")
    return p


def _settings(a) -> RunSettings:
    """The RunSettings the options name: every setting `labkit scale` offers read back (settings.from_args),
    progress from --quiet; the others keep their defaults."""
    return RunSettings(**settings.from_args(a, "scale"), progress=not a.quiet)


def _check_args(a, settings: RunSettings) -> RunSettings:
    """Every check that needs no launch, the settings' first; the settings checked, or ValueError on the first."""
    config.profile()  # LABKIT_PROFILE must be quick, workshop or full
    s = settings.check(a.nps, flags=True)
    if a.json_path:
        _check_json_path(a.json_path, JSON_OWN)
    check_cores(a.nps, s.hosts, a.oversubscribe)
    check_gpus(a.nps, s.device, s.hosts)
    s = _with_device(s, a.nps, choose=True)
    if s.hosts is not None:
        problem = launch_problem(s.hosts)
        if problem:
            raise ValueError(f"--hosts: {problem}")
    for n in a.nps:  # every launch must fit; under strong scaling a rank's batch shrinks with n
        check_memory(s.model, max(1, s.per_rank_batch(n)), ranks_per_host(s.hosts, n))
    if s.checkpoint is not None:
        _check_checkpoint(a, s)
    return s


def _check_checkpoint(a, s: RunSettings) -> None:
    """--checkpoint: one launch, not --paired; the folder's checkpoint fits this run (or --resume finds one);
    room for it now. The ranks check the same again (hvd_train), this is the refusal before any launch."""
    from labkit.scale import checkpoint
    if a.paired:
        raise ValueError("--checkpoint cannot be combined with --paired: it keeps one schedule of synced steps")
    n = a.nps[0]
    batch = s.per_rank_batch(n)
    run = {"model": s.model, "size": n, "batch_size": batch, "seed": s.seed, "data": s.data,
           "num_examples": s.num_examples or settings.num_examples_for(batch, n), "lr": s.lr, "scale_lr": s.scale_lr,
           "lr_warmup_steps": s.lr_warmup_steps, "total_steps": s.warmup_steps + s.steps * s.repeats}
    problem = checkpoint.problem(s.checkpoint, run, s.resume)
    if problem:
        raise ValueError(problem)
    try:
        Path(s.checkpoint).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--checkpoint: cannot make the folder {s.checkpoint} ({err.strerror or err})") from None
    resultsfile.check_space(checkpoint.path(s.checkpoint), _child_bytes(s.model)[1], "--checkpoint")


def _ask_ranks_to_checkpoint() -> int:
    """SIGUSR1 to every rank this process started (hvd_train's processes among its descendants): they agree to
    stop after the current step, rank 0 checkpoints, all exit cleanly. The number of ranks asked."""
    import psutil

    from labkit.scale.launch import WORKER, rank_python
    starts = {1, len(rank_python())}  # `python -m WORKER`, or LABKIT_RANK_PYTHON's words and then -m WORKER
    asked = 0
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
            if any(cmd[i:i + 2] == ["-m", WORKER] for i in starts):  # the ranks themselves, not the launcher
                p.send_signal(signal.SIGUSR1)
                asked += 1
        except psutil.Error:
            continue
    return asked


def _measure(a, s: RunSettings):
    """(with the exchange, without it or None) from run / run_paired, SIGTERM and SIGHUP handled as Ctrl-C;
    an int (the exit status) when the launch failed or was stopped."""
    main = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGTERM, signal.SIGHUP) if main else ()
    asked, done = [], threading.Event()

    def terminate(signum, frame):
        # --checkpoint: the first SIGTERM asks the ranks for a checkpoint and a clean stop, a second one kills
        if s.checkpoint is not None and signum == signal.SIGTERM and not asked:
            return ask(signum, frame)
        raise Terminated(signum)

    def ask(signum, frame):  # SIGUSR1 (Slurm's warning before the time limit): checkpoint and stop
        asked.append(signum)
        print(f"labkit scale: signal {signum}: the workers checkpoint after their current step and stop",
              file=sys.stderr, flush=True)
        if not _ask_ranks_to_checkpoint():  # the ranks are still starting: ask again until one has it (any one
            def retry():                   # suffices, they agree after each step)
                while not _ask_ranks_to_checkpoint() and not done.is_set():
                    done.wait(0.5)
            threading.Thread(target=retry, daemon=True).start()

    previous = {sig: signal.signal(sig, terminate) for sig in handled}
    if main and s.checkpoint is not None:
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, ask)
    try:
        return run_paired(a.nps, settings=s) if a.paired else (run(a.nps, settings=s), None)
    except Terminated as stop:
        print(f"labkit scale: stopped by signal {stop.args[0]}; every process of the launch was killed",
              file=sys.stderr)
        return 128 + int(stop.args[0])
    except KeyboardInterrupt:
        print("labkit scale: interrupted; every process of the launch was killed", file=sys.stderr)
        return 130
    except (HorovodRunError, FileNotFoundError, ValueError) as err:
        print(f"labkit scale: {err}", file=sys.stderr)
        return 1
    finally:
        done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report(a, s: RunSettings, df, free) -> dict:
    """Print one line per worker count and return the `--json` document (labkit.scale.records.ScaleDocument)."""
    print(f"the ranks trained on: {df['data'].iloc[0]}")
    doc = to_json(df, model=s.model, scaling=s.scaling, steps=s.steps, repeats=s.repeats,
                  warmup_steps=s.warmup_steps, data=str(df["data"].iloc[0]), launcher=s.launcher,
                  hosts=s.hosts, threads_per_worker=s.threads, paired=a.paired)
    if free is not None:  # the same launches' exchange-free blocks; their ranks drift apart by design
        doc["without_exchange"] = to_json(free)["runs"]
    for k, r in enumerate(doc["runs"]):
        line = (f"np={r['np']}: {r['images_per_sec']:.1f} +- {r['images_per_sec_std']:.1f} images/s, "
                f"efficiency {r['efficiency']:.2f} (uncontended steps: {r.get('p10_efficiency', float('nan')):.2f})"
                if r["images_per_sec"] == r["images_per_sec"] else f"np={r['np']}: no timed step in this launch")
        if free is not None:
            w = doc["without_exchange"][k]
            line += (f"; without the exchange {w['images_per_sec']:.1f} +- {w['images_per_sec_std']:.1f} images/s, "
                     f"efficiency {w['efficiency']:.2f}; ratio {r['efficiency'] / w['efficiency']:.2f}")
        print(f"{line}, checksums {'equal' if r['in_sync'] else 'DIFFER'}")
    if s.checkpoint is not None:
        ranks = df["ranks"].iloc[0]
        for r in ranks:
            print(f"rank {r['rank']}: final weights checksum {r['checksum']}")
        state = ranks[0]["checkpoint"]
        doc["checkpoint"] = {"step": state["step"], "total_steps": state["total_steps"],
                             "resumed_from": state["resumed_from"], "stopped": state["stopped"]}
        print(f"checkpoint: step {state['step']} of {state['total_steps']}"
              + (f" (resumed at step {state['resumed_from']})" if state["resumed_from"] else "")
              + (": stopped by a signal; --resume continues it" if state["stopped"] else ": the run is complete"))
    return doc


def cli_main(argv=None) -> int:
    """`labkit scale --np 1,2 [--model M] [--batch-size B] [--steps S] [--hosts H] --json FILE`."""
    p = _parser()
    a = p.parse_args(argv)
    try:
        s = _check_args(a, _settings(a))
        note = data_note(s.data)
    except (ValueError, RuntimeError) as err:
        p.error(str(err))
    try:  # the --json file held for the whole run: a second labkit scale on it is refused now, not lost later
        with resultsfile.claimed(a.json_path, "--json", own=JSON_OWN) if a.json_path else contextlib.nullcontext():
            print(note, flush=True)
            measured = _measure(a, s)
            if isinstance(measured, int):
                return measured
            doc = _report(a, s, *measured)
            if a.json_path:
                resultsfile.write_json(a.json_path, doc, indent=2)
    except ValueError as err:
        p.error(str(err))
    if not doc["all_in_sync"]:
        return 3
    return STOPPED if doc.get("checkpoint", {}).get("stopped") else 0
