"""A course installed once, read-only, for many learners (an HPC site's shared copy): run as an ordinary user, its
notebooks write nothing inside it, only under the learner's HOME (labkit.base.workdir's ~/labkit-work) and the
output folder they were asked to write. Run as root, the test makes an ordinary user for it (useradd).
Where this environment's interpreter lies under a folder other users cannot enter (a pyenv Python under /root, a
checkout under a private folder), the run goes through a private mount namespace (root and unshare): that folder
is covered by an empty one that others may enter, holding read-only views of the environment at the same paths;
the checkout itself is hidden there, so the learner's labkit is the shared copy's."""
import hashlib
import os
import pwd
import shlex
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


def _private_folder(path: Path) -> Path | None:
    """The outermost folder on path's way from / that other users cannot enter (no o+x), or None."""
    for folder in [*reversed(path.parents), path]:
        if folder.is_dir() and not folder.stat().st_mode & 0o001:
            return folder
    return None


def environment_views() -> list[tuple[Path, Path]]:
    """(private folder, path to show under it) for each part of this environment an ordinary user cannot reach:
    the venv and the Python it was made from."""
    needed = {Path(sys.prefix), Path(os.path.realpath(sys.base_prefix))}
    return sorted({(folder, path) for path in needed if (folder := _private_folder(path)) is not None})


def namespace_prelude(views: list[tuple[Path, Path]]) -> str:
    """Shell lines, run as root in a new mount namespace: each path in views kept aside (a bind mount), its
    private folder covered by an empty tmpfs others may enter, the path shown again there read-only."""
    lines = ["set -e", 'stash="$(mktemp -d)"']
    for i, (_, path) in enumerate(views):
        lines += [f'mkdir "$stash/{i}"', f'mount --bind {shlex.quote(str(path))} "$stash/{i}"']
    for folder in sorted({folder for folder, _ in views}):
        lines.append(f"mount -t tmpfs -o mode=755 labkit-view {shlex.quote(str(folder))}")
    for i, (_, path) in enumerate(views):
        p = shlex.quote(str(path))
        lines += [f"mkdir -p {p}", f'mount --bind "$stash/{i}" {p}', f"mount -o remount,bind,ro {p}"]
    for i in range(len(views)):  # the stash is no longer needed: nothing of it is left in the temporary folder
        lines += [f'umount "$stash/{i}"', f'rmdir "$stash/{i}"']
    return "\n".join(lines + ['rmdir "$stash"'])


def _runs_as(user: str, views, python: str) -> bool:
    cmd = [shutil.which("runuser"), "-u", user, "--", python, "-c", "pass"]
    if views:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               namespace_prelude(views) + "\nexec " + shlex.join(cmd)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


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
    python, views = sys.executable, []
    if os.geteuid() == 0:
        views = environment_views()
        if views and shutil.which("unshare") is None:
            pytest.skip(f"this environment ({sys.prefix}) lies in a folder ordinary users cannot enter, and showing "
                        "it to one needs unshare (util-linux), absent here")
        if not _runs_as(user, views, python):
            pytest.skip(f"this environment's Python ({python}) cannot be run by an ordinary user here"
                        + (" (a private folder on its path, and no mount namespace to show it in: unshare --mount "
                           "needs CAP_SYS_ADMIN)" if views else ""))
    elif not os.access(sys.prefix, os.R_OK | os.X_OK):
        pytest.skip(f"the environment in {sys.prefix} is not readable by this user")
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
    yield python, user, views, course, home, before
    subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def _run_as(python, user, views, course, home, notebook):
    """`jupyter nbconvert --execute` of one notebook of the course, as user, from the course's notebooks folder."""
    # at smoke scale: what a read-only course changes is where files go, not how long the runs are
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LABKIT_PROFILE": "quick",
           "LABKIT_SMOKE": "1", "PYTHONPATH": os.pathsep.join([str(course), str(course / "scripts")]),
           "LANG": "C.UTF-8", "TMPDIR": str(home / "tmp")}
    # the kernel manager of the course's own runs (scripts/kernel_client.py): a reply's lost wake-up costs 1 s, not
    # the cell's whole timeout
    cmd = [python, "-m", "nbconvert", "--execute", "--to", "notebook",
           "--output-dir", str(home / "out"), "--ExecutePreprocessor.kernel_name=python3",
           "--ExecutePreprocessor.kernel_manager_class=kernel_client.SlicedWaitKernelManager",
           "--ExecutePreprocessor.timeout=600", str(course / "notebooks" / f"{notebook}.ipynb")]
    (home / "tmp").mkdir(exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(home / "tmp", user, user)
        cmd = [shutil.which("runuser"), "-u", user, "--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
               *cmd]
        if views:
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   namespace_prelude(views) + f"\ncd {shlex.quote(str(course / 'notebooks'))}\nexec " + shlex.join(cmd)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=course / "notebooks", timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", [n for n in os.environ.get("LABKIT_READONLY_NOTEBOOKS", "").split(",") if n]
                         and [next(p.stem for p in (ROOT / "notebooks").glob(f"{n}_*.ipynb"))
                              for n in os.environ["LABKIT_READONLY_NOTEBOOKS"].split(",")] or QUICK)
def test_a_notebook_from_a_read_only_course_writes_only_under_home(shared_course, notebook):
    python, user, views, course, home, before = shared_course
    proc = _run_as(python, user, views, course, home, notebook)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (home / "out" / f"{notebook}.ipynb").is_file()
    assert _snapshot(course) == before, "the read-only course changed"
    if notebook.startswith("04"):
        assert (home / "labkit-work" / "my_keras_hvd.py").is_file()


def test_the_namespace_shows_a_private_environment_read_only():
    """The views' shell lines on a planted private folder: an ordinary user reads the file through it, cannot
    write it, and sees nothing else of the folder."""
    user = _learner()
    if os.geteuid() != 0 or user is None or shutil.which("unshare") is None:
        pytest.skip("needs root, runuser and unshare (it plants a private folder and shows it to another user)")
    base = Path(tempfile.mkdtemp(prefix="labkit-view-"))  # pytest's tmp_path lies in a folder only root enters
    try:
        _show_a_planted_folder(base, user)
    finally:
        shutil.rmtree(base)


def _show_a_planted_folder(tmp_path, user):
    private = tmp_path / "private"
    (private / "env/bin").mkdir(parents=True)
    (private / "secret").write_text("not for learners")
    (private / "env/bin/tool").write_text("shown\n")
    tmp_path.chmod(0o755)
    private.chmod(0o700)
    views = [(private, private / "env")]
    script = (namespace_prelude(views) + "\nexec " + shlex.join([shutil.which("runuser"), "-u", user, "--", "sh", "-c",
              f"cat {private}/env/bin/tool; ls {private}; touch {private}/env/x 2>/dev/null && echo wrote"]))
    stash = tmp_path / "tmp"  # the prelude's mktemp -d: empty again once the views stand
    stash.mkdir()
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(stash)))
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    assert proc.stdout.split() == ["shown", "env"], proc.stdout + proc.stderr
    assert list(stash.iterdir()) == [], "the namespace's stash was left in the temporary folder"
    assert _private_folder(private / "env") == private and _private_folder(tmp_path) is None
