"""Data sets: CIFAR-10 (pre-staged, Keras cache, or checksum-verified download) and an offline set.

(01_cnn_basics)
"""
from __future__ import annotations

from pathlib import Path

from labkit import config

CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"


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
