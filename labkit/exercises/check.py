"""Exercise checkers: an answer -> a success line, a hint for a recognised mistake, or "not answered yet".

Each checker is called in the cell after an exercise as `ref = check.NAME(answer, **the exercise's numbers)`.
It prints one line and returns the reference value, computed with labkit's own functions, so the lesson goes on
with the right number whether or not the learner got there. It never raises at the learner: None (the learner
edition's placeholder), text, NaN or an array of the wrong shape are all answered with a line. For tests and
tools, `check.NAME.judge(answer, **numbers)` returns the Verdict instead of printing it. (01_cnn_basics)
"""
from __future__ import annotations

import math

import numpy as np

from labkit.exercises.verdict import CHECKERS, NOT_ANSWERED, Spec, Verdict, checker  # noqa: F401 (the checkers' API)


# ------------------------------------------------------------------------------------ 01_cnn_basics
def _out_size(size, kernel, stride, pad_total):
    from labkit import conv
    return conv.geometry((1, size, 1, 1), (kernel, 1), (stride, 1), [(pad_total // 2, pad_total - pad_total // 2),
                                                                      (0, 0)]).h_out


@checker
def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> Spec:
    """Output height of a convolution: floor((size + 2 padding - kernel) / stride) + 1. (01_cnn_basics)"""
    n, k, s, p = size, kernel, stride, padding
    out = _out_size(n, k, s, 2 * p)
    return Spec(out, mistakes=[
        ("no_plus_one", (n + 2 * p - k) // s, "off by one: the first window position counts too, so add 1 "
                                              "after dividing by the stride."),
        ("no_padding", _out_size(n, k, s, 0), "the padding is missing: it adds `padding` pixels on each side."),
        ("one_side_padding", _out_size(n + p, k, s, 0), "padding goes on both sides: add 2 x padding, not once."),
        ("no_stride", _out_size(n, k, 1, 2 * p), "divide by the stride: the window jumps `stride` pixels."),
        ("ceil", math.ceil((n + 2 * p - k) / s) + 1, "round down: a window that would stick out past the "
                                                     "padded edge is not computed (floor, not ceil)."),
    ], hint="Count the window positions: floor((size + 2 x padding - kernel) / stride) + 1.",
        success=f"a {k}x{k} kernel at stride {s} with padding {p} turns {n} pixels into {out}.")


@checker
def dense_output(x, w, b) -> Spec:
    """A dense layer's output as one matrix multiply: x @ w + b, shape (batch, outputs). (01_cnn_basics)"""
    x, w, b = (np.asarray(v, dtype=np.float64) for v in (x, w, b))
    y = x @ w + b
    return Spec(y, kind="array", mistakes=[
        ("no_bias", x @ w, "you forgot the bias: add b (one number per output) after the product."),
        ("transposed", y.T, f"shapes transposed: a dense layer computes x @ w, (batch, inputs) times (inputs, "
                            f"outputs), giving (batch, outputs) = {y.shape}."),
        ("transposed_no_bias", (x @ w).T, "shapes transposed and the bias missing: x @ w + b."),
    ], hint="A dense layer is x @ w + b (numpy's @ is the matrix multiply).",
        success=f"one matrix multiply, (batch, inputs) @ (inputs, outputs) = {y.shape}, plus the bias.")


@checker
def pool_output_shape(input_shape, pool_size: int, strides: int) -> Spec:
    """(height, width, channels) after max pooling without padding: the spatial rule of a convolution.

    (01_cnn_basics)
    """
    h, w, c = (int(v) for v in input_shape)
    out = (_out_size(h, pool_size, strides, 0), _out_size(w, pool_size, strides, 0), c)
    return Spec(out, kind="shape", mistakes=[
        ("wrong_rank", lambda a: len(a) != 3, "give three numbers: (height, width, channels)."),
        ("channels", lambda a: a[:2] == out[:2] and a[2] != c, f"pooling works on each channel separately: "
                                                               f"the {c} channels stay {c}."),
        ("no_stride", (h - pool_size + 1, w - pool_size + 1, c), "divide by the stride: the window jumps "
                                                                 f"{strides} pixels at a time."),
        ("no_plus_one", ((h - pool_size) // strides, (w - pool_size) // strides, c),
         "off by one: floor((size - pool) / stride) + 1 windows fit."),
        ("halved", (h // strides, w // strides, c), f"not quite half: a {pool_size}x{pool_size} window needs "
                                                    "room to fit, floor((size - pool) / stride) + 1."),
    ], hint="Per spatial side: floor((size - pool) / stride) + 1; the channels are unchanged.",
        success=f"{tuple(input_shape)} -> {out}.")


# ------------------------------------------------------------------------------------ 02_im2col
def _geometry(input_shape, kernel_size, strides, padding):
    from labkit import conv
    return conv.geometry(tuple(input_shape), kernel_size, strides, padding)


@checker
def im2col_shape(input_shape, kernel_size, strides=1, padding="VALID") -> Spec:
    """Shape of the im2col matrix: (N * H_out * W_out, kh * kw * C_in). (02_im2col)"""
    g = _geometry(input_shape, kernel_size, strides, padding)
    m, k = g.cols_shape
    return Spec((m, k), kind="shape", mistakes=[
        ("transposed", (k, m), "shapes transposed: one ROW per output pixel, one COLUMN per patch value."),
        ("no_channels", (m, g.kh * g.kw), "each patch holds every input channel: K = kh x kw x C_in."),
        ("input_pixels", (g.n * g.h * g.w, k), "one row per OUTPUT pixel (H_out x W_out), not per input pixel."),
        ("no_batch", (g.h_out * g.w_out, k), f"every image of the batch adds its rows: times N = {g.n}."),
    ], hint="Rows: N x H_out x W_out output pixels; columns: kh x kw x C_in values per patch.",
        success=f"M = {m:,} output pixels by K = {k} values per patch.")


@checker
def patch(x, kernel_size, pixel, strides=1) -> Spec:
    """The im2col row of one output pixel (VALID padding): the kh x kw x C patch, flattened row by row. (02_im2col)"""
    from labkit import conv
    x = np.asarray(x, dtype=np.float64)
    g = _geometry(x.shape, kernel_size, strides, "VALID")
    i, j = pixel
    row = conv.im2col(x, kernel_size, strides)[i * g.w_out + j]
    top, left = i * g.sh, j * g.sw
    window = x[0, top:top + g.kh, left:left + g.kw, :]
    mistakes = [
        ("not_flat", lambda a: a.size == row.size and a.shape != row.shape and np.allclose(a.ravel(), row),
         "right numbers, but flatten the patch into one row: .reshape(-1) or .ravel()."),
        ("channel_order", window.transpose(2, 0, 1).ravel(),
         "order the values (row, column, channel), as .ravel() does on an NHWC slice, not channel first."),
        ("no_stride", x[0, i:i + g.kh, j:j + g.kw, :].ravel(), f"output pixel (i, j) starts at input (i x "
                                                               f"stride, j x stride) = ({top}, {left})."),
        ("swapped", x[0, j * g.sh:j * g.sh + g.kh, i * g.sw:i * g.sw + g.kw, :].ravel(),
         "row and column swapped: pixel (i, j) is row i, column j."),
    ]
    return Spec(row, kind="array", mistakes=mistakes,
                hint="Slice x[0, i*stride : i*stride + kh, j*stride : j*stride + kw, :] and flatten it.",
                success=f"row {i * g.w_out + j} of the im2col matrix: the {g.kh}x{g.kw}x{g.c} window at "
                        f"({top}, {left}).")


@checker
def gemm_flops(input_shape, kernel_size, c_out: int, strides=1, padding="VALID") -> Spec:
    """FLOPs of a convolution as one GEMM: 2 x M x K x N (M output pixels, K patch values, N filters). (02_im2col)"""
    g = _geometry(input_shape, kernel_size, strides, padding)
    m, k = g.cols_shape
    flops = g.flops(c_out)
    return Spec(flops, rtol=5e-3, mistakes=[
        ("macs", m * k * c_out, "that is the number of multiply-adds (MACs); each one is 2 FLOPs."),
        ("input_pixels", 2 * g.n * g.h * g.w * k * c_out, "M counts OUTPUT pixels (N x H_out x W_out)."),
        ("no_kernel", 2 * m * g.c * c_out, "K = kh x kw x C_in: every value of the patch is multiplied."),
    ], hint="FLOPs = 2 x M x K x N with M = N_batch x H_out x W_out, K = kh x kw x C_in, N = C_out.",
        success=f"2 x {m:,} x {k} x {c_out} = {flops / 1e9:.3f} GFLOP.")


@checker
def im2col_mib(input_shape, kernel_size, strides=1, padding="VALID", bytes_per_value: int = 4) -> Spec:
    """Memory of the im2col matrix in MiB: M x K values x bytes per value / 2**20. (02_im2col)"""
    g = _geometry(input_shape, kernel_size, strides, padding)
    m, k = g.cols_shape
    values = m * k
    mib = values * bytes_per_value / 2**20
    return Spec(mib, rtol=1e-2, mistakes=[
        ("values_not_bytes", values / 2**20, f"that counts values; each float32 value takes {bytes_per_value} "
                                             "bytes."),
        ("mb_not_mib", values * bytes_per_value / 1e6, "that is MB (10^6 bytes); a MiB is 2^20 = 1,048,576 bytes."),
        ("input_size", g.n * g.h * g.w * g.c * bytes_per_value / 2**20, "that is the input's size; im2col copies "
                                                                         "every input pixel up to kh x kw times."),
    ], hint="The matrix is M x K values (see its shape); times 4 bytes; divide by 2^20 for MiB.",
        success=f"{m:,} x {k} values x {bytes_per_value} bytes = {mib:,.1f} MiB.")


# ------------------------------------------------------------------------------------ 03_flops
def _one_conv(input_hw, kernel, c_in, c_out, stride, padding):
    import tensorflow as tf

    from labkit import flops
    h, w = (input_hw, input_hw) if isinstance(input_hw, int) else input_hw
    model = tf.keras.Sequential([tf.keras.Input((h, w, c_in)),
                                 tf.keras.layers.Conv2D(c_out, kernel, strides=stride, padding=padding)])
    return flops.count(model), model.layers[-1].output_shape


@checker
def conv_macs(input_hw, kernel: int, c_in: int, c_out: int, stride: int = 1, padding: str = "same") -> Spec:
    """Multiply-adds of one conv layer: H_out x W_out x kh x kw x C_in x C_out (labkit.flops counts them). (03_flops)"""
    report, shape = _one_conv(input_hw, kernel, c_in, c_out, stride, padding)
    macs, (_, h_out, w_out, _) = report.macs, shape
    return Spec(macs, rtol=5e-3, mistakes=[
        ("flops", 2 * macs, "that is FLOPs: a multiply-add is 2 FLOPs, and MACs count the pair once."),
        ("no_c_in", h_out * w_out * kernel * kernel * c_out, "each output value sums over all C_in input "
                                                             "channels: times C_in."),
        ("no_kernel", h_out * w_out * c_in * c_out, f"each output value needs kh x kw x C_in = "
                                                    f"{kernel * kernel * c_in} multiply-adds."),
    ], hint="MACs = H_out x W_out x (kh x kw x C_in) x C_out.",
        success=f"{macs / 1e9:.3f} G MACs = {2 * macs / 1e9:.3f} GFLOPs per image.")


@checker
def conv_params(kernel: int, c_in: int, c_out: int, bias: bool = True) -> Spec:
    """Learnable parameters of a conv layer: kh x kw x C_in x C_out weights (+ C_out biases). (03_flops)"""
    report, _ = _one_conv(kernel, kernel, c_in, c_out, 1, "valid")  # the smallest input the kernel fits
    params = report.params if bias else report.params - c_out
    weights = kernel * kernel * c_in * c_out
    return Spec(params, mistakes=[
        ("no_bias", weights if bias else None, f"you forgot the bias: one per filter, + {c_out}."),
        ("no_c_in", kernel * kernel * c_out + c_out, "every filter spans all C_in input channels: "
                                                     f"kh x kw x {c_in} weights per filter."),
        ("bias_per_input", weights + c_in * c_out, "one bias per filter (output channel), not per input channel."),
        ("one_kernel_side", kernel * c_in * c_out + c_out, "the kernel is kh x kw, both sides."),
    ], hint="(kh x kw x C_in + 1) x C_out: weights of each filter plus its bias.",
        success=f"({kernel} x {kernel} x {c_in} + 1) x {c_out} = {params:,} parameters.")


@checker
def activation_mb(shape, batch_size: int, bytes_per_value: int = 4) -> Spec:
    """Memory of one layer's output for a batch in MB (10^6 bytes): batch x H x W x C x 4 bytes. (03_flops)"""
    per_image = int(np.prod([int(v) for v in shape]))
    mb = batch_size * per_image * bytes_per_value / 1e6
    return Spec(mb, rtol=1e-2, mistakes=[
        ("no_batch", per_image * bytes_per_value / 1e6, f"that is one image; the batch holds {batch_size}."),
        ("values_not_bytes", batch_size * per_image / 1e6, f"that counts values; float32 takes "
                                                           f"{bytes_per_value} bytes each."),
        ("mib", batch_size * per_image * bytes_per_value / 2**20, "that is MiB (2^20 bytes); this asks for MB "
                                                                  "(10^6 bytes)."),
    ], hint="batch x H x W x C values x 4 bytes, divided by 10^6.",
        success=f"{batch_size} x {per_image:,} values x {bytes_per_value} bytes = {mb:,.1f} MB.")


# ------------------------------------------------------------------------------------ 04_horovod_scaling
def _ring_time(n_bytes, p):
    """Ring allreduce time with alpha = 0 and beta = 1 s/byte: numerically the bytes one rank sends."""
    try:
        from labkit.scale.allreduce import ring_allreduce_time
    except ImportError:
        try:
            from labkit.scale.scaling import ring_allreduce_time
        except ImportError:
            return 2 * (p - 1) / p * n_bytes
    return float(ring_allreduce_time(n_bytes, p, alpha=0.0, beta=1.0))


@checker
def ring_bytes_sent(n_bytes: float, workers: int) -> Spec:
    """Bytes each rank sends in a ring allreduce of n bytes on p workers: 2 (p - 1) / p x n. (04_horovod_scaling)"""
    p, n = workers, n_bytes
    sent = _ring_time(n, p)
    return Spec(sent, rtol=5e-3, mistakes=[
        ("no_fraction", 2 * n, "(p-1)/p is missing: each of the 2(p-1) steps sends one chunk of n/p bytes, "
                               "not the whole buffer."),
        ("one_phase", (p - 1) / p * n, "that is one phase; a ring allreduce is a reduce-scatter then an "
                                       "allgather: times 2."),
        ("naive", (p - 1) * n, "that is sending the whole buffer to every other worker; the ring sends chunks."),
        ("one_chunk", n / p, "that is one step's chunk; there are 2(p-1) steps."),
    ], hint="2 (p-1) steps (reduce-scatter then allgather), each sending a chunk of n/p bytes.",
        success=f"2 x ({p}-1)/{p} x {n / 1e6:,.1f} MB = {sent / 1e6:,.1f} MB per rank, almost independent of p.")


def _scaled_lr(base_lr, batch_size, base_batch_size):
    try:
        from labkit.base.training import scaled_lr
    except ImportError:
        return base_lr * batch_size / base_batch_size
    return scaled_lr(base_lr, batch_size, base_batch_size)


@checker
def scaled_lr(base_lr: float, base_batch_size: int, batch_per_worker: int, workers: int) -> Spec:
    """The linear scaling rule (Goyal et al. 2017): LR = base LR x total batch / base batch. (04_horovod_scaling)"""
    total = batch_per_worker * workers
    lr = _scaled_lr(base_lr, total, base_batch_size)
    return Spec(lr, mistakes=[
        ("unscaled", base_lr, f"the batch is now {total} images per step; scale the LR with it."),
        ("per_worker_batch", _scaled_lr(base_lr, batch_per_worker, base_batch_size),
         f"the batch that counts is the total over all workers: {workers} x {batch_per_worker} = {total}."),
        ("workers_only", base_lr * workers, f"scale by the total batch over the base batch ({total}/"
                                            f"{base_batch_size}), not by the number of workers alone."),
        ("sqrt", base_lr * math.sqrt(total / base_batch_size), "that is the square-root rule; Goyal et al.'s "
                                                               "rule is linear."),
    ], hint="LR = base LR x (workers x batch per worker) / base batch.",
        success=f"{base_lr} x {total} / {base_batch_size} = {lr:g}.")


@checker
def warmup_lr(base_lr: float, target_lr: float, step: int, warmup_steps: int) -> Spec:
    """Gradual warmup (Goyal et al. 2017): a straight line from the base LR to the target LR over warmup_steps.

    (04_horovod_scaling)
    """
    ramp = min(step / warmup_steps, 1.0)
    try:  # the one warmup schedule, where it exists
        from labkit.base.training import warmup_lr as schedule
        lr = float(schedule(step, base_lr, scale=target_lr / base_lr, warmup_steps=warmup_steps))
    except ImportError:
        lr = base_lr + (target_lr - base_lr) * ramp
    return Spec(lr, rtol=1e-4, mistakes=[
        ("no_warmup", target_lr, f"step {step} is still inside the {warmup_steps}-step warmup: the LR is "
                                 "on its way up."),
        ("from_zero", target_lr * ramp, f"the ramp starts at the base LR ({base_lr}), not at 0."),
        ("unscaled", base_lr, "the warmup climbs towards the scaled LR; it does not stay at the base LR."),
    ], hint="base + (target - base) x step / warmup_steps.",
        success=f"{100 * ramp:.0f} % of the way from {base_lr:g} to {target_lr:g}: {lr:.4g}.")


@checker
def efficiency(images_per_sec_1: float, images_per_sec_n: float, workers: int) -> Spec:
    """Weak-scaling efficiency: throughput at n workers / (n x throughput at 1 worker), as a fraction.

    (04_horovod_scaling)
    """
    try:
        import pandas as pd

        from labkit.scale.scaling import efficiency as table_efficiency
        df = pd.DataFrame({"np": [1, workers], "images_per_sec": [images_per_sec_1, images_per_sec_n]})
        eff = float(table_efficiency(df)["efficiency"].iloc[-1])
    except (ImportError, KeyError):  # the table's home moved: the same definition
        eff = images_per_sec_n / (workers * images_per_sec_1)
    speedup = images_per_sec_n / images_per_sec_1
    return Spec(eff, rtol=1e-3, mistakes=[
        ("speedup", speedup, f"that is the speedup; efficiency divides it by the {workers} workers."),
        ("inverted", 1 / eff, "upside down: measured throughput over the ideal (n x one worker's)."),
        ("percent", 100 * eff, "right number as a percentage; give it as a fraction (0.85, not 85)."),
    ], hint="efficiency = speedup / n, the speedup being n workers' images/s over one worker's.",
        success=f"{images_per_sec_n:g} / ({workers} x {images_per_sec_1:g}) = {eff:.3f}.")


# ------------------------------------------------------------------------------------ 05_network_sweep
@checker
def memory_footprint(filters: int, filter_size: int, pool_size: int, extra_conv: bool = False) -> Spec:
    """The MATLAB paper's memory footprint in bytes: 4 bytes x learnable parameters (weights and biases).

    (05_network_sweep)
    """
    from labkit.models.cifar import memory_footprint as footprint
    from labkit.models.cifar import sweep_net
    model = sweep_net(filters, filter_size, pool_size, extra_conv)
    total = footprint(model)
    biases = sum(int(np.prod(w.shape)) for w in model.trainable_weights if "bias" in w.name)
    return Spec(total, rtol=1e-3, mistakes=[
        ("params", total / 4, "that is the number of parameters; each takes 4 bytes in single precision."),
        ("no_bias", total - 4 * biases, f"the biases are missing: one per filter and per output, {biases} in all."),
        ("bits", 8 * total, "that is bits; divide by 8 for bytes."),
        ("kilobytes", total / 1e3, "that is kB (1,000 bytes each); this asks for bytes: give the number of bytes, "
                                   "1,000 times that."),
        ("kibibytes", total / 2**10, "that is KiB (1,024 bytes each); this asks for bytes: give the number of "
                                     "bytes, 1,024 times that."),
    ], hint="Sum (k x k x C_in + 1) x filters over the convs, (inputs + 1) x 10 for the dense layer; times 4.",
        success=f"{total // 4:,} parameters x 4 bytes = {total:,} bytes = {total / 1e3:.1f} kB.")


def _front(points):
    try:
        from labkit.sweep.runner import pareto_front
    except ImportError:
        from labkit.sweep.networks import pareto_front
    return pareto_front(points)


def _beaten_by(points, i):
    m, a = points[i]
    for j, (mj, aj) in enumerate(points):
        if j != i and mj <= m and aj >= a and (mj < m or aj > a):
            return j
    return None


@checker
def beaten_by(points, index: int) -> Spec:
    """The indices of the (memory, accuracy) points that beat point `index`: less or equal memory and higher or
    equal accuracy, one of the two strictly. (05_network_sweep)"""
    points = [tuple(p) for p in points]
    m, a = points[index]
    others = [j for j in range(len(points)) if j != index]
    beats = frozenset(j for j in others if points[j][0] <= m and points[j][1] >= a and points[j] != (m, a))
    return Spec(sorted(beats), kind="indices", mistakes=[
        ("memory_only", frozenset(j for j in others if points[j][0] <= m),
         "a point with less memory but lower accuracy does not beat it: it must be at least as good on both axes."),
        ("accuracy_only", frozenset(j for j in others if points[j][1] >= a),
         "a point with higher accuracy but more memory does not beat it: it must be at least as good on both axes."),
    ], hint="Compare each other point on both axes at once: memory <= and accuracy >=.",
        success=(f"point {index} {points[index]} is beaten by " +
                 (", ".join(f"{j} {points[j]}" for j in sorted(beats)) if beats else "no point: it is on the front") +
                 "."))


@checker
def pareto_front(points) -> Spec:
    """The indices of the Pareto front of (memory, accuracy) points: none is beaten on both axes. (05_network_sweep)"""
    points = [tuple(p) for p in points]
    front = frozenset(_front(points))

    def which(given):
        extra = sorted(given - front)
        if extra:
            j = _beaten_by(points, extra[0])
            return (f"point {extra[0]} {points[extra[0]]} is beaten by point {j} {points[j]}: less or equal memory "
                    "and higher or equal accuracy.")
        missing = sorted(front - given)
        return (f"point {missing[0]} {points[missing[0]]} is on the front too: no point beats it on both memory and "
                "accuracy.")

    in_range = lambda a: all(0 <= i < len(points) for i in a)  # noqa: E731
    return Spec(front, kind="indices", mistakes=[
        ("out_of_range", lambda a: not in_range(a), f"indices run from 0 to {len(points) - 1}."),
        ("maximised_memory", frozenset(_front([(-m, a) for m, a in points])) or None,
         "less memory is better: a point is beaten by one with LESS memory and more accuracy."),
        ("extra_or_missing", lambda a: in_range(a), which),
    ], success=f"the front is {sorted(front)}, ordered by memory.")


# ------------------------------------------------------------------------------------ 06_transfer_learning
@checker
def frozen_layers(model, head: str = "new_fc") -> Spec:
    """Strategy (a): which layers to freeze, i.e. every layer with weights except the new head.

    (06_transfer_learning)
    """
    named = [layer.name for layer in model.layers]
    with_weights = [layer.name for layer in model.layers if layer.weights]
    expected = frozenset(n for n in with_weights if n != head)
    return Spec(expected, kind="names", ignore=tuple(n for n in named if n not in with_weights), mistakes=[
        ("unknown", lambda a: not a <= set(named), f"use the model's layer names: {', '.join(with_weights)}."),
        ("head_frozen", lambda a: head in a, f"{head!r} is the new head: frozen, nothing would learn at all."),
        ("missing", lambda a: a < expected, lambda a: f"{sorted(expected - a)[0]!r} still trains: strategy (a) "
                                                      "freezes every pretrained layer with weights."),
    ], hint="Freeze every pretrained layer that has weights; keep only the new head trainable.",
        success=f"freeze {', '.join(sorted(expected))}; only {head!r} learns.")


@checker
def effective_lr(lr: float, transfer_lr_drop: float, factor: float) -> Spec:
    """The learning rate a layer really gets: (global LR / transfer drop) x the layer's LR factor.

    (06_transfer_learning)
    """
    eff = lr / transfer_lr_drop * factor
    return Spec(eff, mistakes=[
        ("no_factor", lr / transfer_lr_drop, f"the layer's factor multiplies the LR: x {factor:g}."),
        ("no_drop", lr * factor, f"fine-tuning first lowers the global LR by {transfer_lr_drop:g}."),
        ("divided", lr / transfer_lr_drop / factor, "a factor of 10 makes the layer learn 10 times FASTER: "
                                                     "multiply."),
    ], hint="effective LR = (lr / transfer_lr_drop) x factor.",
        success=f"{lr:g} / {transfer_lr_drop:g} x {factor:g} = {eff:g}.")


@checker
def head_params(base, classes: int) -> Spec:
    """Trainable parameters of strategy (a): the new head only, features x classes + classes. (06_transfer_learning)"""
    from labkit import transfer
    model = transfer.transfer_model(base, classes, freeze_base=True)
    counts = transfer.param_counts(model)
    features = int(model.get_layer(transfer.HEAD).kernel.shape[0])
    return Spec(counts["trainable"], mistakes=[
        ("no_bias", features * classes, f"the head's biases train too: + {classes}."),
        ("everything", counts["trainable"] + counts["frozen"], "that is the whole network; the frozen base "
                                                               "does not train."),
        ("base", counts["frozen"], "that is the frozen base; the question is what still trains."),
    ], hint="The new dense layer: (features + 1) x classes.",
        success=f"({features:,} features + 1) x {classes} classes = {counts['trainable']:,} trainable parameters.")


# ------------------------------------------------------------------------------------ code exercises (01-06)
from labkit.exercises.check_code import conv_macs_function, im2col_function, training_step  # noqa: E402,F401
from labkit.exercises.check_code_models import pareto_function, transfer_function  # noqa: E402,F401
from labkit.exercises.check_hvd import keras_hvd  # noqa: E402,F401  (04: a script, judged by running it)
from labkit.exercises.check_resume import resume_hvd  # noqa: E402,F401  (08: a script stopped part way and resumed)
