"""The checker of 04's Horovod exercise: it runs the learner's script on 2 workers and names the first mistake.

`check_hvd.keras_hvd(answer)` takes the path of the learner's copy of labkit/scale/keras_single.py made data-parallel
(or the script's text), runs it under horovodrun through labkit.scale.launch at a tiny size (labkit.exercises.hvd_harness
records what each rank did), prints one line and returns the path of the reference, labkit/scale/keras_hvd.py.
The checks, in the order a learner meets them: initialised, weights broadcast, gradients averaged, LR scaled,
LR warmed up, metrics averaged, one checkpoint writer, data sharded, steps per epoch divided, one printer.
`keras_hvd.judge(answer)` returns the Verdict instead; `run_scripts` / `verdict_of` let several scripts share
one launch (the tests). (04_horovod_scaling)
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from labkit.exercises.verdict import CHECKERS, Verdict, NOT_ANSWERED  # one 'not answered' line for every exercise

SCRIPTS = Path(__file__).resolve().parents[1] / "scale"  # the course's Keras scripts live with the lesson (04)
REFERENCE = SCRIPTS / "keras_hvd.py"
PLACEHOLDER = SCRIPTS / "keras_single.py"  # the learner edition's starting point
LOOP = SCRIPTS / "keras_hvd_loop.py"  # the custom-loop form (hvd.DistributedGradientTape)
NP = 2
HARNESS = "labkit.exercises.hvd_harness"  # the module the ranks run: it records what each rank of a script did
BASE_LR = 0.0125  # an unusual value: a script that ignores --lr shows it
SCRIPT_ARGS = {"epochs": 1, "steps": 8, "batch-size": 8, "lr": BASE_LR}  # 4 steps per rank: tiny on purpose
TIMEOUT = 300  # seconds for one launch, TensorFlow's start-up on a shared machine included

SINGLE_PROCESS = ("Not answered yet: your script is still the single-process one (it never imports horovod); "
                  "edit it as the steps above say and run this cell again. The lesson goes on with "
                  "labkit/scale/keras_hvd.py.")
# (key, hint) in the order they are checked; a hint may use the numbers the check found
MISTAKES = (
    ("not_initialised", "Horovod is not initialised on every rank ({why}): call hvd.init() first, before "
                        "anything asks for hvd.rank() or hvd.size()."),
    ("no_fit", "your script never reaches model.fit: this exercise keeps Keras's fit and adds Horovod's "
               "pieces around it."),
    ("not_broadcast", "the ranks' weights differ after the first step (checksums {a} and {b}): add "
                      "hvd.callbacks.BroadcastGlobalVariablesCallback(0), so that every rank starts from rank "
                      "0's weights."),
    ("gradients_not_averaged", "the ranks' weights drift apart during training (checksums {a} and {b} at the "
                               "end): wrap the optimizer in hvd.DistributedOptimizer(...), which averages the "
                               "gradients over all ranks every step."),
    ("lr_not_scaled", "the learning rate is {lr:g}; with {n} workers it should be {base:g} x hvd.size() = "
                      "{want:g} (the global batch is hvd.size() times larger)."),
    ("no_warmup", "the scaled learning rate is used from the first step: add "
                  "hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1), which ramps it up "
                  "from lr / hvd.size() (early steps at the full rate can diverge)."),
    ("metrics_not_averaged", "the ranks end the epoch with different losses ({a:.4f} and {b:.4f}): add "
                             "hvd.callbacks.MetricAverageCallback(), so that the logs are the average over all "
                             "ranks, not rank 0's shard."),
    ("checkpoint_every_rank", "rank 1 writes {path} too: add the ModelCheckpoint only when hvd.rank() == 0, or "
                              "the ranks overwrite one another's file."),
    ("no_checkpoint", "no rank writes a checkpoint: keep the ModelCheckpoint, on rank 0 only."),
    ("data_not_sharded", "both ranks trained on the same batches: give each its own part of the data, "
                         "data.make_dataset(..., shard=(hvd.rank(), hvd.size()))."),
    ("steps_not_divided", "each rank runs all {steps} steps of an epoch: divide steps_per_epoch by hvd.size(), "
                          "since every step now takes hvd.size() batches."),
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
                env_extra=None) -> list[list[dict]]:
    """Run each script on np_ Horovod ranks, one after the other in one launch (labkit.exercises.hvd_harness); for each
    script, its ranks' records. An entry is a path (run with args), or (path, its own arguments). Horovod stays initialised from the first script that calls hvd.init() on, so
    a script without hvd.init() is only judged as such before it (labkit.exercises.hvd_harness). The ranks load data at
    smoke scale (LABKIT_SMOKE=1: 1000 images; env_extra may say otherwise). Raises
    labkit.scale.launch.HorovodRunError if the launch itself fails or times out."""
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
                   progress=False, env_extra={"LABKIT_SMOKE": "1", **(env_extra or {})},
                   label=f"{np_} workers", module=HARNESS)
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
    accuracy, the files the rank wrote. The harness nudges each rank's weights apart before fit, so equal
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


def _failure(records) -> Verdict | None:
    """The first rank's own error (a rank torn down by another's failure only reports the shutdown)."""
    failed = [r for r in records if r.get("error")]
    if not failed:
        return None
    own = [r for r in failed if "has been shut down" not in r["error"]] or failed
    r = own[0]
    why = r["error"]
    if why.startswith("SystemExit("):  # argparse's one line (e.g. unrecognized arguments), or sys.exit(code)
        tail = r.get("stderr_tail") or []
        why = f"it exited with code {r.get('exit_code')}" + (f" ({tail[-1]})" if tail else "")
    return Verdict("unreadable", f"Your script stopped on rank {r['rank']}: {why[:300]}", str(REFERENCE))


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


def _target_lr(record) -> float | None:
    """The LR the script means to train at: the warmup callback's target, else the optimizer's largest."""
    for fit in record["fit"]:
        for cb in fit["callbacks"]:
            if cb.get("initial_lr") is not None:
                return cb["initial_lr"]
    values = [c["lr"] for c in record["compile"]] + list(record["lr_steps"])
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _has_warmup(record) -> bool:
    named = any("warmup" in cb["class"].lower() for fit in record["fit"] for cb in fit["callbacks"])
    steps = [v for v in record["lr_steps"] if v is not None]
    return named or len(set(steps)) > 1  # a schedule that ramps counts too


def verdict_of(records, *, base_lr: float = BASE_LR, steps: int = SCRIPT_ARGS["steps"]) -> Verdict:
    """Judge one script from its ranks' harness records (rank order): the first mistake, or correct."""
    records = sorted(records, key=lambda r: r["rank"])
    r0, r1 = records[0], records[-1]
    n = r0["size"]
    if not any(r["imports_horovod"] for r in records):
        return Verdict("unanswered", SINGLE_PROCESS, str(REFERENCE))
    uninitialised = [r for r in records if "not been initialized" in (r.get("error") or "")]
    if uninitialised:  # Horovod's own words: "Horovod has not been initialized; use hvd.init()."
        return _mistake("not_initialised", why=f"rank {uninitialised[0]['rank']}: {uninitialised[0]['error'][:100]}")
    failed = _failure(records)
    if failed:
        return failed
    why = None if r0.get("horovod_up_before") else _not_initialised(records)  # see labkit.exercises.hvd_harness
    if why:
        return _mistake("not_initialised", why=why)
    if not all(r["fit"] and r["checksum_first_step"] for r in records):
        return _mistake("no_fit")
    if len({r["checksum_first_step"] for r in records}) > 1:
        return _mistake("not_broadcast", a=r0["checksum_first_step"], b=r1["checksum_first_step"])
    if len({r["checksum_end"] for r in records}) > 1 or not any(c["horovod"] for c in r0["compile"]):
        return _mistake("gradients_not_averaged", a=r0["checksum_end"], b=r1["checksum_end"])
    lr = _target_lr(r0)
    if not _close(lr, base_lr * n):
        return _mistake("lr_not_scaled", lr=lr if lr is not None else float("nan"), n=n, base=base_lr,
                        want=base_lr * n)
    if not _has_warmup(r0):
        return _mistake("no_warmup")
    loss0, loss1 = (r["epoch_logs"][-1].get("loss") if r["epoch_logs"] else None for r in (r0, r1))
    if loss0 is not None and loss1 is not None and not _close(loss0, loss1, 1e-6):
        return _mistake("metrics_not_averaged", a=loss0, b=loss1)
    if any(r["saves"] for r in records[1:]):
        return _mistake("checkpoint_every_rank", path=next(r for r in records[1:] if r["saves"])["saves"][0]["path"])
    if not r0["saves"]:
        return _mistake("no_checkpoint")
    seen0 = {h for batch in r0["batches"] for h in batch}
    seen1 = {h for batch in r1["batches"] for h in batch}
    if seen0 and seen1 and len(seen0 & seen1) > 0.5 * min(len(seen0), len(seen1)):
        return _mistake("data_not_sharded")
    if r0["fit"][-1]["steps_per_epoch"] == steps and n > 1:
        return _mistake("steps_not_divided", steps=steps)
    if any(r["fit"][-1]["verbose"] != 0 for r in records[1:]):
        return _mistake("verbose_every_rank")
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
    path = Path(answer).expanduser()
    if not path.is_file():
        return Verdict("unreadable", f"Could not read your answer: there is no file {str(answer)!r} (from "
                                     f"{Path.cwd()}).", str(REFERENCE))
    return path


def judge(answer=None, *, timeout: float = TIMEOUT) -> Verdict:
    """The verdict on the learner's script (runs it on NP workers; no printing)."""
    from labkit.scale.launch import HorovodRunError
    with tempfile.TemporaryDirectory(prefix="labkit-check-") as tmp:
        path = _script_path(answer, Path(tmp))
        if isinstance(path, Verdict):
            return path
        try:
            (records,) = run_scripts([path], timeout=timeout)
        except HorovodRunError as err:
            last = (err.stderr_tail or [str(err)])[-1].strip()
            what = "did not finish in time" if err.timed_out else "crashed"
            return Verdict("unreadable", f"Your script {what} on {NP} workers: {last[:300]}", str(REFERENCE))
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
