"""Words that match the numbers: every number in a notebook's Markdown comes from the run or from a cited source.

A number in a Markdown cell passes when it is
- in an output of the same notebook, at the printed precision (thousands separators aside: "13,905" = "13905");
- a setting the notebook's code states (a number literal in a code cell, outside strings and comments: the lr,
  the epochs, the batch size hold on every machine);
- in the table of published figures of a source the sentence names (SOURCES: the MATLAB white papers, the
  lecture, the Chameleon slides, the papers; figures held where an oracle test holds them, else here);
- arithmetic the cell shows ("25088 x 4096 = 103 M": every number of a shown product, quotient, sum or
  difference whose result agrees at its printed precision).
Not numbers of the lesson, so not checked: code spans and blocks, LaTeX, URLs, HTML tags, numbers glued to a
name (ResNet-50, conv2_x, 3x3, float32, CIFAR-10), versions (TensorFlow 2.15), years 1950-2030 (citations),
the numbering of sections, exercises, slides, steps and notebooks, a heading's own number, and whole numbers up
to 10: a count a reader checks by eye (kernel sides, workers, cores, layers in a block), the numbers style
guides write as words.
"""
import io
import json
import math
import re
import tokenize

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL = 10  # whole numbers up to this are counts read by eye (see the module docstring)

NUMBER = re.compile(r"(?<![\w.\-/])[-−]?\d[\d,]*(?:\.\d+)?(?!\d)(?![A-Za-z_]\w)(?!\.\d)")
NUMBERING = re.compile(r"\b(?:exercises?|sections?|slides?|steps?|notebooks?|cells?|chapters?|parts?|items?|"
                       r"tables?|figures?|fig\.|eq\.|lines?|tasks?|versions?|v|tensorflow|horovod|python|keras|"
                       r"numpy|ubuntu|opencv|mpich|open mpi|tf|pytorch|cudnn|cuda|nccl|§)\s*$", re.IGNORECASE)
RANGE_NUMBERING = re.compile(r"\b(?:exercises?|sections?|slides?|steps?|notebooks?|cells?|items?)\s+[\d.]+\s*(?:-|–|,|"
                             r"and|to)\s*$", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bcf)(?<!\bFig)[.!?](?=\s+[A-Z(*\"“])")
ARITHMETIC = re.compile(r"((?:\d[\d,]*(?:\.\d+)?\s*(?:[x×*/+\-−^]|\bx\b)\s*)+\d[\d,]*(?:\.\d+)?)\s*(?:=|≈|~)\s*"
                        r"(\d[\d,]*(?:\.\d+)?)\s*(k|K|M|G|T|E|%)?")
SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "E": 1e18, "%": 1e-2, None: 1}


def published_sources() -> list[tuple[re.Pattern, set[str]]]:
    """(how a sentence names the source, the figures it may quote from it), one row per cited source.

    Figures held in labkit (with their oracle tests) are read from there; the rest are typed here, each
    checked by hand against the source's text."""
    from labkit.scale import allreduce
    chameleon = {_norm(f"{v:g}") for col in allreduce.CHAMELEON_BATCH.values() for v in col}
    horovod = {_norm(f"{100 * r['efficiency']:g}") for r in allreduce.PUBLISHED if "Horovod" in r["source"]}
    return [
        (re.compile(r"MATLAB|MathWorks|white paper|the paper's", re.I),
         # white paper (CIFAR-10): SGDM lr 0.001, drop x0.1 at epoch 30, L2 0.004, 40 epochs, batch 100, 16
         # networks, first-layer filters 20/32; the automatic-parallel example: 0.8938 test accuracy, batch 256,
         # 50 epochs, drop at 45; the multi-GPU paper: ~70 % more per doubling, 95 % in ~10 min on 8 GPUs, >40 min
         # on 1, 96,000 images in 55 classes
         {"0.001", "0.1", "30", "0.004", "40", "100", "16", "20", "32", "0.8938", "89.38", "89", "256", "50", "45",
          "70", "95", "10", "8", "64", "128", "1.7", "4", "55", "96000"}),
        (re.compile(r"ImageNet", re.I), {"1000", "1.2", "1.28", "50000"}),
        (re.compile(r"lecture|SURFsara|PRACE", re.I),
         # AlexNet 1.5, VGG 19.6, ResNet 3.6-11.6 GFLOPs; 650K neurons, 60M weights; >1 ExaFLOP for VGG, 50 epochs;
         # Goyal et al.'s 8k = 256 x 32 with 23.60 % vs 23.74 % top-1 error; slides 36-40
         {"1.5", "19.6", "3.6", "11.6", "650", "60", "1", "50", "8", "8192", "256", "32", "23.60", "23.74"}),
        # the slides' batch table labels its third network "ResNet 150" (shared/seeds/003, the table's header)
        (re.compile(r"Chameleon|Das 2017", re.I),
         chameleon | {"194.86", "389.81", "1466.31", "7.5", "1", "2", "8", "150"}),
        (re.compile(r"Goyal", re.I), {"8192", "8", "256", "32", "23.60", "23.74", "90", "5", "0.1", "1"}),
        (re.compile(r"Horovod paper|Sergeev", re.I), horovod | {"512", "128", "64", "88"}),
        (re.compile(r"He et al|ResNet paper", re.I),
         # ResNet-18/34/50/101/152 FLOPs (x10^9 multiply-adds) and the 7x7/2, 3x3 pool of Table 1
         {"1.8", "3.6", "3.8", "7.6", "11.3", "25.5", "23.3"}),
        (re.compile(r"Simonyan|VGG paper", re.I), {"133", "134", "138", "144", "19.6", "15.5"}),
        (re.compile(r"Krizhevsky|AlexNet paper", re.I), {"60", "650", "1.2", "224", "227", "90"}),
        (re.compile(r"CIFAR-10|Krizhevsky 2009", re.I),
         {"60000", "50000", "10000", "6000", "3072", "32"}),
        (re.compile(r"NVIDIA", re.I), _nvidia()),
    ]


def _nvidia() -> set[str]:
    from labkit.flops import hardware
    figures = set()
    for m in hardware.PUBLISHED:
        figures |= {_norm(str(m.batch_size)), _norm(f"{m.images_per_s:g}")}
    return figures


def _norm(token: str) -> str:
    """'13,905' -> '13905'; '−0.5' -> '-0.5' (the printed digits, separators aside)."""
    return token.replace(",", "").replace("−", "-").lstrip("+")


def source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def prose(markdown: str) -> str:
    """The Markdown's words: code, LaTeX, URLs, link targets and HTML tags blanked, a heading's number dropped."""
    text = re.sub(r"```.*?```|~~~.*?~~~", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)|https?://\S+|<[^>\n]+>", " ", text)
    return re.sub(r"^(#+\s*)[\d.]+\s*[·.:)-]?", r"\1", text, flags=re.M)


def output_numbers(nb: dict) -> set[str]:
    """Every number printed in the notebook's outputs (streams, text/plain, HTML tables, Markdown), normalised."""
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                texts.append(source({"source": out["text"]}))
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in out.get("data", {}):
                    texts.append(re.sub(r"<[^>]+>", " ", source({"source": out["data"][mime]})))
    found = re.findall(r"[-−]?\d[\d,]*(?:\.\d+)?", "\n".join(texts))
    return {_norm(t) for t in found}


def code_numbers(nb: dict) -> set[str]:
    """The number literals of the code cells (settings: lr, epochs, sizes), written as prose would write them."""
    found = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = [line for line in source(cell).splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            toks = list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
        for tok in toks:
            if tok.type == tokenize.NUMBER and not tok.string.lower().endswith("j"):
                value = float(tok.string.replace("_", "")) if not tok.string.startswith("0x") else int(tok.string, 16)
                found |= {_norm(f"{value:g}"), _norm(repr(value)), tok.string.replace("_", "")}
                if value == int(value):
                    found.add(str(int(value)))
    return found


def shown_arithmetic(text: str) -> set[str]:
    """Numbers of the arithmetic a text shows whose result agrees at its printed precision."""
    found = set()
    for m in ARITHMETIC.finditer(text):
        expr, result, unit = m.group(1), m.group(2), m.group(3)
        python = re.sub(r"\s*(?:x|×)\s*", "*", expr.replace(",", "").replace("−", "-").replace("^", "**"))
        if not re.fullmatch(r"[\d.*/+\- ]+", python):
            continue
        try:
            value = eval(python, {"__builtins__": {}})  # digits and + - * / only (checked above)
        except (SyntaxError, ZeroDivisionError):
            continue
        decimals = len(result.split(".")[1]) if "." in result else 0
        shown = float(_norm(result)) * SCALE[unit]
        if math.isclose(value, shown, abs_tol=0.5 * 10 ** -decimals * SCALE[unit] * 1.0001):
            found |= {_norm(t) for t in re.findall(r"\d[\d,]*(?:\.\d+)?", m.group(0))}
    return found


def sentences(text: str) -> list[str]:
    """The sentences of a text: its paragraphs, list items and table rows, each cut at full stops."""
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[|*+-]|\d+\.)\s)", text)
    return [s for block in blocks for s in SENTENCE_END.split(block) if s.strip()]


def unexplained(nb: dict, sources=None) -> list[str]:
    """'cell N: number in «sentence»' for every Markdown number that no output, setting, named source or shown
    arithmetic accounts for."""
    sources = published_sources() if sources is None else sources
    printed, settings = output_numbers(nb), code_numbers(nb)
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = prose(source(cell))
        shown = shown_arithmetic(text)
        for sentence in sentences(text):
            cited = set().union(*(figures for name, figures in sources if name.search(sentence)))
            for m in NUMBER.finditer(sentence):
                token, before = _norm(m.group(0)), sentence[:m.start()]
                if token in printed or token in settings or token in shown or token in cited:
                    continue
                if NUMBERING.search(before) or RANGE_NUMBERING.search(before):
                    continue
                if re.fullmatch(r"\d+", token) and (int(token) <= SMALL or 1950 <= int(token) <= 2030):
                    continue
                bad.append(f"cell {i}: {m.group(0)} in «{' '.join(sentence.split())[:160]}»")
    return bad


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_in_the_prose_comes_from_the_run_or_a_cited_source(path):
    bad = unexplained(_load(path))
    assert not bad, f"{path.name}: numbers no output, setting, cited source or shown arithmetic accounts for:\n" + \
        "\n".join(bad)


def _notebook(markdown: str, printed: str, code: str = "x = 1") -> dict:
    return {"cells": [{"cell_type": "markdown", "source": markdown},
                      {"cell_type": "code", "source": code,
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]}]}


def test_a_number_changed_in_the_prose_fails():
    """Planted drift: one printed number of 03's prose changed in a copy is reported, and only that one."""
    nb = _load(ROOT / "notebooks" / "03_flops.ipynb")
    printed, before = output_numbers(nb), unexplained(nb)
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] != "markdown":
            continue
        for sentence in sentences(prose(text)):
            for m in NUMBER.finditer(sentence):
                if "." not in m.group(0) or _norm(m.group(0)) not in printed or NUMBERING.search(sentence[:m.start()]):
                    continue
                drifted = m.group(0)[:-1] + str((int(m.group(0)[-1]) + 3) % 10)
                if _norm(drifted) in printed or any(name.search(sentence) for name, _ in published_sources()):
                    continue
                cell["source"] = text.replace(m.group(0), drifted, 1)
                after = unexplained(nb)
                assert len(after) == len(before) + 1 and f" {drifted} in " in after[-1] or \
                    any(f" {drifted} in " in line for line in after), (m.group(0), drifted, after)
                return
    pytest.fail("03_flops has no decimal number in its prose that an output prints")


def test_an_output_changed_by_a_refresh_fails():
    nb = _notebook("On this machine the speed-up was 1.51x over one worker.", "speed-up 1.51x")
    assert unexplained(nb, sources=[]) == []
    nb["cells"][1]["outputs"][0]["text"] = "speed-up 1.80x"
    assert len(unexplained(nb, sources=[])) == 1


def test_the_rules_accept_what_they_name_and_only_that():
    text = ("ResNet-50 at 224x224 in TensorFlow 2.15 (He et al. 2016), Exercise 4.2 and section 7: `0.123` and "
            "$k = 17$ are skipped, as are 3 workers. fc1 alone has 25088 x 4096 = 103 M parameters. The lecture "
            "says 19.6 GFLOPs for VGG. We read 42.5 ms.")
    bad = unexplained(_notebook(text, "nothing printed", code="lr = 0.001"), sources=published_sources())
    assert bad == ["cell 0: 42.5 in «We read 42.5 ms.»"], bad
    # the source must be named in the same sentence, and the arithmetic must agree
    assert len(unexplained(_notebook("VGG needs 19.6 GFLOPs.", ""), sources=published_sources())) == 1
    assert len(unexplained(_notebook("It has 25088 x 4096 = 113 M.", ""), sources=[])) == 3
    # a setting from the code passes (outside strings and comments only)
    assert unexplained(_notebook("We train at lr 0.001.", "", code="lr = 0.001"), sources=[]) == []
    assert len(unexplained(_notebook("Reference 17,903x.", "", code="s = '17,903x'  # 17903"), sources=[])) == 1
