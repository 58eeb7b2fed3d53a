"""Helpers shared by the tests: real servers (JupyterLab, Slurm), and stand-ins for scaling's launches."""
import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# a child Python of the tests: this checkout first on its path, the quick profile, no debug tracebacks
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
       "LABKIT_PROFILE": "quick"}
ENV.pop("LABKIT_DEBUG", None)


def notebook_client(nb, **kwargs):
    """nbclient's NotebookClient as the course's own runs make it: a kernel client that waits for each message in
    1 s slices (scripts/kernel_client.py says why)."""
    import sys

    import nbclient
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    from kernel_client import SlicedWaitKernelManager
    return nbclient.NotebookClient(nb, kernel_manager_class=SlicedWaitKernelManager, **kwargs)


def edited(src: str, *edits) -> str:
    """src with each (old, new) replaced; each old text must be there exactly once, so that a changed reference
    script fails the test that plants a mistake in it instead of planting nothing."""
    for old, new in edits:
        assert src.count(old) == 1, f"the reference no longer contains {old!r} once"
        src = src.replace(old, new)
    return src


def labkit_cli(*argv, env_extra=None, cwd=ROOT, timeout=300):
    """`python -m labkit ARGV` as a user runs it; the finished process (stdout, stderr, returncode)."""
    import sys
    return subprocess.run([sys.executable, "-m", "labkit", *argv], capture_output=True, text=True, cwd=cwd,
                          env={**ENV, **(env_extra or {})}, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, token=None) -> tuple[int, bytes]:
    """(status, body); an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_post(url, token=None, body: bytes = b"{}") -> tuple[int, bytes]:
    """(status, body) of a JSON POST; an HTTP error status is returned, not raised."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file ('' where there is none)."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def failure(fn, *args) -> str:
    """The message of the failure fn(*args) ends in; a skip in its place fails the test (the point of it)."""
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as err:
        fn(*args)
    assert err.type is pytest.fail.Exception, f"a skip where a failure belongs: {err.value}"
    return str(err.value)


def fake_executable(path: Path, message: str) -> Path:
    """An executable at path that prints message on stderr and exits 1."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def running_lab(home: Path, token: str, env=None, timeout: float = 90, stdout=None):
    """`scripts/lab.sh --port N --no-browser`, as `make lab` starts it, with JUPYTER_TOKEN=token.

    Yields (process, base URL) once /api/status answers; stops the server's whole process group (it and
    the kernels it started) on exit. The server's output goes to home/lab.log (stdout too, unless a file
    object or descriptor is given for it, e.g. a pseudo-terminal standing in for the learner's terminal).
    """
    port = free_port()
    env = dict(os.environ if env is None else env, JUPYTER_TOKEN=token)
    log_path = home / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts/lab.sh"), "--port", str(port), "--no-browser"],
                                env=env, stdout=log if stdout is None else stdout, stderr=log,
                                start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"JupyterLab (scripts/lab.sh) exited with {proc.returncode}; its log's tail:\n"
                                f"{log_tail(log_path)}", pytrace=False)
                try:
                    if http_get(base + "/api/status", token)[0] == 200:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    pytest.fail(f"JupyterLab (scripts/lab.sh) did not answer within {timeout:.0f} s; its log's tail:\n"
                                f"{log_tail(log_path)}", pytrace=False)
                time.sleep(0.3)
            yield proc, base
        finally:
            with contextlib.suppress(ProcessLookupError):  # a server that exited may have left no group behind
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# stand-ins for scaling's launches: a rank's result and scaling.launch (tests/scale), scaling.run / run_paired
# (tests/scale/test_localscale.py, tests/deepdive/test_exchange.py)
def fake_rank(rank, size, ips, checksum, final_loss=1.0):
    """One rank's result as hvd_train prints it: images/s per repeat `ips`, weights checksum `checksum`."""
    return {"rank": rank, "size": size, "batch_size": 8, "global_batch_size": 8 * size,
            "images_per_sec_repeats": ips, "step_time_s": 0.1, "final_loss": final_loss, "checksum": checksum,
            "threads": 1, "model": "small_cnn", "data": "synthetic", "sync": True}


def fake_launch(calls):
    """scaling.launch stand-in: records (n, args, kw) in calls; each of the n ranks answers with fake_rank."""
    def launch(n, args, **kw):
        calls.append((n, list(args), kw))
        return [fake_rank(r, n, [10.0, 10.0], "c") for r in range(n)]
    return launch


def fake_run(step_ms):
    """scaling.run stand-in: step_ms(np, sync, batch) -> step time; images/s from it, one row per np."""
    import pandas as pd

    from labkit.scale import scaling

    def run(nps, *, sync=True, batch_size=64, extra=(), **kw):
        rows = []
        for n in nps:
            # hvd_train --barrier: no gradient exchange, but a 4-byte allreduce per step
            kind = "barrier" if "--barrier" in extra else "one_group" if "--num-groups" in extra else sync
            t = step_ms(n, kind, batch_size) / 1e3
            rows.append({"np": n, "batch_size": batch_size, "global_batch_size": n * batch_size,
                         "images_per_sec": n * batch_size / t, "images_per_sec_std": 0.0, "step_time_s": t,
                         "cpu_step_time_s": 0.9 * t, "in_sync": sync or n == 1, "ranks": [{}] * n})
        return scaling.efficiency(pd.DataFrame(rows))
    return run


def fake_paired(run, calls=None):
    """scaling.run_paired stand-in from a scaling.run stand-in: (with the exchange, without), one launch."""
    def run_paired(nps, **kw):
        assert "sync" not in kw and not {"--no-sync", "--barrier"} & set(kw.get("extra", ()))
        if calls is not None:
            calls.append(("paired", kw.get("batch_size", 64)))
        return run(nps, sync=True, **kw), run(nps, sync=False, **kw)
    return run_paired


def no_separate_launch(*a, **k):
    pytest.fail("the exchange and its control run in one launch (run_paired), not as two scaling.run launches")


# ----------------------------------------------------------------------------- files kept (the nothing-lost tests)
def sha(path) -> str:
    """SHA-256 of a file's bytes."""
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k", inodes: int | None = None):
    """A tmpfs of `size` (and at most `inodes` files) mounted at where (root only; the test is skipped, with the
    reason, otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("a disk-full test mounts a small tmpfs, which needs root")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
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


def refused_on_a_full_disk(tmp_path, capsys, name, flag, main, key: str = "runs") -> None:
    """main(path) (a CLI's exit code) with path `name` holding good results on a small tmpfs, full: exit 2, one
    stderr line naming flag and "No space left", and the file byte for byte as it was. key: what the command's
    own results file holds (labkit writes over no other kind of file)."""
    from labkit.base import resultsfile
    with small_tmpfs(tmp_path / "disk") as disk:
        target = disk / name
        resultsfile.write_json(target, {key: "the good ones of an earlier run"})
        before = target.read_bytes()
        fill(disk)
        assert main(target) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err and "No space left" in err
        assert target.read_bytes() == before


def one_line(proc, *words, code=2):
    """proc failed with exit `code`, one stderr line naming every word, no traceback."""
    assert proc.returncode == code, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]
