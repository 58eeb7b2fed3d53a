"""One worker of tf.distribute.MultiWorkerMirroredStrategy: the same model and step as labkit.linkbench.

Every worker runs `python -m labkit.tfdist_train --workers HOST:PORT,HOST:PORT --index I --out DIR`
(TensorFlow's own launcher-less design: each process is told the whole cluster and its place in it;
on the virtual cluster, `labkit.vcluster.tfdist_run` starts one per node). It times synced training
steps and writes worker{I}.json with the step times and a checksum of the trainable weights, to be
compared with Horovod's. Introduced in notebooks/04_horovod_scaling.ipynb.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m labkit.tfdist_train", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", required=True, help="HOST:PORT of every worker, comma-separated, in order")
    p.add_argument("--index", type=int, required=True, help="this worker's place in --workers")
    p.add_argument("--model", default="seed002")
    p.add_argument("--batch-size", type=int, default=4, help="images per worker per step")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.worker_list = [w for w in args.workers.split(",") if w]
    if not 0 <= args.index < len(args.worker_list):
        p.error(f"--index must be in 0..{len(args.worker_list) - 1}; got {args.index}")
    if args.batch_size < 1 or args.steps < 1:
        p.error("--batch-size and --steps must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": args.worker_list},
                                          "task": {"type": "worker", "index": args.index}})
    import labkit
    labkit.quiet()
    import numpy as np
    import tensorflow as tf
    from labkit import models
    from labkit.training import weights_checksum as checksum
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # --- the distributed part: a strategy, variables created in its scope, steps through strategy.run
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    size, rank = strategy.num_replicas_in_sync, args.index
    with strategy.scope():
        tf.random.set_seed(0)  # MWMS builds the same initial weights on every worker from the seed
        model = models.get(args.model, input_shape=(32, 32, 3), classes=10)
        opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
    x = tf.random.uniform([args.batch_size, 32, 32, 3], seed=rank + 1)
    y = tf.random.uniform([args.batch_size], maxval=10, dtype=tf.int32, seed=rank + 1)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=False, reduction=tf.keras.losses.Reduction.NONE)  # labkit models end in softmax

    @tf.function
    def step():
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                                  global_batch_size=args.batch_size * size)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces the gradients
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step), axis=None)
    # --- end of the distributed part
    for _ in range(3):
        float(step())
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        float(step())
        times.append(time.perf_counter() - t0)
    result = {"index": rank, "size": size, "host": os.uname().nodename, "model": args.model,
              "batch_size": args.batch_size, "step_times_s": times, "median_step_s": float(np.median(times)),
              "images_per_sec": args.batch_size / float(np.median(times)),
              "checksum_trainable": checksum([v.numpy() for v in model.trainable_variables])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"worker{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
