"""An exercise of the learner edition in a real browser: run it unanswered, type an answer, run the check.

JupyterLab is started as `make lab` starts it (scripts/lab.sh) and driven by Debian's Chromium through Playwright
(the fixtures of tests/course/test_browser.py). The notebook is Exercise 1.2 of 01_cnn_basics as the learner edition
has it, written to a temporary folder inside the served tree and removed afterwards. Signals: the status bar's
"| Idle", then the check cell's output text.
"""
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from test_browser import browser, lab, wait_until  # noqa: F401  (pytest fixtures)

from labkit.exercises import build as exercises

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

TITLE = "Exercise 1.2"


def learner_notebook(folder: Path) -> str:
    """A notebook with `from labkit.exercises import check`, the learner's exercise cell and its check cell."""
    source = nbformat.read(str(ROOT / "notebooks/01_cnn_basics.ipynb"), as_version=4)
    ex = next(e for e in exercises.exercises(source) if e.title.startswith(TITLE))
    built = exercises.learner_edition(source)
    nb = nbformat.v4.new_notebook(metadata=source.metadata)
    nb.cells = [nbformat.v4.new_code_cell("from labkit.exercises import check"), built.cells[ex.cell],
                built.cells[ex.cell + 1]]
    folder.mkdir()
    nbformat.write(nb, str(folder / "exercise.ipynb"))
    return f"{folder.relative_to(ROOT)}/exercise.ipynb"


def test_typing_an_answer_and_checking_it_in_chromium(browser, lab, tmp_path):  # noqa: F811
    base, token = lab
    folder = ROOT / "tests" / f"_learner_{os.urandom(4).hex()}"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        notebook = learner_notebook(folder)
        page.goto(f"{base}/lab/tree/{notebook}?token={token}")
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=90_000)
        panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        cells = panel.locator(".jp-Notebook .jp-Cell")
        exercise, check = cells.nth(1), cells.nth(2)
        output = lambda: " ".join(check.locator(".jp-OutputArea-output").all_inner_texts())  # noqa: E731

        # unanswered: Run All goes through and the check says so
        cells.nth(0).locator(".jp-InputPrompt").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        assert "Not answered yet" in wait_until(output, 120, "the check's 'not answered yet'")

        # the learner replaces the placeholder with an answer and runs the exercise and the check
        def answer(text):
            editor = exercise.locator(".cm-content").first
            editor.click()
            page.keyboard.press("Control+A")  # inside the cell's editor: the cell's text only
            page.keyboard.type(text)
            assert exercise.locator(".cm-content").inner_text().strip() == text
            page.keyboard.press("Shift+Enter")  # runs the exercise, moves to the check cell
            page.keyboard.press("Shift+Enter")

        assert exercises.PLACEHOLDER in exercise.locator(".cm-content").inner_text()
        answer("answer = 16")
        line = wait_until(lambda: "Correct!" in output() and output(), 60, "the check's success line")
        assert "into 16" in line
        answer("answer = 15")  # off by one: a recognised mistake gets its own hint
        hint = wait_until(lambda: "off by one" in output() and output(), 60, "the off-by-one hint")
        assert hint.startswith("Not quite")
        check.screenshot(path=str(tmp_path / "check.png"))
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        raise
    finally:
        page.close()
        shutil.rmtree(folder, ignore_errors=True)
