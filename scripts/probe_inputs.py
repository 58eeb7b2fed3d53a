#!/usr/bin/env python
"""Probe labkit with the bad inputs found in review and count the answers: clear / traceback / silent.

  .venv/bin/python scripts/probe_inputs.py [--verbose]
  PYTHONPATH=/path/to/an/older/checkout .venv/bin/python scripts/probe_inputs.py    (count an older labkit)

clear:     a ValueError/TypeError (functions) or exit 2 with no traceback (commands) whose message names
           the parameter; traceback: any other exception or a command's traceback (or a message that does
           not name the parameter: 'unclear'); silent: the bad input was accepted (for `scale`: ranks were
           launched, seen through a stand-in horovodrun). Not a test: a report for
           whoever tracks the count (tests/course/test_bad_inputs.py holds the same cases as tests).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cli(argv, word, env_extra=None):
    def run(tmp: Path):
        env = {**os.environ, "LABKIT_PROFILE": "quick", **(env_extra or {})}
        env.pop("LABKIT_DEBUG", None)
        marker = tmp / "ranks-started"
        fake = tmp / "horovodrun"
        fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
        fake.chmod(0o755)
        env["LABKIT_HOROVODRUN"] = str(fake)
        args = [a.replace("{unwritable}", str(tmp / "a-file" / "x")).replace("{tmp}", str(tmp)) for a in argv]
        try:
            proc = subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                                  env=env, timeout=300, cwd=tmp)
        except subprocess.TimeoutExpired:
            return "silent", "still running after 300 s (the bad input was not refused)"
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        if marker.exists():
            return "silent", "accepted: ranks were launched"
        if "Traceback" in proc.stderr:
            return "traceback", last
        if proc.returncode == 2 and word in last:
            return "clear", last
        if proc.returncode == 0:
            return "silent", "exit 0"
        return "unclear", f"exit {proc.returncode}: {last}"
    return run


def _fn(call, word):
    def run(tmp: Path):
        try:
            call()
        except (ValueError, TypeError) as err:
            return ("clear" if word in str(err) else "unclear"), f"{type(err).__name__}: {err}"
        except Exception as err:  # noqa: BLE001  (counting what escapes is the point)
            return "traceback", f"{type(err).__name__}: {err}"
        return "silent", "no error"
    return run


def _import(primary, fallback):
    import importlib

    try:
        return importlib.import_module(primary)
    except ImportError:
        return importlib.import_module(fallback)


def _resume_mismatch(tmp: Path):
    from labkit import sweep
    from labkit.sweep import networks as netsweep

    cfg = netsweep.network_configs()[0]
    rec = sweep.run_config(lambda c: {"accuracy": 0.5, "memory_bytes": 1000}, cfg, name=netsweep.network_name(cfg),
                           settings=netsweep.NetworkTrainer.for_profile("quick", epochs=1).settings())
    (tmp / "sweep.jsonl").write_text(json.dumps(rec) + "\n")
    return _cli(["sweep", "--out", "{tmp}/sweep.jsonl", "--resume", "--epochs", "2", "--configs",
                 netsweep.network_name(cfg)], "--resume")(tmp)


def cases():
    import numpy as np

    def conv(x_shape, w_shape):
        from labkit import conv as c
        return lambda: c.conv2d_im2col(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32))

    def predict0():
        import tensorflow as tf

        from labkit.base import training
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, activation="softmax")])
        training.predict(model, np.zeros((3, 4), np.float32), batch_size=0)

    def flops_neg():
        from labkit import flops
        flops.training_flops(flops.FlopsReport(model="t", input_shape=(32, 32, 3), rows=[], trainable_params=0),
                             images=-5)

    def trainer0():
        ns = _import("labkit.sweep.networks", "labkit.sweep")
        ns.NetworkTrainer(epochs=0)

    return [
        ("scale --timeout nan", _cli(["scale", "--np", "1", "--timeout", "nan"], "--timeout")),
        ("scale --json unwritable", _cli(["scale", "--np", "1", "--json", "{unwritable}"], "--json")),
        ("scale --model resnet51", _cli(["scale", "--np", "1", "--model", "resnet51"], "model")),
        ("scale --threads 0", _cli(["scale", "--np", "1", "--threads", "0"], "--threads")),
        ("conv-bench --json unwritable", _cli(["conv-bench", "--json", "{unwritable}"], "--json")),
        ("sweep --out unwritable", _cli(["sweep", "--out", "{unwritable}"], "--out")),
        ("sweep --resume other settings", _resume_mismatch),
        ("LABKIT_PROFILE=bogus data where", _cli(["data", "where"], "LABKIT_PROFILE", {"LABKIT_PROFILE": "bogus"})),
        ("LABKIT_PROFILE=bogus conv-bench", _cli(["conv-bench"], "LABKIT_PROFILE", {"LABKIT_PROFILE": "bogus"})),
        ("LABKIT_PROFILE=bogus sweep", _cli(["sweep"], "LABKIT_PROFILE", {"LABKIT_PROFILE": "bogus"})),
        ("data fetch --dir unwritable", _cli(["data", "fetch", "cifar10", "--dir", "{unwritable}"], "--dir")),
        ("training_flops(images=-5)", _fn(flops_neg, "images")),
        ("ring_allreduce_time(alpha=-1)", _fn(lambda: _import("labkit.scale.allreduce", "labkit.scale.scaling")
                                              .ring_allreduce_time(1e6, 4, alpha=-1, beta=1e-9), "alpha")),
        ("fit_alpha_beta(zero times)", _fn(lambda: _import("labkit.scale.allreduce", "labkit.scale.scaling")
                                           .fit_alpha_beta([1e3, 1e6, 1e7], [0.0, 0.0, 0.0], p=2), "times")),
        ("matlab_param_count(filters=-5)", _fn(
            lambda: _import("labkit.sweep.networks", "labkit.sweep").matlab_param_count(
                {"filters": -5, "filter_size": 3, "pool_size": 2}), "filters")),
        ("NetworkTrainer(epochs=0)", _fn(trainer0, "epochs")),
        ("conv2d_im2col N=0", _fn(conv((0, 8, 8, 3), (3, 3, 3, 4)), "N")),
        ("conv2d_im2col C=0", _fn(conv((1, 8, 8, 0), (3, 3, 0, 4)), "C")),
        ("conv2d_im2col C_out=0", _fn(conv((1, 8, 8, 3), (3, 3, 3, 0)), "C_out")),
        ("allreduce.predict(batch_per_gpu=0)", _fn(
            lambda: _import("labkit.scale.allreduce", "labkit.scale.scaling").predict(
                (1, 2, 4), batch_per_gpu=0), "batch_per_gpu")),
        ("training.predict(batch_size=0)", _fn(predict0, "batch_size")),
        ("take_slots(['a:x'])", _fn(
            lambda: _import("labkit.scale.launch", "labkit.scale.scaling").take_slots(["a:x"], 1), "a:x")),
        ("models.get(input_shape=(4,4,3))", _fn(lambda: __import__("labkit.models", fromlist=["get"]).get(
            "resnet50", input_shape=(4, 4, 3)), "input_shape")),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print each case's answer")
    args = parser.parse_args()
    counts = {"clear": 0, "unclear": 0, "traceback": 0, "silent": 0}
    for name, probe in cases():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "a-file").write_text("")
            try:
                verdict, detail = probe(Path(tmp))
            except Exception as err:  # noqa: BLE001  (the probe's own set-up failed)
                verdict, detail = "traceback", f"probe set-up: {type(err).__name__}: {err}"
        counts[verdict] += 1
        print(f"{verdict:<9} {name:<34} {detail[:150] if args.verbose or verdict != 'clear' else ''}".rstrip(),
              flush=True)
    total = sum(counts.values())
    print(f"\n{total} bad inputs: {counts['clear']} clear, {counts['traceback']} traceback, "
          f"{counts['silent']} silent, {counts['unclear']} refused without naming the parameter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
