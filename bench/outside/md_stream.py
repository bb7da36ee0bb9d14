# SPDX-License-Identifier: Apache-2.0
"""The MD frame stream rows of `make bench-outside` (bench/outside/run.py,
issue 49): the same frames from node 0 to node 1 through DYAD, MPI
send/recv, ADIOS2 SST and ADIOS2 BP5 on GlusterFS, in interleaved rounds;
the table (md.md), the figures (md.json) and the chart (md.png).

Figures per run: bench/outside/outside.py's stream_figures (steady frames/s
from the receiver's per-frame times, end-to-end frames/s with start-up in,
the gaps between frames). Ratios are taken round by round (the two runs of
a ratio ran within seconds of each other on the same loaded machine) and
their median and range reported.
"""
import json
import os
import re
import statistics
import subprocess
import tempfile

import outside as ox

DYAD_METHODS = ["pydyad", "pydyad-async", "dyad-wrapper", "dyad-wrapper-async"]
ORDER = DYAD_METHODS + ["mpi", "adios2-sst", "adios2-bp5"]
DEFAULT_METHODS = "pydyad,dyad-wrapper,mpi,adios2-sst,adios2-bp5"
# The per-frame lists kept in md.json (the rest of a run's lists is dropped).
KEEP_LISTS = ("gaps", "frame_movement")


def pct(v, q):
    v = sorted(x for x in v if x is not None)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else None


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def rotated(xs, r):
    k = r % len(xs)
    return xs[k:] + xs[:k]


def fmt(x, unit=1.0):
    if x is None:
        return "-"
    x *= unit
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def clean(msg, root):
    """A failure's text for the table: no terminal colours, no machine paths."""
    msg = re.sub(r"\x1b\[[0-9;]*m", "", msg).replace(root, "<cluster>")
    return re.sub(r"\S*/dyad-cluster-\w+", "<cluster>", msg)


def storage():
    """The file system the nodes' directories (and GlusterFS's bricks) are on."""
    d = tempfile.gettempdir()
    p = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True)
    return f"{p.stdout.strip() or '?'} ({d})"


def usable(methods, adios2_exe, skipped):
    out = []
    for m in methods:
        if m not in ORDER:
            raise SystemExit(f"bench-outside: unknown stream method {m!r} (known: {', '.join(ORDER)})")
        if (m == "mpi" and skipped.get("mpi")) or (m.startswith("adios2") and not adios2_exe):
            continue
        out.append(m)
    return out


def run_one(env, m, size, n, adios2_exe):
    if m == "mpi":
        res = ox.run_mpi_frames(env, size, n)
    elif m.startswith("adios2"):
        res = ox.run_adios2_frames(env, adios2_exe, m.split("-")[1].upper(), size, n)
    else:
        res = ox.run_dyad_frames(env, m, size, n)
    res["load1"] = os.getloadavg()[0]
    return {k: v for k, v in res.items() if not isinstance(v, list) or k in KEEP_LISTS}


def md_rounds(env, sizes, frames, rounds, log, methods, adios2_exe, skipped):
    """Round 0 (8 frames) warms up and is not kept. Each later round runs
    every method once per size, the order rotated. A failed run is logged and
    kept as None (its round's ratios are then left out), never retried into
    a better figure."""
    methods = usable(methods, adios2_exe, skipped)
    out, failures = {}, []
    for r in range(rounds + 1):
        for label in sizes:
            size = ox.wf.FRAME_SIZES[label]
            for m in rotated(methods, r):
                n = frames if r else min(frames, 8)
                try:
                    res = run_one(env, m, size, n, adios2_exe)
                    log(f"md round {r} {label} {m}: {res['steady_fps']:.1f} frames/s steady "
                        f"({res['steady_MB_per_s']:.0f} MB/s), {res['frames_per_s']:.1f} end to end, "
                        f"gap p50 {pct(res['gaps'], .5) * 1e3:.2f} ms, load {res['load1']:.1f}")
                except (RuntimeError, OSError, KeyError, ValueError) as e:
                    why = clean(str(e), env.cluster.root)
                    log(f"md round {r} {label} {m}: FAILED: {why[:400]}")
                    failures.append(f"round {r} {label} {m}: {why[:300]}")
                    res = None
                if r:
                    out.setdefault(label, {}).setdefault(m, []).append(res)
    return out, failures


def headline(s):
    """The DYAD method the goals are judged on: the first DYAD method run."""
    return next((m for m in DYAD_METHODS if m in s), None)


def round_ratios(a_runs, b_runs, key):
    return [a[key] / b[key] for a, b in zip(a_runs, b_runs)
            if a and b and a.get(key) and b.get(key)]


def summarize(md):
    """{label: {"methods": {m: figures}, "ratios": {name: {key: [median, min, max]}}}}."""
    out = {}
    for label, s in md.items():
        ms = {}
        for m, runs in s.items():
            ok = [r for r in runs if r]
            gaps = [g for r in ok for g in r["gaps"]]
            ms[m] = {"runs": len(ok), "failed": len(runs) - len(ok),
                     "steady_fps": med([r["steady_fps"] for r in ok]),
                     "steady_fps_min": min((r["steady_fps"] for r in ok), default=None),
                     "steady_fps_max": max((r["steady_fps"] for r in ok), default=None),
                     "steady_MB_per_s": med([r["steady_MB_per_s"] for r in ok]),
                     "fps": med([r["frames_per_s"] for r in ok]), "MB_per_s": med([r["MB_per_s"] for r in ok]),
                     "gap_p50": pct(gaps, .5), "gap_p90": pct(gaps, .9), "gap_max": max(gaps, default=None),
                     "rendezvous": med([r.get("rendezvous") for r in ok]),
                     "load1": med([r["load1"] for r in ok])}
        d = headline(s)
        ratios = {}
        for other in ("adios2-sst", "adios2-bp5", "mpi"):
            if d and other in s:
                ratios[f"{d} / {other}"] = {}
                for key in ("steady_fps", "frames_per_s"):
                    rr = round_ratios(s[d], s[other], key)
                    ratios[f"{d} / {other}"][key] = [med(rr), min(rr), max(rr)] if rr else None
        out[label] = {"methods": ms, "ratios": ratios}
    return out


def ratio_cell(x):
    return "-" if not x else f"{x[0]:.2f}x ({x[1]:.2f}-{x[2]:.2f})"


def write_md(outdir, md, meta, skipped, failures=()):
    summ = summarize(md)
    methods = sorted({m for s in md.values() for m in s}, key=ORDER.index)
    lines = [f"# The MD frame stream between two nodes ({meta['machine']})", "",
             f"{meta['frames']} frames back to back (no simulation time) from node 0 to node 1 (two network "
             f"namespaces of one machine); {meta['rounds']} interleaved rounds after a warm-up, the order of the "
             "methods rotated each round. Load average (1 min) during the runs: "
             f"{meta.get('load', '?')} on 2 cores: other builds shared the machine, so read ratios of the same round, "
             "not absolute rates. The nodes' directories (DYAD's files, GlusterFS's bricks): "
             f"{meta.get('storage', 'the root disk (ext4)')}.", "",
             f"Command: `{meta.get('command', 'make bench-outside')}`", "",
             "- pydyad: `dyad_open('wb')` publishes; the consumer `get_metadata(should_wait=True)` + "
             "`consume_w_metadata`, then reads and checks (bench/workflow/md_pair.py). dyad-wrapper: the same "
             "frames through `libdyad_wrapper.so` (plain open/write/close, open/read).",
             "- mpi: `MPI_Send`/`MPI_Recv` (mpi4py, OpenMPI, pml ob1, btl tcp between the namespaces), one buffer, "
             f"checked (bench/outside/mpi_frames.py){meta.get('mpi_note', ', mpi_yield_when_idle 1')}.",
             f"- adios2-sst / adios2-bp5: ADIOS2 {meta.get('adios2', '?')}, one step per frame, one uint8 variable "
             "(bench/outside/adios2_frames.cpp); SST over its TCP (WAN) data plane, QueueLimit 4, reader on node 1 "
             "started first; BP5 written to the GlusterFS volume through node 0's mount, read through node 1's as "
             "steps land.", "",
             "Steady: frames 2..N over (last frame checked - first frame checked), start-up left out for all. "
             "End to end: N frames over the whole run with start-up in (DYAD from the producer's start, ADIOS2 from "
             "the earlier of the writer's start and the reader's Open, i.e. SST's rendezvous in; MPI from the "
             "barrier after MPI_Init, its start-up out). Gap: time between two frames checked at the receiver, "
             "pooled over rounds. MB = 10^6 bytes. Values: median of rounds (min-max).", ""]
    for k, v in skipped.items():
        if v:
            lines += [f"Skipped {k}: {v}", ""]
    for f in failures:
        lines += [f"Failed run (left out): {clean(f, '/tmp')}", ""]
    lines += ["| frame | method | steady frames/s | steady MB/s | gap p50 / p90 / max (ms) | end-to-end frames/s | "
              "end-to-end MB/s | SST rendezvous (s) | load |", "|---|---|---|---|---|---|---|---|---|"]
    for label, x in summ.items():
        for m in methods:
            f = x["methods"].get(m)
            if not f or not f["runs"]:
                continue
            lines.append(f"| {label} | {m} | {fmt(f['steady_fps'])} ({fmt(f['steady_fps_min'])}-"
                         f"{fmt(f['steady_fps_max'])}) | {fmt(f['steady_MB_per_s'])} | {fmt(f['gap_p50'], 1e3)} / "
                         f"{fmt(f['gap_p90'], 1e3)} / {fmt(f['gap_max'], 1e3)} | {fmt(f['fps'])} | "
                         f"{fmt(f['MB_per_s'])} | {fmt(f['rendezvous']) if m == 'adios2-sst' else ''} | "
                         f"{fmt(f['load1'])} |")
    names = sorted({n for x in summ.values() for n in x["ratios"]})
    if names:
        lines += ["", "Ratios of the same round (median, min-max over rounds), frames/s:", "",
                  "| frame | " + " | ".join(f"{n} steady | {n} end to end" for n in names) + " |",
                  "|---|" + "---|---|" * len(names)]
        for label, x in summ.items():
            cells = []
            for n in names:
                r = x["ratios"].get(n) or {}
                cells += [ratio_cell(r.get("steady_fps")), ratio_cell(r.get("frames_per_s"))]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Goals (issue 49): DYAD at least 5x ADIOS2 SST's frames/s at every frame size; DYAD's frame "
              "movement at least 0.7x MPI send/recv of the same frames between the same two nodes (steady ratio).",
              ""]
    text = "\n".join(lines)
    with open(os.path.join(outdir, "md.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(outdir, "md.json"), "w") as fh:
        json.dump({"meta": meta, "skipped": skipped, "failures": list(failures), "summary": summ, "runs": md},
                  fh, indent=1)
    return text


def chart(outdir, md):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    summ = summarize(md)
    labels = list(summ)
    methods = sorted({m for s in md.values() for m in s}, key=ORDER.index)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    w = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        xs = [k + (i - (len(methods) - 1) / 2) * w for k in range(len(labels))]
        for ax, key in zip(axes, ("steady_fps", "fps")):
            ax.bar(xs, [summ[lb]["methods"].get(m, {}).get(key) or 0 for lb in labels], w, label=m)
    for ax, title in zip(axes, ("steady (start-up out)", "end to end (start-up in)")):
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yscale("log")
        ax.set_ylabel("frames/s")
        ax.set_title(f"MD frames node 0 -> node 1, {title}", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "md.png"), dpi=110)
    plt.close(fig)
