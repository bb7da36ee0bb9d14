# SPDX-License-Identifier: Apache-2.0
"""`make bench-workflow`: DYAD against a real GlusterFS volume on DYAD's own
workloads across network-namespace nodes (issue 39; docs/workflow-bench.md
says how and what it is not).

Writes under $BENCH_OUT/workflow (default build/bench/workflow):
md.md, md.png (the MD pipeline), dl.md, dl.png (DLIO-like training reads),
results.json (every run), and timeline.png from one traced MD run when
bench/workflow/timeline.py exists.

Every figure comes from interleaved rounds: each round runs every method of
a configuration once, in an order rotated from round to round, on the same
cluster; tables show medians over rounds (the per-run figure), ratios of
medians, and the per-frame or per-batch tails (p90, p99, max) pooled over
the rounds.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workflow as wf  # noqa: E402

UNET3D_SIZE = 146_600_628  # DLIO's unet3d record_length (~140 MB)
RESNET50_SIZE = 150_528  # 224 x 224 x 3


COLORS = {"local": "tab:gray", "dyad-wrapper": "tab:blue", "dyad-wrapper-async": "tab:purple",
          "pydyad": "tab:cyan", "pydyad-async": "tab:green", "gfs-poll": "tab:red", "gfs-barrier": "tab:orange"}


def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def ratio(num, den):
    return num / den if num is not None and den else None


def f(x, unit=1.0, nd=3):
    return "-" if x is None else f"{x * unit:.{nd}f}"


def fr(x):
    return "-" if x is None else f"{x:.2f}x"


def rotated(methods, r):
    k = r % len(methods)
    return methods[k:] + methods[:k]


def run_md_rounds(env, configs, rounds, frames, sim, log):
    """configs: [(size_label, pairs, nodes, methods)]. Returns {config: {method: [run results]}}."""
    out = {}
    for r in range(rounds + 1):  # round 0 warms up, untimed
        for label, pairs, nodes, methods in configs:
            key = f"{label}|{pairs}|{nodes}"
            for m in rotated(methods, r):
                t = time.time()
                res = wf.run_md(env, m, wf.FRAME_SIZES[label], frames if r else min(frames, 8), pairs=pairs,
                                nodes=nodes, sim=sim)
                log(f"md round {r} {label} pairs={pairs} nodes={nodes} {m}: production {f(res['production'])} s, "
                    f"movement {f(res['movement'])} s, consumption {f(res['consumption'])} s "
                    f"({time.time() - t:.1f} s)")
                if r:
                    out.setdefault(key, {}).setdefault(m, []).append(res)
    return out


def md_summary(runs):
    """{method: figures} for one configuration."""
    s = {}
    for m, rs in runs.items():
        fm = [x for r in rs for x in r["frame_movement"]]
        fl = [x for r in rs for x in r["frame_latency"]]
        s[m] = {"production": med([r["production"] for r in rs]), "movement": med([r["movement"] for r in rs]),
                "consumption": med([r["consumption"] for r in rs]), "wall": med([r["wall"] for r in rs]),
                "frame_movement": {"p50": pct(fm, .5), "p90": pct(fm, .9), "max": max(fm) if fm else None},
                "frame_latency": {"p50": pct(fl, .5), "p90": pct(fl, .9), "max": max(fl) if fl else None},
                "rounds": len(rs)}
    return s


def md_ratios(s):
    out = {}
    for d in ("dyad-wrapper", "dyad-wrapper-async", "pydyad", "pydyad-async"):
        if d not in s:
            continue
        g = lambda m, k: s.get(m, {}).get(k)  # noqa: E731
        out[d] = {
            "production_vs_local": ratio(g("local", "production"), g(d, "production")),
            "movement_vs_poll": ratio(g("gfs-poll", "movement"), g(d, "movement")),
            "movement_vs_barrier_read": ratio(g("gfs-barrier", "movement"), g(d, "movement")),
            "consumption_vs_barrier": ratio(g("gfs-barrier", "consumption"), g(d, "consumption")),
            "consumption_vs_poll": ratio(g("gfs-poll", "consumption"), g(d, "consumption")),
        }
    return out


def md_goal_movement(label):
    return 2.0 if label == "28.48MiB" else 5.0


def write_md(outdir, md, meta):
    lines = [f"# MD pipeline: DYAD vs GlusterFS ({meta['machine']})", "",
             f"{meta['frames']} frames per pair, {meta['sim']} s of simulation (sleep) before each frame, "
             f"{meta['rounds']} interleaved rounds after a warm-up; medians over rounds of per-pair sums "
             "(seconds), per-frame tails in ms pooled over rounds. GlusterFS: one brick served from its own "
             "namespace, FUSE mounts (not a kernel Lustre/GPFS client). Consumer data movement of a frame: "
             "from max(consumer asks, producer published) to frame read and checked; consumption: from "
             "published to read and checked, waiting included (gfs-barrier: frames wait for the last one).", ""]
    for key, s in md.items():
        label, pairs, nodes = key.split("|")
        lines += [f"## {label} frames, {pairs} pair(s) on {nodes} nodes", "",
                  "| method | production s | data movement s | consumption s | end-to-end s | "
                  "frame movement ms p50 / p90 / max | frame latency ms p50 / p90 / max |",
                  "|---|---|---|---|---|---|---|"]
        for m in wf.MD_METHODS:
            if m not in s:
                continue
            x = s[m]
            tail = lambda d: (f"{f(d['p50'], 1e3, 1)} / {f(d['p90'], 1e3, 1)} / {f(d['max'], 1e3, 1)}"  # noqa: E731
                              if d["p50"] is not None else "-")
            lines.append(f"| {m} | {f(x['production'])} | {f(x['movement'])} | {f(x['consumption'])} | "
                         f"{f(x['wall'])} | {tail(x['frame_movement'])} | {tail(x['frame_latency'])} |")
        lines.append("")
        rt = md_ratios(s)
        if rt:
            gm = md_goal_movement(label)
            lines += ["| DYAD via | production: local ÷ DYAD (goal >= 0.8 sync, 0.95 async) | movement: gfs-poll ÷ DYAD "
                      f"(goal >= {gm:g}) | movement: gfs-barrier read ÷ DYAD | consumption: barrier ÷ DYAD "
                      "(goal >= 20) | consumption: poll ÷ DYAD (goal >= 3) |", "|---|---|---|---|---|---|"]
            for d, r in rt.items():
                lines.append(f"| {d} | {fr(r['production_vs_local'])} | {fr(r['movement_vs_poll'])} | "
                             f"{fr(r['movement_vs_barrier_read'])} | {fr(r['consumption_vs_barrier'])} | "
                             f"{fr(r['consumption_vs_poll'])} |")
            lines.append("")
    with open(os.path.join(outdir, "md.md"), "w") as fh:
        fh.write("\n".join(lines))
    return "\n".join(lines)


def run_dl_rounds(env, workloads, rounds, log):
    out = {}
    for r in range(rounds):
        for name, count, size, batch in workloads:
            for m in rotated(wf.DL_METHODS, r):
                t = time.time()
                res = wf.run_dl(env, m, count, size, batch)
                log(f"dl round {r} {name} {m}: " + ", ".join(
                    f"epoch {i + 1} {e['samples_per_s']:.1f} samples/s" for i, e in enumerate(res["epochs"]))
                    + f" ({time.time() - t:.1f} s)")
                out.setdefault(name, {}).setdefault(m, []).append(res)
    return out


def dl_summary(runs):
    s = {}
    for m, rs in runs.items():
        s[m] = []
        for e in range(len(rs[0]["epochs"])):
            waits = [w for r in rs for w in r["epochs"][e]["waits"]]
            st = wf.wait_stats(waits)
            s[m].append({"samples_per_s": med([r["epochs"][e]["samples_per_s"] for r in rs]),
                         "min": min(r["epochs"][e]["samples_per_s"] for r in rs),
                         "max": max(r["epochs"][e]["samples_per_s"] for r in rs), **st,
                         "wait_max": max(waits) if waits else None, "batches": len(waits)})
    return s


def write_dl(outdir, dl, meta):
    lines = [f"# DLIO-like training reads: DYAD vs GlusterFS vs local disk ({meta['machine']})", "",
             "Samples produced (untimed) on every node but the last, read on the last by a torch DataLoader "
             "(num_workers 2, a fixed shuffled order; DYAD: DyadDataset with its prefetch sampler, ahead 64). "
             f"{meta['rounds']} interleaved rounds; samples/s: median [min-max] over rounds; batch waits "
             "(time the loop blocked in next()) pooled over rounds. Local disk: the same samples written on "
             "the reader's own disk (the page cache is warm for every method: one machine).", ""]
    for name, s in dl.items():
        info = meta["dl"][name]
        lines += [f"## {name}: {info['count']} samples of {info['size']:,} B, batch {info['batch']}", "",
                  "| method | epoch | samples/s | batch wait mean ms | p99 ms | max ms | waits > 1 s |",
                  "|---|---|---|---|---|---|---|"]
        for m in wf.DL_METHODS:
            for e, x in enumerate(s.get(m, [])):
                lines.append(f"| {m} | {e + 1} | {f(x['samples_per_s'], 1, 1)} [{f(x['min'], 1, 1)}-"
                             f"{f(x['max'], 1, 1)}] | {f(x['mean'], 1e3, 1)} | {f(x['p99'], 1e3, 1)} | "
                             f"{f(x['wait_max'], 1e3, 1)} | {f(x['over_1s'], 100, 1)}% |")
        d, g, loc = s.get("dyad"), s.get("gfs"), s.get("local")
        if d and g and loc:
            lines += ["", "| ratio | value | goal |", "|---|---|---|",
                      f"| epoch 1: DYAD ÷ GlusterFS samples/s | "
                      f"{fr(ratio(d[0]['samples_per_s'], g[0]['samples_per_s']))} | >= 3 |",
                      f"| epoch 2: DYAD ÷ local disk samples/s | "
                      f"{fr(ratio(d[-1]['samples_per_s'], loc[-1]['samples_per_s']))} | >= 0.9 |",
                      f"| epoch 1: GlusterFS p99 wait ÷ DYAD p99 wait | {fr(ratio(g[0]['p99'], d[0]['p99']))} "
                      "| >= 5 |"]
        lines.append("")
    with open(os.path.join(outdir, "dl.md"), "w") as fh:
        fh.write("\n".join(lines))
    return "\n".join(lines)


def charts(outdir, md, dl):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = {k: v for k, v in md.items() if k.endswith("|1|2")}
    if base:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        labels = [k.split("|")[0] for k in base]
        for ax, (fig_key, title) in zip(axes, [("production", "production (s per pair)"),
                                               ("movement", "consumer data movement (s)"),
                                               ("consumption", "total consumption incl. waiting (s)")]):
            methods = [m for m in wf.MD_METHODS if any(m in base[k] and base[k][m][fig_key] is not None
                                                       for k in base)]
            w = 0.8 / max(1, len(methods))
            for j, m in enumerate(methods):
                vals = [base[k].get(m, {}).get(fig_key) or 0 for k in base]
                ax.bar([i + j * w for i in range(len(labels))], vals, w, label=m, color=COLORS[m])
            ax.set_xticks([i + 0.4 - w / 2 for i in range(len(labels))])
            ax.set_xticklabels(labels)
            ax.set_yscale("log")
            ax.set_title(title)
            ax.legend(fontsize=8)
        fig.suptitle("MD pipeline, 1 pair on 2 namespace nodes: DYAD vs GlusterFS (FUSE), one 2-core machine")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "md.png"), dpi=110)
        plt.close(fig)
    if dl:
        fig, axes = plt.subplots(1, 2 * len(dl), figsize=(6 * len(dl) + 2, 4.5))
        for n, (name, s) in enumerate(dl.items()):
            ax, ax2 = axes[2 * n], axes[2 * n + 1]
            methods = [m for m in wf.DL_METHODS if m in s]
            for e in range(2):
                ax.bar([i + e * 0.4 for i in range(len(methods))],
                       [s[m][e]["samples_per_s"] if e < len(s[m]) else 0 for m in methods], 0.4,
                       label=f"epoch {e + 1}")
                ax2.bar([i + e * 0.4 for i in range(len(methods))],
                        [(s[m][e]["p99"] or 0) * 1e3 if e < len(s[m]) else 0 for m in methods], 0.4,
                        label=f"epoch {e + 1}")
            for a in (ax, ax2):
                a.set_xticks([i + 0.2 for i in range(len(methods))])
                a.set_xticklabels(methods)
                a.legend(fontsize=8)
            ax.set_title(f"{name}: samples/s")
            ax2.set_title(f"{name}: p99 batch wait (ms)")
        fig.suptitle("DLIO-like reads: DYAD (DyadDataset) vs GlusterFS (FUSE) vs local disk, one 2-core machine")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "dl.png"), dpi=110)
        plt.close(fig)


def traced_run(outdir, frames, log):
    """One MD run (dyad-wrapper, 2.46 MiB) with DYAD_TRACE, then
    timeline.py if it is there."""
    trace = os.path.join(outdir, "trace")
    os.makedirs(trace, exist_ok=True)
    with wf.Env(2, gfs=False, trace_dir=trace) as env:
        res = wf.run_md(env, "dyad-wrapper", wf.FRAME_SIZES["2.46MiB"], frames, sim=0.02)
    log(f"traced run: {frames} frames of 2.46 MiB, consumption {f(res['consumption'])} s; traces in {trace}: "
        f"{len(os.listdir(trace))} file(s)")
    tl = os.path.join(HERE, "timeline.py")
    if not os.path.exists(tl):
        log("timeline: bench/workflow/timeline.py is not in this tree (DYAD_TRACE's timeline comes with it): "
            "no timeline.png")
        return None
    png = os.path.join(outdir, "timeline.png")
    p = subprocess.run([sys.executable, tl, trace, png], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        log(f"timeline: {tl} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        return None
    with open(os.path.join(outdir, "timeline.txt"), "w") as fh:
        fh.write(p.stdout)
    log(f"timeline: {png}; per event kind (timeline.txt):\n{p.stdout.strip()}")
    return png


def _terminate(signum, frame):
    # SIGTERM (a ctest or CI stop, kill): unwind, so that the volume is
    # unmounted and stopped and the namespaces removed.
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGTERM, _terminate)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_WORKFLOW_ROUNDS", 3)))
    p.add_argument("--frames", type=int, default=128, help="frames per pair (HiCOMB 2024: 128)")
    p.add_argument("--sim", type=float, default=0.02, help="seconds of simulation before each frame")
    p.add_argument("--sizes", default=",".join(wf.FRAME_SIZES), help="frame sizes of the 1-pair table")
    p.add_argument("--scale", default="4x4,8x4", help="PAIRSxNODES runs at 2.46 MiB (empty: none)")
    p.add_argument("--resnet", type=int, default=2048, help="resnet50-like samples (150,528 B)")
    p.add_argument("--unet", type=int, default=8, help="unet3d-like samples (~140 MB; scaled down to fit)")
    p.add_argument("--unet-size", type=int, default=UNET3D_SIZE)
    p.add_argument("--only", choices=["md", "dl"], help="one workload only")
    p.add_argument("--methods", default=",".join(wf.MD_METHODS), help="MD methods of the 1-pair table")
    p.add_argument("--trace-frames", type=int, default=16)
    p.add_argument("--out", default=os.path.join(os.environ.get("BENCH_OUT", os.path.join(wf.ROOT, "build", "bench")),
                                                 "workflow"))
    a = p.parse_args()
    reason = wf.unavailable_reason()
    if reason:
        sys.exit(f"bench-workflow: cannot run here: {reason}")
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "log.txt"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    machine = f"{os.cpu_count()} cores, namespaces of one machine, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    meta = {"machine": machine, "rounds": a.rounds, "frames": a.frames, "sim": a.sim, "dl": {}}
    results = {"meta": meta}
    md_text = dl_text = ""
    if a.only in (None, "md"):
        methods = [m for m in a.methods.split(",") if m]
        unknown = sorted(set(methods) - set(wf.MD_METHODS))
        if unknown:
            sys.exit(f"bench-workflow: unknown MD method(s) {', '.join(unknown)}; choose from {', '.join(wf.MD_METHODS)}")
        configs = [(s, 1, 2, methods) for s in a.sizes.split(",") if s]
        for spec in filter(None, a.scale.split(",")):
            pairs, nodes = (int(x) for x in spec.split("x"))
            configs.append(("2.46MiB", pairs, nodes, ["local", "dyad-wrapper", "gfs-poll", "gfs-barrier"]))
        nodes = max(c[2] for c in configs)
        with wf.Env(nodes) as env:
            runs = run_md_rounds(env, configs, a.rounds, a.frames, a.sim, log)
        md = {k: md_summary(v) for k, v in runs.items()}
        results["md"] = md
        results["md_runs"] = {k: {m: [{x: y for x, y in r.items() if x != "dirs"} for r in rs] for m, rs in v.items()}
                              for k, v in runs.items()}
        md_text = write_md(a.out, md, meta)
    if a.only in (None, "dl"):
        workloads = [("resnet50", a.resnet, RESNET50_SIZE, 32), ("unet3d", a.unet, a.unet_size, 2)]
        workloads = [w for w in workloads if w[1] > 0]
        for name, count, size, batch in workloads:
            meta["dl"][name] = {"count": count, "size": size, "batch": batch}
        with wf.Env(4) as env:
            runs = run_dl_rounds(env, workloads, a.rounds, log)
        dl = {k: dl_summary(v) for k, v in runs.items()}
        results["dl"] = dl
        dl_text = write_dl(a.out, dl, meta)
    charts(a.out, results.get("md", {}), results.get("dl", {}))
    if a.only in (None, "md"):
        results["timeline"] = traced_run(a.out, a.trace_frames, log)
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    print(md_text + "\n" + dl_text)
    log(f"bench-workflow: tables and charts in {a.out}")


if __name__ == "__main__":
    main()
