"""The MATLAB white paper's 16 CIFAR-10 networks: configs, the paper's parameter count, the trainer, the pick.

*Deep Learning in the Cloud with MATLAB R2016b* (MathWorks white paper) trains 16 variants of one
CIFAR-10 network with parfor, plots accuracy against memory footprint and keeps the Pareto front.
labkit.sweep runs them in worker processes; this module says what the networks are and how to train them.

    from labkit.sweep import networks as netsweep
    from labkit import sweep
    trainer = netsweep.NetworkTrainer.for_profile()
    run = sweep.run_sweep(netsweep.network_configs(), trainer, "runs/sweep.jsonl", num_workers=2)
    df = netsweep.with_pareto(run.to_dataframe()); netsweep.recommend(df)

The `labkit sweep` command lives here too; it imports TensorFlow only once it trains. (05_network_sweep)
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit import sweep
from labkit.base import config
from labkit.base.checks import check_int, check_number
from labkit.sweep.runner import check_workers, pareto_front  # noqa: F401  (pareto_front: re-exported for 05)

_KEYS = {"filters", "filter_size", "pool_size", "extra_conv"}


def network_configs() -> list[dict]:
    """The paper's 16 networks: filters {20, 32} x filter size {5, 3} x pool {3, 2} x extra conv {no, yes}.
    (05_network_sweep)"""
    from labkit.models.cifar import SWEEP_GRID  # the model module owns the grid

    return [dict(c) for c in SWEEP_GRID]


def network_name(cfg: dict) -> str:
    """Short readable name: f20_k5_p3, plus _x with the extra conv layer. (05_network_sweep)"""
    if set(cfg) != _KEYS:
        raise ValueError(f"cfg must have exactly the keys {sorted(_KEYS)}; got {sorted(cfg)}")
    return f"f{cfg['filters']}_k{cfg['filter_size']}_p{cfg['pool_size']}" + ("_x" if cfg["extra_conv"] else "")


def matlab_param_count(cfg: dict, input_shape=(32, 32, 3), classes: int = 10, include_mean_image=False) -> int:
    """Learnable parameters of one of the paper's networks by its own formulas (getMemoryFootprint).

    conv: (prod(FilterSize) * NumChannels + 1) * NumFilters; fully connected: (InputSize + 1) * OutputSize;
    pooling without padding: out = floor((in - pool) / 2) + 1. MATLAB also counts the input layer's
    zero-centring mean image (prod(InputSize) values); include_mean_image=True adds it. (05_network_sweep)
    """
    for name in ("filters", "filter_size", "pool_size"):
        check_int(cfg.get(name), name, minimum=1)
    h, w, c = input_shape
    f, k, p = cfg["filters"], cfg["filter_size"], cfg["pool_size"]
    params = (k * k * c + 1) * f
    h, w = (h - p) // 2 + 1, (w - p) // 2 + 1
    if cfg.get("extra_conv"):
        params += (k * k * f + 1) * f
    params += (k * k * f + 1) * 2 * f
    h, w = (h - p) // 2 + 1, (w - p) // 2 + 1
    if h < 1 or w < 1:
        raise ValueError(f"pool_size must leave a feature map after two pools of a {input_shape[:2]} input; "
                         f"got {p}")
    params += (h * w * 2 * f + 1) * classes
    return params + (input_shape[0] * input_shape[1] * c if include_mean_image else 0)


def config_table(configs=None):
    """The networks before training: params (Keras and the paper's formula), memory, MACs per image.

    Memory is labkit.models.cifar.memory_footprint (4 bytes per learnable parameter); MACs come from
    labkit.flops (conv and dense multiply-adds), which an embedded processor pays per frame. (05_network_sweep)
    """
    import warnings

    import pandas as pd

    from labkit import flops
    from labkit.models.cifar import memory_footprint, sweep_net

    rows = []
    for cfg in configs or network_configs():
        model = sweep_net(**cfg)
        with warnings.catch_warnings():  # the normalisation layer has no MAC rule; it has no MACs either
            warnings.simplefilter("ignore")
            macs = flops.count(model).macs
        rows.append({"name": network_name(cfg), **cfg, "params": model.count_params(),
                     "params_paper": matlab_param_count(cfg), "memory_kb": memory_footprint(model) / 1e3,
                     "mmacs": macs / 1e6})
    return pd.DataFrame(rows)


def with_pareto(df):
    """Successful rows sorted by memory, with a boolean `pareto` column (on the front or not). (05_network_sweep)"""
    ok = df[df.status == "ok"].sort_values(["memory_bytes", "name"]).reset_index(drop=True)
    front = set(pareto_front(zip(ok.memory_bytes, ok.accuracy)))
    ok["pareto"] = [i in front for i in range(len(ok))]
    return ok


def recommend(df, max_accuracy_drop: float = 0.02, memory_budget_bytes: int | None = None):
    """The network to ship: the smallest on the Pareto front within max_accuracy_drop of the best.

    memory_budget_bytes, if given, first removes networks that do not fit. Returns the chosen row. (05_network_sweep)
    """
    if not 0 <= max_accuracy_drop <= 1:
        raise ValueError(f"max_accuracy_drop must be in [0, 1] (a fraction, 0.02 = 2 points); "
                         f"got {max_accuracy_drop!r}")
    front = with_pareto(df)
    front = front[front.pareto]
    if memory_budget_bytes is not None:
        front = front[front.memory_bytes <= memory_budget_bytes]
        if front.empty:
            raise ValueError(f"no network fits memory_budget_bytes={memory_budget_bytes}; the smallest needs "
                             f"{int(with_pareto(df).memory_bytes.min())} bytes")
    good = front[front.accuracy >= front.accuracy.max() - max_accuracy_drop]
    return good.sort_values("memory_bytes").iloc[0]


def plot_pareto(df, ax=None, label_points=True):
    """Accuracy vs memory footprint (kB), the Pareto front drawn as a staircase (05_network_sweep)."""
    import matplotlib.pyplot as plt

    ok = df[df.status == "ok"].reset_index(drop=True)
    front = pareto_front(zip(ok.memory_bytes, ok.accuracy))
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    on = ok.index.isin(front)
    ax.scatter(ok.memory_kb[~on], 100 * ok.accuracy[~on], color="tab:gray", label="dominated")
    ax.scatter(ok.memory_kb[on], 100 * ok.accuracy[on], color="tab:red", zorder=3, label="Pareto front")
    f = ok.loc[front]
    ax.step(f.memory_kb, 100 * f.accuracy, where="post", color="tab:red", alpha=0.6)
    if label_points:
        for _, r in ok.iterrows():
            ax.annotate(r["name"], (r.memory_kb, 100 * r.accuracy), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("memory footprint (kB = 1,000 bytes; 4 bytes x learnable parameters)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy against memory footprint")
    ax.legend(loc="best")
    return ax


# ----------------------------------------------------------------------------- the trainer
_DATA_CACHE = {}


def dataset_choice(data_dir=None) -> tuple[str, str]:
    """(name, why): the data set load_dataset() will train on here, decided without loading it. (05_network_sweep)"""
    from labkit import data

    if data.cifar10_available(data_dir):
        return "cifar10", f"CIFAR-10, found in {data.find_cifar10(data_dir) or 'its archive'}"
    return "synthetic", ("labkit's offline synthetic set, because CIFAR-10 was not found (`labkit data fetch "
                         "cifar10` gets it); its accuracies are not CIFAR-10's")


@dataclass(frozen=True)
class NetworkTrainer:
    """Trains one of the paper's networks and returns its test accuracy (picklable, for worker processes).

    Data: labkit.data.load_dataset() (CIFAR-10 when present, else the offline synthetic set) with train_size /
    test_size images. Training: labkit.base.training.compile_sgdm, the paper's SGD with momentum + L2. dropout (a
    Dropout layer before the dense layer) and augment (random flips and +-4 px shifts, data.augment_batch) are
    the two cures for overfitting 05 tries; both are off in the paper. Each result holds the test accuracy and
    the accuracy on the training images, so the gap between them (overfitting) can be read. (05_network_sweep)
    """

    epochs: int = 1
    train_size: int | None = None
    test_size: int | None = None
    batch_size: int = 100
    lr: float = 0.01
    l2: float = 0.004
    seed: int = 0
    dropout: float = 0.0
    augment: bool = False
    warmup_epochs: int = 0

    def __post_init__(self):
        for name in ("epochs", "train_size", "test_size", "batch_size"):
            value = getattr(self, name)
            if value is None and name in ("train_size", "test_size"):
                continue
            check_int(value, name, minimum=1)
        check_number(self.lr, "lr", above=0)
        check_number(self.dropout, "dropout", minimum=0, below=1)
        check_int(self.warmup_epochs, "warmup_epochs", minimum=0, maximum=self.epochs - 1)
        if not isinstance(self.augment, bool):
            raise ValueError(f"augment must be True or False; got {self.augment!r}")

    @classmethod
    def for_profile(cls, name=None, **overrides):
        """Settings scaled to the profile: quick (seconds per network), workshop (~10-30 s), full (the paper's).

        workshop: 3,000 images for 8 epochs in batches of 32 (~750 steps) at LR 0.02, reached by a one-epoch
        linear warmup (Goyal et al. 2017) and dropped x0.1 at 3/4 of the epochs as the paper does. The paper's LR
        0.001 is tuned for 20,000 steps (40 epochs of 50,000 images); with 3 epochs of 2,000 images at LR 0.01 a
        quarter of the networks stayed near chance, LR 0.05 diverged, and without the warmup the networks with
        the extra conv layer stayed at chance. Fewer images seen more often also make the paper's overfitting
        visible. (05_network_sweep)
        """
        from labkit.models import recipes

        opts = recipes.sweep_options(name)
        settings = dict(lr=opts["lr"], l2=opts["l2"], batch_size=opts["batch_size"])
        settings.update(config.by_profile(
            quick=dict(epochs=1, train_size=1000, test_size=500, batch_size=25),
            workshop=dict(epochs=8, train_size=3000, test_size=1000, batch_size=32, lr=0.02, warmup_epochs=1),
            full=dict(epochs=opts["epochs"], train_size=opts["n_train"], test_size=opts["n_test"]),
            smoke=dict(epochs=1, train_size=300, test_size=200, batch_size=50), name=name))
        settings.update(overrides)
        if "warmup_epochs" not in overrides and settings.get("warmup_epochs", 0) >= settings["epochs"]:
            settings["warmup_epochs"] = 0  # a run shortened to fewer epochs than the warmup: no warmup
        return cls(**settings)

    def name(self, cfg: dict) -> str:
        return network_name(cfg)

    def settings(self) -> dict:
        """What makes two results comparable: these fields and the data set (stored in every record).
        (05_network_sweep)"""
        return {**asdict(self), "dataset": dataset_choice()[0]}

    def prepare(self):
        """Load, normalise and cache (in this process) the data. (05_network_sweep)"""
        key = (self.train_size, self.test_size)
        if key not in _DATA_CACHE:
            from labkit import data

            (x_train, y_train), (x_test, y_test), info = data.load_dataset(n_train=self.train_size,
                                                                            n_test=self.test_size)
            _DATA_CACHE[key] = (data.normalize(x_train), y_train, data.normalize(x_test), y_test, info.name)
        return _DATA_CACHE[key]

    def __call__(self, cfg: dict) -> dict:
        from labkit.base import training
        from labkit.models.cifar import memory_footprint, sweep_net

        x_train, y_train, x_test, y_test, dataset = self.prepare()
        config.set_seed(self.seed)
        model = sweep_net(**cfg, input_shape=tuple(x_train.shape[1:]), classes=int(y_train.max()) + 1,
                            dropout=self.dropout)
        steps = -(-len(x_train) // self.batch_size)
        # the paper drops the LR x0.1 at 3/4 of its epochs (30 of 40); runs of a few epochs never get far
        # enough for a drop to help, so they keep the LR constant
        drop_period = (3 * self.epochs) // 4 if self.epochs >= 8 else self.epochs
        training.compile_sgdm(model, lr=self.lr, momentum=0.9, l2=self.l2, steps_per_epoch=steps,
                              drop_period=drop_period, warmup_epochs=self.warmup_epochs)
        start = time.perf_counter()
        if self.augment:
            model.fit(self._augmented(x_train, y_train), epochs=self.epochs, verbose=0)
        else:
            model.fit(x_train, y_train, batch_size=self.batch_size, epochs=self.epochs, verbose=0, shuffle=True)
        train_time = time.perf_counter() - start
        _, accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
        _, train_accuracy = model.evaluate(x_train, y_train, batch_size=500, verbose=0)  # as stored, no dropout
        return {"accuracy": float(accuracy), "train_accuracy": float(train_accuracy), "params": model.count_params(),
                "memory_bytes": memory_footprint(model),
                "train_time_s": train_time, "dataset": dataset, "epochs": self.epochs,
                "train_images": int(len(x_train)), "test_images": int(len(x_test))}


    def _augmented(self, x, y):
        import tensorflow as tf

        from labkit import data

        ds = tf.data.Dataset.from_tensor_slices((x, y.astype("int32"))).shuffle(len(x), seed=self.seed)
        seeds = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True)
        ds = tf.data.Dataset.zip((ds.batch(self.batch_size), seeds))
        return ds.map(lambda xy, s: (data.augment_batch(xy[0], s), xy[1])).prefetch(2)


# ----------------------------------------------------------------------------- CLI
def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labkit sweep",
        description="Train the MATLAB white paper's 16 CIFAR-10 networks in parallel worker processes; each "
                    "result is saved as it lands, so an interrupted sweep resumes where it stopped.",
        epilog="Example: labkit sweep --workers 2 --out runs/sweep.jsonl --resume")
    parser.add_argument("--workers", dest="num_workers", type=int, default=1,
                        help="worker processes (default 1; run_sweep's num_workers)")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="allow more workers than this machine has cores (each gets a slice of a core)")
    parser.add_argument("--threads-per-worker", type=_positive_int, default=None,
                        help="compute threads per worker (default: cores // workers)")
    parser.add_argument("--out", type=Path, default=Path("runs/sweep.jsonl"),
                        help="results file, JSON lines (default runs/sweep.jsonl)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip configs already finished in --out")
    mode.add_argument("--overwrite", action="store_true", help="start --out over, discarding its results")
    parser.add_argument("--configs", default=None,
                        help="comma-separated config names to run (e.g. f20_k5_p3,f32_k3_p2_x); default all 16")
    parser.add_argument("--epochs", type=_positive_int, default=None, help="epochs per network (default: profile)")
    parser.add_argument("--train-size", type=_positive_int, default=None, help="training images (default: profile)")
    parser.add_argument("--test-size", type=_positive_int, default=None, help="test images (default: profile)")
    parser.add_argument("--list", action="store_true",
                        help="list the configs with parameters and memory; train nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _fail(message: str) -> int:
    print(f"labkit sweep: {message}", file=sys.stderr)
    return 2


def _pick_configs(args) -> list[dict]:
    """The configs --configs names (all 16 without it); ValueError naming --configs, or --workers when more
    workers than cores would train them (as `labkit scale --np`)."""
    configs = network_configs()
    if args.configs is not None:
        by_name = {network_name(c): c for c in configs}
        wanted = [n.strip() for n in args.configs.split(",") if n.strip()]
        if not wanted:
            raise ValueError(f"--configs names no config ({args.configs!r}); give names such as "
                             f"{', '.join(list(by_name)[:2])}, or leave --configs out for all 16")
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise ValueError(f"--configs has unknown names {', '.join(unknown)}; choose from {', '.join(by_name)}")
        configs = [by_name[n] for n in wanted]
    check_workers(args.num_workers, "--workers", oversubscribe=args.oversubscribe or args.list)
    if not args.list:
        check_memory(args.num_workers)
    return configs


def check_memory(num_workers: int, available: int | None = None) -> None:
    """ValueError (one line, naming --workers) when num_workers sweep workers of plans.WORKER_BYTES each cannot fit
    in this machine's available memory (machine.memory_available: LABKIT_MEMORY honoured), as `labkit scale`
    refuses a batch that cannot fit. (05_network_sweep)"""
    from labkit.base import machine
    from labkit.sweep.plans import WORKER_BYTES

    available = machine.memory_available() if available is None else available
    need = num_workers * WORKER_BYTES
    if need > available:
        fits = available // WORKER_BYTES
        advice = (f"use --workers {fits} or fewer" if fits else
                  "use a machine with more memory (or a larger LABKIT_MEMORY where it is set too low)")
        raise ValueError(f"--workers {num_workers} cannot fit in memory: {num_workers} x "
                         f"{WORKER_BYTES / 2**20:.0f} MiB per worker process = {need / 2**30:.2f} GiB > "
                         f"{available / 2**30:.2f} GiB available; {advice}")


def cli_main(argv: list[str]) -> int:
    """`labkit sweep [--workers K] [--out FILE] [--resume]` (05_network_sweep)."""
    args = build_parser().parse_args(argv)
    try:
        configs = _pick_configs(args)
        if not args.list:
            config.check_data_dir()  # a LABKIT_DATA that is a file is named, not taken for "no CIFAR-10"
    except ValueError as err:
        return _fail(str(err))
    if args.list:
        table = config_table(configs)
        print(f"{'config':<14} {'params':>8} {'memory (kB)':>12} {'M MACs/image':>13}")
        for r in table.itertuples():
            print(f"{r.name:<14} {r.params:>8} {r.memory_kb:>12.1f} {r.mmacs:>13.1f}")
        return 0
    try:
        sweep.check_writable(args.out)
        existing = [] if args.overwrite else sweep.load_results(args.out)  # --overwrite never reads what it discards
    except ValueError as err:
        return _fail(f"--out: {str(err).removeprefix('out: ')}")
    if existing and not (args.resume or args.overwrite):
        return _fail(f"{args.out} already holds results; pass --resume to skip finished configs or --overwrite "
                     "to start over")
    overrides = {k: v for k, v in (("epochs", args.epochs), ("train_size", args.train_size),
                                   ("test_size", args.test_size)) if v is not None}
    trainer = NetworkTrainer.for_profile(**overrides)
    if args.resume and existing:
        why = sweep.settings_mismatch(existing, trainer.settings(), args.out)
        if why:
            return _fail(f"--resume: {why}; pass the settings it was made with, --overwrite, or another --out")
    print(config.describe())
    print("data set:", dataset_choice()[1])
    print(f"{len(configs)} networks, {args.num_workers} workers, {trainer}", flush=True)
    try:
        run = sweep.run_sweep(configs, trainer, args.out, num_workers=args.num_workers,
                              threads_per_worker=args.threads_per_worker, resume=not args.overwrite,
                              progress=not args.no_progress)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM treated as it (workerpool.Interrupted names it)
        signum = getattr(stop, "signum", signal.SIGINT)
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        kept = sum(r.get("status") == "ok" for r in sweep.load_results(args.out))
        print(f"labkit sweep: {how}; {kept} finished results kept in {args.out} (--resume continues)",
              file=sys.stderr)
        return 128 + signum
    except sweep.ResultsNotSaved as err:  # the results it trained were printed as JSON lines first
        print(f"labkit sweep: {err}", file=sys.stderr)
        return 1
    _print_results(run)
    return 1 if run.failed else 0


def _print_results(run) -> None:
    ok = [r for r in run.records if r["status"] == "ok"]
    front = {ok[i]["key"] for i in pareto_front([(r["memory_bytes"], r["accuracy"]) for r in ok])}
    print(f"{'config':<14} {'memory (kB)':>12} {'accuracy':>9} {'train (s)':>10}  pareto")
    for r in sorted(run.records, key=lambda r: (r["memory_bytes"] is None, r["memory_bytes"] or 0)):
        if r["status"] != "ok":
            print(f"{r['name']:<14} FAILED: {r['error']}")
            continue
        print(f"{r['name']:<14} {r['memory_bytes'] / 1e3:>12.1f} {r['accuracy']:>9.3f} {r['train_time_s']:>10.1f}"
              f"  {'*' if r['key'] in front else ''}")
    print(f"trained {run.ran}, skipped {run.skipped} finished, failed {len(run.failed)}; "
          f"sweep {run.wall_s:.1f} s (+{run.startup_s:.1f} s worker start-up); results in {run.out}")
