"""The one script horovodrun runs: data-parallel training for 1..N ranks, nanoGPT's train.py pattern.

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.hvd_train --batch-size 64 --steps 20 --out runs/x

Every rank runs this same file. Each rank: `hvd.init()`; limits its own threads (default: cores / local
ranks, so N ranks never oversubscribe the machine); pins one GPU by local rank where GPUs exist; reads
only its 1/N shard of the data (an epoch is split, never repeated N times); starts from rank 0's weights
(broadcast); averages gradients with `hvd.DistributedOptimizer` (ring allreduce); and writes its own
JSON result (`rank{R}.json`): images/s per timed repeat, step times, final loss (averaged over ranks),
and a checksum of its final weights. Equal checksums on all ranks are the proof that they stayed in sync.
Rank 0 alone prints progress, writes the log and the checkpoint. Warm-up steps (graph tracing, first
allocations) are run but never timed.

`--bench-allreduce` instead times `hvd.allreduce` over message sizes, to calibrate the ring-allreduce
cost model in labkit.scaling. (04_horovod_scaling)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported)

PROGRESS_TAG = "LABKIT_PROGRESS"  # rank 0's progress lines, parsed by labkit.scaling.run
DEFAULT_MODEL = "small_cnn"


# ----------------------------------------------------------------------------------------------
# pieces that do not need Horovod (used by tests and by the notebook's single-process experiments)

def default_threads(cores: int | None = None, local_size: int = 1) -> int:
    """Threads per rank: the cores this process may use, split evenly among the ranks on this host."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS
            cores = os.cpu_count() or 1
    if local_size < 1:
        raise ValueError(f"local_size must be >= 1; got {local_size}")
    return max(1, cores // local_size)


def scaled_lr(step, lr: float, scale: float = 1.0, warmup_steps: int = 0):
    """Goyal et al.'s rule: target LR = lr x scale, reached by a linear ramp from lr over warmup_steps.

    With warmup_steps=0 the scaled LR applies from the first step (the "no warmup" baseline).
    `step` may be a Python number or a tensor (the optimizer's iteration counter).
    """
    if lr <= 0:
        raise ValueError(f"lr must be > 0; got {lr}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (the number of workers or batch multiple); got {scale}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0; got {warmup_steps}")
    if warmup_steps == 0:
        return lr * scale
    if not isinstance(step, (int, float)) and type(step).__module__ != "numpy":
        import tensorflow as tf  # a tensor: the optimizer's iteration counter inside a graph
        frac = tf.minimum(1.0, tf.cast(step, tf.float32) / float(warmup_steps))
        return lr * (1.0 + (scale - 1.0) * frac)
    frac = min(1.0, float(step) / warmup_steps)
    return lr * (1.0 + (scale - 1.0) * frac)


def small_cnn(input_shape=(32, 32, 3), classes=10, width=16):
    """The default model: conv(3x3, w)-ReLU-pool, conv(3x3, 2w)-ReLU-pool, dense. ~30k parameters."""
    import tensorflow as tf
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input(shape=tuple(input_shape)),
        layers.Conv2D(width, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(classes),
    ], name="small_cnn")


def build_model(name: str = DEFAULT_MODEL, input_shape=(32, 32, 3), classes=10):
    """small_cnn (built here) or any labkit.models.get name, with logits output."""
    if name == DEFAULT_MODEL:
        return small_cnn(input_shape, classes)
    try:
        from labkit import models
    except ImportError as err:  # pragma: no cover
        raise ValueError(f"model {name!r} needs labkit.models ({err}); use model='{DEFAULT_MODEL}'") from err
    return models.get(name, input_shape=tuple(input_shape), classes=classes)


def _ends_in_softmax(model) -> bool:
    """True when the model outputs probabilities (a softmax last layer) rather than logits."""
    last = model.layers[-1]
    act = getattr(last, "activation", None)
    return type(last).__name__ == "Softmax" or getattr(act, "__name__", "") == "softmax"


def synthetic_data(n: int, image_size: int = 32, classes: int = 10, seed: int = 0):
    """A learnable synthetic set: each class is a fixed random template plus noise (float32 NHWC, int labels).

    The same seed gives the same set on every rank, so sharding splits one data set, as with real data.
    """
    import numpy as np
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    rng = np.random.default_rng(seed)
    templates = rng.normal(0.0, 1.0, size=(classes, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, classes, size=n).astype("int32")
    x = 0.5 * templates[y] + rng.normal(0.0, 1.0, size=(n, image_size, image_size, 3)).astype("float32")
    return x, y


def shard_indices(n: int, rank: int, size: int):
    """Rank `rank`'s share of n examples: every size-th one, starting at rank (disjoint, covers all)."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"need 0 <= rank < size; got rank={rank}, size={size}")
    return list(range(rank, n, size))


def weights_checksum(weights) -> str:
    """SHA-256 (first 16 hex digits) over the raw bytes of a list of arrays: equal iff bit-identical."""
    import numpy as np
    h = hashlib.sha256()
    for w in weights:
        a = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def summarize_times(step_times, batch_size: int, steps: int) -> dict:
    """images/s per repeat (repeats are consecutive blocks of `steps` timed steps), mean and spread."""
    import numpy as np
    t = np.asarray(step_times, dtype=float)
    if steps < 1 or t.size < steps:
        raise ValueError(f"need at least one block of steps={steps} timed steps; got {t.size}")
    blocks = t[: t.size // steps * steps].reshape(-1, steps)
    ips = batch_size * steps / blocks.sum(axis=1)
    return {
        "images_per_sec": float(ips.mean()),
        "images_per_sec_std": float(ips.std(ddof=1)) if ips.size > 1 else 0.0,
        "images_per_sec_repeats": [float(v) for v in ips],
        "step_time_s": float(np.median(t)),
        "step_time_mean_s": float(t.mean()),
        # the fast end of the distribution: the step when no other program took the core (shared machines)
        "step_time_p10_s": float(np.percentile(t, 10)),
    }


# ----------------------------------------------------------------------------------------------
# the script

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m labkit.hvd_train",
                                description="Data-parallel training for 1..N Horovod ranks (run under horovodrun).")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"'{DEFAULT_MODEL}' or a labkit.models.get name")
    p.add_argument("--batch-size", type=int, default=64, help="images per rank per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (images/s mean and spread)")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (tracing, allocation)")
    p.add_argument("--data", default="synthetic", choices=["synthetic", "auto", "cifar10"],
                   help="synthetic tensors, or labkit.data.load_dataset (auto) / load_cifar10")
    p.add_argument("--num-examples", type=int, default=4096, help="size of the synthetic training set")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01, help="base learning rate (one worker)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--scale-lr", action="store_true", help="linear scaling rule: LR = lr x number of ranks")
    p.add_argument("--lr-warmup-steps", type=int, default=0, help="ramp the scaled LR up over this many steps")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: cores / local ranks)")
    p.add_argument("--inter-threads", type=int, default=1, help="inter-op threads per rank")
    p.add_argument("--no-sync", action="store_true",
                   help="control experiment: plain optimizer, no gradient allreduce (ranks drift apart)")
    p.add_argument("--no-function", action="store_true", help="run the step eagerly (no tf.function)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for rank{R}.json (default: no files)")
    p.add_argument("--checkpoint-dir", default=None, help="rank 0 writes weights.h5 and log.jsonl here")
    p.add_argument("--progress-every", type=int, default=0, help="rank 0 reports every N steps (0: per repeat)")
    p.add_argument("--bench-allreduce", action="store_true", help="time hvd.allreduce instead of training")
    p.add_argument("--sizes", default="4,1024,16384,262144,1048576,4194304",
                   help="--bench-allreduce: message sizes in bytes (float32)")
    p.add_argument("--chain", type=int, default=20, help="--bench-allreduce: allreduces per timed call")
    # fault injection, for the tests of labkit.scaling's crash and timeout handling
    p.add_argument("--fail-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--fault-at-step", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("batch_size", "steps", "repeats", "num_examples", "image_size", "classes", "chain"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.warmup_steps < 0 or args.lr_warmup_steps < 0 or args.threads < 0:
        p.error("--warmup-steps, --lr-warmup-steps and --threads must be >= 0")
    return args


def _setup(args):
    """hvd.init, thread limits and GPU pinning; must run before TensorFlow executes any op."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    labkit.quiet()
    hvd.init()
    threads = args.threads or default_threads(local_size=hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
    from labkit import gpu

    gpus = tf.config.list_physical_devices("GPU")
    gpu.pin_to_local_rank(hvd.local_rank(), gpus)  # one GPU per rank, chosen by local rank (Horovod's recipe)
    return tf, hvd, threads, len(gpus)


def _load_data(tf, args, rank, size):
    """This rank's endless batched pipeline over its 1/size shard, the data set's name and sizes.

    Real data (--data auto|cifar10) goes through labkit.data.load_dataset + make_dataset(shard=...)
    (issue 5's pipeline, normalised); --data synthetic uses in-memory float tensors sharded here.
    """
    import numpy as np
    if args.data != "synthetic":
        from labkit import data
        if hasattr(data, "load_dataset") and hasattr(data, "make_dataset"):
            (x, y), _, info = data.load_dataset(None if args.data == "auto" else args.data)
            mine = len(shard_indices(len(x), rank, size))
            if mine < args.batch_size:
                raise ValueError(f"this rank's shard has {mine} examples, fewer than batch_size={args.batch_size}")
            ds = data.make_dataset(x, y, args.batch_size, shuffle=True, seed=args.seed, shard=(rank, size),
                                   drop_remainder=True).repeat()
            return ds, str(getattr(info, "name", info)), len(x), mine, x.shape[1:]
        print("labkit.data.load_dataset/make_dataset not available: using synthetic data", file=sys.stderr)
    x, y = synthetic_data(args.num_examples, args.image_size, args.classes, seed=args.seed)
    idx = shard_indices(len(x), rank, size)
    x, y = x[idx], y[idx]
    return _dataset(tf, x, y, args.batch_size, args.seed + rank), "synthetic", args.num_examples, len(x), x.shape[1:]


def _dataset(tf, x, y, batch_size, seed):
    """An endless, shuffled, batched pipeline over this rank's shard (the shard is already taken)."""
    if len(x) < batch_size:
        raise ValueError(f"this rank's shard has {len(x)} examples, fewer than batch_size={batch_size}; "
                         f"raise --num-examples or lower --batch-size")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(min(len(x), 10_000), seed=seed)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)


def train(args) -> dict:
    tf, hvd, threads, n_gpus = _setup(args)
    rank, size = hvd.rank(), hvd.size()
    ds, data_name, n_total, n_mine, shape = _load_data(tf, args, rank, size)
    tf.random.set_seed(args.seed + rank)  # different on purpose: the broadcast must make them equal
    model = build_model(args.model, tuple(shape), args.classes)
    scale = float(size) if args.scale_lr else 1.0
    lr_fn = lambda step: scaled_lr(step, args.lr, scale, args.lr_warmup_steps)  # noqa: E731

    class GoyalSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, lr, scale, warmup_steps):
            self.lr, self.scale, self.warmup_steps = lr, scale, warmup_steps

        def __call__(self, step):
            return scaled_lr(step, self.lr, self.scale, self.warmup_steps)

        def get_config(self):
            return {"lr": self.lr, "scale": self.scale, "warmup_steps": self.warmup_steps}

    opt = tf.keras.optimizers.legacy.SGD(learning_rate=GoyalSchedule(args.lr, scale, args.lr_warmup_steps),
                                         momentum=args.momentum)
    if not args.no_sync:  # Horovod rebuilds the optimizer from its config: let it find our schedule
        with tf.keras.utils.custom_object_scope({"GoyalSchedule": GoyalSchedule}):
            opt = hvd.DistributedOptimizer(opt)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=not _ends_in_softmax(model))

    def step_fn(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        if args.no_sync:
            grads = tape.gradient(loss, model.trainable_variables)
            grads_and_vars = list(zip(grads, model.trainable_variables))
        else:  # DistributedOptimizer averages the gradients over all ranks (fused ring allreduce)
            grads_and_vars = opt.compute_gradients(loss, model.trainable_variables, tape=tape)
        opt.apply_gradients(grads_and_vars)
        return loss

    step = step_fn if args.no_function else tf.function(step_fn)

    # Everyone starts from rank 0's weights and optimizer state (slots created first, then broadcast).
    opt._create_all_weights(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(opt.variables(), root_rank=0)

    it = iter(ds)
    total_steps = args.warmup_steps + args.steps * args.repeats
    report_every = args.progress_every or args.steps
    log_f = None
    if rank == 0 and args.checkpoint_dir:
        Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        log_f = open(Path(args.checkpoint_dir) / "log.jsonl", "w")

    step_times, cpu_times, losses = [], [], []
    t_start = time.perf_counter()
    for i in range(total_steps):
        if i == args.fault_at_step and rank == args.fail_rank:
            raise RuntimeError(f"injected failure on rank {rank} at step {i} (--fail-rank)")
        if i == args.fault_at_step and rank == args.hang_rank:
            print(f"rank {rank}: hanging on purpose at step {i} (--hang-rank)", file=sys.stderr, flush=True)
            time.sleep(10**6)
        xb, yb = next(it)
        c0, t0 = time.process_time(), time.perf_counter()
        loss = float(step(xb, yb))  # float() waits for the step to finish: honest per-step time
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(loss)
        if i >= args.warmup_steps:
            step_times.append(dt)
            cpu_times.append(dc)  # CPU seconds of all this rank's threads: work, not waiting for a core
        done = i + 1 - args.warmup_steps
        if rank == 0 and done > 0 and (done % report_every == 0 or i + 1 == total_steps):
            msg = {"step": done, "steps": args.steps * args.repeats, "loss": round(loss, 4),
                   "lr": float(lr_fn(i)), "elapsed_s": round(time.perf_counter() - t_start, 2)}
            print(f"{PROGRESS_TAG} {json.dumps(msg)}", flush=True)
            if log_f:
                log_f.write(json.dumps(msg) + "\n")
                log_f.flush()

    import numpy as np
    # metric averaging: one allreduce of the whole loss history at the end, not one per step
    loss_avg = hvd.allreduce(tf.constant(losses, tf.float32), op=hvd.Average).numpy()
    weights = [v.numpy() for v in model.weights]
    result = {
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "host": os.uname().nodename, "pid": os.getpid(), "threads": threads, "gpus_visible": n_gpus,
        "model": args.model, "params": int(model.count_params()), "data": data_name,
        "examples_total": int(n_total), "examples_this_rank": int(n_mine),
        "batch_size": args.batch_size, "global_batch_size": args.batch_size * size,
        "steps": args.steps, "repeats": args.repeats, "warmup_steps": args.warmup_steps,
        "lr": args.lr, "lr_final": float(lr_fn(total_steps)), "scale_lr": args.scale_lr,
        "lr_warmup_steps": args.lr_warmup_steps, "sync": not args.no_sync,
        "step_times_s": [round(t, 6) for t in step_times],
        "cpu_step_time_s": float(np.median(cpu_times)), "cpu_step_times_s": [round(t, 6) for t in cpu_times],
        "loss_local": [round(v, 5) for v in losses],
        "loss_avg": [round(float(v), 5) for v in loss_avg],
        "final_loss": float(loss_avg[-1]), "final_loss_local": float(losses[-1]),
        "checksum": weights_checksum(weights), "weight_sum": float(sum(abs(w).sum() for w in weights)),
        "grad_bytes": int(sum(4 * int(v.shape.num_elements()) for v in model.trainable_variables)),
        "grad_tensors": [4 * int(v.shape.num_elements()) for v in model.trainable_variables],
    }
    result.update(summarize_times(step_times, args.batch_size, args.steps))
    if rank == 0 and args.checkpoint_dir:
        model.save_weights(str(Path(args.checkpoint_dir) / "weights.h5"))
        log_f.close()
    return result


def bench_allreduce(args) -> dict:
    """Median time of one hvd.allreduce per message size (a chain of dependent allreduces per call)."""
    import numpy as np
    tf, hvd, threads, _ = _setup(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        t = tf.ones([n], tf.float32)

        @tf.function
        def chain(t):
            # each allreduce depends on the previous one, so Horovod cannot fuse them: k separate rounds
            for _ in range(args.chain):
                t = hvd.allreduce(t, op=hvd.Average)
            return t

        chain(t).numpy()  # trace + warm up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            chain(t).numpy()
            times.append((time.perf_counter() - t0) / args.chain)
        rows.append({"bytes": 4 * n, "time_s": float(np.median(times)), "times_s": times})
    return {"rank": hvd.rank(), "size": hvd.size(), "threads": threads, "chain": args.chain, "allreduce": rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench_allreduce(args) if args.bench_allreduce else train(args)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".rank{result['rank']}.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(out / f"rank{result['rank']}.json")  # atomic: a reader never sees half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
