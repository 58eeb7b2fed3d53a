"""scripts/setup.sh on a machine where Horovod cannot be built (no C++ compiler): everything else is installed, the
kernel registered, one line says why and where the log is, the stamp does not claim Horovod, and `make lab` is not
held up by a retry at every start. pip is faked (a venv whose python records installs), so this takes seconds."""
import os
import sys
from pathlib import Path

import pytest
from test_setup import run_setup  # noqa: E402  (tests/course/ is on sys.path, as helpers is)

COMPILERS = {"c++", "g++", "clang++", "cc", "gcc", "clang"}


def _venv(tmp_path):
    """A venv whose python runs real Python, except that TensorFlow 'is installed' and pip/ipykernel are recorded."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin/python"
    exe.write_text(f"""#!/bin/sh
case "$*" in
  *"import tensorflow"*) echo 2.15.1 ;;
  "-m pip install"*|"-m pip uninstall"*|"-m ipykernel"*|"-m pip check"*) echo "$*" >> {log} ;;
  "-m pip show"*) exit 1 ;;
  "-m pip wheel"*) echo "error: the compiler failed" >&2; exit 1 ;;  # never a real build here
  *) exec {sys.executable} "$@" ;;
esac
""")
    exe.chmod(0o755)
    return venv, log


def _path_without_compilers(tmp_path):
    """A PATH with this machine's tools but no C++ compiler, MPI wrapper or GPU: a laptop missing the build tools."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for f in Path("/usr/bin").iterdir():
        if f.name not in COMPILERS and not f.name.startswith(("mpi", "nvidia", "x86_64-linux-gnu-", "aarch64-")):
            (tools / f.name).symlink_to(f)
    return str(tools)


@pytest.fixture
def failed_setup(repo_root, tmp_path):
    venv, log = _venv(tmp_path)
    env = {"LABKIT_VENV": str(venv), "PATH": _path_without_compilers(tmp_path), "LABKIT_MPI": "auto"}
    return venv, log, env, run_setup(repo_root, env)


def test_setup_finishes_without_horovod_and_says_why_in_one_line(failed_setup):
    venv, log, _, proc = failed_setup
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (f"setup: Horovod could not be built (no C++ compiler): the scaling notebooks 04 and 07 will show "
                    f"the course's recorded measurements; build log: {venv}/horovod-build.log; fix: apt-get install "
                    f"g++ (Debian/Ubuntu), xcode-select --install (macOS) or module load gcc (HPC), then make setup")
    assert "no C++ compiler" in (venv / "horovod-build.log").read_text()
    calls = log.read_text()
    assert "-m pip install --quiet -r" in calls  # the pinned stack
    assert "-m pip install --quiet --no-deps --no-build-isolation -e ." in calls  # labkit itself
    assert "-m ipykernel install --sys-prefix --name labkit" in calls  # the kernel the notebooks ask for
    assert "-m pip check" in calls
    assert " horovod-missing " in (venv / ".labkit-stamp").read_text()  # not the plain inputs: Horovod was not built


def test_a_rerun_does_not_retry_until_asked_or_the_compilers_change(repo_root, failed_setup, tmp_path):
    venv, log, env, _ = failed_setup
    before = log.read_text()
    proc = run_setup(repo_root, env)
    assert proc.returncode == 0 and "without Horovod, which could not be built" in proc.stdout
    assert log.read_text() == before  # nothing installed: `make lab` opens at once
    (venv / "horovod-build.log").unlink()
    proc = run_setup(repo_root, {**env, "LABKIT_HOROVOD_RETRY": "1"})
    assert proc.returncode == 0 and "Horovod could not be built (no C++ compiler)" in proc.stdout
    assert (venv / "horovod-build.log").is_file()  # the build was tried again
    retried = log.read_text()[len(before):]
    assert "-r" not in retried.split() and "-e ." in retried  # only Horovod's build, not the pinned stack again
    compiler = Path(env["PATH"]) / "g++"  # a compiler appears on PATH: the next setup tries again by itself
    compiler.write_text("#!/bin/sh\nexit 1\n")
    compiler.chmod(0o755)
    proc = run_setup(repo_root, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Horovod could not be built (build failed): " in proc.stdout  # the compile itself failed this time
    assert "error: the compiler failed" in (venv / "horovod-build.log").read_text()


def test_a_left_over_horovod_is_removed_when_its_rebuild_fails(repo_root, tmp_path):
    venv, log = _venv(tmp_path)
    exe = venv / "bin/python"
    exe.write_text(exe.read_text().replace('"-m pip show"*) exit 1', '"-m pip show"*) exit 0'))
    proc = run_setup(repo_root, {"LABKIT_VENV": str(venv), "PATH": _path_without_compilers(tmp_path)})
    assert proc.returncode == 0
    assert "-m pip uninstall --quiet -y horovod" in log.read_text()
    assert os.path.isfile(venv / "horovod-build.log")
