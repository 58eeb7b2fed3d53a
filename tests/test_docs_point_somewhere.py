"""Every file a docstring or comment in labkit/, scripts/ or tests/ names exists in the repository: a mention
naming a module at a path it left two moves ago sends a reader nowhere."""
from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a file name with a known extension, with or without folders before it
MENTION = re.compile(r"(?<![\w./{}-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh|ipynb|toml|cfg|yml|yaml))(?![\w/])")
# named on purpose though absent: another project's files, files a run writes, pip's and a learner's names
NOT_OURS = {"setup.py", "train.py", "model.py", "bench.py", "configurator.py", "conftest.py"}
OTHER_PROJECTS = ("torchvision/", "examples/")  # torchvision's CIFAR-10 loader, Horovod's examples folder


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "labkit", "scripts", "tests"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith(".py") and (ROOT / f).is_file()]


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each docstring and comment in a Python file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.append((first.lineno, first.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def _exists(name: str, here: Path, names: set[str]) -> bool:
    if "/" not in name:
        return name in names  # a bare file name: somewhere in the repository
    return any((base / name).exists() for base in (ROOT, here.parent, ROOT / "labkit"))


def missing_mentions(paths) -> list[str]:
    names = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}
    bad = []
    for path in paths:
        for line, text in _prose(path):
            for name in MENTION.findall(text):
                name = name.lstrip("./")
                if name in NOT_OURS or name.startswith(OTHER_PROJECTS) or _exists(name, path, names):
                    continue
                bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: {name}")
    return bad


def test_every_file_a_docstring_or_comment_names_exists():
    bad = missing_mentions(_tracked())
    assert not bad, "name a file that exists (or drop the mention):\n" + "\n".join(bad)


def test_a_missing_file_is_found(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Reads labkit/tfdist_train.py."""\n# see docs/instructors.md and labkit/base/nothere.py\n')
    assert [b.split(": ")[-1] for b in missing_mentions([f])] == ["labkit/tfdist_train.py", "labkit/base/nothere.py"]
