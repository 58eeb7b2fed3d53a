"""labkit.base.plans and the lessons' plans modules: launches fitted to the cores, memory and load, checked at
1-128 cores and 2-256 GiB."""
import math

import pytest

from labkit import cli
from labkit.base import plans
from labkit.base.plans import Machine
from labkit.plan import PLANNERS
from labkit.scale import plans as scale_plans
from labkit.sweep import plans as sweep_plans

GiB = 2**30
CORES = (1, 2, 8, 64, 128)
MEMORY = (2 * GiB, 8 * GiB, 256 * GiB)
SHAPES = [Machine(c, m) for c in CORES for m in MEMORY]


def _scaling(plan):
    return next(e for e in plan if e.notebook.startswith("04") and "per worker count" in e.name)


@pytest.mark.parametrize("m", SHAPES, ids=lambda m: f"{m.cores}cores-{m.memory // GiB}GiB")
def test_workshop_makes_a_handful_of_launches_within_memory(m):
    plan = plans.experiments(PLANNERS, "workshop", m)
    scaling = _scaling(plan)
    assert scaling.launches <= 6 and max(scaling.workers) <= 8, scaling
    assert 2 in scaling.workers, "two workers at least: the exchange is the lesson"
    for e in plan:
        assert e.peak_bytes <= m.memory, e
        assert e.processes <= max(2, m.cores), e  # never more processes than cores, but for the pair of workers


@pytest.mark.parametrize("m", SHAPES, ids=lambda m: f"{m.cores}cores-{m.memory // GiB}GiB")
@pytest.mark.parametrize("profile", plans.PROFILES)
def test_every_profile_fits_memory_and_counts_are_log_spaced(m, profile):
    plan = plans.experiments(PLANNERS, profile, m)
    assert plans.fits(plan, m)
    for e in plan:
        counts = list(e.workers)
        assert counts == sorted(set(counts)) and counts[0] in (1, 2), e
        assert all(n & (n - 1) == 0 for n in counts[:-1]), f"not log-spaced (powers of two, then the top): {counts}"
        if profile == "full":  # every doubling up to the node
            assert all(b <= 2 * a for a, b in zip(counts, counts[1:])), f"a doubling is missing: {counts}"
        assert e.minutes > 0


@pytest.mark.parametrize("memory", MEMORY)
def test_one_core_plans(memory):
    m = Machine(1, memory)
    for profile in plans.PROFILES:
        assert sweep_plans.sweep_workers(profile, m) == [1], "one core: the parallel sweep runs one worker"
        assert scale_plans.scaling_workers(profile, m) == [1, 2], "04's lesson: two workers sharing the core"
        assert all(e.processes <= 2 for e in plans.experiments(PLANNERS, profile, m))


def test_full_profile_scales_to_the_node():
    big = Machine(128, 256 * GiB)
    assert scale_plans.scaling_workers("full", big) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert sweep_plans.sweep_workers("full", big)[-1] == 129  # one past the cores: the curve flattens
    # memory caps it: a convblock_net worker at batch 128 is 400 MiB + 2 x 128 x 2.81 MB = 1087 MiB, and
    # (8192 - 600) MiB hold 6 of them
    assert scale_plans.scaling_workers("full", Machine(128, 8 * GiB))[-1] == 6


def test_full_profile_leaves_the_loaded_cores_to_others():
    assert scale_plans.scaling_workers("full", Machine(64, 256 * GiB, load=40.2)) == [1, 2, 4, 8, 16, 24]
    assert scale_plans.scaling_workers("workshop", Machine(64, 256 * GiB, load=40.2)) == [1, 2, 8]


def test_workshop_by_hand():
    assert scale_plans.scaling_workers("workshop", Machine(2, 2 * GiB)) == [1, 2]
    assert scale_plans.scaling_workers("workshop", Machine(4, 8 * GiB)) == [1, 2, 4]
    assert scale_plans.scaling_workers("workshop", Machine(64, 16 * GiB)) == [1, 2, 8]
    assert scale_plans.scaling_workers("workshop", Machine(64, 2 * GiB)) == [1, 2, 3]  # (2048 - 600) // 400 MiB
    assert plans.log_spaced(6) == [1, 2, 4, 6] and plans.log_spaced(1) == [1]


@pytest.mark.parametrize("bad, name", [(Machine(0, GiB), "cores"), (Machine(2, 0), "memory"),
                                       (Machine(2, GiB, -1.0), "load")])
def test_bad_machine_is_one_line_naming_it(bad, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        plans.experiments(PLANNERS, "workshop", bad)
    with pytest.raises(ValueError, match="^profile must be"):
        plans.experiments(PLANNERS, "huge", Machine(2, GiB))


def test_labkit_plan_on_a_64_core_node(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_CORES", "64")
    monkeypatch.setenv("LABKIT_MEMORY", "16G")
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "64 usable cores, 16.0 GiB free" in out
    row = next(line for line in out.splitlines() if line.startswith("04_horovod_scaling") and "per worker" in line)
    assert row.split()[-5:-2] == ["1,2,8", "64", "6"], row
    assert "host load not counted" in out and "load average" not in out  # LABKIT_CORES names the free cores
    assert cli.main(["plan", "--profile", "full"]) == 0
    full = capsys.readouterr().out
    row = next(line for line in full.splitlines() if line.startswith("04_horovod_scaling") and "per worker" in line)
    assert row.split()[-5:-3] == ["1,2,4,8,14", "128"], row  # (16384 - 600) MiB // 1087 MiB workers at batch 128


def test_decompose_plans_by_default(monkeypatch):
    """localscale.decompose launches the plan's worker counts (1, 2, 8 on 64 cores), not 1..64."""
    from labkit.scale import localscale, probe, scaling
    seen = []
    monkeypatch.setenv("LABKIT_CORES", "64")
    monkeypatch.setenv("LABKIT_MEMORY", "16G")
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")

    class Stop(Exception):
        pass

    def fake_run_paired(workers, **kw):
        seen.extend(workers)
        if len(seen) == 3:
            raise Stop
        return None, None

    monkeypatch.setattr(probe, "gemm_probe", lambda n, *a, **k: {"gflops_total": 1.0})
    monkeypatch.setattr(scaling, "run_paired", fake_run_paired)
    with pytest.raises(Stop):
        localscale.decompose(progress=False)
    assert seen == [1, 2, 8]


def test_minutes_grow_with_the_load_and_with_workers_sharing_a_core():
    quiet, busy = Machine(2, 8 * GiB), Machine(2, 8 * GiB, load=20.0)
    for q, b in zip(*(plans.experiments(PLANNERS, "workshop", m) for m in (quiet, busy))):
        assert b.minutes > 5 * q.minutes, (q, b)  # 20 other programs on 2 cores: each launch gets ~1/11 of them
    one, two = (plans.experiments(PLANNERS, "workshop", m) for m in (Machine(1, 8 * GiB), quiet))
    sync = [e for e in one + two if e.name.startswith("sync run")]
    # two workers on one core take twice the time of two workers on two (the start-up included)
    assert sync[0].minutes == pytest.approx(2 * sync[1].minutes)


def test_labkit_plan_says_the_host_load_it_read(monkeypatch, capsys):
    monkeypatch.delenv("LABKIT_CORES", raising=False)
    assert cli.main(["plan"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "load average" in head and "not counted" not in head, head


@pytest.mark.parametrize("profile, m, batch", [
    ("workshop", Machine(2, 2 * GiB), 64), ("quick", Machine(1, 2 * GiB), 64), ("workshop", Machine(64, 16 * GiB), 64),
    ("full", Machine(128, 256 * GiB), 128), ("full", Machine(2, 24 * GiB), 128),
    # 1 core, 2 GiB, two convblock_net workers: 600 + 2 x (400 + 2 x b x 2.68) MiB <= 2048 MiB holds b <= 60
    ("full", Machine(1, 2 * GiB), 32),
    ("full", Machine(2, GiB), 16)])  # nothing fits: the batch stops at 16, and the plan warns
def test_batch_is_the_profiles_halved_only_where_memory_is_short(profile, m, batch):
    assert scale_plans.batch_size(profile, m) == batch
    assert all(e.batch in (0, batch) for e in plans.experiments(PLANNERS, profile, m) if e.notebook.startswith("04"))


def test_batch_at_smoke_scale(monkeypatch):
    monkeypatch.setenv("LABKIT_SMOKE", "1")
    assert scale_plans.batch_size("full", Machine(2, 24 * GiB)) == 16


def test_a_worker_holds_twice_the_activations_labkit_flops_counts():
    """IMAGE_BYTES (kept so that `labkit plan` does not load TensorFlow) against labkit.flops' count of each model."""
    from labkit.scale import scaling
    for model, per_image in scale_plans.IMAGE_BYTES.items():
        assert scaling.training_bytes(model) == (per_image, scale_plans.STATE_BYTES[model]), model
    assert sorted(scale_plans.STATE_BYTES) == sorted(scale_plans.IMAGE_BYTES)
    # 400 MiB + 2 x 128 images x 2,814,504 bytes (labkit.flops' count)
    assert scale_plans.worker_bytes("convblock_net", 128) == 1_139_943_424


def test_a_run_that_would_not_fit_is_said_before_it_starts():
    # 1 core, 1 GiB: 05's one sweep worker (650 MiB) beside the kernel (600 MiB) needs 1.2 GiB
    line = plans.memory_line(sweep_plans.experiments, "workshop", Machine(1, GiB))
    assert "1.0 GiB of memory free" in line and "estimated to need 1.2 GiB (" in line, line
    assert plans.memory_line(sweep_plans.experiments, "workshop", Machine(2, 2 * GiB)) == ""  # Binder's box holds it
    # from a running kernel outside a cgroup the free memory has the kernel out already: 650 MiB fit in 1 GiB
    assert plans.memory_line(sweep_plans.experiments, "workshop", Machine(1, GiB), running=plans.KERNEL_BYTES) == ""
    assert plans.memory_line(lambda profile, m: [], "workshop", Machine(1, 1)) == ""  # launches nothing


def test_say_if_short_counts_the_kernel_in_labkit_memory(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_CORES", "1")
    monkeypatch.setenv("LABKIT_MEMORY", "1G")  # the whole machine's memory, the kernel's included
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    sweep_plans.say_if_short()
    assert "estimated to need 1.2 GiB (" in capsys.readouterr().out
    monkeypatch.setenv("LABKIT_MEMORY", "4G")
    sweep_plans.say_if_short()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ranks, gpus, device", [
    (2, 0, None),                                    # no GPU: nothing to choose, no flag
    (2, 4, "gpu"), (4, 4, "gpu"), (1, 4, "gpu"), (1, 1, "gpu"), (2, 8, "gpu"),  # a GPU for each of the ranks
    (8, 4, "cpu"), (2, 1, "cpu")])                   # more ranks on a node than GPUs: all of them on the CPU
def test_run_device(ranks, gpus, device):
    assert plans.run_device(ranks, gpus) == device


def test_labkit_plan_names_the_gpus_and_where_the_workers_run(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_GPUS", "4")
    for profile in ("full", "workshop"):
        assert cli.main(["plan", "--profile", profile]) == 0
        head = capsys.readouterr().out.splitlines()[0]
        assert "4 NVIDIA GPUs: the notebooks' workers run on the CPU (`labkit scale` gives each worker a GPU, up to " \
               "4 per node)" in head, head


def test_say_if_short_counts_the_kernel_once(monkeypatch, capsys):
    """From the kernel: where the free memory is the whole machine's (a cgroup's limit with room around it) the
    running kernel is in it; where the system has less left than that (a busy node), the kernel is already out."""
    from labkit.base import machine
    monkeypatch.setenv("LABKIT_CORES", "1")
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    monkeypatch.delenv("LABKIT_MEMORY", raising=False)
    monkeypatch.setattr(machine, "memory", lambda: GiB)  # a 1 GiB box on an idle host: 1 GiB free, kernel in it
    monkeypatch.setattr(machine, "memory_available", lambda: GiB)
    sweep_plans.say_if_short()
    assert "estimated to need 1.2 GiB (" in capsys.readouterr().out
    monkeypatch.setattr(machine, "memory", lambda: 8 * GiB)  # 8 GiB allowed, 1 GiB left after the kernel loaded
    sweep_plans.say_if_short()
    assert capsys.readouterr().out == ""  # 650 MiB more fit in the 1 GiB left


def test_no_load_average_is_unknown_said_in_one_line_and_never_raises(monkeypatch, capsys):
    """A system without a load average (timing.load_average returns NaN there): `labkit plan` says so, exits 0,
    and every notebook's first-cell call and plan counts no load."""
    import json

    from labkit.base import timing
    from labkit.conv import plans as conv_plans
    from labkit.deepdive import plans as deep_plans
    monkeypatch.setattr(timing, "load_average", lambda: float("nan"))
    for var in ("LABKIT_CORES", "LABKIT_MEMORY", "LABKIT_GPUS"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "load unknown (this system keeps no load average; none counted)" in head, head
    assert "nan" not in out.lower()
    assert cli.main(["plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine"]["load"] is None  # strict JSON: no NaN token
    for lesson in (conv_plans, scale_plans, sweep_plans, deep_plans):
        lesson.say_if_short()  # the first cells of 02, 04, 05, 07
    unknown, idle = Machine(8, 64 * 2**30, load=math.nan), Machine(8, 64 * 2**30)
    for profile in plans.PROFILES:
        assert plans.experiments(PLANNERS, profile, unknown) == plans.experiments(PLANNERS, profile, idle)


def test_an_odd_machine_setting_is_one_line_from_labkit_plan(monkeypatch, capsys):
    for var, bad in (("LABKIT_CORES", "100000"), ("LABKIT_MEMORY", "512k"), ("LABKIT_GPUS", "lots")):
        monkeypatch.setenv(var, bad)
        assert cli.main(["plan"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"labkit plan: {var} must be") and err.count("\n") == 1, err
        monkeypatch.delenv(var)


# --- the pace: a notebook's first experiment timed against its plan, the later ones fitted to it ---------------
def test_the_first_experiments_plan_is_for_quiet_cores_of_the_same_number():
    # 1 core: (10 s start + 4 s of work) for one worker, twice that for two sharing the core, a 2 s probe each
    assert scale_plans.pace(46.0, [1, 2], "workshop", Machine(1, 2 * GiB)).planned_s == pytest.approx(46.0)
    # the load counted once at the start does not move the estimate a pace is measured against
    loaded = scale_plans.pace(46.0, [2], "workshop", Machine(1, 2 * GiB, load=4.0))  # decompose adds 1 worker
    assert loaded.planned_s == pytest.approx(46.0) and loaded.ratio == pytest.approx(1.0)
    # 2 quiet cores: the two workers have a core each, (2 + 14) s per count
    assert scale_plans.pace(25.0, [1, 2], "workshop", Machine(2, 4 * GiB)).planned_s == pytest.approx(32.0)


def test_the_reference_machine_cuts_nothing_and_prints_nothing():
    pace = scale_plans.pace(25.2, [1, 2], "workshop", Machine(2, 4 * GiB))  # its committed run: 25.2 s
    assert pace.ratio < 1 and pace.share == 1.0
    assert pace.fit(2, "{n} of {full} rounds", minimum=0) == (2, "")
    assert pace.fit(6, "{n} of {full} epochs", minimum=2) == (6, "")
    assert scale_plans.AS_PLANNED.fit(2, "{n} of {full} rounds", minimum=0) == (2, "")  # nothing measured


def test_a_shared_core_cuts_the_later_experiments_and_says_so():
    # a 1-CPU box shared with a busy process: the first experiment took 300 s against the plan's 46 s
    pace = scale_plans.pace(300.0, [1, 2], "workshop", Machine(1, 1536 * 2**20, load=4.0))
    assert pace.ratio == pytest.approx(300 / 46)
    assert pace.share == pytest.approx(plans.ALLOWANCE * 46 / 300)  # the later runs take ~ALLOWANCE x their plan
    rounds, why = pace.fit(2, "the comparison runs {n} of its {full} rounds here", minimum=0)
    assert rounds == 0  # 2 x 0.23, rounded down
    assert why == ("The first launches ran 6.5x slower than planned (a shared or slow core): the comparison runs "
                   "0 of its 2 rounds here, to keep 04 within its slot.")
    epochs, why = pace.fit(6, "the curves train {n} of their {full} epochs", minimum=2)
    assert epochs == 2 and "train 2 of their 6 epochs" in why  # 6 x 0.23 = 1.4: the minimum
    assert pace.fit(1, "{n} of {full} epochs", minimum=2) == (1, "")  # the minimum never grows a size


@pytest.mark.parametrize("ratio, rounds, epochs", [(1.0, 2, 6), (1.5, 2, 6), (2.0, 1, 4), (3.0, 1, 3), (4.0, 0, 2),
                                                   (6.0, 0, 2), (40.0, 0, 2)])
def test_sizes_shrink_as_the_first_experiment_slows(ratio, rounds, epochs):
    pace = plans.Pace(ratio * 10.0, 10.0, "04")
    assert pace.fit(2, "{n}", minimum=0)[0] == rounds
    assert pace.fit(6, "{n}", minimum=2)[0] == epochs


@pytest.mark.parametrize("call, name", [(lambda: plans.Pace(-1.0, 10.0), "measured_s"),
                                        (lambda: plans.Pace(1.0, 0.0), "planned_s"),
                                        (lambda: plans.Pace(1.0, float("nan")), "planned_s"),
                                        (lambda: plans.Pace().fit(-1, "{n}"), "full"),
                                        (lambda: plans.Pace().fit(2, "{n}", minimum=-1), "minimum"),
                                        (lambda: scale_plans.pace(1.0, [], "workshop", Machine(2, GiB)), "counts")])
def test_a_bad_pace_is_one_line_naming_it(call, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        call()


def test_07s_pace_is_its_paired_launch_of_one_and_two_workers():
    from labkit.deepdive import plans as deepdive_plans
    # 1 core: 14 s for one worker, 28 s for two sharing it; its committed run on 2 cores (22.3 s) cuts nothing
    assert deepdive_plans.pace(42.0, "workshop", Machine(1, 2 * GiB, load=3.0)).ratio == pytest.approx(1.0)
    reference = deepdive_plans.pace(22.3, "workshop", Machine(2, 4 * GiB))
    assert reference.fit(2, "{n} of {full} batch sizes") == (2, "")
    slow = deepdive_plans.pace(6 * 42.0, "workshop", Machine(1, 2 * GiB))
    assert slow.fit(2, "{n} of {full} batch sizes")[0] == 1 and "to keep 07 within" in slow.fit(2, "{n}")[1]


def test_05s_pace_is_as_planned_on_its_reference_run_and_cuts_a_shared_core():
    """05's first lease against its plan: the reference refresh (6 networks of 8 x 3,000 images, 2 workers, 72 s
    with start-up, at load 1.7) is within its allowance; the same lease 3x slower cuts the speed-up's repeats."""
    two = Machine(2, 4 * GiB)
    ref = sweep_plans.pace(72.0, 6, 8 * 3000, 2, two)
    assert 0.8 < ref.ratio <= plans.ALLOWANCE and ref.fit(2, "{n} of {full}") == (2, "")
    slow = sweep_plans.pace(3 * 72.0, 6, 8 * 3000, 2, two)
    repeats, why = slow.fit(2, "the speed-up is timed {n} time(s) per worker count instead of {full}")
    assert repeats == 1 and "instead of 2" in why and "to keep 05 within its slot" in why
    one = sweep_plans.pace(72.0, 6, 8 * 3000, 1, Machine(1, 2 * GiB))  # one worker: twice the work per core
    assert one.planned_s > ref.planned_s
    with pytest.raises(ValueError, match="workers"):
        sweep_plans.pace(72.0, 6, 8 * 3000, 0, two)
