"""Every file labkit writes, written one way; and a lock for files that several processes update.

The writer (git's and SQLite's discipline): a temporary file in the target's own folder, fsync, os.replace,
fsync of the folder. A symlink is followed to its target (results kept on a shared drive through a link are
updated there); a hard link is never written through (the directory entry is replaced, the other name keeps
the old content); any failure (disk full, kill -9, an exception) leaves the previous file as it was.
`replacing` / `replacing_path` are the two doors (an open file, or a path for a library that writes by name);
write_text, write_json, write_notebook are built on them. `check_space` reserves the bytes a
file will need before the compute starts, so a full disk is reported first, not after the run.
labkit writes only its own files: the writer never replaces a device, a pipe or a folder, and `check_target`
(before the work) refuses an existing file that is not of the command's own kind (`json_document`, `json_lines`);
`claimed` adds the file's lock for the whole run, so two runs on one output are refused, not merged into one.
The temporary file is `.NAME.p<pid>@<host>.<random>.tmp<suffix>`: removed on every exit Python sees, and one left
by a kill -9 is removed by the next write of NAME once its writer's pid is gone from this host or it is over an
hour old (a writer on another host sharing the drive is judged by age alone).
A lock file is removed by its holder when the write is done, so none accumulate.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import socket
import stat
import tempfile
import time
from pathlib import Path

LOCK_TIMEOUT_S = 60.0  # how long a writer waits for another process's merge before it refuses
RESULTS_RESERVE_BYTES = 64 * 1024  # a results or JSON file of labkit's: the old and the new copy side by side
STALE_TEMP_S = 3600.0  # a temporary file this old whose writer cannot be told is a leftover
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0]) or "host"
_WRITER = f"p{{pid}}@{_HOST}"  # names a temporary file's writer: its pid and host
_TEMP_WRITER = re.compile(r"p(\d+)@([A-Za-z0-9_-]+)\.[^.]+\.(?:tmp|space)")  # after ".NAME."


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


def _writer_gone(name: str, age_s: float) -> bool:
    """True when a temp file (name: what follows ".TARGET.") is over STALE_TEMP_S old, or its writer was a
    process of this host that is gone (another host's pids cannot be asked here)."""
    if age_s > STALE_TEMP_S:
        return True
    match = _TEMP_WRITER.match(name)
    if match is None or match.group(2) != _HOST:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        pass
    return False


def sweep_stale_temps(target: Path) -> None:
    """Remove the temporary files a killed writer of target left beside it (see the module's docstring)."""
    now = time.time()
    name, suffix = glob.escape(target.name), glob.escape(target.suffix)  # a name with [ or * is matched as written
    for pattern in (f".{name}.*.tmp{suffix}", f".{name}.*.space"):
        for old in target.parent.glob(pattern):
            try:
                if _writer_gone(old.name[len(target.name) + 2:], now - old.lstat().st_mtime):
                    old.unlink()
            except OSError:  # gone meanwhile, or not ours to remove
                pass


def _named(err: OSError, target: Path) -> OSError:
    """err with the file it was writing named (os.write's ENOSPC names none)."""
    if err.filename is None and err.errno is not None:
        return OSError(err.errno, err.strerror or str(err), str(target))  # OSError picks the errno's subclass
    return err


@contextlib.contextmanager
def replacing_path(path, *, follow_symlinks: bool = True):
    """Yield a temporary path beside path's target; when the block ends cleanly, that file is fsynced and
    moved onto the target in one os.replace. On any exception it is removed and the target is untouched.
    For writers that take a file name (Keras' save_weights, savefig)."""
    target = target_of(path, follow_symlinks)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    with contextlib.suppress(FileNotFoundError):  # a device or a pipe is never replaced by a file
        kind = _not_regular(os.stat(target).st_mode)
        if kind:
            raise ValueError(f"{path} is {kind}, not a file of labkit's; give a new file name")
    sweep_stale_temps(target)
    # the target's extension last: writers that pick a format by it (Keras' .h5) see the right one
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{_WRITER.format(pid=os.getpid())}.",
                                suffix=f".tmp{target.suffix}")
    tmp = Path(name)
    try:
        os.close(fd)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _new_mode(target))
        os.replace(tmp, target)
    except OSError as err:
        raise _named(err, target) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
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
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{_WRITER.format(pid=os.getpid())}.",
                                   suffix=".space")
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


# ----------------------------------------------------------------------------- only labkit's own files
OWN_MAX_BYTES = 64 * 2**20  # a results file of labkit's is far smaller; a larger file is not one of them
_KINDS = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a pipe",
          stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}


def _not_regular(mode: int) -> str:
    """What a non-regular file is ('' for a regular file)."""
    return next((kind for test, kind in _KINDS.items() if test(mode)), "" if stat.S_ISREG(mode) else "not a file")


def json_document(*keys: str):
    """A check for check_target's own=: the text is one JSON object with these keys (a labkit --json file)."""
    def own(text: str) -> bool:
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        return isinstance(doc, dict) and all(k in doc for k in keys)
    own.kind = f"a JSON document with {', '.join(repr(k) for k in keys)}" if keys else "a JSON document"
    return own


def json_lines(key: str):
    """A check for own=: every non-blank line is a JSON object with key (a JSON-lines results file)."""
    def own(text: str) -> bool:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            return False
        return all(isinstance(r, dict) and key in r for r in rows)
    own.kind = f"JSON lines with {key!r}"
    return own


def check_target(path, name: str = "path", *, own=None) -> Path:
    """The file a write to path lands in (symlinks followed), checked before any work: ValueError naming `name`
    when it is not a regular file (a device, a pipe, a folder), or when it exists, is not empty and is not a file of
    labkit's own kind (own(text) False, or not readable as text). labkit writes only files of its own."""
    target = target_of(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as err:
        raise ValueError(f"{name}: cannot use {path} ({err.strerror or err})") from None
    kind = _not_regular(st.st_mode)
    if kind:
        where = f" (through the link, {target})" if target != Path(os.path.abspath(path)) else ""
        raise ValueError(f"{name}: {path} is {kind}{where}, not a file of labkit's; give a new file name")
    if own is None or st.st_size == 0:
        return target
    text = None
    if st.st_size <= OWN_MAX_BYTES:
        try:
            text = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    if text is None or not own(text):
        where = f" (through the link, {target})" if target != Path(os.path.abspath(path)) else ""
        raise ValueError(f"{name}: {path}{where} exists and is not {getattr(own, 'kind', 'a results file')} that "
                         "labkit wrote; labkit writes only its own files: give a new file name, or remove it first")
    return target


@contextlib.contextmanager
def claimed(path, name: str = "path", *, own=None, nbytes: int = RESULTS_RESERVE_BYTES):
    """For a command that writes its results at the end of a long run: check_target and check_space now, then
    the file's lock held for the whole block (timeout 0), so a second run on the same file is refused in one line
    now instead of one run's results being lost later. ValueError naming `name` for each refusal."""
    check_target(path, name, own=own)
    check_space(path, nbytes, name)
    try:
        with locked(path, timeout=0):
            yield
    except TimeoutError as err:
        raise ValueError(f"{name} {err}") from None


# ------------------------------------------------------------------ many writers, one file (labkit.sweep.store)
def lock_path(path) -> Path:
    """The lock file of a results file: a dot-file beside its target."""
    target = target_of(path)
    return target.with_name(f".{target.name}.lock")


def _acquire(fd: int, lock: Path, path, timeout: float) -> bool:
    """Wait for the lock on fd; False when lock's file was removed (or replaced) meanwhile: open it again."""
    import fcntl

    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                waited = f" for over {timeout:g} s" if timeout > 0 else ""
                raise TimeoutError(f"{path} is being written by another process (pid {holder}, lock "
                                   f"{lock}){waited}; wait for it to finish or write to another file") from None
            time.sleep(0.05)
    try:
        return os.stat(lock).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def locked(path, timeout: float = LOCK_TIMEOUT_S):
    """Hold an exclusive fcntl lock on path's lock file (creating its folder) while the block runs; the
    holder's pid is written in it, so a writer that waits past timeout refuses naming that pid. The holder
    removes the lock file before it lets go; a waiter that then gets the removed file's lock opens it again."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if _acquire(fd, lock, path, timeout):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        os.ftruncate(fd, 0)  # the lock file holds only the holder's pid; it is no one's data
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while held: a waiter on this file then finds it gone and opens the new one
        os.close(fd)  # closing the descriptor releases the lock
