import json
import os
import stat
import subprocess
import sys

import pytest

from labkit import doctor
from labkit.scale import horovod_info as horovod

CHECK_BUILD = """\
Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [ ] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [ ] MPI
    [X] Gloo
"""


def test_parse_check_build():
    build = horovod.parse_check_build(CHECK_BUILD)
    assert build == {"version": "0.28.1", "frameworks": ["TensorFlow", "PyTorch"],
                     "controllers": ["Gloo"], "operations": ["Gloo"]}


def fake_horovodrun(tmp_path, text):
    exe = tmp_path / "horovodrun"
    exe.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def run_doctor(env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "labkit", "doctor"], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.horovod
def test_doctor_passes_in_the_course_environment():
    report = doctor.doctor()
    assert report.ok, str(report)
    data = report.to_dict()
    assert json.loads(json.dumps(data))["ok"] is True
    names = [c["name"] for c in data["checks"]]
    for expected in ("python", "tensorflow", "horovod", "gpus", "cores", "memory", "disk", "profile", "cifar10"):
        assert expected in names
    assert "Gloo" in data["info"]["horovod_build"]["controllers"]


def test_doctor_fails_with_a_fix_when_horovod_is_missing(tmp_path):
    proc = run_doctor({"LABKIT_HOROVODRUN": str(tmp_path / "no-such-horovodrun")})
    assert proc.returncode == 1
    assert "[FAIL] horovod" in proc.stdout
    assert "fix horovod:" in proc.stdout and "make setup" in proc.stdout


def test_doctor_fails_when_horovod_lacks_tensorflow(tmp_path):
    exe = fake_horovodrun(tmp_path, CHECK_BUILD.replace("[X] TensorFlow", "[ ] TensorFlow"))
    proc = run_doctor({"LABKIT_HOROVODRUN": str(exe)})
    assert proc.returncode == 1
    assert "built without TensorFlow" in proc.stdout


def test_doctor_reports_a_bad_profile(tmp_path):
    exe = fake_horovodrun(tmp_path, CHECK_BUILD)
    proc = run_doctor({"LABKIT_HOROVODRUN": str(exe), "LABKIT_PROFILE": "fastest"})
    assert proc.returncode == 1
    assert "fix profile:" in proc.stdout and "LABKIT_PROFILE" in proc.stdout


def _doctor_with_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def _cifar_check(report):
    return next(c for c in report.checks if c.name == "cifar10")


def test_doctor_names_a_corrupt_cifar10_archive_and_the_fix(tmp_path, monkeypatch):
    from labkit.data import loading as data

    where = _doctor_with_data(tmp_path, monkeypatch)
    where.mkdir()
    (where / data.CIFAR10_ARCHIVE).write_bytes(b"\x1f\x8b half a download")
    with pytest.raises(data.CorruptDataError):  # what a notebook would meet
        data.load_dataset(n_train=10, n_test=10)
    report = doctor.doctor(check_horovod=False)
    check = _cifar_check(report)
    assert not check.ok and check.required and not report.ok
    text = str(report)
    assert "corrupt" in text and "labkit data fetch cifar10 --force" in text
    assert "notebooks use the offline data set" not in text


def test_doctor_says_offline_set_only_when_there_is_no_cifar10(tmp_path, monkeypatch):
    _doctor_with_data(tmp_path, monkeypatch)
    check = _cifar_check(doctor.doctor(check_horovod=False))
    assert not check.ok and not check.required and "notebooks use the offline data set" in check.value


def test_doctor_says_a_generic_blas_kernel_in_one_line(monkeypatch):
    from labkit.base import blas, machine
    monkeypatch.setattr(machine, "blas_info", lambda: [{"internal_api": "openblas", "version": "0.3.23",
                                                        "architecture": "Prescott"}])
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    report = doctor.doctor(check_horovod=False)
    check = next(c for c in report.checks if c.name == "blas")
    assert not check.ok and not check.required  # information: the course still runs
    assert check.value == blas.generic_blas_line() and "OPENBLAS_CORETYPE=Prescott" in str(report)
    assert report.info["generic_blas"] == check.value
