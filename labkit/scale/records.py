"""The `labkit scale --json` document and each rank's `rank{R}.json`, written in code (04_horovod_scaling).

The contract (more keys are welcome; these are promised):

    labkit scale --np 1,2 [--model M] [--batch-size B] [--steps S] --json FILE

runs the ranks once per worker count and writes a ScaleDocument:

    {"runs": [{"np": 1, "images_per_sec": ..., "images_per_sec_std": ..., "efficiency": 1.0,
               "checksums": ["<rank 0>"]},
              {"np": 2, ..., "checksums": ["<rank 0>", "<rank 1>"]}], ...}

images_per_sec is the total over ranks (mean over the timed repeats, warm-up excluded), images_per_sec_std its
spread over them, efficiency the weak-scaling efficiency against the smallest np (1.0 there), and checksums
each rank's checksum of its final trained weights (equal: the ranks stayed in sync). scaling.to_json builds it.

Each rank of labkit.scale.hvd_train writes a RankRecord as `rank{R}.json` in --out; labkit.scale.launch reads
them back (adding wall_s) and scaling.summarize folds one launch's into a row. `problems(value, schema)` lists
where a value departs from one of these schemas: a missing key, a key the schema does not name, a wrong type.
"""
# no `from __future__ import annotations`: Python 3.11's TypedDict must see NotRequired as the class is made
import types
import typing
from typing import NotRequired, TypedDict


class CheckpointState(TypedDict):
    """--checkpoint: where this launch left the run (labkit.scale.checkpoint)."""
    step: int  # steps trained in all, this launch's and the resumed ones'
    total_steps: int  # the run's warm-up + steps x repeats
    resumed_from: int  # the checkpoint's step this launch started at (0: a new run)
    stopped: bool  # stopped early by SIGUSR1/SIGTERM, checkpointed there


class ScaleRun(TypedDict):
    """One worker count's row of the `labkit scale --json` document."""
    np: int
    images_per_sec: float  # all ranks together, mean over the timed repeats
    images_per_sec_std: float  # spread over the timed repeats
    efficiency: float  # speedup / (np / smallest np): 1.0 at the smallest np
    speedup: float
    checksums: list[str]  # each rank's checksum of its final trained weights, in rank order
    in_sync: bool  # every checksum equal
    batch_size: int  # per rank
    global_batch_size: int
    step_time_s: float  # median over ranks of each rank's median timed step
    final_loss: float
    threads: int  # intra-op threads per rank
    controller: NotRequired[str]  # "mpi" or "gloo": what the ranks ran
    tuning: NotRequired[dict[str, str]]  # the exchange's settings the ranks saw (hvd_train.TUNING_ENV)
    p10_efficiency: NotRequired[float]  # efficiency of the uncontended (10th percentile) steps
    cpu_efficiency: NotRequired[float]  # efficiency of the CPU time per image
    step_time_p10_s: NotRequired[float]
    cpu_step_time_s: NotRequired[float]


class ScaleDocument(TypedDict):
    """The `labkit scale --json` document: one ScaleRun per worker count, then the run's settings."""
    runs: list[ScaleRun]
    all_in_sync: bool
    model: NotRequired[str]
    scaling: NotRequired[str]
    steps: NotRequired[int]
    repeats: NotRequired[int]
    warmup_steps: NotRequired[int]
    data: NotRequired[str]
    launcher: NotRequired[str]  # as asked ("auto" included); the runs' controller says what ran
    hosts: NotRequired[str | list[str] | None]
    threads_per_worker: NotRequired[int]
    paired: NotRequired[bool]
    without_exchange: NotRequired[list[ScaleRun]]  # --paired: the same launches' exchange-free blocks
    checkpoint: NotRequired[CheckpointState]  # --checkpoint: where the run stands


class StepTiming(TypedDict):
    """The timing of one kind of step in a rank's record (hvd_train._timing)."""
    step_times_s: list[float]
    cpu_step_time_s: float
    cpu_step_times_s: list[float]
    thread_cpu_ms_per_step: dict[str, float]  # CPU ms per step by thread role; {} without /proc
    images_per_sec: float  # this rank's, mean over the timed repeats
    images_per_sec_std: float
    images_per_sec_repeats: list[float]
    step_time_s: float
    step_time_mean_s: float
    step_time_p10_s: float


class NoSyncTiming(StepTiming):
    """--paired: the exchange-free control's timing, each of its blocks' checksums and the last one."""
    checksums_after_block: list[str]
    checksum: str


class RankRecord(StepTiming):
    """One rank's `rank{R}.json`, as labkit.scale.hvd_train writes it."""
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    pid: int
    threads: int
    gpus_visible: int
    controller: str
    tuning: dict[str, str]
    model: str
    params: int
    data: str
    examples_total: int
    examples_this_rank: int
    batch_size: int
    global_batch_size: int
    steps: int
    repeats: int
    warmup_steps: int
    lr: float
    lr_final: float
    scale_lr: bool
    lr_warmup_steps: int
    sync: bool
    barrier: bool
    num_groups: int
    jit: bool
    paired: bool
    loss_local: list[float]
    loss_avg: list[float]
    final_loss: float
    final_loss_local: float
    checksum: str
    weight_sum: float
    grad_bytes: int
    grad_tensors: list[int]
    no_sync: NotRequired[NoSyncTiming]
    checkpoint: NotRequired[CheckpointState]


def _type_problem(value, hint, where: str) -> list[str]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if typing.is_typeddict(hint):
        return problems(value, hint, where)
    if origin in (typing.Union, types.UnionType):
        found = [_type_problem(value, a, where) for a in args]
        return [] if any(not f for f in found) else found[0]
    if hint is type(None):
        return [] if value is None else [f"{where}: expected null; got {value!r}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list; got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _type_problem(v, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object; got {type(value).__name__}"]
        return [p for k, v in value.items() for p in (_type_problem(k, args[0], f"{where} key")
                                                        + _type_problem(v, args[1], f"{where}[{k!r}]"))]
    # JSON has one number type: an int is a float's value too; a bool is neither
    kinds = {float: (int, float), int: (int,), str: (str,), bool: (bool,)}[hint]
    if isinstance(value, bool) is not (hint is bool) or not isinstance(value, kinds):
        return [f"{where}: expected {hint.__name__}; got {value!r}"]
    return []


def problems(value, schema, where: str = "") -> list[str]:
    """Where value departs from schema (a TypedDict of this module): missing keys, keys it does not name,
    values of the wrong type, one line each; [] when it conforms."""
    name = where or schema.__name__
    if not isinstance(value, dict):
        return [f"{name}: expected an object; got {type(value).__name__}"]
    hints = typing.get_type_hints(schema)
    out = [f"{name}: missing {k!r}" for k in sorted(schema.__required_keys__) if k not in value]
    out += [f"{name}: {k!r} is not in {schema.__name__}" for k in value if k not in hints]
    for k, v in value.items():
        if k in hints:
            out += _type_problem(v, hints[k], f"{name}.{k}")
    return out
