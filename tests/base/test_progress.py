"""Progress bars: in a notebook the saved output is the bar's final state, not its first (labkit.base.progress)."""

import pytest

from helpers import notebook_client
from labkit.base import progress


def test_last_line_keeps_only_the_text_after_the_last_carriage_return():
    shown = []
    out = progress.LastLine(shown.append)
    out.write("\rsweep:   0%|   | 0/4")
    out.write("\rsweep:  50%|#  | 2/4\r")
    out.write("\n")  # tqdm's closing newline changes nothing
    assert out.text == "sweep:  50%|#  | 2/4" and shown == ["sweep:   0%|   | 0/4", "sweep:  50%|#  | 2/4"]


def test_bar_with_a_display_ends_at_its_final_state():
    shown, updates = [], []

    class Handle:
        def update(self, obj, raw=False):
            updates.append(obj["text/plain"])

    def display(obj, raw=False, display_id=None):
        assert raw and display_id  # one output, updated in place
        shown.append(obj)
        return Handle()

    b = progress.bar(16, "sweep (2 workers)", "config", initial=6, display=display)
    for _ in range(10):
        b.update(1)
    b.close()
    assert len(shown) == 1
    assert updates[0].startswith("sweep (2 workers):  38%") and "6/16" in updates[0]
    assert "100%" in updates[-1] and "16/16" in updates[-1]


@pytest.mark.slow
def test_a_saved_notebook_keeps_the_final_state(tmp_path):
    """The real thing: nbclient runs a cell in a kernel and stores what the notebook file keeps."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from labkit.base import progress\n"
        "b = progress.bar(5, 'transfer runs', 'run')\n"
        "for _ in range(5):\n    b.update(1)\nb.close()")]
    # the kernel inherits this process's environment, PYTHONPATH included: the labkit under test
    client = notebook_client(nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    texts = [o["data"]["text/plain"] for o in nb.cells[0].outputs if o.get("output_type") == "display_data"]
    assert len(texts) == 1 and "5/5" in texts[0] and "100%" in texts[0], texts
