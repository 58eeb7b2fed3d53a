"""What a learner sees of the notebooks: no test scaffolding, and every collapsed check says what it checks.

nbval reads its markers from cell tags (nbval-check-output, nbval-ignore-output), so no `# NBVAL_*` line
belongs in a cell; a collapsed (source_hidden) code cell still shows in full on GitHub and nbviewer, so its
first line is a comment that says in words what the cell checks or sets.
"""
import json
import re

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
                    code("# Check: the im2col result equals tf.nn.conv2d to float32 tolerance\nassert x", collapsed=True))
    assert nbval_lines(good) == [] and unsaid_checks(good) == []
