"""One worker, no Horovod: how batch size moves throughput, and how the LR must follow it (04_horovod_scaling).

throughput_vs_batch: training images/s of one process for each batch size (the Chameleon slides' table, on
this CPU). lr_scaling_curves: validation accuracy against epochs and time for a small batch, a k-times larger batch
at the same LR, with the LR scaled k times (Goyal et al. 2017's linear rule) and with gradual warmup. The k*b batch
is what k workers of b would average, computed at once in one process. (04_horovod_scaling)
"""
from __future__ import annotations

import time

import numpy as np

from labkit.base.checks import check_int, check_ints, check_number


def _local_setup(threads):
    import tensorflow as tf

    import labkit  # noqa: F401
    labkit.quiet()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already started in this process: keep its pools
            pass
    return tf


def _train_step_fn(tf, model, opt):
    from labkit.base import training
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)  # labkit models end in softmax
    return training.make_train_step(model, opt, loss_fn)


def throughput_vs_batch(batch_sizes=(1, 2, 4, 8, 16, 32, 64), *, model="small_cnn", steps=10, repeats=3,
                        warmup_steps=2, threads=None, seed=0):
    """Training images/s of one worker for each batch size (the Chameleon slides' table, on this CPU)."""
    import pandas as pd

    from labkit import models
    from labkit.base import config
    from labkit.base.rankstats import summarize_times
    batch_sizes = check_ints(batch_sizes, "batch_sizes", minimum=1)
    tf = _local_setup(threads)
    rows = []
    for b in batch_sizes:
        config.set_seed(seed)
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
                      num_val=1000, data="synthetic", threads=None, seed=0, evals_per_epoch=2):
    """Validation accuracy against epochs and training time: b at lr, k*b at lr, at k*lr, at k*lr with warmup."""
    import pandas as pd

    from labkit import data as lkdata
    for name, v in (("k", k), ("batch_size", batch_size), ("epochs", epochs), ("num_val", num_val),
                    ("evals_per_epoch", evals_per_epoch)):
        check_int(v, name, minimum=1)
    check_number(warmup_epochs, "warmup_epochs", minimum=0, maximum=epochs)
    check_int(num_examples, "num_examples", minimum=k * batch_size)  # at least one large batch
    tf = _local_setup(threads)
    if data == "synthetic":
        (x, y), (xv, yv) = lkdata.synthetic(num_examples, num_val, seed=seed)
        name = "synthetic"
    else:
        (x, y), (xv, yv), info = lkdata.load_dataset(None if data == "auto" else data, n_train=num_examples,
                                                     n_test=num_val)
        name = str(getattr(info, "name", info))
    x, y = lkdata.normalize(x), np.asarray(y).reshape(-1).astype("int32")
    val = lkdata.normalize(xv), np.asarray(yv).reshape(-1).astype("int32")
    configs = [
        (f"b={batch_size}, lr={lr:g}", batch_size, 1.0, False),
        (f"b={k * batch_size}, lr={lr:g} (no scaling)", k * batch_size, 1.0, False),
        (f"b={k * batch_size}, lr={k * lr:g} (linear scaling, no warmup)", k * batch_size, float(k), False),
        (f"b={k * batch_size}, lr={k * lr:g} + warmup", k * batch_size, float(k), True),
    ]
    rows = []
    for label, b, scale, warm in configs:
        points = _lr_curve(tf, x, y, val, b, lr, scale, warmup_epochs if warm else 0, epochs, evals_per_epoch, seed)
        rows += [{"config": label, "batch_size": b, "lr_peak": lr * scale, "warmup": warm, **pt, "data": name}
                 for pt in points]
    return pd.DataFrame(rows)


def _lr_curve(tf, x, y, val, b, lr, scale, warmup_epochs, epochs, evals_per_epoch, seed) -> list[dict]:
    """One configuration of lr_scaling_curves trained from the same start: its points (epoch, train_s, loss,
    val_acc), evals_per_epoch per epoch, the evaluations left out of train_s."""
    from labkit import models
    from labkit.base import config
    from labkit.base.training import warmup_lr
    config.set_seed(seed)
    net = models.get("small_cnn", input_shape=x.shape[1:])
    steps_per_epoch = len(x) // b
    warm_steps = int(round(warmup_epochs * steps_per_epoch))
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=lambda: warmup_lr(opt.iterations, lr, scale, warm_steps),
                                         momentum=0.9)
    step = _train_step_fn(tf, net, opt)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(b, drop_remainder=True)
    every = max(1, steps_per_epoch // evals_per_epoch)
    i, run_loss, train_s, points = 0, [], 0.0, []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for xb, yb in ds:
            loss = float(step(xb, yb))
            run_loss.append(loss if np.isfinite(loss) else 1e3)
            i += 1
            if i % every == 0:
                train_s += time.perf_counter() - t0
                pred = np.argmax(net.predict(val[0], batch_size=500, verbose=0), axis=1)
                points.append({"epoch": i / steps_per_epoch, "train_s": train_s, "loss": float(np.mean(run_loss)),
                               "val_acc": float(np.mean(pred == val[1]))})
                run_loss = []
                t0 = time.perf_counter()
        train_s += time.perf_counter() - t0  # the epoch's steps after its last evaluation
    return points
