"""`labkit doctor`: what is installed and working, and a one-line fix for anything missing (00_welcome).

`doctor()` returns the report as data; `labkit doctor` prints it and exits 1 when something the course
needs is missing. What Horovod was built with is asked of Horovod itself, as `horovodrun --check-build` asks it
(labkit.scale.horovod_info.probe_build), in the Python the ranks run.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import labkit
from labkit.base import config
from labkit.scale import launch
from labkit.scale.horovod_info import failed_build, horovodrun_path, probe_build

SUPPORTED_PYTHON = ((3, 11), (3, 11))  # the one the suite runs on
PINNED_TF = "2.15.1"
PINNED_HOROVOD = "0.28.1"


@dataclass
class Check:
    name: str
    ok: bool
    value: str
    fix: str = ""
    required: bool = True  # a failed optional check (no GPU, no CIFAR-10) is information, not a problem


@dataclass
class Report:
    checks: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def problems(self) -> list:
        return [c for c in self.checks if c.required and not c.ok]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks], "info": self.info}

    def __str__(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = []
        for c in self.checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "--  ")
            lines.append(f"[{mark}] {c.name:<{width}}  {c.value}")
        for c in self.problems:
            lines.append(f"fix {c.name}: {c.fix}")
        lines.append("all checks passed" if self.ok else f"{len(self.problems)} problem(s) found")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle):  # IPython shows the table, not the dataclass
        p.text(str(self))


def _python_check() -> Check:
    v = sys.version_info[:2]
    ok = SUPPORTED_PYTHON[0] <= v <= SUPPORTED_PYTHON[1]
    return Check("python", ok, platform.python_version(),
                 "the course is tested on Python 3.11 alone: recreate .venv with LABKIT_PYTHON=python3.11 make lab")


def _tensorflow_check(report: Report) -> Check:
    try:
        import tensorflow as tf
    except ImportError as err:
        return Check("tensorflow", False, f"not importable ({err})", "run `make setup` (installs tensorflow)")
    labkit.quiet()
    try:
        import keras
        keras_version = keras.__version__
    except ImportError:
        keras_version = "missing"
    report.info["keras"] = keras_version
    report.info["tensorflow"] = tf.__version__
    ok = tf.__version__ == PINNED_TF
    return Check("tensorflow", ok, f"{tf.__version__} (keras {keras_version})",
                 f"the course is pinned to tensorflow {PINNED_TF}: run `make setup`")



def _horovod_check(report: Report) -> Check:
    fix = "build it: `make setup` (or scripts/build-horovod.sh inside your environment)"
    try:
        python = launch.rank_python()  # the Python each rank runs: its Horovod is the one that matters
    except ValueError as err:
        return Check("horovod", False, str(err), f"set {launch.RANK_PYTHON_ENV} to a command that starts Python")
    build, why = (None, "not installed") if horovodrun_path() is None else probe_build(python)
    if build is not None and build["version"] is None:
        build, why = None, f"not installed ({build['error']})"
    if build is None:
        logged = failed_build()  # scripts/setup.sh tried and failed: its reason, and where the log is
        if logged is not None:
            why = f"{why}: the last build stopped with: {logged[1]}"
            fix = f"{fix}, once the cause is fixed; the build's log: {logged[0]}"
        return Check("horovod", False, why, fix)
    report.info["horovod_build"] = {k: build[k] for k in ("version", "frameworks", "controllers", "operations")}
    transports = sorted(set(build["controllers"]) | set(build["operations"]))
    value = f"{build['version']} (TensorFlow: {'yes' if build['frameworks'] else 'NO'}; " \
            f"controllers: {', '.join(build['controllers']) or 'none'}; " \
            f"ops: {', '.join(build['operations']) or 'none'})"
    if not build["frameworks"]:
        return Check("horovod", False, f"{value}: {build['error']}", "Horovod was built without TensorFlow: " + fix)
    if not ({"Gloo", "MPI"} & set(transports)):
        return Check("horovod", False, value, "Horovod has neither Gloo nor MPI: " + fix)
    if build["version"] != PINNED_HOROVOD:
        return Check("horovod", False, value, f"the course is pinned to horovod {PINNED_HOROVOD}: " + fix)
    return Check("horovod", True, value)


def _mpi_check(report: Report) -> Check:
    """Which MPI Horovod links (this environment's Open MPI from PyPI, or the system's) and its mpirun."""
    from labkit.scale import mpi
    exe = mpi.mpirun_path() if mpi.horovod_has_mpi() else None
    report.info["mpi"] = {"libmpi": mpi.horovod_libmpi() or None, "mpirun": exe,
                          "version": mpi.version(exe) if exe else None,
                          "from": None if exe is None else
                          "environment" if mpi.from_this_environment(exe) else "system"}
    fix = "optional: `make setup` builds Horovod with Open MPI from PyPI (launches then use its faster exchange)"
    if exe is None:
        return Check("mpi", False, f"{mpi.describe()}; launches use Gloo", fix, required=False)
    # the path stays in report.info (labkit doctor --json): a notebook's output shows no machine path
    return Check("mpi", True, f"{mpi.describe()}; launches use its mpirun", required=False)


def _gpu_check(report: Report) -> Check:
    try:
        import tensorflow as tf
        gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    except ImportError:
        gpus = []
    report.info["gpus"] = gpus
    value = f"{len(gpus)} visible to TensorFlow" + (f" ({', '.join(gpus)})" if gpus else "; CPU only")
    return Check("gpus", bool(gpus), value, "optional: the full profile wants a GPU", required=False)


def _blas_check(report: Report) -> Check:
    """numpy's BLAS kernel: a generic one on an AVX2/AVX-512 CPU is said in one line (information, not a failure)."""
    from labkit.base import blas
    line = blas.generic_blas_line()
    report.info["generic_blas"] = line
    return Check("blas", line is None, line or "numpy's BLAS runs a kernel for this CPU",
                 "unset OPENBLAS_CORETYPE where this CPU runs OpenBLAS's own choice correctly", required=False)


def _memory_bytes() -> tuple[int | None, int | None, str]:
    """(bytes this process may use, bytes available to it, what limits it): a container's limit and what every
    process in it uses (machine.memory, machine.memory_available), not the node's RAM."""
    from labkit.base import machine
    try:
        total, avail = machine.memory(), machine.memory_available()
    except ImportError:
        return None, None, ""
    if machine.setting(machine.MEMORY_ENV) is not None:
        return total, avail, f" ({machine.MEMORY_ENV})"
    limit = machine.cgroup_memory_limit()
    return total, avail, " (this container's limit)" if limit and limit <= total else ""


def _cores_text(cores: int) -> str:
    """The usable cores, and the CPU quota that limits them where one does (a container started with --cpus)."""
    from labkit.base import machine
    quota = machine.cgroup_cpu_limit()
    text = f"{machine.count_text(cores, 'core')} usable by this process"
    return text + (f" (this container's CPU quota: {quota:g})" if quota else "")


def doctor(check_horovod: bool = True) -> Report:
    """Inspect this environment and return a Report (checks + info); `.ok` is False if the course can't run."""
    report = Report()
    report.checks.append(_python_check())
    report.checks.append(_tensorflow_check(report))
    if check_horovod:
        report.checks.append(_horovod_check(report))
        report.checks.append(_mpi_check(report))
    report.checks.append(_gpu_check(report))

    from labkit.base import machine

    cores = machine.cores()
    report.info["cores"] = cores
    report.checks.append(Check("cores", True, _cores_text(cores), required=False))
    report.checks.append(_blas_check(report))
    total, avail, limit = _memory_bytes()
    report.info["memory_bytes"] = total
    if total:
        report.checks.append(Check("memory", avail > 1.5e9, f"{total / 2**30:.1f} GiB{limit}, "
                                   f"{avail / 2**30:.1f} GiB available",
                                   "under 1.5 GiB free: close other programs or use LABKIT_PROFILE=quick",
                                   required=False))
    disk = shutil.disk_usage(Path.cwd())
    report.info["disk_free_bytes"] = disk.free
    report.checks.append(Check("disk", disk.free > 2e9, f"{disk.free / 2**30:.1f} GiB free here",
                               "under 2 GiB free: CIFAR-10 and checkpoints need room", required=False))
    try:
        prof = config.profile()
        report.checks.append(Check("profile", True, f"{prof} (LABKIT_PROFILE)"))
    except ValueError as err:
        prof = None
        report.checks.append(Check("profile", False, str(err).split(";")[1].strip(), str(err).split("Fix: ")[-1]))
    report.info["profile"] = prof
    report.info["data_dir"] = str(config.data_dir())
    report.checks.append(_cifar10_check(report))
    return report


def _cifar10_check(report: Report) -> Check:
    """Found and intact, corrupt (load_dataset would raise: a failed, required check with the fix), or absent."""
    from labkit.data import cifar10

    problem = config.data_dir_problem()
    if problem:  # a bad setting is said as such, never as "not found"
        report.info["cifar10"] = None
        what, fix = problem.rsplit("; ", 1)  # data_dir_problem's line: what is wrong; how to fix it
        return Check("LABKIT_DATA", False, what, fix)
    where = cifar10.find_cifar10() or cifar10._find_archive()
    report.info["cifar10"] = str(where) if where else None
    if where is None:
        return Check("cifar10", False, "not found locally; notebooks use the offline data set",
                     "optional: `labkit data fetch cifar10` on a machine with internet", required=False)
    problem = cifar10.cifar10_problem()
    if problem:
        return Check("cifar10", False, f"{where} is corrupt: notebooks that load it will stop with an error",
                     "labkit data fetch cifar10 --force (on a machine with internet), or delete it to use the "
                     "offline data set")
    return Check("cifar10", True, f"{where} (checksums verified)", required=False)


def cli_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="labkit doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-horovod", action="store_true", help="skip the Horovod check")
    args = parser.parse_args(argv)
    report = doctor(check_horovod=not args.no_horovod)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1
