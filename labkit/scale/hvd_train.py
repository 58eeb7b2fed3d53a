"""The one script horovodrun runs: data-parallel training for 1..N ranks, nanoGPT's train.py pattern.

    horovodrun -np 2 -H localhost:2 --gloo python -m labkit.scale.hvd_train --batch-size 64 --steps 20 --out runs/x

Every rank runs this same file. Each rank: `hvd.init()`; limits its own threads (default: cores / local
ranks, so N ranks never oversubscribe the machine); pins one GPU by local rank where GPUs exist; reads
only its 1/N shard of the data (an epoch is split, never repeated N times); starts from rank 0's weights
(broadcast); averages gradients with `hvd.DistributedOptimizer` (ring allreduce); and writes its own
JSON result (`rank{R}.json`, whose schema is labkit.scale.records.RankRecord): images/s per timed repeat,
step times, final loss (averaged over ranks), and a checksum of its final weights. Equal checksums on all
ranks are the proof that they stayed in sync.
Rank 0 alone prints progress, writes the log and the checkpoint. Warm-up steps (graph tracing, first
allocations) are run but never timed.

`--checkpoint DIR` makes the run resumable (labkit.scale.checkpoint): its warm-up + steps x repeats steps are a
fixed schedule, trained deterministically (TensorFlow's op determinism, seeded data order); rank 0 writes the
whole state every --checkpoint-every steps, when any rank gets SIGUSR1 or SIGTERM (the ranks agree on it after
each step, stop after the same one and exit cleanly) and at the end; `--resume` continues from it: rank 0 reads
it, broadcasts weights, optimizer slots and step, and every rank skips the batches of its shard already trained,
so a run stopped and resumed ends with the same weights, bit for bit, as one never stopped.

A leaf script: no labkit module imports it. The model comes from labkit.models (default small_cnn), the
data from labkit.data (its synthetic set, sharded by make_dataset; or, with `--data random`, one fixed
random batch at any size, as Horovod's own synthetic benchmark feeds ResNet-50), the LR schedule
(training.warmup_lr) and the step (training.make_train_step, wrapped in hvd.DistributedGradientTape) from
labkit.base.training, the thread limits from labkit.base.machine.

`--paired` also times the same steps without the allreduce (the control of the exchange's cost), in
alternating ABBA blocks of this launch: every synced block starts from rank 0's weights (an untimed broadcast)
and the weights reported are those after the last synced block (labkit.scale.scaling.run_paired).

`--bench-allreduce` instead times `hvd.allreduce` over message sizes, to calibrate the ring-allreduce
cost model in labkit.scale.allreduce. (04_horovod_scaling)
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported)
from labkit.base.checks import check_int
from labkit.scale import checkpoint as ckpt
from labkit.scale import settings
from labkit.scale.records import RankRecord
from labkit.scale.settings import (  # noqa: F401
    DATA,
    DEFAULT_MODEL,
    DEVICES,
    RunSettings,
    check_model,
    num_examples_for,
)

PROGRESS_TAG = "LABKIT_PROGRESS"  # rank 0's progress lines, parsed by labkit.scale.scaling.run


# ----------------------------------------------------------------------------------------------
# the script

def _parser() -> argparse.ArgumentParser:
    """The worker's options: those of the RunSettings fields (settings.add_arguments), then its own."""
    p = argparse.ArgumentParser(prog="python -m labkit.scale.hvd_train",
                                description="Data-parallel training for 1..N Horovod ranks (run under horovodrun).")
    settings.add_arguments(p, "worker")  # every RunSettings field the workers take (RunSettings.argv)
    p.add_argument("--image-size", type=int, default=32, help="--data random: image side in px")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--inter-threads", type=int, default=0, help="inter-op threads per rank (0: as --threads)")
    p.add_argument("--barrier", action="store_true",
                   help="with --no-sync: allreduce only the 4-byte loss after each step, a per-step barrier "
                        "without the gradients (tells the wait for the slower rank from the bytes)")
    p.add_argument("--paired", action="store_true",
                   help="time the same steps without the exchange too, in alternating blocks in this launch")
    p.add_argument("--num-groups", type=int, default=0,
                   help="hvd.DistributedGradientTape(num_groups=N): allreduce the gradients as N groups, each "
                        "sent once all its tensors are ready (0: Horovod's default, one allreduce per tensor, "
                        "fused by the background thread as they arrive)")
    p.add_argument("--no-function", action="store_true", help="run the step eagerly (no tf.function)")
    p.add_argument("--jit", action="store_true", help="compile the step with XLA (tf.function jit_compile)")
    p.add_argument("--out", default=None, help="directory for rank{R}.json (default: no files)")
    p.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)  # --checkpoint's former name (parse_args)
    p.add_argument("--progress-every", type=int, default=0, help="rank 0 reports every N steps (0: per repeat)")
    p.add_argument("--bench-allreduce", action="store_true", help="time hvd.allreduce instead of training")
    p.add_argument("--sizes", default="4,1024,16384,262144,1048576,4194304",
                   help="--bench-allreduce: message sizes in bytes (float32)")
    p.add_argument("--chain", type=int, default=20, help="--bench-allreduce: allreduces per timed call")
    # fault injection, for the tests of labkit.scale.scaling's crash and timeout handling
    p.add_argument("--fail-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--kill-rank", type=int, default=-1, help=argparse.SUPPRESS)  # SIGKILL, mid-run
    p.add_argument("--fault-at-step", type=int, default=2, help=argparse.SUPPRESS)
    return p


def _problem(args) -> str | None:
    """The first thing wrong with the parsed options, in one line, or None."""
    try:
        for name, least in (("batch_size", 1), ("steps", 1), ("repeats", 1), ("image_size", 1), ("classes", 1),
                            ("chain", 1), ("warmup_steps", 0), ("lr_warmup_steps", 0), ("threads", 0),
                            ("inter_threads", 0), ("num_groups", 0), ("checkpoint_every", 0)):
            check_int(getattr(args, name), "--" + name.replace("_", "-"), minimum=least)
        if args.num_examples is not None:
            check_int(args.num_examples, "--num-examples", minimum=1)
    except ValueError as err:
        return str(err)
    if args.paired and (args.no_sync or args.barrier):
        return (f"--paired cannot be combined with {'--no-sync' if args.no_sync else '--barrier'}: it times the "
                "synced steps and their exchange-free control itself")
    if args.barrier and not args.no_sync:
        return "--barrier needs --no-sync (it replaces the gradient allreduce by a 4-byte one)"
    for flag, given in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every)):
        if given and not args.checkpoint:
            return f"{flag} needs --checkpoint (the folder of the run's checkpoint)"
    if args.checkpoint and args.paired:
        return "--checkpoint cannot be combined with --paired: it keeps one schedule of synced steps"
    if args.resume and args.no_sync:
        return ("--resume cannot be combined with --no-sync: the ranks' weights drifted apart, and rank 0's "
                "checkpoint alone cannot restore them")
    if args.data == "synthetic" and (args.image_size, args.classes) != (32, 10):
        return (f"--data synthetic is 32 px with 10 classes; got --image-size {args.image_size} --classes "
                f"{args.classes} (use --data random for other sizes)")
    if not args.bench_allreduce:
        from labkit import models  # noqa: F401  (imports TensorFlow, builds nothing: check_model asks it here)
        try:
            check_model(args.model, "--model")
        except ValueError as err:
            return str(err)
    return None


def parse_args(argv=None):
    """The worker's options, checked: one line and exit 2 on the first bad one, before any model is built."""
    p = _parser()
    args = p.parse_args(argv)
    args.checkpoint = args.checkpoint or args.checkpoint_dir
    problem = _problem(args)
    if problem:
        p.error(problem)
    return args


def _setup(args):
    """hvd.init, thread limits and GPU pinning; must run before TensorFlow executes any op. Also returns the
    ids of the threads hvd.init started (Horovod's background thread and Gloo's network threads)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    labkit.quiet()
    from labkit.base import machine
    from labkit.scale import gpu
    before = set(machine.thread_cpu_seconds())
    hvd.init()
    comm_tids = set(machine.thread_cpu_seconds()) - before
    threads = args.threads or machine.default_threads(local_size=hvd.local_size())
    machine.limit_threads(threads)
    if args.inter_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)

    # one GPU per rank, chosen by local rank (Horovod's recipe), or every rank on the CPU: never a mix
    pinned = gpu.place_rank(hvd.local_rank(), hvd.local_size(), args.device)
    return tf, hvd, threads, int(pinned is not None), comm_tids


def _load_data(tf, args, rank, size, skip: int = 0):
    """This rank's batches (an endless iterator) over its 1/size shard, the data set's name and sizes; skip:
    batches already trained (a resumed run starts where the stopped one left its shard).

    --data random: one fixed random batch, fed every step (Horovod's synthetic benchmark; nothing to shard).
    Otherwise labkit.data's synthetic set or load_dataset, through make_dataset(shard=(rank, size)).
    """
    import itertools

    from labkit import data
    if args.data == "random":
        x, y = data.random_batch(args.batch_size, args.image_size, args.classes, seed=args.seed + rank)
        batch = (tf.constant(x), tf.constant(y))
        return itertools.repeat(batch), "random", args.batch_size, args.batch_size, x.shape[1:]
    if args.data == "synthetic":
        (x, y), _ = data.synthetic(args.num_examples or num_examples_for(args.batch_size, size), 0, seed=args.seed)
        name = "synthetic"
    else:
        (x, y), _, info = data.load_dataset(None if args.data == "auto" else args.data)
        name = str(getattr(info, "name", info))
    mine = len(range(rank, len(x), size))  # make_dataset's shard: every size-th example from rank
    if mine < args.batch_size:
        raise ValueError(f"this rank's shard has {mine} examples, fewer than batch_size={args.batch_size}; "
                         f"raise --num-examples or lower --batch-size")
    ds = data.make_dataset(x, y, args.batch_size, shuffle=True, seed=args.seed, shard=(rank, size),
                           drop_remainder=True).repeat().skip(skip)
    return iter(ds), name, len(x), mine, x.shape[1:]


THREAD_ROLES = ("training", "horovod_background", "gloo_network")
# the settings of the exchange a rank reports back when they are set (rank JSON "tuning")
TUNING_ENV = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "OMPI_MCA_mpi_yield_when_idle")


def _thread_snapshot() -> dict:
    """{thread id: (CPU seconds so far, the kernel function it sleeps in)} for this process; {} without /proc."""
    from labkit.base import machine
    return {tid: (sec, machine.thread_wait_channel(tid)) for tid, sec in machine.thread_cpu_seconds().items()}


def _in_epoll(wchan: str) -> bool:
    return "epoll" in wchan or "ep_poll" in wchan  # do_epoll_wait on Linux 6, ep_poll on older kernels


def thread_cpu_by_role(start: dict, end: dict, comm_tids, steps: int, *, network_role="gloo_network") -> dict:
    """CPU milliseconds per step of this process's threads between two _thread_snapshot()s, summed by role:
    the threads hvd.init started that were seen sleeping in epoll (Gloo's network event loops) are
    network_role ('gloo_network'; under the MPI controller they are Open MPI's event threads: 'mpi_events'),
    the other ones it started (Horovod's background thread) 'horovod_background', every other thread
    (Python's, TensorFlow's pools) 'training'. Where no thread was seen in epoll (a kernel that hides wait
    channels, or another transport) the two communication roles cannot be told apart: they are summed as
    'communication'. {} without snapshots."""
    if not start or not end:
        return {}
    network = {tid for tid in comm_tids
               if _in_epoll(end.get(tid, (0, ""))[1]) or _in_epoll(start.get(tid, (0, ""))[1])}
    roles = ("training", "horovod_background", network_role) if network else ("training", "communication")
    out = dict.fromkeys(roles, 0.0)
    for tid, (sec, _) in end.items():
        sec0 = start.get(tid, (0.0, ""))[0]  # a thread started in between counts from zero
        if tid not in comm_tids:
            role = "training"
        elif not network:
            role = "communication"
        else:
            role = network_role if tid in network else "horovod_background"
        out[role] += sec - sec0
    return {role: round(1e3 * sec / max(1, steps), 4) for role, sec in out.items()}


def schedule(steps: int, repeats: int, warmup_steps: int, paired: bool = False) -> list:
    """The blocks of steps one rank runs, in order: (kind, number of steps, timed). kind "main" is the launch's
    own step, "no_sync" --paired's control (the same step without the exchange). Without paired: the warm-up,
    then all timed steps in one block. With paired: both warm-ups, then per repeat one block of each in ABBA
    order (even repeats: control first), so a drift in the machine's speed falls on both alike."""
    if not paired:
        plan = [("main", warmup_steps, False), ("main", steps * repeats, True)]
    else:
        plan = [("no_sync", warmup_steps, False), ("main", warmup_steps, False)]
        for r in range(repeats):
            order = ("no_sync", "main") if r % 2 == 0 else ("main", "no_sync")
            plan += [(kind, steps, True) for kind in order]
    return [block for block in plan if block[1] > 0]


def thread_cpu_over_blocks(blocks, comm_tids, steps: int, *, network_role="gloo_network") -> dict:
    """thread_cpu_by_role summed over several timed blocks: blocks are (start, end) _thread_snapshot() pairs,
    steps the timed steps in all of them. A thread seen in epoll in any snapshot counts as a network thread."""
    if not blocks or not all(start and end for start, end in blocks):
        return {}
    start, end = {}, {}
    for b0, b1 in blocks:
        for tid, (sec, wchan) in b1.items():
            total = end.get(tid, (0.0, ""))[0] + sec - b0.get(tid, (0.0, ""))[0]
            seen = [w for w in (wchan, b0.get(tid, (0, ""))[1], end.get(tid, (0, ""))[1]) if _in_epoll(w)]
            end[tid] = (total, seen[0] if seen else wchan)
            start[tid] = (0.0, "")
    return thread_cpu_by_role(start, end, comm_tids, steps, network_role=network_role)


def _steps(tf, hvd, args, model, opt) -> dict:
    """The step functions by kind: "main" (the launch's own: synced by DistributedGradientTape unless --no-sync;
    with --barrier a 4-byte allreduce after it) and, under --paired, "no_sync" (the same step, unaveraged)."""
    from labkit.base import training
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)  # every labkit model: softmax
    # DistributedGradientTape averages the gradients over all ranks (fused ring allreduce); --no-sync skips it
    tape_wrapper = None if args.no_sync else functools.partial(hvd.DistributedGradientTape,
                                                               num_groups=args.num_groups)
    jit = True if args.jit else None
    steps = {"main": training.make_train_step(model, opt, loss_fn, tape_wrapper, jit_compile=jit)}
    if args.paired:  # the control: the same model, optimizer and data, the gradients applied unaveraged
        steps["no_sync"] = training.make_train_step(model, opt, loss_fn, None, jit_compile=jit)
    if args.barrier:  # every step ends when the slower rank's does, but only 4 bytes cross
        local_step = steps["main"].python_function

        def barrier_step(x, y):
            loss = local_step(x, y)
            # the step counter read after the update: this allreduce cannot start before the update is done
            # (the loss alone would let it run beside backprop and hide its latency)
            done = tf.cast(tf.reshape(opt.iterations.read_value(), [1]), tf.float32)
            with tf.control_dependencies([hvd.allreduce(done, op=hvd.Average, name="barrier")]):
                return tf.identity(loss)

        steps["main"] = tf.function(barrier_step, jit_compile=jit, autograph=False)  # as make_train_step
    if args.no_function:
        steps = {k: step.python_function for k, step in steps.items()}  # the same steps, run eagerly op by op
    return steps


def _fault(args, rank: int, i: int) -> None:
    """--fail-rank / --hang-rank / --kill-rank: fail, hang or SIGKILL this rank at step --fault-at-step (the
    launcher's tests)."""
    if i == args.fault_at_step and rank == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would: no Python cleanup
    if i == args.fault_at_step and rank == args.fail_rank:
        raise RuntimeError(f"injected failure on rank {rank} at step {i} (--fail-rank)")
    if i == args.fault_at_step and rank == args.hang_rank:
        print(f"rank {rank}: hanging on purpose at step {i} (--hang-rank)", file=sys.stderr, flush=True)
        time.sleep(10**6)


class _Progress:
    """Rank 0's progress lines (PROGRESS_TAG + JSON) over the timed steps of both kinds, and its log.jsonl."""

    def __init__(self, args, rank: int, total: int, lr_fn, opt, done: int = 0):
        self.args, self.on, self.total, self.lr_fn, self.opt = args, rank == 0, total, lr_fn, opt
        self.every, self.done, self.lines, self.t0 = args.progress_every or args.steps, done, [], time.perf_counter()
        self.log = Path(args.checkpoint) / "log.jsonl" if self.on and args.checkpoint else None
        if self.log:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            if done and self.log.is_file():  # a resumed run keeps the stopped one's lines up to its step
                self.lines = [line + "\n" for line in self.log.read_text().splitlines()
                              if line.strip() and json.loads(line)["step"] <= done]

    def step(self, kind: str, loss: float) -> None:
        self.done += 1
        if not self.on or (self.done % self.every and self.done != self.total):
            return
        msg = {"step": self.done, "steps": self.total, "loss": round(loss, 4),
               "lr": float(self.lr_fn(int(self.opt.iterations) - 1)),
               "elapsed_s": round(time.perf_counter() - self.t0, 2)}
        if self.args.paired:
            msg["block"] = kind
        print(f"{PROGRESS_TAG} {json.dumps(msg)}", flush=True)
        if self.log:  # the whole log rewritten atomically (a few lines): a kill leaves the last complete one
            from labkit.base import resultsfile
            self.lines.append(json.dumps(msg) + "\n")
            resultsfile.write_text(self.log, "".join(self.lines))


def _run_plan(args, rank, plan, steps, batches, broadcast, model, opt, progress, after_step=None) -> dict:
    """Run the blocks of plan; per kind of step its timed step times, CPU times and per-thread snapshots, and
    the losses, the index of the last synced step's, each control block's checksum. after_step(): called after
    each step; True stops the run there (run["stopped"])."""
    from labkit.base import rankstats
    times = {k: {"step": [], "cpu": [], "threads": []} for k in steps}
    run = {"times": times, "losses": [], "main_loss_at": 0, "no_sync_checksums": [], "stopped": False}
    last_main = max((b for b, (kind, _, _) in enumerate(plan) if kind == "main"), default=-1)
    saved = None
    for b, (kind, n_steps, timed) in enumerate(plan):
        if run["stopped"]:
            break
        if kind == "main" and b > 0 and plan[b - 1][0] == "no_sync":
            broadcast()  # untimed: every synced block starts from equal weights, whatever the control did
        before = _thread_snapshot() if timed else None
        for _ in range(n_steps):
            _fault(args, rank, len(run["losses"]))
            xb, yb = next(batches)
            c0, t0 = time.process_time(), time.perf_counter()
            loss = float(steps[kind](xb, yb))  # float() waits for the step to finish: honest per-step time
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            run["losses"].append(loss)
            if kind == "main":
                run["main_loss_at"] = len(run["losses"]) - 1
            if timed:
                times[kind]["step"].append(dt)
                times[kind]["cpu"].append(dc)  # CPU seconds of all this rank's threads: work, not waiting for a core
                progress.step(kind, loss)
            if after_step is not None and after_step():
                run["stopped"] = True
                break
        if timed:
            times[kind]["threads"].append((before, _thread_snapshot()))
        if kind == "no_sync" and timed:  # before the next broadcast: each rank's own drift (the proof of no exchange)
            run["no_sync_checksums"].append(rankstats.weights_checksum([v.numpy() for v in model.trainable_weights]))
        if b == last_main and b < len(plan) - 1:  # the state to report: after the last synced block
            saved = [v.numpy() for v in (*model.variables, *opt.variables())]
    if saved is not None:  # undo the unsynced steps after the last synced block (checksum, checkpoint, lr)
        for v, value in zip((*model.variables, *opt.variables()), saved):
            v.assign(value)
    return run


def _timing(args, t: dict, comm_tids, network_role: str) -> dict:
    """One kind of step's timing fields of the rank result. A resumed or stopped run may have timed fewer than
    --steps steps: they are then one repeat; none at all gives NaN times and no repeats."""
    import numpy as np

    from labkit.base import rankstats
    n = len(t["step"])
    summary = (rankstats.summarize_times(t["step"], args.batch_size, min(args.steps, n)) if n else
               {"images_per_sec": float("nan"), "images_per_sec_std": float("nan"), "images_per_sec_repeats": [],
                "step_time_s": float("nan"), "step_time_mean_s": float("nan"), "step_time_p10_s": float("nan")})
    return {"step_times_s": [round(x, 6) for x in t["step"]],
            "cpu_step_time_s": float(np.median(t["cpu"])) if n else float("nan"),
            "cpu_step_times_s": [round(x, 6) for x in t["cpu"]],
            "thread_cpu_ms_per_step": thread_cpu_over_blocks(t["threads"], comm_tids, n, network_role=network_role),
            **summary}


def remaining(plan, done: int) -> list:
    """plan (schedule's blocks) without its first `done` steps: what a run resumed at step `done` still runs."""
    out = []
    for kind, n, timed in plan:
        cut = min(n, done)
        done -= cut
        if n - cut:
            out.append((kind, n - cut, timed))
    return out


class _Stop:
    """SIGUSR1 or SIGTERM asks this rank to stop: after the current step, every rank learns whether any rank was
    asked (one 4-byte allreduce), so all stop after the same step and rank 0 checkpoints it."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
    instance = None  # the one this process installed (main installs it first thing)

    def __init__(self):
        _Stop.instance, self.asked = self, 0
        for sig in self.SIGNALS:
            signal.signal(sig, self._ask)

    def _ask(self, signum, frame):
        self.asked = int(signum)

    def agreed(self, tf, hvd) -> bool:
        return bool(hvd.allreduce(tf.constant(float(self.asked)), op=hvd.Max, name="labkit_stop").numpy())


def train(args) -> RankRecord:
    """This rank's training run, as its result dict (rank{R}.json; its schema: labkit.scale.records.RankRecord)."""
    stop = _Stop.instance or _Stop() if args.checkpoint else None  # SIGUSR1/SIGTERM: a checkpoint, not an end
    tf, hvd, threads, n_gpus, comm_tids = _setup(args)
    rank, size = hvd.rank(), hvd.size()
    plan = schedule(args.steps, args.repeats, args.warmup_steps, args.paired)
    total = sum(n for _, n, _ in plan)
    refusal, done = None, 0
    if args.checkpoint:  # every rank reads the checkpoint's settings (a few bytes) and checks them, now
        tf.config.experimental.enable_op_determinism()  # with the seeds below: the same run, bit for bit
        refusal = ckpt.problem(args.checkpoint, _run_settings(args, size, total), args.resume)
        done = 0 if refusal or not args.resume else ckpt.read_meta(args.checkpoint)["step"]
    batches, data_name, n_total, n_mine, shape = _load_data(tf, args, rank, size, skip=done)
    from labkit import models
    from labkit.base import config, rankstats, training
    config.set_seed(args.seed + rank)  # different on purpose: the broadcast must make them equal
    model = models.get(args.model, input_shape=tuple(shape), classes=args.classes)
    if args.checkpoint:
        _refuse_on_every_rank(tf, hvd, refusal or (_space_problem(args, model) if rank == 0 else None))
    scale = float(size) if args.scale_lr else 1.0
    lr_fn = lambda step: training.warmup_lr(step, args.lr, scale, args.lr_warmup_steps)  # noqa: E731
    opt = tf.keras.optimizers.legacy.SGD(learning_rate=training.WarmupLR(args.lr, scale, args.lr_warmup_steps),
                                         momentum=args.momentum)
    steps = _steps(tf, hvd, args, model, opt)

    opt._create_all_weights(model.trainable_variables)  # the slots exist before the first broadcast
    state = (*model.variables, *opt.variables())  # weights, then the step counter (the LR's) and momentum slots
    broadcast = training.from_rank0(hvd, state)  # everyone from rank 0's weights and optimizer state
    if done and rank == 0:
        _restore(state, ckpt.read_arrays(args.checkpoint), args.checkpoint)
    broadcast()  # a fresh run's rank-0 weights, or the checkpoint, on every rank
    timed_done = sum(n for _, n, timed in plan if timed) - sum(n for _, n, timed in remaining(plan, done) if timed)
    progress = _Progress(args, rank, sum(n for _, n, timed in plan if timed), lr_fn, opt, done=timed_done)
    at = {"step": done}

    def write_checkpoint():
        ckpt.write(args.checkpoint, {**_run_settings(args, size, total), "step": at["step"]},
                   [v.numpy() for v in state])

    def after_step() -> bool:  # checkpoint mode: count, agree on a stop, checkpoint every N steps
        at["step"] += 1
        stopping = stop.agreed(tf, hvd)
        if rank == 0 and not stopping and args.checkpoint_every and at["step"] % args.checkpoint_every == 0:
            write_checkpoint()
        return stopping

    run = _run_plan(args, rank, remaining(plan, done), steps, batches, broadcast, model, opt, progress,
                    after_step if args.checkpoint else None)
    if rank == 0 and args.checkpoint:  # where the run stopped, or its end
        write_checkpoint()

    controller = "mpi" if hvd.mpi_enabled() else "gloo"  # which one hvd.init chose (the launcher's)
    network_role = "mpi_events" if controller == "mpi" else "gloo_network"
    losses, last = run["losses"], run["main_loss_at"]
    # metric averaging: one allreduce of the whole loss history at the end, not one per step
    loss_avg = hvd.allreduce(tf.constant(losses, tf.float32), op=hvd.Average).numpy() if losses else []
    # what the optimizer trains: BatchNorm's moving mean/variance follow each rank's own shard (Horovod does
    # not average them), so they differ across ranks even when every trained weight agrees
    weights = [v.numpy() for v in model.trainable_weights]
    result: RankRecord = {
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "host": os.uname().nodename, "pid": os.getpid(), "threads": threads, "gpus_visible": n_gpus,
        "controller": controller, "tuning": {k: os.environ[k] for k in TUNING_ENV if k in os.environ},
        "model": args.model, "params": int(model.count_params()), "data": data_name,
        "examples_total": int(n_total), "examples_this_rank": int(n_mine),
        "batch_size": args.batch_size, "global_batch_size": args.batch_size * size,
        "steps": args.steps, "repeats": args.repeats, "warmup_steps": args.warmup_steps,
        "lr": args.lr, "lr_final": float(lr_fn(int(opt.iterations))), "scale_lr": args.scale_lr,
        "lr_warmup_steps": args.lr_warmup_steps, "sync": not args.no_sync, "barrier": args.barrier,
        "num_groups": args.num_groups, "jit": args.jit, "paired": args.paired,
        **_timing(args, run["times"]["main"], comm_tids, network_role),
        "loss_local": [round(v, 5) for v in losses], "loss_avg": [round(float(v), 5) for v in loss_avg],
        # the last synced step's (under --paired the last step run may be a control step)
        "final_loss": float(loss_avg[last]) if losses else float("nan"),
        "final_loss_local": float(losses[last]) if losses else float("nan"),
        "checksum": rankstats.weights_checksum(weights), "weight_sum": float(sum(abs(w).sum() for w in weights)),
        "grad_bytes": int(sum(4 * int(v.shape.num_elements()) for v in model.trainable_variables)),
        "grad_tensors": [4 * int(v.shape.num_elements()) for v in model.trainable_variables],
    }
    if args.paired:  # the control's timing, and each rank's trained weights after every one of its blocks
        checks = run["no_sync_checksums"]
        result["no_sync"] = {**_timing(args, run["times"]["no_sync"], comm_tids, network_role),
                             "checksums_after_block": checks, "checksum": checks[-1]}
    if args.checkpoint:
        result["checkpoint"] = {"step": at["step"], "total_steps": total, "resumed_from": done,
                                "stopped": run["stopped"]}
    if rank == 0 and args.checkpoint:
        _write_weights_whole(model, Path(args.checkpoint) / "weights.h5")
    return result


def _run_settings(args, size: int, total: int) -> dict:
    """What a checkpoint of this run records and a resumed run must share (checkpoint.RUN_KEYS), and its steps."""
    return {"model": args.model, "size": size, "batch_size": args.batch_size, "seed": args.seed, "data": args.data,
            "num_examples": args.num_examples or num_examples_for(args.batch_size, size),
            "image_size": args.image_size, "classes": args.classes, "lr": args.lr, "scale_lr": args.scale_lr,
            "lr_warmup_steps": args.lr_warmup_steps, "momentum": args.momentum, "total_steps": total}


def _space_problem(args, model) -> str | None:
    """Rank 0: the checkpoint folder made, and room in it for a checkpoint, now; or the problem in one line."""
    from labkit.base import resultsfile
    try:
        Path(args.checkpoint).mkdir(parents=True, exist_ok=True)
        resultsfile.check_space(ckpt.path(args.checkpoint), ckpt.estimate_bytes(model.count_params()),
                                "--checkpoint")
    except (OSError, ValueError) as err:
        return str(err) if str(err).startswith("--checkpoint") else f"--checkpoint: {err}"
    return None


def _refuse_on_every_rank(tf, hvd, problem: str | None) -> None:
    """Before any training: where any rank found a problem, every rank exits 2 (the finder says it in one line)."""
    if hvd.allreduce(tf.constant(1.0 if problem else 0.0), op=hvd.Max, name="labkit_refuse").numpy():
        if problem:
            print(f"hvd_train: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)


def _restore(variables, arrays, folder) -> None:
    """Rank 0: the checkpoint's arrays into the model's and optimizer's variables, in order."""
    shapes = [tuple(v.shape) for v in variables]
    if [tuple(a.shape) for a in arrays] != shapes:
        raise ValueError(f"--resume: the checkpoint in {folder} holds {len(arrays)} arrays that do not fit this "
                         f"model's {len(shapes)} variables")
    for v, a in zip(variables, arrays):
        v.assign(a)


def _write_weights_whole(model, path: Path) -> None:
    from labkit.base import resultsfile
    with resultsfile.replacing_path(path) as tmp:
        model.save_weights(str(tmp))


def bench_allreduce(args) -> dict:
    """Median time of one hvd.allreduce per message size (a chain of dependent allreduces per call)."""
    import numpy as np
    tf, hvd, threads, _, _ = _setup(args)
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
    if any(a.startswith("--checkpoint") for a in (sys.argv[1:] if argv is None else argv)):
        _Stop()  # at once: a SIGUSR1 while TensorFlow loads must ask for a checkpoint, not end the rank
    args = parse_args(argv)
    result = bench_allreduce(args) if args.bench_allreduce else train(args)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        from labkit.base import resultsfile
        # a reader never sees half a file
        resultsfile.write_text(out / f"rank{result['rank']}.json", json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
