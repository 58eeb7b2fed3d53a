"""labkit.exercises.schedule: a learner's minutes per notebook, checked on a synthetic notebook with known words and
known timestamps, and docs/instructors.md's tables checked against what the script computes now."""

import nbformat
import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)
from labkit.exercises import build as exercises
from labkit.exercises import schedule

# counted by hand: Reading time One two three four five six <code> a b nine
TWELVE = ("# Reading time\n\nOne two three *four* [five](https://example.org/a/b).\n\n```python\nnot counted at all\n"
          "```\n\n<b>six</b> <!-- not read --> `seven_eight` $\\frac{a}{b}$ | nine |\n\n![a chart](chart.png)")


def stamp(seconds: float) -> str:
    return f"2026-01-01T00:{int(seconds) // 60:02d}:{seconds % 60:09.6f}Z"


def timed_cell(source: str, start: float, seconds: float):
    cell = nbformat.v4.new_code_cell(source)
    # busy comes before execute_input and idle after the reply: the run is execute_input -> execute_reply
    cell.metadata["execution"] = {"iopub.status.busy": stamp(start - 0.5), "iopub.execute_input": stamp(start),
                                  "shell.execute_reply": stamp(start + seconds),
                                  "iopub.status.idle": stamp(start + seconds + 0.5)}
    return cell


def exercise_cell(number: str):
    cell = nbformat.v4.new_code_cell(f"# Exercise {number} · a test\n### BEGIN SOLUTION\nanswer = 1\n"
                                     "### END SOLUTION")
    cell.metadata["tags"] = ["exercise"]
    return cell


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    """A notebook of 360 words (2 min), cells timed 30 s and 90 s, one untimed cell, exercises of 7 and 4 min."""
    monkeypatch.setattr(exercises, "MINUTES", {"9.1": (7, "keep"), "9.2": (4, "skip")})
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(TWELVE), nbformat.v4.new_markdown_cell(" ".join(["word"] * 348)),
                timed_cell("x = 1", 10, 30), timed_cell("y = 2", 100, 90), nbformat.v4.new_code_cell("z = 3"),
                exercise_cell("9.1"), nbformat.v4.new_code_cell("check.efficiency(answer, 100, 180, 2)"),
                exercise_cell("9.2"), nbformat.v4.new_code_cell("check.efficiency(answer, 100, 180, 2)")]
    for cell in nb.cells[5:]:  # the exercise cells take no time of their own here
        cell.metadata["execution"] = {"iopub.execute_input": stamp(200), "shell.execute_reply": stamp(200)}
    path = tmp_path / "09_synthetic.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_words_counts_as_a_reader_reads():
    assert schedule.words(TWELVE) == 12
    assert schedule.words("$$2 \\times M K N$$ FLOPs") == 6  # 2 times M K N, then FLOPs
    assert schedule.words("a `<b>not a tag</b>` b") == 3
    assert schedule.words("| a | b |\n|---|---:|\n| 1 | 2 |") == 4
    assert schedule.words("costs $5 and $6 more") == 5  # dollars, not math


def test_cell_seconds_reads_execute_input_to_reply():
    assert schedule.cell_seconds(timed_cell("x", 10, 30)) == pytest.approx(30.0)
    assert schedule.cell_seconds(nbformat.v4.new_code_cell("x")) is None


def test_minutes_of_a_synthetic_notebook(synthetic):
    row = schedule.measure(nbformat.read(str(synthetic), as_version=4), "09_synthetic")
    assert row.words == 360 and row.reading == pytest.approx(2.0)
    assert row.run_s == pytest.approx(120.0) and row.untimed_cells == 1 and row.estimated
    assert (row.exercises_all, row.exercises_kept) == (11, 7)
    [course_row] = schedule.course([synthetic])
    # the untimed cell counts as the mean timed cell: (30 + 90 + 0 + 0 + 0 + 0) / 6 = 20 s
    assert course_row.cell_estimate_s == pytest.approx(20.0)
    assert course_row.running == pytest.approx(140 / 60)
    assert course_row.learner() == pytest.approx(2 + 140 / 60 + 11)
    assert course_row.learner(kept_only=True) == pytest.approx(2 + 140 / 60 + 7)
    assert "~" in schedule.notebook_table([course_row])  # the estimate is marked


def test_a_run_in_another_profile_is_marked_estimated(synthetic):
    nb = nbformat.read(str(synthetic), as_version=4)
    nb.metadata["labkit"] = {"refresh": {"profile": "quick"}}
    nbformat.write(nb, str(synthetic))
    rows = schedule.course([synthetic])
    assert rows[0].run_profile == "quick" and rows[0].estimated
    assert "another profile than the workshop's: 09_synthetic (quick)" in schedule.report(rows)


def test_a_slot_fits_when_it_leaves_the_discussion_time(synthetic):
    rows = schedule.course([synthetic])
    need = rows[0].learner() + schedule.DISCUSSION_MIN  # 25.33 min
    roomy = schedule.Schedule("t", (schedule.Block("s", 26, ("09",)),), kept_only=False, after="-")
    tight = schedule.Schedule("t", (schedule.Block("s", 25, ("09",)),), kept_only=False, after="-")
    assert need == pytest.approx(25 + 1 / 3)
    assert schedule.check(roomy, rows)[0].fits
    assert not schedule.check(tight, rows)[0].fits
    assert "no: 1 min over" in schedule.slot_table(tight, rows)  # 0.33 min over, rounded up

    def kept(minutes):
        return schedule.Schedule("t", (schedule.Block("s", minutes, ("09",)),), kept_only=True, after="-")

    # kept exercises only: 2 + 2.33 + 7 + 10 = 21.33 min
    assert schedule.check(kept(22), rows)[0].fits and not schedule.check(kept(21), rows)[0].fits


def test_a_notebook_in_no_slot_and_a_slot_with_no_notebook_yet(synthetic):
    rows = schedule.course([synthetic])
    plan = schedule.Schedule("t", (schedule.Block("s", 60, ("08",)),), kept_only=False, after="homework")
    assert schedule.slot_of("09", plan) == "homework"
    assert "08 (not written yet)" in schedule.slot_table(plan, rows)


def test_an_exercise_without_minutes_is_named(synthetic, monkeypatch):
    monkeypatch.setattr(exercises, "MINUTES", {"9.1": (7, "keep")})
    with pytest.raises(exercises.ExerciseFormatError,
                       match="exercise 9.2 has no entry in labkit.exercises.build.MINUTES"):
        schedule.course([synthetic])


def test_the_doc_block_needs_its_markers():
    with pytest.raises(ValueError, match="'schedule' once"):
        schedule.doc_block("no markers here", "schedule")


def test_instructors_guide_shows_what_the_script_computes_now():
    """docs/instructors.md's tables are the script's output: after a notebook changes, run
    `python -m labkit.exercises.schedule --write-doc`."""
    text = (ROOT / "docs/instructors.md").read_text(encoding="utf-8")
    for name, body in schedule.blocks(schedule.course()).items():
        assert schedule.doc_block(text, name) == body, \
            f"docs/instructors.md's {name!r} block is stale: run python -m labkit.exercises.schedule --write-doc"


def test_write_doc_rewrites_only_the_blocks(tmp_path):
    rows = schedule.course()
    begin, end = schedule._markers("schedule")
    begin2, end2 = schedule._markers("exercise-minutes")
    doc = tmp_path / "guide.md"
    doc.write_text(f"before\n{begin}\nold\n{end}\nmiddle\n{begin2}\n{end2}\nafter\n")
    assert schedule.write_doc(rows, doc)
    text = doc.read_text()
    assert text.startswith("before\n") and "\nmiddle\n" in text and text.endswith("after\n") and "old" not in text
    assert schedule.doc_block(text, "schedule") == schedule.report(rows)
    assert not schedule.write_doc(rows, doc)  # already up to date


def test_every_notebook_fits_its_slot():
    rows = schedule.course()
    over = [(s.name, c.block.name) for s in schedule.SCHEDULES for c in schedule.check(s, rows) if not c.fits]
    assert not over, over
