"""04's exercise cells keep the learner's my_keras_hvd.py: the instructor edition's solution never writes over it."""
from __future__ import annotations

import json
import os

from helpers import ROOT  # noqa: E402


def _cells_that_touch_my_script() -> list[str]:
    nb = json.loads((ROOT / "notebooks/04_horovod_scaling.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"]
             if c["cell_type"] == "code" and "my_keras_hvd" in "".join(c["source"])]
    assert len(cells) == 2 and "### BEGIN SOLUTION" in cells[1]  # the starting copy, then the exercise
    return cells


def _run(folder):
    from labkit.exercises import check_hvd
    namespace = {"check_hvd": check_hvd}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for source in _cells_that_touch_my_script():  # the starting copy, then the exercise with its solution
            exec(compile(source, "04_horovod_scaling", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_the_instructor_edition_keeps_a_learners_edits(tmp_path, capsys):
    mine = tmp_path / "my_keras_hvd.py"
    mine.write_text("# my own conversion, half done\nimport horovod.tensorflow.keras as hvd\n")
    before = mine.read_bytes()
    namespace = _run(tmp_path)
    assert mine.read_bytes() == before
    assert os.path.isfile(namespace["answer"])  # the solution still answers, with the reference elsewhere
    assert "my_keras_hvd.py: 2 lines, yours to edit" in capsys.readouterr().out


def test_a_fresh_folder_gets_the_starting_script_and_its_line_count_is_the_committed_one(tmp_path, capsys):
    from labkit.exercises import check_hvd
    _run(tmp_path)
    assert (tmp_path / "my_keras_hvd.py").read_text() == check_hvd.PLACEHOLDER.read_text()
    printed = capsys.readouterr().out.strip()
    nb = json.loads((ROOT / "notebooks/04_horovod_scaling.ipynb").read_text())
    committed = [o for c in nb["cells"] if "MY_SCRIPT.write_text" in "".join(c["source"]) for o in c["outputs"]]
    assert ["".join(o["text"]).strip() for o in committed] == [printed]
    assert printed == f"my_keras_hvd.py: {len(check_hvd.PLACEHOLDER.read_text().splitlines())} lines, yours to edit"

