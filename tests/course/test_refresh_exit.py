"""scripts/refresh_notebooks.py killed with -9: its kernel's connection file is in the run's own folder, which the
next run removes (it was left in the temporary folder)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

sys.path.insert(0, str(ROOT / "scripts"))
import refresh_notebooks as refresh  # noqa: E402


@pytest.mark.slow
def test_a_killed_refresh_leaves_its_connection_file_only_in_its_own_folder(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(120)")])
    path = tmp_path / "sleeps.ipynb"
    nbformat.write(nb, path)
    env = dict(os.environ, TMPDIR=str(tmp), LABKIT_PROFILE="quick")
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "refresh_notebooks.py"), "--no-write", "--force",
                             str(path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp.rglob("kernel-*.json")) + list(tmp.rglob("tmp*.json")) and time.monotonic() < deadline:
            time.sleep(0.5)
        connection = (list(tmp.rglob("kernel-*.json")) + list(tmp.rglob("tmp*.json")))[0]
        time.sleep(2)  # the kernel is running its cell
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    kernels = [p for p in _processes() if str(connection) in p[1]]
    for pid, _ in kernels:  # the kernel's own temporary files (TensorFlow's autograph modules) go there too
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"TMPDIR={connection.parent}".encode() in environ
    for pid, _ in kernels:  # the kernel ends with its parent; make sure of it for the suite
        os.kill(pid, signal.SIGKILL)
    assert connection.parent != tmp and connection.parent.name.startswith(f"{refresh.OWN_PREFIX}{proc.pid}-")
    monkeypatch.setattr(refresh.tempfile, "tempdir", str(tmp))
    own = refresh.own_temp_folder()  # the next run's: it removes the killed run's folder
    assert sorted(tmp.iterdir()) == [own]


def _processes():
    for d in os.scandir("/proc"):
        if d.name.isdigit():
            try:
                with open(f"/proc/{d.name}/cmdline", "rb") as f:
                    yield int(d.name), f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass


def test_own_temp_folder_keeps_a_running_owners_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(refresh.tempfile, "tempdir", str(tmp_path))
    alive = tmp_path / f"{refresh.OWN_PREFIX}{os.getpid()}-abc"
    alive.mkdir()
    other = tmp_path / "labkit-refreshing"  # not one of ours
    other.mkdir()
    own = refresh.own_temp_folder()
    assert alive.is_dir() and other.is_dir() and own.name.startswith(f"{refresh.OWN_PREFIX}{os.getpid()}-")
