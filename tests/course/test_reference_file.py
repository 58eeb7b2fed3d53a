"""Reference numbers are never typed: notebooks/results/reference.json is what the committed notebooks give, the
observations read their reference figures from it, and a "reference machine" sentence quotes only what it holds."""
import ast
import json
import os
import shutil
import sys

import pytest
from test_prose_numbers import NOTEBOOKS, NUMBER, NUMBERING, _norm, prose, sentences, source

from labkit.base import observe, reference

REFERENCE_SENTENCE = ("reference machine", "reference run")


def typed_references(nb: dict) -> list[str]:
    """'cell N: reference=...' for every observation given a reference figure as a typed string with a digit."""
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("\n".join(line for line in source(cell).splitlines()
                                       if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "reference" and isinstance(node.value, ast.Constant) \
                    and any(ch.isdigit() for ch in str(node.value.value)):
                bad.append(f"cell {i}: reference={node.value.value!r}")
    return bad


def file_numbers(doc: dict, notebook: str) -> set[str]:
    """The numbers the reference file holds for one notebook: its machine's and that notebook's figures."""
    texts = [str(v) for v in doc.get("machine", {}).values()]
    texts += [str(v) for v in doc["figures"].get(notebook, {}).values()]
    return {_norm(m.group(0)) for t in texts for m in NUMBER.finditer(t)}


def unheld_reference_numbers(nb: dict, stem: str, doc: dict) -> list[str]:
    """'cell N: number in «sentence»' for a number in a "reference machine" sentence the reference file lacks."""
    held, bad = file_numbers(doc, stem), []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for sentence in sentences(prose(source(cell))):
            if not any(words in sentence.lower() for words in REFERENCE_SENTENCE):
                continue
            for m in NUMBER.finditer(sentence):
                if _norm(m.group(0)) not in held and not NUMBERING.search(sentence[:m.start()]):
                    bad.append(f"cell {i}: {m.group(0)} in «{' '.join(sentence.split())[:160]}»")
    return bad


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_reference_file_is_what_the_committed_notebooks_give():
    """Generated, not typed: the refresh's builder on the committed notebooks gives the committed file."""
    assert reference.PATH.is_file(), "notebooks/results/reference.json is missing: refresh_notebooks.write_reference"
    assert reference.load(reference.PATH) == reference.from_notebooks(NOTEBOOKS), \
        "notebooks/results/reference.json differs from the committed notebooks: rebuild it with the refresh's builder"
    assert set(reference.load(reference.PATH)["machine"]) == set(reference.MACHINE_KEYS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_reference_figure_is_typed_in_a_notebook(path):
    assert not typed_references(_load(path)), f"{path.name}: reference figures come from the reference file"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_reference_machine_sentence_quotes_only_the_reference_file(path):
    bad = unheld_reference_numbers(_load(path), path.stem, reference.load(reference.PATH))
    assert not bad, f"{path.name}: numbers said of the reference machine that the reference file does not hold:\n" + \
        "\n".join(bad)


def test_planted_drift_in_the_notebook_or_the_run_fails(tmp_path):
    """A typed figure, a sentence quoting a figure the file lacks, and a refreshed output the file missed all fail."""
    md = {"cell_type": "markdown", "source": "On the reference machine (2 cores) two workers gain 1.51x."}
    code = {"cell_type": "code",
            "source": 'observe.observation(a > b, "two workers gain", here="x", reference="1.51x")'}
    nb = {"cells": [md, code], "metadata": {}}
    assert typed_references(nb) == ["cell 1: reference='1.51x'"]
    doc = {"machine": {"cores": 2}, "figures": {"nb": {"two workers gain": "1.51x one worker"}}}
    assert unheld_reference_numbers(nb, "nb", doc) == []
    doc["figures"]["nb"]["two workers gain"] = "1.80x one worker"  # the next run moved the number
    assert len(unheld_reference_numbers(nb, "nb", doc)) == 1
    # the committed file is the builder's: a notebook whose refreshed metadata or printed machine changed differs
    copies = []
    for p in NOTEBOOKS:
        shutil.copy(p, tmp_path / p.name)
        copies.append(tmp_path / p.name)
    assert reference.from_notebooks(copies) == reference.load(reference.PATH)
    changed = _load(tmp_path / "02_im2col.ipynb")
    changed["metadata"].setdefault("labkit", {}).setdefault("refresh", {})["figures"] = {"two workers gain": "1.80x"}
    (tmp_path / "02_im2col.ipynb").write_text(json.dumps(changed), encoding="utf-8")
    assert reference.from_notebooks(copies) != reference.load(reference.PATH)


def test_an_observation_records_its_figure_and_shows_the_files(tmp_path, monkeypatch, capsys):
    """The refresh's record holds every observation's here; a failed one shows the reference file's figure."""
    record, ref = tmp_path / "figures.jsonl", tmp_path / "reference.json"
    reference.write({"machine": {}, "figures": {"nb": {"two workers gain": "1.51x"}}}, ref)
    monkeypatch.setenv(reference.RECORD_ENV, str(record))
    monkeypatch.setenv(reference.FILE_ENV, str(ref))
    monkeypatch.delenv(observe.STRICT_ENV, raising=False)
    monkeypatch.delenv(observe.LOG_ENV, raising=False)
    observe.observation(True, "it holds", here="0.97 of it")
    observe.observation(False, "two workers gain", here="0.90x", why="a test")
    assert reference.read_record(record) == {"it holds": "0.97 of it", "two workers gain": "0.90x"}
    out = capsys.readouterr().out
    assert "here: 0.90x; the reference machine" in out and out.rstrip().count("\n") == 0, out
    assert out.split("the reference machine", 1)[1].split(")")[1].startswith(": 1.51x"), out


def test_the_refresh_keeps_each_observations_figure_in_the_notebook(tmp_path, monkeypatch):
    """run_notebook puts what the kernel's observations saw into labkit.refresh.figures; from_notebooks reads it."""
    import nbformat
    sys.path.insert(0, str(reference.PATH.parents[2] / "scripts"))
    import refresh_notebooks as refresh
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"display_name": "labkit (Python 3.11)", "language": "python", "name": "labkit"}
    nb.cells = [nbformat.v4.new_code_cell('from labkit.base import observe\n'
                                          'observe.observation(True, "two workers gain", here=f"{3 / 2:.2f}x")')]
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, str(path))
    monkeypatch.delenv(reference.RECORD_ENV, raising=False)
    refresh.run_notebook(path, write=True, timeout=120)
    run = json.loads(path.read_text(encoding="utf-8"))["metadata"]["labkit"]["refresh"]
    assert run["figures"] == {"two workers gain": "1.50x"} and run["date"] == reference.today()
    doc = reference.from_notebooks([path])
    assert doc["figures"] == {"01_x": {"two workers gain": "1.50x"}} and doc["machine"]["date"] == run["date"]
    assert reference.RECORD_ENV not in os.environ
