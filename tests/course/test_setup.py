"""scripts/setup.sh: refuses an unsupported Python before touching anything; a re-run with the same pins is a no-op."""
import os
import stat
import subprocess
import sys

import pytest


def fake_python(tmp_path, version):
    exe = tmp_path / f"python{version}"
    major, minor = version.split(".")
    # answers the version probe like a real interpreter would, and fails loudly if asked to do anything else
    exe.write_text(f'#!/bin/sh\ncase "$*" in *version_info*) echo "{major}.{minor}";; *) echo RAN >&2; exit 9;; esac\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def run_setup(repo_root, env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run(["bash", str(repo_root / "scripts/setup.sh")], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("version", ["3.12", "3.8", "2.7"])
def test_unsupported_python_is_refused_before_installing(repo_root, tmp_path, version):
    venv = tmp_path / "venv"
    proc = run_setup(repo_root, {"LABKIT_PYTHON": str(fake_python(tmp_path, version)), "LABKIT_VENV": str(venv)})
    assert proc.returncode == 2
    assert f"Python {version}" in proc.stderr and "not supported" in proc.stderr
    assert "3.9-3.11" in proc.stderr and "LABKIT_PYTHON=python3.11" in proc.stderr  # the reason and the fix
    assert "RAN" not in proc.stderr
    assert not venv.exists()


def test_missing_interpreter_names_the_fix(repo_root, tmp_path):
    venv = tmp_path / "venv"
    proc = run_setup(repo_root, {"LABKIT_PYTHON": "python3.11-does-not-exist", "LABKIT_VENV": str(venv)})
    assert proc.returncode == 2
    assert "no interpreter 'python3.11-does-not-exist'" in proc.stderr and "LABKIT_PYTHON" in proc.stderr
    assert not venv.exists()


def test_rerun_is_a_no_op_when_pins_are_unchanged(repo_root):
    venv = repo_root / ".venv"
    if not (venv / ".labkit-stamp").exists() or sys.prefix != str(venv):
        pytest.skip("runs only inside the .venv that scripts/setup.sh built")
    if run_setup(repo_root, {"LABKIT_SETUP_CHECK": "1"}).returncode == 3:
        # never reinstall into the environment running the tests (others may be using it)
        pytest.skip("the pins changed since .venv was built: run `make setup` first")
    proc = run_setup(repo_root, {})
    assert proc.returncode == 0, proc.stderr
    assert "environment up to date" in proc.stdout


def _recording_venv(tmp_path):
    """A venv whose python runs real Python for probes but records `pip install` instead of installing."""
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin/python"
    exe.write_text(f"""#!/bin/sh
case "$*" in
  *"import tensorflow"*) exit 1 ;;   # stops scripts/build-horovod.sh: this test ends at the install step
  "-m pip install"*)
    echo "pip install $*" >> {log}
    prev=""; for a in "$@"; do [ "$prev" = "-r" ] && cat "$a" >> {log}; prev="$a"; done
    exit 0 ;;
  "-m pip"*|"-m ipykernel"*) exit 0 ;;
  *) exec {sys.executable} "$@" ;;
esac
""")
    exe.chmod(0o755)
    return venv, log


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "nvidia"])
def test_tensorflow_wheel_follows_the_host(repo_root, tmp_path, gpu):
    venv, log = _recording_venv(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    env = {"LABKIT_VENV": str(venv), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = run_setup(repo_root, env)
    assert proc.returncode != 0 and "TensorFlow is not importable" in proc.stderr  # stopped where intended
    installed = log.read_text()
    lines = [line.split("#")[0].strip() for line in installed.splitlines()]
    if gpu:
        assert "tensorflow[and-cuda]==2.15.1" in lines
        assert not any(line.startswith("tensorflow-cpu") for line in lines)
    else:
        assert any(line.startswith("tensorflow-cpu==2.15.1;") for line in lines)
        assert not any(line.startswith("tensorflow[and-cuda]") for line in lines)
    assert any(line.startswith("tensorflow==2.15.1;") for line in lines)  # macOS / ARM line kept, marker-guarded
    assert "-c constraints.txt" in installed
