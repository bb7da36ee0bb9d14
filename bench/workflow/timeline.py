#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where the time goes: per-process timelines of one run traced with
DYAD_TRACE=DIR (docs/user-guide.md, "Tracing (DYAD_TRACE)").

    /usr/bin/python3 bench/workflow/timeline.py DIR OUT.png [--merge OUT.json] [--title TEXT]
    /usr/bin/python3 bench/workflow/timeline.py DIR --merge OUT.json

DIR holds one trace file per DYAD process (dyad-NODE-PID.json). OUT.png: one
lane per process and thread (dyadd's and the clients'), time in seconds from
the run's first event, one colour per event kind; events inside others
(transfer inside consume, publish inside produce) drawn above them in the
lane. --merge writes every file's events into one JSON file (the Trace Event
Format's object form) to open in Perfetto (ui.perfetto.dev) or
chrome://tracing as one trace. A summary per event kind (count, median and
p90 duration, bytes) goes to stdout.

A file whose process crashed or left by _exit lacks its closing "]" (and may
end in a cut event): it is read up to its last whole event.
"""
import argparse
import glob
import json
import os
import statistics
import sys

# Colours per event kind: the client's steps, then the service's.
COLOURS = {
    "produce": "#9ecae1",
    "publish": "#3182bd",
    "consume": "#d9d9d9",
    "wait-for-create": "#fdae6b",
    "lookup": "#fd8d3c",
    "transfer": "#31a354",
    "commit": "#756bb1",
    "service.publish": "#6baed6",
    "service.fetch": "#74c476",
    "service.fetch_many": "#a1d99b",
    "store.wait": "#fdd0a2",
    "store.get": "#e6550d",
    "store.put": "#08519c",
}
OTHER = ["#e7969c", "#bcbd22", "#17becf", "#8c6d31", "#7b4173"]


def read_events(path):
    """The events of one trace file, repaired if its process did not close it."""
    with open(path, errors="replace") as f:
        text = f.read()
    try:
        doc = json.loads(text)
        return doc["traceEvents"] if isinstance(doc, dict) else doc
    except (json.JSONDecodeError, KeyError):
        pass
    # DYAD writes one event per line: keep every whole one.
    events = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line in ("", "[", "]"):
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the cut last event of a crashed process
    return events


def read_dir(d):
    files = sorted(glob.glob(os.path.join(d, "*.json")))
    if not files:
        raise SystemExit(f"timeline.py: no trace files (*.json) in {d}: run with DYAD_TRACE={d}")
    events = []
    for f in files:
        events.extend(e for e in read_events(f) if isinstance(e, dict))
    return files, events


def lanes_of(events):
    """{(pid, tid): label}, and the complete events per lane."""
    names = {e.get("pid"): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    per_lane = {}
    for e in events:
        if e.get("ph") == "X" and "ts" in e:
            per_lane.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    threads = {}
    for pid, tid in per_lane:
        threads.setdefault(pid, []).append(tid)

    def label(pid, tid):
        base = f"{names.get(pid, 'pid')} {pid}"
        return base if len(threads[pid]) == 1 else f"{base}/{tid}"

    # Services first, then clients in the order they started.
    def order(lane):
        first = min(e["ts"] for e in per_lane[lane])
        return (0 if names.get(lane[0], "").startswith("dyadd") else 1, names.get(lane[0], ""), first)

    keys = sorted(per_lane, key=order)
    return [(k, label(*k)) for k in keys], per_lane


def depths(events):
    """Nesting depth of each event in one lane (an event inside another is one deeper)."""
    out = []
    stack = []  # end times of the open events
    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        start, end = e["ts"], e["ts"] + e.get("dur", 0)
        while stack and stack[-1] <= start:
            stack.pop()
        out.append((e, len(stack)))
        stack.append(end)
    return out


def summary(events):
    rows = {}
    for e in events:
        if e.get("ph") == "X":
            rows.setdefault(e["name"], []).append(e)
    lines = [f"{'event':<20} {'count':>7} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9} {'bytes':>14}"]
    for name in sorted(rows, key=lambda n: -len(rows[n])):
        ds = sorted(e.get("dur", 0) / 1e3 for e in rows[name])
        p90 = ds[min(len(ds) - 1, int(0.9 * len(ds)))]
        nbytes = sum(e.get("args", {}).get("bytes", 0) or 0 for e in rows[name])
        lines.append(f"{name:<20} {len(ds):>7} {statistics.median(ds):>9.3f} {p90:>9.3f} {ds[-1]:>9.3f} {nbytes:>14}")
    return "\n".join(lines)


def draw(events, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches as mpatches
    import matplotlib.pyplot as plt

    lanes, per_lane = lanes_of(events)
    if not lanes:
        raise SystemExit("timeline.py: no complete events (\"ph\":\"X\") to draw")
    t0 = min(e["ts"] for evs in per_lane.values() for e in evs)
    colours = dict(COLOURS)
    extra = iter(OTHER * 10)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(lanes)))
    used = {}
    for row, (lane, _) in enumerate(lanes):
        bars = {}
        for e, depth in depths(per_lane[lane]):
            depth = min(depth, 2)
            x = (e["ts"] - t0) / 1e6
            w = max(e.get("dur", 0) / 1e6, 0)
            bars.setdefault((e["name"], depth), []).append((x, w))
        for (name, depth), xs in bars.items():
            if name not in colours:
                colours[name] = next(extra)
            used[name] = colours[name]
            ax.broken_barh(xs, (row + 0.05 + 0.3 * depth, 0.28), facecolors=colours[name],
                           edgecolor="black", linewidth=0.2)
    ax.set_yticks([i + 0.5 for i in range(len(lanes))])
    ax.set_yticklabels([label for _, label in lanes], fontsize=8)
    ax.set_ylim(0, len(lanes))
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first event")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    n = sum(len(v) for v in per_lane.values())
    ax.set_title(title or f"DYAD timeline: {len(lanes)} lanes, {n} events")
    handles = [mpatches.Patch(color=c, label=name) for name, c in used.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the DYAD_TRACE directory of one run")
    ap.add_argument("png", nargs="?", help="the picture to write (PNG)")
    ap.add_argument("--merge", metavar="OUT.json", help="also write every event into one JSON file for Perfetto")
    ap.add_argument("--title", help="the picture's title")
    a = ap.parse_args(argv)
    if not a.png and not a.merge:
        ap.error("give OUT.png, --merge OUT.json, or both")
    files, events = read_dir(a.dir)
    if a.merge:
        with open(a.merge, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    if a.png:
        draw(events, a.png, a.title)
    print(f"{len(files)} trace files, {sum(1 for e in events if e.get('ph') == 'X')} events")
    print(summary(events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
