"""One run's settings, in one place: their defaults, their checks and the workers' command line (04_horovod_scaling).

`RunSettings` is what `scaling.run`, `scaling.run_paired` and `labkit scale` share, and what hvd_train's own
options default to. A new setting is one line here (its default, its check, the workers' option), plus its flag
in `labkit scale` if it offers one, and the option in hvd_train if the workers take it.
"""
from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from collections.abc import Callable

from labkit.base.checks import check_choice, check_int, check_ints, check_number
from labkit.scale.hosts import LAUNCHERS  # noqa: F401  (RunSettings.launcher's choices; also reachable here)

DEFAULT_MODEL = "small_cnn"
SCALINGS = ("weak", "strong")
DATA = ("synthetic", "random", "auto", "cifar10")
DEVICES = ("cpu", "gpu")  # every worker on the CPU, or one GPU each (labkit.scale.gpu.place_rank)


def _setting(default, check, worker: str | None = None):
    """A RunSettings field: its default, its check (value, name) -> value, and the hvd_train option it becomes
    (None: a setting of the launch, not of the workers; a True/False setting is a switch, given when it leaves
    its default)."""
    return dataclasses.field(default=default, metadata={"check": check, "worker": worker})


def _int(minimum: int):
    return lambda value, name: check_int(value, name, minimum=minimum)


def _positive(value, name: str) -> float:
    return check_number(value, name, above=0)


def _choice(*choices):
    return lambda value, name: check_choice(value, name, choices)



def _bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def _optional(check):
    return lambda value, name: None if value is None else check(value, name)


def _model(value, name: str) -> str:
    return check_model(value, name)


def _args(value, name: str) -> tuple:
    return tuple(map(str, [value] if isinstance(value, str) else value))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings of one `labkit scale` run; `check(nps)` checks them, `argv(n)` is the workers' command line."""
    model: str = _setting(DEFAULT_MODEL, _model, "--model")  # small_cnn or a labkit.models name
    batch_size: int = _setting(64, _int(1), "--batch-size")  # images per step: per worker (weak) or in total (strong)
    steps: int = _setting(20, _int(1), "--steps")  # timed steps per repeat
    repeats: int = _setting(3, _int(1), "--repeats")  # timed repeats (images/s mean and spread)
    warmup_steps: int = _setting(5, _int(0), "--warmup-steps")  # untimed steps first (tracing, allocation)
    scaling: str = _setting("weak", _choice(*SCALINGS))  # weak: fixed work per worker; strong: per step, split
    data: str = _setting("synthetic", _choice(*DATA), "--data")  # random: one fixed batch; auto: CIFAR-10 if on disk
    num_examples: int | None = _setting(None, _optional(_int(1)), "--num-examples")  # None: num_examples_for
    lr: float = _setting(0.01, _positive, "--lr")  # base learning rate (one worker)
    scale_lr: bool = _setting(False, _bool, "--scale-lr")  # linear scaling rule: LR x number of workers
    lr_warmup_steps: int = _setting(0, _int(0), "--lr-warmup-steps")  # ramp the scaled LR up over this many steps
    threads: int = _setting(1, _int(1), "--threads")  # intra-op threads per worker: a fixed share, as a GPU or node
    device: str | None = _setting(None, _optional(_choice(*DEVICES)), "--device")  # None: chosen per run (scaling)
    sync: bool = _setting(True, _bool, "--no-sync")  # False: the control without the gradient allreduce
    seed: int = _setting(0, _int(0), "--seed")
    launcher: str = _setting("auto", _choice(*LAUNCHERS))  # auto: launch.choose_launcher's choice
    hosts: str | list[str] | None = _setting(None, None)  # horovodrun -H entries; None: here or Slurm's (check())
    timeout: float = _setting(300, _positive)  # seconds per launch before every process is killed
    progress: bool | Callable = _setting(True, None)  # print rank 0's progress (a callable gets each line's dict)
    env_extra: dict | None = _setting(None, _optional(lambda value, name: dict(value)))  # the ranks' extra environment
    extra: tuple = _setting((), _args)  # more hvd_train arguments, e.g. ("--num-groups", "1")

    def per_rank_batch(self, n: int) -> int:
        """Images per rank per step in a launch of n workers."""
        return self.batch_size // n if self.scaling == "strong" else self.batch_size

    def argv(self, n: int = 1) -> list[str]:
        """hvd_train's command line for one launch of n workers (strong scaling splits batch_size over them)."""
        out = []
        for f in dataclasses.fields(self):
            flag, value = f.metadata["worker"], getattr(self, f.name)
            if f.name == "batch_size":
                value = self.per_rank_batch(n)
            elif f.name == "num_examples":
                value = value or num_examples_for(self.per_rank_batch(n), n)
            if flag is None or value is None:  # None: the worker's own default
                continue
            out += ([flag] if value != f.default else []) if isinstance(f.default, bool) else [flag, str(value)]
        return out + [str(a) for a in self.extra]

    def check(self, nps=(1,), *, flags: bool = False) -> RunSettings:
        """These settings checked for launches of nps workers, as plain Python values; ValueError naming the
        first bad one, as a parameter (batch_size) or, with flags, as `labkit scale`'s option (--batch-size)."""
        def name(field):
            return ("--" + field.replace("_", "-")) if flags else field

        nps = check_nps(nps, flags=flags)
        out = dataclasses.replace(self, **{f.name: f.metadata["check"](getattr(self, f.name), name(f.name))
                                           for f in dataclasses.fields(self) if f.metadata["check"]})
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


def _check_hosts(hosts, nps, name: str) -> None:
    """Bad entries or too few slots for any launch fail here, before any launch (hosts.take_slots's check)."""
    if hosts is None:
        return
    from labkit.scale.hosts import take_slots
    try:
        for n in nps:
            take_slots(hosts, n)
    except ValueError as err:
        raise ValueError(str(err) if name == "hosts" else f"{name}: {err}") from None


@functools.cache
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
