"""labkit.scale.settings: RunSettings' defaults are the worker's, its argv is what the worker parses back, and
every setting has its check, naming the parameter (or `labkit scale`'s option)."""
import dataclasses

import pytest

from helpers import fake_launch  # noqa: E402
from labkit.scale import hvd_train, scaling
from labkit.scale.settings import RunSettings

SHARED = ("model", "batch_size", "steps", "repeats", "warmup_steps", "data", "lr", "lr_warmup_steps", "seed")


def test_the_worker_defaults_to_the_settings_defaults():
    worker, d = hvd_train.parse_args([]), RunSettings()
    assert {k: getattr(worker, k) for k in SHARED} == {k: getattr(d, k) for k in SHARED}
    assert worker.scale_lr == d.scale_lr and worker.no_sync == (not d.sync)


@pytest.mark.parametrize("n", [1, 4])
def test_argv_is_what_the_worker_parses_back(n):
    s = RunSettings(model="convblock_net", batch_size=32, steps=7, repeats=2, warmup_steps=0, scaling="strong",
                    data="random", num_examples=512, lr=0.05, scale_lr=True, lr_warmup_steps=3, threads=2,
                    sync=False, seed=5, extra=("--num-groups", "1"))
    back = hvd_train.parse_args(s.argv(n))
    assert back.batch_size == 32 // n  # strong scaling: the total batch split over the workers
    assert (back.model, back.steps, back.repeats, back.warmup_steps, back.data, back.num_examples) == \
        ("convblock_net", 7, 2, 0, "random", 512)
    assert (back.lr, back.scale_lr, back.lr_warmup_steps, back.threads, back.no_sync, back.seed, back.num_groups) \
        == (0.05, True, 3, 2, True, 5, 1)


def test_weak_scaling_keeps_the_batch_and_every_shard_holds_a_few_batches():
    for n in (1, 2, 4, 16, 32):
        back = hvd_train.parse_args(RunSettings(batch_size=128).argv(n))
        assert back.batch_size == 128 and back.num_examples >= 1024 and back.num_examples // n >= 4 * 128
    assert scaling.train_args(batch_size=8) == RunSettings(batch_size=8).argv()


@pytest.mark.parametrize("field, bad", [
    ("batch_size", 0), ("batch_size", True), ("steps", 0), ("repeats", 2.5), ("warmup_steps", -1),
    ("scaling", "diagonal"), ("data", "imagenet"), ("num_examples", 0), ("lr", 0.0), ("lr", float("nan")),
    ("scale_lr", 1), ("lr_warmup_steps", -2), ("threads", 0), ("sync", "yes"), ("seed", -1),
    ("launcher", "ssh"), ("timeout", float("inf")), ("timeout", 0), ("hosts", "node1:x"), ("model", "no_such_net"),
])
def test_each_setting_is_checked_and_named(field, bad):
    s = dataclasses.replace(RunSettings(), **{field: bad})
    with pytest.raises(ValueError, match=field):
        s.check([1])
    with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
        s.check([1], flags=True)


def test_check_returns_plain_values_and_refuses_bad_worker_counts():
    np = pytest.importorskip("numpy")
    s = RunSettings(batch_size=np.int64(32), lr=np.float32(0.5), extra=["--jit"]).check([1, 2])
    assert type(s.batch_size) is int and type(s.lr) is float and s.extra == ("--jit",)
    for bad in ([0], [], [1, True], "2"):
        with pytest.raises(ValueError, match="nps"):
            RunSettings().check(bad)
    with pytest.raises(ValueError, match="divisible"):
        RunSettings(batch_size=64, scaling="strong").check([1, 3])
    with pytest.raises(ValueError, match="np=3"):
        RunSettings(hosts="a:1,b:1").check([3])


def test_run_takes_a_settings_object_and_keyword_overrides(monkeypatch):
    calls = []
    monkeypatch.setattr(scaling, "launch", fake_launch(calls))
    base = RunSettings(batch_size=8, steps=3, timeout=42, progress=False, launcher="gloo")
    scaling.run([1, 2], base, steps=5)
    assert [n for n, _, _ in calls] == [1, 2]
    for n, args, kw in calls:
        assert args[args.index("--steps") + 1] == "5" and args[args.index("--batch-size") + 1] == "8"
        assert kw["timeout"] == 42 and kw["threads"] == 1 and not kw["progress"]
    with pytest.raises(TypeError):
        scaling.run([1], no_such_setting=1)


def test_every_workers_setting_is_an_option_of_the_worker_and_of_nothing_else():
    options = {o for action in hvd_train._parser()._actions for o in action.option_strings}
    flags = {f.name: f.metadata["worker"] for f in dataclasses.fields(RunSettings)}
    assert {flag for flag in flags.values() if flag} <= options
    # the launch's own settings never reach the workers' command line
    launch_only = [name for name, flag in flags.items() if flag is None]
    assert set(launch_only) == {"scaling", "launcher", "hosts", "timeout", "progress", "env_extra", "extra"}
    argv = RunSettings(scale_lr=True, sync=False, device="cpu").argv(2)  # None (the default) names no flag
    assert {a for a in argv if a.startswith("--")} == {flag for flag in flags.values() if flag}
