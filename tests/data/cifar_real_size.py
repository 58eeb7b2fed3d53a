"""A CIFAR-10-format set of the real size for measuring the course where the real one cannot be fetched.

    .venv/bin/python tests/data/cifar_real_size.py DIR

writes DIR/data/cifar-10-batches-py/ exactly as the official archive lays it out (data_batch_1..5 of 10,000
images each, test_batch of 10,000, batches.meta; pickled dicts with bytes keys, rows of 3072 bytes, red plane
then green then blue) holding labkit's synthetic images (seed 1: learnable, not the offline set's own), and
in DIR/site/ a sitecustomize module that makes labkit trust these files by their own MD5s (labkit.data.cifar10 checks
every batch against the official table before parsing it). Then, for a measurement only:

    LABKIT_DATA=DIR/data PYTHONPATH=DIR/site:. .venv/bin/python scripts/binder_box.py notebooks/01_cnn_basics.ipynb
"""
from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

PER_BATCH = 10000  # the official batches' size


def write_layout(root: Path, images, labels, test_images, test_labels) -> dict:
    """cifar-10-batches-py/ under root in the official layout; returns its table {file: (MD5, rows)}."""
    from labkit.data import cifar10

    folder = root / cifar10.CIFAR10_DIRNAME
    folder.mkdir(parents=True)

    def write(name, x, y, label):
        rows = x.transpose(0, 3, 1, 2).reshape(len(x), 3072)  # red plane, green plane, blue plane
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": label, b"labels": [int(v) for v in y], b"data": rows,
                         b"filenames": [b"img_%d.png" % i for i in range(len(x))]}, f, protocol=2)

    per = len(images) // 5
    for i in range(5):
        s = slice(i * per, (i + 1) * per)
        write(f"data_batch_{i + 1}", images[s], labels[s], b"training batch %d of 5" % (i + 1))
    write("test_batch", test_images, test_labels, b"testing batch 1 of 1")
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in cifar10.CIFAR10_CLASSES], b"num_vis": 3072}, f)
    return {name: (hashlib.md5((folder / name).read_bytes()).hexdigest(), len(test_labels) if name == "test_batch"
                   else per) for name in cifar10.CIFAR10_FILES}


def trust_module(table: dict) -> str:
    """The text of a sitecustomize module that swaps labkit's checksum table for this set's (measurements and
    tests only)."""
    return ("# measurement only: labkit trusts this CIFAR-10-format set by its own MD5 table\n"
            "import labkit.data.cifar10\n"
            f"labkit.data.cifar10.CIFAR10_FILES = {table!r}\n")


def make(base: Path, per_batch: int = PER_BATCH, seed: int = 1) -> dict:
    """DIR/data (the set) and DIR/site (its sitecustomize module) for 5 x per_batch train and per_batch test images."""
    from labkit.data import loading

    (x, y), (xt, yt) = loading.synthetic(5 * per_batch, per_batch, seed=seed)
    table = write_layout(base / "data", x, y, xt, yt)
    (base / "site").mkdir(parents=True, exist_ok=True)
    (base / "site" / "sitecustomize.py").write_text(trust_module(table))
    return table


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: cifar_real_size.py DIR  (DIR must not hold a data/cifar-10-batches-py/ yet)")
    print(make(Path(sys.argv[1])))
