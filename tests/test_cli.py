import subprocess
import sys

import pytest

from labkit.cli import COMMANDS


def run(*args):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert name in proc.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help(name):
    proc = run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"labkit {name}" in proc.stdout  # the command's own parser answered, with its own options
    assert "--help" in proc.stdout


def test_unknown_command_is_an_error():
    proc = run("dcotor")
    assert proc.returncode == 2
    assert "unknown command 'dcotor'" in proc.stderr and "doctor" in proc.stderr
