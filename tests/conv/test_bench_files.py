"""`labkit conv-bench --json`: checked before the compute, written atomically, never a silently lost run."""
from __future__ import annotations

import json
import os

import pytest

from helpers import labkit_cli, one_line, refused_on_a_full_disk  # noqa: E402


def test_conv_bench_json_on_a_full_disk_is_refused_before_the_compute(tmp_path, monkeypatch, capsys):
    from labkit.conv import bench, bench_cli
    monkeypatch.setattr(bench, "conv_bench", lambda **kw: pytest.fail("computed before checking --json"))
    refused_on_a_full_disk(tmp_path, capsys, "bench.json", "--json",
                           lambda target: bench_cli.cli_main(["--json", str(target)]), key="layers")


def test_conv_bench_json_through_a_symlink_updates_the_target(tmp_path, monkeypatch):
    from labkit.conv import bench, bench_cli

    class Result:
        def to_dict(self):
            return {"new": True}

        def __str__(self):
            return "fake result"

    monkeypatch.setattr(bench, "conv_bench", lambda **kw: Result())
    target = tmp_path / "share" / "bench.json"
    target.parent.mkdir()
    target.write_text('{"layers": [], "old": true}\n')  # an earlier conv-bench's results (labkit's own kind)
    link = tmp_path / "bench.json"
    link.symlink_to(target)
    assert bench_cli.cli_main(["--json", str(link), "--no-naive"]) == 0
    assert link.is_symlink() and json.loads(target.read_text()) == {"new": True}


def test_a_second_conv_bench_on_the_same_json_is_refused_and_the_first_kept(tmp_path, monkeypatch, capsys):
    """Two `labkit conv-bench --json cb.json` at once: while the first computes, a second one (a real process)
    is refused in one line naming the first's pid, before any compute; the first then writes its run."""
    from labkit.conv import bench, bench_cli
    target = tmp_path / "cb.json"
    second = {}

    class Result:
        def to_dict(self):
            return {"run": "first"}

        def __str__(self):
            return "fake result"

    def first_run(**kw):  # the second run starts while the first one is computing
        second["proc"] = labkit_cli("conv-bench", "--json", str(target), "--no-naive")
        return Result()

    monkeypatch.setattr(bench, "conv_bench", first_run)
    assert bench_cli.cli_main(["--json", str(target), "--no-naive"]) == 0
    line = one_line(second["proc"], "--json", str(target), f"pid {os.getpid()}", "another file")
    assert "wrote" not in second["proc"].stdout and "for over" not in line
    assert json.loads(target.read_text()) == {"run": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cb.json"]  # no lock or temp file left
