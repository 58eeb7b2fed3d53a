"""Without Horovod (its build failed): `labkit doctor` names it with the build's reason and log."""
import sys

from labkit import doctor
from labkit.scale import horovod_info


def test_doctor_names_the_failed_build_and_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_HOROVODRUN", str(tmp_path / "no-such-horovodrun"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    check = doctor._horovod_check(doctor.Report())
    assert not check.ok and check.value == "not installed"  # no log: nothing more to say
    log = tmp_path / horovod_info.BUILD_LOG
    log.write_text("build-horovod: building horovod 0.28.1\nerror: ...\nbuild-horovod: no C++ compiler. Fix: "
                   "apt-get install g++\n")
    check = doctor._horovod_check(doctor.Report())
    assert not check.ok
    assert check.value == "not installed: the last build stopped with: no C++ compiler. Fix: apt-get install g++"
    assert check.fix.endswith(f"once the cause is fixed; the build's log: {log}") and "make setup" in check.fix
    # a build that worked (build-horovod.sh's last line) is no reason for a Horovod that is gone now
    log.write_text("build-horovod: compiled in 180 s\n"
                   "build-horovod: horovod 0.28.1 installed (gloo, tensorflow 2.15.1)\n")
    assert doctor._horovod_check(doctor.Report()).value == "not installed"


def test_the_horovod_exercise_says_what_is_missing_instead_of_a_launch_failure(monkeypatch):
    from labkit.exercises import check_hvd
    monkeypatch.setitem(sys.modules, "horovod", None)  # as after a failed build: find_spec says None
    verdict = check_hvd.judge(str(check_hvd.REFERENCE))
    assert verdict.status == "unreadable" and verdict.message == check_hvd.NO_HOROVOD
    assert verdict.message.startswith("Horovod is not installed here") and "labkit doctor" in verdict.message
    assert check_hvd.judge(None).status == "unanswered"  # an unanswered exercise still says so first
