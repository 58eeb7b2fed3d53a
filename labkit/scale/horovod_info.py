"""Which Horovod this environment has: where its horovodrun is, and what it was built with.

One home for both facts: the launcher (labkit.scale.launch) starts this horovodrun, the doctor reports its
build, and the local measurements (labkit.scale.localscale) read the controllers it has. (00_welcome)
"""
from __future__ import annotations

import functools
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
    """(log, reason) of the Horovod build scripts/setup.sh tried in this environment, when one is logged: the
    reason is the build script's last line; None without a log. (00_welcome)"""
    log = Path(sys.prefix) / BUILD_LOG
    try:
        said = [ln[len("build-horovod: "):] for ln in log.read_text(errors="replace").splitlines()
                if ln.startswith("build-horovod: ")]
    except OSError:
        return None
    return log, (said[-1] if said else "see the log")


def parse_check_build(text: str) -> dict:
    """Parse `horovodrun --check-build` into {'version', 'frameworks', 'controllers', 'operations'}."""
    out = {"version": None, "frameworks": [], "controllers": [], "operations": []}
    m = re.search(r"Horovod v(\S+?):?\s*$", text, re.M)
    if m:
        out["version"] = m.group(1)
    section = None
    keys = {"Available Frameworks": "frameworks", "Available Controllers": "controllers",
            "Available Tensor Operations": "operations"}
    for line in text.splitlines():
        stripped = line.strip().rstrip(":")
        if stripped in keys:
            section = keys[stripped]
            continue
        m = re.match(r"\[(X| )\]\s+(\S+)", line.strip())
        if m and section and m.group(1) == "X":
            out[section].append(m.group(2))
    return out


def run_check_build() -> tuple[dict | None, int | None, str]:
    """`horovodrun --check-build` (the launcher's horovodrun), parsed: (build, returncode, ''), or
    (None, None, why) where horovodrun is missing or cannot run."""
    exe = horovodrun_path()
    if exe is None:
        return None, None, "not installed"
    try:
        proc = subprocess.run([exe, "--check-build"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, None, f"horovodrun --check-build failed ({err})"
    return parse_check_build(proc.stdout), proc.returncode, ""


@functools.cache
def horovod_build() -> dict | None:
    """What this environment's Horovod was built with (parse_check_build's dict), asked once per process;
    None where horovodrun is missing or fails."""
    build, returncode, _ = run_check_build()
    return build if returncode == 0 and build["version"] else None
