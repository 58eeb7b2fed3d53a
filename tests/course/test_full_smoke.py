"""The full profile at smoke scale: every notebook but 00 (SAME_IN_EVERY_PROFILE), top to bottom, with
LABKIT_PROFILE=full LABKIT_SMOKE=1, in its learner edition (labkit.exercises.build.build) where it has exercises, so
the same run proves the learner's copy.

Smoke scale (labkit.base.config.by_profile's smoke= values) shrinks every size to seconds and keeps every code path
of the full profile: the same models, launch commands and plots, and CIFAR-10 from disk. The CIFAR-10 here is
a fixture in the official python layout (cifar-10-batches-py/, pickled batches) holding labkit's learnable
synthetic images, so the full profile's accuracy and loss checks still mean something. labkit trusts a batch
only by its MD5 in labkit.data.cifar10.CIFAR10_FILES; the fixture's own table reaches the kernel and the processes
it starts through a sitecustomize module on PYTHONPATH, in this test only.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, notebook_client  # noqa: E402  (the repository root, one definition)

sys.path.insert(0, str(ROOT / "tests" / "data"))
import cifar_real_size  # noqa: E402  (the official CIFAR-10 layout, one writer)

# 00 has no exercise and reads no setting of the profile beyond its name (it prints the profiles, the doctor's
# report and where CIFAR-10 is): its nbval run in the quick profile takes every path it has, and a second run here
# proved nothing more (test_the_notebooks_left_out_take_no_path_of_the_full_profile holds that to be true)
SAME_IN_EVERY_PROFILE = ("00_welcome",)
NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("0*.ipynb")) if p.stem not in SAME_IN_EVERY_PROFILE]
N_TRAIN, N_TEST = 1200, 600  # at least the smoke sizes (labkit.data.default_sizes: 1000 / 500)
TIMES: dict[str, float] = {}


class WorkersOutOfSync(AssertionError):
    """04's check that every worker ends with the same weights failed."""


KNOWN: dict = {}  # notebook stem -> a pytest mark for a known failure (none today)
# The full profile is an HPC node's: 02 and 07 run it as a 64-core node plans it, 05 as an 8-core one (LABKIT_CORES;
# observations not asserted, this is not the reference machine's shape). These are their runs at other core counts
# (tests/course/test_core_counts.py runs the rest): in the quick profile 07's launches at 64 cores were the same as
# at 8 (two workers of one thread: `labkit plan`), and the full profile runs every one of them plus its own; 05's
# sweep workers and their threads at 8 cores are the full plan's here (42 s alone, against 39 s at 2 cores and 36 s
# for the quick profile's 8-core run it replaced). 04 stays at this machine's cores: at 8 its full plan launches up
# to 8 workers (142 s alone, against 68 s).
AT_CORES = {"02_im2col": 64, "05_network_sweep": 8, "07_scaling_deep_dive": 64}


@pytest.mark.parametrize("profile", ["quick", "workshop", "full"])
def test_smoke_scale_shrinks_sizes_and_keeps_choices(monkeypatch, profile):
    from labkit.base import config

    monkeypatch.setenv("LABKIT_PROFILE", profile)
    monkeypatch.delenv("LABKIT_SMOKE", raising=False)
    assert config.by_profile(quick=1, workshop=2, full=3, smoke=0) == {"quick": 1, "workshop": 2, "full": 3}[profile]
    assert "SMOKE" not in config.describe()
    monkeypatch.setenv("LABKIT_SMOKE", "1")
    assert config.by_profile(quick=1, workshop=2, full=3, smoke=0) == 0       # a size: the smoke value
    assert config.by_profile(quick="a", workshop="b", full="c") == {"quick": "a", "workshop": "b", "full": "c"}[profile]
    assert "SMOKE SCALE" in config.describe() and "not results" in config.describe()
    monkeypatch.setenv("LABKIT_SMOKE", "0")
    assert config.by_profile(quick=1, workshop=2, full=3, smoke=0) != 0


@pytest.mark.parametrize("profile", ["quick", "workshop", "full"])
def test_a_part_the_profile_leaves_out_stays_out_at_smoke_scale(monkeypatch, profile):
    """04's and 07's Gloo-vs-MPI rounds and 07's exchange batches: none in the quick profile, so none in the quick
    profile at smoke scale either (the 1-CPU box's and the 8-core runs' smoke scale), one in the others."""
    from labkit.base import config

    monkeypatch.setenv("LABKIT_PROFILE", profile)
    monkeypatch.setenv("LABKIT_SMOKE", "1")
    quick = profile == "quick"
    assert config.by_profile(quick=0, workshop=2, full=3, smoke=1) == (0 if quick else 1)
    assert config.by_profile(quick=[], workshop=[64, 256], full=[128, 512], smoke=[16]) == ([] if quick else [16])
    assert config.by_profile(quick={}, workshop={"a": 1}, full={"a": 1}, smoke={"b": 2}) == ({} if quick else {"b": 2})
    assert config.by_profile(quick=None, workshop=5, full=5, smoke=1) == (None if quick else 1)
    assert config.by_profile(quick=False, workshop=True, full=True, smoke=False) is False
    assert config.by_profile(quick=True, workshop=True, full=True, smoke=False) is False  # a switch turned off
    monkeypatch.setenv("LABKIT_SMOKE", "0")
    assert config.by_profile(quick=0, workshop=2, full=3, smoke=1) == {"quick": 0, "workshop": 2, "full": 3}[profile]


@pytest.mark.parametrize("bad", ["yes", "2", "true"])
def test_bad_smoke_value_names_the_variable(monkeypatch, bad):
    from labkit.base import config

    monkeypatch.setenv("LABKIT_SMOKE", bad)
    with pytest.raises(ValueError, match="LABKIT_SMOKE"):
        config.smoke_scale()


def test_the_notebooks_left_out_take_no_path_of_the_full_profile():
    """A notebook left out of the full-profile runs has no exercise (no learner edition to prove) and no code that
    reads the profile's settings (by_profile, a profile's name compared, smoke scale, a for_profile plan)."""
    import re

    import nbformat

    from labkit.exercises import build as exercises

    for stem in SAME_IN_EVERY_PROFILE:
        nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
        assert exercises.exercises(nb) == [], f"{stem} has exercises: its learner edition must run here"
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        found = re.findall(r"by_profile|profile\(\) *[!=]=|smoke_scale|for_profile", code)
        assert not found, f"{stem} reads the profile ({', '.join(sorted(set(found)))}): it must run here"


@pytest.fixture(scope="module")
def smoke_env(tmp_path_factory):
    from labkit.data import loading as data

    base = tmp_path_factory.mktemp("full-smoke")
    (x, y), (xt, yt) = data.synthetic(N_TRAIN, N_TEST, seed=0)
    table = cifar_real_size.write_layout(base / "data", x, y, xt, yt)
    site = base / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(cifar_real_size.trust_module(table))
    home = base / "home"
    home.mkdir()
    env = {"LABKIT_PROFILE": "full", "LABKIT_SMOKE": "1", "LABKIT_DATA": str(base / "data"),
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "MPLBACKEND": "Agg",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    yield env, table
    if TIMES:
        print("\nfull profile at smoke scale, seconds per notebook (load average "
              f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}):")
        for name, s in TIMES.items():
            print(f"  {name}: {s:.0f} s")


def test_fixture_is_read_as_cifar10(smoke_env, monkeypatch):
    """The fixture is what the full profile loads: CIFAR-10 by name, the smoke sizes, the right labels."""
    from labkit.base import config
    from labkit.data import cifar10
    from labkit.data import loading as data

    env, table = smoke_env
    for key, value in env.items():
        if key != "PYTHONPATH":
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(cifar10, "CIFAR10_FILES", table)
    assert config.smoke_scale() and "SMOKE SCALE" in config.describe()
    (x, y), (xt, yt), info = data.load_dataset()
    assert info.name == "cifar10"
    assert (len(x), len(xt)) == (1000, 500)
    (sx, sy), _ = data.synthetic(1000, 500, seed=0)
    np.testing.assert_array_equal(x, sx)
    np.testing.assert_array_equal(y.ravel(), sy.ravel())


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> dict:
    """The learner edition (labkit.exercises.build.build), built once: notebook name -> its path."""
    from labkit.exercises import build as exercises
    return {p.name: p for p in exercises.build(tmp_path_factory.mktemp("learner"))}


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, marks=KNOWN.get(p.stem, ())) for p in NOTEBOOKS],
                         ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_full_profile_at_smoke_scale(path, smoke_env, learner, monkeypatch):
    import nbclient
    import nbformat

    from labkit.exercises import build as exercises
    from labkit.exercises.verdict import NOT_ANSWERED

    for key, value in smoke_env[0].items():
        monkeypatch.setenv(key, value)
    if path.stem in AT_CORES:
        monkeypatch.setenv("LABKIT_CORES", str(AT_CORES[path.stem]))
        monkeypatch.setenv("LABKIT_STRICT_OBSERVATIONS", "0")
    # the learner edition where the notebook has exercises: one run proves the full profile's code paths and
    # that the learner's copy (solutions removed, every checker saying "not answered yet") runs top to bottom;
    # the instructor's solutions are run and checked by nbval in the quick profile
    run_path = learner.get(path.name, path)
    checks = [ex.cell + 1 for ex in exercises.exercises(nbformat.read(path, as_version=4))] if run_path != path else []
    nb = nbformat.read(run_path, as_version=4)
    client = notebook_client(nb, kernel_name="labkit", timeout=300, allow_errors=False,
                             resources={"metadata": {"path": str(run_path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        index = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", []))), "?")
        first = nb.cells[index].source.splitlines()[0] if index != "?" else ""
        if index != "?" and 'weak["in_sync"].all()' in nb.cells[index].source:
            raise WorkersOutOfSync(f"{path.name} cell {index}: workers' weight checksums differ") from None
        pytest.fail(f"{path.name} cell {index} ({first!r}) failed in the full profile at smoke scale:\n"
                    f"{str(err)[-3000:]}", pytrace=False)
    finally:
        TIMES[path.stem] = time.perf_counter() - start
    texts = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if "config.describe()" in "".join(c.source for c in nb.cells[:3]):
        assert "SMOKE SCALE" in texts, f"{path.name} does not say it ran at smoke scale"
    if path.stem in AT_CORES:
        assert f"{AT_CORES[path.stem]} cores" in texts or f"{AT_CORES[path.stem]} usable cores" in texts, \
            f"{path.name} does not say it planned for {AT_CORES[path.stem]} cores"
    for i in checks:
        text = "".join(o.get("text", "") for o in nb.cells[i].outputs)
        assert text.strip() == NOT_ANSWERED, f"learner edition of {path.name}, cell {i} printed {text!r}"
    print(f"{path.stem}: {TIMES[path.stem]:.0f} s", file=sys.stderr)


# ------------------------------------------------------------------ the hpc/ template in the full profile
from test_slurm import VENV, slurm  # noqa: E402,F401  (the loopback Slurm of tests/course/test_slurm.py, reused)


@pytest.mark.slow
@pytest.mark.slurm
def test_single_node_template_in_full_profile_at_smoke_scale(slurm, smoke_env, tmp_path):  # noqa: F811
    """hpc/single_node.sbatch with LABKIT_PROFILE=full LABKIT_SMOKE=1 on the test Slurm: 2 tasks, ranks in sync."""
    import json

    env, _ = smoke_env
    results = tmp_path / "scale.json"
    job_id, log = slurm.submit("hpc/single_node.sbatch", "--ntasks=2", "--gres=none", log=tmp_path / "job-%j.out",
                               LABKIT_VENV=VENV, LABKIT_RESULTS=str(results), LABKIT_PROFILE="full", LABKIT_SMOKE="1",
                               LABKIT_DATA=env["LABKIT_DATA"], LABKIT_STEPS="3",
                               LABKIT_SCALE_ARGS="--repeats 1 --warmup-steps 1")
    fields = slurm.wait_job(job_id, timeout=300)
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", \
        f"job {job_id}: {fields.get('JobState')} exit {fields.get('ExitCode')}\n{text}\n{slurm.log_tail()}"
    runs = {run["np"]: run for run in json.loads(results.read_text())["runs"]}
    assert sorted(runs) == [1, 2]
    assert runs[2]["checksums"][0] == runs[2]["checksums"][1]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.horovod
def test_multi_node_template_in_full_profile_reads_the_cifar_layout(slurm, smoke_env, tmp_path):  # noqa: F811
    """hpc/multi_node.sbatch with LABKIT_PROFILE=full LABKIT_SMOKE=1 and --data cifar10: both ranks load the
    CIFAR-10-layout archive through the verified loader, train and end with the same weights."""
    import json

    env, _ = smoke_env
    out = tmp_path / "hvd"
    job_id, log = slurm.submit("hpc/multi_node.sbatch", "--nodes=1", "--ntasks-per-node=2", "--gres=none",
                               log=tmp_path / "job-%j.out", LABKIT_VENV=VENV, LABKIT_RESULTS=str(out),
                               LABKIT_STEPS="3", LABKIT_BATCH_SIZE="16", LABKIT_DATA_SOURCE="cifar10", **env)
    fields = slurm.wait_job(job_id, timeout=300)
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED", f"{fields.get('JobState')} {fields.get('ExitCode')}\n{text}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["data"] for r in ranks] == ["cifar10", "cifar10"]
    assert ranks[0]["examples_total"] == 1000  # the full profile's smoke size, read from the archive
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert "all ranks hold the same weights" in text


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.server
def test_jupyter_template_in_full_profile(slurm, smoke_env, tmp_path):  # noqa: F811
    """hpc/jupyter.sbatch with LABKIT_PROFILE=full LABKIT_SMOKE=1: says which profile the notebooks get,
    JupyterLab answers with the token, and scancel ends the job."""
    env, _ = smoke_env
    token = "labkit-full-" + os.urandom(8).hex()
    home = tmp_path / "home"
    home.mkdir()
    job_id, log = slurm.submit("hpc/jupyter.sbatch", "--gres=none", "--cpus-per-task=1", log=tmp_path / "lab-%j.out",
                               JUPYTER_TOKEN=token, LABKIT_VENV=VENV, LABKIT_LOGIN_HOST="login.example.org",
                               USER="student", HOME=str(home), **env)
    try:
        status, text, _ = slurm.wait_for_lab(job_id, log, token, r"ssh -N -L (\d+):127\.0\.0\.1:")
        assert "the notebooks will run in the full profile (LABKIT_SMOKE=1)" in text, text
        assert status == 200, f"JupyterLab did not answer:\n{text}"
    finally:
        slurm.run("scancel", job_id, check=False)
    assert slurm.wait_job(job_id, timeout=30)["JobState"] == "CANCELLED"
