"""Horovod Timeline: read the trace HOROVOD_TIMELINE writes and draw where each gradient's time goes.

Launch with HOROVOD_TIMELINE=/path/timeline.json (rank 0 writes it, Chrome-trace format: one "process" per
tensor, begin/end events per phase). Each gradient tensor first waits in NEGOTIATE_ALLREDUCE until every
rank has it ready (the slowest rank's backprop decides), then ALLREDUCE runs (nested activities such as
the copy into the fusion buffer and the Gloo ring itself). `phases()` turns the file into a DataFrame,
`plot()` draws it per tensor, `summary()` adds the phases up. No TensorFlow here.
Introduced in notebooks/07_scaling_deep_dive.ipynb.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path


def read_events(path) -> list[dict]:
    """The trace's events; a trace cut off mid-write (the job was stopped) is read up to its last event."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # Horovod writes '[' then ',\n'-separated events and may never close it
        data = json.loads(text.rstrip(",\n ") + "]") if text.startswith("[") else []
    return data["traceEvents"] if isinstance(data, dict) else list(data)


def phases(path):
    """One row per phase per tensor: tensor, phase, depth (0 = top level), start_ms, dur_ms, step.

    start_ms counts from the first event. `step` numbers a tensor's top-level NEGOTIATE phases in order
    (Horovod reduces every gradient once per step), so rows of one step share it.
    """
    import pandas as pd
    events = read_events(path)
    names = {e["pid"]: e.get("args", {}).get("name", str(e["pid"])) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    timed = [e for e in events if e.get("ph") in ("B", "E", "X") and "ts" in e]
    if not timed:
        return pd.DataFrame(columns=["tensor", "phase", "depth", "start_ms", "dur_ms", "step"])
    t0 = min(e["ts"] for e in timed)
    rows, stacks, steps = [], {}, {}
    for e in sorted(timed, key=lambda e: e["ts"]):
        pid, ts = e["pid"], (e["ts"] - t0) / 1e3
        stack = stacks.setdefault(pid, [])
        if e["ph"] == "X":
            if not e.get("dur"):  # zero-length marks (which rank reported ready): not a phase
                continue
            rows.append((pid, e.get("name", ""), len(stack), ts, e.get("dur", 0) / 1e3))
        elif e["ph"] == "B":
            stack.append((e.get("name", ""), ts))
            if len(stack) == 1 and e.get("name", "").startswith("NEGOTIATE"):
                steps[pid] = steps.get(pid, -1) + 1
        elif stack:
            name, start = stack.pop()
            rows.append((pid, name, len(stack), start, ts - start))
    df = pd.DataFrame(rows, columns=["pid", "phase", "depth", "start_ms", "dur_ms"])
    df["tensor"] = df["pid"].map(lambda p: names.get(p, str(p)))
    # the step a row belongs to: how many NEGOTIATE phases of its tensor began at or before it
    neg = df[(df.depth == 0) & df.phase.str.startswith("NEGOTIATE")].sort_values("start_ms")
    starts = {p: sorted(g.start_ms) for p, g in neg.groupby("pid")}
    import bisect
    df["step"] = [max(0, bisect.bisect_right(starts.get(p, []), s + 1e-9) - 1)
                  for p, s in zip(df.pid, df.start_ms)]
    return df.drop(columns="pid").sort_values(["start_ms", "depth"]).reset_index(drop=True)


def short_name(tensor: str) -> str:
    """'.../HorovodAllreduce_gradient_tape_convblock_w32_d4_fc_MatMul_0' -> 'convblock_w32_d4_fc_MatMul_0'."""
    m = re.search(r"Horovod(?:Allreduce|Broadcast)_(?:gradient_tape_)?(.*)$", tensor)
    return m[1] if m else tensor.split("/")[-1]


def labels(tensors, among=None, width=40) -> list[str]:
    """Short row labels for tensors: Horovod's prefix dropped (short_name), then the longest whole-word start
    that every name in `among` shares (default: tensors), cut to `width` characters. Among all of a step's
    gradients that start is the model's name: 'convblock_w32_d4_conv1_1_...' -> 'conv1_1_...'."""
    short = [short_name(t) for t in tensors]
    pool = sorted(set(short) if among is None else {short_name(t) for t in among})
    common = os.path.commonprefix(pool) if len(pool) > 1 else ""
    common = common[:common.rfind("_") + 1]  # up to a word's end: 'convblock_w32_d4_', not 'convblock_w32_d4_c'
    return [s[len(common):][:width] if s.startswith(common) else s[:width] for s in short]


def breakdown(step_df) -> dict:
    """One step's gradient exchange in numbers (ms): when gradients became ready, negotiation, allreduce.

    ready_span: first to last gradient reaching Horovod (backprop still running in between);
    allreduce_wall: first allreduce start to last allreduce end; overlap: allreduce time that ran before
    the last gradient was ready, i.e. hidden behind backprop.
    """
    top = step_df[step_df.depth == 0]
    neg, red = top[top.phase.str.startswith("NEGOTIATE")], top[top.phase == "ALLREDUCE"]
    last_ready = neg.start_ms.max()
    a0, a1 = red.start_ms.min(), (red.start_ms + red.dur_ms).max()
    busy = sorted(zip(red.start_ms, red.start_ms + red.dur_ms))
    hidden, cur_end = 0.0, -1.0
    for s, e in busy:  # union of allreduce intervals before last_ready
        s, e = max(s, cur_end), min(e, last_ready)
        if e > s:
            hidden += e - s
        cur_end = max(cur_end, e)
    return {"tensors": int(red.tensor.nunique()), "ready_span_ms": float(last_ready - neg.start_ms.min()),
            "negotiate_median_ms": float(neg.dur_ms.median()), "allreduce_wall_ms": float(a1 - a0),
            "allreduces": int(len(red)), "overlap_ms": float(hidden)}


def summary(df):
    """Total and median milliseconds per (top-level or nested) phase, over all tensors and steps."""
    g = df.groupby(["depth", "phase"])["dur_ms"]
    return g.agg(total_ms="sum", median_ms="median", count="count").reset_index().sort_values(["depth", "phase"])


def plot(df, step=None, ax=None, max_tensors=40):
    """Bars per tensor (rows) over time: negotiation vs allreduce, nested activities thinner."""
    import matplotlib.pyplot as plt
    if step is not None:
        df = df[df.step == step]
    if df.empty:
        raise ValueError("no timeline events to draw (was HOROVOD_TIMELINE set, and did a step run?)")
    every = df.tensor.unique()  # all of the step's tensors, for the labels' shared start
    order = df[df.depth == 0].groupby("tensor")["start_ms"].min().sort_values().index[:max_tensors]
    df = df[df.tensor.isin(order)]
    ax = ax or plt.subplots(figsize=(9, 0.18 * len(order) + 1.5))[1]
    colors, t_min = {}, df.start_ms.min()
    palette = plt.get_cmap("tab10")
    for y, tensor in enumerate(order):
        for _, r in df[df.tensor == tensor].iterrows():
            c = colors.setdefault(r.phase, palette(len(colors) % 10))
            h = 0.8 if r.depth == 0 else 0.4
            ax.broken_barh([(r.start_ms - t_min, max(r.dur_ms, 0.05))], (y - h / 2, h), color=c,
                           label=r.phase if r.phase not in ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(labels(order, among=every), fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.legend(fontsize=7, loc="lower right")
    return ax
