"""scripts/binder_box.py's argument checks: each bad value is named by its own option, before any box is made."""
import subprocess
import sys

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)


@pytest.mark.parametrize("argv, named", [(["--cpus=-1"], "cpus: expected 1 to "), (["--cpus=0", "--busy=1"], "cpus:"),
                                         (["--busy=3", "--cpus=1"], "busy: expected 0 to --cpus (1)")])
def test_a_bad_option_is_named_by_itself(argv, named):
    """--cpus -1 was reported as a bad --busy ('busy: expected 0 to --cpus (-1) busy CPUs, got 0')."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "binder_box.py"), *argv,
                           str(ROOT / "notebooks" / "00_welcome.ipynb")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"binder_box: {named}"), proc.stderr
