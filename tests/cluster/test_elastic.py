"""labkit.cluster.elastic: Horovod Elastic with a node taken away and given back (elastic_train, the worker).

The summary is checked on planted logs whose times lost are computed here by hand. The data order is checked to go
on across world sizes. The real runs (slow): on a 2-node virtual cluster (root, network namespaces: skipped with
the reason elsewhere, or when a cluster is already up), or, where that cannot be built, on two slots of this
machine; both check that training goes on in sync, never from step 0, the world size following the hosts file.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from labkit.cluster import elastic
from labkit.cluster.elastic_train import batch_indices, parse_args


def _steps(gen, size, steps, t0, dt, checksum="c", ranks=None):
    """Log lines of `size` workers doing `steps` in world `gen`, one every dt seconds from t0."""
    rows = []
    for k, s in enumerate(steps):
        for r in (ranks if ranks is not None else range(size)):
            rows.append({"t": t0 + k * dt + 0.001 * r, "host": f"n{r}", "pid": 100 + r, "step": s, "size": size,
                         "rank": r, "generation": gen, "loss": 1.0, "checksum": f"{checksum}{s}"})
    return rows


def _sync(gen, size, step, t, checksum="s"):
    return [{"t": t, "host": f"n{r}", "pid": 100 + r, "event": "sync", "step": step, "size": size, "rank": r,
             "generation": gen, "checksum": f"{checksum}{gen}"} for r in range(size)]


def _planted():
    """2 workers: steps 1-20 every 0.1 s; node taken away (t=2.5), 1 worker goes on from step 20 every 0.05 s after
    a 2 s gap; node lost... given back (t=4.0): 2 workers again from step 35 (the last commit; 40 was reached) after
    a 5 s gap, every 0.1 s."""
    rows = _sync(1, 2, 0, 0.0) + _steps(1, 2, range(1, 21), 0.1, 0.1)  # step 20 done at 2.0 + 0.001
    rows += _sync(2, 1, 20, 3.9) + _steps(2, 1, range(21, 41), 4.001, 0.05)  # step 40 at 4.951
    rows += _sync(3, 2, 35, 9.5) + _steps(3, 2, range(36, 61), 9.951, 0.1)
    actions = [{"t": 2.5, "action": "remove", "node": "n1"}, {"t": 4.5, "action": "add", "node": "n1"},
               {"t": 12.0, "action": "stop", "node": "n1"}]
    return rows, actions


def test_time_lost_is_the_gap_less_one_steady_step_of_the_new_world():
    rows, actions = _planted()
    s = elastic.summarize(rows, actions)
    first, second = s["changes"]
    assert (first["size_before"], first["size_after"], first["action"]) == (2, 1, "remove")
    assert first["gap_s"] == pytest.approx(4.001 - 2.001)
    assert first["steady_step_s"] == pytest.approx(0.05)
    assert first["time_lost_s"] == pytest.approx(2.0 - 0.05)
    assert (first["continued_from_step"], first["steps_redone"]) == (20, 0)
    assert (second["size_before"], second["size_after"], second["action"]) == (1, 2, "add")
    assert second["gap_s"] == pytest.approx(9.951 + 0.001 - 4.951)  # the step is done when its last worker is
    assert second["time_lost_s"] == pytest.approx(5.001 - 0.1)
    assert (second["last_step_before"], second["continued_from_step"], second["steps_redone"]) == (40, 35, 5)
    assert second["action_to_first_step_s"] == pytest.approx(9.952 - 4.5)
    assert s["time_lost_s"] == pytest.approx(1.95 + 4.901, abs=1e-3)
    assert s["steady_step_s"] == {"1": pytest.approx(0.05), "2": pytest.approx(0.1)}
    assert s["steps"] == 60 and s["never_from_zero"] and s["resets"] == 2
    assert s["in_sync_every_step"] and s["in_sync_after_every_reset"] and s["steps_missing_a_worker"] == 0
    # world size over time follows the changes
    sizes = s["timeline"]["size"]
    assert sizes[0] == 2 and sizes[20] == 1 and sizes[40] == 2 and len(sizes) == 20 + 20 + 25


def test_a_rank_out_of_step_or_a_world_started_over_is_reported():
    rows, actions = _planted()
    rows[5]["checksum"] = "other"  # one worker's weights differ at one step
    rows.append({**_sync(3, 2, 35, 9.5)[1], "checksum": "x"})  # and one worker's after a reset
    rows += _sync(4, 2, 0, 20.0) + _steps(4, 2, range(1, 5), 20.5, 0.1)  # the run started again from step 0
    s = elastic.summarize(rows, actions)
    assert not s["in_sync_every_step"] and not s["in_sync_after_every_reset"]
    assert not s["never_from_zero"] and s["changes"][-1]["continued_from_step"] == 0


def test_a_step_the_lost_worker_did_not_log_is_counted_not_called_out_of_sync():
    rows, actions = _planted()
    rows = [r for r in rows if not (r.get("step") == 20 and r["rank"] == 1 and "event" not in r)]
    s = elastic.summarize(rows, actions)
    assert s["in_sync_every_step"] and s["steps_missing_a_worker"] == 1


def test_summary_without_steps_is_refused():
    with pytest.raises(ValueError, match="rows must hold the workers' step lines"):
        elastic.summarize(_sync(1, 2, 0, 0.0))


def test_the_data_order_goes_on_across_world_sizes():
    order = np.arange(100, 110)  # 10 examples
    two = [batch_indices(0, r, 2, 3, order) for r in range(2)]
    assert [list(b) for b in two] == [[100, 101, 102], [103, 104, 105]]
    # one worker left: the world has consumed 6 examples; it goes on with the next 3, then wraps around
    assert list(batch_indices(6, 0, 1, 3, order)) == [106, 107, 108]
    assert list(batch_indices(9, 0, 1, 3, order)) == [109, 100, 101]
    with pytest.raises(ValueError, match="rank"):
        batch_indices(0, 2, 2, 3, order)


@pytest.mark.parametrize("kw, word", [({"nodes": 1}, "nodes"), ({"actions": ("add",)}, "actions"),
                                      ({"actions": ("remove", "kill")}, "actions"), ({"actions": ("drop",)}, "actions"),
                                      ({"steps_per_phase": 10, "commit_every": 10}, "steps_per_phase"),
                                      ({"lr": 0}, "lr")])
def test_bad_settings_are_refused_in_one_line(kw, word):
    with pytest.raises(ValueError, match=word) as err:
        elastic.ElasticSettings(**kw).check()
    assert "\n" not in str(err.value)


def test_a_kill_on_one_machine_is_refused_before_any_launch(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("launched before the check"))
    with pytest.raises(ValueError, match="'kill' needs the virtual cluster"):
        elastic.run(elastic.ElasticSettings(nodes=2, actions=("kill", "add")), local=True, progress=None)


@pytest.mark.parametrize("argv, word", [(["--out", "x", "--steps", "0"], "--steps"),
                                        (["--out", "x", "--commit-every", "0"], "--commit-every"),
                                        (["--out", "x", "--lr", "-1"], "--lr")])
def test_the_worker_refuses_bad_options_in_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as err:
        parse_args(argv)
    assert err.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and word in lines[0]


def test_the_logs_are_read_a_whole_line_at_a_time(tmp_path):
    logs = elastic._Logs(tmp_path)
    path = tmp_path / "worker-n1-7.jsonl"
    path.write_text('{"step": 1}\n{"ste')
    assert logs.read() == [{"step": 1}]
    with open(path, "a") as f:
        f.write('p": 2}\n')
    assert logs.read() == [{"step": 1}, {"step": 2}]


def _temp_folders() -> set:
    return set(Path(tempfile.gettempdir()).glob("labkit-elastic-*"))


@pytest.mark.parametrize("how", ["timeout", "ctrl-c"])
def test_every_process_and_temp_file_is_gone_after_a_timeout_or_ctrl_c(how, monkeypatch):
    """A stand-in for horovodrun that starts a child and sleeps: both are stopped, the folder removed."""
    import psutil
    before = _temp_folders()
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); " \
           "time.sleep(120)"
    monkeypatch.setattr(elastic, "_command", lambda *a: [sys.executable, "-c", code])
    started = []
    real_popen = subprocess.Popen

    def popen(*a, **k):
        started.append(real_popen(*a, **k))
        return started[-1]
    monkeypatch.setattr(subprocess, "Popen", popen)
    calls = []

    def interrupted(rows):
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return []
    if how == "ctrl-c":
        monkeypatch.setattr(elastic, "world_steps", interrupted)
    settings = elastic.ElasticSettings(nodes=2, actions=("remove", "add"), timeout=1.5)
    with pytest.raises(KeyboardInterrupt if how == "ctrl-c" else TimeoutError):
        elastic.run(settings, local=True, progress=None)
    launcher = started[0]
    assert launcher.poll() is not None
    assert not [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(120)" in " ".join(p.info["cmdline"] or [])]
    assert _temp_folders() <= before


def test_module_imports_without_tensorflow():
    code = "import sys, labkit.cluster.elastic, labkit.cluster.elastic_train; print('tensorflow' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "False", res


def test_the_committed_measurement_tells_the_lesson():
    res = elastic.load_results()
    assert res["in_sync_every_step"] and res["in_sync_after_every_reset"] and res["never_from_zero"]
    kinds = [c["action"] for c in res["changes"]]
    assert kinds[:2] == [res["settings"]["actions"][0], "add"]
    n = res["settings"]["nodes"]
    assert [(c["size_before"], c["size_after"]) for c in res["changes"]][:2] == [(n, n - 1), (n - 1, n)]
    assert elastic.table(res)["time lost (s)"].tolist() == [c["time_lost_s"] for c in res["changes"]]
    assert json.loads(json.dumps(res)) == res


def _check_run(res, n):
    """What any elastic run with one node taken away and given back must show."""
    assert [(c["size_before"], c["size_after"]) for c in res["changes"]] == [(n, n - 1), (n - 1, n)], res["changes"]
    assert res["never_from_zero"] and all(c["continued_from_step"] >= c["last_step_before"] - res["settings"]
                                          ["commit_every"] for c in res["changes"])
    assert res["changes"][0]["steps_redone"] == 0  # taken away at a commit: nothing is trained twice
    assert res["in_sync_every_step"] and res["in_sync_after_every_reset"]
    sizes = res["timeline"]["size"]
    assert sizes[0] == n and sizes[-1] == n and min(sizes) == n - 1
    assert all(c["time_lost_s"] > -0.5 for c in res["changes"])


def _cluster_problem():
    from labkit.deepdive import vcluster
    reason = vcluster.why_not()
    if reason:
        return reason
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if "labkit-node" in netns or vcluster.STATE_DIR.exists():
        return "a virtual cluster (or part of one) is already up here; scripts/vcluster.sh down first"
    return None


@pytest.mark.slow
@pytest.mark.horovod
def test_a_node_taken_away_and_given_back_on_the_virtual_cluster():
    reason = _cluster_problem()
    if reason:
        pytest.skip(reason)
    from labkit.deepdive import vcluster
    before = _temp_folders()
    try:
        vcluster.up(2, "1gbit")
        settings = elastic.ElasticSettings(nodes=2, actions=("remove", "add"), steps_per_phase=60, timeout=150)
        res = elastic.run(settings, progress=None)
    finally:
        vcluster.down()
    _check_run(res, 2)
    assert _temp_folders() <= before


@pytest.mark.slow
@pytest.mark.horovod
def test_a_worker_taken_away_and_given_back_on_this_machine():
    """Where the virtual cluster can be built its test above runs instead: the same run, with a network."""
    if _cluster_problem() is None:
        pytest.skip("the virtual cluster can be built here: its test runs this")
    from labkit.scale import launch
    if launch.horovodrun_path() is None:
        pytest.skip("horovodrun not installed")
    before = _temp_folders()
    settings = elastic.ElasticSettings(nodes=2, actions=("remove", "add"), steps_per_phase=40, timeout=150)
    _check_run(elastic.run(settings, local=True, progress=None), 2)
    assert _temp_folders() <= before


def test_a_lost_node_kills_only_this_runs_live_worker_on_it():
    """The pids come from the logs (one may be gone, or reused by now): only a process with the run's marker dies."""
    from labkit.scale import launch
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleep, env={**launch.child_env(), launch.MARKER_ENV: "run-a"})
    other_run = subprocess.Popen(sleep, env={**launch.child_env(), launch.MARKER_ENV: "run-b"})
    elsewhere = subprocess.Popen(sleep, env={**launch.child_env(), launch.MARKER_ENV: "run-a"})
    try:
        rows = [{"host": "labkit-node3", "pid": ours.pid}, {"host": "labkit-node3", "pid": other_run.pid},
                {"host": "labkit-node1", "pid": elsewhere.pid}, {"host": "labkit-node3", "pid": 2 ** 22 + 7}]
        assert elastic._kill_node_workers(rows, "labkit-node3", "run-a") == 1
        assert ours.wait(timeout=10) == -9
        assert other_run.poll() is None and elsewhere.poll() is None
    finally:
        for p in (ours, other_run, elsewhere):
            p.kill()
            p.wait()


@pytest.mark.parametrize("argv, expected", [(["--actions", "drop"], "elastic: actions must be a sequence of remove, "
                                                                     "kill, add; got ('drop',)"),
                                            (["--nodes", "1"], "elastic: nodes must be")])
def test_the_command_refuses_bad_input_in_one_line_before_any_cluster(argv, expected, tmp_path):
    res = subprocess.run([sys.executable, "-m", "labkit.cluster.elastic", *argv, "--out", str(tmp_path / "e.json")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith(expected) and res.stderr.count("\n") == 1, res
