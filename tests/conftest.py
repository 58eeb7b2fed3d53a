"""Shared pytest set-up: keep TensorFlow quiet and the user's home untouched."""
import os
import sys
from pathlib import Path

import pytest

import labkit  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL before any test imports TensorFlow)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def venv_bin() -> Path:
    """The bin/ folder of the interpreter running the tests (the project's .venv under `make test`)."""
    return Path(sys.executable).parent


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """HOME and Jupyter's dirs in tmp, so a test writes nothing to the real home."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
           "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
           "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"),
           "IPYTHONDIR": str(home / ".ipython")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return home


def pytest_configure(config):
    os.environ.setdefault("MPLBACKEND", "Agg")
