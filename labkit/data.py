"""Data sets: CIFAR-10 (pre-staged, Keras cache, or checksum-verified download) and an offline set.

Where CIFAR-10 is looked for, in order: the `data_dir` argument, $LABKIT_DATA (else ~/.labkit/data), and
Keras's cache ~/.keras/datasets. Each place may hold the extracted `cifar-10-batches-py/` folder or the
official `cifar-10-python.tar.gz` archive (verified by its MD5 before use). On an HPC login node with
internet, `labkit data fetch cifar10 --dir D` pre-stages it for compute nodes without internet.

When CIFAR-10 is not there, `load_dataset()` falls back to a synthetic set generated on the fly: 10 classes of
32x32x3 shapes and textures in random colours, positions and sizes, on noisy backgrounds with clutter (a blob,
thin lines). The seed 000 network reaches ~50% on it in the quick profile; it is learnable, not trivial.
(01_cnn_basics)
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from labkit import config

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
SYNTHETIC_CLASSES = ("disc", "ring", "square", "frame", "triangle", "plus", "cross", "h-stripes",
                     "v-stripes", "checker")
# Per-channel mean and std of CIFAR-10's training images (pixels scaled to [0, 1]); make_dataset normalises
# with these whatever the data, so train and test sets always get the same transform.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class CorruptDataError(ValueError):
    """A data file that is truncated, corrupted or not what it claims to be; the message says what to do."""


class DatasetInfo(dict):
    """What load_dataset returned: info.name ('cifar10' | 'synthetic'), class_names, source, sizes, note."""

    __getattr__ = dict.__getitem__

    def __str__(self):
        return (f"dataset: {self['name']} ({self['n_train']} train / {self['n_test']} test images, "
                f"{len(self['class_names'])} classes) from {self['source']}" + (f"\n{self['note']}" if self.get(
                    "note") else ""))


def _candidate_dirs(data_dir=None) -> list[Path]:
    dirs = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    dirs.append(config.data_dir())
    dirs.append(Path.home() / ".keras" / "datasets")
    return dirs


def find_cifar10(data_dir=None) -> Path | None:
    """The first place holding extracted CIFAR-10 batches: data_dir, $LABKIT_DATA, the Keras cache."""
    for d in _candidate_dirs(data_dir):
        batches = d / CIFAR10_DIRNAME
        if (batches / "data_batch_1").is_file() and (batches / "test_batch").is_file():
            return batches
    return None


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


def _read_batches(batches: Path, files=None):
    parts = [_load_batch(batches / f"data_batch_{i}", files) for i in range(1, 6)]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts]).reshape(-1, 1)
    x_test, y_test = _load_batch(batches / "test_batch", files)
    return (x_train, y_train), (x_test, y_test.reshape(-1, 1))


def _extract(archive: Path, expected_md5: str | None = None) -> Path:
    """Verify and extract an archive beside itself; a folder appears only once fully extracted."""
    expected = CIFAR10_MD5 if expected_md5 is None else expected_md5
    got = md5(archive)
    if got != expected:
        raise CorruptDataError(f"{archive} is truncated or corrupted: its MD5 is {got}, expected {expected}. "
                               + _fix_hint(archive.parent))
    target = archive.parent / CIFAR10_DIRNAME
    if target.exists() and find_cifar10(archive.parent) != target:
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


def load_cifar10(data_dir=None, *, download: bool = True):
    """CIFAR-10 as Keras returns it: (x_train, y_train), (x_test, y_test), uint8 NHWC images, (N, 1) labels.

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
    return _read_batches(batches)


def _writable_dir(target: Path) -> Path:
    """Create target if needed and prove it writable, before any download; OSError names --dir and the fix."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=target).close()
    except OSError as err:
        raise OSError(f"--dir {target} is not a writable directory ({err.strerror or err}); pick one you can "
                      "write, e.g. --dir ~/labkit-data") from err
    return target


def fetch_cifar10(data_dir=None, *, force: bool = False) -> Path:
    """Download the official archive into data_dir (default $LABKIT_DATA) and verify its MD5; returns its path.

    force=True first deletes what is there (the archive and the extracted folder, e.g. files that failed their
    checksum) and downloads again. (01_cnn_basics)
    """
    target = _writable_dir(Path(data_dir).expanduser() if data_dir is not None else config.data_dir())
    archive = target / CIFAR10_ARCHIVE
    if force:
        shutil.rmtree(target / CIFAR10_DIRNAME, ignore_errors=True)
        for name in _ARCHIVE_NAMES:
            (target / name).unlink(missing_ok=True)
    if archive.is_file() and md5(archive) == CIFAR10_MD5:
        return archive
    from tensorflow import keras

    try:
        path = keras.utils.get_file(fname=CIFAR10_ARCHIVE, origin=CIFAR10_URL, file_hash=CIFAR10_MD5,
                                    hash_algorithm="md5", cache_dir=str(target), cache_subdir="")
    except ValueError as err:  # get_file's checksum failure
        raise CorruptDataError(f"the download of {CIFAR10_URL} failed its MD5 check ({err}). Try again; if it "
                               f"keeps failing, copy {CIFAR10_ARCHIVE} into {target} by hand.") from err
    except Exception as err:  # get_file wraps network errors in a bare Exception
        raise ConnectionError(f"could not download {CIFAR10_URL} ({err}). On a machine without internet, run "
                              f"`labkit data fetch cifar10 --dir {target}` where there is internet and copy "
                              f"{target} here (or point LABKIT_DATA at it).") from err
    return Path(path)


# ---------------------------------------------------------------------------------------------------------
# The offline synthetic set


def _synthetic_chunk(rng: np.random.Generator, n: int):
    """n images of random classes: a shape or texture in a random colour on a cluttered, noisy background."""
    size = 32
    labels = rng.integers(0, 10, n)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    cx = rng.uniform(9, 23, (n, 1, 1)).astype(np.float32)
    cy = rng.uniform(9, 23, (n, 1, 1)).astype(np.float32)
    r = rng.uniform(5, 10, (n, 1, 1)).astype(np.float32)
    theta = rng.uniform(-0.3, 0.3, (n, 1, 1)).astype(np.float32)  # small tilt: stripes keep their orientation
    du, dv = (xx - cx) / r, (yy - cy) / r
    u = np.cos(theta) * du + np.sin(theta) * dv
    v = -np.sin(theta) * du + np.cos(theta) * dv
    rad, box = np.sqrt(u * u + v * v), np.maximum(np.abs(u), np.abs(v))
    period = rng.uniform(2.2, 3.4, (n, 1, 1)).astype(np.float32)
    shapes = [
        rad < 1,                                                           # disc
        (rad > 0.55) & (rad < 1),                                          # ring
        box < 0.8,                                                         # square
        (box > 0.5) & (box < 0.85),                                        # frame
        (v < 0.7) & (np.abs(u) < (v + 0.9) * 0.55),                        # triangle (apex up)
        ((np.abs(u) < 0.3) | (np.abs(v) < 0.3)) & (box < 1),               # plus
        (np.abs(np.abs(u) - np.abs(v)) < 0.3) & (box < 0.9),               # cross (x)
        (box < 1) & (np.cos(period * np.pi * v) > 0),                      # horizontal stripes
        (box < 1) & (np.cos(period * np.pi * u) > 0),                      # vertical stripes
        (box < 1) & (np.cos(period * np.pi * u) * np.cos(period * np.pi * v) > 0),  # checker
    ]
    mask = np.choose(labels[:, None, None], shapes).astype(np.float32)
    # background: a colour plus a random linear gradient; foreground: another colour, not too close
    bg = rng.uniform(0.1, 0.9, (n, 1, 1, 3)).astype(np.float32)
    fg = rng.uniform(0.0, 1.0, (n, 1, 1, 3)).astype(np.float32)
    too_close = np.abs(fg - bg).sum(-1, keepdims=True) < 0.45  # some low-contrast images, none invisible
    fg = np.where(too_close, 1.0 - bg, fg)
    grad = rng.normal(0, 0.012, (n, 1, 1, 2)).astype(np.float32)
    ramp = (grad[..., :1] * (xx - 16)[..., None] + grad[..., 1:] * (yy - 16)[..., None])
    img = bg + ramp + mask[..., None] * (fg - bg)
    # clutter: a random blob and three thin lines in random colours that the network must learn to ignore
    bx, by = rng.uniform(0, 32, (2, n, 1, 1)).astype(np.float32)
    blob = (((xx - bx) ** 2 + (yy - by) ** 2) < rng.uniform(3, 8, (n, 1, 1))).astype(np.float32)
    img = img + 0.5 * blob[..., None] * (rng.uniform(0, 1, (n, 1, 1, 3)).astype(np.float32) - img)
    for _ in range(3):
        a = rng.uniform(0, np.pi, (n, 1, 1)).astype(np.float32)
        off = rng.uniform(-14, 14, (n, 1, 1)).astype(np.float32)
        line = (np.abs(np.cos(a) * (xx - 16) + np.sin(a) * (yy - 16) - off) < 0.6).astype(np.float32)
        col = rng.uniform(0, 1, (n, 1, 1, 3)).astype(np.float32)
        img = img + 0.5 * line[..., None] * (col - img)
    img = img + rng.normal(0, 0.10, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8), labels.astype(np.uint8)


def synthetic(n_train=50000, n_test=10000, seed=0):
    """The offline set: (x_train, y_train), (x_test, y_test) as uint8 NHWC images and int labels 0..9.

    Deterministic: images are generated in chunks of 1000 from (seed, split, chunk), so a smaller set is a
    prefix of a larger one. Classes: SYNTHETIC_CLASSES. (01_cnn_basics)
    """
    for name, value in (("n_train", n_train), ("n_test", n_test), ("seed", seed)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int; got {value!r}")

    def split(n, split_id):
        xs, ys = [], []
        for chunk in range(-(-n // 1000)):
            x, y = _synthetic_chunk(np.random.default_rng([seed, split_id, chunk]), 1000)
            xs.append(x), ys.append(y)
        if not xs:
            return np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.uint8)
        return np.concatenate(xs)[:n], np.concatenate(ys)[:n]

    return split(n_train, 0), split(n_test, 1)


def default_sizes(name: str) -> tuple[int, int]:
    """(n_train, n_test) the active profile uses: small in quick, all of CIFAR-10 in full."""
    full = (50000, 10000)
    return config.by_profile(quick=(5000, 1000), workshop=(10000, 2000) if name == "synthetic" else full,
                             full=full)


def load_dataset(name=None, *, n_train=None, n_test=None, data_dir=None, seed=0, download=False):
    """(x_train, y_train), (x_test, y_test), info: CIFAR-10 when available, else the synthetic set.

    name: None (CIFAR-10 if on disk, else synthetic), "cifar10" or "synthetic". Labels come back flat, shape
    (N,). n_train / n_test default to the profile's sizes (default_sizes); CIFAR-10 subsets are the first
    images of each split. info.name says which set it is; print(info) to say so in a notebook. (01_cnn_basics)
    """
    if name not in (None, "cifar10", "synthetic"):
        raise ValueError(f"name must be None, 'cifar10' or 'synthetic'; got {name!r}")
    if name is None:
        name = "cifar10" if cifar10_available(data_dir) else "synthetic"
    d_train, d_test = default_sizes(name)
    n_train = d_train if n_train is None else n_train
    n_test = d_test if n_test is None else n_test
    for pname, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{pname} must be a positive int; got {value!r}")
    if name == "cifar10":
        (x_train, y_train), (x_test, y_test) = load_cifar10(data_dir, download=download)
        source, classes, note = str(find_cifar10(data_dir) or "download"), CIFAR10_CLASSES, ""
        x_train, y_train, x_test, y_test = x_train[:n_train], y_train[:n_train], x_test[:n_test], y_test[:n_test]
    else:
        (x_train, y_train), (x_test, y_test) = synthetic(n_train, n_test, seed)
        source, classes = f"labkit.data.synthetic(seed={seed})", SYNTHETIC_CLASSES
        note = ("CIFAR-10 was not found, so these numbers come from labkit's offline synthetic set (shapes and "
                "textures), not CIFAR-10. Run `labkit data fetch cifar10` to use the real data.")
    info = DatasetInfo(name=name, class_names=list(classes), source=source, n_train=len(x_train),
                       n_test=len(x_test), note=note)
    return (x_train, y_train.reshape(-1).astype(np.int32)), (x_test, y_test.reshape(-1).astype(np.int32)), info


# ---------------------------------------------------------------------------------------------------------
# tf.data pipeline


def normalize(x):
    """uint8 images -> float32, scaled to [0, 1] then standardised per channel with MEAN and STD."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"x must be uint8 images (raw pixels); got dtype {x.dtype}")
    return ((x.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)).astype(np.float32)


def augment_batch(x, seed):
    """Seed 002's augmentation on a batch of NHWC images: random horizontal flip and +-4 px translation.

    seed: an int or a shape-[2] int tensor; the same seed gives the same augmentation (stateless ops).
    Translation pads 4 pixels of zeros (the mean colour after normalisation) and crops a random 32x32 window.
    """
    import tensorflow as tf

    base = tf.cast(tf.reshape(seed, [-1])[:1], tf.int64)
    seeds = [tf.concat([base, tf.constant([i], tf.int64)], 0) for i in range(3)]
    shape = tf.shape(x)
    n, h, w = shape[0], shape[1], shape[2]
    flip = tf.random.stateless_uniform([n, 1, 1, 1], seeds[0]) < 0.5
    x = tf.where(flip, tf.reverse(x, axis=[2]), x)
    padded = tf.pad(x, [[0, 0], [4, 4], [4, 4], [0, 0]])
    dy = tf.random.stateless_uniform([n], seeds[1], 0, 9, dtype=tf.int32)
    dx = tf.random.stateless_uniform([n], seeds[2], 0, 9, dtype=tf.int32)
    rows = dy[:, None] + tf.range(h)[None, :]  # (n, h)
    cols = dx[:, None] + tf.range(w)[None, :]  # (n, w)
    out = tf.gather(padded, rows, axis=1, batch_dims=1)  # (n, h, w + 8, c)
    return tf.gather(out, cols, axis=2, batch_dims=1)  # (n, h, w, c)


def make_dataset(x, y, batch_size, *, shuffle=True, augment=False, seed=0, shard=None, drop_remainder=False):
    """tf.data pipeline: shard -> shuffle (every epoch) -> batch -> normalise -> augment -> prefetch.

    augment=True applies seed 002's flip and +-4 px shift (augment_batch), different every epoch.

    x: uint8 NHWC images; y: integer labels, shape (N,) or (N, 1). shard=(index, count) keeps every count-th
    example starting at index, so Horovod rank i of n trains on its own 1/n of the data. (01_cnn_basics)
    """
    import tensorflow as tf

    x = np.asarray(x)
    y = np.asarray(y).reshape(-1)
    if x.dtype != np.uint8 or x.ndim != 4:
        raise ValueError(f"x must be uint8 images of shape (N, H, W, C); got {x.dtype} {x.shape}")
    if len(y) != len(x):
        raise ValueError(f"y must have one label per image: {len(x)} images but {len(y)} labels")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
    ds = tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))
    if shard is not None:
        if (not isinstance(shard, (tuple, list)) or len(shard) != 2
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in shard)
                or not 0 <= shard[0] < shard[1]):
            raise ValueError(f"shard must be (index, count) with 0 <= index < count; got {shard!r}")
        ds = ds.shard(shard[1], shard[0])
    if shuffle:
        n = len(x) if shard is None else -(-len(x) // shard[1])
        ds = ds.shuffle(max(n, 1), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    mean, std = tf.constant(MEAN, tf.float32), tf.constant(STD, tf.float32)

    def prepare(images, labels):
        return (tf.cast(images, tf.float32) / 255.0 - mean) / std, labels

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if augment:
        # one random seed per batch, a fresh sequence every epoch, reproducible from `seed`
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        ds = tf.data.Dataset.zip((ds, seeds)).map(lambda xy, s: (augment_batch(xy[0], s), xy[1]),
                                                   num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------------------
# CLI: labkit data fetch cifar10 [--dir D] | labkit data where


def cli_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="labkit data",
        description="Fetch or locate data sets. Compute nodes without internet: fetch on a login node into a "
                    "shared directory, then export LABKIT_DATA=that directory.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fetch = sub.add_parser("fetch", help="download, verify (MD5) and extract a data set")
    fetch.add_argument("dataset", choices=["cifar10"], help="which data set")
    fetch.add_argument("--dir", default=None, help="where to put it (default: $LABKIT_DATA or ~/.labkit/data)")
    fetch.add_argument("--force", action="store_true",
                       help="delete what is there (e.g. files that failed their checksum) and download again")
    sub.add_parser("where", help="show where labkit looks for data and what it finds")
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 0
    if args.action == "where":
        print(config.describe())
        for d in _candidate_dirs():
            batches, archives = d / CIFAR10_DIRNAME, [d / a for a in _ARCHIVE_NAMES if (d / a).is_file()]
            found = ("extracted" if find_cifar10(d) == batches else "") or (
                f"archive {archives[0].name}" if archives else "nothing")
            print(f"  {d}: {found}")
        batches = find_cifar10() or _find_archive()
        problem = cifar10_problem() if batches else None
        if problem:
            print(f"load_dataset() stops with an error: {problem}")
            return 1
        print(f"load_dataset() uses: {'cifar10 from ' + str(batches) if batches else 'the synthetic set'}")
        return 0
    try:
        archive = fetch_cifar10(args.dir, force=args.force)
        batches = _extract(archive)
        _read_batches(batches)  # parse once: a bad file fails here, not on a compute node
    except (CorruptDataError, ConnectionError) as err:
        print(f"labkit data fetch: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # --dir not writable: bad input, said before any download
        print(f"labkit data fetch: {err}", file=sys.stderr)
        return 2
    where = batches.parent
    print(f"CIFAR-10 ready in {batches}. On compute nodes: export LABKIT_DATA={where}")
    return 0
