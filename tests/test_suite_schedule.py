"""tests/conftest.py's schedule: the Binder box's units wait for the other test process by its state file, and go
one to each test process."""
import os
from types import SimpleNamespace

import pytest

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


def test_two_boxes_side_by_side_get_cpus_of_their_own(tmp_path):
    (gw0, claim0), (gw2, _) = conftest.claim_cpu(tmp_path, 2), conftest.claim_cpu(tmp_path, 2)
    assert (gw0, gw2) == (0, 1)  # not both CPU 0, as the worker's index modulo the CPUs gave gw0 and gw2
    assert conftest.claim_cpu(tmp_path, 2) == (0, None)  # a third: every CPU held
    claim0.unlink()  # gw0's box ended: its CPU is free again
    assert conftest.claim_cpu(tmp_path, 2)[0] == 0
    (tmp_path / "gw1").write_text(f"{os.getpid()}")  # a claim is not a test process's state file
    assert [f.name for f in tmp_path.iterdir() if f.suffix != ".claim"] == ["gw1"]


def test_every_box_notebook_run_has_its_unit_and_the_busy_one_goes_last():
    units = set(conftest.SOLO_CORE_UNITS.values())
    assert len(units) == 2 and all(conftest._unit(t) in units for t in conftest.SOLO_CORE_UNITS)
    assert conftest._LAST[conftest.SOLO_UNIT] > max(conftest._LAST[u] for u in units)


def test_units_with_a_slow_test_go_out_before_the_others_and_the_boxes_last():
    slow = {conftest.SERIAL_UNIT, conftest.FULL_SMOKE, "notebooks/05_network_sweep.ipynb", "tests/scale/test_launch.py",
            *conftest.SOLO_CORE_UNITS.values(), conftest.SOLO_UNIT}
    units = ["tests/base/test_checks.py", "tests/scale/test_launch.py", conftest.SOLO_UNIT, "tests/a_test.py",
             "notebooks/05_network_sweep.ipynb", *sorted(set(conftest.SOLO_CORE_UNITS.values())), conftest.FULL_SMOKE,
             conftest.SERIAL_UNIT]
    order = sorted(units, key=lambda unit: conftest._send_order(unit, slow))
    assert order == [conftest.SERIAL_UNIT, conftest.FULL_SMOKE, "notebooks/05_network_sweep.ipynb",
                     "tests/scale/test_launch.py", "tests/a_test.py", "tests/base/test_checks.py",
                     *sorted(set(conftest.SOLO_CORE_UNITS.values())), conftest.SOLO_UNIT]


def test_a_notebook_run_and_a_test_marked_slow_are_slow():
    marked = SimpleNamespace(nodeid="tests/x.py::t", get_closest_marker=lambda name: name == "slow" or None)
    plain = SimpleNamespace(nodeid="tests/x.py::t", get_closest_marker=lambda name: None)
    cell = SimpleNamespace(nodeid="notebooks/01_cnn_basics.ipynb::Cell 0", get_closest_marker=lambda name: None)
    assert conftest._is_slow(marked) and conftest._is_slow(cell) and not conftest._is_slow(plain)


def test_the_full_profiles_notebook_runs_leave_the_serial_unit_but_its_slurm_templates_stay():
    smoke = conftest.FULL_SMOKE
    assert conftest._unit(f"{smoke}::test_notebook_runs_in_full_profile_at_smoke_scale[x]") == smoke
    assert conftest._unit(f"{smoke}::test_single_node_template_in_full_profile_at_smoke_scale") == conftest.SERIAL_UNIT
    assert conftest._unit("tests/course/test_slurm.py::test_x") == conftest.SERIAL_UNIT


class _Node:
    """A test process as xdist's scheduler sees it: what it was sent, whether it was told to stop."""

    def __init__(self, name):
        self.gateway, self.shutting_down, self.sent = SimpleNamespace(id=name), False, []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def test_the_two_box_units_go_one_to_each_process(monkeypatch):
    """The process that takes the first 1-CPU box unit is handed the busy box next, not the second 1-CPU box unit:
    that one goes to the other process when it is through its own tests, so the two boxes run side by side."""
    pytest.importorskip("xdist")
    import xdist.scheduler.loadscope as loadscope
    monkeypatch.setattr(loadscope, "parse_tx_spec_config", lambda config: ["popen", "popen"])
    box = conftest.BOX_FILE + "::test_notebook_runs_through_on_one_cpu[{}]"
    tests = ["tests/a_test.py::one", "tests/a_test.py::two", "tests/b_test.py::one", "tests/b_test.py::two",
             "tests/b_test.py::three", *(box.format(nb) for nb in ("01_cnn_basics.ipynb", "05_network_sweep.ipynb",
                                                                   "04_horovod_scaling.ipynb",
                                                                   "07_scaling_deep_dive.ipynb")),
             next(iter(conftest.SOLO_TESTS))]
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=False))
    sched = conftest.by_file_scheduler()(config, None)
    first, second = _Node("gw0"), _Node("gw1")
    for node in (first, second):
        sched.add_node(node)
        sched.add_node_collection(node, tests)
    sched.schedule()
    for index in (0, 1):  # the first process is through its file; the second still runs its own
        sched.mark_test_complete(first, index)
    got = {node: [tests[i] for i in node.sent] for node in (first, second)}
    assert got[first] == [*tests[:2], *tests[5:7], tests[9]] and got[second] == tests[2:5], got
    for index in (2, 3):
        sched.mark_test_complete(second, index)
    assert [tests[i] for i in second.sent[3:]] == tests[7:9]
