"""The script every Horovod Elastic worker runs: a small model trained on state that survives workers coming and going.

    horovodrun --gloo -np 3 --min-np 1 --max-np 3 --host-discovery-script ./discover-hosts \\
        python -m labkit.cluster.elastic_train --out DIR --steps 5000

The training state is one hvd.elastic.TensorFlowKerasState: the model's and the optimizer's variables (the momentum
and the step counter) plus `step` (steps done) and `seen` (examples consumed, so the data order goes on where it
was). Every --commit-every steps the state is committed: copied to memory, and
the workers learn there whether hosts were added or removed. On such a change hvd.elastic.run shuts Horovod down,
starts it again with the workers that remain (or with the new ones), and goes on from the committed state, broadcast
from rank 0 where a worker is new; a worker lost in the middle of a step makes the others go back to the last commit.
Gradients are averaged over whatever the world size is now (Horovod reads it at run time under HOROVOD_ELASTIC).

Every process appends one JSON line per step to its own log in --out (worker-<host>-<pid>.jsonl: wall time, step,
world size, rank, the world's number (rank 0's count of (re)starts), the loss and a checksum of its weights) and one
line after every (re)start, so the driver (labkit.cluster.elastic) reads the run as it goes. Training ends at
--steps, or at the first commit after rank 0 sees the file `stop` in --out (the decision is broadcast: every worker
stops at the same step).
A leaf script: imported by nothing but its tests. (08_training_on_the_cluster)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported)
from labkit.base.checks import check_int, check_number

LOG_GLOB = "worker-*.jsonl"
STOP_FILE = "stop"


def batch_indices(seen: int, rank: int, size: int, batch_size: int, order) -> np.ndarray:
    """The examples `rank` of `size` trains on next, `seen` examples into the run: the world's next size x batch_size
    examples of `order` (wrapping around), rank's slice of them. The same for any world size: nothing is skipped or
    trained twice when workers come or go."""
    check_int(size, "size", minimum=1)
    check_int(rank, "rank", minimum=0, maximum=size - 1)
    start = check_int(seen, "seen", minimum=0) + rank * check_int(batch_size, "batch_size", minimum=1)
    return np.asarray(order)[(start + np.arange(batch_size)) % len(order)]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m labkit.cluster.elastic_train",
                                description="One Horovod Elastic worker (under horovodrun --host-discovery-script).")
    p.add_argument("--out", required=True, help="folder for the per-process logs (and the stop file)")
    p.add_argument("--steps", type=int, default=5000, help="the most steps; the stop file ends the run sooner")
    p.add_argument("--commit-every", type=int, default=5, help="steps between commits of the state")
    p.add_argument("--model", default="small_cnn", help="a labkit.models name")
    p.add_argument("--width", type=int, default=8, help="small_cnn's first layer's filters")
    p.add_argument("--num-examples", type=int, default=2000, help="labkit's offline synthetic training set")
    p.add_argument("--batch-size", type=int, default=16, help="images per worker per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1, help="compute threads per worker")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv=None):
    """The worker's options, checked: one line and exit 2 on the first bad one."""
    p = _parser()
    args = p.parse_args(argv)
    try:
        for name, least in (("steps", 1), ("commit_every", 1), ("width", 1), ("num_examples", 1),
                            ("batch_size", 1), ("threads", 1), ("seed", 0)):
            check_int(getattr(args, name), "--" + name.replace("_", "-"), minimum=least)
        check_number(args.lr, "--lr", above=0)
    except ValueError as err:
        p.error(str(err))
    return args


class _Log:
    """This process's JSON lines, appended and flushed one by one: a stream the driver reads while the run goes
    on (a log in the driver's own temporary folder, not a results file), one file per process so no two append
    to the same one."""

    def __init__(self, out):
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.f = open(Path(out) / f"worker-{self.host}-{self.pid}.jsonl", "a", buffering=1)

    def write(self, **row) -> None:
        self.f.write(json.dumps({"t": round(time.time(), 4), "host": self.host, "pid": self.pid, **row}) + "\n")


def train(args) -> int:
    """This worker's share of the run; the steps done when it ended."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    labkit.quiet()
    from labkit import data, models
    from labkit.base import config, machine, rankstats, training
    log = _Log(args.out)
    log.write(event="start")
    hvd.init()
    machine.limit_threads(args.threads)
    config.set_seed(args.seed, deterministic=True)
    (x, y), _ = data.synthetic(args.num_examples, 0, seed=args.seed)
    x = data.normalize(x)
    kw = {"width": args.width} if args.model == "small_cnn" else {}
    model = models.get(args.model, input_shape=tuple(x.shape[1:]), classes=10, **kw)
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=args.lr, momentum=0.9)
    opt._create_all_weights(model.trainable_variables)  # the slots exist before the state copies them
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    step_fn = training.make_train_step(model, opt, loss_fn, hvd.DistributedGradientTape)
    # traced now, alone: a worker that joins a running job does not keep the others waiting while it compiles
    step_fn.get_concrete_function(tf.TensorSpec((args.batch_size, *x.shape[1:]), tf.float32),
                                  tf.TensorSpec((args.batch_size,), y.dtype))
    order = np.random.default_rng(args.seed).permutation(len(x))
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0, seen=0)
    stop_file = Path(args.out) / STOP_FILE
    starts = [0]  # how many times this process entered the loop: rank 0's count numbers the worlds

    def checksum():
        return rankstats.weights_checksum([v.numpy() for v in model.trainable_weights])

    @hvd.elastic.run
    def loop(state):
        rank, size = hvd.rank(), hvd.size()
        starts[0] += 1
        # the world's number, rank 0's (the oldest worker: a new one cannot know how many worlds came before)
        generation = hvd.broadcast_object(starts[0], root_rank=0, name="generation")
        # after every (re)start, before any step: the state every worker holds now
        log.write(event="sync", step=state.step, size=size, rank=rank, generation=generation, checksum=checksum())
        while state.step < args.steps:
            idx = batch_indices(state.seen, rank, size, args.batch_size, order)
            loss = float(step_fn(x[idx], y[idx]))
            state.step += 1
            state.seen += size * args.batch_size
            log.write(step=state.step, size=size, rank=rank, generation=generation, loss=round(loss, 5),
                      checksum=checksum())
            if state.step % args.commit_every == 0:
                stop = hvd.broadcast_object(rank == 0 and stop_file.exists(), root_rank=0, name="stop")
                state.commit()  # raises HostsUpdatedInterrupt on every worker alike when hosts came or went
                if stop:
                    break
        return state.step

    done = loop(state)
    log.write(event="end", step=done, size=hvd.size(), rank=hvd.rank(), checksum=checksum())
    return done


def main(argv=None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
