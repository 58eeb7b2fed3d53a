"""requirements.txt is the one source of truth for versions: every other file must agree with it."""
import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def pins(lines) -> dict:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        spec = str(req.specifier)
        assert spec.startswith("==") and "," not in spec, f"not an exact pin: {line}"
        out[canonicalize_name(req.name)] = spec[2:]
    return out


REQUIREMENTS = pins((ROOT / "requirements.txt").read_text().splitlines())


def test_the_stack_is_pinned_as_decided():
    assert REQUIREMENTS["tensorflow-cpu"] == "2.15.1"
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


def test_lock_agrees_with_requirements():
    lock = pins((ROOT / "constraints.txt").read_text().splitlines())
    for name, version in REQUIREMENTS.items():
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
    for name, version in REQUIREMENTS.items():
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
