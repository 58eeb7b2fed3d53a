"""The sweep's results file: two sweeps on one file keep every record; refusals before any training."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from helpers import ENV, fill, labkit_cli, one_line, small_tmpfs  # noqa: E402
from labkit.sweep import store

# ================================================================ two sweeps at once
_MERGER = """
import sys
from labkit.sweep import store
out, who = sys.argv[1], sys.argv[2]
for i in range(40):
    store.merge_records(out, [{"key": f"{who}-{i}", "by": who}])
"""


def test_two_processes_merging_into_one_results_file_keep_every_record(tmp_path):
    out = tmp_path / "sweep.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _MERGER, str(out), who], env=ENV) for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    keys = sorted(r["key"] for r in store.load_results(out))
    assert keys == sorted(f"{who}-{i}" for who in "ab" for i in range(40))


_HOLDER = """
import sys, time
from labkit.base import resultsfile
with resultsfile.locked(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(30)
"""


def test_a_writer_that_waits_too_long_names_the_holders_pid(tmp_path):
    out = tmp_path / "sweep.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TimeoutError, match=rf"pid {holder.pid}\b"):
            store.merge_records(out, [{"key": "x"}], timeout=0.5)
    finally:
        holder.kill()
        holder.wait()
    assert store.merge_records(out, [{"key": "x"}], timeout=5) == [{"key": "x"}]  # released with its holder


_TOY = """
import os, time

def train(cfg):
    time.sleep(0.3)
    return {"accuracy": 0.5, "memory_bytes": 4 * cfg["i"]}
"""

_SWEEP = """
import sys
import toy_train
from labkit.sweep import runner as sweep
if __name__ == "__main__":
    out, first = sys.argv[1], int(sys.argv[2])
    run = sweep.run_sweep([{"i": first}, {"i": first + 1}], toy_train.train, out, num_workers=1,
                          tensorflow=False, progress=False)
    assert run.ran == 2
"""


def test_two_sweeps_on_the_same_out_keep_all_four_records(tmp_path):
    """The issue's probe (2 of 4 records lost), with run_sweep itself: the function `labkit sweep` runs."""
    (tmp_path / "toy_train.py").write_text(_TOY)
    (tmp_path / "sweep_main.py").write_text(_SWEEP)
    out = tmp_path / "sweep.jsonl"
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ENV['PYTHONPATH']}"}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "sweep_main.py"), str(out), str(first)], env=env,
                              cwd=tmp_path) for first in (0, 10)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    assert sorted(r["config"]["i"] for r in store.load_results(out)) == [0, 1, 10, 11]


def test_the_sweep_command_writes_through_run_sweep_and_merge_records(monkeypatch, tmp_path):
    """`labkit sweep` lands each result with store.merge_records (the layer tested above with two processes)."""
    from labkit.sweep import networks as netsweep
    from labkit.sweep import runner as sweep
    calls = []
    monkeypatch.setattr(sweep, "merge_records", lambda out, recs: calls.append(recs) or
                        store.merge_records(out, recs))
    monkeypatch.setattr(netsweep.NetworkTrainer, "__call__", lambda self, cfg: {"accuracy": 0.1, "memory_bytes": 4})
    monkeypatch.setattr(netsweep.NetworkTrainer, "prepare", lambda self: None)
    monkeypatch.setattr(sweep, "new_pool", lambda k, threads, tf: _InlinePool())
    monkeypatch.setattr(sweep, "_warm_pool", lambda *a: None)
    out = tmp_path / "s.jsonl"
    name = netsweep.network_name(netsweep.network_configs()[0])
    assert netsweep.cli_main(["--out", str(out), "--configs", name, "--no-progress"]) == 0
    assert len(calls) == 1 and calls[0][0]["name"] == name


class _InlinePool:
    """A pool that runs each task at once in this process (the merge path is what is under test)."""

    def submit(self, fn, *args):
        from concurrent.futures import Future
        fut = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self, wait=True, cancel_futures=False):
        pass


# ================================================================ refused before anything is made or trained
@pytest.mark.parametrize("names", [",", " , ,"])
def test_configs_that_name_nothing_are_refused_before_anything_is_made(tmp_path, names):
    out = tmp_path / "runs" / "sweep.jsonl"
    one_line(labkit_cli("sweep", "--configs", names, "--out", str(out), "--no-progress"), "--configs",
             "names no config")
    assert not (tmp_path / "runs").exists()


def test_more_workers_than_cores_is_refused_at_once(tmp_path):
    """As `labkit scale --np 64` is: one line naming --workers, the core count and --oversubscribe, nothing made."""
    from labkit.base import machine
    many = str(max(64, machine.cores() + 1))
    out = tmp_path / "runs" / "sweep.jsonl"
    t0 = time.perf_counter()
    line = one_line(labkit_cli("sweep", "--workers", many, "--out", str(out), "--no-progress"),
                    f"--workers {many}", "--oversubscribe")
    assert f"({machine.cores()})" in line and not (tmp_path / "runs").exists()
    assert time.perf_counter() - t0 < 60


def _toy(cfg):
    return {"accuracy": 0.75, "memory_bytes": 100 + cfg["i"]}


def test_resume_on_a_nearly_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    """Each write rewrites the whole results file beside the old one: the space check reserves its size too."""
    from labkit.sweep import runner
    monkeypatch.setattr(runner, "new_pool", lambda *a: pytest.fail("trained before the space check refused"))
    with small_tmpfs(tmp_path / "disk", size="256k") as disk:
        out = disk / "sweep.jsonl"
        store.write_results(out, [{"key": f"old-{i}", "pad": "x" * 1000} for i in range(150)])  # ~150 KB
        before = out.read_bytes()
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        assert 64 * 1024 < free < len(before)  # the old 64 KiB check passes; the rewrite does not fit
        with pytest.raises(ValueError, match="out: cannot write .*No space left"):
            runner.run_sweep([{"i": 1}], _toy, out, tensorflow=False, progress=False)
        assert out.read_bytes() == before


class _FillingPool(_InlinePool):
    """Trains in this process; the disk fills while it trains (another program's files)."""

    def __init__(self, disk):
        self.disk = disk

    def submit(self, fn, *args):
        fill(self.disk)
        return super().submit(fn, *args)


def test_a_result_that_cannot_be_written_is_printed_and_kept(tmp_path, monkeypatch, capsys):
    from labkit.sweep import runner
    with small_tmpfs(tmp_path / "disk", size="256k") as disk:
        out = disk / "sweep.jsonl"
        store.write_results(out, [{"key": "old", "accuracy": 0.5}])
        before = out.read_bytes()
        monkeypatch.setattr(runner, "new_pool", lambda *a: _FillingPool(disk))
        with pytest.raises(store.ResultsNotSaved, match=str(out)) as err:
            runner.run_sweep([{"i": 7}], _toy, out, tensorflow=False, warmup=False, progress=False)
        assert [r["accuracy"] for r in err.value.records] == [0.75]
        assert err.value.errno == errno.ENOSPC and str(err.value).startswith(f"could not write {out} (")
        printed = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        assert [(r["config"], r["accuracy"], r["memory_bytes"]) for r in printed] == [({"i": 7}, 0.75, 107)]
        assert out.read_bytes() == before
