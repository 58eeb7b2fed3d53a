"""05's main sweep starts the workers the plan fits (labkit.sweep.plans), never a number typed in the notebook: on
one core the plan says one worker, and the notebook's sweep must start one."""
import ast
import json

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

NOTEBOOK = ROOT / "notebooks" / "05_network_sweep.ipynb"


def _code_cells():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            text = "".join(cell["source"])
            yield ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))


def _workers_of_run_sweep_calls():
    for tree in _code_cells():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "run_sweep":
                yield next((k.value for k in node.keywords if k.arg == "num_workers"), None)


def _sweep_workers_assignment():
    for tree in _code_cells():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SWEEP_WORKERS"]:
                return node.value
    return None


def test_every_sweep_in_05_takes_its_workers_from_one_name_set_by_the_plan():
    workers = list(_workers_of_run_sweep_calls())
    assert workers, "05 runs sweep.run_sweep"
    for value in workers:
        assert isinstance(value, ast.Name) and value.id == "SWEEP_WORKERS", \
            f"run_sweep(num_workers={ast.unparse(value) if value is not None else None}): use SWEEP_WORKERS"
    assigned = _sweep_workers_assignment()
    assert assigned is not None and "plans.sweep_workers" in ast.unparse(assigned), "SWEEP_WORKERS comes from the plan"


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_notebooks_worker_count_follows_the_cores(monkeypatch, cores):
    from labkit.base import machine
    from labkit.sweep import plans

    monkeypatch.setenv("LABKIT_CORES", str(cores))
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    workers = eval(compile(ast.Expression(_sweep_workers_assignment()), "05", "eval"),  # the notebook's expression
                   {"plans": plans, "machine": machine, "min": min, "max": max})
    assert workers == min(max(plans.sweep_workers()), cores)
    assert 1 <= workers <= cores
    if cores == 1:
        assert workers == 1, "one core: one worker, as the plan says"
