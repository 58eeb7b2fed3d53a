"""Keras's model.fit path against labkit's custom loop: images/s on the same network, batch and workers
(04_horovod_scaling).

`compare(np_=2)` alternates labkit.scale.hvd_train (the custom loop with hvd.DistributedGradientTape, as `labkit scale`
runs it: time of each step call) and labkit/scale/keras_hvd.py (model.fit with Horovod's callbacks, timed by
labkit.exercises.hvd_harness --timing: wall time between the ends of consecutive training batches), `rounds` times each
in one launch, and returns one row per run; `summary` gives the medians and the ratio fit / custom loop.
`explain` takes fit's per-step pieces away one at a time; `fixed_overhead` measures the per-step machinery alone.
Both: small_cnn, 32x32 images, legacy SGD with momentum, the same warm-up steps excluded, images/s summed
over the ranks, mean over `repeats` blocks of `steps` steps. `labkit fit-bench` runs it from a shell.
"""
from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

import numpy as np

from labkit.base import resultsfile  # every file labkit writes, written atomically
from labkit.base.checks import check_int, check_number

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTEROP_THREADS")
PATHS = ("fit", "custom_loop")

OWN = resultsfile.json_document("rows")  # what --json holds: no other existing file is replaced


def _launch_args(np_, batch_size, steps, repeats, warmup_steps, threads, rounds):
    """(the fit script's arguments, hvd_train's path, its arguments): the same run on both paths, checked first."""
    from labkit.scale import scaling
    for name, value in (("np_", np_), ("batch_size", batch_size), ("steps", steps), ("repeats", repeats),
                        ("warmup_steps", warmup_steps), ("rounds", rounds), ("threads", threads)):
        check_int(value, name, minimum=1)
    total = warmup_steps + steps * repeats  # steps per rank; keras_hvd divides its --steps by the workers
    fit_args = ["--epochs", "1", "--steps", str(total * np_), "--batch-size", str(batch_size), "--lr", "0.01",
                "--threads", str(threads)]
    loop_args = [*scaling.train_args(batch_size=batch_size, steps=steps, repeats=repeats, warmup_steps=warmup_steps,
                                     threads=threads), "--out", "{workdir}"]
    return fit_args, Path(scaling.__file__).with_name("hvd_train.py"), loop_args


def _run(entries, np_, timeout, threads):
    """The scripts in one launch, each rank held to `threads` threads."""
    from labkit.exercises import check_hvd
    return check_hvd.run_scripts(entries, np_=np_, timeout=timeout, timing=True,
                                 env_extra={var: str(threads) for var in THREAD_ENV})


def _row(label, ranks, fit: bool, batch_size, warmup_steps, steps) -> dict:
    """One script's numbers from its ranks' records (RuntimeError naming label when a rank failed)."""
    failed = [r for r in ranks if r.get("error")]
    if failed:
        raise RuntimeError(f"{label} failed on rank {failed[0]['rank']}: {failed[0]['error']}")
    if fit:
        return fit_images_per_sec(ranks, batch_size, warmup_steps, steps)
    from labkit.scale import scaling
    summ = scaling.summarize([r["result"] for r in ranks])
    return {key: float(summ[key]) for key in ("images_per_sec", "images_per_sec_std", "step_time_s",
                                              "step_time_p10_s", "cpu_step_time_s")}



def fit_images_per_sec(ranks: list[dict], batch_size: int, warmup_steps: int, steps: int) -> dict:
    """One fit launch's images/s from its ranks' batch-end times: steps after warm-up, in blocks of `steps`,
    summed over the ranks per block (as labkit.scale.scaling.summarize does for the custom loop)."""
    from labkit.base import rankstats
    per_rank, cpu = [], []
    for r in ranks:
        done = np.asarray(r["batch_index"], dtype=int) + 1  # steps done at each mark
        if warmup_steps < done[0]:
            raise ValueError(f"warmup_steps={warmup_steps} is shorter than the first timed block ({done[0]} steps)")

        def per_step(marks, done=done):  # this rank's marks
            # each interval between two marks covers done[i] - done[i-1] steps (k under steps_per_execution=k)
            t = np.asarray(marks, dtype=float)
            return np.repeat(np.diff(t) / np.diff(done), np.diff(done))[warmup_steps - done[0]:]

        per_rank.append(rankstats.summarize_times(per_step(r["batch_end_s"]), batch_size, steps))
        cpu.append(float(np.median(per_step(r["batch_cpu_s"]))))
    per_block = np.sum([s["images_per_sec_repeats"] for s in per_rank], axis=0)
    return {"images_per_sec": float(per_block.mean()),
            "images_per_sec_std": float(per_block.std(ddof=1)) if per_block.size > 1 else 0.0,
            "step_time_s": float(np.median([s["step_time_s"] for s in per_rank])),
            # a synchronous step ends when the slowest rank's does: the max over ranks (labkit.scale.scaling's rule)
            "step_time_p10_s": float(np.max([s["step_time_p10_s"] for s in per_rank])),
            "cpu_step_time_s": float(np.median(cpu))}


def compare(np_: int = 2, *, batch_size: int = 64, steps: int = 20, repeats: int = 3, warmup_steps: int = 5,
            rounds: int = 3, threads: int = 1, timeout: float = 1200, script=None):
    """The custom loop (labkit.scale.hvd_train, as `labkit scale` runs it) and model.fit (labkit/scale/keras_hvd.py),
    alternated `rounds` times in ONE launch: the same processes, so neither gets a quieter start-up or machine; a
    DataFrame, one row per run. The custom loop runs first and sets the thread pools (hvd_train --threads) for both."""
    import pandas as pd

    from labkit.exercises import check_hvd
    script = Path(script) if script is not None else check_hvd.REFERENCE
    fit_args, loop, loop_args = _launch_args(np_, batch_size, steps, repeats, warmup_steps, threads, rounds)
    order = [path for _ in range(rounds) for path in ("custom_loop", "fit")]
    entries = [(loop, loop_args) if path == "custom_loop" else (script, fit_args) for path in order]
    runs = _run(entries, np_, timeout, threads)
    rows = [{"round": k // 2 + 1, "path": path,
             **_row(path, ranks, path == "fit", batch_size, warmup_steps, steps)}
            for k, (path, ranks) in enumerate(zip(order, runs))]
    out = pd.DataFrame(rows)
    out.attrs["config"] = {"np": np_, "model": "small_cnn", "batch_size": batch_size, "steps": steps,
                           "repeats": repeats, "warmup_steps": warmup_steps, "threads": threads, "rounds": rounds}
    return out


# What model.fit adds per step, one piece taken away at a time: (name, [(text in keras_hvd.py, replacement)])
_NO_WARMUP = ("    hvd.callbacks.LearningRateWarmupCallback(", "    # hvd.callbacks.LearningRateWarmupCallback(")
_NO_CALLBACKS = [("    hvd.callbacks.BroadcastGlobalVariablesCallback(0),", ""),
                 ("    hvd.callbacks.MetricAverageCallback(),", ""), _NO_WARMUP]
_NO_ACCURACY = [('metrics=["accuracy"]', "metrics=[]"), (", accuracy {history.history['accuracy'][-1]:.3f}", "")]
VARIANTS = (
    ("keras_hvd.py", []),
    ("no LR warmup callback", [_NO_WARMUP]),
    ("no Horovod callbacks", _NO_CALLBACKS),
    ("no callbacks, no accuracy", [*_NO_CALLBACKS, *_NO_ACCURACY]),
    ("steps_per_execution=5", [('metrics=["accuracy"])', 'metrics=["accuracy"], steps_per_execution=5)')]),
    ("one fixed batch, no callbacks, no accuracy", [*_NO_CALLBACKS, *_NO_ACCURACY, (
        "dataset = data.make_dataset(x, y, args.batch_size, shard=(hvd.rank(), hvd.size()), drop_remainder=True)"
        ".repeat()", "dataset = tf.data.Dataset.from_tensors((tf.random.uniform((args.batch_size, *x.shape[1:])), "
        "y[:args.batch_size])).repeat()")]),
)
LOOP_VARIANTS = (  # labkit.scale.hvd_train, as `labkit scale` runs it, beside them in the same launch
    ("custom loop (hvd_train)", []),
    ("custom loop, one fixed batch", ["--data", "random"]),
)


def _edited(source: str, edits) -> str:
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"the script no longer contains {old!r} exactly once")
        source = source.replace(old, new)
    return source


def explain(np_: int = 2, *, batch_size: int = 64, steps: int = 20, repeats: int = 3, warmup_steps: int = 5,
            rounds: int = 3, threads: int = 1, timeout: float = 900):
    """Where model.fit's time goes: labkit.scale.hvd_train (LOOP_VARIANTS), keras_hvd.py and its VARIANTS, each `rounds`
    times, interleaved in ONE launch (the same processes); a DataFrame, one row per run, images/s summed over
    the ranks."""
    import tempfile

    import pandas as pd

    from labkit.exercises import check_hvd
    args, loop, loop_args = _launch_args(np_, batch_size, steps, repeats, warmup_steps, threads, rounds)
    source = check_hvd.REFERENCE.read_text()
    with tempfile.TemporaryDirectory(prefix="labkit-fitbench-") as tmp:
        entries = [(loop, [*loop_args, *extra]) for _, extra in LOOP_VARIANTS]  # first: hvd_train sets the pools
        for i, (_, edits) in enumerate(VARIANTS):
            entries.append((Path(tmp) / f"variant{i}.py", args))
            resultsfile.write_text(entries[-1][0], _edited(source, edits))
        names = [name for name, _ in LOOP_VARIANTS] + [name for name, _ in VARIANTS]
        order = [i for _ in range(rounds) for i in range(len(entries))]
        runs = _run([entries[i] for i in order], np_, timeout, threads)
    rows = [{"round": k // len(entries) + 1, "variant": names[i],
             **_row(f"variant {names[i]!r}", ranks, i >= len(LOOP_VARIANTS), batch_size, warmup_steps, steps)}
            for k, (i, ranks) in enumerate(zip(order, runs))]
    return pd.DataFrame(rows)


def _tiny_run(batch_size: int, model: str | None):
    """(dataset, make) for fixed_overhead: 4 random batches repeated; make() -> (model, optimizer)."""
    import tensorflow as tf

    from labkit import models
    rng = np.random.default_rng(0)
    shape = (4, 4, 1) if model is None else (32, 32, 3)
    x = rng.random((4 * batch_size, *shape), dtype=np.float32)
    y = rng.integers(0, 2, 4 * batch_size).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True).repeat()

    def make():
        net = tf.keras.Sequential([tf.keras.layers.Input(shape), tf.keras.layers.Flatten(),
                                   tf.keras.layers.Dense(2, activation="softmax")]) if model is None else \
            models.get(model, input_shape=shape, classes=10)
        return net, tf.keras.optimizers.legacy.SGD(learning_rate=0.01, momentum=0.9)
    return dataset, make


def _fit_step_s(dataset, make, steps: int, horovod_callbacks: bool, accuracy: bool) -> float:
    """Median seconds between consecutive batch ends of one model.fit epoch (the first 5 left out)."""
    import time

    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    ends = []
    clock = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    model, opt = make()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=hvd.DistributedOptimizer(opt),
                  metrics=["accuracy"] if accuracy else [])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01, warmup_epochs=1)] \
        if horovod_callbacks else []
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[*callbacks, clock])
    return float(np.median(np.diff(ends)[5:]))


def _loop_step_s(dataset, make, steps: int) -> float:
    """The same for labkit's custom loop, the loss read back every step as labkit.scale.hvd_train does."""
    import time

    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    from labkit.base import training
    model, opt = make()
    step = training.make_train_step(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(),
                                    hvd_tf.DistributedGradientTape)
    it, ends = iter(dataset), []
    for _ in range(steps):
        float(step(*next(it)))
        ends.append(time.perf_counter())
    return float(np.median(np.diff(ends)[5:]))


def fixed_overhead(steps: int = 300, rounds: int = 3, batch_size: int = 4, model: str | None = None) -> dict:
    """Median microseconds per step of model.fit and of a custom loop, in this process (Horovod of size 1), rounds
    alternated; model=None: a 16 -> 2 dense layer, so what remains is the per-step machinery alone."""
    import horovod.tensorflow.keras as hvd

    for name, value, minimum in (("steps", steps, 10), ("rounds", rounds, 1), ("batch_size", batch_size, 1)):
        check_int(value, name, minimum=minimum)
    hvd.init()
    dataset, make = _tiny_run(batch_size, model)
    paths = {"fit, Horovod's callbacks, accuracy": lambda: _fit_step_s(dataset, make, steps, True, True),
             "fit, no callbacks, no metric": lambda: _fit_step_s(dataset, make, steps, False, False),
             "custom loop": lambda: _loop_step_s(dataset, make, steps)}
    times = {name: [] for name in paths}
    for _ in range(rounds):
        for name, run in paths.items():
            times[name].append(run())
    return {name: 1e6 * float(np.median(t)) for name, t in times.items()}


def summary(df) -> dict:
    """Median images/s of each path over the rounds, and fit / custom loop (1.0: fit costs nothing)."""
    med = {p: float(df.loc[df["path"] == p, "images_per_sec"].median()) for p in PATHS}
    cpu = {p: float(df.loc[df["path"] == p, "cpu_step_time_s"].median()) for p in PATHS}
    p10 = {p: float(df.loc[df["path"] == p, "step_time_p10_s"].median()) for p in PATHS}
    return {"fit_images_per_sec": med["fit"], "custom_loop_images_per_sec": med["custom_loop"],
            "ratio": med["fit"] / med["custom_loop"],
            # the uncontended steps (10th percentile of step times) of a shared machine, as a speed ratio
            "fit_step_time_p10_s": p10["fit"], "custom_loop_step_time_p10_s": p10["custom_loop"],
            "p10_ratio": p10["custom_loop"] / p10["fit"],
            # CPU seconds per step, all threads: work done, whatever the waits (fit's extra work shows here)
            "fit_cpu_step_time_s": cpu["fit"], "custom_loop_cpu_step_time_s": cpu["custom_loop"],
            "cpu_ratio": cpu["fit"] / cpu["custom_loop"], **df.attrs.get("config", {})}


def cli_main(argv=None) -> int:
    """`labkit fit-bench [--np 2] [--batch-size 64] [--steps 20] [--rounds 3] [--explain] [--json FILE]`."""
    from labkit.scale.scaling import _Parser  # labkit scale's one-line errors
    p = _Parser(prog="labkit fit-bench",
                description="images/s of Keras's model.fit with Horovod's callbacks (labkit/scale/keras_hvd.py) "
                            "against labkit's custom loop (labkit.scale.hvd_train), alternated launches.")
    p.add_argument("--np", type=int, default=2, help="workers (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="images per worker per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per launch")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=3, help="runs of each path, alternated in one launch")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--timeout", type=float, default=1200, help="seconds for the launch")
    p.add_argument("--json", dest="json_path", default=None, help="write the rows and the summary here")
    p.add_argument("--explain", action="store_true",
                   help="instead: keras_hvd.py with one piece of fit's per-step work taken away at a time, beside "
                        "the custom loop, in one launch (where fit's time goes)")
    a = p.parse_args(argv)
    from labkit.scale.scaling import Terminated  # labkit scale's: SIGTERM and SIGHUP as a Ctrl-C
    try:
        _check_args(a)
        with resultsfile.claimed(a.json_path, "--json", own=OWN) if a.json_path else contextlib.nullcontext(), \
                _terminated_as_interrupt():
            return _bench(a)
    except ValueError as err:
        p.error(str(err))
    except Terminated as stop:  # SIGTERM/SIGHUP end here, cleaned up; Ctrl-C goes on to labkit's one line
        print(f"labkit fit-bench: stopped by {signal.Signals(stop.args[0]).name}; every process of the launch was "
              "killed", file=sys.stderr)
        return 128 + stop.args[0]


@contextlib.contextmanager
def _terminated_as_interrupt():
    """SIGTERM and SIGHUP handled as Ctrl-C while fit-bench runs (labkit scale's Terminated), so the launch and the
    --json lock are cleaned up (the default action ended the process and left the lock file). Main thread only."""
    import threading

    from labkit.scale.scaling import Terminated

    def terminate(signum, frame):
        raise Terminated(signum)

    handled = (signal.SIGTERM, signal.SIGHUP) if threading.current_thread() is threading.main_thread() else ()
    previous = {sig: signal.signal(sig, terminate) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check_args(a) -> None:
    """What `labkit scale` refuses, fit-bench refuses too, in one line before any launch: counts, more workers
    than cores, a batch that cannot fit in memory (LABKIT_MEMORY honoured), a --json target not its own."""
    from labkit.scale import scaling
    for name in ("np", "batch_size", "steps", "repeats", "warmup_steps", "rounds", "threads"):
        check_int(getattr(a, name), f"--{name.replace('_', '-')}", minimum=1)
    check_number(a.timeout, "--timeout", above=0)
    scaling.check_cores([a.np])
    scaling.check_memory("small_cnn", a.batch_size, a.np)
    if a.json_path:
        scaling._check_json_path(a.json_path)
        resultsfile.check_target(a.json_path, "--json", own=OWN)


def _bench(a) -> int:
    """The launches `labkit fit-bench` asked for, printed and (with --json) written."""
    if a.explain:
        print(f"labkit fit-bench --explain: {a.rounds} rounds of {len(LOOP_VARIANTS) + len(VARIANTS)} runs in one "
              f"{a.np}-worker launch ...", flush=True)
        df = explain(a.np, batch_size=a.batch_size, steps=a.steps, repeats=a.repeats, warmup_steps=a.warmup_steps,
                     rounds=a.rounds, threads=a.threads, timeout=a.timeout)
        table = df.groupby("variant", sort=False)[["images_per_sec", "step_time_p10_s", "cpu_step_time_s"]].median()
        table["vs_custom_loop"] = table["images_per_sec"] / table["images_per_sec"].iloc[0]
        print(f"np={a.np}, small_cnn, batch {a.batch_size}/worker, {a.threads} thread(s)/worker, medians of "
              f"{a.rounds} rounds:\n{table.round(4).to_string()}")
        if a.json_path:
            resultsfile.write_json(a.json_path, {"rows": df.to_dict("records")}, indent=2)
        return 0
    print(f"labkit fit-bench: {a.rounds} rounds of custom loop then model.fit in one {a.np}-worker launch ...",
          flush=True)
    df = compare(a.np, batch_size=a.batch_size, steps=a.steps, repeats=a.repeats, warmup_steps=a.warmup_steps,
                 rounds=a.rounds, threads=a.threads, timeout=a.timeout)
    s = summary(df)
    print(f"np={a.np}, small_cnn, batch {a.batch_size}/worker, {a.threads} thread(s)/worker, {a.rounds} rounds: "
          f"model.fit {s['fit_images_per_sec']:.1f} images/s, custom loop {s['custom_loop_images_per_sec']:.1f} "
          f"images/s (medians), fit / custom loop = {s['ratio']:.3f}; uncontended steps (p10): "
          f"{s['p10_ratio']:.3f}; CPU per step: fit {1e3 * s['fit_cpu_step_time_s']:.1f} ms, custom loop "
          f"{1e3 * s['custom_loop_cpu_step_time_s']:.1f} ms")
    if a.json_path:
        resultsfile.write_json(a.json_path, {"rows": df.to_dict("records"), "summary": s}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
