"""The course in a real browser: JupyterLab started by the open-the-course command, driven by headless Chromium.

scripts/lab.sh starts JupyterLab (127.0.0.1, token) exactly as `make lab` does; Playwright drives Debian's
Chromium (no browser download) to open a notebook with an ipywidgets explorer, run it from the top through
the explorer's cell (Run > Run All Above Selected Cell, then that cell), move a slider, and read from the
page that the explorer's output changed. A screenshot of the explorer lands in the test's tmp dir.

The notebook is the first course notebook with an explorer (01_cnn_basics, 02_im2col), else a small fixture
(tests/fixtures_browser/explorer.ipynb); LABKIT_BROWSER_NOTEBOOK=path picks another. Skips only where
Chromium or Playwright is not installed, and says which; an installed Chromium or JupyterLab that does not start
is a failure that names it and ends with the tail of its log.
"""
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import failure, fake_executable, http_get, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

# course notebooks with an explorer, preferred in this order: the cells above 01's explorer only load
# data, while 02's explorer comes after its benchmarks
COURSE_NOTEBOOKS = ["notebooks/01_cnn_basics.ipynb", "notebooks/02_im2col.ipynb"]
FIXTURE = "tests/fixtures_browser/explorer.ipynb"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_S = float(os.environ.get("LABKIT_BROWSER_RUN_TIMEOUT", 240))
NEWS = "text=Would you like to get notified about official Jupyter news?"
FIRST = "notebooks/00_welcome.ipynb"  # the notebook `make lab` opens

# The explorer's visible state: every slider's readout, the output text and a digest of every image.
SNAPSHOT_JS = """(cell) => {
  const out = cell.querySelector('.jp-Cell-outputArea');
  if (!out) return null;
  const readouts = [...out.querySelectorAll('.widget-readout')].map(e => e.textContent || e.value || '');
  const text = [...out.querySelectorAll('.jp-OutputArea-output')]
      .filter(e => !e.querySelector('.widget-slider')).map(e => e.innerText).join('\\n');
  const images = [...out.querySelectorAll('img')].map(i => i.src.length + ':' + i.src.slice(-64));
  return JSON.stringify({readouts, text, images});
}"""


def explorer_cell(path: Path):
    """Index (among all cells) of the first code cell that builds an ipywidgets explorer, or None."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "explorer(" in "".join(cell["source"]):
            return i
    return None


def pick_notebook():
    """(path relative to the repo, index of its explorer cell): a course notebook if one has an explorer."""
    chosen = os.environ.get("LABKIT_BROWSER_NOTEBOOK")
    for rel in [chosen] if chosen else COURSE_NOTEBOOKS + [FIXTURE]:
        index = explorer_cell(ROOT / rel)
        if index is not None:
            return rel, index
    raise AssertionError(f"{chosen or FIXTURE} has no explorer cell (a code cell calling ...explorer(...))")


def chromium_path() -> str | None:
    explicit = os.environ.get("LABKIT_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def http_json(url, token):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def launch_chromium(pw, exe: str):
    """pw.chromium started headless from exe; an installed browser that does not start fails the test."""
    try:
        return pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
    except Exception as err:  # noqa: BLE001  (Playwright raises its own Error type)
        # Playwright's message ends with the browser's own output ("Browser logs: ...")
        tail = "\n".join(str(err).strip().splitlines()[-15:])
        pytest.fail(f"Chromium at {exe} is installed but did not start; its log's tail:\n{tail}", pytrace=False)


def installed_chromium() -> str:
    """chromium_path(), or a skip that says Chromium is not installed."""
    exe = chromium_path()
    if exe is None:
        pytest.skip("Chromium is not installed (scripts/system-deps.sh installs Debian's chromium as root)")
    return exe


@pytest.fixture
def browser():
    """Headless Debian Chromium under Playwright; skips (with the reason) where either is not installed."""
    exe = installed_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright's Python package is not installed (pip install playwright; "
                    "it drives the system Chromium, no browser download)")
    with sync_playwright() as pw:
        chromium = launch_chromium(pw, exe)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def lab(isolated_home):
    """`scripts/lab.sh --port N --no-browser` with a known token; yields (base URL, token)."""
    token = "labkit-browser-" + os.urandom(8).hex()
    # In the temporary settings dir only: no autosave (the test runs a committed notebook and must not write
    # its outputs back into the repository), no cell windowing. The news pop-up is left to the course's own
    # settings (scripts/jupyter/labconfig), which the tests check.
    settings = isolated_home / ".jupyter/lab/user-settings/@jupyterlab"
    for plugin, value in [("docmanager-extension/plugin", {"autosave": False}),
                          ("notebook-extension/tracker", {"windowingMode": "none"})]:  # every cell in the DOM
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)  # tests run with Agg; a learner's kernel draws inline figures
    with running_lab(isolated_home, token, env=env) as (_, base):
        autosave = http_json(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
        assert autosave["settings"]["autosave"] is False, "autosave is on: the test would write into notebooks/"
        yield base, token


def wait_until(fn, timeout, what, poll=0.25):
    deadline = time.time() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def test_explorer_runs_and_reacts_to_its_slider_in_chromium(browser, lab, tmp_path):
    base, token = lab
    notebook, index = pick_notebook()
    assert http_get(f"{base}/api/contents/{notebook}")[0] == 403  # no token, no notebook
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    shot = tmp_path / "explorer.png"
    try:
        page.goto(f"{base}/lab/tree/{notebook}?token={token}")
        # a kernel is attached and idle: only then does Run run anything (else: a kernel dialog)
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=90_000)
        panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        cell = panel.locator(".jp-Notebook .jp-Cell").nth(index)
        cell.scroll_into_view_if_needed()
        cell.locator(".jp-InputPrompt").first.click()
        for item in ("Run All Above Selected Cell", "Run Selected Cell and Do not Advance"):
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text=item).first.click()

        # every code cell up to the explorer's has run: numbered prompts, none pending, the kernel idle
        def all_ran():
            prompts = panel.locator(".jp-Notebook .jp-Cell").evaluate_all(
                f"(cells) => cells.slice(0, {index + 1}).filter(c => c.classList.contains('jp-CodeCell')"
                # a collapsed cell (checks, settings) shows a placeholder whose prompt keeps no count; the visible
                # cells after it use what it defines, so their prompts say it ran
                " && !c.querySelector('.jp-InputPlaceholder'))"
                ".map(c => c.querySelector('.jp-InputPrompt').textContent.trim())")
            return (prompts and all(p not in ("[ ]:", "[*]:", "") for p in prompts)
                    and page.locator(".jp-StatusBar-Widget", has_text="| Idle").count() > 0)
        wait_until(all_ran, RUN_TIMEOUT_S, f"cells 0..{index} of {notebook} to run")
        tracebacks = panel.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
                                   ' pre:has-text("Traceback"), .jp-RenderedText[data-mime-type='
                                   '"application/vnd.jupyter.error"]')
        assert tracebacks.count() == 0, f"{notebook} raised:\n" + "\n".join(tracebacks.all_inner_texts())

        # the explorer rendered: a live slider in a cell's output (not the "Loading widget..." text)
        slider = cell.locator(".jp-OutputArea .widget-slider").first
        slider.wait_for(timeout=30_000)
        cell.scroll_into_view_if_needed()
        snap = lambda: cell.evaluate(SNAPSHOT_JS)  # noqa: E731
        # the explorer's first drawing is done when its state stops changing
        previous = [None]

        def settled():
            now = snap()
            same = now == previous[0]
            previous[0] = now
            return same and now
        before = json.loads(wait_until(settled, 30, "the explorer's first output", poll=0.7))
        assert before["readouts"], "the slider shows no value"
        assert before["text"].strip() or before["images"], "the explorer drew nothing"

        handle = slider.locator(".noUi-handle").first
        handle.focus()
        page.keyboard.press("ArrowRight")
        if json.loads(snap())["readouts"] == before["readouts"]:  # already at its maximum
            page.keyboard.press("ArrowLeft")
            page.keyboard.press("ArrowLeft")
        def changed():
            now = json.loads(snap())
            moved = now["readouts"] != before["readouts"]
            redrawn = now["text"] != before["text"] or now["images"] != before["images"]
            return now if moved and redrawn else None
        after = wait_until(changed, 30, "the explorer's output to change after moving the slider")
        assert after["readouts"] != before["readouts"]
        assert after["text"] != before["text"] or after["images"] != before["images"]
        cell.screenshot(path=str(shot))
        # the news pop-up shows within seconds of opening, where the course's settings leave it on
        assert page.locator(NEWS).count() == 0, "JupyterLab's news pop-up is showing"
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        raise
    finally:
        page.close()
    assert shot.stat().st_size > 1000
    assert not errors, f"JavaScript errors on the page: {errors}"


def test_first_notebook_opens_unmodified_and_without_news(browser, lab):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{base}/lab/tree/{FIRST}?token={token}")
        # the kernel connected and idle: JupyterLab has taken its language_info by then
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=90_000)
        time.sleep(2)  # the news pop-up, where it is on, shows within this
        tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text=Path(FIRST).name).first
        assert page.locator(NEWS).count() == 0, "JupyterLab's news pop-up is showing"
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), f"{FIRST} shows the modified dot on opening"
    finally:
        page.close()


# --- starting: absent is a skip, installed but broken is a failure -----------------------------------------


def test_a_chromium_that_exits_is_a_failure_with_its_log(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    exe = fake_executable(tmp_path / "chromium", "chromium: cannot open shared object file here")
    with sync_api.sync_playwright() as pw:
        text = failure(launch_chromium, pw, str(exe))
    assert text.startswith(f"Chromium at {exe} is installed but did not start"), text
    assert "cannot open shared object file here" in text, f"the browser's own words are missing:\n{text}"


def test_absent_chromium_is_a_skip_that_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv("LABKIT_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed"):
        installed_chromium()


def test_a_lab_that_exits_is_a_failure_with_its_log(tmp_path):
    """scripts/lab.sh given an environment whose jupyter exits 1: running_lab fails and shows what it printed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")  # lab.sh claims its port with it
    fake_executable(venv / "bin" / "jupyter", "jupyter-lab: error: the server extension failed here")
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, LABKIT_VENV=str(venv), HOME=str(home))
    def start():
        with running_lab(home, "labkit-test-token", env=env, timeout=30):
            pass
    text = failure(start)
    assert text.startswith("JupyterLab (scripts/lab.sh) exited with 1"), text
    assert "the server extension failed here" in text, text
