"""Kernel explorer: hand-picked 3x3 convolution kernels (Sobel, blur, sharpen, your own) on a real image.

The core is `apply_kernel`, a plain numpy function (tested against tf.nn.conv2d); `kernel_explorer` wraps it
in ipywidgets. Like tf.nn.conv2d, "convolution" here is cross-correlation: the kernel is not flipped.
(01_cnn_basics)
"""
from __future__ import annotations

import numpy as np

KERNELS = {
    "identity": [[0, 0, 0], [0, 1, 0], [0, 0, 0]],
    "sobel x (vertical edges)": [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]],
    "sobel y (horizontal edges)": [[-1, -2, -1], [0, 0, 0], [1, 2, 1]],
    "blur (box)": [[1 / 9] * 3] * 3,
    "blur (gaussian)": [[1 / 16, 2 / 16, 1 / 16], [2 / 16, 4 / 16, 2 / 16], [1 / 16, 2 / 16, 1 / 16]],
    "sharpen": [[0, -1, 0], [-1, 5, -1], [0, -1, 0]],
    "laplacian (edges)": [[0, 1, 0], [1, -4, 1], [0, 1, 0]],
    "emboss": [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]],
}


def kernel(name: str) -> np.ndarray:
    """A named kernel from KERNELS as a float32 (3, 3) array."""
    if name not in KERNELS:
        raise ValueError(f"kernel name must be one of {', '.join(KERNELS)}; got {name!r}")
    return np.array(KERNELS[name], dtype=np.float32)


def to_gray(image) -> np.ndarray:
    """RGB (H, W, 3) image, uint8 or float, -> float32 (H, W) luminance in [0, 1] (ITU-R 601 weights)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"image must be (height, width, 3); got shape {image.shape}")
    scale = 255.0 if image.dtype == np.uint8 else 1.0
    return (image.astype(np.float32) / scale) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def apply_kernel(image, k, padding="SAME") -> np.ndarray:
    """Slide kernel k over a 2-D image: out[i, j] = sum_ab k[a, b] * image[i + a, j + b] (tf.nn.conv2d's rule).

    padding "VALID" keeps only full windows; "SAME" zero-pads so the output has the input's size.
    """
    x = np.asarray(image, dtype=np.float32)
    k = np.asarray(k, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"image must be 2-D (height, width); got shape {x.shape}")
    if k.ndim != 2 or k.shape[0] > x.shape[0] or k.shape[1] > x.shape[1]:
        raise ValueError(f"kernel must be 2-D and no larger than the image; got shape {k.shape}")
    if padding not in ("SAME", "VALID"):
        raise ValueError(f"padding must be 'SAME' or 'VALID'; got {padding!r}")
    kh, kw = k.shape
    if padding == "SAME":  # TensorFlow's split: the extra row/column of padding goes after
        top, left = (kh - 1) // 2, (kw - 1) // 2
        x = np.pad(x, ((top, kh - 1 - top), (left, kw - 1 - left)))
    h, w = x.shape[0] - kh + 1, x.shape[1] - kw + 1
    out = np.zeros((h, w), dtype=np.float32)
    for a in range(kh):  # one shifted copy of the image per kernel weight: 9 passes for a 3x3 kernel
        for b in range(kw):
            out += k[a, b] * x[a:a + h, b:b + w]
    return out


def render(image, k, title="", ax_pair=None):
    """Draw the image (grayscale) and its filtered version side by side; returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    gray = to_gray(image)
    out = apply_kernel(gray, k)
    if ax_pair is None:
        fig, ax_pair = plt.subplots(1, 3, figsize=(9, 3.2))
    else:
        fig = ax_pair[0].figure
    ax_pair[0].imshow(np.asarray(image))
    ax_pair[0].set_title("image")
    ax_pair[1].imshow(gray, cmap="gray", vmin=0, vmax=1)
    ax_pair[1].set_title("grayscale input")
    lim = float(np.abs(out).max()) or 1.0
    signed = out.min() < 0
    ax_pair[2].imshow(out, cmap="RdBu_r" if signed else "gray", vmin=-lim if signed else 0, vmax=lim)
    ax_pair[2].set_title(f"{title} output".strip())
    for ax in ax_pair:
        ax.axis("off")
    fig.tight_layout()
    return fig


def kernel_explorer(images, class_names=None, labels=None):
    """ipywidgets: pick an image and a kernel (or type your own 3x3 weights) and see the convolution."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    images = np.asarray(images)
    choice = W.Dropdown(options=list(KERNELS) + ["custom"], value="sobel x (vertical edges)", description="kernel")
    index = W.IntSlider(0, 0, len(images) - 1, description="image")
    cells = [W.FloatText(value=float(v), layout=W.Layout(width="70px"))
             for v in kernel("sobel x (vertical edges)").ravel()]
    grid = W.GridBox(cells, layout=W.Layout(grid_template_columns="repeat(3, 75px)"))
    out = W.Output()

    syncing = [False]  # True while the cells are set from the dropdown, not typed by the learner

    def update(*_):
        if syncing[0]:
            return
        if choice.value != "custom":
            syncing[0] = True
            for cell, v in zip(cells, kernel(choice.value).ravel()):
                cell.value = float(v)
            syncing[0] = False
        k = np.array([c.value for c in cells], dtype=np.float32).reshape(3, 3)
        name = "" if labels is None or class_names is None else f" ({class_names[int(labels[index.value])]})"
        with out:
            out.clear_output(wait=True)
            fig = render(images[index.value], k, title=choice.value + name)
            display(fig)
            plt.close(fig)

    def typed(change):
        if syncing[0]:
            return
        if choice.value != "custom":
            syncing[0] = True
            choice.value = "custom"
            syncing[0] = False
        update()

    choice.observe(update, "value")
    index.observe(update, "value")
    for c in cells:
        c.observe(typed, "value")
    update()
    return W.VBox([W.HBox([choice, index]), W.Label("kernel weights (edit to make your own):"), grid, out])
