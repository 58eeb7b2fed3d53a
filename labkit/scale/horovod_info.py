"""Which Horovod this environment has: where its horovodrun is, and what it was built with.

One home for both facts: the launcher (labkit.scale.launch) starts this horovodrun; the doctor reports the build
of the Horovod the ranks import, asked of its TensorFlow extension (probe_build), and the MPI lookup
(labkit.scale.mpi) falls back on it where no ldd can say which MPI the extension links. (00_welcome)
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def horovodrun_path() -> str | None:
    """$LABKIT_HOROVODRUN (a site's module-loaded Horovod), else the horovodrun of this Python environment
    (next to sys.executable), else the one on PATH; None when there is none."""
    override = os.environ.get("LABKIT_HOROVODRUN", "").strip()
    if override:
        return override if Path(override).exists() else None
    local = Path(sys.executable).with_name("horovodrun")
    return str(local) if local.exists() else shutil.which("horovodrun")


BUILD_LOG = "horovod-build.log"  # scripts/setup.sh keeps the build's output there, in the environment's folder


def failed_build() -> tuple[Path, str] | None:
    """(log, reason) of the Horovod build scripts/setup.sh tried in this environment, when it failed: the reason is
    the build script's last line; None without a log, or where that build installed Horovod. (00_welcome)"""
    log = Path(sys.prefix) / BUILD_LOG
    try:
        said = [ln[len("build-horovod: "):] for ln in log.read_text(errors="replace").splitlines()
                if ln.startswith("build-horovod: ")]
    except OSError:
        return None
    if said and re.fullmatch(r"horovod \S+ installed \(.*\)", said[-1]):  # build-horovod.sh's last line when it worked
        return None
    return log, (said[-1] if said else "see the log")


# `horovodrun --check-build`'s rows, in its order: (row, the extension's function that answers it)
CONTROLLERS = (("MPI", "mpi_built"), ("Gloo", "gloo_built"))
OPERATIONS = (("NCCL", "nccl_built"), ("DDL", "ddl_built"), ("CCL", "ccl_built"), ("MPI", "mpi_built"),
              ("Gloo", "gloo_built"))


def ask_extension() -> dict:
    """What this process's Horovod was built with, asked as `horovodrun --check-build` asks: import the TensorFlow
    extension (horovod.tensorflow) and call its mpi_built(), gloo_built(), ... The same questions, in one process:
    --check-build starts one process per question and each imports TensorFlow (20 s where this takes 3 s).
    {'version', 'frameworks', 'controllers', 'operations', 'error'}; version None where Horovod is not importable."""
    out = {"version": None, "frameworks": [], "controllers": [], "operations": [], "error": ""}
    try:
        import horovod
        out["version"] = horovod.__version__
        import horovod.tensorflow as ext
    except Exception as err:  # noqa: BLE001  (a broken build raises anything on import: it is the answer)
        out["error"] = f"{type(err).__name__}: {err}".splitlines()[0]
        return out
    out["frameworks"] = ["TensorFlow"]
    for key, rows in (("controllers", CONTROLLERS), ("operations", OPERATIONS)):
        for row, fn in rows:  # an older Horovod may lack a question: not built, as --check-build would say
            try:
                if getattr(ext, fn)():
                    out[key].append(row)
            except Exception:  # noqa: BLE001, S112  (the same answer as --check-build's, which catches it too)
                continue
    return out


def probe_build(python: list[str] | None = None, timeout: float = 120) -> tuple[dict | None, str]:
    """ask_extension() in a new process of `python` (a command, default this interpreter; the doctor passes the
    ranks' Python, labkit.scale.launch.rank_python), so that a build which crashes on import cannot take the
    caller with it: (build, '') or (None, why) where that process could not answer. It runs in a session of its
    own, ended whole past the timeout (a container command's children with it)."""
    import signal
    cmd = [*(python or [sys.executable]), "-m", "labkit.scale.horovod_info"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as err:
        return None, f"asking Horovod what it was built with failed ({err})"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"asking Horovod what it was built with took more than {timeout:g} s"
    for line in reversed(out.splitlines()):  # the answer is the last JSON line; TensorFlow may print before it
        with contextlib.suppress(ValueError):
            build = json.loads(line)
            if isinstance(build, dict) and set(build) >= {"version", "frameworks", "controllers", "operations"}:
                return {"error": "", **build}, ""
    said = [ln for ln in err.strip().splitlines() if re.match(r"\w*(Error|Exception)\b", ln)]
    said = said or err.strip().splitlines() or [f"exit status {proc.returncode}, no answer"]
    if "No module named 'labkit'" in said[-1]:
        return None, f"the ranks' Python cannot import labkit ({' '.join(cmd[:-2])})"
    return None, f"asking Horovod what it was built with failed ({said[-1]})"


@functools.cache
def horovod_build() -> dict | None:
    """What this environment's Horovod was built with (probe_build's dict), asked once per process; None where
    Horovod is missing or its TensorFlow extension does not load."""
    build, _ = probe_build()
    return build if build and build["version"] and build["frameworks"] else None


if __name__ == "__main__":  # probe_build's process: one line of JSON
    print(json.dumps(ask_extension()))
