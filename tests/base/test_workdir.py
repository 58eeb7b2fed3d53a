"""labkit.base.workdir: the learner's files go to LABKIT_WORKDIR, the current folder, or ~/labkit-work, never into a
read-only course."""
import os
from pathlib import Path

import pytest

from labkit.base import workdir


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course folder (notebooks/ inside) and a HOME, both under tmp_path; LABKIT_WORKDIR unset."""
    root, home = tmp_path / "course", tmp_path / "home"
    (root / "notebooks").mkdir(parents=True)
    home.mkdir()
    monkeypatch.setattr(workdir, "COURSE_ROOT", root.resolve())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(workdir.ENV, raising=False)
    monkeypatch.setattr(workdir, "_said", set())
    return root, home


def read_only(monkeypatch, *folders):
    """Make folders (and everything under them) read as not writable, as for a non-root user or a read-only mount;
    root passes os.access on a chmod-ed folder, so the rule is tested here and the real thing in
    tests/course/test_readonly_course.py."""
    ro = [Path(f).resolve() for f in folders]
    real = workdir._writable
    monkeypatch.setattr(workdir, "_writable", lambda p: real(p) and not any(
        Path(p).resolve() == f or f in Path(p).resolve().parents for f in ro))


def test_writable_current_folder_is_the_workdir(course, monkeypatch):
    root, home = course
    monkeypatch.chdir(root / "notebooks")
    said = []
    assert workdir.workdir(say=said.append) == (root / "notebooks").resolve()
    assert said == [] and not (home / workdir.HOME_FOLDER).exists()


def test_read_only_course_sends_files_home_and_says_so_once(course, monkeypatch):
    root, home = course
    read_only(monkeypatch, root)
    monkeypatch.chdir(root / "notebooks")
    said = []
    assert workdir.workdir(say=said.append) == home / workdir.HOME_FOLDER
    assert workdir.workdir(say=said.append) == home / workdir.HOME_FOLDER
    assert said == ["your files go to ~/labkit-work: the course is installed read-only "
                    "(LABKIT_WORKDIR chooses another folder)"]
    assert (home / workdir.HOME_FOLDER).is_dir() and list(root.rglob("*")) == [root / "notebooks"]


def test_writable_folder_inside_a_read_only_course_is_not_used(course, monkeypatch):
    """A notebooks/ folder left group-writable in a read-only install is still the course's: nothing goes there."""
    root, home = course
    read_only(monkeypatch, root)
    real = workdir._writable
    monkeypatch.setattr(workdir, "_writable", lambda p: True if Path(p) == root / "notebooks" else real(p))
    monkeypatch.chdir(root / "notebooks")
    assert workdir.workdir(say=lambda line: None) == home / workdir.HOME_FOLDER


def test_read_only_folder_outside_the_course(course, tmp_path, monkeypatch):
    root, home = course
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    read_only(monkeypatch, elsewhere)
    monkeypatch.chdir(elsewhere)
    said = []
    assert workdir.workdir(say=said.append) == home / workdir.HOME_FOLDER
    assert said == ["your files go to ~/labkit-work: this folder is read-only (LABKIT_WORKDIR chooses another folder)"]


def test_labkit_workdir_wins_and_is_created(course, tmp_path, monkeypatch):
    root, home = course
    monkeypatch.chdir(root / "notebooks")
    monkeypatch.setenv(workdir.ENV, str(tmp_path / "mine" / "04"))
    assert workdir.workdir() == tmp_path / "mine" / "04" and (tmp_path / "mine" / "04").is_dir()


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_bad_labkit_workdir_is_named(course, tmp_path, monkeypatch, kind):
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("x")
    else:
        target.mkdir()
        read_only(monkeypatch, target)
    monkeypatch.setenv(workdir.ENV, str(target))
    with pytest.raises(ValueError, match=r"^LABKIT_WORKDIR=.*target is not (a folder|writable by you); point "):
        workdir.workdir()


def test_unwritable_home_says_what_to_set(course, monkeypatch):
    root, home = course
    read_only(monkeypatch, root)
    monkeypatch.setenv("HOME", str(root / "nohome"))
    def refuse(self, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "mkdir", refuse)
    monkeypatch.chdir(root / "notebooks")
    with pytest.raises(ValueError, match=r"^no folder of yours to write in: .*\(Permission denied\); set LABKIT_"):
        workdir.workdir()


def test_shown_and_find(course, monkeypatch):
    root, home = course
    read_only(monkeypatch, root)
    monkeypatch.chdir(root / "notebooks")
    mine = workdir.workdir(say=lambda line: None) / "my_keras_hvd.py"
    mine.write_text("x")
    assert workdir.shown(mine) == "~/labkit-work/my_keras_hvd.py"
    assert workdir.find("my_keras_hvd.py") == mine  # the learner's answer by name, from the notebook's folder
    assert workdir.find("missing.py") == Path("missing.py")
    monkeypatch.chdir(home)
    assert workdir.shown(mine) == os.path.join("labkit-work", "my_keras_hvd.py")


def _course_files(root: Path):
    """A course's notebooks folder: two notebooks, results/ beside them, and a checkpoint that is not the course."""
    nb = root / "notebooks"
    (nb / "00_welcome.ipynb").write_text('{"cells": []}\n')
    (nb / "01_cnn_basics.ipynb").write_text('{"cells": [1]}\n')
    (nb / "results").mkdir()
    (nb / "results" / "reference.json").write_text("{}\n")
    (nb / ".ipynb_checkpoints").mkdir()
    (nb / ".ipynb_checkpoints" / "00_welcome-checkpoint.ipynb").write_text("old\n")


def test_lab_serves_a_writable_course_itself(course, monkeypatch):
    root, home = course
    _course_files(root)
    said = []
    assert workdir.lab_folder(course=root, say=said.append) == root
    assert said == [] and not (home / workdir.HOME_FOLDER).exists()


def test_lab_on_a_read_only_course_copies_the_notebooks_and_keeps_the_learners(course, monkeypatch):
    """Read-only course: the notebooks and results/ are copied into ~/labkit-work/notebooks (checkpoints not), one
    line says so; a second start copies what is missing and leaves the learner's edited notebook as it is."""
    root, home = course
    _course_files(root)
    read_only(monkeypatch, root)
    monkeypatch.chdir(root / "notebooks")
    said = []
    served = workdir.lab_folder(course=root, say=said.append)
    mine = home / workdir.HOME_FOLDER / "notebooks"
    assert served == home / workdir.HOME_FOLDER
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*") if p.is_file()) == [
        "00_welcome.ipynb", "01_cnn_basics.ipynb", os.path.join("results", "reference.json")]
    assert len(said) == 1 and "~/labkit-work/notebooks" in said[0] and "read-only" in said[0], said
    (mine / "01_cnn_basics.ipynb").write_text("my answers\n")
    (mine / "00_welcome.ipynb").unlink()
    said.clear()
    assert workdir.lab_folder(course=root, say=said.append) == served
    assert (mine / "01_cnn_basics.ipynb").read_text() == "my answers\n"
    assert (mine / "00_welcome.ipynb").read_text() == '{"cells": []}\n'
    assert len(said) == 1 and "1 file(s) copied" in said[0] and "2 file(s) already there kept" in said[0], said


def test_lab_on_a_read_only_course_uses_labkit_workdir(course, tmp_path, monkeypatch):
    root, _ = course
    _course_files(root)
    read_only(monkeypatch, root)
    monkeypatch.setenv(workdir.ENV, str(tmp_path / "mine"))
    assert workdir.lab_folder(course=root, say=lambda line: None) == tmp_path / "mine"
    assert (tmp_path / "mine" / "notebooks" / "00_welcome.ipynb").is_file()


def test_lab_without_notebooks_folder_is_named(course, tmp_path):
    with pytest.raises(ValueError, match="notebooks/"):
        workdir.lab_folder(course=tmp_path / "nowhere", say=lambda line: None)
