"""Data sets: CIFAR-10 (pre-staged, Keras cache, or checksum-verified download) and an offline set.

CIFAR-10 on disk (where it is looked for, verification, the parser) lives in labkit.data.cifar10; its names are
available here too. On an HPC login node with internet, `labkit data fetch cifar10 --dir D` pre-stages it
for compute nodes without internet.

When CIFAR-10 is not there, `load_dataset()` falls back to a synthetic set generated on the fly: 10 classes of
32x32x3 shapes and textures in random colours, positions and sizes, on noisy backgrounds with clutter (a blob,
thin lines). The network of the MATLAB cloud white paper reaches ~50% on it in the quick profile; it is learnable,
not trivial. (01_cnn_basics)
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from labkit.base import config
from labkit.base.checks import check_int
from labkit.base.pixels import MEAN, STD, normalize  # noqa: F401  (labkit.data is where notebooks look for them)
from labkit.data import cifar10 as _disk  # its checksum table, as it is now (tests swap in a fixture's)
from labkit.data.cifar10 import (  # noqa: F401  (re-exported: labkit.data is where notebooks look for them)
    _ARCHIVE_NAMES,
    CIFAR10_ARCHIVE,
    CIFAR10_CLASSES,
    CIFAR10_DIRNAME,
    CIFAR10_FILES,
    CIFAR10_MD5,
    CIFAR10_URL,
    CorruptDataError,
    _batches_in,
    _candidate_dirs,
    _extract,
    _find_archive,
    _read_batches,
    cifar10_available,
    cifar10_problem,
    fetch_cifar10,
    find_cifar10,
    load_cifar10,
    md5,
)

SYNTHETIC_CLASSES = ("disc", "ring", "square", "frame", "triangle", "plus", "cross", "h-stripes",
                     "v-stripes", "checker")


class DatasetInfo(dict):
    """What load_dataset returned: info.name ('cifar10' | 'synthetic'), class_names, source, sizes, note."""

    __getattr__ = dict.__getitem__

    def __str__(self):
        return (f"dataset: {self['name']} ({self['n_train']} train / {self['n_test']} test images, "
                f"{len(self['class_names'])} classes) from {self['source']}" + (f"\n{self['note']}" if self.get(
                    "note") else ""))


# ---------------------------------------------------------------------------------------------------------
# The offline synthetic set


# SYNTHETIC_CLASSES' shapes in the unit frame of an image (u, v; rad and box its round and square distance from
# the centre; period the stripes' frequency): True inside
_SHAPES = (
    lambda u, v, rad, box, period: rad < 1,                                                    # disc
    lambda u, v, rad, box, period: (rad > 0.55) & (rad < 1),                                   # ring
    lambda u, v, rad, box, period: box < 0.8,                                                  # square
    lambda u, v, rad, box, period: (box > 0.5) & (box < 0.85),                                 # frame
    lambda u, v, rad, box, period: (v < 0.7) & (np.abs(u) < (v + 0.9) * 0.55),                 # triangle (apex up)
    lambda u, v, rad, box, period: ((np.abs(u) < 0.3) | (np.abs(v) < 0.3)) & (box < 1),        # plus
    lambda u, v, rad, box, period: (np.abs(np.abs(u) - np.abs(v)) < 0.3) & (box < 0.9),        # cross (x)
    lambda u, v, rad, box, period: (box < 1) & (np.cos(period * np.pi * v) > 0),               # horizontal stripes
    lambda u, v, rad, box, period: (box < 1) & (np.cos(period * np.pi * u) > 0),               # vertical stripes
    lambda u, v, rad, box, period: (box < 1) & (np.cos(period * np.pi * u) * np.cos(period * np.pi * v) > 0),
)                                                                                              # checker


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
    mask = np.zeros((n, size, size), np.float32)
    for k, shape in enumerate(_SHAPES):  # each image's own shape only: the same values as all ten then a choice
        pick = labels == k
        if pick.any():
            mask[pick] = shape(u[pick], v[pick], rad[pick], box[pick], period[pick])
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
    n_train, n_test, seed = (check_int(v, name, minimum=0) for v, name in (
        (n_train, "n_train"), (n_test, "n_test"), (seed, "seed")))

    def split(n, split_id):
        xs, ys = [], []
        for chunk in range(-(-n // 1000)):
            x, y = _synthetic_chunk(np.random.default_rng([seed, split_id, chunk]), 1000)
            xs.append(x), ys.append(y)
        if not xs:
            return np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.uint8)
        return np.concatenate(xs)[:n], np.concatenate(ys)[:n]

    return split(n_train, 0), split(n_test, 1)


def random_batch(batch_size, image_size=224, classes=1000, seed=0):
    """One batch of random float32 images (N, S, S, 3) and int32 labels: throughput benchmarks only.

    Nothing to learn here (use synthetic() for that): this is the fixed batch Horovod's synthetic benchmark
    feeds ResNet-50 at 224 px every step, so the timing is the network's, not the input pipeline's.
    (04_horovod_scaling)
    """
    batch_size, image_size, classes = (check_int(v, name, minimum=1) for v, name in (
        (batch_size, "batch_size"), (image_size, "image_size"), (classes, "classes")))
    rng = np.random.default_rng(seed)
    x = rng.random((batch_size, image_size, image_size, 3), dtype=np.float32)
    y = rng.integers(0, classes, batch_size).astype(np.int32)
    return x, y


def default_sizes(name: str) -> tuple[int, int]:
    """(n_train, n_test) the active profile uses for data set `name` ('cifar10' or 'synthetic'). (01_cnn_basics)

    The rule: a profile's slot is set by images x epochs, and an image costs the same on either set (32x32x3
    through the same networks), so quick and workshop take the same counts from CIFAR-10 as from the offline set
    (workshop: 10,000 train / 2,000 test, its first images; real, checksum-verified) and fit the same minutes and
    memory; only the full profile, the sources' own run, takes all of CIFAR-10 (50,000 / 10,000). 06 loads these
    sizes; 01 and 05 ask for their own (labkit.models.recipes, NetworkTrainer.for_profile), alike for both sets.
    Only the batch files holding the images asked for are read (load_cifar10), so memory follows the count too.
    """
    if name not in ("cifar10", "synthetic"):
        raise ValueError(f"name must be 'cifar10' or 'synthetic'; got {name!r}")
    return config.by_profile(quick=(5000, 1000), workshop=(10000, 2000), full=(50000, 10000), smoke=(1000, 500))


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
    n_train, n_test = check_int(n_train, "n_train", minimum=1), check_int(n_test, "n_test", minimum=1)
    if name == "cifar10":
        # only the batches holding the first n_train / n_test images are read: the rest never reach memory
        (x_train, y_train), (x_test, y_test) = load_cifar10(data_dir, download=download, n_train=n_train,
                                                            n_test=n_test)
        source, classes, note = config.shown_path(find_cifar10(data_dir) or "download"), CIFAR10_CLASSES, ""
        whole = sum(rows for name, (_, rows) in _disk.CIFAR10_FILES.items() if name != "test_batch")
        if len(x_train) < whole:
            note = (f"The first {len(x_train):,} of CIFAR-10's {whole:,} training images: this profile's size, "
                    "which fits the session's time and memory (LABKIT_PROFILE=full uses all of them).")
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


def augment_batch(x, seed):
    """The augmentation of MATLAB's cloud-training example on a batch of NHWC images: random horizontal flip and
    +-4 px translation.

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

    augment=True applies MATLAB's cloud-training example's flip and +-4 px shift (augment_batch), different every epoch.

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
    batch_size = check_int(batch_size, "batch_size", minimum=1)
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
                       help="download again even if a copy is there (e.g. files that failed their checksum); the old "
                            "copy is replaced only once the new one is downloaded and verified")
    sub.add_parser("where", help="show where labkit looks for data and what it finds")
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 0
    if args.action == "where":
        print(config.describe())
        for d in _candidate_dirs(check=False):
            archives = [d / a for a in _ARCHIVE_NAMES if (d / a).is_file()]
            found = "extracted" if _batches_in(d) else f"archive {archives[0].name}" if archives else "nothing"
            if os.path.lexists(d) and not d.is_dir():  # a file, a dangling link or a symlink loop
                found = "not a folder" + (" (LABKIT_DATA points here)" if d == config.data_dir() else "")
            print(f"  {d}: {found}")
        problem = config.data_dir_problem()
        if problem:
            print(f"load_dataset() stops with an error: {problem}")
            return 1
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
