"""scripts/refresh_notebooks.py: refuses a busy machine, names the cell that failed, records the load and the
cells' timestamps, and saves notebooks as JupyterLab does (so opening one marks nothing modified)."""
import copy
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

sys.path.insert(0, str(ROOT / "scripts"))
import refresh_notebooks as refresh  # noqa: E402


def kernel_language_info() -> dict:
    """What an IPython kernel (the labkit kernel is one, in this interpreter) reports as language_info."""
    from ipykernel.ipkernel import IPythonKernel
    return copy.deepcopy(IPythonKernel.language_info)


def small_notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"display_name": "labkit (Python 3.11)", "language": "python", "name": "labkit"}
    nb.metadata.language_info = {"name": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# a notebook")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


def test_load_gate_refuses_above_a_third_of_a_load_per_core_and_force_says_so():
    assert refresh.load_gate(False, 0.59, 2) is None
    refusal = refresh.load_gate(False, 0.61, 2)
    assert "0.61" in refusal and "0.3 x 2 cores = 0.60" in refusal and "--force" in refusal
    assert refresh.load_gate(True, 3.0, 2).startswith("--force: starting anyway")
    assert refresh.load_gate(False, float("nan"), 2) is None  # no load average on this platform


def test_busy_machine_refused_before_any_notebook_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(refresh, "load_average", lambda: 9.0)
    monkeypatch.setattr(refresh, "run_notebook", lambda *a, **k: pytest.fail("ran a notebook on a busy machine"))
    assert refresh.main([str(small_notebook(tmp_path / "a.ipynb", "1"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "load average 9.00" in err and "--force" in err


GENERIC = "numpy's BLAS (OpenBLAS 0.3.23) runs its generic Prescott kernel on an AVX-512 CPU (...)"


def test_generic_blas_refused_before_any_notebook_runs_unless_allowed_and_then_recorded(monkeypatch, tmp_path,
                                                                                          capsys):
    monkeypatch.setattr(refresh, "load_gate", lambda force, load, cores: None)
    monkeypatch.setattr(refresh, "horovod_build", lambda: "not asked in this test")
    monkeypatch.setattr(refresh, "generic_blas", lambda: GENERIC)
    seen = notes = []

    def run_notebook(*args, record, notes, **kwargs):
        record.update(load_before=0.0, load_after=0.0)
        return seen.append(notes) or (0.0, 0, 0)

    monkeypatch.setattr(refresh, "run_notebook", run_notebook)
    nb = str(small_notebook(tmp_path / "a.ipynb", "1"))
    assert refresh.main([nb]) == 2 and notes == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Prescott" in err and "--allow-generic-blas" in err
    assert refresh.main([nb, "--allow-generic-blas"]) == 0 and notes == [{"generic_blas": GENERIC}]
    assert refresh.main([nb, "--force"]) == 0 and notes[-1] == {"generic_blas": GENERIC}
    monkeypatch.setattr(refresh, "generic_blas", lambda: None)
    assert refresh.main([nb]) == 0 and notes[-1] == {"generic_blas": None}


def test_jupyterlab_format_sets_what_jupyterlab_would_and_is_idempotent():
    nb = nbformat.v4.new_notebook()
    nb.nbformat_minor = 4
    nb.cells = [nbformat.v4.new_code_cell("1")]
    del nb.cells[0]["id"]
    info = kernel_language_info()
    once = nbformat.writes(refresh.jupyterlab_format(nb, info))
    assert nb.nbformat_minor == 5 and nb.cells[0]["id"] and nb.metadata.language_info == info
    assert info["version"] and info["pygments_lexer"] == "ipython3"  # the full record, not just the name
    assert nbformat.writes(refresh.jupyterlab_format(nbformat.reads(once, as_version=4), info)) == once
    with pytest.raises(ValueError, match="language_info must be the kernel's language_info dict"):
        refresh.jupyterlab_format(nb, {"version": "3.11"})


def test_jupyterlab_format_gives_the_bytes_jupyterlab_saved():
    """The oracle: tests/fixtures_jupyterlab/before.ipynb opened in JupyterLab 4.6 (labkit kernel connected), saved
    with Ctrl+S: saved_by_jupyterlab.ipynb. Opened again it showed no modified dot; before.ipynb did."""
    fixtures = ROOT / "tests/fixtures_jupyterlab"
    saved = (fixtures / "saved_by_jupyterlab.ipynb").read_text(encoding="utf-8")
    info = kernel_language_info()
    info["version"] = nbformat.reads(saved, as_version=4).metadata.language_info.version  # that machine's Python
    before = nbformat.read(str(fixtures / "before.ipynb"), as_version=4)
    assert nbformat.writes(refresh.jupyterlab_format(before, info)) + "\n" == saved


@pytest.mark.slow
def test_refresh_runs_records_and_names_the_failing_cell(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(refresh, "load_gate", lambda force, load, cores: None)  # this test's own numbers only
    monkeypatch.setattr(refresh, "generic_blas", lambda: None)
    monkeypatch.setattr(refresh, "horovod_build", lambda: "not asked in this test")
    good = small_notebook(tmp_path / "good.ipynb", "import time\ntime.sleep(0.3)", "print('done')")
    bad = small_notebook(tmp_path / "bad.ipynb", "x = 1", "\n# the workshop-only check\nassert x == 2, 'binds here'")
    bad_before = bad.read_bytes()
    assert refresh.main([str(good), str(bad), "--timeout", "120"]) == 1
    out, err = capsys.readouterr()
    assert "bad.ipynb: cell 2 raised AssertionError: binds here (cell 2: '# the workshop-only check')" in err
    assert bad.read_bytes() == bad_before  # a failed notebook is not written
    nb = nbformat.read(str(good), as_version=4)
    assert nb.metadata.language_info == kernel_language_info()
    run = nb.metadata.labkit.refresh
    assert {"load_before", "load_after", "wall_s", "profile"} <= set(run) and run["wall_s"] >= 0.3
    slept = nb.cells[1].metadata.execution
    assert {"iopub.execute_input", "shell.execute_reply"} <= set(slept)
    from labkit.exercises import schedule
    assert 0.3 <= schedule.cell_seconds(nb.cells[1]) < 5
    assert nb.cells[2].outputs[0].text == "done\n"


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name)
def test_committed_notebook_is_saved_as_jupyterlab_saves_it(path):
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    info = kernel_language_info()
    # the Python patch version is the refreshing machine's: JupyterLab elsewhere writes its own
    info["version"] = nb.metadata.get("language_info", {}).get("version", info["version"])
    assert nbformat.writes(refresh.jupyterlab_format(nb, info)) + "\n" == text


def test_header_names_the_one_horovod_build():
    """The header's Horovod line from the real lookup (the runner test stands it in; a renamed module once broke it)."""
    text = refresh.horovod_build()
    try:
        import horovod
    except ImportError:
        assert text.startswith("none found")
        return
    assert text.startswith(horovod.__version__ + " (controllers: ") and "Gloo" in text


_EDIT_DURING_THE_RUN = """
from pathlib import Path
p = Path("edited.ipynb")  # the kernel runs in the notebook's folder: the instructor saves a fix meanwhile
p.write_text(p.read_text().replace("# a notebook", "# a notebook, typo fixed"))
"""


def test_a_notebook_edited_while_it_ran_keeps_the_edit_and_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(refresh, "load_gate", lambda force, load, cores: None)
    monkeypatch.setattr(refresh, "generic_blas", lambda: None)
    monkeypatch.setattr(refresh, "horovod_build", lambda: "not asked in this test")
    edited = small_notebook(tmp_path / "edited.ipynb", _EDIT_DURING_THE_RUN, "print('ran')")
    other = small_notebook(tmp_path / "other.ipynb", "print('ran')")
    assert refresh.main([str(edited), str(other), "--timeout", "120"]) == 1
    out, err = capsys.readouterr()
    assert "edited.ipynb: changed on disk while it ran" in err and "wrote nothing for it" in err
    kept = nbformat.read(str(edited), as_version=4)
    assert kept.cells[0].source == "# a notebook, typo fixed" and not kept.cells[2].outputs  # the edit, no run
    assert nbformat.read(str(other), as_version=4).cells[1].outputs[0].text == "ran\n"  # the others are written


def _timed_notebook(seconds_committed: float, source: str = "x = 1", profile: str = "workshop"):
    import nbformat
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["execution"] = {"iopub.execute_input": "2026-11-26T21:00:00.000000Z",
                                  "shell.execute_reply": f"2026-11-26T21:00:{seconds_committed:09.6f}Z"}
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell("text")])
    nb.metadata["labkit"] = {"refresh": {"profile": profile}}
    return nb


def test_a_cell_may_take_ten_times_its_committed_run_and_three_minutes_at_least():
    nb = _timed_notebook(30.0)
    assert refresh.cell_timeouts(nb, 1800, "workshop")(nb.cells[0]) == 300
    assert refresh.cell_timeouts(nb, 200, "quick")(nb.cells[0]) == 200  # never above the cap
    assert refresh.cell_timeouts(nb, 1800, "full")(nb.cells[0]) == 1800  # the full profile runs longer
    short = _timed_notebook(0.5)
    assert refresh.cell_timeouts(short, 1800, "workshop")(short.cells[0]) == refresh.STALL_FLOOR_S
    untimed = _timed_notebook(1.0, profile="quick")  # committed from another profile: the cap
    assert refresh.cell_timeouts(untimed, 1800, "workshop")(untimed.cells[0]) == 1800


def test_a_stalled_cell_fails_in_its_bound_naming_the_cell(tmp_path, monkeypatch):
    """A cell that hangs (as once after a widget cell, 899 s) fails in its bound, not the whole --timeout."""
    import nbformat
    monkeypatch.setattr(refresh, "STALL_FLOOR_S", 3)
    path = tmp_path / "stall.ipynb"
    nbformat.write(_timed_notebook(0.1, "import time\ntime.sleep(60)"), path)
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    start = time.perf_counter()
    with pytest.raises(refresh.CellFailed, match="cell 0 raised"):
        refresh.run_notebook(path, write=False, timeout=600)
    assert time.perf_counter() - start < 45


def test_settle_waits_until_the_load_decays_and_no_longer_than_its_limit():
    now = [0.0]
    loads = iter([2.5, 1.8, 1.2, 0.9, 0.7])  # a 2-core machine after 04's launches, every 2 s

    def sleep(s):
        now[0] += s

    waited = refresh.settle(2, load=lambda: next(loads), sleep=sleep, clock=lambda: now[0])
    assert waited == 6.0  # 0.9, the fourth reading, is the first at or below 0.5 x 2 cores: three sleeps
    now[0] = 0.0
    assert refresh.settle(2, load=lambda: 3.0, sleep=sleep, clock=lambda: now[0], limit_s=10) == 10.0
    assert refresh.settle(2, load=lambda: float("nan"), sleep=sleep, clock=lambda: now[0]) == 0.0  # no load average


RUN_AFTER_LOOP_RESET = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import refresh_notebooks as refresh
from jupyter_core.utils import ensure_event_loop
from pathlib import Path
ensure_event_loop()  # an earlier notebook run in this process: jupyter_core keeps its loop
asyncio.run(asyncio.sleep(0))  # then anything that ends with asyncio.set_event_loop(None)
print(refresh.run_notebook(Path(sys.argv[2]), write=False, timeout=120, stall_bounds=False)[0] > 0)
"""


@pytest.mark.slow
def test_a_notebook_runs_after_the_thread_lost_its_current_loop(tmp_path):
    """run_notebook's Ctrl-C handlers go on the loop nbclient runs on (jupyter_core's), not the thread's current one:
    a process that ran a notebook and then asyncio.run (which leaves the thread without a loop) still runs one; with
    asyncio.get_event_loop it raised "There is no current event loop" (seen in the suite, 3 processes)."""
    import subprocess

    from helpers import ENV
    path = small_notebook(tmp_path / "n.ipynb", "1 + 1")
    out = subprocess.run([sys.executable, "-c", RUN_AFTER_LOOP_RESET, str(ROOT / "scripts"), str(path)],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("True"), out.stderr[-2000:]


def test_the_memory_monitor_sees_a_child_s_memory_and_reads_pss_at_most_once_a_second(monkeypatch):
    """PeakRSS: a child that holds 200 MiB is in both peaks; PSS (a walk of every page table, 14 ms for one
    TensorFlow process) is read at most every pss_interval seconds while RSS is read every interval."""
    import signal
    import subprocess

    import psutil

    reads = {"pss": 0, "rss": 0}
    full, plain = psutil.Process.memory_full_info, psutil.Process.memory_info

    def counted(kind, real):
        def read(self):
            reads[kind] += 1
            return real(self)
        return read

    monkeypatch.setattr(psutil.Process, "memory_full_info", counted("pss", full))
    monkeypatch.setattr(psutil.Process, "memory_info", counted("rss", plain))
    child = "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); " \
            "time.sleep(30)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"  # the tree: it and the child
    holder = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == b"1"  # the child's 200 MiB are touched
        monitor = refresh.PeakRSS(holder.pid, interval=0.05, pss_interval=1.0)
        monitor.start()
        time.sleep(2.5)
        monitor.stop()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the child too
        holder.wait()
    assert monitor.peak >= 200 * 2**20 and monitor.peak_pss >= 190 * 2**20, (monitor.peak, monitor.peak_pss)
    samples = reads["pss"] + reads["rss"]  # per process of the tree (the parent and the child)
    assert samples >= 2 * 20, reads  # RSS every 0.05 s
    assert reads["pss"] <= 2 * 3, reads  # PSS at 0, 1 and 2 s
