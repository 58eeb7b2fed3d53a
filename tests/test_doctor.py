import json
import os
import subprocess
import sys

import pytest

from labkit import doctor


def fake_horovod(tmp_path, tensorflow_import: str) -> dict:
    """An environment whose `import horovod` finds a Horovod 0.28.1 package in tmp_path, and whose
    `import horovod.tensorflow` runs tensorflow_import (an extension that does not load raises there)."""
    pkg = tmp_path / "fake" / "horovod"
    (pkg / "tensorflow").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.28.1"\n')
    (pkg / "tensorflow" / "__init__.py").write_text(tensorflow_import + "\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "fake"), os.environ.get("PYTHONPATH")]))}


def _fake_python(tmp_path, body: str) -> list:
    """A command standing in for the ranks' Python (LABKIT_RANK_PYTHON): a shell script running body."""
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return [str(exe)]


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


def _line(text: str, check: str) -> str:
    """The doctor's line for one check, its padding squeezed: '[FAIL] horovod 0.27.2 (...)'."""
    return " ".join(next(ln for ln in text.splitlines() if ln.split("] ", 1)[-1].startswith(check + " ")).split())


def test_doctor_fails_when_horovod_lacks_tensorflow(tmp_path):
    """A Horovod whose TensorFlow extension does not load (built without it, or against another TensorFlow)."""
    env = fake_horovod(tmp_path, 'raise ImportError("mpi_lib.so: undefined symbol: _ZN10tensorflow8OpKernel")')
    proc = run_doctor(env)
    assert proc.returncode == 1, proc.stdout
    line = _line(proc.stdout, "horovod")
    assert line.startswith("[FAIL] horovod 0.28.1 (TensorFlow: NO") and "undefined symbol" in line, proc.stdout
    assert "fix horovod: Horovod was built without TensorFlow" in proc.stdout


@pytest.mark.slow
def test_the_build_is_asked_of_the_ranks_python(tmp_path):
    """The doctor asks the Python each rank runs (LABKIT_RANK_PYTHON): its Horovod is the one launches use."""
    ranks = _fake_python(tmp_path, "echo '{\"version\": \"0.27.2\", \"frameworks\": [\"TensorFlow\"], "
                                   "\"controllers\": [\"Gloo\"], \"operations\": [\"Gloo\"], \"error\": \"\"}'")
    proc = run_doctor({"LABKIT_RANK_PYTHON": ranks[0]})
    assert proc.returncode == 1
    assert _line(proc.stdout, "horovod") == "[FAIL] horovod 0.27.2 (TensorFlow: yes; controllers: Gloo; ops: Gloo)"
    assert "pinned to horovod 0.28.1" in proc.stdout
    proc = run_doctor({"LABKIT_RANK_PYTHON": str(tmp_path / "no-such-python")})
    assert proc.returncode == 1
    assert _line(proc.stdout, "horovod").startswith("[FAIL] horovod LABKIT_RANK_PYTHON: expected a command")


def test_a_horovod_that_is_not_importable_is_not_installed(tmp_path):
    env = fake_horovod(tmp_path, "")
    (tmp_path / "fake" / "horovod" / "__init__.py").write_text('raise ImportError("libgloo.so: cannot open")\n')
    proc = run_doctor(env)
    assert proc.returncode == 1
    assert _line(proc.stdout, "horovod") == "[FAIL] horovod not installed (ImportError: libgloo.so: cannot open)"


def test_doctor_reports_a_bad_profile():
    proc = run_doctor({"LABKIT_PROFILE": "fastest"})
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


def test_the_probe_reads_its_answer_past_what_tensorflow_prints_and_refuses_an_incomplete_one(tmp_path):
    from labkit.scale import horovod_info
    noisy = _fake_python(tmp_path, "echo 'oneDNN custom operations are on.'\necho '{\"version\": \"0.28.1\", "
                                   "\"frameworks\": [\"TensorFlow\"], \"controllers\": [\"Gloo\"], \"operations\": "
                                   "[\"Gloo\"]}'\necho 'I tensorflow/core/platform: done' >&2")
    build, why = horovod_info.probe_build(noisy)
    assert why == "" and build == {"version": "0.28.1", "frameworks": ["TensorFlow"], "controllers": ["Gloo"],
                                   "operations": ["Gloo"], "error": ""}
    partial = _fake_python(tmp_path, "echo '{\"version\": \"0.28.1\"}'\necho 'W tensorflow: a warning' >&2\n"
                                     "echo 'RuntimeError: the extension said no' >&2\necho 'W later noise' >&2")
    assert horovod_info.probe_build(partial) == (
        None, "asking Horovod what it was built with failed (RuntimeError: the extension said no)")
    no_labkit = _fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'labkit'\" >&2; exit 1")
    build, why = horovod_info.probe_build(no_labkit)
    assert build is None and why.startswith("the ranks' Python cannot import labkit")


def test_the_probe_past_its_timeout_ends_with_everything_it_started(tmp_path):
    import time

    import psutil

    from labkit.scale import horovod_info
    marker = tmp_path / "child.pid"
    slow = _fake_python(tmp_path, f"sleep 60 & echo $! > {marker}\nwait")
    start = time.monotonic()
    build, why = horovod_info.probe_build(slow, timeout=2)
    assert build is None and "took more than 2 s" in why and time.monotonic() - start < 10
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the probe's child outlived it"
        time.sleep(0.1)


def test_doctor_passes_with_a_cifar10_copy_in_the_official_layout(tmp_path, monkeypatch):
    """The copy found and verified (what 00 showed in the full profile's run with the real-size layout, which no
    longer runs 00): the check passes and names the folder."""
    from pathlib import Path

    from labkit.data import cifar10
    from labkit.data import loading as data
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "data"))
    import cifar_real_size  # the official CIFAR-10 layout, one writer

    where = _doctor_with_data(tmp_path, monkeypatch)
    (x, y), (xt, yt) = data.synthetic(500, 100, seed=0)
    monkeypatch.setattr(cifar10, "CIFAR10_FILES", cifar_real_size.write_layout(where, x, y, xt, yt))
    monkeypatch.setenv("LABKIT_PROFILE", "full")
    report = doctor.doctor(check_horovod=False)
    check = _cifar_check(report)
    assert check.ok and check.value.endswith("(checksums verified)") and str(where) in check.value, check.value
    assert report.ok, str(report)
