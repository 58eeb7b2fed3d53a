"""labkit.scale.mpi: which libmpi Horovod links and the mpirun that goes with it, against what the loader and the
library itself say."""
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.scale import mpi

# A process that loads Horovod's extension, then asks the loader which libmpi it mapped, and that libmpi
# which version it is (MPI_Get_library_version may be called before MPI_Init).
LOADED = """
import ctypes, horovod.tensorflow
maps = open("/proc/self/maps").read().split()
lib = next(p for p in maps if "/libmpi.so" in p)
buf, n = ctypes.create_string_buffer(8192), ctypes.c_int()
ctypes.CDLL(lib).MPI_Get_library_version(buf, ctypes.byref(n))
print(lib)
print(buf.value.decode().splitlines()[0])
"""


@pytest.mark.horovod
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_the_libmpi_and_mpirun_are_the_ones_horovod_loads():
    if not mpi.horovod_has_mpi():
        pytest.skip(f"Horovod here has no MPI ({mpi.describe()})")
    out = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded, library_says = out.stdout.strip().splitlines()[-2:]
    assert Path(loaded).resolve() == Path(mpi.horovod_libmpi()).resolve()
    exe = mpi.mpirun_path()
    number = mpi.version(exe).split()[-1]  # 'Open MPI 5.0.11' -> '5.0.11'
    assert f"Open MPI v{number}" in library_says, (exe, library_says)
    # the description names the same installation
    assert mpi.version(exe) in mpi.describe()
    assert ("in this environment" in mpi.describe()) is (
        Path(exe).parent.resolve() == Path(sys.prefix, "bin").resolve())


def _with_ldd(tmp_path, monkeypatch, output: str):
    """A fake ldd printing output, and a Horovod extension for it to read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ldd").write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    (bin_dir / "ldd").chmod(0o755)
    ext = tmp_path / "mpi_lib.so"
    ext.write_bytes(b"")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(mpi, "horovod_extension", lambda: ext)
    monkeypatch.setattr(mpi.sys, "platform", "linux")
    mpi.horovod_libmpi.cache_clear()


@pytest.mark.parametrize("ldd, expected", [
    # Open MPI 4 (apt): the C++ bindings come first and are not the library asked for
    ("\tlibmpi_cxx.so.40 => /lib/x86_64-linux-gnu/libmpi_cxx.so.40 (0x1)\n"
     "\tlibmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x2)", "/lib/x86_64-linux-gnu/libmpi.so.40"),
    ("\tlibmpi.so.40 => /work/venv/lib/libmpi.so.40 (0x2)", "/work/venv/lib/libmpi.so.40"),  # PyPI's, by rpath
    ("\tlibmpi.so.12 => not found", "libmpi.so.12"),
    ("\tlibgloo.so => /x/libgloo.so (0x1)\n\tlibc.so.6 => /lib/libc.so.6 (0x2)", ""),  # built without MPI
])
def test_libmpi_is_read_from_the_linker_listing(tmp_path, monkeypatch, ldd, expected):
    _with_ldd(tmp_path, monkeypatch, ldd)
    try:
        assert mpi.horovod_libmpi() == expected
        assert mpi.horovod_has_mpi() is bool(expected)
    finally:
        mpi.horovod_libmpi.cache_clear()


@pytest.mark.parametrize("lib_dir", ["venv/lib", "usr/lib/x86_64-linux-gnu"])
def test_mpirun_comes_from_the_installation_of_the_libmpi(tmp_path, monkeypatch, lib_dir):
    lib = tmp_path / lib_dir / "libmpi.so.40"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    prefix = tmp_path / lib_dir.split("/")[0]
    (prefix / "bin").mkdir()
    (prefix / "bin" / "mpirun").write_text("")
    other = tmp_path / "elsewhere"  # an mpirun first on PATH that belongs to another MPI
    other.mkdir()
    (other / "mpirun").write_text("#!/bin/sh\n")
    (other / "mpirun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    monkeypatch.delenv("LABKIT_MPIRUN", raising=False)
    monkeypatch.setattr(mpi, "horovod_libmpi", lambda: str(lib))
    assert mpi.mpirun_path() == str(prefix / "bin" / "mpirun")
    monkeypatch.setenv("LABKIT_MPIRUN", str(other / "mpirun"))  # a site's override wins
    assert mpi.mpirun_path() == str(other / "mpirun")


def test_doctor_names_the_mpi_or_says_gloo(monkeypatch):
    from labkit import doctor
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: True)
    monkeypatch.setattr(mpi, "horovod_libmpi", lambda: f"{sys.prefix}/lib/libmpi.so.40")
    monkeypatch.setattr(mpi, "mpirun_path", lambda: f"{sys.prefix}/bin/mpirun")
    monkeypatch.setattr(mpi, "version", lambda exe: "Open MPI 5.0.11")
    report = doctor.Report()
    check = doctor._mpi_check(report)
    assert check.ok and "Open MPI 5.0.11 from PyPI in this environment" in check.value
    assert report.info["mpi"]["from"] == "environment"
    monkeypatch.setattr(mpi, "mpirun_path", lambda: "/usr/bin/mpirun")
    report = doctor.Report()
    check = doctor._mpi_check(report)
    # the line a notebook shows names the MPI, not a path; --json's info keeps the path
    assert "Open MPI 5.0.11 of the system" in check.value and "/usr/bin" not in check.value
    assert report.info["mpi"]["mpirun"] == "/usr/bin/mpirun" and report.info["mpi"]["from"] == "system"
    monkeypatch.setattr(mpi, "horovod_has_mpi", lambda: False)
    check = doctor._mpi_check(doctor.Report())
    assert not check.ok and not check.required  # Gloo still runs the course
    assert "launches use Gloo" in check.value and "make setup" in check.fix
