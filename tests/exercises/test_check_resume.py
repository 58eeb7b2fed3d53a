"""08's resume exercise checker: the reference resumes bit for bit, the starting script is 'not answered', and each
usual mistake, made the way a learner would make it in a copy of the reference, is named.

Every script runs three times (to the end, stopped after check_resume.KILL_AFTER steps, resumed) and all of them
share ONE 2-worker launch (labkit.exercises.resume_harness): TensorFlow's start-up is paid once. One more launch
goes through the learner's entry point, check_resume.resume_hvd(path), end to end, and checks that it leaves no
process or temporary folder behind.
"""
import os
import tempfile
import time
from pathlib import Path

import pytest

from helpers import edited
from labkit.exercises import check_resume
from labkit.exercises.resume_harness import kills
from labkit.exercises.verdict import CHECKERS

REF = check_resume.REFERENCE.read_text()


def _broken(*edits):
    """The reference with each (old, new) replaced (helpers.edited: each old text there exactly once)."""
    return edited(REF, *edits)


RESTORE = "    checkpoint.restore(manager.latest_checkpoint)"
# mistake key -> the learner's script with that one mistake (the five of the exercise first)
BROKEN = {
    "every_rank_writes": _broken(("        if hvd.rank() == 0:  # one writer: every rank holds the same state\n"
                                  "            manager.save()", "        manager.save()")),
    "epoch_not_restored": _broken(("epochs=args.epochs, initial_epoch=start,", "epochs=args.epochs,")),
    # not Checkpoint(model=model, epoch=epoch): a compiled model brings its optimizer into the checkpoint itself
    "optimizer_lost": _broken(("tf.train.Checkpoint(model=model, optimizer=opt, epoch=epoch)",
                               "tf.train.Checkpoint(weights=model.weights, epoch=epoch)")),
    "lr_restarted": _broken(("epochs=args.epochs, initial_epoch=start,", "epochs=args.epochs - start,")),
    "data_replayed": _broken(("dataset = dataset.skip(start * steps_per_epoch)", "")),
    # two more, which the checks meet before those
    "not_restored": _broken((RESTORE, "    pass")),
    "restored_on_one_rank": _broken(("if manager.latest_checkpoint:",
                                     "if manager.latest_checkpoint and hvd.rank() == 0:"),
                                    ("start = int(epoch)", "start = int(hvd.broadcast(epoch, root_rank=0))")),
}
# correct scripts other than the reference, as learners write them: each must be judged correct
CORRECT = {
    # rank 0 reads the checkpoint and broadcasts all of the state before the first step (the optimizer's slots made
    # first, as labkit.scale.hvd_train does, so that both ranks have them under the same names)
    "read_on_rank_0_and_broadcast": _broken(
        ("import horovod.tensorflow.keras as hvd\n", "import horovod.tensorflow as hvd_tf\n"
                                                     "import horovod.tensorflow.keras as hvd\n"),
        ("if manager.latest_checkpoint:", "opt._create_all_weights(model.trainable_variables)\n"
                                          "if manager.latest_checkpoint and hvd.rank() == 0:"),
        ("start = int(epoch)", "hvd_tf.broadcast_variables([*model.variables, *opt.variables()], root_rank=0)\n"
                               "start = int(hvd_tf.broadcast(epoch, root_rank=0))")),
}
# two ranks writing one checkpoint may stop one of them; a checkpoint read on rank 0 alone makes the ranks' optimizer
# slots differ, and Horovod's broadcast of them shuts it down for every later script of the launch: these go last
LAST = ("every_rank_writes", "restored_on_one_rank")


@pytest.fixture(scope="session")
def verdicts(tmp_path_factory):
    """Every variant, the reference and the starting script, each run whole, stopped and resumed in one launch."""
    folder = tmp_path_factory.mktemp("resume_variants")
    paths = {"correct": check_resume.REFERENCE, "start": check_resume.PLACEHOLDER}
    for name, src in sorted({**CORRECT, **BROKEN}.items(), key=lambda item: LAST.index(item[0]) if item[0] in LAST
                            else -1):
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(src)
    t0 = time.perf_counter()
    runs = check_resume.run_resumes(list(paths.values()), folder / "checkpoints")
    print(f"\n{len(paths)} scripts x 3 runs on 2 workers in one launch: {time.perf_counter() - t0:.1f} s")
    out = {name: check_resume.verdict_of(r) for name, r in zip(paths, runs)}
    for name, v in out.items():  # what the learner reads, shown with pytest -s
        print(f"{name:22s} {v.message}")
    return out


@pytest.mark.parametrize("name", ["correct", "start", *CORRECT, *BROKEN])
@pytest.mark.horovod
@pytest.mark.slow
def test_each_script_gets_its_verdict(verdicts, name):
    v = verdicts[name]
    assert "\n" not in v.message and len(v.message) < 500, v.message
    if name == "correct" or name in CORRECT:
        assert v.status == "correct" and v.message.startswith("Correct!") and "bit for bit" in v.message, v.message
    elif name == "start":
        assert (v.status, v.message) == ("unanswered", check_resume.NO_CHECKPOINT)
    else:
        assert (v.status, v.mistake) == ("mistake", name), v.message
        assert v.message.startswith("Not quite: ")


@pytest.mark.horovod
@pytest.mark.slow
def test_the_hints_carry_what_the_runs_showed(verdicts):
    assert "ranks 0 and 1" in verdicts["every_rank_writes"].message
    assert "trained 12 steps where 8 were left" in verdicts["epoch_not_restored"].message  # 12 steps, resumed at 4
    assert "at step 0 where the run never stopped was at step 4" in verdicts["optimizer_lost"].message
    # lr_at(0) = 0.0125 (one worker's) against lr_at(1) = 0.0125 x 2 workers
    assert "learning rate of 0.0125 where the run never stopped trained at 0.025" in verdicts["lr_restarted"].message
    assert "its first batch again" in verdicts["data_replayed"].message


def test_every_mistake_is_planted():
    assert set(BROKEN) == set(check_resume.resume_hvd.mistakes)


def test_the_checker_is_registered_and_answers_before_any_launch():
    assert CHECKERS["resume_hvd"] is check_resume.resume_hvd
    assert check_resume.judge(None).status == "unanswered"
    assert check_resume.judge(3).status == "unreadable"
    v = check_resume.judge("no-such-script.py")
    assert v.status == "unreadable" and "no-such-script.py" in v.message


def test_the_stop_is_read_from_the_environment_or_refused():
    assert kills("1:6,4:6") == {1: 6, 4: 6} and kills("") == {}
    for bad in ("1", "1:0", "a:6", "1:-2"):
        with pytest.raises(ValueError, match="LABKIT_RESUME_KILL must be SCRIPT:STEPS"):
            kills(bad)


def _ranks():
    """The processes that run a rank of the resume harness."""
    out = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"resume_harness" in (proc / "cmdline").read_bytes():
                out.add(int(proc.name))
        except OSError:
            pass
    return out


@pytest.mark.horovod
@pytest.mark.slow
def test_the_learner_s_entry_point_end_to_end(tmp_path, monkeypatch, capsys):
    """The starting script copied where a learner keeps it, by its name: one line, nothing left behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_resume_hvd.py").write_text(REF)
    private = tmp_path.parent / f"{tmp_path.name}-tmp"  # the temporary folders of this check alone
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert check_resume.resume_hvd("my_resume_hvd.py") == str(check_resume.REFERENCE)
    out = capsys.readouterr().out.strip()
    assert out.startswith("Correct!") and "\n" not in out, out
    assert not list(private.iterdir()) and not _ranks()
    assert sorted(os.listdir(tmp_path)) == ["my_resume_hvd.py"]
