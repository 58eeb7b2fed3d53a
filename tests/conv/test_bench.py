"""labkit.base.timing and labkit.conv.bench: timing rules (warm-up excluded, median, best, spread, side by side),
conv-bench."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import labkit  # noqa: F401
from labkit.base import timing
from labkit.conv import bench, bench_cli


def test_warmup_is_excluded_from_the_timing():
    calls = []

    def slow_first_call():
        calls.append(1)
        time.sleep(0.3 if len(calls) == 1 else 0.001)

    t = bench.timeit(slow_first_call, repeats=5, warmup=1, min_time=0.0)
    assert len(t.times) == 5 and len(calls) == 6
    assert t.median < 0.1


def test_timing_median_spread_and_rate():
    t = bench.Timing([0.4, 0.1, 0.2, 0.3, 0.5])
    assert t.median == pytest.approx(0.3)
    assert t.spread == pytest.approx(0.2)  # 75th - 25th percentile: 0.4 - 0.2
    assert t.gflops(3e9) == pytest.approx(10.0)
    assert t.best == pytest.approx(0.1) and t.gflops(3e9, "best") == pytest.approx(30.0)
    with pytest.raises(ValueError, match="stat"):
        t.gflops(1.0, "mean")


def test_compare_times_side_by_side_in_rotating_order():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timings = bench.compare(fns, repeats=3, warmup=1, min_time=0.0)
    assert set(timings) == {"a", "b", "c"} and all(len(t.times) == 3 for t in timings.values())
    assert order[3:] == list("abc" "bca" "cab")  # after one warm-up call each


def test_cpu_time_clock_ignores_waiting():
    wall = bench.timeit(lambda: time.sleep(0.02), repeats=3)
    cpu = bench.timeit(lambda: time.sleep(0.02), repeats=3, clock=time.process_time)
    assert wall.median >= 0.02 and cpu.median < 0.01  # sleeping costs time, not CPU


def test_short_calls_are_repeated_until_measurable():
    t = bench.timeit(lambda: None, repeats=3, min_time=0.002)
    assert t.number > 10


def test_bad_repeats_name_the_parameter():
    with pytest.raises(ValueError, match="repeats"):
        bench.timeit(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        bench.compare({"a": lambda: None}, warmup=-1)


def test_gemm_rate_is_measured():
    rate = bench.gemm_rate(256, 256, 256, repeats=3)
    assert np.isfinite(rate) and 0.1 < rate < 1e5  # GFLOP/s: between a slow laptop and a whole GPU
    for bad in ({"m": 0}, {"k": -5}, {"n": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            timing.gemm_rate(**bad)


def test_resnet50_layers_follow_he_et_al_table_1():
    # Table 1 of He et al. (2016), 50-layer column: output sizes and [1x1, 3x3, 1x1] widths per stage
    table = {56: (64, 256), 28: (128, 512), 14: (256, 1024), 7: (512, 2048)}
    layers = bench.RESNET50_LAYERS
    assert len(layers) == 12
    for layer in layers:
        width, out = table[layer.size]
        expected = {3: (width, width), 1: (out, width) if "reduce" in layer.name else (width, out)}[layer.kernel]
        assert (layer.c_in, layer.c_out) == expected
    # conv2_x's 3x3 at batch 1: a 3136 x 576 x 64 GEMM, 231.2 MFLOP
    g = layers[0].geometry(1)
    assert g.cols_shape == (3136, 576) and g.flops(64) == 231_211_008


def test_conv_bench_on_small_layers():
    layers = [bench.ConvLayer("small 3x3", 8, 4, 6, 3), bench.ConvLayer("small 1x1", 8, 6, 4, 1)]
    result = bench.conv_bench(layers, batch_size=2, repeats=2, naive_size=3)
    assert [r.layer for r in result.layers] == ["small 3x3", "small 1x1"]
    row = result.layers[0]
    assert row.gemm_mkn == (2 * 8 * 8, 9 * 4, 6) and row.gflop == pytest.approx(2 * 128 * 36 * 6 / 1e9)
    assert set(row.gflops) == {"im2col", "im2col_tf", "tf", "gemm", "tf_gemm", "naive"}
    assert row.ratios["im2col_vs_tf"] == pytest.approx(row.gflops["im2col"] / row.gflops["tf"])
    # the tf engine against tf.nn.conv2d and against its own GEMM (TensorFlow's matmul of the same shape)
    assert row.ratios["im2col_tf_vs_tf"] == pytest.approx(row.gflops["im2col_tf"] / row.gflops["tf"])
    assert row.ratios["im2col_tf_vs_tf_gemm"] == pytest.approx(row.gflops["im2col_tf"] / row.gflops["tf_gemm"])
    assert row.ratios["tf_gemm_vs_tf"] == pytest.approx(row.gflops["tf_gemm"] / row.gflops["tf"])
    # stat="best": GFLOP/s at the fastest repeat
    assert row.gflops["im2col"] == pytest.approx(row.gflop / (row.best_ms["im2col"] / 1e3))
    assert row.naive_shape[:4] == (1, 3, 3, 4)
    d = json.loads(json.dumps(result.to_dict(), default=float))
    assert set(d["summary"]) == {"3x3", "1x1"} and "targets" not in d
    assert d["onednn"] in (True, False) and d["stat"] == "best"
    text = str(result)
    assert "im2col/tf" in text and "im2tf/tfgemm" in text and "small 3x3" in text and "oneDNN kernels" in text
    assert not any(word in text for word in ("target", "-> met", "MISSED"))
    assert list(result.to_dataframe().index) == ["small 3x3", "small 1x1"]


def test_conv_bench_paired_ratios_are_medians_of_per_round_ratios():
    layers = [bench.ConvLayer("small 3x3", 8, 4, 6, 3)]
    result = bench.conv_bench(layers, batch_size=2, repeats=5, naive=False, stat="paired")
    row = result.layers[0]
    t = {name: np.array(v) for name, v in row.times_ms.items()}
    assert all(len(v) == 5 for v in t.values())
    # speed ratio im2col_tf/tf in one round = tf's time / im2col_tf's time in that round
    assert row.ratios["im2col_tf_vs_tf"] == pytest.approx(np.median(t["tf"] / t["im2col_tf"]))
    assert row.ratios["im2col_vs_gemm"] == pytest.approx(np.median(t["gemm"] / t["im2col"]))
    assert row.gflops["tf"] == pytest.approx(row.gflop / (np.median(t["tf"]) / 1e3))
    assert "median over rounds" in str(result)
    with pytest.raises(ValueError, match="stat must be"):
        bench.conv_bench(layers, stat="mean")


def test_conv_bench_im2col_vs_tf_only_prints_the_per_layer_table(capsys):
    """`labkit conv-bench --methods im2col,tf --stat paired`: only those two alternate; one row per layer."""
    layers = [bench.ConvLayer("tiny 3x3", 6, 3, 4, 3), bench.ConvLayer("tinier 3x3", 4, 4, 2, 3)]
    result = bench.conv_bench(layers, batch_size=1, repeats=3, stat="paired", methods=["tf", "im2col"])
    assert result.methods == ("im2col", "tf")
    for row in result.layers:
        assert set(row.times_ms) == {"im2col", "tf"} and set(row.ratios) == {"im2col_vs_tf"}
        assert row.ratios["im2col_vs_tf"] == pytest.approx(np.median(np.divide(row.times_ms["tf"],
                                                                               row.times_ms["im2col"])))
    lines = str(result).splitlines()
    head = next(line for line in lines if line.startswith("layer"))
    assert head.split() == ["layer", "M", "x", "K", "x", "N", "im2col", "tf", "im2col/tf"]
    assert [line.split()[0:2] for line in lines if line.startswith("tin")] == [["tiny", "3x3"], ["tinier", "3x3"]]
    assert "oneDNN kernels" in str(result) and "threads: numpy BLAS" in str(result)
    d = json.loads(json.dumps(result.to_dict(), default=float))
    assert d["methods"] == ["im2col", "tf"] and set(d["summary"]["3x3"]) == {"im2col_vs_tf"}
    for bad in ("im2col", [], ["im2col", "winograd"]):
        with pytest.raises(ValueError, match="methods must be"):
            bench.conv_bench(layers, methods=bad)
    with pytest.raises(SystemExit) as exit_:
        bench_cli.cli_main(["--methods", "im2col,fft"])
    assert exit_.value.code == 2 and "--methods" in capsys.readouterr().err


def test_conv_bench_cpu_time_and_bad_threads():
    layers = [bench.ConvLayer("small 3x3", 8, 4, 6, 3)]
    result = bench.conv_bench(layers, batch_size=2, repeats=2, naive=False, cpu_time=True)
    assert result.clock == "cpu" and "CPU time" in str(result) and "naive" not in result.layers[0].gflops
    assert result.threads["blas"] >= 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            bench.conv_bench(layers, batch_size=1, repeats=1, threads=bad)


def test_chunk_sweep_reports_memory_and_rate():
    layer = bench.ConvLayer("t", 16, 8, 8, 3)
    df = bench.chunk_sweep(layer, chunk_sizes=(16, 64, "auto", None), batch_size=2, repeats=2, threads=1)
    assert list(df.index) == [16, 64, f"auto ({2 * 2**20 // (72 * 4)})", "whole batch"]
    # the whole-batch buffer is the full matrix: 2*16*16 rows x 72 columns x 4 bytes
    assert df.loc["whole batch", "im2col buffer (MiB)"] == round(2 * 256 * 72 * 4 / 2**20, 2)
    assert df.loc[16, "GEMMs"] == 32 and df.loc["whole batch", "GEMMs"] == 1
    assert (df["GFLOP/s"] > 0).all()


def test_cli_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_cli.cli_main(["--help"])
    assert exit_.value.code == 0 and "--json" in capsys.readouterr().out
    for bad in (["--threads", "0"], ["--batch-size", "0"], ["--kernels", "5"], ["--kernels", "x"],
                ["--chunk-size", "-1"], ["--chunk-size", "x"],
                ["--stat", "mean"]):
        with pytest.raises(SystemExit) as exit_:
            bench_cli.cli_main(bad)
        assert exit_.value.code == 2


def test_unwritable_json_fails_before_any_compute(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "conv_bench", lambda **kw: pytest.fail("computed before checking --json"))
    for bad in (tmp_path / "no-such-folder" / "out.json", tmp_path):
        assert bench_cli.cli_main(["--json", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--json" in err and "Traceback" not in err


def test_unknown_profile_fails_before_any_compute(monkeypatch, capsys):
    monkeypatch.setattr(bench, "conv_bench", lambda **kw: pytest.fail("computed with an unknown profile"))
    monkeypatch.setenv("LABKIT_PROFILE", "bogus")
    assert bench_cli.cli_main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LABKIT_PROFILE" in err


def test_conv_bench_rejects_bad_arguments_before_compute():
    for kwargs, name in (({"batch_size": 0}, "batch_size"), ({"repeats": -1}, "repeats"), ({"stat": "mean"}, "stat")):
        with pytest.raises(ValueError, match=name):
            bench.conv_bench([bench.ConvLayer("t", 4, 2, 2, 3)], **kwargs)


@pytest.mark.slow
def test_conv_bench_command_quick_profile(tmp_path):
    """`labkit conv-bench --json FILE` as CI runs it: every ResNet-50 layer, ratios in the JSON."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, LABKIT_PROFILE="quick")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "labkit", "conv-bench", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - start < 180  # the target is < 60 s; slack for a shared CI machine
    d = json.loads(out.read_text())
    assert d["profile"] == "quick" and d["batch_size"] == 2 and len(d["layers"]) == 12
    assert all({"im2col_vs_tf", "im2col_vs_gemm", "im2col_tf_vs_tf", "im2col_tf_vs_tf_gemm", "im2col_vs_naive"}
               <= set(r["ratios"]) for r in d["layers"])
    assert "OPENBLAS_CORETYPE" in d["openblas_env"] and d["blas"] and "oneDNN kernels" in d["machine"]
    assert "im2col/gemm" in proc.stdout and "GFLOP/s" in proc.stdout


def test_summary_is_the_geometric_mean_and_names_the_worst_layer():
    def row(name, kernel, im2col, tf, gemm, naive):
        return bench.LayerResult(name, kernel, (1, 1, 1, 1), (1, 1, 1), 1.0,
                                 {"im2col": im2col, "tf": tf, "gemm": gemm, "naive": naive}, {}, {})

    result = bench.BenchResult("quick", 1, 1, "auto", 1.0, "", {}, [],
                               [row("a", 3, 90, 100, 100, 0.1), row("b", 3, 40, 100, 50, 0.1),
                                row("c", 1, 10, 1, 1, 1)])
    s = result.summary()
    assert s["3x3"]["im2col_vs_tf"]["geomean"] == pytest.approx((0.9 * 0.4) ** 0.5)
    assert s["3x3"]["im2col_vs_tf"]["worst"] == pytest.approx(0.4) and s["3x3"]["im2col_vs_tf"]["worst_layer"] == "b"
    assert s["3x3"]["im2col_vs_gemm"]["geomean"] == pytest.approx((0.9 * 0.8) ** 0.5)
    assert s["1x1"]["im2col_vs_naive"]["worst"] == pytest.approx(10) and "tf_gemm_vs_tf" not in s["3x3"]
    assert "im2col/tf 0.60x (0.40x b)" in str(result)


def test_report_names_the_load_and_the_gemm_size():
    result = bench.BenchResult("quick", 1, 1, "auto", 50.0, "", {}, [], [], [9.0, 10.0], machine_gemm_size=1024)
    text = str(result)
    assert "numpy, 1024^3): 50.0 GFLOP/s" in text
    assert "other work (cores' worth; the load average, or a CPU-limited container's own use) 9.0 -> 10.0 on" in text
    assert ("other programs competed" in text) == (10.0 > 0.5 * os.cpu_count())


@pytest.mark.slow
def test_conv_bench_command_single_core_cpu_time():
    env = dict(os.environ, LABKIT_PROFILE="quick")
    proc = subprocess.run([sys.executable, "-m", "labkit", "conv-bench", "--threads", "1", "--cpu-time", "--kernels",
                           "3", "--no-naive", "--batch-size", "1", "--repeats", "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "BLAS and im2col workers 1, TensorFlow intra-op 1, inter-op 1" in proc.stdout and "CPU time" in proc.stdout
    assert proc.stdout.count(" 3x3 ") >= 4


def test_ratio_table_and_plot_show_the_ratios_the_notebook_reads():
    import matplotlib

    matplotlib.use("Agg")
    layers = [bench.ConvLayer("small 3x3", 8, 4, 6, 3), bench.ConvLayer("small 1x1", 8, 6, 4, 1)]
    result = bench.conv_bench(layers, batch_size=2, repeats=2, naive_size=3)
    table = result.ratio_table()
    assert list(table.columns) == ["M x K x N", "im2col/tf", "im2col/gemm", "gemm/tf", "tfgemm/tf", "im2tf/tfgemm",
                                   "im2col/naive"]
    row = result.layers[0]  # each column against the GFLOP/s it is the ratio of
    assert table.loc["small 3x3", "im2tf/tfgemm"] == pytest.approx(row.gflops["im2col_tf"] / row.gflops["tf_gemm"],
                                                                   abs=0.006)
    assert table.loc["small 3x3", "im2col/naive"] == pytest.approx(row.gflops["im2col"] / row.gflops["naive"], abs=0.6)
    header = result.header()
    assert header.startswith("conv-bench: profile=") and "load average" in header and "small 3x3" not in header
    ax = result.plot_ratios()
    assert ax.get_yscale() == "linear" and len(ax.patches) == 4 * 2
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == pytest.approx(sorted(row.ratios[k] for row in result.layers
                                           for k in ("im2col_vs_gemm", "im2col_tf_vs_tf_gemm", "gemm_vs_tf",
                                                     "tf_gemm_vs_tf")))
    with pytest.raises(ValueError, match="ratios must be"):
        result.ratio_table(["im2col_vs_everything"])
