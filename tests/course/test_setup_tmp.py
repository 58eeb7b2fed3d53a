"""scripts/setup.sh leaves nothing in the temporary folder: ipykernel install leaves an empty tmp*_kernels folder
there at every run (ipykernel removes only the kernel spec inside it). pip and ipykernel are faked, as in
test_setup_horovod_fails, so this takes seconds."""
import sys

from test_setup import run_setup  # noqa: E402  (tests/course/ is on sys.path, as helpers is)
from test_setup_horovod_fails import _path_without_compilers  # noqa: E402


def test_setup_leaves_nothing_in_the_temporary_folder(repo_root, tmp_path):
    venv, tmp = tmp_path / "venv", tmp_path / "tmp"
    (venv / "bin").mkdir(parents=True)
    tmp.mkdir()
    exe = venv / "bin/python"
    exe.write_text(f"""#!/bin/sh
case "$*" in
  *"import tensorflow"*) echo 2.15.1 ;;
  "-m ipykernel install"*) mkdir "${{TMPDIR:-/tmp}}/tmpfake_kernels" ;;  # as ipykernel leaves it
  "-m pip install"*|"-m pip uninstall"*|"-m pip check"*) ;;
  "-m pip show"*) exit 1 ;;
  "-m pip wheel"*) exit 1 ;;
  *) exec {sys.executable} "$@" ;;
esac
""")
    exe.chmod(0o755)
    env = {"LABKIT_VENV": str(venv), "PATH": _path_without_compilers(tmp_path), "LABKIT_MPI": "auto",
           "TMPDIR": str(tmp)}
    proc = run_setup(repo_root, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp.iterdir()) == []
