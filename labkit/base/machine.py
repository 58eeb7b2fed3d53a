"""The one home of machine facts: usable cores, thread limits, numpy's BLAS, TensorFlow's oneDNN switch.

    from labkit.base import machine
    machine.cores()              # CPU cores this process may use (affinity mask and cgroup quota; LABKIT_CORES)
    machine.memory()             # bytes of memory it may use (RAM, cgroup limit; LABKIT_MEMORY such as 16G)
    machine.gpus()               # NVIDIA GPUs it may use, counted without TensorFlow (LABKIT_GPUS)
    machine.limit_threads(2)     # BLAS/OpenMP pools and TensorFlow's pools, before TF's first op
    print(machine.describe())    # CPU, cores, BLAS and its kernel, TensorFlow version, oneDNN on/off

Nothing here imports TensorFlow at import time; only limit_threads(tensorflow=True) and
tf_onednn_enabled() load it, when called. (00_welcome)
"""
from __future__ import annotations

import math
import os
import platform
import sys
from pathlib import Path

from labkit.base.checks import check_int

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_CGROUP_ROOT = Path("/sys/fs/cgroup")


# ----------------------------------------------------------------------------------------------------
# Cores


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cgroup_cpu_limit(root: Path | str = _CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores (e.g. 1.5), or None when there is no quota.

    cgroup v2: cpu.max holds "quota period" or "max period"; cgroup v1: cpu.cfs_quota_us (-1 = none) and
    cpu.cfs_period_us. A container started with --cpus=2 on a 64-core host has affinity 64 but quota 2."""
    root = Path(root)
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


CORES_ENV, MEMORY_ENV, GPUS_ENV = "LABKIT_CORES", "LABKIT_MEMORY", "LABKIT_GPUS"
MAX_CORES, MAX_GPUS, MIN_MEMORY = 4096, 1024, 256 * 2**20  # the bounds of the three settings


def setting(name: str) -> int | None:
    """LABKIT_CORES (1..4096), LABKIT_GPUS (0..1024) or LABKIT_MEMORY (bytes, 256M or more) as a whole number,
    None where unset or empty; one ValueError line naming the variable and what it takes otherwise. The one
    reader of the three. (00_welcome)"""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if name == MEMORY_ENV:
        return parse_size(text, name, minimum=MIN_MEMORY)
    bounds = {CORES_ENV: (1, MAX_CORES, "cores", 8), GPUS_ENV: (0, MAX_GPUS, "GPUs", 4)}
    if name not in bounds:
        raise ValueError(f"name must be {CORES_ENV}, {MEMORY_ENV} or {GPUS_ENV}; got {name!r}")
    low, high, unit, example = bounds[name]
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise ValueError(f"{name} must be a whole number of {unit} from {low} to {high}, such as {example}; "
                         f"got {text!r}")
    return int(text)


def cores() -> int:
    """CPU cores this process may use: its affinity mask, capped by its cgroup's CPU quota (rounded up), or
    LABKIT_CORES where set (fewer, to be polite on a shared node; or more, to ask what labkit would plan there).
    (00_welcome)"""
    override = setting(CORES_ENV)
    return _usable_cores() if override is None else override


_cores = cores  # for default_threads, whose `cores` argument hides the function


def count_text(n: int, noun: str, plural: str | None = None) -> str:
    """n and the noun, singular for one: '1 usable core', '2 usable cores' (plural where adding s is wrong:
    '2 processes'). (00_welcome)"""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver runs (Linux)


def gpus(driver_dir: Path | str = _NVIDIA_GPUS) -> int:
    """NVIDIA GPUs this process may use, counted without loading TensorFlow: LABKIT_GPUS where set (to ask what
    labkit would do on a GPU node); else CUDA_VISIBLE_DEVICES' entries up to the first invalid one, as CUDA
    reads it; else the driver's count; 0 without a driver (macOS, a CPU node). Whether TensorFlow can use them
    (its CUDA build) is `labkit doctor`'s to say."""
    override = setting(GPUS_ENV)
    if override is not None:
        return override
    driver = Path(driver_dir)
    present = len(list(driver.iterdir())) if driver.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not present:
        return present
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break  # CUDA stops at the first entry it cannot read ("-1" hides every GPU)
        count += 1
    return min(count, present)


def physical_cores() -> int:
    """Usable cores that are whole cores, not hyperthreads: what hwloc (mpirun --bind-to core) can bind to."""
    import psutil
    return min(cores(), psutil.cpu_count(logical=False) or cores())


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_size(text: str, name: str = MEMORY_ENV, minimum: int = 2**20) -> int:
    """Bytes from a size such as '16G', '2GiB', '512M' or '1073741824' (K/M/G/T are powers of 1024, as
    docker and Slurm read them), `minimum` bytes at least; one ValueError line naming `name` otherwise."""
    import re
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < minimum:
        raise ValueError(f"{name} must be a size of {_size_text(minimum)} or more, such as 16G, 2GiB or 512M "
                         f"(K, M, G, T: powers of 1024); got {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def _size_text(n: int) -> str:
    for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


def cgroup_memory_limit(root: Path | str = _CGROUP_ROOT) -> int | None:
    """The memory limit of this process's cgroup in bytes (v2 memory.max, v1 memory.limit_in_bytes), None if none."""
    root = Path(root)
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 says "no limit" with a huge number
            return int(text)
        return None
    return None


def memory() -> int:
    """Bytes of memory this process may use: the machine's RAM capped by its cgroup's limit, or LABKIT_MEMORY
    where set (e.g. 16G). (00_welcome)"""
    override = setting(MEMORY_ENV)
    if override is not None:
        return override
    import psutil
    total = psutil.virtual_memory().total
    limit = cgroup_memory_limit()
    return min(total, limit) if limit else total


def _first_number(path: Path, key: str | None = None) -> int | None:
    """The whole number in a cgroup file (key: the value of its `key N` line), None where absent or unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if key is not None:
        text = next((line.split()[1] for line in text.splitlines() if line.split()[:1] == [key]), "")
    text = text.strip()
    return int(text) if text.isdigit() else None


def cgroup_memory_usage(root: Path | str = _CGROUP_ROOT) -> int | None:
    """Bytes the processes of this cgroup use now, every process in it (this kernel, other kernels, their
    children), less the file cache the kernel can drop (inactive_file): v2 memory.current, v1
    memory.usage_in_bytes, as `docker stats` counts them. None where there is no such file. (00_welcome)"""
    root = Path(root)
    for usage, stat, cache in ((root / "memory.current", root / "memory.stat", "inactive_file"),
                               (root / "memory" / "memory.usage_in_bytes", root / "memory" / "memory.stat",
                                "total_inactive_file")):
        used = _first_number(usage)
        if used is not None:
            return max(0, used - (_first_number(stat, cache) or 0))
    return None


def memory_available(root: Path | str = _CGROUP_ROOT) -> int:
    """Bytes free for new processes now: under a cgroup memory limit, that limit less what every process of the
    cgroup uses (other notebooks' kernels in the same container count), and never more than the node has free;
    without a limit, what the system says is available, within memory(); memory() itself where LABKIT_MEMORY is
    set (the plan is then for that machine, not this one). (00_welcome)"""
    if setting(MEMORY_ENV) is not None:
        return memory()
    import psutil
    node = psutil.virtual_memory().available
    limit, used = cgroup_memory_limit(root), cgroup_memory_usage(root)
    if limit and used is not None:
        return max(0, min(limit - used, node))
    return min(limit or memory(), node)


def cgroup_cpu_seconds(root: Path | str = _CGROUP_ROOT) -> float | None:
    """CPU seconds the processes of this cgroup have used since it began (v2 cpu.stat usage_usec, v1
    cpuacct.usage), None where there is no such file."""
    root = Path(root)
    usec = _first_number(root / "cpu.stat", "usage_usec")
    if usec is not None:
        return usec / 1e6
    nsec = _first_number(root / "cpuacct" / "cpuacct.usage")
    return None if nsec is None else nsec / 1e9


def cgroup_cpu_pressure(root: Path | str = _CGROUP_ROOT) -> float | None:
    """Percent of the last 10 s in which some process of this cgroup waited for a core (cpu.pressure's
    "some avg10", where the kernel keeps pressure figures: PSI), None where it keeps none."""
    try:
        line = next(line for line in (Path(root) / "cpu.pressure").read_text().splitlines() if line.startswith("some"))
        return float(next(f for f in line.split() if f.startswith("avg10="))[len("avg10="):])
    except (OSError, StopIteration, ValueError):
        return None


def cgroup_throttled(root: Path | str = _CGROUP_ROOT) -> float | None:
    """The share of the quota's periods (since the cgroup began) in which its processes used the whole quota and
    waited for the next period (cpu.stat nr_throttled / nr_periods, v2 and v1), None without a quota or file."""
    root = Path(root)
    for stat in (root / "cpu.stat", root / "cpu" / "cpu.stat"):
        periods, throttled = _first_number(stat, "nr_periods"), _first_number(stat, "nr_throttled")
        if periods:
            return (throttled or 0) / periods
    return None


def _usable_cores() -> int:
    n = _affinity_cores()
    quota = cgroup_cpu_limit()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def default_threads(cores: int | None = None, local_size: int = 1) -> int:
    """Threads per rank: the usable cores (machine.cores(), LABKIT_CORES honoured) split evenly among the
    `local_size` ranks on this host, never 0. (04_horovod_scaling)"""
    local_size = check_int(local_size, "local_size", minimum=1)
    cores = _cores() if cores is None else check_int(cores, "cores", minimum=1)
    return max(1, cores // local_size)


# ----------------------------------------------------------------------------------------------------
# Thread limits


_THREADPOOL_LIMITS = None  # keeps threadpoolctl's limit alive for the process's lifetime


def limit_threads(threads: int, tensorflow: bool = True) -> None:
    """Pin this process to `threads` compute threads: OpenMP/BLAS pools and, if asked, TensorFlow's.

    Call before TensorFlow runs its first op (a sweep worker's start-up); afterwards TF's pools are fixed.
    (05_network_sweep)"""
    global _THREADPOOL_LIMITS
    threads = check_int(threads, "threads", minimum=1)
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits

        _THREADPOOL_LIMITS = threadpool_limits(limits=threads)
    except ImportError:  # the environment variables still apply to libraries loaded later
        pass
    if tensorflow:
        import tensorflow as tf

        import labkit  # noqa: F401  (TF log level before TF)

        labkit.quiet()
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def thread_report() -> dict:
    """This process's thread limits now: env vars, BLAS pools, TensorFlow's pools (if TF is imported).
    (05_network_sweep)"""
    report = {var: os.environ.get(var) for var in THREAD_ENV_VARS}
    try:
        from threadpoolctl import threadpool_info

        report["blas_threads"] = [info["num_threads"] for info in threadpool_info()]
    except ImportError:
        report["blas_threads"] = []
    if "tensorflow" in sys.modules:
        tf = sys.modules["tensorflow"]
        report["tf_intra_op"] = tf.config.threading.get_intra_op_parallelism_threads()
        report["tf_inter_op"] = tf.config.threading.get_inter_op_parallelism_threads()
    return report


def thread_cpu_seconds(task_dir: Path | str = "/proc/self/task") -> dict:
    """CPU seconds so far of each of this process's threads, {thread id: seconds}, from Linux's /proc
    (schedstat: nanoseconds on a core; stat's user + system ticks where schedstat is missing). {} where
    there is no /proc (macOS). Time waiting for a core is not counted. (04_horovod_scaling)"""
    task_dir = Path(task_dir)
    try:
        tids = [d.name for d in task_dir.iterdir()]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for tid in tids:
        try:
            out[int(tid)] = int((task_dir / tid / "schedstat").read_text().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:  # fields after the ")" that ends the thread's name: utime and stime are the 12th and 13th
            fields = (task_dir / tid / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass  # the thread ended between the listing and the read
    return out


def thread_wait_channel(tid: int, task_dir: Path | str = "/proc/self/task") -> str:
    """The kernel function thread `tid` of this process sleeps in ('do_epoll_wait' for an event loop,
    'futex_wait_queue' or similar for a lock or condition); '' when running, unknown or unreadable."""
    try:
        name = (Path(task_dir) / str(tid) / "wchan").read_text().strip()
    except OSError:
        return ""
    return "" if name == "0" else name


# ----------------------------------------------------------------------------------------------------
# BLAS and oneDNN


def blas_info() -> list:
    """threadpoolctl's view of numpy's BLAS: library, version, kernel ('architecture'), threads. (02_im2col)"""
    import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]


def openblas_env() -> dict:
    """The OpenBLAS variables that pin its kernel choice: {name: value or None when unset}. (02_im2col)"""
    return {name: os.environ.get(name) for name in OPENBLAS_VARS}


# CPU features for which TensorFlow 2.15 turns its oneDNN kernels on by default on Linux (its util/port.cc,
# DefaultOneDnnPolicy): Intel since Cascade Lake, AMD since Zen 4. Names as /proc/cpuinfo spells them.
ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line that starts with one of keys (Linux), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo on Linux); empty where the system does not list them."""
    return set((_cpuinfo("flags", "features") or "").split())


def onednn_rule(env=None, machine_arch: str | None = None, system: str | None = None,
                flags: set[str] | None = None) -> bool:
    """TensorFlow 2.15's rule for its oneDNN kernels, without importing it. macOS wheels are built without
    them (the variable changes nothing there). Elsewhere TF_ENABLE_ONEDNN_OPTS=0/false switches them off and
    1/true on; unset (or any other value) leaves TensorFlow's default: on for x86-64 Windows, and on x86-64
    Linux only when the CPU has one of ONEDNN_DEFAULT_FLAGS (`flags`: the CPU's, read from /proc/cpuinfo when
    not given). (02_im2col)"""
    env = os.environ if env is None else env
    arch = (machine_arch or platform.machine()).lower()
    system = system or platform.system()
    if system == "Darwin":
        return False
    value = (env.get("TF_ENABLE_ONEDNN_OPTS") or "").lower()
    if value in ("0", "false"):
        return False
    if value in ("1", "true"):
        return True
    if arch not in ("x86_64", "amd64"):
        return False
    if system == "Windows":
        return True
    return system == "Linux" and bool(set(cpu_flags() if flags is None else flags) & set(ONEDNN_DEFAULT_FLAGS))


def tf_onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN kernels in this process: asked of TensorFlow itself (its
    IsMklEnabled), or by onednn_rule() when TensorFlow is not installed. Imports TensorFlow. (02_im2col)"""
    try:
        import labkit

        labkit.quiet()
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return onednn_rule()
    return bool(_pywrap_util_port.IsMklEnabled())


_KERNEL_PROBE = """
import numpy as np, tensorflow as tf
n, h, c, k = {shape}
x = tf.constant(np.ones((n, h, h, c), np.float32)); w = tf.constant(np.ones((k, k, c, c), np.float32))
tf.nn.conv2d(x, w, 1, "SAME").numpy()
tf.linalg.matmul(tf.reshape(x, (-1, c)), tf.reshape(w[0, 0], (c, c))).numpy()
"""


def onednn_kernels(batch_size: int = 2, size: int = 28, channels: int = 128, kernel: int = 3) -> dict:
    """Which kernels TensorFlow runs for one tf.nn.conv2d and one tf.linalg.matmul, as oneDNN reports them.

    Runs the two ops in a fresh Python with ONEDNN_VERBOSE=1 (the variable is read once, when TensorFlow
    loads) and parses oneDNN's "exec" lines: {"conv2d": "brgconv:avx512_core (convolution_direct)",
    "matmul": "oneDNN sgemm", ...} (TensorFlow's Eigen matmul calls oneDNN's sgemm even with oneDNN's
    other kernels off). With oneDNN off there are no such lines and each op maps to
    "TensorFlow's own (Eigen) kernel". Takes a few seconds (a TensorFlow start-up). (02_im2col)"""
    import subprocess

    batch_size, size, channels, kernel = (check_int(v, n, minimum=1) for v, n in (
        (batch_size, "batch_size"), (size, "size"), (channels, "channels"), (kernel, "kernel")))
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2")
    code = _KERNEL_PROBE.format(shape=(batch_size, size, channels, kernel))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the TensorFlow probe failed: {done.stderr.strip().splitlines()[-1:]}")
    found = {}
    for line in done.stdout.splitlines():
        fields = line.split(",")
        if len(fields) < 6 or fields[0] != "onednn_verbose" or fields[1] != "exec":
            continue
        primitive, impl = fields[3], fields[4] or ("oneDNN sgemm" if fields[3] == "gemm_api" else "?")
        alg = next((f.split("alg:")[1] for f in fields if f.startswith("alg:")), "")
        name = {"convolution": "conv2d", "gemm_api": "matmul", "matmul": "matmul"}.get(primitive, primitive)
        found.setdefault(name, impl + (f" ({alg})" if alg else ""))
    for op in ("conv2d", "matmul"):
        found.setdefault(op, "TensorFlow's own (Eigen) kernel")
    return found


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), or platform.processor()."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown CPU"


def describe(tensorflow: bool = True) -> str:
    """Lines naming the CPU, usable cores, numpy's BLAS and kernel, the OpenBLAS pins, TensorFlow and
    whether its oneDNN kernels are on (tensorflow=False: skip TF, so no TF import). (02_im2col)"""
    lines = [f"CPU: {cpu_model()}; {count_text(cores(), 'usable core')} of {os.cpu_count()}"]
    try:
        libs = blas_info()
    except ImportError:
        libs = []
    for lib in libs:
        lines.append(f"numpy BLAS: {lib.get('internal_api')} {lib.get('version')}, kernel "
                     f"{lib.get('architecture', '?')}, {lib.get('num_threads')} threads "
                     f"({lib.get('threading_layer', '?')}), {os.path.basename(lib.get('filepath', ''))}")
    if not libs:
        lines.append("numpy BLAS: not visible to threadpoolctl")
    pinned = {k: v for k, v in openblas_env().items() if v is not None}
    if pinned:
        lines.append("OpenBLAS kernel pinned by " + ", ".join(f"{k}={v}" for k, v in pinned.items())
                     + " (for a fair run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE labkit conv-bench)")
    else:
        lines.append("OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset: OpenBLAS picked its own kernel")
    if tensorflow:
        try:
            import labkit

            labkit.quiet()
            import tensorflow as tf

            version = tf.__version__
        except ImportError:
            version = None
        if version is None:
            lines.append("TensorFlow: not installed")
        else:
            on = tf_onednn_enabled()
            lines.append(f"TensorFlow {version}: oneDNN kernels {'on' if on else 'off'} "
                         f"(TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})")
    return "\n".join(lines)


def refuse_more_than_cores(count: int, flag: str, what: str, wait: str) -> None:
    """ValueError (one line, naming flag) when count processes (what: "ranks", "worker processes") would be more
    than this machine's cores(): each would get a slice of a core and `wait`. `labkit scale --np` and `labkit
    sweep --workers` both refuse so, unless --oversubscribe (04_horovod_scaling, 05_network_sweep)."""
    have = cores()
    if count > have:
        raise ValueError(f"{flag} {count} starts more {what} than this machine has cores ({have}); each would get a "
                         f"slice of a core and {wait}. Use {flag} up to {have}, or pass --oversubscribe to run it "
                         "anyway")


def namespaces_problem() -> str | None:
    """None when this process can make Linux network namespaces (root on Linux: the deep dive's virtual cluster),
    else what is missing, in a few words. (07_scaling_deep_dive)"""
    if sys.platform != "linux":
        return f"Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "root (network namespaces, tc and the daemons)"
    return None
