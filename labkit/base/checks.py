"""One validator for every numeric argument: the value back, or one ValueError line naming the parameter.

    check_int(batch_size, "batch_size", minimum=1)              -> "batch_size must be an int >= 1; got 0"
    check_number(timeout, "timeout", above=0)                   -> "timeout must be a finite number > 0; got nan"
    check_ints(workers, "workers", minimum=1)                   -> "workers must be a non-empty list of ints >= 1; ..."
    check_choice(launcher, "launcher", ("gloo", "mpi"))         -> "launcher must be 'gloo' or 'mpi'; got 'tcp'"

bool is refused where a number is asked for (True is an int to Python, never to a learner); numpy integers and
floats are accepted and returned as Python int / float. After scikit-learn's `check_scalar`.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["check_choice", "check_int", "check_ints", "check_number"]


def _bounds(minimum=None, maximum=None, above=None, below=None) -> str:
    parts = [f">= {minimum:g}" if minimum is not None else "", f"> {above:g}" if above is not None else "",
             f"<= {maximum:g}" if maximum is not None else "", f"< {below:g}" if below is not None else ""]
    return " and ".join(p for p in parts if p)


def _within(value, minimum, maximum, above, below) -> bool:
    return ((minimum is None or value >= minimum) and (maximum is None or value <= maximum)
            and (above is None or value > above) and (below is None or value < below))


def check_int(value, name: str, *, minimum=None, maximum=None):
    """value as an int if it is a whole number (not a bool) within [minimum, maximum]; else one ValueError line."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not _within(value, minimum, maximum,
                                                                                          None, None):
        bounds = _bounds(minimum, maximum)
        raise ValueError(f"{name} must be an int{' ' + bounds if bounds else ''}; got {value!r}")
    return int(value)


def check_number(value, name: str, *, minimum=None, maximum=None, above=None, below=None):
    """value as a float if it is a finite real number (not a bool) within the bounds; else one ValueError line."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
          and _within(value, minimum, maximum, above, below))
    if not ok:
        bounds = _bounds(minimum, maximum, above, below)
        raise ValueError(f"{name} must be a finite number{' ' + bounds if bounds else ''}; got {value!r}")
    return float(value)


def check_choice(value, name: str, choices):
    """value, when it is one of choices; else one ValueError line naming the parameter and every choice."""
    if value not in choices:
        raise ValueError(f"{name} must be {', '.join(map(repr, choices[:-1]))} or {choices[-1]!r}; got {value!r}")
    return value


def check_ints(values, name: str, *, minimum=None, maximum=None) -> list[int]:
    """A non-empty sequence of ints within the bounds, as a list; else one ValueError line naming the first bad one."""
    bounds = _bounds(minimum, maximum)
    what = f"{name} must be a non-empty list of ints{' ' + bounds if bounds else ''}"
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{what}; got {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{what}; got an empty list")
    for v in values:
        try:
            check_int(v, name, minimum=minimum, maximum=maximum)
        except ValueError:
            raise ValueError(f"{what}; got {v!r} in {values!r}") from None
    return [int(v) for v in values]
