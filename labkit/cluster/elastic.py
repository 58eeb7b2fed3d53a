"""Horovod Elastic on the virtual cluster: a node taken away mid-run and given back, training going on meanwhile
(08_training_on_the_cluster).

`run(settings)` writes a host-discovery script that prints a hosts file this module controls, starts
`horovodrun --gloo --min-np 1 --max-np N --host-discovery-script ...` on the first node of scripts/vcluster.sh's
cluster (labkit.deepdive.vcluster: ranks reached by ssh; local=True: N slots of this machine instead, no root
needed), and runs labkit.cluster.elastic_train, whose every process logs each step as a JSON line. Following the
steps it does each of settings.actions in turn once the world has trained settings.steps_per_phase steps at its
present size: "remove" takes the last node out of the hosts file (the workers reset at their next commit, none
lost), "kill" also kills that node's worker at once (a lost node: the others go back to their last commit), "add"
gives it back (a new worker starts there and gets the state from rank 0). Then it asks the workers to stop.
`summarize` turns the logs into world size and step against wall time and, at each change of the world, the time
lost: the gap between the last step before and the first step after, less one steady step of the new world.
`load_results()` reads the committed copy (notebooks/results/elastic.json) for machines without root; `plot` draws
it. Every process is stopped and the temporary folder removed at the end, on an error and on Ctrl-C.
TensorFlow is never imported here: the workers import it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from labkit.base.checks import check_int, check_number

MODULE = "labkit.cluster.elastic_train"
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "notebooks" / "results" / "elastic.json"
ACTIONS = ("remove", "kill", "add")


@dataclasses.dataclass(frozen=True)
class ElasticSettings:
    """One elastic run's sizes and what happens to the cluster during it."""
    nodes: int = 3  # workers at the start, one per node (the most, --max-np)
    actions: tuple = ("remove", "add", "kill", "add")  # done in turn, each on the last node
    steps_per_phase: int = 150  # steps at each world size before the next action (and before the stop)
    commit_every: int = 10  # steps between commits of the elastic state
    batch_size: int = 16  # per worker
    num_examples: int = 2000  # labkit's offline synthetic set
    width: int = 8  # small_cnn's first layer
    lr: float = 0.01
    threads: int = 1  # per worker
    seed: int = 0
    max_steps: int = 100_000  # the workers' own limit, past any run the actions make
    timeout: float = 300  # seconds for the whole run

    def check(self) -> ElasticSettings:
        """ValueError naming the first setting out of range, in one line; else self."""
        check_int(self.nodes, "nodes", minimum=2)
        if not isinstance(self.actions, (tuple, list)) or any(a not in ACTIONS for a in self.actions):
            raise ValueError(f"actions must be a sequence of {', '.join(ACTIONS)}; got {self.actions!r}")
        away = 0
        for a in self.actions:  # one node at most is away at a time: taken away, then given back
            away += 1 if a != "add" else -1
            if away not in (0, 1):
                raise ValueError(f"actions must alternate taking the node away (remove or kill) and giving it back "
                                 f"(add), starting with taking it away; got {self.actions!r}")
        for name, least in (("steps_per_phase", 1), ("commit_every", 1), ("batch_size", 1), ("num_examples", 1),
                            ("width", 1), ("threads", 1), ("seed", 0), ("max_steps", 1)):
            check_int(getattr(self, name), name, minimum=least)
        if self.steps_per_phase < 2 * self.commit_every:
            raise ValueError(f"steps_per_phase must be at least 2 x commit_every ({2 * self.commit_every}) so that "
                             f"each world size commits; got {self.steps_per_phase}")
        check_number(self.lr, "lr", above=0)
        check_number(self.timeout, "timeout", above=0)
        return self

    def argv(self, out) -> list[str]:
        """The workers' command line."""
        return [str(a) for a in ("--out", out, "--steps", self.max_steps, "--commit-every", self.commit_every,
                                 "--batch-size", self.batch_size, "--num-examples", self.num_examples,
                                 "--width", self.width, "--lr", self.lr, "--threads", self.threads,
                                 "--seed", self.seed)]


# ----------------------------------------------------------------------------------------------- the summary

def _median(xs):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else 0.5 * (xs[k - 1] + xs[k])


def world_steps(rows) -> list[dict]:
    """The world's steps from every worker's log lines, in time order: one per (generation, step), done when its
    last worker logged it; with its world size, how many workers logged it and their weights checksums."""
    groups = {}
    for r in rows:
        if "event" in r:
            continue
        g = groups.setdefault((r["generation"], r["step"]), {"generation": r["generation"], "step": r["step"],
                                                              "size": r["size"], "t": r["t"], "checksums": set(),
                                                              "workers": 0})
        g["t"] = max(g["t"], r["t"])
        g["checksums"].add(r["checksum"])
        g["workers"] += 1
    return sorted(groups.values(), key=lambda g: (g["t"], g["generation"], g["step"]))


def summarize(rows, actions=()) -> dict:
    """The run read from the workers' log lines (and the driver's actions, {"t", "action", "node"}): steps, world size
    over time, the steady step time of each world size, each change of the world with its time lost, and whether
    the workers were in sync after every reset and at every step."""
    steps = world_steps(rows)
    if not steps:
        raise ValueError("rows must hold the workers' step lines (labkit.cluster.elastic_train's logs); got none")
    t0 = min(r["t"] for r in rows)
    by_gen = {}
    for s in steps:
        by_gen.setdefault(s["generation"], []).append(s)
    intervals = {}  # world size -> step-to-step times within one generation
    for gen in by_gen.values():
        intervals.setdefault(gen[0]["size"], []).extend(b["t"] - a["t"] for a, b in zip(gen, gen[1:]))
    steady = {size: _median(v) for size, v in intervals.items()}
    gens = sorted(by_gen, key=lambda g: by_gen[g][0]["t"])
    changes = []
    for before, after in zip(gens, gens[1:]):
        last, first = by_gen[before][-1], by_gen[after][0]
        step_s = steady[first["size"]]
        action = max((a for a in actions if a["t"] <= first["t"]), key=lambda a: a["t"], default=None)
        continued = first["step"] - 1
        changes.append({
            "t_s": round(first["t"] - t0, 3), "size_before": last["size"], "size_after": first["size"],
            "action": action["action"] if action else None, "last_step_before": last["step"],
            "continued_from_step": continued, "steps_redone": last["step"] - continued,
            "gap_s": round(first["t"] - last["t"], 4), "steady_step_s": round(step_s, 5),
            "time_lost_s": round(first["t"] - last["t"] - step_s, 4),
            "action_to_first_step_s": round(first["t"] - action["t"], 3) if action else None})
    syncs = {}
    for r in rows:
        if r.get("event") == "sync":
            syncs.setdefault(r["generation"], set()).add(r["checksum"])
    return {
        "steps": max(s["step"] for s in steps),
        "wall_s": round(max(s["t"] for s in steps) - t0, 3),
        "timeline": {"t_s": [round(s["t"] - t0, 3) for s in steps], "step": [s["step"] for s in steps],
                     "size": [s["size"] for s in steps]},
        "actions": [{**a, "t_s": round(a["t"] - t0, 3)} for a in actions],
        "steady_step_s": {str(k): round(v, 5) for k, v in sorted(steady.items())},
        "changes": changes,
        "time_lost_s": round(sum(c["time_lost_s"] for c in changes), 3),
        "never_from_zero": all(c["continued_from_step"] > 0 for c in changes),
        "in_sync_every_step": all(len(s["checksums"]) == 1 for s in steps),
        # a step not every worker logged: the lost worker's last one, or none
        "steps_missing_a_worker": sum(s["workers"] < s["size"] for s in steps),
        "in_sync_after_every_reset": bool(syncs) and all(len(v) == 1 for v in syncs.values()),
        "resets": len(syncs) - 1,
    }


# ----------------------------------------------------------------------------------------------- the run

class _Logs:
    """The workers' JSON lines, read as they grow: only whole lines, each file from where it was left."""

    def __init__(self, folder: Path):
        self.folder, self.offsets, self.rows = folder, {}, []

    def read(self) -> list[dict]:
        from labkit.cluster.elastic_train import LOG_GLOB
        for path in sorted(self.folder.glob(LOG_GLOB)):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            whole = chunk[:chunk.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            self.rows += [json.loads(line) for line in whole.decode().splitlines() if line.strip()]
        return self.rows


def _node(i: int, local: bool) -> str:
    from labkit.scale import launch
    return "localhost" if local else f"{launch.NODE_PREFIX}{i}"


def _hosts_text(n: int, local: bool) -> str:
    """The discovery script's answer with n workers: one line per node, or n slots of this machine."""
    if local:
        return f"localhost:{n}\n"
    return "".join(f"{_node(i, False)}:1\n" for i in range(1, n + 1))


def _command(settings: ElasticSettings, folder: Path, local: bool) -> list[str]:
    venv_bin = Path(sys.executable).parent
    cmd = [str(venv_bin / "horovodrun"), "--gloo", "-np", str(settings.nodes), "--min-np", "1",
           "--max-np", str(settings.nodes), "--host-discovery-script", str(folder / "discover.sh"),
           "--network-interface", "lo" if local else "eth0",
           # a lost node's host is blocked for 1-2 s only, so that it can be given back
           "--blacklist-cooldown-range", "1", "2",
           str(venv_bin / "python"), "-m", MODULE, *settings.argv(folder / "logs")]
    if local:
        return cmd
    from labkit.deepdive import vcluster
    return ["bash", str(vcluster.SCRIPT), "exec", _node(1, False), *cmd]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    """A file of the run's own temporary folder, replaced whole (the discovery script may read it at any time)."""
    from labkit.base import resultsfile
    resultsfile.write_text(path, text)
    os.chmod(path, mode)


def _kill_node_workers(rows, node: str, marker: str) -> int:
    """SIGKILL the worker of this run on `node`, as a node that dies takes its processes with it; how many were
    killed. Only a live process that carries this run's marker: a pid from the logs may be gone, or reused."""
    import psutil

    from labkit.scale import launch
    pids = {r["pid"] for r in rows if r.get("host") == node}
    killed = 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.environ().get(launch.MARKER_ENV) == marker:
                p.kill()
                killed += 1
        except (psutil.Error, OSError):
            continue
    return killed


def _stop(proc, marker: str) -> None:
    """horovodrun, everything it started (here and, through ssh, on the nodes) and any worker left: gone."""
    from labkit.scale import launch
    if proc is not None:  # also when it has ended: a worker of the launch may outlive it
        launch.kill_tree(proc, marker)


def _tail(folder: Path) -> str:
    lines = []
    for name in ("horovodrun.out",):
        try:
            lines += (folder / name).read_text(errors="replace").splitlines()
        except OSError:
            pass
    keep = [ln for ln in lines if not ln.startswith(("20", "To enable"))]  # TensorFlow's start-up chatter
    return "\n".join(keep[-12:])


def run(settings: ElasticSettings | None = None, *, local: bool = False, progress=print) -> dict:
    """One elastic run with settings.actions done on the last node; the summary (JSON-able). local=True: the
    workers are slots of this machine (no cluster, no root), otherwise one per node of the virtual cluster,
    which must be up with settings.nodes nodes at least."""
    from labkit.base import config, machine
    from labkit.scale import launch
    settings = (settings or ElasticSettings()).check()
    if local and "kill" in settings.actions:
        raise ValueError("actions: 'kill' needs the virtual cluster (local=False): on one machine Horovod blocks the "
                         "lost worker's host, which holds every worker")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be a callable taking one line, or None; got {progress!r}")
    if not local:
        from labkit.deepdive import vcluster
        if vcluster.nodes_up() < settings.nodes:
            raise RuntimeError(f"need a virtual cluster of {settings.nodes} nodes: scripts/vcluster.sh up --nodes "
                               f"{settings.nodes} (as root)")
    say = progress or (lambda line: None)
    folder = Path(tempfile.mkdtemp(prefix="labkit-elastic-"))
    os.chmod(folder, 0o755)
    marker = f"elastic-{uuid.uuid4().hex[:12]}"
    proc, actions = None, []
    try:
        (folder / "logs").mkdir()
        n = settings.nodes
        _write(folder / "hosts", _hosts_text(n, local))
        _write(folder / "discover.sh", f"#!/bin/sh\ncat {folder / 'hosts'}\n", 0o755)
        venv_bin = Path(sys.executable).parent
        env = launch.child_env({"PATH": f"{venv_bin}:{os.environ.get('PATH', '')}:/usr/sbin:/sbin"}, marker=marker)
        with open(folder / "horovodrun.out", "wb") as out:
            proc = subprocess.Popen(_command(settings, folder, local), stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=ROOT, start_new_session=True)
        logs, todo, size = _Logs(folder / "logs"), list(settings.actions) + ["stop"], n
        deadline = time.monotonic() + settings.timeout
        while todo and proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the elastic run did not finish its actions in {settings.timeout:.0f} s (timeout); "
                                   f"done: {[a['action'] for a in actions]}\n{_tail(folder)}")
            steps = world_steps(logs.read())
            now = [s for s in steps if s["generation"] == steps[-1]["generation"]] if steps else []
            # a node dies half-way between two commits (a kill at a commit would cost no step: the worst case is
            # a commit interval, the typical one half of it)
            wait = settings.steps_per_phase + (settings.commit_every // 2 if todo[0] == "kill" else 0)
            if now and now[0]["size"] == size and len(now) >= wait:
                what, node = todo.pop(0), _node(n, local)
                size += {"remove": -1, "kill": -1, "add": 1}.get(what, 0)
                if what == "stop":
                    _write(folder / "logs" / "stop", "")
                else:  # the hosts file first: the node is gone from the list before (or as) its worker dies
                    _write(folder / "hosts", _hosts_text(size, local))
                killed = _kill_node_workers(logs.rows, node, marker) if what == "kill" else 0
                actions.append({"t": time.time(), "action": what, "node": node, "at_step": now[-1]["step"],
                                "size_after": size, **({"workers_killed": killed} if what == "kill" else {})})
                say(f"step {now[-1]['step']}: {what} {node if what != 'stop' else ''}".rstrip())
            time.sleep(0.1)
        try:
            proc.wait(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the workers did not stop in {settings.timeout:.0f} s (timeout)\n{_tail(folder)}") \
                from None
        if todo or proc.returncode != 0:
            raise RuntimeError(f"horovodrun ended with exit {proc.returncode} before {todo[0] if todo else 'the end'}"
                               f"\n{_tail(folder)}")
        res = summarize(logs.read(), actions)
    finally:
        _stop(proc, marker)
        shutil.rmtree(folder, ignore_errors=True)
    res.update(settings=dataclasses.asdict(settings), local=local, data="synthetic", profile=config.profile(),
               machine=machine.describe(), date=time.strftime("%Y-%m-%d"))
    if not local:
        from labkit.deepdive import vcluster
        res["link"] = (vcluster.STATE_DIR / "shape").read_text().strip() if (vcluster.STATE_DIR / "shape").exists() \
            else None
    for c in res["changes"]:
        say(f"{c['size_before']} -> {c['size_after']} workers ({c['action']}): continued from step "
            f"{c['continued_from_step']}, {c['steps_redone']} steps re-done, {c['time_lost_s']:.2f} s lost")
    return res


# ----------------------------------------------------------------------------------------------- reading it

_WORDS = {"remove": "taken away", "kill": "lost", "add": "given back"}
_TABLE_WORDS = {"remove": "node taken away", "kill": "node lost (its worker killed)", "add": "node given back",
                None: "-"}


def load_results(path=RESULTS) -> dict:
    """The committed measurement (for machines where the cluster cannot be built), or a run of yours at path."""
    return json.loads(Path(path).expanduser().read_text())


def table(results: dict):
    """One row per change of the world: what was done, where training went on, the time lost."""
    import pandas as pd
    rows = [{"world": f"{c['size_before']} -> {c['size_after']} workers", "what happened": _TABLE_WORDS[c["action"]],
             "at (s)": c["t_s"], "continued from step": c["continued_from_step"], "steps re-done": c["steps_redone"],
             "gap (s)": c["gap_s"], "steady step (ms)": 1e3 * c["steady_step_s"], "time lost (s)": c["time_lost_s"]}
            for c in results["changes"]]
    return pd.DataFrame(rows)


def plot(results: dict, ax=None):
    """Step (left axis) and world size (right axis) against wall time, the actions marked; the data set and the
    profile in the title."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    tl = results["timeline"]
    ax.plot(tl["t_s"], tl["step"], color="C0", lw=1.5, label="step")
    ax.set_xlabel("wall time since the workers started (s)")
    ax.set_ylabel("training step", color="C0")
    right = ax.twinx()
    right.step(tl["t_s"], tl["size"], where="post", color="C1", lw=1.5, label="workers")
    right.set_ylabel("workers (world size)", color="C1")
    right.set_ylim(0, results["settings"]["nodes"] + 0.5)
    right.set_yticks(range(0, results["settings"]["nodes"] + 1))
    for a in results["actions"]:
        if a["action"] != "stop":
            ax.axvline(a["t_s"], color="0.6", ls="--", lw=0.8)
            ax.text(a["t_s"], ax.get_ylim()[1], " " + _WORDS[a["action"]], rotation=90, va="top", fontsize=7,
                    color="0.4")
    for c in results["changes"]:
        ax.annotate(f"{c['time_lost_s']:.1f} s lost", (c["t_s"], c["continued_from_step"]), fontsize=7,
                    xytext=(4, -12), textcoords="offset points", color="C3")
    n = results["settings"]["nodes"]
    where = f"{n} slots of one machine" if results.get("local") else f"a {n}-node virtual cluster"
    ax.set_title(f"Horovod Elastic on {where}: {results['data']} data, {results['profile']} profile", fontsize=10)
    ax.grid(alpha=0.3)
    return ax


def main(argv=None) -> int:
    """`python -m labkit.cluster.elastic`: one run on the virtual cluster (brought up for it when none is), its
    summary written to --out."""
    import argparse

    from labkit.base import resultsfile
    from labkit.deepdive import vcluster
    p = argparse.ArgumentParser(prog="python -m labkit.cluster.elastic",
                                description="Horovod Elastic on the virtual cluster: the last node taken away and "
                                            "given back mid-run (root; the cluster is brought up when none is).")
    p.add_argument("--nodes", type=int, default=ElasticSettings.nodes)
    p.add_argument("--actions", default=",".join(ElasticSettings.actions), help="remove, kill, add, in turn")
    p.add_argument("--steps-per-phase", type=int, default=ElasticSettings.steps_per_phase)
    p.add_argument("--local", action="store_true", help="slots of this machine instead of the virtual cluster")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    try:
        settings = ElasticSettings(nodes=args.nodes, actions=tuple(a.strip() for a in args.actions.split(",")),
                                   steps_per_phase=args.steps_per_phase).check()
        resultsfile.check_target(args.out, "--out", own=resultsfile.json_document("changes", "timeline"))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # room for the results now, not after the run
        resultsfile.check_space(args.out, resultsfile.RESULTS_RESERVE_BYTES, "--out")
    except (OSError, ValueError) as err:
        print(f"elastic: {err}", file=sys.stderr)
        return 2
    started = False
    if not args.local:
        reason = vcluster.why_not()
        if reason:
            print(f"elastic: {reason}", file=sys.stderr)
            return 2
        started = vcluster.nodes_up() < settings.nodes
        if started:
            vcluster.up(settings.nodes)
    try:
        res = run(settings, local=args.local)
    finally:
        if started:
            vcluster.down()
    resultsfile.write_json(args.out, res)
    print(table(res).round(3).to_string())
    print("written:", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
