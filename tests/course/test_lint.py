"""ruff (pinned in requirements.txt, configured in pyproject.toml) finds nothing in labkit/, tests/ and scripts/:
the same check as `make lint`, so `make test` and CI run it."""
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

LINTED = ("labkit", "tests", "scripts")


def _ruff() -> Path:
    return Path(sys.executable).parent / "ruff"


def test_ruff_finds_nothing():
    ruff = _ruff()
    assert ruff.exists(), f"no ruff beside {sys.executable}: run scripts/setup.sh (requirements.txt pins it)"
    out = subprocess.run([str(ruff), "check", "--output-format", "concise", *LINTED], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{out.stdout}{out.stderr}"


def test_ruff_is_the_pinned_version():
    pinned = next(line.split("==")[1].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.startswith("ruff=="))
    out = subprocess.run([str(_ruff()), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["ruff", pinned], out.stdout


def test_ruff_sees_a_planted_error(tmp_path):
    """The config is read and the rules run: an unused import in a copy of a linted file is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    out = subprocess.run([str(_ruff()), "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "F401" in out.stdout, out.stdout + out.stderr
