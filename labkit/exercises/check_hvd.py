"""The checker of 04's Horovod exercise: it runs the learner's script on 2 workers and names the first mistake.

`check_hvd.keras_hvd(answer)` takes the path of the learner's copy of labkit/scale/keras_single.py made
data-parallel (or the script's text), runs it under horovodrun through labkit.scale.launch at a tiny size
(labkit.exercises.hvd_harness records what each rank did), prints one line and returns the path of the
reference, labkit/scale/keras_hvd.py.
The checks, in the order a learner meets them (MISTAKES): a crash named when it is a usual one (hvd.init()
missing or late, the wrong Horovod module, Keras's new optimizer, an optimizer wrapped on some ranks only, a rank
that left a collective), initialised,
weights broadcast, gradients averaged, LR scaled, LR warmed up, metrics averaged, one checkpoint writer, data
sharded, steps per epoch divided, one printer. Judged by effect, so every correct form passes (the broadcast as
the callback, broadcast_variables before fit or after the first batch; a warmup as the callback or a schedule; the
data sharded by make_dataset or by hand). Metrics averaged by hand are right when the average goes back into
Keras's logs during fit (a callback, as MetricAverageCallback does) and a mistake when only a number printed after
fit is averaged: the callbacks that read the logs (save_best_only, EarlyStopping) then see each rank's own.
`keras_hvd.judge(answer)` returns the Verdict instead; `run_scripts` / `verdict_of` let several scripts share
one launch (the tests). (04_horovod_scaling)
"""
from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

from labkit.exercises.verdict import CHECKERS, NOT_ANSWERED, Verdict  # one 'not answered' line for every exercise

SCRIPTS = Path(__file__).resolve().parents[1] / "scale"  # the course's Keras scripts live with the lesson (04)
REFERENCE = SCRIPTS / "keras_hvd.py"
PLACEHOLDER = SCRIPTS / "keras_single.py"  # the learner edition's starting point
LOOP = SCRIPTS / "keras_hvd_loop.py"  # the custom-loop form (hvd.DistributedGradientTape)
NP = 2
HARNESS = "labkit.exercises.hvd_harness"  # the module the ranks run: it records what each rank of a script did
BASE_LR = 0.0125  # an unusual value: a script that ignores --lr shows it
SCRIPT_ARGS = {"epochs": 1, "steps": 8, "batch-size": 8, "lr": BASE_LR}  # 4 steps per rank: tiny on purpose
TIMEOUT = 300  # seconds for one launch, TensorFlow's start-up on a shared machine included
# ranks waiting in different collectives never finish: Horovod shuts down once one has waited STALL_S seconds
# (checked every STALL_CHECK_S), and the checker names the rank that left instead of waiting for TIMEOUT
STALL_CHECK_S, STALL_S = 5, 20
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(STALL_CHECK_S),
             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_S)}

SINGLE_PROCESS = ("Not answered yet: your script is still the single-process one (it never imports horovod); "
                  "edit it as the steps above say and run this cell again. The lesson goes on with "
                  "labkit/scale/keras_hvd.py.")
# (key, hint) in the order they are checked; a hint may use the numbers the check found. A crash that is none of
# these is one line in the learner's words with the error's own line (the one that names the cause).
MISTAKES = (
    ("not_initialised", "Horovod is not initialised on every rank ({why}): call hvd.init() first, before "
                        "anything asks for hvd.rank() or hvd.size()."),
    ("init_too_late", "hvd.init() comes after the first use of Horovod (rank {rank}: {error}): move hvd.init() "
                      "up, right after the imports; nothing of Horovod answers before it."),
    ("wrong_import", "hvd.{name} is not in {module} (rank {rank}: {error}). Keras's pieces (DistributedOptimizer "
                     "for model.fit, hvd.callbacks) are in horovod.tensorflow.keras; the custom loop's "
                     "(DistributedGradientTape, broadcast_variables) in horovod.tensorflow: import the one that "
                     "has what you call, or both under two names."),
    ("new_optimizer", "your optimizer is {optimizer}, Keras 2.11+'s new kind, and the script stopped (rank "
                      "{rank}: {error}). Horovod 0.28.1's callbacks were written for the legacy optimizers (the "
                      "LR warmup sets the momentum as a Keras variable; the new optimizer keeps it as a plain "
                      "float): use tf.keras.optimizers.legacy.SGD, as the starting script does."),
    ("optimizer_on_some_ranks", "every rank must take part in every collective, and only rank {wrapped} wraps its "
                                "optimizer in hvd.DistributedOptimizer: its allreduce of the gradients waits for "
                                "rank {bare}, which never joins it (Horovod then shuts down). Wrap it on every "
                                "rank; only printing and writing files may depend on hvd.rank()."),
    ("rank_left", "every rank must take part in every collective, and rank {left} left {how} while rank {waited} "
                  "waited for it in a collective (an allreduce or a broadcast){error}: give every rank the same "
                  "model.fit, the same steps and the "
                  "same callbacks; only printing and writing files may depend on hvd.rank()."),
    ("no_fit", "your script never reaches model.fit: this exercise keeps Keras's fit and adds Horovod's "
               "pieces around it."),
    ("not_broadcast", "the ranks' weights differ after the first step (checksums {a} and {b}): each rank "
                      "initialises its own (no seed is shared), so start them all from rank 0's, every variable "
                      "of the model: add "
                      "hvd.callbacks.BroadcastGlobalVariablesCallback(0) (or broadcast model.variables from rank "
                      "0 before fit)."),
    ("gradients_not_averaged", "the ranks' weights drift apart during training (checksums {a} and {b} at the "
                               "end): wrap the optimizer in hvd.DistributedOptimizer(...), which averages the "
                               "gradients over all ranks every step."),
    ("lr_local_size", "the learning rate is {lr:g} = {base:g} x hvd.local_size(), the workers on this node "
                      "only (here each worker runs as on a node of its own): scale by hvd.size(), all the "
                      "workers of the job, = {want:g}."),
    ("warmup_not_scaled", "the warmup ramps the learning rate up to {lr:g}, one worker's rate: scale its target "
                          "too, lr = args.lr * hvd.size() = {want:g}, given to the optimizer and to "
                          "LearningRateWarmupCallback(initial_lr=lr), which starts at lr / hvd.size() and ends "
                          "at lr."),
    ("lr_not_scaled", "the learning rate is {lr:g}; with {n} workers it should be {base:g} x hvd.size() = "
                      "{want:g} (the global batch is hvd.size() times larger)."),
    ("no_warmup", "the scaled learning rate is used from the first step: add "
                  "hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1), which ramps it up "
                  "from lr / hvd.size() (early steps at the full rate can diverge)."),
    ("metrics_by_hand", "you average a metric by hand, but the logs Keras keeps during training are still each "
                        "rank's own (losses {a:.4f} and {b:.4f} at the end of the epoch), and a callback that "
                        "reads them (a checkpoint's save_best_only, EarlyStopping) can decide differently on "
                        "each rank: add hvd.callbacks.MetricAverageCallback(), which averages the logs every "
                        "epoch, before the other callbacks read them."),
    ("metrics_not_averaged", "the ranks end the epoch with different losses ({a:.4f} and {b:.4f}): add "
                             "hvd.callbacks.MetricAverageCallback(), so that the logs are the average over all "
                             "ranks, not rank 0's shard."),
    ("checkpoint_per_rank", "every rank writes a checkpoint of its own ({paths}): the ranks hold the same "
                            "weights, so these are {n} copies of one file, {n} times the disk and the writing "
                            "time: add the ModelCheckpoint only when hvd.rank() == 0."),
    ("checkpoint_every_rank", "rank 1 writes {path} too: add the ModelCheckpoint only when hvd.rank() == 0, or "
                              "the ranks overwrite one another's file."),
    ("no_checkpoint", "no rank writes a checkpoint: keep the ModelCheckpoint, on rank 0 only."),
    ("data_not_sharded", "both ranks trained on the same batches: give each its own part of the data, "
                         "data.make_dataset(..., shard=(hvd.rank(), hvd.size()))."),
    ("steps_not_divided", "each rank runs {got} steps of an epoch, where the {n} workers together should run the "
                          "{steps} of --steps: divide, steps_per_epoch = args.steps // hvd.size(), since every step "
                          "now takes hvd.size() batches."),
    ("verbose_every_rank", "rank 1 prints its progress too: pass verbose only on rank 0 "
                           "(verbose=2 if hvd.rank() == 0 else 0)."),
)
_HINTS = dict(MISTAKES)


def _mistake(key: str, **numbers) -> Verdict:
    return Verdict("mistake", "Not quite: " + _HINTS[key].format(**numbers), str(REFERENCE), key)


def script_args(**overrides) -> list[str]:
    """The command-line options every checked script gets (it must keep keras_single.py's options)."""
    opts = {**SCRIPT_ARGS, **overrides}
    return [str(v) for k, v in opts.items() for v in (f"--{k}", v)]


def run_scripts(scripts, args=None, *, np_: int = NP, timeout: float = TIMEOUT, timing: bool = False,
                env_extra=None, module: str = HARNESS) -> list[list[dict]]:
    """Run each script on np_ Horovod ranks, one after the other in one launch (labkit.exercises.hvd_harness); for
    each script, its ranks' records. An entry is a path (run with args), or (path, its own arguments). Horovod stays
    initialised from the first script that calls hvd.init() on, so a script without hvd.init() is only judged as
    such before it (labkit.exercises.hvd_harness). The ranks load data at smoke scale (LABKIT_SMOKE=1: 1000
    images; env_extra may say otherwise). module: the ranks' harness (08's labkit.exercises.resume_harness wraps this
    one). Raises labkit.scale.launch.HorovodRunError if the launch itself fails or
    times out."""
    if not scripts:
        raise ValueError("scripts must name at least one script")
    own = ["--timing"] if timing else []  # not --time: horovodrun would take it for its --timeline-* (ambiguous)
    for entry in scripts:  # a path, or (path, its own arguments; "{workdir}" is its folder)
        path, mine = (entry, None) if isinstance(entry, (str, Path)) else entry
        path = Path(path).resolve()
        if not path.is_file():
            raise ValueError(f"scripts: no file {path}")
        own += ["--script", str(path)]
        if mine is not None:
            if any("," in str(a) for a in mine):
                raise ValueError(f"scripts: {path.name}'s own arguments cannot contain commas; got {mine!r}")
            own.append("--with=" + ",".join(map(str, mine)))
    from labkit.scale.launch import launch
    ranks = launch(np_, [*own, "--", *(script_args() if args is None else args)], timeout=timeout,
                   progress=False, env_extra={"LABKIT_SMOKE": "1", **STALL_ENV, **(env_extra or {})},
                   label=f"{np_} workers", module=module)
    return [[r["scripts"][k] for r in ranks] for k in range(len(scripts))]


def conversion_diff(before=PLACEHOLDER, after=REFERENCE) -> str:
    """The code lines that change from one script to the other (their docstrings left out), as a unified diff
    (04 shows the Horovod conversion)."""
    import ast
    import difflib

    def code(path):
        lines = path.read_text().splitlines(True)
        body = ast.parse("".join(lines)).body
        doc = body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
        return lines[body[0].end_lineno:] if doc else lines

    a, b = Path(before), Path(after)
    return "".join(difflib.unified_diff(code(a), code(b), a.name, b.name, n=0))


def sync_table(np_: int = NP, script=REFERENCE, *, epochs: int = 1, steps: int = 20, batch_size: int = 32,
               timeout: float = TIMEOUT):
    """Launch a script on np_ workers (through labkit.exercises.hvd_harness) and return one row per rank: the weights'
    checksum after the first step and at the end (equal on every rank: in sync), the last logged loss and
    accuracy, the files the rank wrote. Each rank initialises its own weights (the harness), so equal
    checksums are the broadcast's doing."""
    (records,) = run_scripts([script], script_args(epochs=epochs, steps=steps, **{"batch-size": batch_size}),
                             np_=np_, timeout=timeout)
    return sync_rows(records)


def sync_rows(records):
    """sync_table's DataFrame from one script's harness records (RuntimeError with the script's error)."""
    import pandas as pd
    failed = _failure(records)
    if failed:
        raise RuntimeError(failed.message)
    rows = []
    for r in sorted(records, key=lambda r: r["rank"]):
        logs = r["epoch_logs"][-1] if r["epoch_logs"] else {}
        rows.append({"rank": r["rank"], "workers": r["size"], "checksum_first_step": r["checksum_first_step"],
                     "checksum_end": r["checksum_end"] or next(iter(r.get("models_end", {}).values()), None),
                     "loss": logs.get("loss"), "accuracy": logs.get("accuracy"),
                     "files_written": [x["path"] for x in r["saves"]]})
    return pd.DataFrame(rows)


# what one Horovod module lacks and the other has: hvd.<name> from the wrong import
ELSEWHERE = {"horovod.tensorflow": {"callbacks", "load_model"},
             "horovod.tensorflow.keras": {"DistributedGradientTape", "PartialDistributedGradientTape", "join",
                                          "broadcast_variables", "broadcast_object", "allgather_object"}}
# a rank left the others (in eager steps the ranks' next collectives then differ: "Mismatched ALLREDUCE tensor shapes")
COLLECTIVE = ("not supported with Join", "has been shut down", "Horovod is shutting down", "Mismatched ")


def _error(r) -> str:
    """A rank's error as the learner reads it: argparse's or sys.exit's line, or the error's own line."""
    why = r["error"]
    if why.startswith("SystemExit("):  # argparse's one line (e.g. unrecognized arguments), or sys.exit(code)
        tail = r.get("stderr_tail") or []
        why = f"it exited with code {r.get('exit_code')}" + (f" ({tail[-1]})" if tail else "")
    return why if len(why) <= 240 else why[:237] + "..."


def _failure(records) -> Verdict | None:
    """The first rank's own error (a rank torn down by another's failure or departure only reports that)."""
    failed = [r for r in records if r.get("error")]
    if not failed:
        return None
    own = [r for r in failed if not any(c in r["error"] for c in COLLECTIVE)] or failed
    r = own[0]
    return Verdict("unreadable", f"Your script stopped on rank {r['rank']}, none of the usual Horovod mistakes; "
                                 f"the error's own line: {_error(r)}", str(REFERENCE))


def _left(records) -> Verdict | None:
    """A rank that left the others inside a collective: it skipped fit, stopped, or ran fewer steps."""
    if any(r.get("error") and not any(c in r["error"] for c in COLLECTIVE) for r in records):
        return None  # a rank's own error: reported as such
    def progress(r):  # fits called, training steps begun (a rank stuck inside a step has begun it)
        return len(r["fit"]), r.get("steps_begun", 0)

    stuck = [r for r in records if r.get("error")]
    if len({progress(r) for r in records}) == 1 and not stuck:
        return None
    gone = min(records, key=lambda r: (progress(r), bool(r.get("error"))))
    other = max(records, key=lambda r: (progress(r), bool(r.get("error"))))
    if gone is other:
        return None
    how = ("without calling model.fit" if not gone["fit"] else
           f"after {progress(gone)[1]} training steps (rank {other['rank']} began {progress(other)[1]})")
    shown = other.get("error") and "with Join" not in other["error"]  # Join: the harness's, not the learner's
    error = f" (rank {other['rank']}'s error: {_error(other).split('. ')[0]})" if shown else ""
    return _mistake("rank_left", left=gone["rank"], how=how, waited=other["rank"], error=error)


def _crash(records) -> Verdict | None:
    """A script that stopped on some rank: the likely mistake named, else the error's own line."""
    for r in records:
        why = r.get("error") or ""
        if "not been initialized" in why:  # Horovod's own words: "Horovod has not been initialized; use hvd.init()."
            if "init" in r.get("calls", ()):
                return _mistake("init_too_late", rank=r["rank"], error=_error(r))
            return _mistake("not_initialised", why=f"rank {r['rank']}: {_error(r)}")
        missing = re.search(r"module '(horovod[\w.]*)' has no attribute '(\w+)'", why)
        if missing and missing[2] in ELSEWHERE.get(missing[1], ()):
            return _mistake("wrong_import", name=missing[2], module=missing[1], rank=r["rank"], error=_error(r))
    wrapped = _wrapped_on_some_ranks(records)
    if wrapped:
        return wrapped
    new = [c for r in records for c in r["compile"] if c.get("legacy") is False]
    failed = next((r for r in records if r.get("error")), None)
    if failed and new and failed["fit"]:  # it stopped in fit, where Horovod's callbacks meet the optimizer
        return _mistake("new_optimizer", optimizer=f"tf.keras.optimizers.{new[0]['optimizer']}",
                        rank=failed["rank"], error=_error(failed))
    return _left(records) or _failure(records)


def _wrapped_on_some_ranks(records) -> Verdict | None:
    """hvd.DistributedOptimizer on some ranks only (e.g. under `if hvd.rank() == 0`): their gradient allreduce
    waits for ranks that never join it."""
    wraps = {r["rank"]: any(c["horovod"] for c in r["compile"]) for r in records if r["compile"]}
    if len(wraps) < len(records) or len(set(wraps.values())) < 2:
        return None
    return _mistake("optimizer_on_some_ranks", wrapped=", ".join(str(k) for k, v in wraps.items() if v),
                    bare=", ".join(str(k) for k, v in wraps.items() if not v))


def _not_initialised(records) -> str | None:
    """Why Horovod is not set up on every rank (the scripts ran to the end), or None."""
    if not all(r.get("initialized") for r in records):
        return "hvd.init() is never called"
    if any(r["hvd_size"] != r["size"] for r in records):
        return f"hvd.size() is {records[0]['hvd_size']} on a {records[0]['size']}-worker launch"
    if len({r["hvd_rank"] for r in records}) < len(records):
        return "two ranks both think they are rank 0"
    return None


def _close(a, b, rel=1e-5) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _warmup_target(record) -> float | None:
    """The learning rate a warmup callback ramps up to, or None without one."""
    for fit in record["fit"]:
        for cb in fit["callbacks"]:
            if cb.get("initial_lr") is not None:
                return cb["initial_lr"]
    return None


def _target_lr(record) -> float | None:
    """The LR the script means to train at: the warmup callback's target, else the optimizer's largest (a
    schedule's too)."""
    target = _warmup_target(record)
    if target is not None:
        return target
    values = [v for c in record["compile"] for v in [c["lr"], *(c.get("lr_curve") or [])]] + record["lr_steps"]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _has_warmup(record) -> bool:
    named = any("warmup" in cb["class"].lower() for fit in record["fit"] for cb in fit["callbacks"])
    curves = [[v for v in c.get("lr_curve") or [] if v is not None] for c in record["compile"]]
    steps = [v for v in record["lr_steps"] if v is not None]
    return named or len(set(steps)) > 1 or any(len(set(c)) > 1 for c in curves)  # a schedule that ramps counts


def _lr_mistake(r0, base_lr: float, n: int) -> Verdict | None:
    """The learning rate not scaled by the workers (by local_size(), only in the warmup, not at all), or None."""
    lr = _target_lr(r0)
    if _close(lr, base_lr * n):
        return None
    numbers = {"lr": lr if lr is not None else float("nan"), "n": n, "base": base_lr, "want": base_lr * n}
    local = r0.get("hvd_local_size")
    if r0.get("lr_uses_local_size") and local is not None and local != n and _close(lr, base_lr * local):
        return _mistake("lr_local_size", **numbers)
    if _warmup_target(r0) is not None and _close(lr, base_lr):
        return _mistake("warmup_not_scaled", **numbers)
    return _mistake("lr_not_scaled", **numbers)


def _sync_mistake(records) -> Verdict | None:
    """Horovod not set up, no fit, weights not broadcast or not kept equal, or None."""
    r0, r1 = records[0], records[-1]
    why = None if r0.get("horovod_up_before") else _not_initialised(records)  # see labkit.exercises.hvd_harness
    if why:
        return _mistake("not_initialised", why=why)
    if not all(r["fit"] and r["checksum_first_step"] for r in records):
        return _mistake("no_fit")
    if len({r["checksum_first_step"] for r in records}) > 1:
        return _mistake("not_broadcast", a=r0["checksum_first_step"], b=r1["checksum_first_step"])
    if len({r["checksum_end"] for r in records}) > 1 or not any(c["horovod"] for c in r0["compile"]):
        return _mistake("gradients_not_averaged", a=r0["checksum_end"], b=r1["checksum_end"])
    return None


def _output_mistake(records, steps: int) -> Verdict | None:
    """Metrics not averaged, checkpoints on every rank or none, data not sharded, steps not divided, progress
    printed on every rank, or None."""
    r0, r1, n = records[0], records[-1], records[0]["size"]
    loss0, loss1 = (r["epoch_logs"][-1].get("loss") if r["epoch_logs"] else None for r in (r0, r1))
    if loss0 is not None and loss1 is not None and not _close(loss0, loss1, 1e-6):
        by_hand = any("allreduce" in r.get("calls", ()) for r in records)
        return _mistake("metrics_by_hand" if by_hand else "metrics_not_averaged", a=loss0, b=loss1)
    writers = [r for r in records[1:] if r["saves"]]
    if writers:
        paths = [r["saves"][0]["path"] for r in records if r["saves"]]
        if len(set(paths)) > 1:
            return _mistake("checkpoint_per_rank", paths=", ".join(paths), n=len(paths))
        return _mistake("checkpoint_every_rank", path=writers[0]["saves"][0]["path"])
    if not r0["saves"]:
        return _mistake("no_checkpoint")
    seen0 = {h for batch in r0["batches"] for h in batch}
    seen1 = {h for batch in r1["batches"] for h in batch}
    if seen0 and seen1 and len(seen0 & seen1) > 0.5 * min(len(seen0), len(seen1)):
        return _mistake("data_not_sharded")
    got = r0["fit"][-1]["steps_per_epoch"]  # None: the whole (sharded) data set, which is divided already
    if n > 1 and got is not None and got not in (max(1, steps // n), -(-steps // n)):  # floor or ceiling
        return _mistake("steps_not_divided", got=got, n=n, steps=steps)
    if any(r["fit"][-1]["verbose"] != 0 for r in records[1:]):
        return _mistake("verbose_every_rank")
    return None


def verdict_of(records, *, base_lr: float = BASE_LR, steps: int = SCRIPT_ARGS["steps"]) -> Verdict:
    """Judge one script from its ranks' harness records (rank order): the first mistake, or correct."""
    records = sorted(records, key=lambda r: r["rank"])
    r0, n = records[0], records[0]["size"]
    if not any(r["imports_horovod"] for r in records):
        return Verdict("unanswered", SINGLE_PROCESS, str(REFERENCE))
    found = (_crash(records) or _sync_mistake(records) or _lr_mistake(r0, base_lr, n)
             or (None if _has_warmup(r0) else _mistake("no_warmup")) or _output_mistake(records, steps))
    if found:
        return found
    return Verdict("correct", f"Correct! On {n} workers your script starts every rank from rank 0's weights "
                              f"and keeps them equal (checksum {r0['checksum_end']} on every rank), trains at "
                              f"{base_lr:g} x {n} = {base_lr * n:g} after a warmup, averages the metrics, "
                              f"shards the data and writes one checkpoint.", str(REFERENCE))


def _script_path(answer, tmp: Path) -> Path | Verdict:
    """The script to run: answer as a path, or as the script's text (written to tmp)."""
    if answer is None or answer is Ellipsis:
        return Verdict("unanswered", NOT_ANSWERED, str(REFERENCE))
    if isinstance(answer, str) and "\n" in answer:
        path = tmp / "answer.py"
        from labkit.base import resultsfile
        resultsfile.write_text(path, answer)
        return path
    if not isinstance(answer, (str, Path)):
        return Verdict("unreadable", f"Could not read your answer: expected the path of your script, got "
                                     f"{type(answer).__name__}.", str(REFERENCE))
    from labkit.base import workdir
    path = workdir.find(answer)  # by name: from the current folder, or the learner's own (04's starting copy)
    if not path.is_file():
        return Verdict("unreadable", f"Could not read your answer: there is no file {str(answer)!r} (from "
                                     f"{Path.cwd()}).", str(REFERENCE))
    return path


NO_HOROVOD = ("Horovod is not installed here (its build failed or was skipped), so your script cannot run on 2 "
              "workers: `labkit doctor` says why and how to fix it. Until then, compare your script with the "
              "reference conversion, labkit/scale/keras_hvd.py (the diff above).")

_LOG_NOISE = ("WARNING", "W ", "I ", "[20", "Missing ranks", "One or more tensors", "Traceback", "File ")


def _last_words(lines) -> str:
    """The ranks' last line that says something to a learner: an exception's line if there is one, never
    TensorFlow's or Horovod's log lines and node names."""
    lines = [re.sub(r"^\[rank \d+\]\s*", "", ln).strip() for ln in lines]
    said = [ln for ln in lines if ln and not ln.startswith(_LOG_NOISE) and not re.search(r"\[\[|PartitionedCall|"
                                                                                      r"function_node|^\d+: \[", ln)]
    errors = [ln for ln in said if re.match(r"[\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
    last = (errors or said or ["(nothing)"])[-1]
    return last if len(last) <= 200 else last[:197] + "..."


def _launch_failure(err) -> str:
    """A launch that died (a rank killed, a hang past the timeout): one line and the ranks' last words."""
    last = _last_words([*(err.stderr_tail or []), *str(err).splitlines()[:1]])
    if err.timed_out:
        return (f"Your script did not finish in time on {NP} workers: a rank may be waiting in a collective "
                f"that another rank never joins (every rank must take part in every one); the last line: {last}")
    return f"Your script stopped the whole launch on {NP} workers (a rank died); the last line it wrote: {last}"


def judge(answer=None, *, timeout: float = TIMEOUT) -> Verdict:
    """The verdict on the learner's script (runs it on NP workers; no printing)."""
    import importlib.util

    from labkit.scale.launch import HorovodRunError
    if answer not in (None, Ellipsis) and importlib.util.find_spec("horovod") is None:
        return Verdict("unreadable", NO_HOROVOD, str(REFERENCE))  # the launch could only fail, and say less
    with tempfile.TemporaryDirectory(prefix="labkit-check-") as tmp:
        path = _script_path(answer, Path(tmp))
        if isinstance(path, Verdict):
            return path
        try:
            (records,) = run_scripts([path], timeout=timeout)
        except HorovodRunError as err:
            return Verdict("unreadable", _launch_failure(err), str(REFERENCE))
    return verdict_of(records)


def keras_hvd(answer=None, *, timeout: float = TIMEOUT):
    """The Horovod conversion of keras_single.py, run on 2 workers: each of its mistakes named. (04_horovod_scaling)"""
    verdict = judge(answer, timeout=timeout)
    print(verdict.message)
    return verdict.expected


keras_hvd.judge = judge
keras_hvd.kind = "script"  # judged by running it, not by a Spec of values (labkit.exercises.verdict)
keras_hvd.mistakes = tuple(key for key, _ in MISTAKES)
CHECKERS["keras_hvd"] = keras_hvd
