"""tests/conftest.py's schedule: the Binder box's units wait for the other test process by its state file."""
import os

import conftest


def _state(tmp_path, text):
    f = tmp_path / "gw1"
    f.write_text(text)
    return f


def test_a_box_unit_waits_for_a_process_that_runs_other_tests(tmp_path):
    busy = _state(tmp_path, f"{os.getpid()}")  # a live process running ordinary tests
    assert conftest._in_the_way(busy, alone=False) and conftest._in_the_way(busy, alone=True)
    beside = _state(tmp_path, f"{os.getpid()} solo")  # it runs a box unit too: a 1-CPU box may run beside it
    assert not conftest._in_the_way(beside, alone=False) and conftest._in_the_way(beside, alone=True)
    gone = _state(tmp_path, "999999999 solo")  # its process is gone: in no one's way
    assert not conftest._in_the_way(gone, alone=True)


def test_every_box_notebook_run_has_its_unit_and_the_busy_one_goes_last():
    units = set(conftest.SOLO_CORE_UNITS.values())
    assert len(units) == 2 and all(conftest._unit(t) in units for t in conftest.SOLO_CORE_UNITS)
    assert conftest._LAST[conftest.SOLO_UNIT] > max(conftest._LAST[u] for u in units)


def test_the_full_profiles_notebook_runs_leave_the_serial_unit_but_its_slurm_templates_stay():
    smoke = conftest.FULL_SMOKE
    assert conftest._unit(f"{smoke}::test_notebook_runs_in_full_profile_at_smoke_scale[x]") == smoke
    assert conftest._unit(f"{smoke}::test_single_node_template_in_full_profile_at_smoke_scale") == conftest.SERIAL_UNIT
    assert conftest._unit("tests/course/test_slurm.py::test_x") == conftest.SERIAL_UNIT
