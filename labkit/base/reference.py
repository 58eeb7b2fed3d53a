"""The reference run, in one file: the machine the committed outputs come from and every figure an observation
compares with (notebooks/results/reference.json). (00_welcome)

The refresh of the committed outputs records, per notebook, what each observation saw (`observe.observation`
appends its `here` to the file RECORD_ENV names), keeps it in the notebook's metadata (labkit.refresh.figures),
and then writes this file with from_notebooks(), the one function that builds it. An observation given no
`reference=` shows the figure this file holds for its `what`, so no reference number is typed in a notebook.

    from labkit.base import reference
    reference.figure("two workers beat one")     # '1.51x' as the reference run saw it, or '' when not recorded
    reference.machine()["cpu"]                   # the reference machine's CPU
"""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

FILE_ENV = "LABKIT_REFERENCE_FILE"  # another reference file (the tests' planted copies)
RECORD_ENV = "LABKIT_REFERENCE_RECORD"  # the refresh: a file each observation appends {"what", "here"} to, one line
PATH = Path(__file__).resolve().parents[2] / "notebooks" / "results" / "reference.json"
MACHINE_KEYS = ("cpu", "cores", "blas", "tensorflow", "load_before", "load_after", "profile", "date")


def path() -> Path:
    """The reference file: FILE_ENV where set, else notebooks/results/reference.json."""
    return Path(os.environ.get(FILE_ENV, "").strip() or PATH)


def load(where: Path | str | None = None) -> dict:
    """The reference file as a dict ({"machine": {...}, "figures": {notebook: {what: here}}}); empty parts when
    it does not exist yet."""
    where = path() if where is None else Path(where)
    if not where.is_file():
        return {"machine": {}, "figures": {}}
    doc = json.loads(where.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("figures"), dict):
        raise ValueError(f"reference file {where.name} must hold a 'figures' object; got {type(doc).__name__}")
    return doc


def machine() -> dict:
    """The reference machine: cpu, cores, blas, tensorflow, load_before, load_after, profile, date."""
    return load().get("machine", {})


def figure(what: str) -> str:
    """What the reference run's observation named `what` saw (its `here`), or '' when the file does not hold it."""
    for figures in load()["figures"].values():
        if what in figures:
            return str(figures[what])
    return ""


def record(what: str, here: str) -> None:
    """Append one observation's figure to the file RECORD_ENV names (the refresh sets it); nothing when unset."""
    where = os.environ.get(RECORD_ENV, "").strip()
    if not where or not here:
        return
    from labkit.base import resultsfile  # the one writer: read and rewritten whole under the file's lock
    line = json.dumps({"what": what, "here": here}, ensure_ascii=False) + "\n"
    with resultsfile.locked(where):
        old = Path(where).read_text(encoding="utf-8") if Path(where).is_file() else ""
        resultsfile.write_text(where, old + line)


def read_record(where: Path | str) -> dict:
    """{what: here} from a RECORD_ENV file (a later line for the same what wins: the cell's last run)."""
    where = Path(where)
    if not where.is_file():
        return {}
    rows = [json.loads(line) for line in where.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {row["what"]: row["here"] for row in rows}


def _printed_machine(nb: dict) -> dict:
    """CPU, cores, BLAS and TensorFlow from the lines machine.describe() printed in a notebook's outputs."""
    found = {}
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                m = re.match(r"CPU: (.+); (\d+) usable cores? of \d+", line)
                if m:
                    found.update(cpu=m.group(1), cores=int(m.group(2)))
                m = re.match(r"numpy BLAS: (\S+ \S+), kernel (\S+),", line)
                if m:
                    found["blas"] = f"{m.group(1)}, kernel {m.group(2)}"
                m = re.match(r"TensorFlow (\d[\w.]*):", line)
                if m:
                    found["tensorflow"] = m.group(1)
    return found


def from_notebooks(paths) -> dict:
    """The reference file's content from refreshed notebooks: the machine (describe()'s printed lines, the
    refresh's metadata: load before/after, profile, date) and each notebook's recorded figures."""
    doc = {"machine": {}, "figures": {}}
    loads_before, loads_after, profiles, dates = [], [], set(), []
    for p in sorted(Path(p) for p in paths):
        nb = json.loads(p.read_text(encoding="utf-8"))
        run = nb.get("metadata", {}).get("labkit", {}).get("refresh", {})
        doc["machine"].update({k: v for k, v in _printed_machine(nb).items() if k not in doc["machine"]})
        loads_before += [run["load_before"]] if "load_before" in run else []
        loads_after += [run["load_after"]] if "load_after" in run else []
        profiles |= {run["profile"]} if "profile" in run else set()
        dates += [run["date"]] if "date" in run else []
        doc["figures"][p.stem] = dict(sorted(run.get("figures", {}).items()))
    doc["machine"].update(load_before=max(loads_before, default=None), load_after=max(loads_after, default=None),
                          profile=", ".join(sorted(profiles)) or None, date=max(dates, default=None))
    doc["machine"] = {k: doc["machine"].get(k) for k in MACHINE_KEYS}
    return doc


def write(doc: dict, where: Path | str | None = None) -> Path:
    """Write the reference file (atomically, as every file labkit writes)."""
    from labkit.base import resultsfile
    where = path() if where is None else Path(where)
    resultsfile.write_text(where, json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=False) + "\n")
    return where


def today() -> str:
    """The refresh's date stamp (UTC, ISO)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
