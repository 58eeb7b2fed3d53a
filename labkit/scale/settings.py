"""One run's settings, in one place: their defaults, their checks and the workers' command line (04_horovod_scaling).

`RunSettings` is what `scaling.run`, `scaling.run_paired` and `labkit scale` share, and what hvd_train's own
options default to. A new setting is one line here (and its flag in `labkit scale`, if it has one).
"""
from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from typing import Callable

from labkit.base.checks import check_int, check_ints, check_number

DEFAULT_MODEL = "small_cnn"
SCALINGS = ("weak", "strong")
DATA = ("synthetic", "random", "auto", "cifar10")
LAUNCHERS = ("auto", "gloo", "mpi", "srun")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings of one `labkit scale` run; `check(nps)` checks them, `argv(n)` is the workers' command line."""
    model: str = DEFAULT_MODEL   # small_cnn or a labkit.models name
    batch_size: int = 64         # images per step: per worker (weak scaling) or in total, split (strong)
    steps: int = 20              # timed steps per repeat
    repeats: int = 3             # timed repeats (images/s mean and spread)
    warmup_steps: int = 5        # untimed steps first (tracing, allocation)
    scaling: str = "weak"        # weak: fixed work per worker; strong: fixed work per step, split over them
    data: str = "synthetic"      # synthetic, random (one fixed batch), auto (CIFAR-10 if on disk) or cifar10
    num_examples: int | None = None  # training set size; None: num_examples_for(batch, workers)
    lr: float = 0.01             # base learning rate (one worker)
    scale_lr: bool = False       # linear scaling rule: LR x number of workers
    lr_warmup_steps: int = 0     # ramp the scaled LR up over this many steps
    threads: int = 1             # intra-op threads per worker: each owns a fixed share, as each GPU or node does
    sync: bool = True            # False: the control without the gradient allreduce (ranks drift apart)
    seed: int = 0
    launcher: str = "auto"       # auto (launch.choose_launcher), gloo, mpi or srun
    hosts: str | list[str] | None = None  # horovodrun -H entries ("node1:1,node2:1" or a list); None: here or Slurm's
    timeout: float = 300         # seconds per launch before every process is killed
    progress: bool | Callable = True  # print rank 0's progress (a callable receives each line's dict)
    env_extra: dict | None = None  # extra environment for the ranks
    extra: tuple = ()            # more hvd_train arguments, e.g. ("--num-groups", "1")

    def per_rank_batch(self, n: int) -> int:
        """Images per rank per step in a launch of n workers."""
        return self.batch_size // n if self.scaling == "strong" else self.batch_size

    def argv(self, n: int = 1) -> list[str]:
        """hvd_train's command line for one launch of n workers (strong scaling splits batch_size over them)."""
        batch = self.per_rank_batch(n)
        a = ["--model", self.model, "--batch-size", batch, "--steps", self.steps, "--repeats", self.repeats,
             "--warmup-steps", self.warmup_steps, "--data", self.data,
             "--num-examples", self.num_examples or num_examples_for(batch, n), "--lr", self.lr,
             "--lr-warmup-steps", self.lr_warmup_steps, "--threads", self.threads, "--seed", self.seed]
        a += ["--scale-lr"] * bool(self.scale_lr) + ["--no-sync"] * (not self.sync)
        return [str(v) for v in (*a, *self.extra)]

    def check(self, nps=(1,), *, flags: bool = False) -> RunSettings:
        """These settings checked for launches of nps workers, as plain Python values; ValueError naming the
        first bad one, as a parameter (batch_size) or, with flags, as `labkit scale`'s option (--batch-size)."""
        def name(field):
            return ("--" + field.replace("_", "-")) if flags else field

        nps = check_nps(nps, flags=flags)
        out = dataclasses.replace(
            self, model=check_model(self.model, name("model")),
            batch_size=check_int(self.batch_size, name("batch_size"), minimum=1),
            steps=check_int(self.steps, name("steps"), minimum=1),
            repeats=check_int(self.repeats, name("repeats"), minimum=1),
            warmup_steps=check_int(self.warmup_steps, name("warmup_steps"), minimum=0),
            scaling=_check_choice(self.scaling, name("scaling"), SCALINGS),
            data=_check_choice(self.data, name("data"), DATA),
            num_examples=None if self.num_examples is None else check_int(self.num_examples, name("num_examples"),
                                                                          minimum=1),
            lr=check_number(self.lr, name("lr"), above=0),
            scale_lr=_check_bool(self.scale_lr, name("scale_lr")),
            lr_warmup_steps=check_int(self.lr_warmup_steps, name("lr_warmup_steps"), minimum=0),
            threads=check_int(self.threads, name("threads"), minimum=1),
            sync=_check_bool(self.sync, name("sync")), seed=check_int(self.seed, name("seed"), minimum=0),
            launcher=_check_choice(self.launcher, name("launcher"), LAUNCHERS),
            timeout=check_number(self.timeout, name("timeout"), above=0),
            env_extra=None if self.env_extra is None else dict(self.env_extra),
            extra=tuple(map(str, [self.extra] if isinstance(self.extra, str) else self.extra)))
        _check_hosts(out.hosts, nps, name("hosts"))
        bad = [n for n in nps if out.scaling == "strong" and out.batch_size % n]
        if bad:
            raise ValueError(f"strong scaling splits {name('batch_size')}={out.batch_size} over np={bad[0]}: "
                             f"choose a batch size divisible by every np")
        return out


def num_examples_for(batch_size: int, ranks: int = 1) -> int:
    """The synthetic training set's default size: 1024 images and 16 batches at least, 4 batches per rank's shard."""
    return max(1024, 16 * batch_size, 4 * batch_size * ranks)


def check_nps(nps, *, flags: bool = False) -> list[int]:
    """Worker counts as a list (one int is a list of one); ValueError naming nps (or --np) otherwise."""
    return check_ints([nps] if isinstance(nps, int) and not isinstance(nps, bool) else nps,
                      "--np" if flags else "nps", minimum=1)


def _check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be {', '.join(map(repr, choices[:-1]))} or {choices[-1]!r}; got {value!r}")
    return value


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def _check_hosts(hosts, nps, name: str) -> None:
    """Bad entries or too few slots for any launch fail here, before any launch (launch.take_slots's check)."""
    if hosts is None:
        return
    from labkit.scale.launch import take_slots
    try:
        for n in nps:
            take_slots(hosts, n)
    except ValueError as err:
        raise ValueError(str(err) if name == "hosts" else f"{name}: {err}") from None


@functools.lru_cache(maxsize=None)
def model_names() -> tuple:
    """The model names the ranks can build: labkit.models' names and small_cnn. Asked of a child Python
    unless TensorFlow is already loaded here, so that `labkit scale` never loads it itself."""
    if "tensorflow" in sys.modules:
        from labkit import models
        return tuple(sorted({*models.names(), DEFAULT_MODEL}))
    from labkit.scale.launch import child_env
    out = subprocess.run([sys.executable, "-c", "from labkit import models; print(*models.names())"],
                         capture_output=True, text=True, timeout=300, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"could not list labkit.models: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return tuple(sorted({*out.stdout.split(), DEFAULT_MODEL}))


def check_model(model, name: str = "model") -> str:
    """model, if the ranks can build it (small_cnn is checked for free); else ValueError naming `name`."""
    if model == DEFAULT_MODEL:
        return model
    names = model_names()
    if model not in names:
        raise ValueError(f"{name} must be one of {', '.join(names)}; got {model!r}")
    return model
