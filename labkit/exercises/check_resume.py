"""The checker of 08's resume exercise: it runs the learner's Horovod script on 2 workers, stops it part way, runs it
again, and names the first mistake of its resume.

`check_resume.resume_hvd(answer)` takes the name of the learner's copy of labkit/cluster/resume_start.py made
resumable and runs it three times in one launch through labkit.scale.launch
(labkit.exercises.resume_harness records what each rank did): once to the end, once stopped after KILL_AFTER of
its steps (at the end of a step, on every rank, as a kill would), and once more with the same checkpoint folder,
which must continue the stopped run. A resume is right when the continued run ends with the weights of the run
never stopped, bit for bit. The mistakes, each found by its effect, in the order they are checked: every rank
writing the checkpoint; the checkpoint read on one rank only while the ranks then begin apart (an error, or other
weights or slots at the first step: reading on rank 0 and broadcasting everything before that step is right); a
run that failed, in one line; the weights not restored (the first step after the resume compared with every step
of the run never stopped: the one whose weights it starts from is where the checkpoint was); the epoch not
restored (the steps trained after the resume against the steps that were left); the optimizer's state lost (its
step counter and momentum slots at the first step after the resume, rank by rank); the LR schedule started again
(the learning rate of that step); the data replayed from its first batch (the batch that step trains on, on each
rank). A script that writes no checkpoint is "not answered yet".
`resume_hvd.judge(answer)` returns the Verdict instead; `run_resumes` / `verdict_of` let several scripts share one
launch (the tests). (08_training_on_the_cluster)
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from labkit.exercises import check_hvd
from labkit.exercises.verdict import CHECKERS, NOT_ANSWERED, Verdict

SCRIPTS = Path(__file__).resolve().parents[1] / "cluster"  # the scripts live with the lesson (08)
REFERENCE = SCRIPTS / "resume_hvd.py"
PLACEHOLDER = SCRIPTS / "resume_start.py"  # the learner's starting point
NP = 2
HARNESS = "labkit.exercises.resume_harness"
SCRIPT_ARGS = {"epochs": 3, "steps": 8, "batch-size": 8, "lr": 0.0125}  # 4 steps per rank and epoch, 12 in all
KILL_AFTER = 6  # steps: half-way through the second epoch, after the first epoch's end
RUNS = ("whole", "stopped", "resumed")  # each script's three runs, in this order

NO_CHECKPOINT = ("Not answered yet: your script writes no checkpoint, so the run after the stop starts again from "
                 "its first step. Add one as the steps above say and run this cell again. The lesson goes on with "
                 "labkit/cluster/resume_hvd.py.")
# (key, hint) in the order they are checked; a hint may use the numbers the check found
MISTAKES = (
    ("every_rank_writes", "every rank writes the checkpoint (ranks {ranks}): they hold the same state, so these are "
                          "{n} writers of one file, which can leave it torn; save only when hvd.rank() == 0."),
    ("not_restored", "the run after the stop began {how}: read the checkpoint at the start when there is one, "
                     "checkpoint.restore(manager.latest_checkpoint)."),
    ("restored_on_one_rank", "after the stop {who}, so rank {rank} begins with its own new weights and optimizer: "
                             "Horovod's broadcast callback copies rank 0's only after the first step, which rank "
                             "{rank} takes from the wrong weights (and the optimizer's slots, made differently on "
                             "the two ranks, may not match at all): read the checkpoint on every rank."),
    ("epoch_not_restored", "the run after the stop trained {got} steps where {left} were left: {how}; restore the "
                           "epoch with the weights and pass model.fit(..., initial_epoch=<the epochs done>, "
                           "epochs=<all the epochs>)."),
    ("optimizer_lost", "the optimizer began the resumed run {how} where the run never stopped was at step {want}: "
                       "its momentum and step counter are not in the checkpoint; save it with the model, "
                       "tf.train.Checkpoint(model=model, optimizer=opt, ...)."),
    ("lr_restarted", "the first step after the resume trained at a learning rate of {got:g} where the run never "
                     "stopped trained at {want:g} (epoch {epoch}): the schedule began again at epoch {at}, since "
                     "fit counts its epochs from initial_epoch; pass initial_epoch=<the epochs done> and "
                     "epochs=<all the epochs>, not the epochs left."),
    ("data_replayed", "after the resume rank {rank} trained on {which} where the run never stopped trained on its "
                      "batch {want}: the data began again; skip the batches already trained, "
                      "dataset.skip(<epochs done> * steps_per_epoch)."),
)
_HINTS = dict(MISTAKES)


def _mistake(key: str, **numbers) -> Verdict:
    return Verdict("mistake", "Not quite: " + _HINTS[key].format(**numbers), str(REFERENCE), key)


def _args(checkpoint) -> list[str]:
    return [str(v) for k, v in {**SCRIPT_ARGS, "checkpoint": checkpoint}.items() for v in (f"--{k}", v)]


def run_resumes(scripts, folder, *, timeout: float = check_hvd.TIMEOUT) -> list[dict]:
    """Each script run whole, stopped after KILL_AFTER steps, and resumed, all in one launch on NP workers; for each
    script {"whole" | "stopped" | "resumed": its ranks' records, "folder": the stopped run's checkpoint folder}.
    Checkpoint folders go under folder. Raises labkit.scale.launch.HorovodRunError if the launch fails."""
    entries, kill, folders = [], [], []
    for k, script in enumerate(scripts):
        whole, stopped = Path(folder) / f"s{k}-whole", Path(folder) / f"s{k}-stopped"
        entries += [(script, _args(whole)), (script, _args(stopped)), (script, _args(stopped))]
        kill.append(f"{3 * k + 1}:{KILL_AFTER}")
        folders.append(stopped)
    from labkit.exercises.resume_harness import KILL_ENV
    runs = check_hvd.run_scripts(entries, np_=NP, timeout=timeout, module=HARNESS,
                                 env_extra={KILL_ENV: ",".join(kill)})
    return [{**dict(zip(RUNS, runs[3 * k:3 * k + 3])), "folder": folders[k]} for k in range(len(scripts))]


def _writers(run) -> list[int]:
    return [r["rank"] for r in run if r.get("saves") or r["resume"]["writes"]]


def _failure(runs) -> Verdict | None:
    """A run that stopped with an error (the stop the checker asked for is none), in one line."""
    for name in RUNS:
        for r in runs[name]:
            if r.get("error"):
                when = {"whole": "", "stopped": " before the stop", "resumed": " after the stop"}[name]
                return Verdict("unreadable", f"Your script stopped on rank {r['rank']}{when}; the error's own "
                                             f"line: {r['error']}", str(REFERENCE))
    if any(r["resume"]["killed_after"] != KILL_AFTER for r in runs["stopped"]):
        done = runs["stopped"][0]["resume"]["steps_done"]
        return Verdict("unreadable", f"Your script ended after {done} training steps, before the stop after "
                                     f"{KILL_AFTER}: keep the starting script's options (--epochs, --steps) and its "
                                     "model.fit.", str(REFERENCE))
    return None


def _apart(resumed) -> bool:
    """Whether the ranks began the resumed run apart: an error, or other weights or optimizer slots at its first
    step (a checkpoint read on one rank and broadcast before that step is right)."""
    firsts = [r["resume"]["steps"][:1] for r in resumed]
    if any(r.get("error") for r in resumed) or not all(firsts):
        return True
    return len({(f[0]["weights"], f[0]["slots"]) for f in firsts}) > 1


def _resume_mistake(whole, resumed) -> Verdict | None:
    """Where the resumed run began (the step of the run never stopped whose weights it starts from), and what of
    the state it did not bring back, or None."""
    steps, first = whole[0]["resume"]["steps"], resumed[0]["resume"]["steps"]
    if not first:  # fit had nothing left to run: the epoch restored past the run's last one
        return _mistake("epoch_not_restored", got=0, left=f"{len(steps) - KILL_AFTER} or more",
                        how="fit found no epoch left to run")
    at = next((s for s, step in enumerate(steps) if step["weights"] == first[0]["weights"]), None)
    if at is None or at == 0:
        how = ("again from new weights" if at == 0 else
               "from weights that are neither new ones nor those of any step of the run never stopped")
        return _mistake("not_restored", how=how)
    a, b = (r["resume"]["steps"][0]["weights"] for r in (resumed[0], resumed[-1]))
    if a != b:
        return _mistake("restored_on_one_rank", rank=resumed[-1]["rank"],
                        who=f"rank {resumed[-1]['rank']}'s first weights differ from rank 0's ({b} and {a})")
    total, got = whole[0]["resume"]["steps_done"], resumed[0]["resume"]["steps_done"]
    if got != total - at:
        how = (f"fit began again at epoch {first[0]['epoch']} where the checkpoint was at epoch {steps[at]['epoch']}"
               if got > total - at else "fit stopped before the last epoch")
        return _mistake("epoch_not_restored", got=got, left=total - at, how=how)
    want = steps[at]
    for w, r in zip(whole, resumed):  # every rank's optimizer against the same rank's in the run never stopped
        mine, theirs = r["resume"]["steps"][0], w["resume"]["steps"][at]
        if mine["iterations"] != theirs["iterations"] or None not in (mine["slots"], theirs["slots"]) and \
                mine["slots"] != theirs["slots"]:
            how = (f"at step {mine['iterations']}" if mine["iterations"] != theirs["iterations"] else
                   f"at step {theirs['iterations']} but with other momentum")
            return _mistake("optimizer_lost", how=how + (f" on rank {r['rank']}" if r["rank"] else ""),
                            want=theirs["iterations"])
    if None not in (first[0]["lr"], want["lr"]) and not math.isclose(first[0]["lr"], want["lr"], rel_tol=1e-6):
        return _mistake("lr_restarted", got=first[0]["lr"], want=want["lr"], epoch=want["epoch"],
                        at=first[0]["epoch"])
    for w, r in zip(whole, resumed):
        mine, theirs = r["resume"]["batches"], w["resume"]["batches"]
        if mine and len(theirs) > at and mine[0] != theirs[at]:
            which = ("its first batch again" if mine[0] == theirs[0] else
                     f"its batch {theirs.index(mine[0])}" if mine[0] in theirs else "another batch")
            return _mistake("data_replayed", rank=r["rank"], which=which, want=at)
    return None


def verdict_of(runs) -> Verdict:
    """Judge one script from its three runs (run_resumes' dict): the first mistake, or correct."""
    runs = {**runs, **{name: sorted(runs[name], key=lambda r: r["rank"]) for name in RUNS}}
    whole, stopped, resumed = (runs[name] for name in RUNS)
    writers = sorted({rank for name in RUNS for rank in _writers(runs[name])})
    if len(writers) > 1:  # first: several writers may also make a run fail
        return _mistake("every_rank_writes", ranks=" and ".join(map(str, writers)), n=len(writers))
    readers = [r["rank"] for r in resumed if r["resume"]["reads"]]
    if 0 < len(readers) < len(resumed) and _apart(resumed):  # before failures: Horovod's broadcast may then fail
        other = next(r["rank"] for r in resumed if r["rank"] not in readers)
        return _mistake("restored_on_one_rank", rank=other, who=f"only rank {', '.join(map(str, readers))} reads "
                                                                "the checkpoint")
    folder = Path(runs["folder"])
    if not writers and not (folder.is_dir() and any(folder.iterdir())):
        return _failure(runs) or Verdict("unanswered", NO_CHECKPOINT, str(REFERENCE))
    found = _failure(runs) or _resume_mistake(whole, resumed)
    if found:
        return found
    ends = {r["checksum_end"] for r in (*whole, *resumed)}
    a, b = whole[0]["checksum_end"], resumed[0]["checksum_end"]
    if len(ends) == 1:
        first = resumed[0]["resume"]["steps"][0]
        return Verdict("correct", f"Correct! Stopped after {KILL_AFTER} of {whole[0]['resume']['steps_done']} "
                                  f"steps and run again, your script continued at step {first['iterations']} "
                                  f"(epoch {first['epoch']}) and ended with the weights of the run never stopped, "
                                  f"bit for bit (checksum {a} on every rank).", str(REFERENCE))
    return Verdict("wrong", f"Not quite: stopped and run again, your script ends with other weights than the run "
                            f"never stopped (checksums {b} and {a}), though the weights, epoch, optimizer, learning "
                            "rate and first batch after the stop agree; compare it with "
                            "labkit/cluster/resume_hvd.py.", str(REFERENCE))


NO_HOROVOD = ("Horovod is not installed here (its build failed or was skipped), so your script cannot run on 2 "
              "workers: `labkit doctor` says why and how to fix it. Until then, compare your script with "
              "labkit/cluster/resume_hvd.py.")


def _script_path(answer) -> Path | Verdict:
    """The learner's script by name (from the current folder, or the learner's own), or the Verdict why not."""
    if not isinstance(answer, (str, Path)):
        return Verdict("unreadable", f"Could not read your answer: expected the name of your script, got "
                                     f"{type(answer).__name__}.", str(REFERENCE))
    from labkit.base import workdir
    path = workdir.find(answer)
    if not path.is_file():
        return Verdict("unreadable", f"Could not read your answer: there is no file {str(answer)!r}.",
                       str(REFERENCE))
    return path


def judge(answer=None, *, timeout: float = check_hvd.TIMEOUT) -> Verdict:
    """The verdict on the learner's script (three runs on NP workers in one launch; no printing)."""
    import importlib.util

    from labkit.scale.launch import HorovodRunError
    if answer is None or answer is Ellipsis:
        return Verdict("unanswered", NOT_ANSWERED, str(REFERENCE))
    if importlib.util.find_spec("horovod") is None:
        return Verdict("unreadable", NO_HOROVOD, str(REFERENCE))
    path = _script_path(answer)
    if isinstance(path, Verdict):
        return path
    with tempfile.TemporaryDirectory(prefix="labkit-resume-") as tmp:  # the checkpoints: removed whatever happens
        try:
            (runs,) = run_resumes([path], tmp, timeout=timeout)
        except HorovodRunError as err:
            return Verdict("unreadable", check_hvd._launch_failure(err), str(REFERENCE))
        return verdict_of(runs)


def resume_hvd(answer=None, *, timeout: float = check_hvd.TIMEOUT):
    """resume_start.py made resumable, stopped part way and run again on 2 workers: each mistake named.
    (08_training_on_the_cluster)"""
    verdict = judge(answer, timeout=timeout)
    print(verdict.message)
    return verdict.expected


resume_hvd.judge = judge
resume_hvd.kind = "script"  # judged by running it (labkit.exercises.verdict)
resume_hvd.mistakes = tuple(key for key, _ in MISTAKES)
CHECKERS["resume_hvd"] = resume_hvd
