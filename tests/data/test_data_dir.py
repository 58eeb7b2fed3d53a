"""LABKIT_DATA and `labkit data fetch`: a bad setting is named, a good copy is never lost."""
from __future__ import annotations

import contextlib
import io
import os

import pytest

from helpers import labkit_cli, one_line  # noqa: E402


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


@pytest.fixture
def data_is_a_file(tmp_path, monkeypatch):
    where = tmp_path / "data.txt"
    where.write_text("not a folder")
    monkeypatch.setenv("LABKIT_DATA", str(where))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no Keras cache to find CIFAR-10 in
    return where


def test_doctor_reports_a_labkit_data_that_is_a_file(data_is_a_file):
    from labkit import doctor
    report = doctor.doctor(check_horovod=False)
    assert not report.ok and "all checks passed" not in str(report)
    assert any(f"LABKIT_DATA={data_is_a_file} is not a folder" in c.value for c in report.problems)


def test_sweep_and_scale_name_the_bad_setting_not_a_missing_data_set(data_is_a_file, tmp_path):
    from labkit.scale import scaling
    from labkit.sweep import networks as netsweep
    for check in (lambda: scaling.data_note("auto"), netsweep.dataset_choice,
                  lambda: netsweep.NetworkTrainer().settings()):
        with pytest.raises(ValueError, match=f"LABKIT_DATA={data_is_a_file} is not a folder"):
            check()
    env = {"LABKIT_DATA": str(data_is_a_file), "HOME": str(tmp_path / "home")}
    out = tmp_path / "runs" / "s.jsonl"
    one_line(labkit_cli("sweep", "--out", str(out), "--no-progress", env_extra=env), f"LABKIT_DATA={data_is_a_file}")
    assert not out.parent.exists()


def _fake_good_copy(folder):
    """A stand-in for a good CIFAR-10 copy: an archive and an extracted folder with known bytes."""
    from labkit.data import cifar10
    (folder / cifar10.CIFAR10_DIRNAME).mkdir(parents=True)
    (folder / cifar10.CIFAR10_DIRNAME / "data_batch_1").write_bytes(b"old batch")
    (folder / cifar10.CIFAR10_ARCHIVE).write_bytes(b"old archive")
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_fetch_force_with_no_network_keeps_the_old_copy(tmp_path, monkeypatch):
    from tensorflow import keras

    from labkit.data import cifar10

    def no_network(**kw):
        raise Exception("URL fetch failure: [Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(keras.utils, "get_file", no_network)
    before = _fake_good_copy(tmp_path)
    with pytest.raises(ConnectionError, match="could not download"):
        cifar10.fetch_cifar10(tmp_path, force=True)
    assert {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([cifar10.CIFAR10_ARCHIVE, cifar10.CIFAR10_DIRNAME])


def test_fetch_force_replaces_the_old_copy_once_the_new_one_is_verified(tmp_path, monkeypatch):
    import hashlib
    import tarfile

    from tensorflow import keras

    from labkit.data import cifar10
    staged = tmp_path / "staged"
    (staged / cifar10.CIFAR10_DIRNAME).mkdir(parents=True)
    (staged / cifar10.CIFAR10_DIRNAME / "test_batch").write_bytes(b"new batch")
    fresh = tmp_path / "fresh.tar.gz"
    with tarfile.open(fresh, "w:gz") as tar:
        tar.add(staged / cifar10.CIFAR10_DIRNAME, arcname=cifar10.CIFAR10_DIRNAME)
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(fresh.read_bytes()).hexdigest())

    def download(fname, cache_dir, **kw):
        path = os.path.join(cache_dir, fname)
        with open(path, "wb") as fh:
            fh.write(fresh.read_bytes())
        return path

    monkeypatch.setattr(keras.utils, "get_file", download)
    data = tmp_path / "data"
    _fake_good_copy(data)
    archive = cifar10.fetch_cifar10(data, force=True)
    assert archive.read_bytes() == fresh.read_bytes()
    assert sorted(p.name for p in (data / cifar10.CIFAR10_DIRNAME).iterdir()) == ["test_batch"]
    assert sorted(p.name for p in data.iterdir()) == sorted([cifar10.CIFAR10_ARCHIVE, cifar10.CIFAR10_DIRNAME])
