"""The course's exercises, and the learner edition of the notebooks without their solutions.

An exercise is a code cell tagged `exercise` whose solution sits between nbgrader's markers `### BEGIN SOLUTION`
and `### END SOLUTION`; its first line (`# Exercise 2.1 · title`) names it, and the next cell calls a checker
from labkit.exercises.check. The learner edition replaces each solution with `answer = None  # your answer here`, which
the checker answers with "not answered yet", and clears the outputs of the exercise and check cells, so "Run
All" goes through and the lesson carries on with the checker's reference value.

A small module rather than nbgrader's ClearSolutions: nbgrader 0.9.6 resolves against our pins but brings
SQLAlchemy, alembic, Mako, RapidFuzz and notebook 7 for a text replacement, and its stub
(`raise NotImplementedError`) would stop Run All. (00_welcome)
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TAG = "exercise"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
PLACEHOLDER = "answer = None  # your answer here"
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
_CHECK_CALL = re.compile(r"\bcheck\.(\w+)\(")
_NUMBER = re.compile(r"\bExercise\s+(\d+\.\d+)\b")

# Minutes per exercise (reading, doing, checking; the fast half of a room needs about half) and what to do with
# it when short of time ("keep..." or "skip..."): the one home of these numbers, keyed by the number in the
# exercise's title. labkit.exercises.schedule adds them to each notebook's minutes and writes docs/instructors.md's
# table.
MINUTES = {
    "1.1": (5, "keep"),
    "1.2": (5, "keep (the formula recurs in 02 and 03)"),
    "1.3": (3, "skip"),
    "1.4": (10, "keep (the loop after it is the answer)"),
    "2.1": (4, "keep"),
    "2.2": (8, "skip (the im2col explorer shows the same)"),
    "2.3": (10, "keep (the notebook's core)"),
    "2.4": (4, "keep"),
    "2.5": (4, "skip"),
    "3.1": (4, "keep"),
    "3.2": (3, "keep"),
    "3.3": (10, "keep"),
    "3.4": (4, "skip"),
    "4.1": (15, "keep (the skill the course is for)"),
    "4.2": (3, "keep"),
    "4.3": (3, "keep"),
    "4.4": (4, "skip"),
    "4.5": (5, "keep"),
    "5.1": (10, "skip on the half day (05 is homework)"),
    "5.2": (3, "keep"),
    "5.3": (4, "skip"),
    "5.4": (10, "skip on the half day (05 is homework)"),
    "6.1": (3, "keep"),
    "6.2": (5, "skip"),
    "6.3": (3, "keep"),
    "6.4": (10, "keep"),
    "8.1": (15, "keep (08 is self-paced: the checkpoint every rank resumes from)"),
}


class ExerciseFormatError(ValueError):
    """An exercise cell whose markers do not pair up, or with no checker call after it."""


@dataclass(frozen=True)
class Exercise:
    notebook: str
    cell: int  # index of the exercise cell
    title: str
    checker: str
    checks: str  # the checker's one-line description

    def __str__(self):
        return f"{self.notebook}  {self.title}  [check.{self.checker}: {self.checks}]"

    @property
    def number(self) -> str:
        """'2.1' from the title 'Exercise 2.1 · ...'."""
        found = _NUMBER.search(self.title)
        if found is None:
            raise ExerciseFormatError(f"{self.notebook} cell {self.cell}: the title must start 'Exercise N.M'; "
                                      f"got {self.title!r}")
        return found.group(1)

    @property
    def minutes(self) -> int:
        """The learner's minutes for it, from MINUTES."""
        return _minutes_entry(self)[0]

    @property
    def kept(self) -> bool:
        """Whether it stays when the room is short of time (MINUTES says 'keep...')."""
        return _minutes_entry(self)[1].startswith("keep")


def _minutes_entry(ex: Exercise) -> tuple[int, str]:
    if ex.number not in MINUTES:
        raise ExerciseFormatError(f"{ex.notebook}: exercise {ex.number} has no entry in labkit.exercises.build.MINUTES "
                                  "(add its minutes and 'keep' or 'skip')")
    return MINUTES[ex.number]


def _read(path):
    import nbformat
    return nbformat.read(str(path), as_version=4)


def is_exercise(cell) -> bool:
    return cell.cell_type == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def solution_lines(source: str) -> list[str]:
    """The lines between the markers (the markers excluded)."""
    out, inside = [], False
    for line in source.splitlines():
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside:
            out.append(line)
    return out


def strip_solution(source: str, where: str = "cell") -> str:
    """The source with each BEGIN..END block (markers included) replaced by the placeholder, same indentation."""
    out, inside = [], False
    for line in source.splitlines():
        mark = line.strip()
        if mark == BEGIN:
            if inside:
                raise ExerciseFormatError(f"{where}: {BEGIN!r} twice without {END!r} between")
            inside = True
            out.append(line[:len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif mark == END:
            if not inside:
                raise ExerciseFormatError(f"{where}: {END!r} without a {BEGIN!r} before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ExerciseFormatError(f"{where}: {BEGIN!r} is never closed by {END!r}")
    return "\n".join(out)


def exercises(nb, name: str = "notebook") -> list[Exercise]:
    """The exercises of one notebook, in order; each must have markers and a checker call in the next cell."""
    from labkit.exercises import check
    found = []
    for i, cell in enumerate(nb.cells):
        if not is_exercise(cell):
            continue
        where = f"{name} cell {i}"
        if BEGIN not in cell.source:
            raise ExerciseFormatError(f"{where}: an exercise cell needs {BEGIN!r} ... {END!r} around its solution")
        strip_solution(cell.source, where)
        following = nb.cells[i + 1].source if i + 1 < len(nb.cells) else ""
        call = _CHECK_CALL.search(following)
        if call is None or call.group(1) not in check.CHECKERS:
            raise ExerciseFormatError(f"{where}: the next cell must call a checker, check.NAME(answer, ...)")
        title = cell.source.splitlines()[0].lstrip("# ").strip()
        doc = (check.CHECKERS[call.group(1)].__doc__ or "").strip().splitlines()
        checks = re.sub(r"\s*\(\d\d_\w+\)$", "", doc[0]) if doc else ""  # without the notebook's name
        found.append(Exercise(name, i, title, call.group(1), checks))
    return found


def learner_edition(nb, name: str = "notebook"):
    """A copy of the notebook with every solution replaced by the placeholder and the exercise outputs cleared."""
    out = copy.deepcopy(nb)
    for ex in exercises(nb, name):
        for i in (ex.cell, ex.cell + 1):
            out.cells[i].outputs = []
            out.cells[i].execution_count = None
        out.cells[ex.cell].source = strip_solution(nb.cells[ex.cell].source, f"{name} cell {ex.cell}")
    out.metadata.setdefault("labkit", {})["edition"] = "learner"
    return out


def course_notebooks(source=None) -> list[Path]:
    paths = sorted(Path(source or NOTEBOOKS).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no course notebooks (NN_name.ipynb) in {source or NOTEBOOKS}")
    return paths


def list_exercises(source=None) -> list[Exercise]:
    """Every exercise of the course, notebook by notebook."""
    return [ex for path in course_notebooks(source) for ex in exercises(_read(path), path.name)]


MANIFEST = ".labkit-learner-edition.json"  # what build wrote into a folder: {name: sha256 of its bytes}


def _sha256(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def _manifest(out_dir: Path) -> dict:
    """{notebook name: [sha256, ...]} of what build wrote into out_dir ({} when it wrote nothing there): while a
    build runs a name lists the old and the new content, so the manifest agrees with the file whichever it holds."""
    import json
    try:
        written = json.loads((out_dir / MANIFEST).read_text()).get("written", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(written, dict):
        return {}
    return {name: [v] if isinstance(v, str) else list(v) for name, v in written.items() if isinstance(v, (str, list))}


def foreign_notebooks(out_dir, names) -> list[str]:
    """Those of names in out_dir whose content build did not write there itself (an instructor copy, a
    learner's edits, a link): the files a build would overwrite and must not without force."""
    out_dir = Path(out_dir)
    mine = _manifest(out_dir)
    foreign = []
    for name in names:
        path = out_dir / name
        if not os.path.lexists(path):
            continue
        try:
            ours = not path.is_symlink() and _sha256(path.read_bytes()) in mine.get(name, [])
        except OSError:
            ours = False
        if not ours:
            foreign.append(name)
    return foreign


def _check_inodes(out_dir: Path, names) -> None:
    """ValueError naming DIR when its file system has fewer free files (inodes) than the build makes: the new
    notebooks, the manifest and one temporary file at a time. A file system without an inode count passes."""
    st = os.statvfs(out_dir)
    need = sum(not os.path.lexists(out_dir / n) for n in [*names, MANIFEST]) + 1
    if st.f_files and st.f_favail < need:
        raise ValueError(f"DIR: cannot write {out_dir} (its file system has {st.f_favail} free inodes, the "
                         f"build needs {need}); free some files there or choose another folder")


class Built(list):
    """The notebooks build wrote (a list of paths), and .kept: the copies it kept of the notebooks it replaced."""

    kept: list


def _keep_copies(out_dir: Path, names) -> list[Path]:
    """Copy each of names in out_dir (a learner's edits about to be replaced) into a new folder
    out_dir/replaced-YYYYmmdd-HHMMSS/; a symlink in the way is not copied (its target is never written)."""
    import time

    from labkit.base import resultsfile
    names = [n for n in names if not (out_dir / n).is_symlink()]
    if not names:
        return []
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
    while True:  # two builds in one second: a new folder each
        folder = out_dir / (f"replaced-{stamp}" + (f"-{n}" if n else ""))
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
    return [resultsfile.write_bytes(folder / name, (out_dir / name).read_bytes(), follow_symlinks=False)
            for name in names]


def build(out_dir, source=None, force: bool = False) -> Built:
    """Write the learner edition of every course notebook into out_dir; returns the paths written (.kept: the
    copies of the notebooks it replaced).

    Never overwrites a notebook it did not write itself: out_dir's manifest records the SHA-256 of each file
    build wrote, and a notebook in the way with other content (a copy of the instructor edition, a learner's
    edits) is refused, by name, unless force=True; with force, a copy of each such notebook is kept first in
    out_dir/replaced-YYYYmmdd-HHMMSS/, so nothing a learner wrote is lost. Each file is replaced through
    labkit.base.resultsfile's writer: a new directory entry, so a hard-linked copy never writes into the
    instructor's files, and a full disk leaves every notebook either old or new, never half-written. (00_welcome)
    """
    import nbformat

    from labkit.base import resultsfile
    paths = course_notebooks(source)
    out_dir = Path(out_dir)
    resultsfile.target_of(out_dir)  # a symlink loop: one line
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise ValueError(f"DIR {out_dir} is not a folder")
    if os.path.realpath(out_dir) == os.path.realpath(paths[0].parent):
        raise ValueError(f"out_dir must differ from the notebooks' own folder {paths[0].parent} (it would "
                         "overwrite the instructor edition)")
    rendered = {path.name: nbformat.writes(learner_edition(_read(path), path.name)) for path in paths}
    rendered = {name: (text if text.endswith("\n") else text + "\n").encode() for name, text in rendered.items()}
    foreign = foreign_notebooks(out_dir, rendered) if out_dir.is_dir() else []
    if foreign and not force:
        raise ValueError(f"{out_dir} holds notebooks that build did not write: {', '.join(foreign)}; they would "
                         "be overwritten. Choose an empty folder, or pass --force to replace them")
    out_dir.mkdir(parents=True, exist_ok=True)
    copies = sum((out_dir / n).stat().st_size for n in foreign if not (out_dir / n).is_symlink())
    resultsfile.check_space(out_dir / MANIFEST, sum(len(b) for b in rendered.values()) + copies + 4096, "DIR")
    _check_inodes(out_dir, [*rendered, *([f"copy of {n}" for n in foreign] + ["their folder"] * bool(foreign))])
    written, mine = Built(), _manifest(out_dir)
    written.kept = _keep_copies(out_dir, foreign)
    for name, data in rendered.items():
        target = out_dir / name
        # the manifest first names every content the file may hold (after builds stopped mid-write, any of
        # them) and the new one: a failure at either write leaves it agreeing with the file
        digest = _sha256(data)
        mine[name] = list(dict.fromkeys([*mine.get(name, []), digest]))
        resultsfile.write_json(out_dir / MANIFEST, {"written": mine}, follow_symlinks=False)
        resultsfile.write_bytes(target, data, follow_symlinks=False)  # a link in the way is replaced, not followed
        mine[name] = [digest]
        written.append(target)
    resultsfile.write_json(out_dir / MANIFEST, {"written": mine}, follow_symlinks=False)
    return written


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr and exit 2, no usage block
        print(f"labkit exercises: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="labkit exercises", description="List the course's exercises or build the learner edition.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    b = sub.add_parser("build", help="write the notebooks with the solutions removed into DIR")
    b.add_argument("dir", metavar="DIR", help="output folder, e.g. learner/")
    b.add_argument("--from", dest="source", metavar="NOTEBOOKS", help="source folder (default: the course's)")
    b.add_argument("--force", action="store_true",
                   help="replace notebooks in DIR that build did not write (an instructor copy, edited files)")
    ls = sub.add_parser("list", help="print every exercise: notebook, title, what its checker checks")
    ls.add_argument("--from", dest="source", metavar="NOTEBOOKS", help="source folder (default: the course's)")
    return parser


def cli_main(argv: list[str]) -> int:
    """`labkit exercises list` | `labkit exercises build DIR [--from NOTEBOOKS]`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action is None:
        print("labkit exercises: choose an action: list, or build DIR (see --help)", file=sys.stderr)
        return 2
    try:
        found = list_exercises(args.source)
        if args.action == "list":
            for ex in found:
                print(ex)
            print(f"{len(found)} exercises")
        else:
            written = build(args.dir, args.source, force=args.force)
            print(f"learner edition: {len(written)} notebooks, {len(found)} exercises, in {Path(args.dir)}")
            if written.kept:
                print(f"the {len(written.kept)} notebook(s) it replaced are kept in {written.kept[0].parent}: "
                      f"{', '.join(p.name for p in written.kept)}")
    except (OSError, ValueError) as err:
        print(f"labkit exercises: {err}", file=sys.stderr)
        return 2
    return 0
