import os
import subprocess
import sys
import types

import pytest

from labkit import cli
from labkit.cli import COMMANDS


def run(*args):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert name in proc.stdout


# an option only that command's own parser knows: its real --help answered, not the router's
OWN_OPTIONS = {"conv-bench": ("--json",), "flops": ("--input-size",), "sweep": ("--workers", "--resume"),
               "scale": ("--hosts",), "exercises": ("build",)}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help(name):
    proc = run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"labkit {name}" in proc.stdout  # the command's own parser answered, with its own options
    assert all(option in proc.stdout for option in ("--help", *OWN_OPTIONS.get(name, ())))


def test_unknown_command_is_an_error():
    proc = run("dcotor")
    assert proc.returncode == 2
    assert "unknown command 'dcotor'" in proc.stderr and "doctor" in proc.stderr


# A command's --help answers without importing TensorFlow (a login node, a laptop without the venv warm):
# the module behind each command imports TF lazily, inside the functions that need it.
HELP_PROBE = """
import contextlib, io, sys
from labkit.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print("tensorflow" in sys.modules)
"""


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in COMMANDS], ids=" ".join)
def test_help_does_not_import_tensorflow(argv):
    proc = subprocess.run([sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False", f"`labkit {' '.join(argv)}` imported tensorflow"


@pytest.mark.parametrize("argv", [["data", "where"], ["conv-bench"], ["sweep"], ["scale"], ["flops"]])
def test_bad_profile_is_one_line_before_the_command_runs(argv):
    env = dict(os.environ, LABKIT_PROFILE="bogus")
    proc = subprocess.run([sys.executable, "-m", "labkit", *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "LABKIT_PROFILE" in proc.stderr and "'bogus'" in proc.stderr and "quick, workshop, full" in proc.stderr
    assert proc.stdout == ""  # nothing ran


@pytest.fixture
def fake_command(monkeypatch):
    """`labkit boom` routed to a module whose cli_main raises what it is given."""
    module = types.ModuleType("labkit_fake_boom")
    monkeypatch.setitem(sys.modules, "labkit_fake_boom", module)
    monkeypatch.setitem(cli.COMMANDS, "boom", ("labkit_fake_boom", "raise"))
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    monkeypatch.delenv("LABKIT_DEBUG", raising=False)
    return module


@pytest.mark.parametrize("exc", [ValueError("--timeout must be a positive number of seconds; got nan"),
                                 OSError(13, "Permission denied: --json /ro/x.json")])
def test_bad_input_from_a_command_is_one_line_exit_2(fake_command, exc, capsys):
    def cli_main(argv):
        raise exc

    fake_command.cli_main = cli_main
    assert cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("labkit boom: ") and "Traceback" not in err
    assert str(exc.args[-1]).split(":")[0] in err and "LABKIT_DEBUG=1" in err


def test_labkit_debug_shows_the_traceback(fake_command, monkeypatch):
    def cli_main(argv):
        raise ValueError("--np must be positive")

    fake_command.cli_main = cli_main
    monkeypatch.setenv("LABKIT_DEBUG", "1")
    with pytest.raises(ValueError, match="--np"):
        cli.main(["boom"])


def test_a_reader_that_goes_away_is_not_an_error():
    """`labkit plan | head -1`: the pipe's reader closed before labkit wrote; quiet, as any Unix tool."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before labkit writes a line
    proc = subprocess.run([sys.executable, "-m", "labkit", "plan"], stdout=w, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    os.close(w)
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


@pytest.mark.parametrize("variable, value", [("LABKIT_MEMORY", "abc"), ("LABKIT_MEMORY", "512k"),
                                             ("LABKIT_CORES", "100000"), ("LABKIT_GPUS", "-1")])
def test_a_bad_setting_is_refused_before_any_command_runs(fake_command, monkeypatch, capsys, variable, value):
    """A command that never reads the setting (labkit sweep and LABKIT_MEMORY, once) still refuses it, in one line."""
    ran = []
    fake_command.cli_main = ran.append
    for name in ("LABKIT_CORES", "LABKIT_MEMORY", "LABKIT_GPUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    assert cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert ran == [] and err.count("\n") == 1 and err.startswith(f"labkit boom: {variable} must be ")
    assert f"got {value!r}" in err and "LABKIT_DEBUG" not in err
