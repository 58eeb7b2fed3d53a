"""labkit.scale.hvd_train against Horovod's own synthetic benchmark, side by side, interleaved.

    python scripts/bench_hvd_peer.py --peer /tmp/peer/tensorflow2_synthetic_benchmark.py --rounds 3

Each round starts one process of each contender, one after the other (the order alternates every round,
so neither always gets the cooler machine): `python -m labkit.scale.hvd_train --model resnet50 --data random`
(one fixed random batch at 224 px, as the peer feeds) and, if --peer names it, Horovod's
examples/tensorflow2/tensorflow2_synthetic_benchmark.py (not shipped here: fetch it from the Horovod
repository). Both: one rank, one CPU process, the same batch, warm-up steps untimed, the same number of
timed steps. Printed: images/s of each per round, the ratio labkit/peer per round and its median, and the
configuration (TensorFlow version, oneDNN on/off, cores, threads, batch, model). Extra contenders:
--variant 'label=--inter-threads 1' runs hvd_train with those extra arguments as well.
Without --peer only the labkit contenders run. (04_horovod_scaling)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv):
    p = argparse.ArgumentParser(prog="scripts/bench_hvd_peer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", default=None, help="path of Horovod's tensorflow2_synthetic_benchmark.py")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="timed steps per process")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps per process (after tracing)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process of each per round)")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                   help="another hvd_train contender with these extra arguments (repeatable)")
    p.add_argument("--json", default=None, help="also write the rounds and the summary here")
    a = p.parse_args(argv)
    for name in ("batch_size", "steps", "rounds", "warmup_steps"):
        if getattr(a, name) < (0 if name == "warmup_steps" else 1):
            p.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'warmup_steps' else 1}; "
                    f"got {getattr(a, name)}")
    if a.peer is not None and not Path(a.peer).is_file():
        p.error(f"--peer must be the path of tensorflow2_synthetic_benchmark.py; no file at {a.peer!r}")
    for v in a.variant:
        if "=" not in v or not v.split("=", 1)[0].strip():
            p.error(f"--variant must be LABEL=ARGS; got {v!r}")
    return a


def _run_labkit(a, extra):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "labkit.scale.hvd_train", "--model", "resnet50", "--data", "random",
               "--image-size", "224", "--classes", "1000", "--batch-size", str(a.batch_size),
               "--steps", str(a.steps), "--repeats", "1", "--warmup-steps", str(a.warmup_steps), "--out", out,
               *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"labkit.scale.hvd_train failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        r = json.loads((Path(out) / "rank0.json").read_text())
    return r["images_per_sec"], {"threads": r["threads"]}


def _run_peer(a):
    # the first step (tracing + broadcast) is untimed there too; then warmup_steps, then steps timed
    cmd = [sys.executable, a.peer, "--no-cuda", "--model", "ResNet50", "--batch-size", str(a.batch_size),
           "--num-warmup-batches", str(a.warmup_steps), "--num-batches-per-iter", str(a.steps), "--num-iters", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    m = re.search(r"Img/sec per CPU: ([0-9.]+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"the peer failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}")
    return float(m.group(1)), {}


def _config(a) -> dict:
    import labkit  # noqa: F401  (TF's log level, before TensorFlow loads)
    # isort: split
    import tensorflow as tf

    from labkit.base import machine
    return {"tensorflow": tf.__version__, "onednn": machine.tf_onednn_enabled(), "cores": machine.cores(),
            "model": "ResNet-50 (keras.applications, 224 px)", "batch_size": a.batch_size,
            "timed_steps": a.steps, "warmup_steps": a.warmup_steps, "ranks": 1, "device": "CPU",
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(unset: TensorFlow's default)")}


def main(argv=None) -> int:
    a = _parse(argv)
    if a.json:  # room for the results now, not after the rounds
        from labkit.base import resultsfile
        resultsfile.check_space(a.json, resultsfile.RESULTS_RESERVE_BYTES, "--json")
    contenders = [("labkit", [])] + [(v.split("=", 1)[0].strip(), shlex.split(v.split("=", 1)[1]))
                                     for v in a.variant]
    runners = [(label, lambda extra=extra: _run_labkit(a, extra)) for label, extra in contenders]
    if a.peer:
        runners.append(("peer", lambda: _run_peer(a)))
    cfg = _config(a)
    print("configuration:", json.dumps(cfg))
    rounds = []
    for i in range(a.rounds):
        order = runners if i % 2 == 0 else runners[::-1]
        row = {}
        for label, fn in order:
            ips, info = fn()
            row[label] = ips
            if info:
                cfg.setdefault(f"{label}_threads", info.get("threads"))
        rounds.append(row)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f} images/s" for k, v in row.items())
              + "".join(f", {k}/peer {row[k] / row['peer']:.3f}" for k in row if k != "peer" and "peer" in row),
              flush=True)
    summary = {label: {"images_per_sec_median": statistics.median(r[label] for r in rounds)}
               for label, _ in runners}
    if a.peer:
        for label, _ in runners[:-1]:
            ratios = [r[label] / r["peer"] for r in rounds]
            summary[label]["ratio_to_peer_median"] = statistics.median(ratios)
            summary[label]["ratios"] = ratios
    for label, s in summary.items():
        print(f"{label}: median {s['images_per_sec_median']:.2f} images/s"
              + (f", median ratio to the peer {s['ratio_to_peer_median']:.3f}x" if "ratio_to_peer_median" in s
                 else ""))
    if a.json:
        from labkit.base import resultsfile
        resultsfile.write_json(a.json, {"config": cfg, "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
