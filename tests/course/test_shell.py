"""The shell scripts: they pass shellcheck, survive bash 3.2's `set -u` with empty arrays (macOS's
/bin/bash), and the Slurm JupyterLab job closes its output file (it holds the token) to other users."""
import os
import re
import shutil
import stat
import subprocess
import time

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("hpc/*.sbatch"), ROOT / "binder/postBuild",
                  ROOT / "binder/start"])


def test_there_are_scripts_to_check():
    names = {p.name for p in SCRIPTS}
    assert {"lab.sh", "setup.sh", "build-horovod.sh", "system-deps.sh", "jupyter.sbatch"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_is_clean(script):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (scripts/system-deps.sh installs it: apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "--shell=bash", "--severity=warning", str(script)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# "${arr[@]}" of an empty array aborts under `set -u` in bash < 4.4 (macOS ships 3.2); ${arr[@]+"${arr[@]}"}
# does not. Any array expansion in our scripts must use the guarded form.
UNGUARDED = re.compile(r'(?<!\+)"\$\{(\w+)\[@\]\}"')


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_unguarded_array_expansion(script):
    bad = []
    for number, line in enumerate(script.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for match in UNGUARDED.finditer(line):
            if f'${{{match[1]}[@]+"${{{match[1]}[@]}}"}}' not in line:
                bad.append(f"{script.name}:{number}: {line.strip()}")
    assert not bad, "unguarded array expansion (aborts under set -u in bash 3.2):\n" + "\n".join(bad)


# bash >= 4 only: associative arrays, mapfile, case-changing expansions, |&, &>>, namerefs, [[ -v ]]
BASH4 = re.compile(r"declare -A|\bmapfile\b|\breadarray\b|\$\{\w+(,,|\^\^)|\|&|&>>|local -n|\bcoproc\b|\[\[ -v ")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_bash4_only_syntax(script):
    bad = [f"{script.name}:{n}: {line.strip()}" for n, line in enumerate(script.read_text().splitlines(), 1)
           if not line.lstrip().startswith("#") and BASH4.search(line)]
    assert not bad, "bash >= 4 only (macOS's /bin/bash is 3.2):\n" + "\n".join(bad)


def test_the_bash4_pattern_is_caught():
    for line in ['declare -A seen', 'mapfile -t lines < f', 'echo "${name,,}"', 'make |& tee log', 'x &>> log']:
        assert BASH4.search(line), line
    assert not BASH4.search('echo "${name:-x}" 2>&1 | tee log')


def test_the_unguarded_pattern_is_caught():
    # the checker above would find the form that breaks bash 3.2, and accept the guarded one
    assert UNGUARDED.search('exec x "${args[@]}"')
    line = 'exec x ${args[@]+"${args[@]}"}'
    assert all(f'${{{m[1]}[@]+"${{{m[1]}[@]}}"}}' in line for m in UNGUARDED.finditer(line))


def test_jupyter_job_output_is_readable_by_its_owner_only(tmp_path):
    out = tmp_path / "labkit-lab-1.out"
    out.write_text("")
    out.chmod(0o644)  # as Slurm creates it under a usual login umask
    env = dict(os.environ, LABKIT_VENV=str(tmp_path / "no-venv"))  # the job stops after closing its output
    with open(out, "a") as f:
        proc = subprocess.run(["bash", str(ROOT / "hpc/jupyter.sbatch")], stdout=f, stderr=f, env=env,
                              cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "no Python in" in out.read_text()


def _lock(tmp_path, venv):
    """`make lock VENV=venv` on a copy of the Makefile beside a committed constraints.txt."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    return subprocess.run(["make", "-s", "lock", f"VENV={venv}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("venv", ["missing-venv", "broken-venv"])
def test_make_lock_without_a_working_venv_keeps_constraints(tmp_path, venv):
    committed = "# Full lock\nnumpy==1.26.4\n"
    (tmp_path / "constraints.txt").write_text(committed)
    if venv == "broken-venv":  # a python that starts and fails, as a venv whose interpreter was removed does
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / "python").write_text("#!/bin/sh\necho 'No module named pip' >&2\nexit 1\n")
        (tmp_path / venv / "bin" / "python").chmod(0o755)
    done = _lock(tmp_path, venv)
    assert done.returncode != 0 and "constraints.txt left as it was" in done.stderr, done.stderr
    assert (tmp_path / "constraints.txt").read_text() == committed
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != venv) == ["Makefile", "constraints.txt"]


def test_make_lock_with_a_working_venv_writes_the_freeze(tmp_path):
    (tmp_path / "constraints.txt").write_text("old\n")
    (tmp_path / "constraints.txt").chmod(0o644)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text(
        "#!/bin/sh\nprintf 'numpy==1.26.4\\nlabkit==0.1\\nhorovod @ file:///w.whl\\ntensorflow==2.15.1\\n'\n")
    (tmp_path / "venv" / "bin" / "python").chmod(0o755)
    done = _lock(tmp_path, "venv")
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "constraints.txt").read_text().splitlines()
    assert lines[0].startswith("# Full lock") and lines[1:] == ["numpy==1.26.4", "tensorflow==2.15.1"]
    assert stat.S_IMODE((tmp_path / "constraints.txt").stat().st_mode) == 0o644


# scripts/build-horovod.sh with a stand-in Python: `pip wheel` writes a wheel (after `sleep` seconds), the rest
# answers what the script asks (TensorFlow's version, the Python tag) and records `pip install`
_FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *"import tensorflow"*) echo 2.15.1 ;;
  *"version_info"*) echo 311 ;;
  *"-m pip wheel"*)
    for last; do :; done
    head -c 300000 /dev/urandom > "$last/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    sleep "${FAKE_COMPILE_S:-0}" ;;
  *"-m pip install"*) echo "$*" >> "$(dirname "$0")/installed" ;;
  *) exit 0 ;;
esac
"""


@pytest.fixture
def horovod_build(tmp_path):
    """A copy of the script beside requirements.txt and constraints.txt, a stand-in Python and a private TMPDIR."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/build-horovod.sh", tmp_path / "scripts/build-horovod.sh")
    for name in ("requirements.txt", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "venv/bin").mkdir(parents=True)
    py = tmp_path / "venv/bin/python"
    py.write_text(_FAKE_PYTHON)
    py.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHON": str(py), "TMPDIR": str(tmp_path / "tmp"), "LABKIT_MPI": "system",
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return tmp_path, env


def _cached_wheels(root):
    return sorted(p.relative_to(root / ".cache/horovod").as_posix() for p in (root / ".cache/horovod").rglob("*")
                  if p.is_file())


def test_build_horovod_ctrl_c_removes_its_temp_folder(horovod_build):
    import signal
    root, env = horovod_build
    def as_a_terminal_starts_it():  # Ctrl-C delivered and not ignored, whatever this test process inherited: in
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # one run with three test processes the script never saw it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # and finished its 30 s build

    proc = subprocess.Popen(["bash", str(root / "scripts/build-horovod.sh")], env={**env, "FAKE_COMPILE_S": "30"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=as_a_terminal_starts_it)
    try:
        assert "building horovod" in proc.stdout.readline()
        deadline = time.time() + 30
        while not list((root / "tmp").rglob("*.whl")):  # compiling: its wheel is in the temp folder
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole process group
        proc.wait(timeout=30)
    out = proc.stdout.read()
    assert proc.returncode != 0 and list((root / "tmp").iterdir()) == [], out
    assert not (root / ".cache/horovod").exists() or _cached_wheels(root) == []


def test_build_horovod_an_interrupted_copy_never_leaves_a_wheel_the_next_run_trusts(horovod_build):
    """The wheel crosses from the temp folder (often another file system) to the cache: a copy that breaks off
    (stand-ins for cp and mv that write half and fail across folders) must leave no wheel under its real name."""
    root, env = horovod_build
    (root / "bin").mkdir()
    half = 'head -c 1000 "$1" > "$2"; exit 1'
    (root / "bin/cp").write_text(f"#!/bin/sh\n{half}\n")
    (root / "bin/mv").write_text('#!/bin/sh\n[ "$1" = -f ] && shift\n'  # a rename within one folder is atomic
                                 f'[ "$(dirname "$1")" = "$(dirname "$2")" ] && exec /bin/mv "$1" "$2"\n{half}\n')
    for tool in ("cp", "mv"):
        (root / "bin" / tool).chmod(0o755)
    done = subprocess.run(["bash", str(root / "scripts/build-horovod.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert not [w for w in _cached_wheels(root) if w.split("/")[-1].startswith("horovod-")]
    assert list((root / "tmp").iterdir()) == []


def test_build_horovod_caches_the_whole_wheel_and_installs_it(horovod_build):
    root, env = horovod_build
    done = subprocess.run(["bash", str(root / "scripts/build-horovod.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    wheels = _cached_wheels(root)
    assert len(wheels) == 1 and wheels[0].endswith("/horovod-0.28.1-cp311-cp311-linux_x86_64.whl")
    assert (root / ".cache/horovod" / wheels[0]).stat().st_size == 300000
    assert list((root / "tmp").iterdir()) == []
    assert "horovod-0.28.1" in (root / "venv/bin/installed").read_text()
