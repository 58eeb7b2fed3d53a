"""Nothing lost (issue 26): every file labkit writes goes through one atomic writer, is never written over
someone else's work, concurrent sweeps keep every record, and impossible launches are refused up front.

Each test leaves a good previous file in place, does the damaging thing for real (a full tmpfs, kill -9, two
processes, links), and asserts the previous content is still there, byte for byte."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit.base import resultsfile
from labkit.sweep import store

from helpers import ROOT  # noqa: E402  (the repository root, one definition)
from helpers import ENV, labkit_cli  # noqa: E402


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k"):
    """A tmpfs of `size` mounted at where (root only; the test is skipped, with the reason, otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("a disk-full test mounts a small tmpfs, which needs root")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> None:
    """Take every free byte of folder's file system."""
    with open(folder / "filler", "wb", buffering=0) as fh:  # unbuffered: nothing left to flush at close
        try:
            while True:
                fh.write(b"x" * 512)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    assert os.statvfs(folder).f_bavail == 0


def one_line(proc, *words, code=2):
    """proc failed with exit `code`, one stderr line naming every word, no traceback."""
    assert proc.returncode == code, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


# ================================================================ the writer: links, failures, disk full, kill -9
def test_symlinked_output_is_updated_at_its_target(tmp_path):
    shared = tmp_path / "shared-drive"
    shared.mkdir()
    target = shared / "results.json"
    resultsfile.write_json(target, {"v": 1})
    link = tmp_path / "results.json"
    link.symlink_to(target)
    resultsfile.write_json(link, {"v": 2})
    assert link.is_symlink() and os.readlink(link) == str(target)  # still a link, not a local copy
    assert json.loads(target.read_text()) == {"v": 2}
    assert sorted(p.name for p in shared.iterdir()) == ["results.json"]  # no temp file left


def test_hard_linked_output_is_never_written_through(tmp_path):
    original = tmp_path / "instructor.json"
    original.write_text('{"solutions": true}\n')
    before = sha(original)
    copy = tmp_path / "copy.json"
    os.link(original, copy)  # cp -al
    resultsfile.write_json(copy, {"solutions": False})
    assert sha(original) == before  # the other name keeps the old inode and content
    assert json.loads(copy.read_text()) == {"solutions": False}
    assert os.stat(copy).st_ino != os.stat(original).st_ino


def test_symlink_loop_is_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ValueError, match="symlink loop"):
        resultsfile.write_text(loop, "x")
    with pytest.raises(ValueError, match="symlink loop"):
        resultsfile.write_text(loop / "inside.json", "x")


def test_an_error_while_writing_leaves_the_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("previous\n")
    target.chmod(0o640)
    with pytest.raises(RuntimeError), resultsfile.replacing(target) as fh:
        fh.write("half of the new")
        raise RuntimeError("the compute failed mid-write")
    assert target.read_text() == "previous\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    resultsfile.write_text(target, "new\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file keeps its permissions


def test_notebook_bytes_are_what_nbformat_writes(tmp_path):
    import nbformat
    nb = nbformat.read(str(ROOT / "notebooks" / "00_welcome.ipynb"), as_version=4)
    nbformat.write(nb, str(tmp_path / "by_nbformat.ipynb"))  # the oracle: nbformat's own writer
    resultsfile.write_notebook(tmp_path / "by_labkit.ipynb", nb)
    assert (tmp_path / "by_labkit.ipynb").read_bytes() == (tmp_path / "by_nbformat.ipynb").read_bytes()


def test_disk_full_keeps_the_previous_file(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "conv-bench.json"
        good = {"layers": [{"name": f"conv{i}", "gflops": i * 1.5} for i in range(200)]}
        resultsfile.write_json(target, good)
        before = target.read_bytes()
        fill(disk)
        bigger = {"layers": good["layers"] * 4}
        with pytest.raises(OSError) as err:
            resultsfile.write_json(target, bigger)
        assert err.value.errno == errno.ENOSPC
        assert target.read_bytes() == before and json.loads(before) == good
        assert sorted(p.name for p in disk.iterdir()) == ["conv-bench.json", "filler"]  # no half-written temp
        with pytest.raises(ValueError, match="--json: cannot write .*No space left"):
            resultsfile.check_space(target, resultsfile.RESULTS_RESERVE_BYTES, "--json")
        assert sorted(p.name for p in disk.iterdir()) == ["conv-bench.json", "filler"]


_SLOW_WRITER = """
import sys, time
from pathlib import Path
from labkit.base import resultsfile
target, started = Path(sys.argv[1]), Path(sys.argv[2])
with resultsfile.replacing(target, binary=True) as fh:
    for i in range(4000):  # 4000 x 64 KiB = 250 MiB, slowly: the write is wide open when the kill comes
        fh.write(bytes([i % 251]) * 65536)
        fh.flush()
        if i == 10:
            started.write_text("writing")
        time.sleep(0.005)
"""


def test_kill_9_during_a_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "scale.json"
    resultsfile.write_json(target, {"runs": [{"np": 1, "images_per_sec": 123.4}]})
    before = target.read_bytes()
    started = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(target), str(started)], env=ENV)
    try:
        deadline = time.time() + 60
        while not started.exists():
            assert child.poll() is None, "the writer ended before it started writing"
            assert time.time() < deadline, "the writer never started"
            time.sleep(0.02)
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".scale.json.")]
        assert temps and temps[0].stat().st_size > 0  # mid-write: a partial temp file beside the target
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert target.read_bytes() == before  # the kill left the previous complete file


# ================================================================ every writer in labkit/ and scripts/
# A write that does not go through labkit.base.resultsfile. Each exemption says why it is not a file anyone keeps.
_FORBIDDEN = re.compile(r"""\bopen\(.*,\s*(?:mode\s*=\s*)?["'](?:w|a|x|r\+|w\+|a\+)b?["']|(?<!resultsfile)\.write_(?:text|bytes)\(|"""
                        r"""json\.dump\(|pickle\.dump\(|nbformat\.write\(|\.to_csv\(|\.to_parquet\(|\.savefig\(|"""
                        r"""save_weights\(|\.save\(|np\.save|\.touch\(|shutil\.copy|fdopen\(|"""
                        r"""os\.open\([^)]*O_(?:WRONLY|RDWR|CREAT|TRUNC|APPEND)|tofile\(""")
_EXEMPT = {
    ("labkit/base/resultsfile.py", 'open(tmp, "wb" if binary else "w"'): "the writer's own temporary file",
    ("labkit/base/resultsfile.py", "os.open(lock, os.O_RDWR | os.O_CREAT"): "the lock file (holds only a pid)",
    ("labkit/scale/launch.py", 'os.fdopen(write_fd, "w")'): "a pipe to the watchdog, not a file",
    ("labkit/base/training.py", 'savefig(buf, format="png")'): "an in-memory buffer",
    ("labkit/scale/hvd_train.py", "model.save_weights(str(tmp))"): "the temporary path of resultsfile.replacing_path",
    ("labkit/scale/keras_hvd_loop.py", "model.save_weights(args.checkpoint)"): "a script the learner reads and "
    "copies: the checkpoint as a Keras user writes it, on rank 0 only",
    ("scripts/delay_relay.py", 'os.open("/dev/net/tun"'): "a TUN device",
    ("scripts/binder_box.py", ".write_text("): "cgroup control files: kernel interfaces, written in place by design",
    ("scripts/probe_inputs.py", ".write_text("): "fixtures in the probe's own fresh temporary folder; the probe "
                                               "also runs an older labkit (PYTHONPATH) that has no writer",
}


def non_atomic_writes() -> list[str]:
    found = []
    for path in sorted([*ROOT.glob("labkit/**/*.py"), *ROOT.glob("scripts/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if _FORBIDDEN.search(line) and not any(rel == f and s in line for f, s in _EXEMPT):
                found.append(f"{rel}:{lineno}: {line.strip()}")
    return found


def test_no_write_in_labkit_or_scripts_bypasses_the_atomic_writer():
    assert non_atomic_writes() == []


def test_the_source_check_can_fail():
    """The pattern finds the writes the issue found (so the count of 0 above means something)."""
    for line in ('with open(args.json, "w") as f:', "Path(a.json_path).write_text(json.dumps(doc))",
                 "json.dump(result.to_dict(), f)", "nbformat.write(nb, path)", "df.to_csv(out)",
                 "fig.savefig(out)", 'log_f = open(Path(d) / "log.jsonl", "w")'):
        assert _FORBIDDEN.search(line), line


# ================================================================ commands: checked before the compute, written atomically
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


def test_localscale_out_on_a_full_disk_is_refused_before_the_runs(tmp_path, monkeypatch, capsys):
    from labkit.scale import localscale
    monkeypatch.setattr(localscale, "controller_cost", lambda *a, **k: pytest.fail("ran before checking --out"))
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "controllers.json"
        resultsfile.write_json(target, {"rows": "committed measurements"})
        before = target.read_bytes()
        fill(disk)
        assert localscale.main(["--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--out" in err and "No space left" in err
        assert target.read_bytes() == before


@pytest.fixture
def fake_ranks(monkeypatch):
    """scaling.run answers at once with two launches' summaries; the memory estimate is not asked for."""
    from labkit.scale import scaling

    def ranks(n):
        return [{"size": n, "batch_size": 8, "global_batch_size": 8 * n, "images_per_sec_repeats": [10.0, 11.0],
                 "step_time_s": 0.1, "final_loss": 2.0, "checksum": "abc", "threads": 1, "model": "small_cnn",
                 "data": "synthetic", "sync": True} for _ in range(n)]

    def run(nps, **kw):
        import pandas as pd
        return scaling.efficiency(pd.DataFrame([scaling.summarize(ranks(n)) for n in nps]))

    monkeypatch.setattr(scaling, "run", run)
    monkeypatch.setattr(scaling, "check_memory", lambda *a, **k: None)


def test_scale_json_on_a_full_disk_is_refused_before_the_launch(tmp_path, capsys, monkeypatch):
    from labkit.scale import scaling
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("launched before checking --json"))
    monkeypatch.setattr(scaling, "check_memory", lambda *a, **k: None)
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "scale.json"
        resultsfile.write_json(target, {"runs": "the good old ones"})
        before = target.read_bytes()
        fill(disk)
        with pytest.raises(SystemExit) as e:
            scaling.cli_main(["--np", "1", "--json", str(target)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "--json" in err and "No space left" in err
        assert target.read_bytes() == before


def test_scale_json_through_a_symlink_and_a_hard_link(tmp_path, fake_ranks):
    from labkit.scale import scaling
    shared = tmp_path / "share" / "scale.json"
    shared.parent.mkdir()
    shared.write_text("{}\n")
    link = tmp_path / "scale.json"
    link.symlink_to(shared)
    assert scaling.cli_main(["--np", "1,2", "--json", str(link), "--quiet"]) == 0
    assert link.is_symlink() and [r["np"] for r in json.loads(shared.read_text())["runs"]] == [1, 2]
    keep = tmp_path / "keep.json"
    os.link(shared, keep)
    before = sha(keep)
    assert scaling.cli_main(["--np", "1", "--json", str(shared), "--quiet"]) == 0
    assert sha(keep) == before and [r["np"] for r in json.loads(shared.read_text())["runs"]] == [1]


# ================================================================ exercises build
SOURCE = ROOT / "notebooks"


def course_names():
    return sorted(p.name for p in SOURCE.glob("[0-9][0-9]_*.ipynb"))


def test_build_refuses_a_copy_of_the_instructor_edition_and_force_replaces_it(tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in course_names():
        (copy / name).write_bytes((SOURCE / name).read_bytes())
    before = {name: sha(copy / name) for name in course_names()}
    line = one_line(labkit_cli("exercises", "build", str(copy)), "did not write", "--force", course_names()[0])
    assert all(name in line for name in course_names())
    assert {name: sha(copy / name) for name in course_names()} == before  # the solutions survive
    done = labkit_cli("exercises", "build", str(copy), "--force")
    assert done.returncode == 0, done.stderr
    assert all(sha(copy / name) != sha(SOURCE / name) for name in course_names())


def test_build_refuses_a_learners_edited_notebook_but_rebuilds_its_own(tmp_path):
    from labkit.exercises import build as exercises
    learner = tmp_path / "learner"
    exercises.build(learner)
    exercises.build(learner)  # over its own output: allowed
    edited = learner / "02_im2col.ipynb"
    edited.write_text(edited.read_text().replace("answer = None  # your answer here", "answer = 42", 1))
    mine = sha(edited)
    with pytest.raises(ValueError, match=r"did not write: 02_im2col\.ipynb;.*--force"):
        exercises.build(learner)
    assert sha(edited) == mine


def test_build_into_a_hard_linked_copy_never_writes_into_the_instructor_edition(tmp_path):
    from labkit.exercises import build as exercises
    src = tmp_path / "notebooks"  # a private copy stands in for the course's folder (cp -al on it below)
    src.mkdir()
    for name in course_names():
        (src / name).write_bytes((SOURCE / name).read_bytes())
    before = {name: sha(src / name) for name in course_names()}
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in course_names():
        os.link(src / name, linked / name)
    with pytest.raises(ValueError, match="did not write"):
        exercises.build(linked, src)
    exercises.build(linked, src, force=True)
    assert {name: sha(src / name) for name in course_names()} == before  # the instructor edition is intact
    assert all(os.stat(linked / n).st_ino != os.stat(src / n).st_ino for n in course_names())
    assert all(b"### BEGIN SOLUTION" not in (linked / n).read_bytes() for n in course_names())


def test_build_into_a_symlink_loop_is_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    one_line(labkit_cli("exercises", "build", str(loop)), "symlink loop")


def test_build_on_a_full_disk_keeps_the_previous_edition_whole(tmp_path):
    from labkit.exercises import build as exercises
    src = tmp_path / "src"
    src.mkdir()
    for name in course_names()[:3]:
        (src / name).write_bytes((SOURCE / name).read_bytes())
    need = sum((src / n).stat().st_size for n in course_names()[:3])
    with small_tmpfs(tmp_path / "disk", size=f"{(need * 3 // 2) // 1024 + 64}k") as disk:
        exercises.build(disk / "learner", src)
        before = {p.name: sha(p) for p in (disk / "learner").iterdir()}
        fill(disk)
        with pytest.raises(ValueError, match="DIR: cannot write .*No space left"):
            exercises.build(disk / "learner", src)
        assert {p.name: sha(p) for p in (disk / "learner").iterdir()} == before  # no 0-byte notebook
        assert all(json.loads((disk / "learner" / n).read_text())["cells"] for n in course_names()[:3])


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
    from labkit.sweep import networks as netsweep, runner as sweep
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

    def shutdown(self, wait=True):
        pass


# ================================================================ scale: refused before any launch
@pytest.fixture
def fake_horovodrun(tmp_path):
    marker = tmp_path / "ranks-started"
    exe = tmp_path / "horovodrun"
    exe.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    exe.chmod(0o755)
    return {"LABKIT_HOROVODRUN": str(exe)}, marker


def test_more_ranks_than_cores_needs_oversubscribe(fake_horovodrun):
    from labkit.base import machine
    env, marker = fake_horovodrun
    many = str(max(64, machine.cores() + 1))
    t0 = time.perf_counter()
    line = one_line(labkit_cli("scale", "--np", many, env_extra=env), f"--np {many}", "--oversubscribe")
    assert str(machine.cores()) in line and not marker.exists()
    assert time.perf_counter() - t0 < 60  # said at once, not after the 600 s timeout


def test_oversubscribe_lets_the_launch_go(monkeypatch, fake_ranks):
    from labkit.base import machine
    from labkit.scale import scaling
    monkeypatch.setattr(machine, "cores", lambda: 1)
    with pytest.raises(SystemExit):
        scaling.cli_main(["--np", "2", "--quiet"])
    assert scaling.cli_main(["--np", "2", "--quiet", "--oversubscribe"]) == 0


def test_a_batch_that_cannot_fit_in_memory_is_refused_with_the_estimate(fake_horovodrun):
    env, marker = fake_horovodrun
    line = one_line(labkit_cli("scale", "--np", "1", "--batch-size", "10000000", env_extra=env),
                    "--batch-size 10000000", "GiB available", "MB of activations per image")
    assert not marker.exists()
    fits = int(re.search(r"Use --batch-size (\d+) or less", line).group(1))
    assert 0 < fits < 10_000_000


def test_the_memory_estimate_is_below_what_training_really_takes():
    """Oracle: the peak resident memory of a real training step of small_cnn grows from batch 32 to batch 1024 by
    at least labkit.flops' activation estimate for the extra images (the estimate is a floor, so no batch that
    could run is refused). Each batch size in a fresh process: the peak of one process is its own, whatever
    another step in it left behind."""
    from labkit.scale import scaling
    per_image, _ = scaling._child_bytes("small_cnn")
    code = textwrap.dedent("""
        import resource, sys
        import tensorflow as tf
        from labkit import models
        m = models.get("small_cnn", input_shape=(32, 32, 3), classes=10)
        opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
        loss = tf.keras.losses.SparseCategoricalCrossentropy()
        def step(n):
            x, y = tf.random.uniform((n, 32, 32, 3)), tf.zeros((n,), tf.int32)
            with tf.GradientTape() as tape:
                l = loss(y, m(x, training=True))
            opt.apply_gradients(zip(tape.gradient(l, m.trainable_variables), m.trainable_variables))
        step(32); step(int(sys.argv[1]))
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """)
    peak = {}
    for batch in (32, 1024):
        out = subprocess.run([sys.executable, "-c", code, str(batch)], capture_output=True, text=True, env=ENV,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        peak[batch] = int(out.stdout.split()[-1])
    grew = peak[1024] - peak[32]
    assert grew >= (1024 - 32) * per_image, (peak, per_image)


def test_a_rank_killed_by_sigkill_is_said_to_be_out_of_memory(tmp_path, monkeypatch):
    """A launcher whose rank dies of SIGKILL (as the OOM killer does) the way Horovod's Gloo runner reports it."""
    from labkit.scale import launch
    exe = tmp_path / "horovodrun"
    exe.write_text("#!/bin/sh\nsh -c 'kill -9 $$'\necho 'Process 0 exit with status code 137.'\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("LABKIT_HOROVODRUN", str(exe))
    with pytest.raises(launch.HorovodRunError) as err:
        launch.launch(1, [], progress=False, timeout=60, launcher="gloo")  # the fake is horovodrun
    text = str(err.value)
    assert "out-of-memory" in text and "SIGKILL" in text and "--batch-size" in text
    assert "(no stderr)" not in text


def _netns(path: Path):
    """A persistent network namespace bind-mounted at path (as `ip netns add` makes /run/netns/NAME)."""
    path.touch()
    done = subprocess.run(["unshare", f"--net={path}", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {done.stderr.strip()}")


def test_vcluster_hosts_from_the_host_are_refused_and_allowed_from_a_node(tmp_path, monkeypatch, capsys):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    from labkit.scale import launch, scaling
    netns = tmp_path / "netns"
    netns.mkdir()
    node = netns / "labkit-node1"
    _netns(node)
    try:
        problem = launch.launch_problem("labkit-node1:1,labkit-node2:1", netns_dir=netns)
        assert problem and "scripts/vcluster.sh exec labkit-node1" in problem
        inside = subprocess.run(
            ["nsenter", f"--net={node}", sys.executable, "-c",
             ("import sys; from pathlib import Path; from labkit.scale import launch; "
              "print(launch.launch_problem('labkit-node1:1', netns_dir=Path(sys.argv[1])))"), str(netns)],
            capture_output=True, text=True, env=ENV, timeout=120)
        assert inside.returncode == 0 and inside.stdout.strip() == "None", inside.stderr
        assert launch.launch_problem("otherhost:1", netns_dir=netns) is None
        real = launch.launch_problem
        monkeypatch.setattr(scaling, "launch_problem", lambda hosts: real(hosts, netns_dir=netns))
        monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("launched from the host"))
        with pytest.raises(SystemExit) as e:
            scaling.cli_main(["--np", "2", "--hosts", "labkit-node1:1,labkit-node2:1"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "vcluster.sh exec labkit-node1" in err
    finally:
        subprocess.run(["umount", str(node)], check=False)


# ================================================================ the smaller items: lab.sh ports, LABKIT_DATA
def lab(*args, timeout=30):
    env = {**os.environ, "LABKIT_VENV": str(Path(sys.executable).parent.parent)}
    return subprocess.run(["bash", str(ROOT / "scripts/lab.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("port", ["99999", "65536", "123456"])
def test_lab_refuses_a_port_out_of_range(port):
    one_line(lab("--port", port, "--no-browser"), "--port must be 1-65535", port)


def test_lab_says_how_to_pick_another_port_when_it_is_busy():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line(lab("--port", str(port), "--no-browser"), f"port {port}", "busy", "--port 0")


def test_lab_port_0_prints_the_port_it_listens_on(tmp_path, isolated_home):
    from helpers import http_get
    env = {**os.environ, "LABKIT_VENV": str(Path(sys.executable).parent.parent), "JUPYTER_TOKEN": "t0k3n"}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/lab.sh"), "--port", "0", "--no-browser"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/lab", first).group(1))
        assert port > 0
        deadline = time.time() + 90
        while True:
            try:
                if http_get(f"http://127.0.0.1:{port}/api/status", "t0k3n")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "the server did not answer on the printed port"
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("kind", ["file", "loop"])
def test_labkit_data_that_is_not_a_folder_is_said_so(tmp_path, monkeypatch, kind):
    from labkit.data import loading as data
    where = tmp_path / "data"
    if kind == "file":
        where.write_text("not a folder")
    else:
        where.symlink_to(where)
    monkeypatch.setenv("LABKIT_DATA", str(where))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        data.cli_main(["where"])
    assert f"{where}: not a folder (LABKIT_DATA points here)" in out.getvalue()
    with pytest.raises(OSError, match="is not a folder"):
        data.fetch_cifar10()
