"""The package's dependency rules, read from the code: every import, those inside functions included.

Each package of labkit has a floor; a module may import its own package and the floors below it, never one
above or beside it (a lesson uses an earlier lesson's API, never a later one's). No two modules import each
other, directly or round a longer circle. The rules are the ones each package's docstring states.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

LABKIT = Path(__file__).resolve().parents[1] / "labkit"

# floor of each top-level part of labkit: the base at the bottom, the lessons in teaching order (the 07 deep dive
# after 06, since it builds on 04 and nothing builds on it), then what sits above every lesson
FLOORS = {
    "labkit": 0,  # labkit/__init__.py: TensorFlow's log level, nothing else
    "base": 1,
    "data": 2, "models": 2,
    "conv": 3,  # 02
    "flops": 4,  # 03
    "scale": 5,  # 04
    "sweep": 6,  # 05
    "transfer": 7,  # 06
    "deepdive": 8,  # 07
    "cluster": 9,  # 08: builds on 04's launcher, beside nothing of 07's
    "widgets": 10, "exercises": 10,
    "doctor": 11, "plan": 11, "cli": 11, "__main__": 12,
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "labkit"


def _module_name(path: Path) -> str:
    rel = path.relative_to(LABKIT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The labkit modules a file imports, at the top or inside a function ('from labkit.x import y' counts
    labkit.x.y when y is a module, else labkit.x)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "labkit")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "labkit":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (LABKIT.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (LABKIT.parent / Path(*sub.split(".")) / "__init__.py").exists()
                out.add(sub if is_module else node.module)
    return out


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): imports_of(p) for p in sorted(LABKIT.rglob("*.py"))}


def test_every_part_of_labkit_has_a_floor():
    parts = {_part(m) for m in _graph()}
    assert parts <= set(FLOORS), f"give these a floor in FLOORS: {sorted(parts - set(FLOORS))}"


def test_no_import_runs_up_or_sideways():
    bad = []
    for mod, deps in _graph().items():
        mine = _part(mod)
        for dep in deps:
            theirs = _part(dep)
            if theirs != mine and theirs != "labkit" and FLOORS[theirs] >= FLOORS[mine]:
                bad.append(f"{mod} imports {dep} ({mine} is on floor {FLOORS[mine]}, {theirs} on {FLOORS[theirs]})")
    assert not bad, "\n".join(bad)


def test_the_package_root_imports_nothing_of_labkit():
    assert not imports_of(LABKIT / "__init__.py")


def test_no_circle_between_modules():
    graph = _graph()
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    # a package's __init__ re-exporting its own modules is not a circle: drop init -> own submodule edges
    for m in graph:
        graph[m] = {d for d in graph[m] if not d.startswith(m + ".")}
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph[m]):
            visit(d)
        stack.pop()
    for m in sorted(graph):
        visit(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from labkit.base import machine\n", {"labkit.base.machine"}),
    ("import labkit.scale.launch\n", {"labkit.scale.launch"}),
    ("from labkit.base.machine import cores\n", {"labkit.base.machine"}),
    ("import numpy\nfrom . import x\n", set()),
])
def test_imports_are_read_inside_functions_too(tmp_path, source, expected):
    f = tmp_path / "m.py"
    f.write_text(source)
    assert imports_of(f) == expected


def test_no_module_takes_the_name_of_a_package_a_script_imports():
    """A script run by path (python labkit/scale/keras_hvd.py, the checker's harness) has its own folder first on
    sys.path: a labkit module named like a top-level package (horovod, tensorflow, a standard module) would be
    imported in its place ("'horovod' is not a package")."""
    import pkgutil
    import sys

    outside = [p for p in sys.path if Path(p or ".").resolve() != LABKIT.parent]
    taken = {m.name for m in pkgutil.iter_modules(outside)} | set(sys.stdlib_module_names)
    clashes = [str(p.relative_to(LABKIT.parent)) for p in LABKIT.rglob("*.py") if p.stem in taken - {"__init__",
                                                                                                      "__main__"}]
    assert not clashes, f"rename these (a script beside them would import them instead of the real package): {clashes}"
