"""Rank script: allreduce calibration and interleaved compute-only / synced training steps, in one launch.

    horovodrun -np 2 -H labkit-node1:1,labkit-node2:1 --gloo python -m labkit.deepdive.linkbench --out DIR

Every rank (1) times chains of dependent hvd.allreduce calls per message size (the data the ring model's
alpha and beta are fitted to), then (2) times training steps of one model in three variants, interleaved
repeat by repeat so that a change in machine load hits all of them alike: `compute` (no gradient
exchange: what one node alone would take), `sync` (hvd.DistributedGradientTape, float32 on the wire) and
`sync_fp16` (hvd.Compression.fp16: half the bytes). It writes rank{R}.json to --out. Driven by
labkit.deepdive.vcluster; introduced in notebooks/07_scaling_deep_dive.ipynb.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from labkit.base.checks import check_int


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m labkit.deepdive.linkbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4096,65536,262144,1048576,4194304,8388608", help="allreduce bytes")
    p.add_argument("--chain", type=int, default=5, help="dependent allreduces per timed call")
    p.add_argument("--calib-repeats", type=int, default=7)
    p.add_argument("--model", default="convblock_net", help="a labkit.models name")
    p.add_argument("--batch-size", type=int, default=4, help="images per rank per step")
    p.add_argument("--steps", type=int, default=4, help="steps per variant per repeat")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--variants", default="compute,sync,sync_fp16")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        for name in ("chain", "calib_repeats", "batch_size", "steps", "repeats", "threads"):
            check_int(getattr(args, name), "--" + name.replace("_", "-"), minimum=1)
    except ValueError as err:
        p.error(str(err))
    bad = set(args.variants.split(",")) - {"compute", "sync", "sync_fp16"}
    if bad:
        p.error(f"--variants must name compute, sync, sync_fp16; got {','.join(sorted(bad))}")
    try:
        args.size_list = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes must be comma-separated byte counts; got {args.sizes!r}")
    return args


def _calibrate(tf, hvd, sizes, chain, repeats):
    """Seconds per allreduce for each size: all sizes traced and warmed first, then timed round-robin."""
    def make(n):
        t = tf.ones([max(1, n // 4)], tf.float32)

        @tf.function
        def run(x):
            for k in range(chain):  # each depends on the previous: no fusion, `chain` separate rounds
                # a name per size: Horovod caches each name's negotiation, and a name seen with another
                # shape forces a full renegotiation (~10 ms here), which is not the cost being measured
                x = hvd.allreduce(x, op=hvd.Average, name=f"calib_{n}_{k}")
            return x
        return lambda: run(t)

    runs = {n: make(n) for n in sizes}
    for _ in range(2):  # trace, then one more: the first allreduces of a process pay set-up costs
        for run in runs.values():
            run().numpy()
    times = {n: [] for n in sizes}
    for _ in range(repeats):  # round-robin: a burst of machine load does not land on one size only
        for n, run in runs.items():
            t0 = time.perf_counter()
            run().numpy()
            times[n].append((time.perf_counter() - t0) / chain)
    return [{"bytes": 4 * max(1, n // 4), "times_s": times[n]} for n in sizes]


def _model_and_steps(tf, hvd, args, rank):
    """The model, its optimizer, and one step function per variant on this rank's fixed random batch, all
    ranks starting from rank 0's weights."""
    from labkit import models
    from labkit.base import config, training
    config.set_seed(rank)
    model = models.get(args.model, input_shape=(32, 32, 3), classes=10)
    x = tf.random.uniform([args.batch_size, 32, 32, 3], seed=rank)
    y = tf.random.uniform([args.batch_size], maxval=10, dtype=tf.int32, seed=rank)
    opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)  # labkit models end in softmax
    wrappers = {"compute": None, "sync": hvd.Compression.none, "sync_fp16": hvd.Compression.fp16}

    def make_step(compression):  # the one train step; sync variants wrap its tape in Horovod's
        wrap = None if compression is None else \
            (lambda tape: hvd.DistributedGradientTape(tape, compression=compression))
        step = training.make_train_step(model, opt, loss_fn, tape_wrapper=wrap)
        return lambda: step(x, y)

    steps = {v: make_step(wrappers[v]) for v in args.variants.split(",")}
    opt._create_all_weights(model.trainable_variables)
    _broadcast(hvd, model, opt)
    return model, opt, steps


def _broadcast(hvd, model, opt) -> None:
    from labkit.base import training
    training.from_rank0(hvd, [*model.variables, *opt.variables()])()


def _time_steps(steps: dict, n_steps: int, repeats: int) -> dict:
    """Seconds per step of each variant, interleaved repeat by repeat (load changes hit every variant alike)."""
    for step in steps.values():  # trace and warm up
        for _ in range(2):
            float(step())
    times = {v: [] for v in steps}
    for _ in range(repeats):
        for v, step in steps.items():
            for _ in range(n_steps):
                t0 = time.perf_counter()
                float(step())
                times[v].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    import labkit
    labkit.quiet()
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from labkit.base.rankstats import weights_checksum as checksum
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rank, size = hvd.rank(), hvd.size()
    calib = _calibrate(tf, hvd, args.size_list, args.chain, args.calib_repeats)
    model, opt, steps = _model_and_steps(tf, hvd, args, rank)
    times = _time_steps(steps, args.steps, args.repeats)
    # the sync proof: from rank 0's weights, synced steps on different data keep the ranks identical
    _broadcast(hvd, model, opt)
    if "sync" in steps:
        for _ in range(2):
            float(steps["sync"]())
    trainable = [v.numpy() for v in model.trainable_variables]
    result = {"rank": rank, "size": size, "host": os.uname().nodename, "model": args.model,
              "batch_size": args.batch_size, "threads": args.threads, "chain": args.chain,
              "allreduce": calib, "step_times_s": times,
              "median_step_s": {v: float(np.median(t)) for v, t in times.items()},
              "grad_tensors": [4 * int(v.shape.num_elements()) for v in model.trainable_variables],
              "checksum_trainable": checksum(trainable),
              "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default (128 MiB)")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from labkit.base import resultsfile
    resultsfile.write_text(out / f"rank{rank}.json", json.dumps(result))  # atomic: a reader never sees half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
