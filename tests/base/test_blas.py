"""labkit.base.blas: one line when numpy's OpenBLAS runs a generic kernel on a CPU with AVX2/AVX-512."""
from labkit.base import blas

AVX512 = {"sse3", "avx", "avx2", "avx512f", "avx512bw"}
AVX2 = {"sse3", "avx", "avx2", "fma"}


def openblas(kernel: str, version: str = "0.3.23.dev") -> list:
    """threadpoolctl's entry for numpy's OpenBLAS, as machine.blas_info() returns it."""
    return [{"user_api": "blas", "internal_api": "openblas", "num_threads": 2, "prefix": "libopenblas",
             "version": version, "threading_layer": "pthreads", "architecture": kernel}]


def test_prescott_on_avx512_with_coretype_set_is_one_line_naming_the_variable():
    line = blas.generic_blas_line(openblas("Prescott"), AVX512, {"OPENBLAS_CORETYPE": "Prescott"})
    assert line and "\n" not in line
    assert "Prescott" in line and "AVX-512" in line and "OPENBLAS_CORETYPE=Prescott" in line


def test_core2_on_avx2_without_the_variable_says_openblas_chose_it():
    line = blas.generic_blas_line(openblas("Core2"), AVX2, {})
    assert "Core2" in line and "AVX2 CPU" in line and "OPENBLAS_CORETYPE" not in line


def test_a_kernel_for_the_cpu_or_a_cpu_without_avx2_says_nothing():
    assert blas.generic_blas_line(openblas("SkylakeX"), AVX512, {"OPENBLAS_CORETYPE": "SkylakeX"}) is None
    assert blas.generic_blas_line(openblas("Haswell"), AVX2, {}) is None
    assert blas.generic_blas_line(openblas("Prescott"), {"sse3", "avx"}, {}) is None  # nothing better to run
    assert blas.generic_blas_line(openblas("Prescott"), set(), {}) is None  # flags unknown (not Linux)


def test_other_blas_libraries_are_not_judged():
    mkl = [{"user_api": "blas", "internal_api": "mkl", "version": "2024", "architecture": None}]
    assert blas.generic_blas_line(mkl, AVX512, {}) is None
    assert blas.generic_blas_line([], AVX512, {}) is None


def test_this_machine_reads_its_own_blas_and_flags():
    line = blas.generic_blas_line()  # whatever this machine runs: None or the one line
    assert line is None or ("kernel" in line and "\n" not in line)


def test_say_if_generic_prints_the_line_or_nothing(monkeypatch, capsys):
    from labkit.base import machine
    monkeypatch.setattr(machine, "blas_info", lambda: openblas("Prescott"))
    monkeypatch.setattr(machine, "cpu_flags", lambda: AVX512)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    blas.say_if_generic()
    assert capsys.readouterr().out == blas.generic_blas_line() + "\n"
    monkeypatch.setattr(machine, "blas_info", lambda: openblas("SkylakeX"))
    blas.say_if_generic()
    assert capsys.readouterr().out == ""
