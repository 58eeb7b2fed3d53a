"""conv2d_im2col's workers and numpy's BLAS threads follow machine.cores() (LABKIT_CORES), and 02's bound on one
thread's im2col buffer holds on every core count from 1 to 128."""
import pytest

from labkit import conv
from labkit.conv import bench, numpy_engine


@pytest.fixture
def fresh_blas():
    """numpy_engine's BLAS handle made anew (its first use sets BLAS to machine.cores()), and put back after."""
    numpy_engine._blas, numpy_engine._cores_limit = None, None
    yield
    if numpy_engine._cores_limit is not None:
        numpy_engine._cores_limit.restore_original_limits()
    numpy_engine._blas, numpy_engine._cores_limit = None, None


@pytest.mark.parametrize("cores", [1, 3, 8])
def test_blas_threads_and_im2col_workers_follow_labkit_cores(monkeypatch, fresh_blas, cores):
    monkeypatch.setenv("LABKIT_CORES", str(cores))
    assert conv.blas_threads() == cores  # this machine has 2: 1 and 3, 8 are LABKIT_CORES's
    g = bench.RESNET50_LAYERS[0].geometry(8)  # 25,088 rows: 49 workers' worth
    chunks, workers = conv.plan(g, 64)
    assert workers == cores and len(chunks) >= cores


def test_a_narrower_blas_limit_still_bounds_the_workers(monkeypatch, fresh_blas):
    from threadpoolctl import threadpool_limits
    monkeypatch.setenv("LABKIT_CORES", "8")
    g = bench.RESNET50_LAYERS[0].geometry(8)
    assert conv.blas_threads() == 8  # first use: LABKIT_CORES's 8, as conv_bench makes it before its limit
    with threadpool_limits(limits=1, user_api="blas"):  # conv_bench(threads=1)
        assert conv.plan(g, 64)[1] == 1
    assert conv.plan(g, 64)[1] == 8


@pytest.mark.parametrize("profile", ["workshop", "full"])
def test_one_threads_im2col_buffer_is_under_a_hundredth_of_the_batch_on_1_to_128_cores(monkeypatch, profile):
    """02's assert (cell 'chunking shrinks each thread's im2col buffer'): chunk_sweep's columns, as the notebook
    reads them, on a machine of every core count (BLAS as wide as its cores)."""
    layer = bench.RESNET50_LAYERS[0]
    batch = bench.default_settings(profile)["batch_size"]
    g = layer.geometry(batch)
    monkeypatch.setattr(numpy_engine, "blas_threads", lambda: 128)
    whole = bench.chunk_buffer(g, None)["im2col buffer (MiB)"]
    total_fails = []
    for cores in range(1, 129):
        monkeypatch.setenv("LABKIT_CORES", str(cores))
        for cs in (64, 256, 1024, "auto", 8192, 32768):
            row = bench.chunk_buffer(g, bench._check_chunk_size(cs, g, "float32", layer.c_out))
            assert row["threads"] <= cores
            if cs == 64:
                assert row["im2col buffer (MiB)"] / row["threads"] < whole / 100, (cores, row)
                if row["im2col buffer (MiB)"] >= whole / 100:
                    total_fails.append(cores)
    # all threads' buffers together: not bounded so (an observation in 02), already on an 8-core machine
    assert (8 in total_fails) == (profile == "workshop") and total_fails
