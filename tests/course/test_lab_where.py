"""scripts/lab.sh --where: the folder JupyterLab would serve, without starting it. A writable course serves itself;
a course on a read-only file system (a real read-only bind mount, as an HPC site's shared copy) serves the
learner's ~/labkit-work, with the notebooks copied there once and the learner's own copies kept."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT  # noqa: E402


def _lab(course: Path, home: Path, cwd: Path, *args):
    env = {**os.environ, "HOME": str(home), "LABKIT_VENV": sys.prefix, "PYTHONPATH": str(course)}
    env.pop("LABKIT_WORKDIR", None)
    return subprocess.run(["bash", str(course / "scripts" / "lab.sh"), "--where", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


def test_where_on_a_writable_course_is_the_course(tmp_path):
    done = _lab(ROOT, tmp_path, ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{ROOT}\n" and done.stderr == ""
    assert not (tmp_path / "labkit-work").exists()


@pytest.fixture
def read_only_course(tmp_path):
    """The course's scripts/, labkit/ and notebooks/ (tracked files) under tmp_path, mounted read-only."""
    src, course = tmp_path / "src", tmp_path / "course"
    files = subprocess.run(["git", "ls-files", "-z", "scripts", "labkit", "notebooks"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    course.mkdir()
    mount = shutil.which("mount")
    if mount is None or subprocess.run([mount, "--bind", str(src), str(course)], capture_output=True).returncode:
        pytest.skip("needs a read-only bind mount (root with mount; root ignores chmod's write bits)")
    try:
        subprocess.run([mount, "-o", "remount,ro,bind", str(course)], check=True, capture_output=True)
        assert not os.access(course / "notebooks", os.W_OK)
        yield course
    finally:
        subprocess.run(["umount", str(course)], check=False)


def test_where_on_a_read_only_course_copies_the_notebooks_home(read_only_course, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    done = _lab(read_only_course, home, read_only_course / "notebooks")
    mine = home / "labkit-work"
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{mine}\n"
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lab: ") and "~/labkit-work/notebooks" in lines[0], lines
    course_nbs = sorted(p.name for p in (read_only_course / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (mine / "notebooks").glob("*.ipynb")) == course_nbs
    assert (mine / "notebooks" / "results" / "reference.json").is_file()
    edited = mine / "notebooks" / course_nbs[1]
    edited.write_text("my answers\n")
    again = _lab(read_only_course, home, read_only_course / "notebooks")
    assert again.returncode == 0 and again.stdout == done.stdout
    assert edited.read_text() == "my answers\n", "a learner's notebook was overwritten"
