"""`labkit conv-bench`: the parser, the checks made before any compute, and the one writer of --json (02_im2col).

Everything the command line can get wrong is said in one line before TensorFlow starts: a bad number, an
unwritable or full --json, and a --json another `labkit conv-bench` is writing (two runs at once would both
say "wrote" and the file would hold one: the second is refused, naming the first one's pid).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from labkit.base import resultsfile
from labkit.conv import bench

OWN = resultsfile.json_document("layers")  # what conv-bench's --json holds: no other existing file is replaced


def _unwritable(path: str) -> str:
    """Why `path` cannot be written as a file ('' when it can): checked before minutes of compute."""
    target = Path(path)
    if target.is_dir():
        return "is a folder; give a file name"
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        return f"{folder} is not a folder" if folder.exists() else f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return "not writable"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labkit conv-bench",
        description="Time naive loops, im2col + GEMM (numpy and TensorFlow engines), tf.nn.conv2d and bare GEMMs "
                    "(numpy's, TensorFlow's) on "
                    "ResNet-50's 3x3 and 1x1 conv layers (float32, one process, warm-up excluded, round-robin "
                    "repeats). Batch size and repeats follow LABKIT_PROFILE.",
        epilog="For a fair BLAS: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE labkit conv-bench",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results (GFLOP/s, ratios, machine) as JSON")
    parser.add_argument("--batch-size", type=int, help="images per batch (default: by profile, quick=2, workshop=8)")
    parser.add_argument("--repeats", type=int, help="timed repeats per method (default: by profile)")
    parser.add_argument("--chunk-size", default="auto",
                        help="im2col rows per GEMM: 'auto' (default, about 2 MiB), a number, or 0 = whole batch, "
                             "one GEMM")
    parser.add_argument("--kernels", default="3,1", help="which layers: '3', '1' or '3,1' (default)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive loops")
    parser.add_argument("--methods", default=",".join(bench.METHODS),
                        help=f"which methods to time, comma-separated (default: all of {','.join(bench.METHODS)}); "
                             "'im2col,tf' alternates just those two, each pair back to back")
    parser.add_argument("--threads", type=int,
                        help="threads for every method (default: BLAS's and TensorFlow's own); 1 compares single "
                             "cores")
    parser.add_argument("--stat", choices=("best", "median", "paired"), default="best",
                        help="GFLOP/s and ratios at each method's fastest repeat (default: other programs only "
                             "ever slow a repeat down), at the median, or 'paired': each ratio taken within every "
                             "round-robin round, median over the rounds")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by CPU time (all threads) instead of wall-clock: GFLOP/s per busy core, "
                             "hardly moved by other programs; best with --threads 1")
    return parser


def _checked(parser, args) -> tuple[set, list]:
    """(kernels, methods) from args; a bad value ends the command through parser.error (one line, exit 2)."""
    for name in ("batch_size", "repeats", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.chunk_size != "auto":
        if not args.chunk_size.isdigit():
            parser.error(f"--chunk-size must be 'auto' or a number >= 0; got {args.chunk_size!r}")
        args.chunk_size = int(args.chunk_size) or None
    try:
        kernels = {int(k) for k in args.kernels.split(",")}
    except ValueError:
        parser.error(f"--kernels must be a comma-separated list of 3 and 1; got {args.kernels!r}")
    if not kernels or not kernels <= {1, 3}:
        parser.error(f"--kernels must be a comma-separated list of 3 and 1; got {args.kernels!r}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or not set(methods) <= set(bench.METHODS):
        parser.error(f"--methods must be a comma-separated list of {','.join(bench.METHODS)}; got {args.methods!r}")
    return kernels, methods


def _json_problem(path) -> str:
    """Why --json cannot take this run's results ('' when it can): unwritable, no room (the old copy stays
    until the new one is complete, so both must fit)."""
    problem = _unwritable(path)
    if problem:
        return f"--json {path}: {problem}"
    try:
        resultsfile.check_target(path, "--json", own=OWN)
        resultsfile.check_space(path, resultsfile.RESULTS_RESERVE_BYTES, "--json")
    except ValueError as err:
        return str(err)
    return ""


def cli_main(argv: list) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    kernels, methods = _checked(parser, args)
    try:
        bench.default_settings()  # an unknown LABKIT_PROFILE, before TensorFlow starts
    except ValueError as err:
        print(f"labkit conv-bench: {err}", file=sys.stderr)
        return 2
    problem = _json_problem(args.json) if args.json else ""
    if problem:
        print(f"labkit conv-bench: {problem}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as held:
        if args.json:  # held for the whole run: a second run on the same file is refused now, not lost later
            try:
                held.enter_context(resultsfile.locked(args.json, timeout=0))
            except TimeoutError as err:
                print(f"labkit conv-bench: --json {err}", file=sys.stderr)
                return 2
        return _run(args, kernels, methods)


def _run(args, kernels, methods) -> int:
    start = time.perf_counter()
    result = bench.conv_bench(layers=[layer for layer in bench.RESNET50_LAYERS if layer.kernel in kernels],
                              batch_size=args.batch_size, repeats=args.repeats, chunk_size=args.chunk_size,
                              naive=not args.no_naive, threads=args.threads, cpu_time=args.cpu_time,
                              stat=args.stat, methods=methods,
                              progress=lambda row: print(f"  {row.layer}: done", file=sys.stderr, flush=True))
    print()
    print(result)
    print(f"total wall time {time.perf_counter() - start:.1f} s")
    if args.json:
        resultsfile.write_json(args.json, result.to_dict(), indent=1, default=float)
        print(f"wrote {args.json}")
    return 0
