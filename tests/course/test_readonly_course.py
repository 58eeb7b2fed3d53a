"""A course installed once, read-only, for many learners (an HPC site's shared copy): run as an ordinary user, its
notebooks write nothing inside it, only under the learner's HOME (labkit.base.workdir's ~/labkit-work) and the
output folder they were asked to write. Run as root, the test makes an ordinary user for it (useradd).
LABKIT_LEARNER_PYTHON names a copy of this environment's interpreter where its own lies in a private folder; the
environment's packages then come through PYTHONPATH."""
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT  # noqa: E402

USER = "labkit-learner"
QUICK = ["00_welcome", "01_cnn_basics"]  # in the suite; 04 and 05 by hand: LABKIT_READONLY_NOTEBOOKS=00,01,04,05


def _learner() -> str | None:
    """The ordinary user to run as: this one when not root, else USER (created once); None where impossible."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        return None
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", USER], check=True, capture_output=True)
    return USER


def _snapshot(root: Path) -> dict:
    """Every path under root with its mode and, for files, a hash of its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = (st.st_mode, digest)
    return out


@pytest.fixture(scope="module")
def shared_course():
    """A read-only copy of the course's tracked files (write bits removed), and a HOME of the learner's own."""
    user = _learner()
    if user is None:
        pytest.skip("runs as an ordinary user: as root it needs runuser and useradd (util-linux, passwd), absent here")
    if not os.access(sys.prefix, os.R_OK | os.X_OK) or not os.access(Path(sys.prefix).parent, os.X_OK):
        pytest.skip(f"the environment in {sys.prefix} is not readable by other users")
    python = os.environ.get("LABKIT_LEARNER_PYTHON") or sys.executable  # a copy of it where this one is private
    if os.geteuid() == 0 and subprocess.run([shutil.which("runuser"), "-u", user, "--", python, "-c", "pass"],
                                            capture_output=True).returncode != 0:
        pytest.skip(f"this environment's Python ({python}) cannot be run by an ordinary user here (a private "
                    "folder on its path); a shared course installs it where learners can read it")
    base = Path(tempfile.mkdtemp(prefix="labkit-shared-"))
    base.chmod(0o755)
    course, home = base / "course", base / "home"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, course / name)
    home.mkdir()
    if os.geteuid() == 0:
        shutil.chown(home, user, user)
    subprocess.run(["chmod", "-R", "a-w", str(course)], check=True)
    before = _snapshot(course)
    yield python, user, course, home, before
    subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def _run_as(python, user, course, home, notebook):
    """`jupyter nbconvert --execute` of one notebook of the course, as user, from the course's notebooks folder."""
    import site
    paths = [str(course)] + ([] if python == sys.executable else site.getsitepackages())  # the environment's packages
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LABKIT_PROFILE": "quick",
           "PYTHONPATH": os.pathsep.join(paths), "LANG": "C.UTF-8"}
    cmd = [python, "-m", "nbconvert", "--execute", "--to", "notebook",
           "--output-dir", str(home / "out"), "--ExecutePreprocessor.kernel_name=python3",
           "--ExecutePreprocessor.timeout=600", str(course / "notebooks" / f"{notebook}.ipynb")]
    if os.geteuid() == 0:
        cmd = [shutil.which("runuser"), "-u", user, "--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
               *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=course / "notebooks", timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", [n for n in os.environ.get("LABKIT_READONLY_NOTEBOOKS", "").split(",") if n]
                         and [next(p.stem for p in (ROOT / "notebooks").glob(f"{n}_*.ipynb"))
                              for n in os.environ["LABKIT_READONLY_NOTEBOOKS"].split(",")] or QUICK)
def test_a_notebook_from_a_read_only_course_writes_only_under_home(shared_course, notebook):
    python, user, course, home, before = shared_course
    proc = _run_as(python, user, course, home, notebook)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (home / "out" / f"{notebook}.ipynb").is_file()
    assert _snapshot(course) == before, "the read-only course changed"
    if notebook.startswith("04"):
        assert (home / "labkit-work" / "my_keras_hvd.py").is_file()
