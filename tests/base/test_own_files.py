"""labkit writes only its own files: a device, a pipe, a folder, or an existing file that is not of the command's
own kind (a password file behind a symlink) is refused in one line before any work, and left as it was; two runs
on one output are refused, not merged into one (labkit.base.resultsfile.check_target / claimed)."""
import json
import os

import pytest

from helpers import labkit_cli
from labkit.base import resultsfile

PASSWD = "root:x:0:0:root:/root:/bin/bash\n"  # what a careless --json target may hold


@pytest.fixture
def foreign(tmp_path):
    """(a symlink, the file it points at): a regular file that no labkit command wrote."""
    target = tmp_path / "passwd"
    target.write_text(PASSWD)
    link = tmp_path / "results.json"
    link.symlink_to(target)
    return link, target


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_the_writer_never_replaces_a_pipe(fifo):
    with pytest.raises(ValueError, match="is a pipe"):
        resultsfile.write_text(fifo, "x")
    assert fifo.is_fifo()


def test_a_foreign_file_behind_a_link_is_refused_and_kept(foreign):
    link, target = foreign
    with pytest.raises(ValueError, match=r"^--json: .*results.json \(through the link, .*passwd\) exists and is not a "
                                         r"JSON document with 'runs'") as err:
        resultsfile.check_target(link, "--json", own=resultsfile.json_document("runs"))
    assert "\n" not in str(err.value)
    assert target.read_text() == PASSWD and link.is_symlink()


def test_own_files_empty_files_and_new_files_pass(tmp_path):
    own = resultsfile.json_document("runs")
    (tmp_path / "old.json").write_text(json.dumps({"runs": []}))
    (tmp_path / "empty.json").write_text("")
    for name in ("old.json", "empty.json", "new.json"):
        assert resultsfile.check_target(tmp_path / name, "--json", own=own) == tmp_path / name
    lines = resultsfile.json_lines("key")
    (tmp_path / "sweep.jsonl").write_text('{"key": "a"}\n\n{"key": "b"}\n')
    resultsfile.check_target(tmp_path / "sweep.jsonl", "out", own=lines)
    (tmp_path / "other.jsonl").write_text('{"key": "a"}\n{"name": "b"}\n')
    with pytest.raises(ValueError, match="not JSON lines with 'key'"):
        resultsfile.check_target(tmp_path / "other.jsonl", "out", own=lines)


def test_a_second_run_on_one_output_is_refused(tmp_path):
    out = tmp_path / "r.json"
    with resultsfile.claimed(out, "--json", own=resultsfile.json_document("runs")):
        with pytest.raises(ValueError, match=r"^--json .*r.json is being written by another process \(pid "):
            with resultsfile.claimed(out, "--json", own=resultsfile.json_document("runs")):
                pass
    with resultsfile.claimed(out, "--json"):  # free again once the first run is done
        pass
    assert not resultsfile.lock_path(out).exists()


def _one_line_refusal(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


def test_conv_bench_refuses_a_foreign_file_and_a_pipe(foreign, fifo):
    link, target = foreign
    _one_line_refusal(labkit_cli("conv-bench", "--json", str(link)), "exists and is not", "'layers'")
    _one_line_refusal(labkit_cli("conv-bench", "--json", str(fifo)), "is a pipe")
    assert target.read_text() == PASSWD and fifo.is_fifo()


def test_fit_bench_refuses_a_foreign_file_a_pipe_and_what_scale_refuses(foreign, fifo):
    link, target = foreign
    _one_line_refusal(labkit_cli("fit-bench", "--json", str(link)), "exists and is not", "'rows'")
    _one_line_refusal(labkit_cli("fit-bench", "--json", str(fifo)), "is a pipe")
    assert target.read_text() == PASSWD and fifo.is_fifo()
    _one_line_refusal(labkit_cli("fit-bench", "--np", "2", env_extra={"LABKIT_CORES": "1"}), "--np 2", "cores")
    _one_line_refusal(labkit_cli("fit-bench", "--np", "1", "--batch-size", "200000"), "--batch-size 200000",
                      "memory")


@pytest.mark.slow
def test_sweep_refuses_a_foreign_file_and_a_pipe(foreign, fifo):
    link, target = foreign
    for extra in ((), ("--overwrite",)):
        _one_line_refusal(labkit_cli("sweep", "--out", str(link), *extra), "exists and is not", "'key'")
    _one_line_refusal(labkit_cli("sweep", "--out", str(fifo)), "is a pipe")
    assert target.read_text() == PASSWD and fifo.is_fifo()


def test_scale_refuses_a_foreign_file_a_pipe_and_a_second_run_on_its_json(foreign, fifo, tmp_path):
    link, target = foreign
    _one_line_refusal(labkit_cli("scale", "--np", "1", "--json", str(link)), "exists and is not", "'runs'")
    _one_line_refusal(labkit_cli("scale", "--np", "1", "--json", str(fifo)), "is a pipe")
    assert target.read_text() == PASSWD and fifo.is_fifo()
    out = tmp_path / "scale.json"
    with resultsfile.claimed(out, "--json"):  # another run holds it
        _one_line_refusal(labkit_cli("scale", "--np", "1", "--json", str(out)), "being written by another process")
    assert not out.exists()
