"""`labkit exercises build`: never over someone else's work, a full disk keeps the previous edition."""
from __future__ import annotations

import contextlib
import errno
import json
import os

import pytest

from helpers import ROOT, fill, labkit_cli, one_line, sha, small_tmpfs  # noqa: E402

# ================================================================ exercises build
SOURCE = ROOT / "notebooks"


def course_names():
    return sorted(p.name for p in SOURCE.glob("[0-9][0-9]_*.ipynb"))


def _course_copy(folder, names=None):
    """folder, made here, holding a byte copy of the course's notebooks `names` (default: all of them)."""
    folder.mkdir()
    for name in course_names() if names is None else names:
        (folder / name).write_bytes((SOURCE / name).read_bytes())
    return folder


def test_build_refuses_a_copy_of_the_instructor_edition_and_force_replaces_it(tmp_path):
    copy = _course_copy(tmp_path / "copy")
    before = {name: sha(copy / name) for name in course_names()}
    line = one_line(labkit_cli("exercises", "build", str(copy)), "did not write", "--force", course_names()[0])
    assert all(name in line for name in course_names())
    assert {name: sha(copy / name) for name in course_names()} == before  # the solutions survive
    done = labkit_cli("exercises", "build", str(copy), "--force")
    assert done.returncode == 0, done.stderr
    assert all(sha(copy / name) != sha(SOURCE / name) for name in course_names())


def test_build_refuses_a_learners_edited_notebook_but_rebuilds_its_own(tmp_path):
    from labkit.exercises import build as exercises
    learner = tmp_path / "learner"
    exercises.build(learner)
    exercises.build(learner)  # over its own output: allowed
    edited = learner / "02_im2col.ipynb"
    edited.write_text(edited.read_text().replace("answer = None  # your answer here", "answer = 42", 1))
    mine = sha(edited)
    with pytest.raises(ValueError, match=r"did not write: 02_im2col\.ipynb;.*--force"):
        exercises.build(learner)
    assert sha(edited) == mine


def test_build_into_a_hard_linked_copy_never_writes_into_the_instructor_edition(tmp_path):
    from labkit.exercises import build as exercises
    src = _course_copy(tmp_path / "notebooks")  # a private copy stands in for the course's folder (cp -al on it below)
    before = {name: sha(src / name) for name in course_names()}
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in course_names():
        os.link(src / name, linked / name)
    with pytest.raises(ValueError, match="did not write"):
        exercises.build(linked, src)
    exercises.build(linked, src, force=True)
    assert {name: sha(src / name) for name in course_names()} == before  # the instructor edition is intact
    assert all(os.stat(linked / n).st_ino != os.stat(src / n).st_ino for n in course_names())
    assert all(b"### BEGIN SOLUTION" not in (linked / n).read_bytes() for n in course_names())


def test_build_into_a_symlink_loop_is_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    one_line(labkit_cli("exercises", "build", str(loop)), "symlink loop")


def test_build_on_a_full_disk_keeps_the_previous_edition_whole(tmp_path):
    from labkit.exercises import build as exercises
    src = _course_copy(tmp_path / "src", course_names()[:3])
    need = sum((src / n).stat().st_size for n in course_names()[:3])
    with small_tmpfs(tmp_path / "disk", size=f"{(need * 3 // 2) // 1024 + 64}k") as disk:
        exercises.build(disk / "learner", src)
        before = {p.name: sha(p) for p in (disk / "learner").iterdir()}
        fill(disk)
        with pytest.raises(ValueError, match="DIR: cannot write .*No space left"):
            exercises.build(disk / "learner", src)
        assert {p.name: sha(p) for p in (disk / "learner").iterdir()} == before  # no 0-byte notebook
        assert all(json.loads((disk / "learner" / n).read_text())["cells"] for n in course_names()[:3])


def _take_inodes(folder, leave: int) -> None:
    """Create empty files in folder until its file system has no free inode, then remove `leave` of them."""
    made = []
    try:
        while True:
            made.append(folder / f"f{len(made)}")
            made[-1].touch()
    except OSError as err:
        assert err.errno == errno.ENOSPC
        made.pop()
    for p in made[-leave:]:
        p.unlink()
    assert os.statvfs(folder).f_favail == leave


def test_build_out_of_inodes_is_refused_before_any_write_and_leaves_no_manifest(tmp_path):
    """3 free inodes pass a one-file space check; the build makes 3 notebooks and a manifest (and a temporary
    file at a time): it is refused before writing anything, rather than stopping with a notebook written
    that its manifest does not know (a rerun would then need --force)."""
    from labkit.exercises import build as exercises
    src = _course_copy(tmp_path / "src", course_names()[:3])
    with small_tmpfs(tmp_path / "disk", size="16m", inodes=64) as disk:
        (disk / "learner").mkdir()
        (disk / "others").mkdir()
        _take_inodes(disk / "others", leave=3)
        with pytest.raises(ValueError, match=r"DIR: cannot write .*free inodes"):
            exercises.build(disk / "learner", src)
        assert list((disk / "learner").iterdir()) == []


def test_the_manifest_agrees_with_every_notebook_whatever_write_fails(tmp_path, monkeypatch):
    """A write that fails mid-build (the manifest's, or a notebook's) leaves a manifest that still knows every
    notebook build wrote: the rerun needs no --force."""
    from labkit.base import resultsfile
    from labkit.exercises import build as exercises
    src = _course_copy(tmp_path / "src", course_names()[:3])
    learner = tmp_path / "learner"
    real = resultsfile.write_bytes
    for fail_at in range(1, 8):  # the n-th write of the build fails (notebooks and manifests alike)
        calls = {"n": 0}

        def failing(*a, calls=calls, fail_at=fail_at, **k):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*a, **k)

        monkeypatch.setattr(resultsfile, "write_bytes", failing)
        with contextlib.suppress(OSError):
            exercises.build(learner, src)
        monkeypatch.setattr(resultsfile, "write_bytes", real)
        assert exercises.foreign_notebooks(learner, course_names()[:3]) == [], fail_at


def test_two_builds_stopped_at_the_notebook_leave_it_known_as_builds(tmp_path, monkeypatch):
    """Each stopped build of a changed source names its new content; the notebook on disk still holds the content
    of the last whole build, which the manifest must keep knowing: the next build needs no --force."""
    from labkit.base import resultsfile
    from labkit.exercises import build as exercises
    name = course_names()[0]
    src, learner = _course_copy(tmp_path / "src", [name]), tmp_path / "learner"
    exercises.build(learner, src)
    whole = (learner / name).read_bytes()
    real = resultsfile.write_bytes

    def notebook_write_fails(path, *a, **k):
        if str(path).endswith(".ipynb"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *a, **k)

    for edition in (2, 3):  # the source changes between the builds, so each names a new content
        nb = json.loads((src / name).read_text())
        nb["cells"][0]["source"] = f"# edition {edition}\n" + "".join(nb["cells"][0]["source"])
        (src / name).write_text(json.dumps(nb, indent=1) + "\n")
        monkeypatch.setattr(resultsfile, "write_bytes", notebook_write_fails)
        with pytest.raises(OSError):
            exercises.build(learner, src)
        monkeypatch.setattr(resultsfile, "write_bytes", real)
        assert (learner / name).read_bytes() == whole
        assert exercises.foreign_notebooks(learner, [name]) == [], edition
    exercises.build(learner, src)  # no --force needed
    assert b"# edition 3" in (learner / name).read_bytes()
