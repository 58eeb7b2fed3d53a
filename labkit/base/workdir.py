"""Where the files a learner makes go (04's my_keras_hvd.py, a command's default output): one folder of theirs.

$LABKIT_WORKDIR if set; else the current folder, when it is writable and not inside a course installed read-only
(an instructor's shared copy on an HPC file system); else ~/labkit-work, said in one line the first time. Nothing
is ever written inside a read-only course. (04_horovod_scaling)
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "LABKIT_WORKDIR"
HOME_FOLDER = "labkit-work"
COURSE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding labkit/ and notebooks/
_said: set[Path] = set()  # the fallback folders already announced in this process


def _writable(path: Path) -> bool:
    """True for a folder this user may create files in (a read-only mount says no even to root)."""
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _inside_readonly_course(path: Path) -> bool:
    """True when path lies in the course's folder and the course itself is not writable (installed read-only)."""
    try:
        path.resolve().relative_to(COURSE_ROOT)
    except ValueError:
        return False
    return not _writable(COURSE_ROOT)


def workdir_problem() -> str | None:
    """Why $LABKIT_WORKDIR cannot be used (not a folder, or not writable), in one line; else None."""
    env = os.environ.get(ENV, "").strip()
    if not env:
        return None
    where = Path(env).expanduser()
    if not os.path.lexists(where):
        parent = next((p for p in where.absolute().parents if p.exists()), None)
        if parent is not None and _writable(parent):
            return None  # created on demand
        return f"{ENV}={env} does not exist and cannot be created here; point {ENV} at a folder you can write"
    if not where.is_dir():
        return f"{ENV}={env} is not a folder; point {ENV} at a folder you can write (or unset it)"
    if not _writable(where):
        return f"{ENV}={env} is not writable by you; point {ENV} at a folder you can write (or unset it)"
    return None


def workdir(*, say=print) -> Path:
    """The learner's own folder for the files labkit makes (created on demand): $LABKIT_WORKDIR, else the current
    folder when writable and outside a read-only course, else ~/labkit-work (say() gets one line the first time).
    A bad $LABKIT_WORKDIR raises ValueError naming it. (04_horovod_scaling)"""
    problem = workdir_problem()
    if problem:
        raise ValueError(problem)
    env = os.environ.get(ENV, "").strip()
    if env:
        path = Path(env).expanduser().absolute()
        path.mkdir(parents=True, exist_ok=True)
        return path
    here = Path.cwd()
    if _writable(here) and not _inside_readonly_course(here):
        return here
    home = Path.home() / HOME_FOLDER
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"no folder of yours to write in: this folder is read-only and {shown(home)} cannot be "
                         f"made ({err.strerror}); set {ENV} to a folder you can write") from None
    if home not in _said:
        _said.add(home)
        why = "the course is installed read-only" if _inside_readonly_course(here) else "this folder is read-only"
        say(f"your files go to {shown(home)}: {why} ({ENV} chooses another folder)")
    return home


def shown(path) -> str:
    """A path as a notebook may print it: relative to the current folder when inside it, else ~/... (no machine
    paths). (04_horovod_scaling)"""
    from labkit.base.config import shown_path
    path = Path(path).expanduser().absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return shown_path(path)


def find(name) -> Path:
    """A file the learner names: as given (from the current folder) if it exists, else in workdir() when there;
    else as given. (04_horovod_scaling)"""
    path = Path(name).expanduser()
    if path.is_absolute() or path.exists():
        return path
    try:
        mine = workdir(say=lambda line: None) / path
    except ValueError:
        return path
    return mine if mine.exists() else path


def _copy_missing(source: Path, target: Path) -> tuple[int, int]:
    """Copy source's files into target, keeping the tree; a file already in target is left as it is (the
    learner's copy). Returns (copied, kept)."""
    from labkit.base import resultsfile
    copied = kept = 0
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if not path.is_file() or any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue  # checkpoints, caches and hidden files are not the course
        dest = target / rel
        if os.path.lexists(dest):
            kept += 1
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        resultsfile.write_bytes(dest, path.read_bytes(), follow_symlinks=False)
        copied += 1
    return copied, kept


def lab_folder(*, course: Path | None = None, say=print) -> Path:
    """The folder JupyterLab serves (scripts/lab.sh), holding notebooks/: the course itself when its notebooks
    folder is writable; else workdir(), into which the course's notebooks/ (results/ with it) is copied first,
    never over a copy the learner already has there; say() gets one line saying so. (00_welcome)"""
    course = COURSE_ROOT if course is None else Path(course)
    notebooks = course / "notebooks"
    if not notebooks.is_dir():
        raise ValueError(f"course {course} has no notebooks/ folder; run lab from the course's own scripts/")
    if _writable(notebooks):
        return course
    target = workdir(say=lambda line: None)
    copied, kept = _copy_missing(notebooks, target / "notebooks")
    mine = f"; {kept} file(s) already there kept as you left them" if kept else ""
    say(f"the course is installed read-only: its notebooks are in {shown(target / 'notebooks')} for you to edit "
        f"({copied} file(s) copied{mine}; {ENV} chooses another folder)")
    return target


def _main(argv: list[str]) -> int:
    """`python -m labkit.base.workdir [--lab]`: print workdir() (or lab_folder()); its line goes to stderr."""
    import sys

    def say(line):
        print(f"lab: {line}", file=sys.stderr)

    try:
        print(lab_folder(say=say) if argv == ["--lab"] else workdir(say=say))
    except ValueError as err:
        say(str(err))
        return 2
    return 0


if __name__ == "__main__":  # scripts/lab.sh asks for the folder here: one home for the rule
    import sys
    sys.exit(_main(sys.argv[1:]))
