"""LABKIT_DATA and `labkit data fetch`: a bad setting is named, a good copy is never lost."""
from __future__ import annotations

import contextlib
import io

import pytest




@pytest.mark.parametrize("kind", ["file", "loop"])
def test_labkit_data_that_is_not_a_folder_is_said_so(tmp_path, monkeypatch, kind):
    from labkit.data import loading as data
    where = tmp_path / "data"
    if kind == "file":
        where.write_text("not a folder")
    else:
        where.symlink_to(where)
    monkeypatch.setenv("LABKIT_DATA", str(where))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        data.cli_main(["where"])
    assert f"{where}: not a folder (LABKIT_DATA points here)" in out.getvalue()
    with pytest.raises(OSError, match="is not a folder"):
        data.fetch_cifar10()
