"""Each package's public names: a sorted `__all__`, every name in it importable, one package per name."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import labkit

PACKAGES = sorted(m.name for m in pkgutil.iter_modules(labkit.__path__) if m.ispkg)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_every_name_resolves(name):
    pkg = importlib.import_module(f"labkit.{name}")
    public = getattr(pkg, "__all__", None)
    assert public is not None, f"labkit.{name} has no __all__"
    assert public == sorted(set(public)), f"labkit.{name}.__all__ must be sorted, each name once"
    for attr in public:  # a re-exported name, or a submodule of the package
        assert hasattr(pkg, attr) or importlib.util.find_spec(f"labkit.{name}.{attr}"), f"labkit.{name}.{attr}"


def test_a_reexported_name_has_one_package():
    """A function or class a package re-exports is not also in another package's __all__."""
    owner = {}
    for name in PACKAGES:
        pkg = importlib.import_module(f"labkit.{name}")
        for attr in getattr(pkg, "__all__", ()):
            obj = getattr(pkg, attr, None)
            if obj is None or isinstance(obj, type(labkit)):
                continue  # a submodule: its address is its path
            key = (getattr(obj, "__module__", None), getattr(obj, "__qualname__", attr))
            assert owner.setdefault(key, name) == name, f"{attr} is public in labkit.{owner[key]} and labkit.{name}"
