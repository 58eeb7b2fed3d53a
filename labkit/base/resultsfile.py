"""Every file labkit writes, written one way; and the sweep's results file (JSON lines) on top of it.

The writer (git's and SQLite's discipline): a temporary file in the target's own folder, fsync, os.replace,
fsync of the folder. A symlink is followed to its target (results kept on a shared drive through a link are
updated there); a hard link is never written through (the directory entry is replaced, the other name keeps
the old content); any failure (disk full, kill -9, an exception) leaves the previous file as it was.
`replacing` / `replacing_path` are the two doors (an open file, or a path for a library that writes by name);
write_text, write_json, write_notebook, merge_records are built on them. `check_space` reserves the bytes a
file will need before the compute starts, so a full disk is reported first, not after the run.

Sweep records may carry the settings they were made with (epochs, data set, ...); settings_mismatch says what
differs, so a resume never mixes results of two set-ups in one table. (05_network_sweep)
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import time
from pathlib import Path

LOCK_TIMEOUT_S = 60.0
RESULTS_RESERVE_BYTES = 64 * 1024  # a results or JSON file of labkit's: the old and the new copy side by side  # how long a writer waits for another process's merge before it refuses


# ----------------------------------------------------------------------------- the one writer
def target_of(path, follow_symlinks: bool = True) -> Path:
    """The file a write to path lands in (absolute): symlinks followed unless follow_symlinks=False.
    A symlink loop on the way is a ValueError in one line."""
    path = Path(path)
    try:
        os.stat(path if follow_symlinks else path.parent)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symlink loop ({err.strerror}); point it at a real file or folder, "
                             "or remove it") from None
    if follow_symlinks:
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def _new_mode(target: Path) -> int:
    """The old file's permission bits, or what a plain open() would give a new file (0666 minus the umask)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the data itself was synced
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing_path(path, *, follow_symlinks: bool = True):
    """Yield a temporary path beside path's target; when the block ends cleanly, that file is fsynced and
    moved onto the target in one os.replace. On any exception it is removed and the target is untouched.
    For writers that take a file name (Keras' save_weights, savefig)."""
    target = target_of(path, follow_symlinks)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    # the target's extension last: writers that pick a format by it (Keras' .h5) see the right one
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{target.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _new_mode(target))
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_folder(target.parent)


@contextlib.contextmanager
def replacing(path, *, binary: bool = False, follow_symlinks: bool = True):
    """Yield an open file (text, UTF-8, or binary) that becomes path's content, atomically, when the block
    ends cleanly (see replacing_path)."""
    with replacing_path(path, follow_symlinks=follow_symlinks) as tmp:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()


def write_bytes(path, data: bytes, *, follow_symlinks: bool = True) -> Path:
    """path's content becomes data, atomically; returns the file written (the symlink's target)."""
    with replacing(path, binary=True, follow_symlinks=follow_symlinks) as fh:
        fh.write(data)
    return target_of(path, follow_symlinks)


def write_text(path, text: str, *, follow_symlinks: bool = True) -> Path:
    """path's content becomes text (UTF-8), atomically; returns the file written."""
    return write_bytes(path, text.encode("utf-8"), follow_symlinks=follow_symlinks)


def write_json(path, obj, *, indent=1, follow_symlinks: bool = True, **dumps_kw) -> Path:
    """obj as JSON (one trailing newline), atomically; returns the file written."""
    return write_text(path, json.dumps(obj, indent=indent, **dumps_kw) + "\n", follow_symlinks=follow_symlinks)


def write_notebook(path, nb, *, follow_symlinks: bool = True) -> Path:
    """A notebook in nbformat's JSON, byte for byte what nbformat.write gives, atomically."""
    import nbformat

    text = nbformat.writes(nb)
    return write_text(path, text if text.endswith("\n") else text + "\n", follow_symlinks=follow_symlinks)


def check_space(path, nbytes: int, name: str = "path") -> None:
    """Reserve nbytes beside path's target (a placeholder file, allocated then removed), so a full disk or an
    unwritable folder is a ValueError naming `name` now, before the compute, not after it."""
    target = target_of(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".space")
    except OSError as err:
        raise ValueError(f"{name}: cannot write {path} ({err.strerror or err})") from None
    try:
        try:
            os.posix_fallocate(fd, 0, max(1, int(nbytes)))
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.write(fd, b"\0" * max(1, int(nbytes)))  # a file system without fallocate: write the bytes
            os.fsync(fd)
    except OSError as err:
        raise ValueError(f"{name}: cannot write {path} ({err.strerror or err}; {int(nbytes)} bytes needed)") from None
    finally:
        os.close(fd)
        os.unlink(tmp)


# ----------------------------------------------------------------------------- many writers, one file
def lock_path(path) -> Path:
    """The lock file of a results file: a dot-file beside its target."""
    target = target_of(path)
    return target.with_name(f".{target.name}.lock")


@contextlib.contextmanager
def locked(path, timeout: float = LOCK_TIMEOUT_S):
    """Hold an exclusive fcntl lock on path's lock file (creating its folder) while the block runs; the
    holder's pid is written in it, so a writer that waits past timeout refuses naming that pid."""
    import fcntl

    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    raise TimeoutError(f"{path} is being written by another process (pid {holder}, lock "
                                       f"{lock}) for over {timeout:g} s; wait for it to finish or write "
                                       "to another file") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)  # the lock file holds only the holder's pid; it is no one's data
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def merge_records(path, records, key: str = "key", timeout: float = LOCK_TIMEOUT_S) -> list[dict]:
    """Add records to a JSON-lines file under its lock, keeping every record another process wrote since:
    the file is re-read, a record with the same key replaced, new keys appended, the whole rewritten
    atomically. Returns the file's records after the merge. (05_network_sweep)"""
    with locked(path, timeout):
        merged = {rec[key]: rec for rec in load_results(path)}
        for rec in records:
            merged[rec[key]] = rec
        out = list(merged.values())
        write_results(path, out)
    return out


# ----------------------------------------------------------------------------- the sweep's results file


def load_results(path) -> list[dict]:
    """Records in a results file (JSON lines); [] if it does not exist. (05_network_sweep)"""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"results file {path} line {lineno} is not JSON ({err}); fix or delete that line, "
                             "or start over with resume=False / --overwrite") from None
        if not isinstance(rec, dict) or "key" not in rec:
            raise ValueError(f"results file {path} line {lineno} is not a sweep record (no 'key')")
        records.append(rec)
    return records


def write_results(path, records) -> None:
    """Write all records at once (JSON lines) through the atomic writer. (05_network_sweep)"""
    path = Path(path)
    target_of(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in records))


def check_writable(path) -> None:
    """Raise ValueError naming `out` when the results file cannot be written there, or the disk has no room for
    it (before any compute). (05_network_sweep)"""
    path = Path(path)
    target_of(path)  # a symlink loop is one line
    if path.is_dir():
        raise ValueError(f"out must be a file path; {path} is a directory")
    for parent in path.parents:  # the nearest existing folder must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"out: cannot write the results file {path} ({parent} is a file, not a folder)")
            break
    try:
        target_of(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"out: cannot write the results file {path} ({err.strerror or err})") from None
    check_space(path, RESULTS_RESERVE_BYTES, "out")


def settings_mismatch(records, settings: dict, path="the results file") -> str | None:
    """Why these records cannot be resumed with `settings` (what differs, one line), or None when they can.
    (05_network_sweep)"""
    for rec in records:
        old = rec.get("settings")
        if old is None:
            return f"{path} holds results without recorded settings (an older labkit), which cannot be checked"
        if old != settings:
            diff = "; ".join(f"{k}={old.get(k)!r} there, {settings.get(k)!r} now"
                             for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k))
            return f"{path} was made with other settings ({diff})"
    return None



def records_dataframe(records):
    """Records as a pandas DataFrame: one row per config, config keys as columns, memory in KB. (05_network_sweep)"""
    import pandas as pd

    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k not in ("config", "settings", "traceback")}
        row.update(r.get("config") or {})
        rows.append(row)
    df = pd.DataFrame(rows)
    if "memory_bytes" in df:
        df["memory_kb"] = df["memory_bytes"] / 1e3
    return df
