"""One run's settings, in one place: their defaults, checks, options and the workers' command line (04_horovod_scaling).

`RunSettings` is what `scaling.run`, `scaling.run_paired` and `labkit scale` share, and what hvd_train's own
options default to. A new setting is one line here: its default, its check, the workers' option, whether
`labkit scale` offers it, its help. `add_arguments` writes both parsers' options from these fields and
`from_args` reads them back, so a flag is spelled once; where a parser departs from the field on purpose
(hvd_train's --threads default, `labkit scale`'s --timeout) the field's `differs` says how and why.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from collections.abc import Callable

from labkit.base.checks import check_choice, check_int, check_ints, check_number
from labkit.scale.hosts import LAUNCHERS  # noqa: F401  (RunSettings.launcher's choices; also reachable here)

DEFAULT_MODEL = "small_cnn"
SCALINGS = ("weak", "strong")
DATA = ("synthetic", "random", "auto", "cifar10")
DEVICES = ("cpu", "gpu")  # every worker on the CPU, or one GPU each (labkit.scale.gpu.place_rank)
CLI_TIMEOUT = 600  # `labkit scale` waits longer per launch than a notebook's run (RunSettings.timeout)


def _setting(default, check, worker: str | None = None, *, scale: str | None = None, help: str | None = None,
             type=None, choices=None, differs: dict | None = None):
    """A RunSettings field: its default, its check (value, name) -> value, the hvd_train option it becomes
    (worker; None: a setting of the launch, not of the workers; a True/False setting is a switch, given when
    it leaves its default), `labkit scale`'s option (scale; None: not offered), its help, its argparse type and
    choices (where the default does not say them), and differs: {"scale" | "worker": {argparse keyword: value,
    ..., "why": the reason}} where one parser departs from the field on purpose."""
    return dataclasses.field(default=default, metadata={"check": check, "worker": worker, "scale": scale,
                                                        "help": help, "type": type, "choices": choices,
                                                        "differs": differs or {}})


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


def _folder(value, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{name} must be a folder path; got {value!r}")
    return str(value)


def _model(value, name: str) -> str:
    return check_model(value, name)


def _args(value, name: str) -> tuple:
    return tuple(map(str, [value] if isinstance(value, str) else value))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings of one `labkit scale` run; `check(nps)` checks them, `argv(n)` is the workers' command line."""
    model: str = _setting(DEFAULT_MODEL, _model, "--model", scale="--model",
                          help=f"{DEFAULT_MODEL} (default) or a labkit.models name")
    batch_size: int = _setting(64, _int(1), "--batch-size", scale="--batch-size",
                               help="images per step: per worker (weak scaling) or in total (strong)",
                               differs={"worker": {"help": "images per rank per step",
                                                   "why": "labkit scale splits a strong-scaling batch first"}})
    steps: int = _setting(20, _int(1), "--steps", scale="--steps", help="timed steps per repeat")
    repeats: int = _setting(3, _int(1), "--repeats", scale="--repeats",
                            help="timed repeats (images/s mean and spread)")
    warmup_steps: int = _setting(5, _int(0), "--warmup-steps", scale="--warmup-steps",
                                 help="untimed steps first (tracing, allocation)")
    scaling: str = _setting("weak", _choice(*SCALINGS), scale="--scaling", choices=SCALINGS,
                            help="weak: fixed work per worker (default); strong: fixed work per step, split")
    data: str = _setting("synthetic", _choice(*DATA), "--data", scale="--data", choices=DATA,
                         help="labkit.data's synthetic set (32 px, 10 classes), one fixed random batch at "
                              "--image-size (throughput only, as Horovod's synthetic benchmark), or "
                              "labkit.data.load_dataset (auto: CIFAR-10 if on disk)",
                         differs={"scale": {"choices": ("synthetic", "auto", "cifar10"),
                                            "help": "synthetic (default), auto (CIFAR-10 if on disk, else the "
                                                    "offline set) or cifar10",
                                            "why": "random is a throughput-only batch; labkit scale trains on "
                                                   "a data set (scaling.data_note)"}})
    num_examples: int | None = _setting(None, _optional(_int(1)), "--num-examples", type=int,
                                        help="size of the synthetic training set (default: "
                                             "settings.num_examples_for)")
    lr: float = _setting(0.01, _positive, "--lr", help="base learning rate (one worker)")
    scale_lr: bool = _setting(False, _bool, "--scale-lr", help="linear scaling rule: LR = lr x number of ranks")
    lr_warmup_steps: int = _setting(0, _int(0), "--lr-warmup-steps",
                                    help="ramp the scaled LR up over this many steps")
    threads: int = _setting(1, _int(1), "--threads", scale="--threads",
                            help="intra-op threads per worker (default %(default)s: each worker owns a fixed share "
                                 "of the machine, as each GPU or node does, so adding workers adds cores)",
                            differs={"worker": {"default": 0, "help": "intra-op threads per rank (0: cores / local "
                                                                      "ranks)",
                                                "why": "a worker started by hand shares its node's cores among "
                                                       "its local ranks; RunSettings.argv always passes "
                                                       "--threads"}})
    device: str | None = _setting(None, _optional(_choice(*DEVICES)), "--device", scale="--device", choices=DEVICES,
                                  help="every worker on the CPU, or one GPU each (default: GPUs where every host "
                                       "has one for each of its workers in every launch, else the CPU; never a mix)",
                                  differs={"worker": {"help": "every rank on the CPU, or one GPU per rank (default: "
                                                              "a GPU per rank where the node has one for each of "
                                                              "its ranks, else the CPU)",
                                                      "why": "None is decided per launch by labkit scale "
                                                             "(plans.run_device), per node by a worker "
                                                             "(gpu.place_rank)"}})
    sync: bool = _setting(True, _bool, "--no-sync",
                          help="control experiment: plain optimizer, no gradient allreduce (ranks drift apart)")
    seed: int = _setting(0, _int(0), "--seed", help="seed of the weights and the data order")
    checkpoint: str | None = _setting(None, _optional(_folder), "--checkpoint", scale="--checkpoint", type=str,
                                      help="folder where rank 0 keeps the run's checkpoint (weights, optimizer "
                                           "state, step and data position; one launch, synced): written every "
                                           "--checkpoint-every steps, when a worker gets SIGUSR1 or SIGTERM, and "
                                           "at the end")
    resume: bool = _setting(False, _bool, "--resume", scale="--resume",
                            help="continue the run in --checkpoint from its step: every worker gets rank 0's "
                                 "weights and optimizer state and skips the batches already trained")
    checkpoint_every: int = _setting(0, _int(0), "--checkpoint-every", scale="--checkpoint-every",
                                     help="with --checkpoint: write it every N steps too (0: on a signal and at "
                                          "the end only)")
    launcher: str = _setting("auto", _choice(*LAUNCHERS), scale="--launcher", choices=LAUNCHERS,
                             help="how the ranks start: auto (mpirun where Horovod has MPI and every rank runs "
                                  "here, else horovodrun --gloo), gloo, mpi or srun")
    hosts: str | list[str] | None = _setting(None, None, scale="--hosts", type=str,
                                             help="horovodrun -H hosts as name:slots, e.g. node1:1,node2:1 "
                                                  "(default: this machine, or the nodes of the Slurm allocation)")
    timeout: float = _setting(300, _positive, scale="--timeout", type=float,
                              help="seconds per launch before everything is killed (default %(default)g)",
                              differs={"scale": {"default": CLI_TIMEOUT,
                                                 "why": "a terminal waits longer per launch than a notebook"}})
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
        _check_checkpoint(out, nps, name)
        bad = [n for n in nps if out.scaling == "strong" and out.batch_size % n]
        if bad:
            raise ValueError(f"strong scaling splits {name('batch_size')}={out.batch_size} over np={bad[0]}: "
                             f"choose a batch size divisible by every np")
        return out


PARSERS = ("scale", "worker")  # `labkit scale` (scaling._parser) and hvd_train (hvd_train._parser)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def options(for_: str) -> list[tuple[dataclasses.Field, str, dict]]:
    """(field, flag, argparse keywords) of every RunSettings field the parser for_ ("scale" or "worker") offers:
    default, help, type and choices from the field, then its `differs` for that parser."""
    check_choice(for_, "for_", PARSERS)
    out = []
    for f in dataclasses.fields(RunSettings):
        meta = f.metadata
        flag = meta[for_]
        if flag is None:
            continue
        if isinstance(f.default, bool):  # a switch: given, the setting leaves its default
            kw = {"action": "store_true", "help": meta["help"]}
        else:
            kind = meta["type"] or (str if f.default is None else type(f.default))
            kw = {"type": kind, "default": f.default, "help": meta["help"]}
            if meta["choices"]:
                kw["choices"] = meta["choices"]
        kw.update({k: v for k, v in meta["differs"].get(for_, {}).items() if k != "why"})
        out.append((f, flag, {**kw, "dest": _dest(flag)}))
    return out


def add_arguments(parser, for_: str) -> None:
    """Add to parser the option of every RunSettings field the parser for_ ("scale" or "worker") offers."""
    for _, flag, kw in options(for_):
        parser.add_argument(flag, **kw)


def from_args(args, for_: str) -> dict:
    """{field name: value} of the RunSettings fields the parser for_ offers, read from its parsed args; a field
    whose option is missing from args is a ValueError, never its default."""
    out = {}
    for f, flag, kw in options(for_):
        if not hasattr(args, kw["dest"]):
            raise ValueError(f"RunSettings.{f.name}: the parsed options hold no {kw['dest']} ({flag}); "
                             f"add it with settings.add_arguments(parser, {for_!r})")
        value = getattr(args, kw["dest"])
        out[f.name] = (not f.default if value else f.default) if kw.get("action") == "store_true" else value
    return out


def num_examples_for(batch_size: int, ranks: int = 1) -> int:
    """The synthetic training set's default size: 1024 images and 16 batches at least, 4 batches per rank's shard."""
    return max(1024, 16 * batch_size, 4 * batch_size * ranks)


def check_nps(nps, *, flags: bool = False) -> list[int]:
    """Worker counts as a list (one int is a list of one); ValueError naming nps (or --np) otherwise."""
    return check_ints([nps] if isinstance(nps, int) and not isinstance(nps, bool) else nps,
                      "--np" if flags else "nps", minimum=1)


def _check_checkpoint(s: RunSettings, nps, name) -> None:
    """--resume and --checkpoint-every need --checkpoint; a checkpoint holds one synced launch."""
    for field, given in (("resume", s.resume), ("checkpoint_every", s.checkpoint_every)):
        if given and s.checkpoint is None:
            raise ValueError(f"{name(field)} needs {name('checkpoint')} (the folder of the run's checkpoint)")
    if s.checkpoint is None:
        return
    if len(nps) != 1:
        raise ValueError(f"{name('checkpoint')} keeps one run: give one worker count, not {list(nps)}")
    if s.resume and not s.sync:
        raise ValueError(f"sync must be True with {name('resume')}: without the exchange the workers' weights "
                         "drift apart and rank 0's checkpoint alone cannot restore them")


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
