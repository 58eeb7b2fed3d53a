"""im2col explorer: kernel size, stride, padding and dilation -> patches, matrix shape, output shape, FLOPs.

The core is `explain`, a plain function (tested against tf.nn.conv2d and labkit.conv.im2col); `draw`
renders it with matplotlib; `im2col_explorer` wraps both in ipywidgets sliders. (02_im2col)
"""
from __future__ import annotations

import numpy as np

from labkit import conv


def explain(image_size=(7, 7), kernel_size=3, strides=1, padding="VALID", dilations=1,
            c_in: int = 1, c_out: int = 1, batch_size: int = 1) -> dict:
    """Every number the explorer shows, for an input of batch_size x H x W x c_in and c_out filters.

    padding: "VALID", "SAME", an int p (p on every side) or [(top, bottom), (left, right)].
    Returns the padding, output shape, im2col matrix shape (M, K), weight matrix shape (K, N),
    FLOPs = 2*M*K*N, the im2col blow-up (matrix size / input size) and, per output pixel, the
    (row, column) of every kernel tap in padded-image coordinates.
    """
    h, w = (image_size, image_size) if np.isscalar(image_size) else tuple(image_size)
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        padding = [(int(padding), int(padding))] * 2
    g = conv.geometry((batch_size, h, w, c_in), kernel_size, strides, padding, dilations)
    m, k = g.cols_shape
    taps = np.empty((g.h_out, g.w_out, g.kh * g.kw, 2), dtype=int)
    for i in range(g.h_out):
        for j in range(g.w_out):
            taps[i, j] = [(i * g.sh + a * g.dh, j * g.sw + b * g.dw) for a in range(g.kh) for b in range(g.kw)]
    return {
        "geometry": g,
        "input_shape": (batch_size, h, w, c_in),
        "padding": {"top": g.pad_top, "bottom": g.pad_bottom, "left": g.pad_left, "right": g.pad_right},
        "padded_hw": g.padded_hw,
        "output_shape": (batch_size, g.h_out, g.w_out, c_out),
        "im2col_shape": (m, k),
        "weights_shape": (k, c_out),
        "flops": g.flops(c_out),
        "macs": m * k * c_out,
        "blowup": (m * k) / (batch_size * h * w * c_in),
        "taps": taps,
    }


def summary_text(info: dict) -> str:
    """The explorer's text panel: shapes, the GEMM and its FLOPs."""
    m, k = info["im2col_shape"]
    n = info["weights_shape"][1]
    p = info["padding"]
    return "\n".join([
        f"input (N, H, W, C):      {info['input_shape']}",
        f"padding (t, b, l, r):    ({p['top']}, {p['bottom']}, {p['left']}, {p['right']}) "
        f"-> padded {info['padded_hw'][0]} x {info['padded_hw'][1]}",
        f"output (N, H, W, C_out): {info['output_shape']}",
        f"im2col matrix (M x K):   {m} x {k}  ({info['blowup']:.2f}x the input's values)",
        f"weights (K x N):         {k} x {n}",
        f"GEMM: {m} x {k} x {n} -> {info['macs']:,} MACs = {info['flops']:,} FLOPs (2*M*K*N)",
    ])


def draw(info: dict, pixel=(0, 0), image=None, axes=None):
    """Left: the padded image with every patch's top-left tap and the chosen output pixel's taps.
    Right: the im2col matrix (one row per output pixel) with that pixel's row marked."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    g = info["geometry"]
    hp, wp = info["padded_hw"]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1, 1.3]})
    ax, ax_cols = axes
    if image is None:
        image = np.arange(1, g.h * g.w + 1, dtype=float).reshape(g.h, g.w)
    padded = np.zeros((hp, wp))
    padded[g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w] = image
    inside = np.zeros((hp, wp), bool)
    inside[g.pad_top: g.pad_top + g.h, g.pad_left: g.pad_left + g.w] = True
    ax.imshow(np.where(inside, padded, np.nan), cmap="Blues", vmin=0, vmax=np.nanmax(image) * 1.6)
    ax.imshow(np.where(inside, np.nan, 0.0), cmap="Greys", vmin=-1, vmax=3)  # padding in grey
    for r in range(hp):
        for c in range(wp):
            ax.text(c, r, f"{padded[r, c]:g}", ha="center", va="center", fontsize=7,
                    color="black" if inside[r, c] else "grey")
    taps = info["taps"]
    i, j = min(pixel[0], g.h_out - 1), min(pixel[1], g.w_out - 1)
    for (r, c) in taps[:, :, 0].reshape(-1, 2):  # every patch's first tap: where the kernel lands
        ax.plot(c, r, "o", ms=3, color="tab:orange", alpha=0.6)
    for (r, c) in taps[i, j]:
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="tab:red", lw=2))
    ax.set_title(f"padded input; taps of output ({i}, {j}) in red", fontsize=9)
    ax.set_xticks([]), ax.set_yticks([])
    cols = conv.im2col(padded[None, :, :, None], (g.kh, g.kw), (g.sh, g.sw), "VALID", (g.dh, g.dw))
    ax_cols.imshow(cols, cmap="Blues", aspect="auto", vmin=0, vmax=np.nanmax(image) * 1.6, interpolation="nearest")
    row = i * g.w_out + j
    ax_cols.add_patch(Rectangle((-0.5, row - 0.5), cols.shape[1], 1, fill=False, ec="tab:red", lw=2))
    ax_cols.set_title(f"im2col matrix {cols.shape[0]} x {cols.shape[1]} (one image, C=1); row {row}", fontsize=9)
    ax_cols.set_xlabel("kernel tap (row-major over a, b)")
    ax_cols.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax_cols.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax_cols.set_ylabel("output pixel")
    return axes


def im2col_explorer(image_size=(7, 7), c_in=64, c_out=64, batch_size=1):
    """ipywidgets: sliders for kernel size, stride, padding and dilation redraw the patches and the
    im2col matrix; the text shows the shapes and FLOPs for c_in -> c_out channels. (02_im2col)"""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    style = {"description_width": "110px"}
    s = dict(continuous_update=False, style=style)
    controls = {
        "kh": widgets.IntSlider(3, min=1, max=5, description="kernel height", **s),
        "kw": widgets.IntSlider(3, min=1, max=5, description="kernel width", **s),
        "stride": widgets.IntSlider(1, min=1, max=3, description="stride", **s),
        "dilation": widgets.IntSlider(1, min=1, max=3, description="dilation", **s),
        "padding": widgets.Dropdown(options=["VALID", "SAME", "explicit"], value="VALID", description="padding",
                                    style=style),
        "pad": widgets.IntSlider(1, min=0, max=3, description="explicit pad", **s),
        "size": widgets.IntSlider(image_size[0], min=3, max=10, description="image size", **s),
        "pixel": widgets.IntSlider(0, min=0, max=0, description="output pixel", **s),
    }
    text = widgets.HTML()
    plot = widgets.Output()
    state = {}

    def update(_=None):
        c = {k: v.value for k, v in controls.items()}
        padding = [(c["pad"], c["pad"])] * 2 if c["padding"] == "explicit" else c["padding"]
        try:
            info = explain((c["size"], c["size"]), (c["kh"], c["kw"]), c["stride"], padding, c["dilation"],
                           c_in=c_in, c_out=c_out, batch_size=batch_size)
        except ValueError as err:
            text.value = f"<pre style='color:#b00'>{err}</pre>"
            return
        g = info["geometry"]
        controls["pixel"].max = g.h_out * g.w_out - 1
        state["info"] = info
        text.value = (f"<pre>{summary_text(info)}\n(shapes and FLOPs for {c_in} -> {c_out} channels; "
                      f"the pictures show one channel)</pre>")
        pixel = divmod(min(c["pixel"], g.h_out * g.w_out - 1), g.w_out)
        with plot:
            plot.clear_output(wait=True)
            draw(info, pixel=pixel)
            plt.show()

    for control in controls.values():
        control.observe(update, names="value")
    update()
    box = widgets.VBox([widgets.HBox([widgets.VBox(list(controls.values())[:4]),
                                      widgets.VBox(list(controls.values())[4:])]), text, plot])
    box.controls, box.text, box.state = controls, text, state  # handles for tests and the curious
    return box
