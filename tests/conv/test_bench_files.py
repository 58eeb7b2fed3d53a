"""`labkit conv-bench --json`: checked before the compute, written atomically, never a silently lost run."""
from __future__ import annotations

import json

import pytest

from labkit.base import resultsfile

from helpers import fill, small_tmpfs  # noqa: E402


def test_conv_bench_json_on_a_full_disk_is_refused_before_the_compute(tmp_path, monkeypatch, capsys):
    from labkit.conv import bench
    monkeypatch.setattr(bench, "conv_bench", lambda **kw: pytest.fail("computed before checking --json"))
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "bench.json"
        resultsfile.write_json(target, {"good": "13 kB of results"})
        before = target.read_bytes()
        fill(disk)
        assert bench.cli_main(["--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--json" in err and "No space left" in err
        assert target.read_bytes() == before


def test_conv_bench_json_through_a_symlink_updates_the_target(tmp_path, monkeypatch):
    from labkit.conv import bench

    class Result:
        def to_dict(self):
            return {"new": True}

        def __str__(self):
            return "fake result"

    monkeypatch.setattr(bench, "conv_bench", lambda **kw: Result())
    target = tmp_path / "share" / "bench.json"
    target.parent.mkdir()
    target.write_text('{"old": true}\n')
    link = tmp_path / "bench.json"
    link.symlink_to(target)
    assert bench.cli_main(["--json", str(link), "--no-naive"]) == 0
    assert link.is_symlink() and json.loads(target.read_text()) == {"new": True}
