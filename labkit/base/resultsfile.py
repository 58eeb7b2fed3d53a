"""The sweep's results file: JSON lines, one record per config, rewritten atomically; settings checked on resume.

Every record may carry the settings it was made with (epochs, data set, ...); settings_mismatch says what
differs, so a resume never mixes results of two set-ups in one table. (05_network_sweep)
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def load_results(path) -> list[dict]:
    """Records in a results file (JSON lines); [] if it does not exist. (05_network_sweep)"""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"results file {path} line {lineno} is not JSON ({err}); fix or delete that line, "
                             "or start over with resume=False / --overwrite") from None
        if not isinstance(rec, dict) or "key" not in rec:
            raise ValueError(f"results file {path} line {lineno} is not a sweep record (no 'key')")
        records.append(rec)
    return records


def write_results(path, records) -> None:
    """Write all records at once: temp file in the same directory, fsync, os.replace (atomic). (05_network_sweep)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def check_writable(path) -> None:
    """Raise ValueError naming `out` when the results file cannot be written there (before any compute).
    (05_network_sweep)"""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"out must be a file path; {path} is a directory")
    for parent in path.parents:  # the nearest existing folder must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"out: cannot write the results file {path} ({parent} is a file, not a folder)")
            break
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ValueError(f"out: cannot write the results file {path} ({err.strerror or err})") from None


def settings_mismatch(records, settings: dict, path="the results file") -> str | None:
    """Why these records cannot be resumed with `settings` (what differs, one line), or None when they can.
    (05_network_sweep)"""
    for rec in records:
        old = rec.get("settings")
        if old is None:
            return f"{path} holds results without recorded settings (an older labkit), which cannot be checked"
        if old != settings:
            diff = "; ".join(f"{k}={old.get(k)!r} there, {settings.get(k)!r} now"
                             for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k))
            return f"{path} was made with other settings ({diff})"
    return None



def records_dataframe(records):
    """Records as a pandas DataFrame: one row per config, config keys as columns, memory in KB. (05_network_sweep)"""
    import pandas as pd

    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k not in ("config", "settings", "traceback")}
        row.update(r.get("config") or {})
        rows.append(row)
    df = pd.DataFrame(rows)
    if "memory_bytes" in df:
        df["memory_kb"] = df["memory_bytes"] / 1e3
    return df
