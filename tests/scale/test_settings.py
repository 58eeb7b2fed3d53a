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
    for _, args, kw in calls:
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
    # None (the default) names no flag
    argv = RunSettings(scale_lr=True, sync=False, device="cpu", checkpoint="ck", resume=True).argv(2)
    assert {a for a in argv if a.startswith("--")} == {flag for flag in flags.values() if flag}


@pytest.mark.parametrize("for_, parser", [("scale", scaling._parser), ("worker", hvd_train._parser)])
def test_each_generated_option_keeps_its_fields_default_and_help_or_says_why_not(for_, parser):
    actions = {a.dest: a for a in parser()._actions}
    offered = [f for f in dataclasses.fields(RunSettings) if f.metadata[for_]]
    assert offered, for_
    for f in offered:
        action = actions[f.metadata[for_].lstrip("-").replace("-", "_")]
        differs = f.metadata["differs"].get(for_, {})
        assert action.option_strings == [f.metadata[for_]]
        assert action.help == differs.get("help", f.metadata["help"]) and action.help, f.name
        if not isinstance(f.default, bool):
            assert action.default == differs.get("default", f.default), f.name
        if differs:
            assert differs.get("why"), f"{f.name}: {for_} departs from the field without saying why"
    # the deliberate differences, as the issue names them
    assert actions["threads"].default == (0 if for_ == "worker" else 1)
    if for_ == "scale":
        assert actions["timeout"].default == scaling.CLI_TIMEOUT != RunSettings().timeout


def test_labkit_scale_fills_every_setting_it_offers_from_its_options():
    a = scaling._parser().parse_args(["--model", "convblock_net", "--batch-size", "16", "--steps", "3",
                                      "--repeats", "2", "--warmup-steps", "0", "--scaling", "strong", "--data", "auto",
                                      "--threads", "2", "--device", "cpu", "--launcher", "gloo",
                                      "--hosts", "a:1,b:1", "--timeout", "9", "--quiet"])
    s = scaling._settings(a)
    assert (s.model, s.batch_size, s.steps, s.repeats, s.warmup_steps, s.scaling, s.data, s.threads, s.device,
            s.launcher, s.hosts, s.timeout, s.progress) == \
        ("convblock_net", 16, 3, 2, 0, "strong", "auto", 2, "cpu", "gloo", "a:1,b:1", 9.0, False)
    d = scaling._settings(scaling._parser().parse_args([]))
    assert d == dataclasses.replace(RunSettings(), timeout=scaling.CLI_TIMEOUT)


def test_a_setting_whose_option_went_missing_fails_instead_of_taking_its_default():
    a = scaling._parser().parse_args(["--batch-size", "16"])
    del a.batch_size  # as a hand-written --batch that parsed into another name would leave it
    with pytest.raises(ValueError, match=r"RunSettings\.batch_size.*--batch-size"):
        scaling._settings(a)
    import argparse
    old = argparse.Namespace(nps=[1], batch=16, quiet=True)  # the old getattr/hasattr reading would run this
    with pytest.raises(ValueError, match="RunSettings.model"):
        scaling._settings(old)


def test_a_renamed_flag_in_the_fields_metadata_renames_it_in_both_parsers(monkeypatch):
    import types
    field = RunSettings.__dataclass_fields__["steps"]
    monkeypatch.setattr(field, "metadata", types.MappingProxyType({**field.metadata, "scale": "--timed-steps",
                                                                    "worker": "--timed-steps"}))
    assert scaling._settings(scaling._parser().parse_args(["--timed-steps", "4"])).steps == 4
    assert hvd_train._parser().parse_args(RunSettings(steps=4).argv()).timed_steps == 4
    with pytest.raises(AttributeError, match="steps"):  # the worker reads args.steps: loud, not a default
        hvd_train.parse_args(RunSettings(steps=4).argv())
    with pytest.raises(SystemExit):
        scaling._parser().parse_args(["--steps", "4"])
