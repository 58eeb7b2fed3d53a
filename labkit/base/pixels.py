"""The pixel transform every model of the course sees: uint8 images -> standardised float32 (01_cnn_basics)."""
from __future__ import annotations

import numpy as np

# Per-channel mean and std of CIFAR-10's training images (pixels scaled to [0, 1]); labkit.data.make_dataset and
# labkit.base.training.predict normalise with these whatever the data, so every set gets the same transform.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def normalize(x):
    """uint8 images -> float32, scaled to [0, 1] then standardised per channel with MEAN and STD."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"x must be uint8 images (raw pixels); got dtype {x.dtype}")
    return ((x.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)).astype(np.float32)
