"""Is numpy's BLAS running a generic kernel on a CPU that has better? One line when it is (02_im2col).

OpenBLAS picks its kernel for the CPU it finds, unless OPENBLAS_CORETYPE pins one: a machine that pins an old
one (Prescott, Core2: SSE3-era kernels, no AVX) on an AVX2 or AVX-512 CPU multiplies matrices several times
slower than it could, so every numpy figure it prints understates the CPU. threadpoolctl names the kernel in
use ('architecture'); /proc/cpuinfo names what the CPU can do.
"""
from __future__ import annotations

import os

# OpenBLAS kernels that use neither AVX2 nor AVX-512 (its names as threadpoolctl reports them, lowercased):
# the x86-64 generic/SSE-era targets. Sandybridge (AVX1) is left out: it is what an AVX-only CPU should run.
GENERIC_KERNELS = frozenset({"prescott", "core2", "katmai", "coppermine", "northwood", "banias", "atom",
                             "penryn", "dunnington", "nehalem", "opteron", "opteron_sse3", "barcelona",
                             "athlon", "generic"})
WIDE_FLAGS = ("avx512f", "avx2")  # what the CPU offers beyond those kernels, best first


def generic_blas_line(info: list | None = None, flags: set | None = None, env: dict | None = None) -> str | None:
    """One line when an OpenBLAS library runs a generic kernel on a CPU with AVX2/AVX-512, naming
    OPENBLAS_CORETYPE when set; None otherwise. info: threadpoolctl's BLAS entries (machine.blas_info()),
    flags: the CPU's (machine.cpu_flags()), env: the environment; each read from this machine when None.
    (02_im2col)"""
    from labkit.base import machine

    info = machine.blas_info() if info is None else info
    flags = machine.cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    wide = next((f for f in WIDE_FLAGS if f in flags), None)
    if wide is None:
        return None
    for lib in info:
        kernel = str(lib.get("architecture") or "")
        if lib.get("internal_api") == "openblas" and kernel.lower() in GENERIC_KERNELS:
            isa = "AVX-512" if wide == "avx512f" else "AVX2"
            pinned = env.get("OPENBLAS_CORETYPE")
            why = f"OPENBLAS_CORETYPE={pinned} is set" if pinned else "OpenBLAS chose it"
            return (f"numpy's BLAS (OpenBLAS {lib.get('version') or '?'}) runs its generic {kernel} kernel on an "
                    f"{isa} CPU ({why}): numpy's matrix products here are slower than this CPU can do")
    return None


def say_if_generic() -> None:
    """Print generic_blas_line() when there is one: numpy's timings that follow understate this CPU. (02_im2col)"""
    line = generic_blas_line()
    if line:
        print(line)
