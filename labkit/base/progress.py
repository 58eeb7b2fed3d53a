"""Progress bars whose final state is what a saved notebook keeps (05_network_sweep, 06_transfer_learning).

tqdm's notebook widget stores only its first picture (0 %) in the saved file, since a widget's later states live
in the browser. In a Jupyter kernel, bar() draws tqdm's text bar into one display output and updates that output
in place, so the notebook file ends with the bar's last state (16/16, 100 %). In a terminal it is plain tqdm.
"""
from __future__ import annotations

import re


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (where an output can be updated in place), False in a terminal or pytest."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class LastLine:
    """A write-only text file for tqdm that passes the last non-empty line it was given to show(text)."""

    encoding = "utf-8"  # tqdm draws its bar in Unicode blocks when the file says it can take them

    def __init__(self, show):
        self.show, self.text = show, ""

    def write(self, s: str) -> int:
        # tqdm redraws with '\r' (and ends with '\n'): only the text after the last one is the bar as it stands
        lines = [part for part in re.split(r"[\r\n]", s) if part.strip()]
        if lines:
            self.text = lines[-1]
            self.show(self.text)
        return len(s)

    def flush(self) -> None:
        pass


def bar(total: int, desc: str, unit: str, initial: int = 0, display=None):
    """A tqdm progress bar; in Jupyter (or given an IPython-style display function) one output updated in place."""
    if display is None and in_jupyter():
        from IPython.display import display
    if display is None:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit)
    from tqdm.std import tqdm

    handle = display({"text/plain": f"{desc}: starting"}, raw=True, display_id=True)
    out = LastLine(lambda text: handle.update({"text/plain": text}, raw=True))
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=out, ncols=100, mininterval=0.5)
