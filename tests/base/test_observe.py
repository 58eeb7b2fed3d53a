"""labkit.base.observe: observations print in a learner's kernel and raise in the suite; the load is said."""
import pytest

from labkit.base import observe


def test_an_observation_that_holds_says_nothing(monkeypatch, capsys):
    monkeypatch.setenv(observe.STRICT_ENV, "0")
    assert observe.observation(True, "two workers beat one", "1.5x", "1.51x") is None
    assert capsys.readouterr().out == ""


def test_in_a_learners_kernel_it_prints_one_line_and_never_raises(monkeypatch, capsys):
    monkeypatch.setenv(observe.STRICT_ENV, "0")
    held = observe.observation(False, "two workers beat one", here="0.93x one worker", reference="1.51x",
                               why="1 usable core")
    out = capsys.readouterr().out
    assert held is None and out.count("\n") == 1
    assert "two workers beat one" in out and "0.93x one worker" in out and "1.51x" in out
    assert observe.REFERENCE in out and "Likely why: 1 usable core" in out


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_in_the_suite_it_raises(monkeypatch, value):
    monkeypatch.setenv(observe.STRICT_ENV, value)
    with pytest.raises(AssertionError, match="two workers beat one.*0.93x"):
        observe.observation(False, "two workers beat one", here="0.93x")


def test_the_suite_sets_strict_for_notebook_kernels():
    import os
    assert os.environ.get(observe.STRICT_ENV) == "1", "tests/conftest.py sets it before nbval starts kernels"


def test_likely_reason_names_cores_then_load():
    assert "1 usable core" in observe.likely_reason(cores=1, load=0.0)
    assert "busy (load average 3.0 on 2 cores)" in observe.likely_reason(cores=2, load=3.0)
    assert "different CPU" in observe.likely_reason(cores=2, load=0.2)


def test_conditions_warns_above_the_usable_cores():
    quiet = observe.conditions(cores=2, load=0.4)
    assert quiet.count("\n") == 0 and "load average 0.40 (1 min) on 2 usable cores" in quiet
    busy = observe.conditions(cores=2, load=2.5)
    warn, line = busy.split("\n")
    assert "busy" in warn and "noisy" in warn and line.startswith("load average 2.50 (1 min) on 2 usable cores")
    assert "1 usable core" in observe.conditions(cores=1, load=0.0)
    assert "no load average" in observe.conditions(cores=2, load=float("nan"))


def test_one_core_prints_only_on_one_core(capsys):
    observe.one_core("two workers share the core", "sync", cores=2)
    assert capsys.readouterr().out == ""
    observe.one_core("two workers share the core", "the workers stay in sync", cores=1)
    out = capsys.readouterr().out
    assert "1 core: two workers share the core" in out and "still holds here: the workers stay in sync" in out
    assert "2 or more cores" in out and out.count("\n") == 1


def test_say_if_busy(monkeypatch, capsys):
    from labkit.base import machine, timing
    monkeypatch.setenv("LABKIT_CORES", "2")
    monkeypatch.setattr(timing, "load_average", lambda: 1.4)
    observe.say_if_busy()
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(timing, "load_average", lambda: 1.6)
    observe.say_if_busy()
    assert capsys.readouterr().out.startswith("This machine is busy: load average 1.6 against 2 usable cores.")
    assert machine.cores() == 2


def test_what_is_checked():
    with pytest.raises(ValueError, match="^what must be"):
        observe.observation(False, "")


def test_observations_that_did_not_hold_are_logged_where_asked(monkeypatch, tmp_path, capsys):
    log = tmp_path / "seen.txt"
    monkeypatch.setenv(observe.STRICT_ENV, "0")
    monkeypatch.setenv(observe.LOG_ENV, str(log))
    observe.observation(True, "holds")
    observe.observation(False, "two workers beat one", here="0.9x")
    observe.observation(False, "the loops are slower", here="50x")
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and "two workers beat one" in lines[0] and "the loops are slower" in lines[1]
    assert capsys.readouterr().out.splitlines() == lines


def test_the_log_is_rewritten_under_its_lock(monkeypatch, tmp_path, capsys):
    """Notebooks run side by side (binder_box's shapes) append to one log: each read-and-rewrite holds
    resultsfile's lock, so no writer rewrites the file with another's line missing."""
    from labkit.base import resultsfile
    log = tmp_path / "seen.txt"
    monkeypatch.setenv(observe.STRICT_ENV, "0")
    monkeypatch.setenv(observe.LOG_ENV, str(log))
    held, write = [], resultsfile.write_text

    def write_text(path, text, **kw):
        held.append(resultsfile.lock_path(path).exists())
        return write(path, text, **kw)

    monkeypatch.setattr(resultsfile, "write_text", write_text)
    observe.observation(False, "two workers beat one")
    assert held == [True]
    assert log.read_text().count("\n") == 1 and not resultsfile.lock_path(log).exists()  # let go once written
