"""The learner's minutes per notebook (reading, running, exercises) and the workshop schedules they must fit.

    python -m labkit.exercises.schedule               # the tables; exit status 1 when a slot is over its minutes
    python -m labkit.exercises.schedule --write-doc   # also rewrite the marked blocks of docs/instructors.md

Reading is the words of the markdown cells at WORDS_PER_MINUTE, counted as a reader reads them: no fenced
code, no HTML tags or comments, no LaTeX commands or braces, a link by its text, an inline code span as one
word. Running is the committed workshop run: the sum over code cells of the timestamps nbclient records in
each cell's metadata (`execution`: iopub.execute_input -> shell.execute_reply; scripts/refresh_notebooks.py
records them); a code cell without them counts as the course's mean timed cell, and the minutes are marked
"~" (estimate). Exercises come from labkit.exercises.build.MINUTES. A slot fits when its notebooks' minutes leave
DISCUSSION_MIN for the instructor's introduction and questions.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

WORDS_PER_MINUTE = 180
DISCUSSION_MIN = 10  # per slot: the instructor's introduction and the room's questions
DEFAULT_CELL_S = 5.0  # an untimed cell when no cell of the course is timed either
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "instructors.md"


@dataclass(frozen=True)
class Block:
    """A stretch of the day: a slot with notebooks (by their number, '04'), or a break (no notebooks)."""
    name: str
    minutes: int
    notebooks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Schedule:
    name: str
    blocks: tuple[Block, ...]
    kept_only: bool  # True: only the exercises MINUTES marks 'keep' are done in the room
    after: str  # what happens to the notebooks in no slot


# About six 60-minute slots; 07 (the deep dive after 04) is read self-paced, or shown by the instructor as time allows;
# 08 (time to accuracy, after 07) is self-paced
DAY = Schedule("one day", (
    Block("slot 1", 60, ("00", "01")),
    Block("break", 15),
    Block("slot 2", 60, ("02",)),
    Block("slot 3", 60, ("03",)),
    Block("lunch", 45),
    Block("slot 4", 60, ("04",)),
    Block("break", 15),
    Block("slot 5", 60, ("05",)),
    Block("slot 6", 60, ("06",)),
    Block("wrap-up", 15),
), kept_only=False, after="self-paced")
HALF_DAY = Schedule("half day", (
    Block("slot 1", 55, ("00", "01")),
    Block("slot 2", 50, ("02",)),
    Block("break", 15),
    Block("slot 3", 60, ("04",)),
    Block("wrap-up", 15),
), kept_only=True, after="homework")
SCHEDULES = (DAY, HALF_DAY)


# --- reading ---------------------------------------------------------------------------------------------
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)([^$\n]+?)(?<![\s\\])\$", re.S)
# layout commands a reader does not say; the others (\times, \eta, \sqrt) are read as a word each
_LATEX_LAYOUT = re.compile(r"\\(?:frac|dfrac|tfrac|left|right|mathrm|mathbf|mathit|text|textrm|operatorname|"
                           r"quad|qquad|big|Big|bigg|Bigg|displaystyle|,|;|:|!)(?![A-Za-z])")
_WORD = re.compile(r"[^\W_]")


def _math_words(tex: str) -> str:
    tex = _LATEX_LAYOUT.sub(" ", tex)
    tex = re.sub(r"\\([A-Za-z]+)", r" \1 ", tex)  # \times -> 'times'
    return " ".join(re.findall(r"[A-Za-z]+|\d+(?:[.,]\d+)*", tex))


def words(markdown: str) -> int:
    """Words of one markdown text as a reader reads them (see the module's docstring)."""
    text = _FENCE.sub(" ", markdown)
    text = _COMMENT.sub(" ", text)
    text = _CODE_SPAN.sub(" code ", text)  # before tags and math: `<b>` or `$x` inside code is code
    text = _MATH.sub(lambda m: " " + _math_words(m.group(1) or m.group(2)) + " ", text)
    text = _TAG.sub(" ", text)
    text = _IMAGE.sub(" ", text)
    text = _LINK.sub(r" \1 ", text)
    return sum(1 for token in re.split(r"[\s|]+", text) if _WORD.search(token))


# --- running ---------------------------------------------------------------------------------------------
def _stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def cell_seconds(cell) -> float | None:
    """Seconds a code cell ran in its recorded execution (None when its metadata has no timestamps)."""
    timing = cell.get("metadata", {}).get("execution") or {}
    start = timing.get("iopub.execute_input") or timing.get("iopub.status.busy")
    end = timing.get("shell.execute_reply") or timing.get("iopub.status.idle")
    if not (start and end):
        return None
    return max(0.0, (_stamp(end) - _stamp(start)).total_seconds())


# --- one notebook ----------------------------------------------------------------------------------------
@dataclass
class Minutes:
    notebook: str
    words: int
    run_s: float  # timed cells only
    untimed_cells: int
    exercises_all: int
    exercises_kept: int
    cell_estimate_s: float = DEFAULT_CELL_S
    exercise_numbers: list = field(default_factory=list)
    run_profile: str | None = None  # the profile of the refresh that ran it (labkit.refresh), where recorded

    @property
    def number(self) -> str:
        return self.notebook[:2]

    @property
    def reading(self) -> float:
        return self.words / WORDS_PER_MINUTE

    @property
    def running(self) -> float:
        return (self.run_s + self.untimed_cells * self.cell_estimate_s) / 60

    @property
    def estimated(self) -> bool:
        """Running minutes not all from a timed workshop run: untimed cells, or another profile's refresh."""
        return self.untimed_cells > 0 or self.run_profile not in (None, "workshop")

    def exercises(self, kept_only: bool) -> int:
        return self.exercises_kept if kept_only else self.exercises_all

    def learner(self, kept_only: bool = False) -> float:
        """Reading + running + the exercises done in the room."""
        return self.reading + self.running + self.exercises(kept_only)


def measure(nb, name: str) -> Minutes:
    """The minutes of one notebook (an nbformat NotebookNode); untimed cells are counted separately."""
    from labkit.exercises import build as exercises
    found = exercises.exercises(nb, name)
    timed = [cell_seconds(c) for c in nb.cells if c.cell_type == "code"]
    return Minutes(
        notebook=name,
        words=sum(words(c.source) for c in nb.cells if c.cell_type == "markdown"),
        run_s=sum(s for s in timed if s is not None),
        untimed_cells=sum(s is None for s in timed),
        exercises_all=sum(ex.minutes for ex in found),
        exercises_kept=sum(ex.minutes for ex in found if ex.kept),
        exercise_numbers=[ex.number for ex in found],
        run_profile=nb.metadata.get("labkit", {}).get("refresh", {}).get("profile"))


def course(paths=None) -> list[Minutes]:
    """Minutes of every course notebook; an untimed cell counts as the mean of the course's timed cells."""
    import nbformat

    from labkit.exercises import build as exercises
    paths = list(paths) if paths is not None else exercises.course_notebooks()
    books = [nbformat.read(str(p), as_version=4) for p in paths]
    rows = [measure(nb, Path(p).name[:-len(".ipynb")]) for nb, p in zip(books, paths)]
    timed = [s for nb in books for c in nb.cells if c.cell_type == "code" for s in [cell_seconds(c)] if s is not None]
    estimate = sum(timed) / len(timed) if timed else DEFAULT_CELL_S
    for row in rows:
        row.cell_estimate_s = estimate
    stale = sorted(set(exercises.MINUTES) - {n for row in rows for n in row.exercise_numbers})
    if stale and {Path(p).resolve() for p in paths} == {p.resolve() for p in exercises.course_notebooks()}:
        raise exercises.ExerciseFormatError(
            f"labkit.exercises.build.MINUTES lists exercises no notebook has: {', '.join(stale)}")
    return rows


# --- the tables --------------------------------------------------------------------------------------------
def _clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def _m(value: float, estimated: bool = False) -> str:
    return ("~" if estimated else "") + ("<1" if 0 < value < 0.5 else f"{value:.0f}")


def slot_of(number: str, schedule: Schedule) -> str:
    start = 0
    for block in schedule.blocks:
        if number in block.notebooks:
            return f"{block.name} ({_clock(start)})"
        start += block.minutes
    return schedule.after


@dataclass
class SlotCheck:
    start: int
    block: Block
    learner: float | None  # None: a break
    missing: list
    estimated: bool

    @property
    def fits(self) -> bool:
        return self.learner is None or self.learner + DISCUSSION_MIN <= self.block.minutes


def check(schedule: Schedule, rows: list[Minutes]) -> list[SlotCheck]:
    """Each block of the schedule with its notebooks' learner minutes (missing notebooks named)."""
    by_number = {row.number: row for row in rows}
    out, start = [], 0
    for block in schedule.blocks:
        if block.notebooks:
            present = [by_number[n] for n in block.notebooks if n in by_number]
            out.append(SlotCheck(start, block, sum(r.learner(schedule.kept_only) for r in present),
                                 [n for n in block.notebooks if n not in by_number],
                                 any(r.estimated for r in present)))
        else:
            out.append(SlotCheck(start, block, None, [], False))
        start += block.minutes
    return out


def notebook_table(rows: list[Minutes]) -> str:
    lines = ["| notebook | reading | running | exercises (kept) | total | one day | half day |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r.notebook} | {_m(r.reading)} | {_m(r.running, r.estimated)} | "
                     f"{r.exercises_all} ({r.exercises_kept}) | {_m(r.learner(), r.estimated)} | "
                     f"{slot_of(r.number, DAY)} | {slot_of(r.number, HALF_DAY)} |")
    return "\n".join(lines)


def slot_table(schedule: Schedule, rows: list[Minutes]) -> str:
    exercises = "kept exercises" if schedule.kept_only else "all exercises"
    lines = [f"| {schedule.name}: start | block | minutes | notebooks | learner's minutes ({exercises}) | fits |",
             "|---|---|---:|---|---:|---|"]
    for s in check(schedule, rows):
        head = f"| {_clock(s.start)} | {s.block.name} | {s.block.minutes} |"
        if s.learner is None:
            lines.append(f"{head} | | |")
            continue
        names = ", ".join(n + (" (not written yet)" if n in s.missing else "") for n in s.block.notebooks)
        over = math.ceil(s.learner + DISCUSSION_MIN - s.block.minutes)
        verdict = ("-" if len(s.missing) == len(s.block.notebooks) else
                   "yes" if s.fits else f"**no: {over} min over**")
        lines.append(f"{head} {names} | {_m(s.learner, s.estimated)} | {verdict} |")
    lines.append(f"| {_clock(sum(b.minutes for b in schedule.blocks))} | end | | | | |")
    return "\n".join(lines)


def exercise_table() -> str:
    from labkit.exercises import build as exercises
    lines = ["| notebook | exercise | minutes | when short of time |", "|---|---|---:|---|"]
    found = exercises.list_exercises()
    for ex in found:
        title = re.sub(r"^Exercise\s+", "", ex.title).replace(" · ", " ", 1)
        lines.append(f"| {ex.notebook[:2]} | {title} | {ex.minutes} | {exercises.MINUTES[ex.number][1]} |")
    lines.append(f"| all | {len(found)} exercises; the kept ones: {sum(ex.kept for ex in found)} | "
                 f"{sum(ex.minutes for ex in found)}; kept: {sum(ex.minutes for ex in found if ex.kept)} | |")
    return "\n".join(lines)


def report(rows: list[Minutes]) -> str:
    """The schedule block of docs/instructors.md: per notebook, then per slot of each schedule."""
    notes = [f"Reading at {WORDS_PER_MINUTE} words/min; running is the committed workshop run (cell timestamps); "
             f"exercises from `labkit.exercises.build.MINUTES`, in brackets the kept ones; total = reading + running + "
             f"all exercises. A slot fits when its learner's minutes leave {DISCUSSION_MIN} min for the "
             "instructor's introduction and questions."]
    untimed = [r.notebook for r in rows if r.untimed_cells]
    if untimed:
        notes.append(f"~: estimated, some code cells carry no timestamps ({', '.join(untimed)}); each counts as "
                     f"the course's mean timed cell, {rows[0].cell_estimate_s:.1f} s.")
    other = [f"{r.notebook} ({r.run_profile})" for r in rows if r.run_profile not in (None, "workshop")]
    if other:
        notes.append(f"~: run in another profile than the workshop's: {', '.join(other)}.")
    parts = [notebook_table(rows), "\n".join(notes)] + [slot_table(s, rows) for s in SCHEDULES]
    return "\n\n".join(parts)


# --- docs/instructors.md -------------------------------------------------------------------------------------
def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}: written by `python -m labkit.exercises.schedule --write-doc`; "
            "edit labkit/exercises/schedule.py or labkit.exercises.build.MINUTES, not this block -->",
            f"<!-- /{name} -->")


def blocks(rows: list[Minutes]) -> dict:
    return {"schedule": report(rows), "exercise-minutes": exercise_table()}


def doc_block(text: str, name: str) -> str:
    """The text between a marked block's markers in text."""
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"docs/instructors.md must hold the block {name!r} once, between {begin!r} and {end!r}")
    return text[text.index(begin) + len(begin):text.index(end)].strip("\n")


def write_doc(rows: list[Minutes], path: Path = DOC) -> bool:
    """Rewrite the marked blocks of the instructors' guide; True when something changed."""
    text = old = path.read_text(encoding="utf-8")
    for name, body in blocks(rows).items():
        doc_block(text, name)  # both markers there, once, in order
        begin, end = _markers(name)
        text = text[:text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end):]
    if text != old:
        from labkit.base import resultsfile
        resultsfile.write_text(path, text)
    return text != old


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.exercises.schedule", description=__doc__.splitlines()[0])
    parser.add_argument("--write-doc", action="store_true", help="rewrite the marked blocks in docs/instructors.md")
    args = parser.parse_args(argv)
    rows = course()
    print(report(rows))
    if args.write_doc:
        print(f"\n{DOC}: {'rewritten' if write_doc(rows) else 'already up to date'}")
    over = [f"{s.name}: {c.block.name} ({', '.join(c.block.notebooks)})"
            for s in SCHEDULES for c in check(s, rows) if not c.fits]
    if over:
        print("\nover their slot: " + "; ".join(over), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
