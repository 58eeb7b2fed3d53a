"""Judging an exercise's answer: a Verdict (correct, a recognised mistake, wrong, unanswered, unreadable).

A checker is a function `spec(**numbers) -> Spec` (the reference answer and the usual mistakes) turned by
`@checker` into `check.NAME(answer, **numbers)`, which prints one line and returns the reference value. The
checkers themselves live in labkit.exercises.check; this module is the machinery they share. (01_cnn_basics)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

CHECKERS: dict = {}  # name -> checker, in the order the course meets them
NOT_ANSWERED = ("Not answered yet: put your answer in place of None in the cell above and run both cells. "
                "The lesson goes on with the reference value.")


@dataclass(frozen=True)
class Verdict:
    """status: correct | mistake (a recognised one, named by `mistake`) | wrong | unanswered | unreadable."""
    status: str
    message: str
    expected: object
    mistake: str | None = None


@dataclass
class Spec:
    """What a checker knows: the reference answer, its kind, and the usual mistakes [(key, value or test, hint)]."""
    expected: object
    kind: str = "number"  # number | shape | array | indices | names | bool
    mistakes: list = field(default_factory=list)
    hint: str = ""
    success: str = ""
    rtol: float = 1e-6
    ignore: tuple = ()  # names: allowed in the answer but irrelevant (layers without weights)


class _Unreadable(Exception):
    pass


def _describe(answer) -> str:
    text = " ".join(repr(answer).split())  # one line, whatever numpy's repr does
    return text if len(text) <= 60 else text[:57] + "..."


def _number(answer) -> float:
    if isinstance(answer, (bool, np.bool_)):
        raise _Unreadable(f"expected a number, got {answer!r}")
    if isinstance(answer, str):
        raise _Unreadable(f"expected a number, got the text {answer!r}; write it without quotes")
    try:
        arr = np.asarray(answer, dtype=float)
    except (TypeError, ValueError):
        raise _Unreadable(f"expected a number, got {_describe(answer)}") from None
    if arr.size != 1:
        raise _Unreadable(f"expected one number, got {arr.size} values (shape {arr.shape})")
    value = float(arr.reshape(()))
    if not math.isfinite(value):
        raise _Unreadable(f"expected a finite number, got {value}")
    return value


def _coerce(kind: str, answer):
    """The answer in the kind's canonical form, or _Unreadable with the reason."""
    if kind == "number":
        return _number(answer)
    if kind == "bool":
        if isinstance(answer, (bool, np.bool_)):
            return bool(answer)
        raise _Unreadable(f"expected True or False, got {_describe(answer)}")
    if kind == "array":
        try:
            arr = np.asarray(answer, dtype=float)
        except (TypeError, ValueError):
            raise _Unreadable(f"expected an array of numbers, got {_describe(answer)}") from None
        if not np.all(np.isfinite(arr)):
            raise _Unreadable("your array contains NaN or infinity")
        return arr
    if isinstance(answer, (str, bytes)):
        if kind == "names":
            return frozenset([answer])
        raise _Unreadable(f"expected a tuple of whole numbers, got the text {answer!r}")
    try:
        items = list(np.asarray(answer).ravel()) if isinstance(answer, np.ndarray) else list(answer)
    except TypeError:
        what = "names" if kind == "names" else "whole numbers"
        raise _Unreadable(f"expected a list or tuple of {what}, got {_describe(answer)}") from None
    if kind == "names":
        if not all(isinstance(i, str) for i in items):
            raise _Unreadable(f"expected layer names as text, got {_describe(answer)}")
        return frozenset(items)
    out = []
    for item in items:
        if isinstance(item, (list, tuple, np.ndarray)) or isinstance(item, (bool, np.bool_)):
            raise _Unreadable(f"expected whole numbers, got {_describe(item)} in {_describe(answer)}")
        value = _number(item)
        if value != int(value):
            raise _Unreadable(f"expected whole numbers, got {_describe(item)} in {_describe(answer)}")
        out.append(int(value))
    return tuple(out) if kind == "shape" else frozenset(out)


def _same(kind: str, answer, value, rtol: float) -> bool:
    if callable(value):
        return bool(value(answer))
    if kind == "number":
        return math.isclose(answer, float(value), rel_tol=rtol, abs_tol=1e-12)
    if kind == "array":
        value = np.asarray(value, dtype=float)
        return answer.shape == value.shape and bool(np.allclose(answer, value, rtol=1e-5, atol=1e-6))
    if kind in ("indices", "names"):
        return answer == frozenset(value)
    return answer == value


def judge(spec: Spec, answer) -> Verdict:
    """The verdict on one answer (no printing)."""
    expected = spec.expected
    if answer is None or answer is Ellipsis:
        return Verdict("unanswered", NOT_ANSWERED, expected)
    try:
        given = _coerce(spec.kind, answer)
        if spec.kind == "names":
            given = frozenset(given) - frozenset(spec.ignore)
        if _same(spec.kind, given, expected, spec.rtol):
            return Verdict("correct", "Correct! " + spec.success[:1].upper() + spec.success[1:], expected)
        canonical = _coerce(spec.kind, expected)
        for key, value, hint in spec.mistakes:
            if value is None or (not callable(value) and _same(spec.kind, canonical, value, spec.rtol)):
                continue  # this mistake gives the right answer for these numbers: not recognisable
            if _same(spec.kind, given, value, spec.rtol):
                return Verdict("mistake", "Not quite: " + (hint(given) if callable(hint) else hint),
                               expected, key)
        if spec.kind == "array" and given.shape != np.shape(expected):
            return Verdict("wrong", f"Not quite: your array has shape {given.shape}; the answer has shape "
                                    f"{np.shape(expected)}. {spec.hint}", expected)
    except _Unreadable as err:
        return Verdict("unreadable", f"Could not read your answer: {err}.", expected)
    except Exception as err:  # a checker must answer with a line, whatever the learner passed
        return Verdict("unreadable", f"Could not read your answer {_describe(answer)} ({type(err).__name__}).",
                       expected)
    shown = "your array" if spec.kind == "array" else _describe(answer)
    return Verdict("wrong", f"Not quite: {shown} is not it. {spec.hint}".rstrip(), expected)


def checker(spec_fn):
    """Turn `spec_fn(**numbers) -> Spec` into a checker `fn(answer, **numbers)` that prints and returns."""
    @functools.wraps(spec_fn)
    def run(answer=None, **numbers):
        verdict = judge(spec_fn(**numbers), answer)
        print(verdict.message)
        return verdict.expected

    run.judge = lambda answer=None, **numbers: judge(spec_fn(**numbers), answer)
    run.spec = spec_fn
    CHECKERS[spec_fn.__name__] = run
    return run
