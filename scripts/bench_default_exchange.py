#!/usr/bin/env python
"""The exchange on the path learners take: `labkit scale --np 1,2 --threads 1` (default launcher and settings)
against the same ranks without the exchange, once per round (issue 29's "0.9 of no-sync" check).

    .venv/bin/python scripts/bench_default_exchange.py [--rounds 3] [--separate] [--json out.json]

Each round is one scaling.run_paired([1, 2]): per worker count one launch whose ranks time the synced steps and
the same steps without the exchange in alternating blocks, so launch-to-launch differences (core placement,
clock) stay out of the ratio. --separate instead runs scaling.run([1, 2]) with the exchange and with --no-sync
as launches of their own, in alternating order (ABBA), as before. Each round prints both weak-scaling
efficiencies and their ratio (with / without), the number the goal is stated in, the same ratio from the fastest
tenth of steps (p10: less sensitive to other processes), the np=2 images/s of both, the configuration, the
launcher the default chose, and the load average before and after.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.scale import launch, scaling  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--np", default="1,2", help="worker counts (default 1,2)")
    p.add_argument("--separate", action="store_true",
                   help="the exchange and its control as two launches per round (ABBA), not one paired launch")
    p.add_argument("--json", default=None, help="write the rounds here")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1; got {a.rounds}")
    nps = [int(n) for n in a.np.split(",")]
    print(launch.choose_launcher()[2])
    print(f"configuration: labkit scale defaults (model {scaling.DEFAULT_MODEL}, batch 64 per worker, 20 steps x 3 "
          f"repeats, 5 warm-up, synthetic data), --np {a.np} --threads 1; {os.cpu_count()} CPUs; "
          f"{'two launches per round (ABBA)' if a.separate else 'one paired launch per np per round'}", flush=True)
    rounds = []
    for r in range(a.rounds):
        before = load()
        if a.separate:
            order = (True, False) if r % 2 == 0 else (False, True)  # ABBA: a drift in load falls on both alike
            runs = {sync: scaling.run(nps, threads=1, sync=sync, progress=False, timeout=600) for sync in order}
        else:  # the ranks alternate the two themselves (ABBA blocks in each launch)
            runs = dict(zip((True, False), scaling.run_paired(nps, threads=1, progress=False, timeout=600)))
        after = load()
        top = max(nps)
        eff = {sync: float(df.loc[df["np"] == top, "efficiency"].iloc[0]) for sync, df in runs.items()}
        ips = {sync: float(df.loc[df["np"] == top, "images_per_sec"].iloc[0]) for sync, df in runs.items()}
        # the same from each run's fastest tenth of steps: what a shared machine's quiet moments allow
        p10 = {sync: float(df.loc[df["np"] == top, "p10_efficiency"].iloc[0]) for sync, df in runs.items()}
        row = {"round": r + 1, "mode": "separate" if a.separate else "paired",
               "efficiency": eff[True], "no_sync_efficiency": eff[False],
               "ratio": eff[True] / eff[False], "p10_ratio": p10[True] / p10[False],
               "images_per_sec": ips[True], "no_sync_images_per_sec": ips[False],
               "in_sync": bool(runs[True]["in_sync"].all()), "controller": runs[True]["controller"].iloc[-1],
               "tuning": runs[True]["tuning"].iloc[-1], "load_before": before, "load_after": after}
        rounds.append(row)
        print(f"round {r + 1}: np={top} efficiency {eff[True]:.3f} with the exchange ({row['controller']}), "
              f"{eff[False]:.3f} without: ratio {row['ratio']:.3f} (uncontended steps: {row['p10_ratio']:.3f}); "
              f"images/s {ips[True]:,.0f} vs {ips[False]:,.0f} "
              f"({ips[True] / ips[False]:.3f}); checksums {'equal' if row['in_sync'] else 'DIFFER'}; "
              f"load {before} -> {after}", flush=True)
    ratios = [r["ratio"] for r in rounds]
    print(f"ratio with / without the exchange over {len(ratios)} round(s), {rounds[0]['mode']}: median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f} .. {max(ratios):.3f}")
    if a.json:
        from labkit.base import resultsfile
        resultsfile.write_json(a.json, {"rounds": rounds})
    return 0 if all(r["in_sync"] for r in rounds) else 3


if __name__ == "__main__":
    sys.exit(main())
