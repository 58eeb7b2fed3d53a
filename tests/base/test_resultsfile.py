"""The one writer (labkit.base.resultsfile): links, failures, a full disk, kill -9, stale temporary files, locks;
and the source check that every write in labkit/ and scripts/ goes through it."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import pytest

from helpers import ENV, ROOT, fill, sha, small_tmpfs  # noqa: E402
from labkit.base import resultsfile


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
_FORBIDDEN = re.compile(r"""\bopen\(.*,\s*(?:mode\s*=\s*)?["'](?:w|a|x|r\+|w\+|a\+)b?["']|"""
                        r"""(?<!resultsfile)\.write_(?:text|bytes)\(|"""
                        r"""json\.dump\(|pickle\.dump\(|nbformat\.write\(|\.to_csv\(|\.to_parquet\(|\.savefig\(|"""
                        r"""save_weights\(|\.save\(|np\.save|\.touch\(|shutil\.copy|fdopen\(|"""
                        r"""os\.open\([^)]*O_(?:WRONLY|RDWR|CREAT|TRUNC|APPEND)|tofile\(""")
_EXEMPT = {
    ("labkit/base/resultsfile.py", 'open(tmp, "wb" if binary else "w"'): "the writer's own temporary file",
    ("labkit/base/resultsfile.py", "os.open(lock, os.O_RDWR | os.O_CREAT"): "the lock file (holds only a pid)",
    ("labkit/scale/launch.py", 'os.fdopen(write_fd, "w")'): "a pipe to the watchdog, not a file",
    ("labkit/base/training.py", 'savefig(buf, format="png")'): "an in-memory buffer",
    ("labkit/scale/hvd_train.py", "model.save_weights(str(tmp))"): "the temporary path of resultsfile.replacing_path",
    ("labkit/scale/keras_hvd_loop.py", 'model.save_weights(args.checkpoint + ".part.h5")'): "a script the learner "
    "reads: written under a temporary name and renamed by os.replace on the next line, the writer's rule spelled out",
    ("scripts/delay_relay.py", 'os.open("/dev/net/tun"'): "a TUN device",
    ("scripts/binder_box.py", ".write_text("): "cgroup control files: kernel interfaces, written in place by design",
    ("scripts/binder_box.py", 'open(kernel_log, "w")'): "the kernel's stderr, in the run's own temporary folder",
    ("scripts/binder_box.py", "os.open(os.devnull, os.O_RDWR)"): "the reaper's stdio: the null device, no file",
    ("labkit/cli.py", "os.open(os.devnull, os.O_WRONLY)"): "the null device, standing in for a closed stdout",
    ("labkit/scale/checkpoint.py", "np.savez(buf, "): "an in-memory buffer, written by resultsfile.write_bytes",
    ("scripts/probe_inputs.py", ".write_text("): "fixtures in the probe's own fresh temporary folder; the probe "
                                               "also runs an older labkit (PYTHONPATH) that has no writer",
    ("labkit/cluster/elastic.py", 'open(folder / "horovodrun.out", "wb")'): "horovodrun's output stream, in the "
    "run's own temporary folder; read after the run, kept by nobody",
    ("labkit/cluster/elastic_train.py", '"a", buffering=1)'): "a log each worker appends a line to per step (a "
    "line at a time, so a worker killed mid-run leaves whole lines), in the driver's temporary folder",
    ("labkit/cluster/resume_hvd.py", "manager.save()"): "a script the learner reads: tf.train.CheckpointManager "
    "writes the files under new names and replaces its index file whole",
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


# ================================================================ leftovers: temporary files and locks
def dead_pid() -> int:
    """The pid of a process that has ended (reaped, so no one holds it)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_every_exit_python_sees_removes_the_temp_file(tmp_path, exc):
    target = tmp_path / "r.json"
    with pytest.raises(exc), resultsfile.replacing(target) as fh:
        fh.write("half")
        raise exc("stopped mid-write")
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writers_temp_files_are_swept_on_the_next_write(tmp_path):
    """A kill -9 leaves a temp file no `finally` removes; the next write of the same file removes it when its
    writer's pid is gone or it is over an hour old, and leaves a live writer's temp file alone."""
    target = tmp_path / "sweep.jsonl"
    old_style = tmp_path / ".sweep.jsonl.k3x9q1.tmp.jsonl"  # the name before the pid was in it: by age only
    host = resultsfile._HOST
    dead = tmp_path / f".sweep.jsonl.p{dead_pid()}@{host}.a1b2c3.tmp.jsonl"
    live = tmp_path / f".sweep.jsonl.p{os.getpid()}@{host}.d4e5f6.tmp.jsonl"
    # a writer on another host sharing the drive: its pid means nothing here, so its age decides
    elsewhere = tmp_path / f".sweep.jsonl.p{dead_pid()}@{host}x.g7h8i9.tmp.jsonl"
    young = tmp_path / ".sweep.jsonl.r7t8y9.tmp.jsonl"
    other = tmp_path / ".other.jsonl.x1.tmp.jsonl"  # another file's: not this write's business
    for p in (old_style, dead, live, elsewhere, young, other):
        p.write_text("partial")
    two_hours_ago = time.time() - 7200
    os.utime(old_style, (two_hours_ago, two_hours_ago))
    os.utime(other, (two_hours_ago, two_hours_ago))
    resultsfile.write_text(target, "new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, elsewhere.name, young.name,
                                                                  other.name])


def test_a_name_with_glob_characters_has_its_temp_files_swept(tmp_path):
    target = tmp_path / "run[1].json"
    dead = tmp_path / f".run[1].json.p{dead_pid()}@{resultsfile._HOST}.a1b2c3.tmp.json"
    dead.write_text("partial")
    resultsfile.write_text(target, "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_the_temp_file_names_its_writers_pid(tmp_path):
    with resultsfile.replacing_path(tmp_path / "w.h5") as tmp:
        assert tmp.name.startswith(f".w.h5.p{os.getpid()}@{resultsfile._HOST}.") and tmp.name.endswith(".tmp.h5")


def test_lock_files_do_not_accumulate(tmp_path):
    out = tmp_path / "sweep.jsonl"
    with resultsfile.locked(out) as lock:
        assert lock.exists() and lock.read_text().strip() == str(os.getpid())
    assert list(tmp_path.iterdir()) == []


_COUNTER = """
import sys
from pathlib import Path
from labkit.base import resultsfile
out = Path(sys.argv[1])
for _ in range(30):
    with resultsfile.locked(out):
        n = int(out.read_text()) if out.exists() else 0
        resultsfile.write_text(out, f"{n + 1}\\n")
"""


def test_the_lock_still_excludes_while_its_file_comes_and_goes(tmp_path):
    """Four processes each add 1 thirty times under the lock, which is removed after every release: a waiter
    that got the lock of a removed file must try again, or two would hold it at once and increments be lost."""
    out = tmp_path / "count.txt"
    procs = [subprocess.Popen([sys.executable, "-c", _COUNTER, str(out)], env=ENV) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert out.read_text() == "120\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["count.txt"]


def test_a_failed_write_names_the_file(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / "results.jsonl"
        fill(disk)
        with pytest.raises(OSError, match=str(target)) as err:
            resultsfile.write_text(target, "x" * 100_000)
        assert err.value.errno == errno.ENOSPC
