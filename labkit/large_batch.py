"""One worker, no Horovod: how batch size moves throughput, and how the LR must follow it (04_horovod_scaling).

throughput_vs_batch: training images/s of one process for each batch size (the Chameleon slides' table, on
this CPU). lr_scaling_curves: training loss against epochs for a small batch, a k-times larger batch at the
same LR, with the LR scaled k times (Goyal et al. 2017's linear rule) and with gradual warmup. The k*b batch
is what k workers of b would average, computed at once in one process. (04_horovod_scaling)
"""
from __future__ import annotations

import time

import numpy as np


def _local_setup(threads):
    import labkit  # noqa: F401
    import tensorflow as tf
    labkit.quiet()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already started in this process: keep its pools
            pass
    return tf


def _train_step_fn(tf, model, opt):
    from labkit import training
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)  # labkit models end in softmax
    return training.make_train_step(model, opt, loss_fn)


def throughput_vs_batch(batch_sizes=(1, 2, 4, 8, 16, 32, 64), *, model="small_cnn", steps=10, repeats=3,
                        warmup_steps=2, threads=None, seed=0):
    """Training images/s of one worker for each batch size (the Chameleon slides' table, on this CPU)."""
    import pandas as pd
    from labkit import models
    from labkit.rankstats import summarize_times
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"batch_sizes must be positive ints; got {b!r}")
    tf = _local_setup(threads)
    rows = []
    for b in batch_sizes:
        tf.random.set_seed(seed)
        net = models.get(model)
        opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
        step = _train_step_fn(tf, net, opt)
        x = tf.random.normal([b, *net.input_shape[1:]], seed=seed)
        y = tf.zeros([b], tf.int32)
        for _ in range(warmup_steps):
            float(step(x, y))
        times = []
        for _ in range(steps * repeats):
            t0 = time.perf_counter()
            float(step(x, y))
            times.append(time.perf_counter() - t0)
        s = summarize_times(times, b, steps)
        rows.append({"batch_size": b, "images_per_sec": s["images_per_sec"],
                     "images_per_sec_std": s["images_per_sec_std"], "step_time_s": s["step_time_s"]})
    return pd.DataFrame(rows)


def lr_scaling_curves(*, batch_size=32, k=8, lr=0.02, epochs=4, warmup_epochs=1, num_examples=4096,
                      data="synthetic", threads=None, seed=0, evals_per_epoch=4):
    """Training loss vs epochs for: batch b at lr; batch k*b at lr (naive); at k*lr (linear scaling);
    at k*lr with gradual warmup (Goyal et al.). One process: the k*b batch is what k workers of b would
    average, computed at once (exact for SGD on the same examples). Returns a long DataFrame.
    """
    import pandas as pd
    from labkit import models
    from labkit import data as lkdata
    from labkit.training import warmup_lr
    if k < 1 or batch_size < 1 or epochs < 1:
        raise ValueError("k, batch_size and epochs must be >= 1")
    tf = _local_setup(threads)
    if data == "synthetic":
        (x, y), _ = lkdata.synthetic(num_examples, 0, seed=seed)
        name = "synthetic"
    else:
        (x, y), _, info = lkdata.load_dataset(None if data == "auto" else data, n_train=num_examples)
        name = str(getattr(info, "name", info))
    x, y = lkdata.normalize(x), np.asarray(y).reshape(-1).astype("int32")
    configs = [
        (f"b={batch_size}, lr={lr:g}", batch_size, 1.0, 0),
        (f"b={k * batch_size}, lr={lr:g} (no scaling)", k * batch_size, 1.0, 0),
        (f"b={k * batch_size}, lr={k * lr:g} (linear scaling)", k * batch_size, float(k), 0),
        (f"b={k * batch_size}, lr={k * lr:g} + warmup", k * batch_size, float(k), -1),
    ]
    rows = []
    for label, b, scale, warm in configs:
        tf.random.set_seed(seed)
        net = models.get("small_cnn", input_shape=x.shape[1:])
        steps_per_epoch = len(x) // b
        warm_steps = warmup_epochs * steps_per_epoch if warm < 0 else 0
        sched = lambda step, s=scale, w=warm_steps: warmup_lr(step, lr, s, w)  # noqa: E731
        opt = tf.keras.optimizers.legacy.SGD(learning_rate=lambda: sched(opt.iterations), momentum=0.9)
        step = _train_step_fn(tf, net, opt)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(b, drop_remainder=True)
        every = max(1, steps_per_epoch // evals_per_epoch)
        i, run_loss = 0, []
        for epoch in range(epochs):
            for xb, yb in ds:
                loss = float(step(xb, yb))
                run_loss.append(loss if np.isfinite(loss) else 1e3)
                i += 1
                if i % every == 0:
                    rows.append({"config": label, "batch_size": b, "lr_peak": lr * scale,
                                 "epoch": i / steps_per_epoch, "loss": float(np.mean(run_loss)),
                                 "data": name})
                    run_loss = []
    return pd.DataFrame(rows)
