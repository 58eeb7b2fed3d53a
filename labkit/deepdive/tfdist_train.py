"""One worker of tf.distribute.MultiWorkerMirroredStrategy: the same model and step as labkit.deepdive.linkbench.

Every worker runs `python -m labkit.deepdive.tfdist_train --workers HOST:PORT,HOST:PORT --index I --out DIR`
(TensorFlow's own launcher-less design: each process is told the whole cluster and its place in it).
`run_workers` starts them: on this machine (`run_local`, one port each on 127.0.0.1) or one per node of
the virtual cluster (`labkit.deepdive.vcluster.tfdist_run`). Each times synced training steps on a fixed random batch
and writes worker{I}.json with the step times, CPU time per step and a checksum of the trainable weights, to
be compared with Horovod's. Introduced in notebooks/07_scaling_deep_dive.ipynb.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.base.checks import check_int


def distributed_lines() -> int:
    """Lines of this file's step written for distribution (between its two "distributed part" markers): what
    07 counts against Horovod's 4. (07_scaling_deep_dive)"""
    src = Path(__file__).read_text().splitlines()
    start = src.index(next(ln for ln in src if ln.strip().startswith("# --- the distributed part")))
    end = src.index(next(ln for ln in src if ln.strip().startswith("# --- end of the distributed part")))
    return end - start - 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m labkit.deepdive.tfdist_train", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", required=True, help="HOST:PORT of every worker, comma-separated, in order")
    p.add_argument("--index", type=int, required=True, help="this worker's place in --workers")
    p.add_argument("--model", default="convblock_net")
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
    from labkit.base import config
    from labkit.base.rankstats import weights_checksum as checksum
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # --- the distributed part: a strategy, variables created in its scope, steps through strategy.run
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    size, rank = strategy.num_replicas_in_sync, args.index
    with strategy.scope():
        config.set_seed(0)
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
    times, cpu = [], []
    for _ in range(args.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        float(step())
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # CPU seconds of all this worker's threads
    result = {"index": rank, "size": size, "host": os.uname().nodename, "model": args.model,
              "batch_size": args.batch_size, "threads": args.threads, "step_times_s": times,
              "median_step_s": float(np.median(times)), "cpu_step_time_s": float(np.median(cpu)),
              "images_per_sec": args.batch_size / float(np.median(times)),
              "checksum_trainable": checksum([v.numpy() for v in model.trainable_variables])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from labkit.base import resultsfile
    resultsfile.write_text(out / f"worker{rank}.json", json.dumps(result))  # a reader never sees half a file
    return 0


def run_workers(workers: list[str], *, wrap=None, model="convblock_net", batch_size=4, steps=12, threads=1,
                timeout=300) -> list[dict]:
    """Start one worker per 'HOST:PORT' of workers (wrap(i): the command prefix that puts worker i where its
    host is, e.g. into a node's namespace; default: this machine), wait for all, return their result dicts in
    index order. Every worker is killed (its whole process group) if one fails, on timeout or on interrupt."""
    if len(workers) < 2:
        raise ValueError(f"workers must list 2 or more 'HOST:PORT'; got {workers!r}")
    from labkit.scale import launch
    out = Path(tempfile.mkdtemp(prefix="labkit-tfd-"))
    t0, procs, logs = time.perf_counter(), [], []
    try:
        for i in range(len(workers)):
            cmd = [*(wrap(i) if wrap else []), sys.executable, "-m", "labkit.deepdive.tfdist_train",
                   "--workers", ",".join(workers), "--index", str(i), "--model", model,
                   "--batch-size", str(batch_size), "--steps", str(steps), "--threads", str(threads),
                   "--out", str(out)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=launch.child_env(), start_new_session=True))
        for proc in procs:
            logs.append(proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))[0])
        results = [json.loads(p.read_text()) for p in sorted(out.glob("worker*.json"))]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        shutil.rmtree(out, ignore_errors=True)
    if len(results) != len(workers):
        raise RuntimeError(f"{len(results)} of {len(workers)} tf.distribute workers wrote a result\n" + "\n".join(
            ln for log in logs for ln in log.splitlines()[-8:]))
    return sorted(results, key=lambda r: r["index"])


def free_ports(n: int) -> list[int]:
    """n TCP ports on 127.0.0.1 that were free a moment ago (held open together, so all differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_local(np_: int = 2, **kw) -> list[dict]:
    """np_ workers of MultiWorkerMirroredStrategy on this machine (127.0.0.1, one free port each);
    kw: run_workers' (model, batch_size, steps, threads, timeout)."""
    check_int(np_, "np_", minimum=2)  # an allreduce needs two workers
    return run_workers([f"127.0.0.1:{p}" for p in free_ports(np_)], **kw)


if __name__ == "__main__":
    sys.exit(main())
