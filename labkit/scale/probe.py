"""The machine's own parallel limit: N single-thread GEMM processes running at once (04_horovod_scaling).

Data-parallel workers that each own one core can at best scale as well as the cores themselves do when
they all compute at once: they share caches, memory bandwidth and the chip's power budget (a laptop's clock
drops when more cores are busy). `gemm_probe(n)` measures exactly that ceiling with no framework and no
communication at all: n processes, one thread each, multiply float32 matrices for the same wall-clock
window and report their GFLOP/s. `gemm_probe(2)["efficiency"]` is the best efficiency two training workers
on this machine could reach.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from labkit.base.checks import check_int, check_number

# One child: pinned to one BLAS thread by its environment, waits for the shared start time, multiplies
# n x n float32 matrices until the window closes, prints its GFLOP/s as JSON.
_CHILD = r"""
import json, sys, time
import numpy as np
n, start, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rng = np.random.default_rng(0)
a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
a @ b  # load the BLAS, touch the pages
while time.time() < start:
    time.sleep(0.001)
count, t0 = 0, time.perf_counter()
while time.time() < start + seconds:
    a @ b
    count += 1
dt = time.perf_counter() - t0
print(json.dumps({"gflops": 2 * n ** 3 * count / dt / 1e9, "matmuls": count, "seconds": dt}))
"""

WINDOW_S, SMOKE_WINDOW_S = 2.0, 0.25  # seconds each probe computes; at smoke scale a size like the others


def window_s() -> float:
    """The probe's window in this profile: WINDOW_S, SMOKE_WINDOW_S at smoke scale. (04_horovod_scaling)"""
    from labkit.base import config
    return config.by_profile(quick=WINDOW_S, workshop=WINDOW_S, full=WINDOW_S, smoke=SMOKE_WINDOW_S)


_ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                 "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}


def gemm_rates(processes: int, seconds: float = WINDOW_S, n: int = 384, timeout: float = 120) -> list[float]:
    """GFLOP/s of each of `processes` single-thread GEMM processes computing in the same time window."""
    check_int(processes, "processes", minimum=1)
    check_number(seconds, "seconds", above=0, maximum=60)
    check_int(n, "n", minimum=16)  # the matrix side
    from labkit.scale.launch import child_env
    env = child_env(_ONE_THREAD)
    start = time.time() + 1.0 + 0.2 * processes  # every child is started and warm before the window opens
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(n), repr(start), repr(float(seconds))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(processes)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:  # interrupted or timed out: no child outlives the probe
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(p.returncode, err) for p, (_, err) in zip(procs, outs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"a GEMM probe process failed (exit {bad[0][0]}): "
                           f"{(bad[0][1].strip().splitlines() or ['?'])[-1]}")
    return [json.loads(out.strip().splitlines()[-1])["gflops"] for out, _ in outs]


def gemm_probe(processes: int, seconds: float = WINDOW_S, n: int = 384, base: float | None = None) -> dict:
    """Total GFLOP/s of `processes` single-thread GEMM processes at once, with speedup and efficiency
    against `base` (one process's GFLOP/s; measured now when None)."""
    rates = gemm_rates(processes, seconds, n)
    if base is None:
        base = rates[0] if processes == 1 else gemm_rates(1, seconds, n)[0]
    total = float(sum(rates))
    return {"processes": processes, "gflops_total": total, "gflops_each": [float(r) for r in rates],
            "speedup": total / base, "efficiency": total / base / processes}
