"""Exercise 4.2's hint defines efficiency in the words 04 defines it with (speedup / n), where the table shows it."""
import json
import re

from helpers import ROOT
from labkit.exercises import check


def _definition() -> str:
    """04's Markdown sentence that defines efficiency: '**efficiency** is speedup / n'."""
    nb = json.loads((ROOT / "notebooks" / "04_horovod_scaling.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        text = " ".join("".join(cell["source"]).split())
        m = re.search(r"\*\*efficiency\*\* is (\S+ / \S+?)[:.,]", text) if cell["cell_type"] == "markdown" else None
        if m:
            return m.group(1)
    raise AssertionError("04_horovod_scaling defines no **efficiency** in its Markdown")


def test_exercise_4_2s_hint_uses_04s_definition_of_efficiency():
    definition = _definition()
    assert definition == "speedup / n", definition
    spec = check.efficiency.spec(images_per_sec_1=120, images_per_sec_n=408, workers=4)
    assert f"efficiency = {definition}" in spec.hint, spec.hint
