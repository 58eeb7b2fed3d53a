"""labkit.base.checks: the one validator of numeric arguments."""
import math

import numpy as np
import pytest

from labkit.base.checks import check_int, check_ints, check_number


@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1)])
def test_check_int_returns_python_ints(value):
    out = check_int(value, "n", minimum=1)
    assert out == int(value) and type(out) is int


@pytest.mark.parametrize("value, kw, message", [
    (0, {"minimum": 1}, "n must be an int >= 1; got 0"),
    (True, {"minimum": 0}, "n must be an int >= 0; got True"),
    (2.0, {}, "n must be an int; got 2.0"),
    ("3", {"minimum": 1}, "n must be an int >= 1; got '3'"),
    (9, {"minimum": 1, "maximum": 8}, "n must be an int >= 1 and <= 8; got 9"),
    (None, {}, "n must be an int; got None"),
])
def test_check_int_refuses_in_one_line_naming_the_parameter(value, kw, message):
    with pytest.raises(ValueError) as err:
        check_int(value, "n", **kw)
    assert str(err.value) == message


@pytest.mark.parametrize("value, kw", [(0.5, {"above": 0}), (1, {"minimum": 1}), (np.float32(2.5), {"below": 3})])
def test_check_number_accepts_and_returns_floats(value, kw):
    out = check_number(value, "x", **kw)
    assert out == pytest.approx(float(value)) and type(out) is float


@pytest.mark.parametrize("value, kw, message", [
    (math.nan, {"above": 0}, "t must be a finite number > 0; got nan"),
    (math.inf, {}, "t must be a finite number; got inf"),
    (0, {"above": 0}, "t must be a finite number > 0; got 0"),
    (1.0, {"minimum": 0, "below": 1}, "t must be a finite number >= 0 and < 1; got 1.0"),
    (False, {}, "t must be a finite number; got False"),
    ("fast", {}, "t must be a finite number; got 'fast'"),
])
def test_check_number_refuses_in_one_line(value, kw, message):
    with pytest.raises(ValueError) as err:
        check_number(value, "t", **kw)
    assert str(err.value) == message


def test_check_ints_names_the_first_bad_value():
    assert check_ints((1, np.int64(2)), "workers", minimum=1) == [1, 2]
    for bad, shown in [([], "an empty list"), ([1, 0, 2], "0 in [1, 0, 2]"), ("12", "'12'"), (3, "3")]:
        with pytest.raises(ValueError, match="workers must be a non-empty list of ints >= 1; got "
                           + shown.replace("[", r"\[").replace("]", r"\]")):
            check_ints(bad, "workers", minimum=1)
