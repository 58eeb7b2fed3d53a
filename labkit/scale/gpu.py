"""The GPU path: one GPU per Horovod rank, mixed precision with loss scaling, and model-FLOPs utilisation.

pin_to_local_rank is the Horovod recipe (each process on a node sees only the GPU of its local rank);
place_rank applies a run's device (labkit.base.plans.run_device: one GPU per rank, or every rank on the CPU,
never a mix) and puts a node's ranks on the CPU rather than failing where it has fewer GPUs than ranks;
mixed_precision switches Keras to float16 compute with float32 variables, only when asked; mfu is the
fraction of the device's peak that a training step used, as nanoGPT reports it. Every function runs on a CPU
too, so the course's tests check the GPU path without a GPU. (04_horovod_scaling)
"""
from __future__ import annotations

import contextlib
import time

from labkit.base.checks import check_int, check_number


def pin_to_local_rank(local_rank: int, gpus=None):
    """Make only GPU number local_rank visible to this process (Horovod's recipe); returns it, or None on a
    machine without GPUs (nothing changes there).

    gpus: the physical GPUs (default tf.config.list_physical_devices("GPU")). Memory growth is switched on for
    each, so a process takes GPU memory as it needs it, as Horovod's examples do. A local rank without a GPU of
    its own (more processes than GPUs on a node) raises ValueError. (04_horovod_scaling)
    """
    check_int(local_rank, "local_rank", minimum=0)
    import tensorflow as tf

    gpus = list(tf.config.list_physical_devices("GPU") if gpus is None else gpus)
    if not gpus:
        return None
    if local_rank >= len(gpus):
        raise ValueError(f"local_rank {local_rank} has no GPU of its own: this node has {len(gpus)} GPU(s); "
                         f"start at most {len(gpus)} process(es) per node (horovodrun -np N -H host:{len(gpus)})")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpus[local_rank], "GPU")
    return gpus[local_rank]


def place_rank(local_rank: int, local_size: int, device: str | None = None, gpus=None):
    """Put this rank on its device before TensorFlow runs an op: device "cpu" hides every GPU; "gpu" pins the
    GPU of its local rank (pin_to_local_rank: too few GPUs is its ValueError); None: the GPU of its local rank
    where the node has one for each of its local_size ranks, else every rank on the CPU instead of failing.
    Returns the GPU pinned, or None."""
    import tensorflow as tf

    from labkit.base import plans
    from labkit.scale.settings import DEVICES
    check_int(local_size, "local_size", minimum=1)
    if device is not None and device not in DEVICES:
        raise ValueError(f"device must be 'cpu', 'gpu' or None (choose); got {device!r}")
    gpus = list(tf.config.list_physical_devices("GPU") if gpus is None else gpus)
    if device == "gpu" and not gpus:
        raise ValueError("device 'gpu': TensorFlow sees no GPU here (`labkit doctor` says why); use 'cpu' or none")
    device = device or plans.run_device(local_size, len(gpus))  # this node's ranks
    if device == "cpu":
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return None
    return pin_to_local_rank(local_rank, gpus)


@contextlib.contextmanager
def mixed_precision(enabled: bool):
    """Inside the block, Keras layers built compute in float16 and keep float32 variables (policy
    'mixed_float16') when enabled is True; when False nothing changes. The previous policy comes back at the
    end. model.compile wraps the optimizer in a LossScaleOptimizer under this policy; a hand-written step uses
    loss_scaled(optimizer) and train_step. (01_cnn_basics)
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False; got {enabled!r}")
    import tensorflow as tf

    before = tf.keras.mixed_precision.global_policy()
    if enabled:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield tf.keras.mixed_precision.global_policy().name
    finally:
        tf.keras.mixed_precision.set_global_policy(before)


def loss_scaled(optimizer):
    """The optimizer wrapped in tf.keras.mixed_precision.LossScaleOptimizer when the global policy computes in
    float16 (small float16 gradients would round to zero without it), else the optimizer itself.
    (04_horovod_scaling)"""
    import tensorflow as tf

    scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    if tf.keras.mixed_precision.global_policy().compute_dtype == "float16" and not scaled:
        return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def images_per_sec(build_model, batch_size: int, steps: int, *, mixed: bool = False, warmup_steps: int = 1,
                   image_shape=(32, 32, 3), classes: int = 10, seed: int = 0) -> dict:
    """Train build_model() in this process on random images for warmup_steps + steps and time the steps;
    mixed=True under mixed_float16 with loss scaling. Returns images_per_sec, step_s, the last loss and the
    compute / variable dtypes. (04_horovod_scaling)"""
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        check_int(value, name, minimum=1)
    import tensorflow as tf

    from labkit import data
    from labkit.base import training

    with mixed_precision(mixed):
        model = build_model()
        optimizer = loss_scaled(tf.keras.optimizers.SGD(0.01, momentum=0.9))
        step = training.make_train_step(model, optimizer, tf.keras.losses.SparseCategoricalCrossentropy())
        x, y = map(tf.constant, data.random_batch(batch_size, image_shape[0], classes, seed))
        for _ in range(warmup_steps):
            float(step(x, y))
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(x, y)
        loss = float(loss)  # waits for the last step
        elapsed = time.perf_counter() - start
        compute = model.layers[-1].compute_dtype
    return {"images_per_sec": batch_size * steps / elapsed, "step_s": elapsed / steps, "loss": loss,
            "compute_dtype": compute, "variable_dtype": model.trainable_variables[0].dtype.name}


def mfu(images_per_sec: float, forward_flops_per_image: float, peak_flops: float) -> float:
    """Model-FLOPs utilisation: achieved training FLOP/s (3 x forward FLOPs per image x images/s, as
    labkit.flops.training_flops counts them) over the device's peak FLOP/s. (04_horovod_scaling)"""
    for name, value in (("images_per_sec", images_per_sec), ("forward_flops_per_image", forward_flops_per_image),
                        ("peak_flops", peak_flops)):
        check_number(value, name, above=0)
    return 3.0 * forward_flops_per_image * images_per_sec / peak_flops


def mfu_line(images_per_sec: float, forward_flops_per_image: float, peak_flops: float, where: str) -> str:
    """The MFU as a notebook prints it; above 100 % it says the peak was not this device's (a peak measured
    with another engine, or on a busy machine) instead of standing as a figure. (07_scaling_deep_dive)"""
    fraction = mfu(images_per_sec, forward_flops_per_image, peak_flops)
    line = f"MFU = {100 * fraction:.0f} % of {peak_flops / 1e9:,.0f} GFLOP/s ({where})"
    if fraction > 1:
        line += ": above 100 %, so that figure is not this device's peak (measured slower than the training ran)"
    return line


def device_name() -> str:
    """The GPU this process computes on, as TensorFlow names it (e.g. 'NVIDIA H100 80GB HBM3'), or 'CPU'."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def tf_gemm_rate(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of TensorFlow's float32 tf.linalg.matmul of two n x n matrices on this process's device and threads,
    the fastest of repeats after a warm-up (a peak is a best case). (07_scaling_deep_dive)"""
    check_int(n, "n", minimum=1)
    check_int(repeats, "repeats", minimum=1)
    import tensorflow as tf

    a = tf.random.stateless_normal((n, n), seed=(0, 1))
    b = tf.random.stateless_normal((n, n), seed=(0, 2))
    matmul = tf.function(lambda x, y: tf.reduce_sum(tf.linalg.matmul(x, y)))  # .numpy() waits for the product
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best


def peak_flops(device: str | None = None, precision: str = "fp32", *, gemm_size: int = 1024) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) for device (default: the one TensorFlow computes on): a GPU of
    labkit.flops.hardware's datasheet table, matched by name, or the CPU, whose peak is TensorFlow's own float32
    matmul rate (tf_gemm_rate, gemm_size^3, in this process: the engine and threads the training uses, so a
    training step cannot beat it; numpy's BLAS may run another kernel). (04_horovod_scaling)"""
    from labkit.flops import hardware

    name = device_name() if device is None else device
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"device must be a GPU name from labkit.flops.hardware or 'CPU'; got {device!r}")
    if name.strip().upper() == "CPU":
        rate = tf_gemm_rate(gemm_size)
        return rate, f"this CPU's float32 matmul rate in TensorFlow ({gemm_size}^3, fastest of 5)"
    for key, dev in hardware.DEVICES.items():
        if key.lower() in name.lower().replace("-", " ").split() or key.lower() == name.strip().lower():
            return dev.peak_flops(precision), f"{dev.model} datasheet {precision} peak ({dev.source})"
    raise ValueError(f"device {name!r} is not in labkit.flops.hardware's table ({', '.join(hardware.DEVICES)}) "
                     "and is not 'CPU'")
