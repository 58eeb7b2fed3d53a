"""The sweep's results file (05_network_sweep): JSON lines, one record per config, merged under a lock.

Records carry the settings they were made with (epochs, data set, ...); settings_mismatch says what differs,
so a resume never mixes results of two set-ups in one table. Every write goes through labkit.base.resultsfile.
"""
from __future__ import annotations

import json
from pathlib import Path

from labkit.base.resultsfile import (
    LOCK_TIMEOUT_S,
    RESULTS_RESERVE_BYTES,
    check_space,
    check_target,
    json_lines,
    locked,
    target_of,
    write_text,
)

OWN = json_lines("key")  # what a sweep results file holds: check_target refuses any other existing file


def merge_records(path, records, key: str = "key", timeout: float = LOCK_TIMEOUT_S) -> list[dict]:
    """Add records to a JSON-lines file under its lock, keeping every record another process wrote since:
    the file is re-read, a record with the same key replaced, new keys appended, the whole rewritten
    atomically. Returns the file's records after the merge. (05_network_sweep)"""
    with locked(path, timeout):
        merged = {rec[key]: rec for rec in load_results(path)}
        for rec in records:
            merged[rec[key]] = rec
        out = list(merged.values())
        write_results(path, out)
    return out


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
    """Write all records at once (JSON lines) through the atomic writer. (05_network_sweep)"""
    path = Path(path)
    target_of(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in records))


class ResultsNotSaved(OSError):
    """A result was trained but its results file could not be written (disk full, ...): the message names the
    file; .records holds the results not saved, which were also printed on stderr as JSON lines."""

    def __init__(self, path, err: OSError, records: list):
        super().__init__(f"could not write {path} ({err.strerror or err}); {len(records)} trained result(s) not "
                         "saved there were printed above as JSON lines (add them to the file once there is room)")
        self.errno, self.records = err.errno, records  # str(self) is the line alone, with no "[Errno N]" before it


def check_writable(path) -> None:
    """Raise ValueError naming `out` when the results file cannot be written there, or the disk has no room for
    it (before any compute): each write rewrites the whole file beside the old one, so the old file's size is
    reserved with room for the new records. A file that exists and is not a sweep results file (or a device, a
    pipe) is refused: the sweep writes only its own files. (05_network_sweep)"""
    path = Path(path)
    target_of(path)  # a symlink loop is one line
    if path.is_dir():
        raise ValueError(f"out must be a file path; {path} is a directory")
    check_target(path, "out", own=OWN)
    for parent in path.parents:  # the nearest existing folder must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"out: cannot write the results file {path} ({parent} is a file, not a folder)")
            break
    try:
        target_of(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"out: cannot write the results file {path} ({err.strerror or err})") from None
    try:
        size = target_of(path).stat().st_size
    except OSError:
        size = 0
    check_space(path, size + RESULTS_RESERVE_BYTES, "out")


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
    """Records as a pandas DataFrame: one row per config, config keys as columns, memory in kB. (05_network_sweep)"""
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
