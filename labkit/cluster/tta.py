"""Time to accuracy with real workers: 1..N Horovod ranks train to one target, with and without LR scaling and
warmup (08_training_on_the_cluster).

`time_to_accuracy(workers=(1, 2), target=0.4)` launches labkit.cluster.tta_train once per worker count and
setting (one worker once: scaling and warmup change nothing there) and returns one row per validation: the
training time rank 0 measured (validations left out), the wall time, the epoch and the validation accuracy over
every rank's shard of the test set. `summary` turns them into time to target and final accuracy per run, `plot`
draws accuracy against time.
"""
from __future__ import annotations

import dataclasses
import itertools

from labkit.base.checks import check_int, check_ints, check_number

MODULE = "labkit.cluster.tta_train"


@dataclasses.dataclass(frozen=True)
class TTASettings:
    """One time-to-accuracy experiment's sizes; for_profile() gives the active profile's."""
    target: float = 0.4  # validation accuracy to reach
    data: str = "synthetic"  # tta_train.DATA: the offline set, or auto (CIFAR-10 if on disk) / cifar10
    num_examples: int = 4000  # training examples, all workers together
    num_test: int = 1000
    batch_size: int = 32  # per worker: two workers average a batch twice as large
    epochs: int = 3
    lr: float = 0.01  # one worker's
    warmup_epochs: float = 1.0  # where warmup is on
    evals_per_epoch: int = 2
    threads: int = 1  # per worker: each worker adds its own share of the machine
    model: str = "small_cnn"
    seed: int = 0
    timeout: float = 600  # seconds per launch

    @classmethod
    def for_profile(cls, name: str | None = None) -> TTASettings:
        """The sizes of the active profile: seconds (quick), minutes on 2 cores (workshop), CIFAR-10 on a GPU
        node (full: the offline set where CIFAR-10 is not on disk)."""
        from labkit.base.config import by_profile
        return by_profile(
            quick=cls(target=0.15, num_examples=3000, num_test=500, epochs=2, timeout=300),
            workshop=cls(target=0.5, num_examples=10000, num_test=2000, epochs=6),
            full=cls(target=0.55, data="auto", num_examples=50000, num_test=10000, batch_size=64, epochs=15,
                     lr=0.02, timeout=1800),
            smoke=cls(target=0.15, num_examples=1000, num_test=200, epochs=1, timeout=300), name=name)

    def check(self) -> TTASettings:
        """ValueError naming the first setting out of range, in one line; else self."""
        from labkit.cluster.tta_train import DATA
        check_number(self.target, "target", above=0, below=1)
        if self.data not in DATA:
            raise ValueError(f"data must be one of {', '.join(DATA)}; got {self.data!r}")
        for name, least in (("num_examples", 1), ("num_test", 1), ("batch_size", 1), ("epochs", 1),
                            ("evals_per_epoch", 1), ("threads", 1), ("seed", 0)):
            check_int(getattr(self, name), name, minimum=least)
        check_number(self.lr, "lr", above=0)
        check_number(self.warmup_epochs, "warmup_epochs", minimum=0, maximum=self.epochs)
        check_number(self.timeout, "timeout", above=0)
        return self

    def argv(self, scale_lr: bool, warmup: bool) -> list[str]:
        """The workers' command line for one run."""
        args = ["--model", self.model, "--data", self.data, "--num-examples", self.num_examples,
                "--num-test", self.num_test, "--batch-size", self.batch_size, "--epochs", self.epochs,
                "--lr", self.lr, "--evals-per-epoch", self.evals_per_epoch, "--threads", self.threads,
                "--seed", self.seed]
        if scale_lr:
            args.append("--scale-lr")
        if warmup:
            args += ["--warmup-epochs", self.warmup_epochs]
        return [str(a) for a in args]


def _bools(value, name: str) -> tuple[bool, ...]:
    values = (value,) if isinstance(value, bool) else tuple(value) if isinstance(value, (tuple, list)) else None
    if not values or not all(isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must be True, False or a tuple of them; got {value!r}")
    return tuple(dict.fromkeys(values))


def runs(workers=(1, 2), scale_lr=(False, True), warmup=(False, True)) -> list[tuple[int, bool, bool]]:
    """The launches (workers, scale_lr, warmup) of one experiment: warmup only with scale_lr (it ramps up to the
    scaled LR), and one worker once (LR x 1 needs neither)."""
    workers = check_ints(workers, "workers", minimum=1)
    if list(workers) != sorted(set(workers)):
        raise ValueError(f"workers must be worker counts in increasing order, each once; got {workers!r}")
    settings = [(s, w) for s, w in itertools.product(_bools(scale_lr, "scale_lr"), _bools(warmup, "warmup"))
                if s or not w]
    if not settings:
        raise ValueError("warmup ramps up to the scaled LR: warmup=True needs scale_lr=True among its choices")
    out = []
    for n in workers:
        out += [(n, False, False)] if n == 1 else [(n, s, w) for s, w in settings]
    return out


def label(workers: int, scale_lr: bool, warmup: bool) -> str:
    """A run's name in the tables and the plot's legend: '2 workers, LR x2 + warmup'."""
    name = "1 worker" if workers == 1 else f"{workers} workers"
    if workers > 1 and scale_lr:
        name += f", LR x{workers}" + (" + warmup" if warmup else "")
    return name


def time_to_accuracy(workers=(1, 2), target=None, scale_lr=(False, True), warmup=(False, True), *,
                     settings: TTASettings | None = None, launcher="auto", progress=print):
    """One row per validation of every run (workers x settings); target=None: the settings' (the profile's).
    progress: a callable given one line per finished run, or None."""
    import pandas as pd

    from labkit.scale.launch import launch
    settings = (settings or TTASettings.for_profile())
    if target is not None:
        settings = dataclasses.replace(settings, target=target)
    settings.check()
    plan = runs(workers, scale_lr, warmup)  # every argument checked before the first launch
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be a callable taking one line, or None; got {progress!r}")
    rows = []
    for n, s, w in plan:
        ranks = launch(n, settings.argv(s, w), module=MODULE, launcher=launcher, timeout=settings.timeout,
                       progress=False, label=label(n, s, w))
        first = ranks[0]
        in_sync = len({r["checksum"] for r in ranks}) == 1
        for p in first["points"]:
            rows.append({"run": label(n, s, w), "workers": n, "scale_lr": s, "warmup": w,
                         "lr_peak": first["lr_peak"], "global_batch_size": first["global_batch_size"], **p,
                         "data": first["data"], "target": settings.target, "in_sync": in_sync,
                         "launch_s": first["wall_s"]})
        if progress:
            last = first["points"][-1]
            progress(f"{label(n, s, w)}: validation accuracy {last['val_acc']:.1%} after {last['epoch']:g} epochs, "
                     f"{last['train_s']:.1f} s of training")
    return pd.DataFrame(rows)


def summary(df):
    """Per run: time and epochs to the target (the first validation at or above it; NaN where never reached), the
    final accuracy and its difference from one worker's, in points."""
    import numpy as np
    import pandas as pd
    if df is None or len(df) == 0 or not {"run", "val_acc", "train_s", "target"} <= set(df.columns):
        raise ValueError("df must be time_to_accuracy's table (columns run, val_acc, train_s, target, ...)")
    rows = []
    for run, g in df.groupby("run", sort=False):
        hit = g[g.val_acc >= g.target.iloc[0]]
        last = g.iloc[-1]
        rows.append({"run": run, "workers": int(last.workers), "target": float(last.target),
                     "time_to_target_s": float(hit.train_s.iloc[0]) if len(hit) else np.nan,
                     "epochs_to_target": float(hit.epoch.iloc[0]) if len(hit) else np.nan,
                     "final_acc": float(last.val_acc), "training_s": float(last.train_s)})
    out = pd.DataFrame(rows)
    one = out[out.workers == 1]
    base = float(one.final_acc.iloc[0]) if len(one) else np.nan
    out["vs_one_worker_points"] = 100 * (out.final_acc - base)
    return out


def plot(df, ax=None, profile: str | None = None):
    """Validation accuracy against training time, one line per run, the target dashed; the data set and the
    profile in the title."""
    import matplotlib.pyplot as plt

    from labkit.base import config
    if df is None or len(df) == 0:
        raise ValueError("df must be time_to_accuracy's table with at least one row")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    styles = {(False, False): "-", (True, False): "--", (True, True): ":"}
    for run, g in df.groupby("run", sort=False):
        key = (bool(g.scale_lr.iloc[0]), bool(g.warmup.iloc[0]))
        ax.plot(g.train_s, 100 * g.val_acc, styles.get(key, "-"), marker="o", ms=3,
                color=f"C{int(g.workers.iloc[0]) - 1}", label=run)
    ax.axhline(100 * df.target.iloc[0], color="0.5", lw=1, ls="--")
    ax.text(ax.get_xlim()[1], 100 * df.target.iloc[0], " target", va="center", fontsize=8, color="0.4")
    ax.set_xlabel("training time on rank 0 (s, validations left out)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"Time to accuracy: {df.data.iloc[0]} data, {profile or config.profile()} profile", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return ax
