"""What a learner sees of the notebooks: no test scaffolding, and every collapsed check says what it checks.

nbval reads its markers from cell tags (nbval-check-output, nbval-ignore-output), so no `# NBVAL_*` line
belongs in a cell; a collapsed (source_hidden) code cell still shows in full on GitHub and nbviewer, so its
first line is a comment that says in words what the cell checks or sets.
"""
import json
import re
from pathlib import Path

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# a first line that names no claim: "# Checks the claims above against this run's numbers (collapsed)"
GENERIC = re.compile(r"^#\s*Checks?\s+(the\s+)?(claims?|text)\s+(above|below)\b[^:]*$", re.IGNORECASE)


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def nbval_lines(path) -> list[str]:
    """'cell N: line' for every line of a cell that starts with an nbval marker comment."""
    return [f"cell {i}: {line.strip()}" for i, cell in enumerate(cells(path))
            for line in source(cell).splitlines() if line.lstrip().upper().startswith("# NBVAL_")]


def unsaid_checks(path) -> list[str]:
    """'cell N: first line' for every collapsed code cell whose first line does not say what the cell does."""
    bad = []
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or not hidden(cell):
            continue
        first = (source(cell).splitlines() or [""])[0].strip()
        if not first.startswith("# ") or len(first[2:].split()) < 4 or GENERIC.match(first):
            bad.append(f"cell {i}: {first!r}")
    return bad


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 8, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_nbval_marker_in_a_cell(path):
    assert not nbval_lines(path), f"{path.name}: nbval markers belong in cell tags, not in the source"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_collapsed_cell_says_what_it_checks(path):
    assert not unsaid_checks(path), f"{path.name}: a collapsed cell's first line must say in words what it checks"


def test_the_rules_catch_what_they_name(tmp_path):
    """The two rules on a notebook made to break them, and on one that keeps them."""
    def notebook(*cells_):
        path = tmp_path / f"nb{len(list(tmp_path.iterdir()))}.ipynb"
        path.write_text(json.dumps({"cells": list(cells_)}), encoding="utf-8")
        return path

    def code(text, collapsed=False):
        return {"cell_type": "code", "source": text.splitlines(True),
                "metadata": {"jupyter": {"source_hidden": True}} if collapsed else {}}

    bad = notebook(code("# NBVAL_CHECK_OUTPUT\nprint(1)"), code("assert x == 1", collapsed=True),
                   code("# Checks the claims above against this run's numbers (collapsed)\nassert x", collapsed=True),
                   code("# check\nassert x", collapsed=True))
    assert nbval_lines(bad) == ["cell 0: # NBVAL_CHECK_OUTPUT"]
    assert [line.split(":")[0] for line in unsaid_checks(bad)] == ["cell 1", "cell 2", "cell 3"]
    good = notebook(code("print(1)"), {"cell_type": "markdown", "source": "text", "metadata": {}},
                    code("# Check: the im2col result equals tf.nn.conv2d to float32 tolerance\nassert x",
                         collapsed=True))
    assert nbval_lines(good) == [] and unsaid_checks(good) == []


# ------------------------------------------------------------------------------------------------
# Horovod's defaults as the text quotes them, against the installed Horovod (horovodrun's own help text)

def horovod_defaults() -> dict:
    """{'fusion_threshold_mb': 128, 'cycle_time_ms': 1.0} as the installed horovodrun's help states them (its
    MB are 1024 x 1024 bytes: Horovod's runner config parser multiplies by 1024 * 1024)."""
    import importlib.util
    spec = importlib.util.find_spec("horovod.runner.launch")
    if spec is None or not spec.origin:
        pytest.skip("Horovod is not installed")
    text = Path(spec.origin).read_text(encoding="utf-8")  # horovodrun's parser, as --help prints it
    found = {}
    for option in ("fusion-threshold-mb", "cycle-time-ms"):
        block = re.search(rf"add_argument\('--{option}'(.*?)\)\n", text, re.S)
        m = re.search(r"\(default: ([\d.]+)", block.group(1)) if block else None
        if m:
            found[option.replace("-", "_")] = float(m.group(1))
    assert set(found) == {"fusion_threshold_mb", "cycle_time_ms"}, found
    return found


def misquoted_horovod_defaults(text: str, defaults: dict) -> list[str]:
    """Sentences that quote Horovod's fusion buffer or cycle time as a default other than the installed one's
    (a sentence that names the documentation quotes the documentation's 64 MB on purpose)."""
    mib, ms = defaults["fusion_threshold_mb"], defaults["cycle_time_ms"]
    bad = []
    for sentence in re.split(r"(?<=[.;])\s+", " ".join(text.split())):
        if "documentation" in sentence.lower():
            continue
        if re.search(r"fusion|FUSION_THRESHOLD", sentence):
            for size in re.findall(r"(\d+(?:\.\d+)?)\s*(?:MB|MiB)\b", sentence):
                if float(size) != mib:
                    bad.append(sentence)
            for product in re.findall(r"(\d+)\s*x\s*1024\s*x\s*1024", sentence):
                if float(product) != mib:
                    bad.append(sentence)
        if re.search(r"CYCLE_TIME|cycle time", sentence):
            for value in re.findall(r"(\d+(?:\.\d+)?)\s*ms by default|"
                                    r"default(?:s)?(?: of| is|:)?\s*(\d+(?:\.\d+)?)\s*ms", sentence):
                number = next(v for v in value if v)
                if float(number) != ms:
                    bad.append(sentence)
    return bad


def test_horovods_defaults_in_the_text_are_the_installed_horovods():
    from labkit.scale import allreduce
    defaults = horovod_defaults()
    assert allreduce.FUSION_THRESHOLD == defaults["fusion_threshold_mb"] * 1024 * 1024
    bad = [f"{p.name} cell {i}: {s}" for p in NOTEBOOKS for i, cell in enumerate(cells(p))
           if cell["cell_type"] == "markdown" for s in misquoted_horovod_defaults(source(cell), defaults)]
    assert not bad, "Horovod's defaults quoted wrong:\n" + "\n".join(bad)


def test_a_misquoted_horovod_default_is_caught():
    defaults = {"fusion_threshold_mb": 128.0, "cycle_time_ms": 1.0}
    assert misquoted_horovod_defaults("Tensor fusion packs gradients into one 64 MB buffer.", defaults)
    assert misquoted_horovod_defaults("Horovod wakes every HOROVOD_CYCLE_TIME (5 ms by default).", defaults)
    assert not misquoted_horovod_defaults("Its fusion buffer holds 128 MiB; its documentation still says 64 MB. "
                                          "It wakes every HOROVOD_CYCLE_TIME (1 ms by default).", defaults)


def test_the_readme_counts_the_exercises_the_notebooks_hold():
    import nbformat

    from labkit.exercises import build
    held = sum(len(build.exercises(nbformat.read(str(p), as_version=4), p.stem)) for p in NOTEBOOKS
               if p.stem[:2] in ("01", "02", "03", "04", "05", "06"))
    said = re.search(r"Notebooks 01-06 hold (\d+) exercises", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert said and int(said.group(1)) == held, (said and said.group(0), held)
