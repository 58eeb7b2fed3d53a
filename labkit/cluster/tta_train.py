"""The script every Horovod rank runs for time to accuracy: train on its shard, validate on its shard of the test set.

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.cluster.tta_train --epochs 4 --scale-lr --out runs/x

Every rank: `hvd.init()`; one compute thread (--threads) so each worker owns a share of the machine, as each
GPU or node does; reads the whole data set (the same on every rank) and trains on its 1/N shard, the same number
of steps per epoch on every rank; starts from rank 0's weights (broadcast); averages gradients with
hvd.DistributedGradientTape; LR x N with --scale-lr (Goyal et al. 2017's linear rule), reached over
--warmup-epochs (training.warmup_lr). Every --evals-per-epoch it predicts its own shard of the test set and
averages (correct, count) over the ranks with hvd.allreduce: correct / count is the accuracy on the whole test
set, the same number on every rank. Rank 0 keeps the log (wall time, step, epoch, validation accuracy) in
tta_log.json, rewritten whole after each evaluation. Each rank's result is rank{R}.json (labkit.scale.launch
reads them). A leaf script: imported by nothing but its tests. (08_training_on_the_cluster)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported)
from labkit.base.checks import check_int, check_number

PROGRESS_TAG = "LABKIT_PROGRESS"  # labkit.scale.launch reads rank 0's lines that start with it
LOG_NAME = "tta_log.json"
DATA = ("synthetic", "auto", "cifar10")


def validation_shard(n: int, rank: int, size: int) -> np.ndarray:
    """The test examples one rank validates: every size-th from rank (make_dataset's sharding of the training set)."""
    check_int(size, "size", minimum=1)
    check_int(rank, "rank", minimum=0, maximum=size - 1)
    return np.arange(check_int(n, "n", minimum=0))[rank::size]


def local_counts(probs, labels) -> np.ndarray:
    """[correct, count] of one rank's shard: the two numbers hvd.allreduce averages over the ranks."""
    probs, labels = np.asarray(probs), np.asarray(labels).reshape(-1)
    if probs.ndim != 2 or len(probs) != len(labels):
        raise ValueError(f"probs must be (examples, classes) with one row per label; got {probs.shape} for "
                         f"{len(labels)} labels")
    return np.array([np.sum(np.argmax(probs, axis=1) == labels), len(labels)], np.float64)


def accuracy_of(averaged_counts) -> float:
    """Accuracy on the whole test set from the ranks' averaged [correct, count]: mean correct / mean count, so
    shards of unequal size weigh by their examples, not one vote per rank."""
    correct, count = (float(v) for v in np.asarray(averaged_counts).reshape(-1))
    if count <= 0:
        raise ValueError(f"count must be above 0 (every rank validated nothing); got {count}")
    return correct / count


def steps_per_epoch(n_train: int, size: int, batch_size: int) -> int:
    """Steps of one epoch, the same on every rank: the smallest shard's full batches (a rank that stepped once
    more would wait for the others' allreduce forever)."""
    steps = (check_int(n_train, "n_train", minimum=0) // check_int(size, "size", minimum=1)) // check_int(
        batch_size, "batch_size", minimum=1)
    if steps < 1:
        raise ValueError(f"each of {size} ranks gets {n_train // size} training examples, fewer than batch_size="
                         f"{batch_size}: raise the training examples or lower the batch size")
    return steps


def eval_steps(steps_per_epoch: int, epochs: int, evals_per_epoch: int) -> list[int]:
    """The global steps after which every rank validates: step 0 (the untrained start), evals_per_epoch per
    epoch, and the last step."""
    per, epochs = check_int(evals_per_epoch, "evals_per_epoch", minimum=1), check_int(epochs, "epochs", minimum=1)
    check_int(steps_per_epoch, "steps_per_epoch", minimum=1)
    return sorted({0, *(round(k * steps_per_epoch / per) for k in range(1, epochs * per + 1))})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m labkit.cluster.tta_train",
                                description="Train to a target accuracy on 1..N Horovod ranks (run under horovodrun).")
    p.add_argument("--model", default="small_cnn", help="a labkit.models name")
    p.add_argument("--data", default="synthetic", choices=DATA,
                   help="labkit.data's offline set, or load_dataset (auto: CIFAR-10 if on disk)")
    p.add_argument("--num-examples", type=int, default=4000, help="training examples (all ranks together)")
    p.add_argument("--num-test", type=int, default=1000, help="test examples (all ranks together)")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01, help="the one-worker learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--scale-lr", action="store_true", help="linear scaling rule: LR = lr x number of ranks")
    p.add_argument("--warmup-epochs", type=float, default=0.0, help="ramp the scaled LR up over this many epochs")
    p.add_argument("--evals-per-epoch", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--device", default=None, choices=("cpu", "gpu"), help="default: a GPU per rank where there is one")
    p.add_argument("--seed", type=int, default=0, help="the weights' and the data order's")
    p.add_argument("--nondeterministic", action="store_true", help="allow TensorFlow's faster nondeterministic ops")
    p.add_argument("--out", default=None, help="directory for rank{R}.json and rank 0's tta_log.json")
    return p


def _problem(args) -> str | None:
    """The first thing wrong with the parsed options, in one line, or None."""
    try:
        for name, least in (("num_examples", 1), ("num_test", 1), ("batch_size", 1), ("epochs", 1),
                            ("evals_per_epoch", 1), ("threads", 1), ("seed", 0)):
            check_int(getattr(args, name), "--" + name.replace("_", "-"), minimum=least)
        check_number(args.lr, "--lr", above=0)
        check_number(args.momentum, "--momentum", minimum=0, below=1)
        check_number(args.warmup_epochs, "--warmup-epochs", minimum=0, maximum=args.epochs)
    except ValueError as err:
        return str(err)
    from labkit import models  # noqa: F401  (imports TensorFlow, builds nothing: check_model asks it here)
    from labkit.scale.settings import check_model
    try:
        check_model(args.model, "--model")
    except ValueError as err:
        return str(err)
    return None


def parse_args(argv=None):
    """The worker's options, checked: one line and exit 2 on the first bad one, before any model is built."""
    p = _parser()
    args = p.parse_args(argv)
    problem = _problem(args)
    if problem:
        p.error(problem)
    return args


def _setup(args):
    """hvd.init, this rank's threads and device, seeds and op determinism; before TensorFlow runs any op."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    labkit.quiet()
    from labkit.base import config, machine
    from labkit.scale import gpu
    hvd.init()
    machine.limit_threads(args.threads)
    pinned = gpu.place_rank(hvd.local_rank(), hvd.local_size(), args.device)
    config.set_seed(args.seed, deterministic=not args.nondeterministic)
    return tf, hvd, int(pinned is not None)


def _load(args):
    """The whole data set, the same on every rank: (x, y), (x_test, y_test), its name."""
    from labkit import data
    if args.data == "synthetic":
        train, test = data.synthetic(args.num_examples, args.num_test, seed=args.seed)
        return train, test, "synthetic"
    train, test, info = data.load_dataset(None if args.data == "auto" else args.data, n_train=args.num_examples,
                                          n_test=args.num_test)
    return train, test, str(info.name)


class _Log:
    """Rank 0's points (wall time, step, epoch, validation accuracy), its progress lines and tta_log.json."""

    def __init__(self, args, rank: int, total: int, spe: int):
        self.on, self.total, self.spe, self.points = rank == 0, total, spe, []
        self.path = Path(args.out) / LOG_NAME if self.on and args.out else None

    def add(self, step: int, train_s: float, wall_s: float, loss: float, acc: float, lr: float) -> None:
        point = {"step": step, "epoch": round(step / self.spe, 4), "train_s": round(train_s, 4),
                 "wall_s": round(wall_s, 4), "loss": round(loss, 5), "val_acc": round(acc, 5), "lr": lr}
        self.points.append(point)
        if not self.on:
            return
        print(f"{PROGRESS_TAG} " + json.dumps({"step": step, "steps": self.total, "loss": point["loss"],
                                               "elapsed_s": point["wall_s"], "val_acc": point["val_acc"]}), flush=True)
        if self.path:  # the whole log rewritten through the one writer: a kill leaves the last complete one
            from labkit.base import resultsfile
            resultsfile.write_json(self.path, {"points": self.points})


def _validate(tf, hvd, model, x_test, y_test) -> tuple[float, int]:
    """Accuracy over every rank's shard of the test set (the same on every rank), and this rank's shard size."""
    from labkit import data
    mine = validation_shard(len(x_test), hvd.rank(), hvd.size())
    probs = model.predict(data.normalize(x_test[mine]), batch_size=500, verbose=0) if len(mine) else np.zeros((0, 1))
    counts = local_counts(probs, y_test[mine]) if len(mine) else np.zeros(2)
    averaged = hvd.allreduce(tf.constant(counts, tf.float64), op=hvd.Average, name="val_counts").numpy()
    return accuracy_of(averaged), len(mine)


def _untimed_first_step(hvd, model, opt, step, batch) -> None:
    """Trace the step and warm Horovod up on one batch, then undo it: every rank starts from rank 0's weights
    and a fresh optimizer, so the clock measures training, not TensorFlow's first-call compilation."""
    opt._create_all_weights(model.trainable_variables)  # the slots exist before the broadcast
    state = [*model.variables, *opt.variables()]
    saved = [v.numpy() for v in state]
    float(step(*batch))
    for v, value in zip(state, saved):
        v.assign(value)
    from labkit.base import training
    training.from_rank0(hvd, state)()


def train(args) -> dict:
    """This rank's run: its points (the same validation accuracies on every rank) and its summary."""
    tf, hvd, n_gpus = _setup(args)
    rank, size = hvd.rank(), hvd.size()
    (x, y), (x_test, y_test), data_name = _load(args)
    from labkit import data, models
    from labkit.base import rankstats, training
    spe = steps_per_epoch(len(x), size, args.batch_size)
    model = models.get(args.model, input_shape=tuple(x.shape[1:]), classes=10)
    scale, warm = float(size) if args.scale_lr else 1.0, int(round(args.warmup_epochs * spe))
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=training.WarmupLR(args.lr, scale, warm), momentum=args.momentum)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)  # every labkit model: softmax
    step = training.make_train_step(model, opt, loss_fn, hvd.DistributedGradientTape)
    ds = data.make_dataset(x, y, args.batch_size, shuffle=True, seed=args.seed, shard=(rank, size),
                           drop_remainder=True).take(spe).repeat()
    batches, evals = iter(ds), eval_steps(spe, args.epochs, args.evals_per_epoch)
    _untimed_first_step(hvd, model, opt, step, next(iter(ds)))  # its own iterator: the data order stays
    log = _Log(args, rank, evals[-1], spe)
    done, train_s, losses, t_start = 0, 0.0, [], time.perf_counter()
    for target in evals:
        t0 = time.perf_counter()
        while done < target:
            losses.append(step(*next(batches)))
            done += 1
        last = float(losses[-1]) if losses else float("nan")  # waits for the last step: honest training time
        train_s += time.perf_counter() - t0
        acc, n_mine = _validate(tf, hvd, model, x_test, y_test)
        lr = float(training.warmup_lr(max(done - 1, 0), args.lr, scale, warm))
        log.add(done, train_s, time.perf_counter() - t_start, last, acc, lr)
    weights = [v.numpy() for v in model.trainable_weights]
    return {"rank": rank, "size": size, "gpus_visible": n_gpus, "threads": args.threads, "model": args.model,
            "data": data_name, "examples_total": len(x), "test_total": len(x_test), "test_this_rank": n_mine,
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * size, "steps_per_epoch": spe,
            "epochs": args.epochs, "lr": args.lr, "lr_peak": args.lr * scale, "scale_lr": args.scale_lr,
            "warmup_epochs": args.warmup_epochs, "warmup_steps": warm, "seed": args.seed,
            "deterministic": not args.nondeterministic, "points": log.points,
            "checksum": rankstats.weights_checksum(weights)}


def main(argv=None) -> int:
    args = parse_args(argv)
    result = train(args)
    if args.out:
        from labkit.base import resultsfile
        resultsfile.write_text(Path(args.out) / f"rank{result['rank']}.json", json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
