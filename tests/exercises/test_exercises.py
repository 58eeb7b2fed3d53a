"""The exercises in the notebooks and the learner edition built from them.

Every notebook 01-06 has at least 3 exercises (20 or more in all), each a tagged cell with nbgrader's markers
followed by a checker call; the instructor's solution passes its checker in notebook order; the learner
edition keeps no line of any solution, answers every exercise with "not answered yet";
tests/course/test_full_smoke.py runs the learner edition top to bottom (full profile at smoke scale) and checks
that every checker says "not answered yet" there.
"""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)
from labkit.exercises import build as exercises
from labkit.exercises.build import BEGIN, END, PLACEHOLDER, ExerciseFormatError
from labkit.exercises.verdict import NOT_ANSWERED

COURSE = sorted((ROOT / "notebooks").glob("0[1-6]_*.ipynb"))


def _nb(path):
    return nbformat.read(str(path), as_version=4)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    out = tmp_path_factory.mktemp("learner")
    exercises.build(out)
    return out


def test_at_least_three_exercises_per_notebook_and_twenty_in_all():
    found = exercises.list_exercises()
    per = {p.name: sum(ex.notebook == p.name for ex in found) for p in COURSE}
    assert len(per) == 6 and min(per.values()) >= 3, per
    assert len(found) >= 20
    assert all(ex.title.startswith("Exercise ") for ex in found)
    assert len({ex.title for ex in found}) == len(found), "titles must be unique"


def _run_pairs(nb, strip: bool, tmp: Path):
    """Run each exercise cell and its check cell in notebook order in one namespace; the printed lines.
    04's Horovod exercise runs the script on 2 workers (the instructor's copy is written under tmp)."""
    import tensorflow as tf

    from labkit.exercises import check_hvd
    from labkit.models.cifar import sweep_net
    from labkit.transfer import finetune as transfer
    ns = {"np": np, "tf": tf, "transfer": transfer,  # what the exercise cells use from their notebook's imports
          "base": sweep_net(filters=32, filter_size=5, pool_size=3, classes=5),
          "check_hvd": check_hvd, "MY_SCRIPT": tmp / "my_keras_hvd.py"}
    lines = []
    for ex in exercises.exercises(nb):
        src = nb.cells[ex.cell].source
        exec(exercises.strip_solution(src) if strip else src, ns)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(nb.cells[ex.cell + 1].source, ns)
        lines.append((ex.title, buf.getvalue().strip()))
    return lines


@pytest.mark.parametrize("path", COURSE, ids=[p.stem for p in COURSE])
def test_solutions_pass_and_placeholders_are_not_answered(path, tmp_path):
    nb = _nb(path)
    for title, line in _run_pairs(nb, strip=False, tmp=tmp_path):
        assert line.startswith("Correct!") and "\n" not in line, (title, line)
    for title, line in _run_pairs(nb, strip=True, tmp=tmp_path):
        assert line == NOT_ANSWERED, (title, line)


@pytest.mark.parametrize("path", COURSE, ids=[p.stem for p in COURSE])
def test_learner_edition_keeps_no_solution_line(path, learner):
    source, built = _nb(path), _nb(learner / path.name)
    assert built.metadata["labkit"]["edition"] == "learner"
    assert len(built.cells) == len(source.cells)
    solution = {line.strip() for ex in exercises.exercises(source) for line in
                exercises.solution_lines(source.cells[ex.cell].source) if line.strip()}
    assert solution
    built_lines = {line.strip() for cell in built.cells for line in cell.source.splitlines()}
    assert not solution & built_lines, f"solution lines left in the learner edition: {solution & built_lines}"
    ex_cells = {i for ex in exercises.exercises(source) for i in (ex.cell, ex.cell + 1)}
    for i, (a, b) in enumerate(zip(source.cells, built.cells)):
        if i in ex_cells:
            assert b.get("outputs", []) == [] and b.get("execution_count") is None
            if exercises.is_exercise(a):
                assert PLACEHOLDER in b.source and BEGIN not in b.source and END not in b.source
        else:
            assert (a.source, a.get("outputs")) == (b.source, b.get("outputs")), f"cell {i} changed"


def test_strip_solution_keeps_indentation_and_rejects_unpaired_markers():
    src = f"# Exercise\nif True:\n    {BEGIN}\n    answer = 42\n    extra = 1\n    {END}\nprint(answer)"
    assert exercises.strip_solution(src) == f"# Exercise\nif True:\n    {PLACEHOLDER}\nprint(answer)"
    assert exercises.solution_lines(src) == ["    answer = 42", "    extra = 1"]
    for bad in (f"{BEGIN}\nx = 1", f"x = 1\n{END}", f"{BEGIN}\n{BEGIN}\n{END}"):
        with pytest.raises(ExerciseFormatError):
            exercises.strip_solution(bad)


def test_an_exercise_without_a_checker_call_is_named(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"# Exercise 9.1 · x\n{BEGIN}\nanswer = 1\n{END}",
                                          metadata={"tags": ["exercise"]}),
                nbformat.v4.new_code_cell("print(answer)")]
    nbformat.write(nb, str(tmp_path / "01_x.ipynb"))
    with pytest.raises(ExerciseFormatError, match="01_x.ipynb cell 0: the next cell must call a checker"):
        exercises.list_exercises(tmp_path)


def _labkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env)


def test_cli_list_and_build(tmp_path):
    out = _labkit("exercises", "list")
    assert out.returncode == 0 and "Exercise 1.1" in out.stdout and "check.conv_output_size" in out.stdout
    assert out.stdout.strip().endswith(f"{len(exercises.list_exercises())} exercises")
    built = _labkit("exercises", "build", str(tmp_path / "learner"))
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in (tmp_path / "learner").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("args, message", [
    (["exercises"], "choose an action"),
    (["exercises", "frob"], "invalid choice"),
    (["exercises", "build"], "the following arguments are required: DIR"),
    (["exercises", "build", "notebooks"], "would overwrite the instructor edition"),
    (["exercises", "list", "--from", "/nonexistent"], "no course notebooks"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    out = _labkit(*args)
    assert out.returncode == 2 and message in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


