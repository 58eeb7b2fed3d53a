"""CIFAR-10 on disk: where it is looked for, checksum-verified download, and a parser that runs no code.

Where CIFAR-10 is looked for, in order: the `data_dir` argument, $LABKIT_DATA (else ~/.labkit/data), and
Keras's cache ~/.keras/datasets. Each place may hold the extracted `cifar-10-batches-py/` folder or the
official `cifar-10-python.tar.gz` archive (verified by its MD5 before use). Every batch file is checked
against the official per-file MD5 before it is parsed, and parsed by an unpickler that admits numpy arrays
and nothing else (a pickle can name any function; pickle.load would call it). A bad file raises
CorruptDataError naming the file and the fix, `labkit data fetch cifar10 --force`. labkit.data.load_dataset
is the usual entry point; `labkit data` is the command. (01_cnn_basics)
"""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from labkit.base import config

CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"  # published on https://www.cs.toronto.edu/~kriz/cifar.html
# names under which an archive may sit: ours, and the one keras.datasets.cifar10.load_data() leaves behind
_ARCHIVE_NAMES = (CIFAR10_ARCHIVE, "cifar-10-batches-py.tar.gz")
# The official files inside it, as torchvision records them (torchvision/datasets/cifar.py, train_list and
# test_list): name -> (MD5, rows). A batch is hashed before it is parsed; tests of the parser on fixtures
# swap in their own table, the real data is only ever checked against this one.
CIFAR10_FILES = {
    "data_batch_1": ("c99cafc152244af753f735de768cd75f", 10000),
    "data_batch_2": ("d4bba439e000b95fd0a9bffe97cbabec", 10000),
    "data_batch_3": ("54ebc095f3ab1f0389bbae665268c751", 10000),
    "data_batch_4": ("634d18415352ddfa80567beed471001a", 10000),
    "data_batch_5": ("482c414d41f54cd18b22e5b47cb7c3cb", 10000),
    "test_batch": ("40351d587109b95175f43aff81a1287e", 10000),
}
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class CorruptDataError(ValueError):
    """A data file that is truncated, corrupted or not what it claims to be; the message says what to do."""


def _candidate_dirs(data_dir=None, check: bool = True) -> list[Path]:
    """Where CIFAR-10 is looked for; a LABKIT_DATA that is not a folder is a ValueError naming it (check=True)."""
    dirs = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    dirs.append(config.check_data_dir() if check else config.data_dir())
    dirs.append(Path.home() / ".keras" / "datasets")
    return dirs


def _batches_in(folder: Path) -> Path | None:
    """folder's extracted CIFAR-10 batches (cifar-10-batches-py/ with data_batch_1 and test_batch), or None."""
    batches = Path(folder) / CIFAR10_DIRNAME
    return batches if (batches / "data_batch_1").is_file() and (batches / "test_batch").is_file() else None


def find_cifar10(data_dir=None) -> Path | None:
    """The first place holding extracted CIFAR-10 batches: data_dir, $LABKIT_DATA, the Keras cache."""
    return next((b for b in map(_batches_in, _candidate_dirs(data_dir)) if b is not None), None)


def _find_archive(data_dir=None) -> Path | None:
    for d in _candidate_dirs(data_dir):
        for name in _ARCHIVE_NAMES:
            if (d / name).is_file():
                return d / name
    return None


def cifar10_available(data_dir=None) -> bool:
    """True when CIFAR-10 is on disk (extracted or as an archive) in one of the places load_cifar10 looks."""
    return find_cifar10(data_dir) is not None or _find_archive(data_dir) is not None


def cifar10_problem(data_dir=None) -> str | None:
    """Why load_cifar10 would refuse what is on disk (a file that fails its MD5, a missing file), or None when
    the data found is good or there is none. Hashes the files; parses nothing. (01_cnn_basics)"""
    batches = find_cifar10(data_dir)
    if batches is not None:
        for name in CIFAR10_FILES:
            try:
                _verify_file(batches / name)
            except CorruptDataError as err:
                return str(err)
        return None
    archive = _find_archive(data_dir)
    if archive is not None:
        got = md5(archive)
        if got != CIFAR10_MD5:
            return (f"{archive} is truncated or corrupted: its MD5 is {got}, expected {CIFAR10_MD5}. "
                    + _fix_hint(archive.parent))
    return None


def md5(path) -> str:
    """Hex MD5 of a file, read in 1 MiB blocks."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fix_hint(where) -> str:
    return (f"Delete it and fetch a fresh copy: `labkit data fetch cifar10 --force --dir {where}` on a machine "
            f"with internet (e.g. an HPC login node), or copy a good {CIFAR10_ARCHIVE} (MD5 {CIFAR10_MD5}) there.")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch and nothing else: a pickle can name any callable (os.system included) and
    pickle.load would call it. CIFAR-10's batches need only numpy's array reconstruction; dicts, lists, bytes
    and ints are plain opcodes. Every other global is refused before it is looked up."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.numeric", "_frombuffer"),  # protocol 5 arrays
               ("builtins", "list"), ("builtins", "dict"), ("builtins", "bytes"), ("builtins", "str")}

    @staticmethod
    def _latin1_encode(text, encoding="latin1", errors="strict"):
        # Python 3 writes bytes at protocol 2 as _codecs.encode(str, "latin1"); admit that use only
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
            raise pickle.UnpicklingError(f"it calls _codecs.encode with {encoding!r}, not a CIFAR-10 batch")
        return text.encode("latin1")

    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode"):
            return self._latin1_encode
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR-10 batch never holds "
                                         "(refused: unpickling it could run code)")
        return super().find_class(module, name)


def _verify_file(path: Path, files=None) -> int:
    """Check path's MD5 against the table (default CIFAR10_FILES) before it is parsed; returns its row count."""
    table = CIFAR10_FILES if files is None else files
    if path.name not in table:
        raise CorruptDataError(f"{path} is not one of CIFAR-10's files ({', '.join(table)}). "
                               + _fix_hint(path.parent.parent))
    want, rows = table[path.name]
    if not path.is_file():  # missing, or a device/FIFO planted in its place (hashing /dev/zero never ends)
        raise CorruptDataError(f"{path} is missing or not a regular file. " + _fix_hint(path.parent.parent))
    try:
        got = md5(path)
    except OSError as err:
        raise CorruptDataError(f"{path} could not be read ({err}). " + _fix_hint(path.parent.parent)) from err
    if got != want:
        raise CorruptDataError(f"{path} is not the official CIFAR-10 file (MD5 {got}, expected {want}): truncated, "
                               "corrupted or replaced; it was not parsed. " + _fix_hint(path.parent.parent))
    return rows


def _load_batch(path: Path, files=None):
    """One CIFAR-10 pickle batch -> (uint8 images NHWC, uint8 labels), after checking its MD5 against the
    official table (files: another table, for fixtures). Raises CorruptDataError when it is not the file."""
    rows = _verify_file(path, files)
    try:
        with open(path, "rb") as f:
            d = _BatchUnpickler(f, encoding="bytes").load()
        d = {k.decode("utf8") if isinstance(k, bytes) else k: v for k, v in d.items()}
        raw = d["data"]
        labels = np.asarray(d["labels"])
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError, TypeError, AttributeError,
            IndexError) as err:
        raise CorruptDataError(f"{path} is not a readable CIFAR-10 batch ({type(err).__name__}: {err}). "
                               + _fix_hint(path.parent.parent)) from err
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or not np.issubdtype(labels.dtype, np.integer):
        raise CorruptDataError(f"{path} holds {type(raw).__name__} {getattr(raw, 'dtype', '')} data and "
                               f"{labels.dtype} labels; a CIFAR-10 batch holds uint8 data and integer labels. "
                               + _fix_hint(path.parent.parent))
    data = raw
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data) or labels.ndim != 1 or (
            len(labels) and (labels.min() < 0 or labels.max() > 9)):
        raise CorruptDataError(f"{path} has data of shape {data.shape} and {len(labels)} labels; a CIFAR-10 batch "
                               f"holds N x 3072 bytes and N labels 0..9. " + _fix_hint(path.parent.parent))
    if len(data) != rows:
        raise CorruptDataError(f"{path} holds {len(data)} images; this file holds {rows}. "
                               + _fix_hint(path.parent.parent))
    labels = labels.astype(np.uint8)
    # each row is 1024 red, then 1024 green, then 1024 blue bytes, each plane row-major
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _first_rows(paths: list[Path], n: int | None, files=None):
    """The first n images and labels (all when n is None) of these batch files read in order, each verified;
    a batch past the first n rows is not read. Returns fresh arrays, not views into a parsed batch, so nothing
    beyond the n images stays in memory."""
    xs, ys, have = [np.zeros((0, 32, 32, 3), np.uint8)], [np.zeros((0,), np.uint8)], 0
    for path in paths:
        if n is not None and have >= n:
            break
        x, y = _load_batch(path, files)
        keep = len(x) if n is None else min(len(x), n - have)
        xs.append(np.ascontiguousarray(x[:keep])), ys.append(y[:keep].copy())
        have += keep
        del x, y
    return (xs[1], ys[1]) if len(xs) == 2 else (np.concatenate(xs), np.concatenate(ys))


def _read_batches(batches: Path, files=None, n_train: int | None = None, n_test: int | None = None):
    """(x_train, y_train), (x_test, y_test) from the extracted folder: the first n_train / n_test of each split
    (all when None), reading only the batches those rows are in."""
    x_train, y_train = _first_rows([batches / f"data_batch_{i}" for i in range(1, 6)], n_train, files)
    x_test, y_test = _first_rows([batches / "test_batch"], n_test, files)
    return (x_train, y_train.reshape(-1, 1)), (x_test, y_test.reshape(-1, 1))


def _extract(archive: Path, expected_md5: str | None = None) -> Path:
    """Verify and extract an archive beside itself; a folder appears only once fully extracted."""
    expected = CIFAR10_MD5 if expected_md5 is None else expected_md5
    got = md5(archive)
    if got != expected:
        raise CorruptDataError(f"{archive} is truncated or corrupted: its MD5 is {got}, expected {expected}. "
                               + _fix_hint(archive.parent))
    target = archive.parent / CIFAR10_DIRNAME
    if target.exists() and _batches_in(archive.parent) is None:
        raise CorruptDataError(f"{target} exists but lacks data_batch_1..5 or test_batch (an interrupted copy?). "
                               f"Delete that folder; labkit will extract {archive.name} again.")
    tmp = Path(tempfile.mkdtemp(prefix=".cifar10-", dir=archive.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(CIFAR10_DIRNAME + "/") and m.isfile()]
            if not members:
                raise CorruptDataError(f"{archive} holds no {CIFAR10_DIRNAME}/ folder. " + _fix_hint(archive.parent))
            tar.extractall(tmp, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        if not target.exists():
            os.replace(tmp / CIFAR10_DIRNAME, target)  # atomic: a half-extracted folder is never seen
        return target
    except (tarfile.TarError, EOFError, OSError) as err:
        raise CorruptDataError(f"{archive} could not be extracted ({type(err).__name__}: {err}). "
                               + _fix_hint(archive.parent)) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_cifar10(data_dir=None, *, download: bool = True, n_train: int | None = None, n_test: int | None = None):
    """CIFAR-10 as Keras returns it: (x_train, y_train), (x_test, y_test), uint8 NHWC images, (N, 1) labels.

    n_train / n_test: only the first images of each split (all when None); only the batch files holding them
    are read (each checked against its MD5 first), so a 10,000-image subset costs one batch, not all six.

    Looks in data_dir, $LABKIT_DATA, the Keras cache (extracted folder first, then a verified archive);
    otherwise downloads into data_dir (or $LABKIT_DATA) with keras.utils.get_file when download=True.
    A truncated or corrupted file raises CorruptDataError (a ValueError) saying what to do; it is never used.
    (01_cnn_basics)
    """
    batches = find_cifar10(data_dir)
    if batches is None:
        archive = _find_archive(data_dir)
        if archive is None:
            if not download:
                raise FileNotFoundError(
                    "CIFAR-10 not found in " + ", ".join(str(d) for d in _candidate_dirs(data_dir))
                    + ". Fix: `labkit data fetch cifar10 --dir DIR` (needs internet), then export LABKIT_DATA=DIR.")
            archive = fetch_cifar10(data_dir)
        batches = _extract(archive)
    return _read_batches(batches, n_train=n_train, n_test=n_test)


def _writable_dir(target: Path) -> Path:
    """Create target if needed and prove it writable, before any download; OSError names --dir and the fix."""
    if os.path.lexists(target) and not target.is_dir():  # a file, or a symlink loop
        raise OSError(f"--dir {target} is not a folder (LABKIT_DATA or --dir must name a folder); pick one you "
                      "can write, e.g. --dir ~/labkit-data")
    try:
        target.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=target).close()
    except OSError as err:
        raise OSError(f"--dir {target} is not a writable directory ({err.strerror or err}); pick one you can "
                      "write, e.g. --dir ~/labkit-data") from err
    return target


def fetch_cifar10(data_dir=None, *, force: bool = False) -> Path:
    """Download the official archive into data_dir (default $LABKIT_DATA) and verify its MD5; returns its path.

    force=True downloads again even when a copy is there (e.g. files that failed their checksum): into a
    temporary folder beside it, verified and extracted there, and only then moved over the old archive and
    folder, so a failed download (no internet on a compute node) leaves the old copy as it was. (01_cnn_basics)
    """
    target = _writable_dir(Path(data_dir).expanduser() if data_dir is not None else config.data_dir())
    archive = target / CIFAR10_ARCHIVE
    if not force and archive.is_file() and md5(archive) == CIFAR10_MD5:
        return archive
    if not force:
        return _download(target, target)
    tmp = Path(tempfile.mkdtemp(prefix=".cifar10-fetch-", dir=target))
    try:
        fresh = _extract(_download(tmp, target))  # verified (MD5) and extracted before anything old is touched
        os.replace(tmp / CIFAR10_ARCHIVE, archive)
        folder = target / CIFAR10_DIRNAME
        if os.path.lexists(folder):
            os.replace(folder, tmp / "old")  # removed with tmp below
        os.replace(fresh, folder)
        for name in _ARCHIVE_NAMES[1:]:
            (target / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return archive


def _download(folder: Path, target: Path) -> Path:
    """The official archive downloaded into folder (target's own, or a temporary one in it) with its MD5 checked
    (keras.utils.get_file)."""
    from tensorflow import keras

    try:
        path = keras.utils.get_file(fname=CIFAR10_ARCHIVE, origin=CIFAR10_URL, file_hash=CIFAR10_MD5,
                                    hash_algorithm="md5", cache_dir=str(folder), cache_subdir="")
    except ValueError as err:  # get_file's checksum failure
        raise CorruptDataError(f"the download of {CIFAR10_URL} failed its MD5 check ({err}). Try again; if it "
                               f"keeps failing, copy {CIFAR10_ARCHIVE} into {target} by hand.") from err
    except Exception as err:  # get_file wraps network errors in a bare Exception
        raise ConnectionError(f"could not download {CIFAR10_URL} ({err}). On a machine without internet, run "
                              f"`labkit data fetch cifar10 --dir {target}` where there is internet and copy "
                              f"{target} here (or point LABKIT_DATA at it).") from err
    return Path(path)
