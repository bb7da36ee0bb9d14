# SPDX-License-Identifier: Apache-2.0
"""`make bench-outside`: DYAD measured with outside tools (issue 49), on 2
and 4 network-namespace nodes of this machine, as root.

- DLIO (github argonne-lcf/dlio_benchmark), epochs 1 and 2 of unet3d-like
  and resnet50-like workloads (bench/outside/configs), read three ways:
  through DYAD (pydyad.dlio.DyadTorchDataLoader), from GlusterFS and from
  local disk (DLIO's own PyTorch loader): samples/s, p50/p90/p99 batch wait
  (DLIO's own per-step load times, pooled over ranks and rounds) and DLIO's
  reported throughput and AU.
- The MD frame stream (644 KiB, 2.46 MiB, 8.75 MiB) between two nodes:
  through DYAD (pydyad), MPI send/recv of the same frames (mpi4py on
  OpenMPI), ADIOS2 SST and BP5 (on GlusterFS) when ADIOS2_DIR is given.

Tools come from the environment: OUTSIDE_PYTHON (a python that imports
dlio_benchmark), or DLIO_SRC and HYDRA_SRC (and PYDFTRACER_SRC) from which
scripts/bench-outside-setup.sh makes one; ADIOS2_DIR (an ADIOS2 install).
A row whose tool is missing is printed as skipped, with the reason.

Interleaved rounds: each round runs every method of a configuration once,
the order rotated from round to round; round 0 warms up and is not counted.
Writes $BENCH_OUT/outside: dlio.md, md.md, md.json, results.json, dlio.png,
md.png (the stream rows: bench/outside/md_stream.py).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside as ox  # noqa: E402
import md_stream  # noqa: E402
from md_stream import med, pct, rotated  # noqa: E402  (the same statistics for every row)

wf = ox.wf
WORKLOADS = {"unet3d_dyad": {"batch": 4}, "resnet50_dyad": {"batch": 16}}
FRAME_SIZES = {k: wf.FRAME_SIZES[k] for k in ("644KiB", "2.46MiB", "8.75MiB")}


def f3(x, unit=1.0):
    return "-" if x is None else f"{x * unit:.3g}" if abs(x * unit) < 100 else f"{x * unit:.0f}"


def dlio_python(log):
    """(python, why-not): a python that imports dlio_benchmark."""
    py = os.environ.get("OUTSIDE_PYTHON")
    if not py and os.environ.get("DLIO_SRC") and os.environ.get("HYDRA_SRC"):
        venv = os.environ.get("OUTSIDE_VENV") or os.path.join(os.path.dirname(os.path.abspath(
            os.environ["DLIO_SRC"])), "dlio-venv")
        py = os.path.join(venv, "bin", "python")
        if subprocess.run([py, "-c", "import dlio_benchmark.main"], capture_output=True).returncode != 0:
            log(f"bench-outside: making {venv} from DLIO_SRC and HYDRA_SRC (scripts/bench-outside-setup.sh)")
            p = subprocess.run(["bash", os.path.join(wf.ROOT, "scripts", "bench-outside-setup.sh")],
                               env=dict(os.environ, OUTSIDE_VENV=venv), capture_output=True, text=True)
            if p.returncode != 0:
                return None, f"scripts/bench-outside-setup.sh failed: {p.stderr.strip()[-400:]}"
    if not py:
        return None, "DLIO is not installed: set DLIO_SRC and HYDRA_SRC (or OUTSIDE_PYTHON)"
    p = subprocess.run([py, "-c", "import dlio_benchmark.main, torch, mpi4py"], capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"{py} cannot import DLIO: {p.stderr.strip().splitlines()[-1:]}"
    return py, None


def dlio_commit():
    src = os.environ.get("DLIO_SRC")
    if not src:
        return "unknown (DLIO_SRC unset)"
    p = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "unknown (DLIO_SRC is not a git tree)"


def mpi_unavailable():
    if shutil.which("mpirun") is None:
        return "mpirun is missing: bash bench/outside/install-deps.sh (openmpi-bin)"
    if subprocess.run(["/usr/bin/python3", "-c", "import mpi4py"], capture_output=True).returncode:
        return "mpi4py is missing: bash bench/outside/install-deps.sh (python3-mpi4py)"
    return None


def dlio_rounds(env, py, nodes, workloads, rounds, log, results):
    template_root = os.path.join(env.cluster.root, "templates")
    for wl in workloads:
        tmpl = os.path.join(template_root, wl)
        if not os.path.isdir(tmpl):
            n = ox.generate(py, wl, tmpl, env.cluster.root)
            log(f"dlio: generated {n} files of {wl}")
        folders = ox.place_dataset(env, wl, tmpl, nodes)
        for r in range(rounds + 1):
            for m in rotated(ox.DLIO_METHODS, r):
                t = time.time()
                try:
                    res = ox.run_dlio(env, py, m, wl, WORKLOADS[wl]["batch"], folders[m], nodes)
                except RuntimeError as e:  # e.g. OpenMPI's daemons failing to connect: once more
                    log(f"dlio round {r} {wl} {nodes} nodes {m}: failed, running it again: {str(e)[:300]}")
                    res = ox.run_dlio(env, py, m, wl, WORKLOADS[wl]["batch"], folders[m], nodes)
                log(f"dlio round {r} {wl} {nodes} nodes {m}: " + ", ".join(
                    f"epoch {e['epoch']} {e['samples_per_s']:.1f} samples/s p99 wait {pct(e['waits'], .99):.3f} s"
                    for e in res["epochs"]) + f" ({time.time() - t:.0f} s)")
                if r:
                    results.setdefault(f"{wl}|{nodes}", {}).setdefault(m, []).append(res)


def dlio_summary(runs):
    out = {}
    for m, rs in runs.items():
        s = {}
        for e in (1, 2):
            eps = [ep for r in rs for ep in r["epochs"] if ep["epoch"] == e]
            waits = [w for ep in eps for w in ep["waits"]]
            thr = [r["dlio"]["throughput_samples_per_s"] for r in rs]
            thr = [t[e - 1] if isinstance(t, list) and len(t) >= e else None for t in thr]
            au = [r["dlio"]["au_percent"] for r in rs]
            au = [a[e - 1] if isinstance(a, list) and len(a) >= e else None for a in au]
            s[e] = {"samples_per_s": med([ep["samples_per_s"] for ep in eps]), "p50": pct(waits, .5),
                    "p90": pct(waits, .9), "p99": pct(waits, .99), "dlio_throughput": med(thr),
                    "dlio_au": med(au), "first": med([w for ep in eps for w in ep["first_waits"]]),
                    "runs": len(eps)}
        out[m] = s
    return out


def goals_dlio(s):
    d, g, lo = s.get("dyad"), s.get("gfs"), s.get("local")
    if not (d and g and lo):
        return {}

    def ratio(a, b):
        return a / b if a is not None and b else None
    return {"epoch1_vs_gfs": ratio(d[1]["samples_per_s"], g[1]["samples_per_s"]),
            "epoch2_vs_local": ratio(d[2]["samples_per_s"], lo[2]["samples_per_s"]),
            "p99_vs_gfs_epoch1": ratio(g[1]["p99"], d[1]["p99"])}


def write_dlio(outdir, summaries, meta, skipped):
    lines = [f"# DLIO through DYAD, GlusterFS and local disk ({meta['machine']})", "",
             f"DLIO {meta['dlio_commit']} (main branch), PyTorch {meta.get('torch', '?')}; medians over "
             f"{meta['rounds']} interleaved rounds (after one warm-up); batch waits are DLIO's own per-step load "
             "times, pooled over ranks and rounds, without each rank's first step of an epoch (the DataLoader's start, "
             "excluded by DLIO's own figures too: its median is the 'first batch' column). dyad: pydyad.dlio.DyadTorchDataLoader (global shuffle, "
             "prefetch of 64 MiB in flight, ramped; local reads checked by install stamp); gfs and local: DLIO's PyTorch loader.", ""]
    if skipped:
        lines += [f"Skipped: {skipped}", ""]
    for key, s in summaries.items():
        wl, nodes = key.split("|")
        lines += [f"## {wl}, {nodes} nodes ({nodes} ranks)", "",
                  "| method | epoch | samples/s | batch wait p50 (ms) | p90 (ms) | p99 (ms) | first batch (ms) | "
                  "DLIO samples/s | DLIO AU % |", "|---|---|---|---|---|---|---|---|---|"]
        for m in ox.DLIO_METHODS:
            for e in (1, 2):
                x = s.get(m, {}).get(e)
                if x:
                    lines.append(f"| {m} | {e} | {f3(x['samples_per_s'])} | {f3(x['p50'], 1e3)} | "
                                 f"{f3(x['p90'], 1e3)} | {f3(x['p99'], 1e3)} | {f3(x['first'], 1e3)} | {f3(x['dlio_throughput'])} | "
                                 f"{f3(x['dlio_au'])} |")
        g = goals_dlio(s)
        if g:
            lines += ["", f"Goals: epoch 1 {g['epoch1_vs_gfs']:.2f}x GlusterFS (goal 3x), epoch 2 "
                          f"{g['epoch2_vs_local']:.2f}x local (goal 0.95x), epoch 1 p99 batch wait GlusterFS's / DYAD's "
                          f"{g['p99_vs_gfs_epoch1']:.2f} (goal 5)."]
        lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(outdir, "dlio.md"), "w") as f:
        f.write(text)
    return text


def charts(outdir, dl):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if dl:
        fig, axes = plt.subplots(1, len(dl), figsize=(4.2 * len(dl), 3.6), squeeze=False)
        for ax, (key, s) in zip(axes[0], dl.items()):
            for i, m in enumerate(ox.DLIO_METHODS):
                vals = [s.get(m, {}).get(e, {}).get("samples_per_s") or 0 for e in (1, 2)]
                ax.bar([e + (i - 1) * 0.27 for e in (1, 2)], vals, 0.27, label=m)
            ax.set_xticks([1, 2], ["epoch 1", "epoch 2"])
            ax.set_title(key.replace("|", ", ") + " nodes", fontsize=9)
            ax.set_ylabel("samples/s")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "dlio.png"), dpi=110)
        plt.close(fig)


def traced_dlio(py, workload, nodes, outdir, log):
    """One DYAD DLIO run with DYAD_TRACE on every dyadd and rank: the
    timeline (bench/workflow/timeline.py) and its per-event summary, to see
    what bounds a consumer per file."""
    trace = os.path.join(outdir, f"trace-{workload}-{nodes}n")
    shutil.rmtree(trace, ignore_errors=True)
    os.makedirs(trace)
    with wf.Env(nodes, gfs=False, trace_dir=trace) as env:
        tmpl = os.path.join(env.cluster.root, "templates", workload)
        ox.generate(py, workload, tmpl, env.cluster.root)
        folders = ox.place_dataset(env, workload, tmpl, nodes, gfs=False)
        res = ox.run_dlio(env, py, "dyad", workload, WORKLOADS[workload]["batch"], folders["dyad"], nodes,
                          trace_dir=trace)
    png = os.path.join(outdir, f"trace-{workload}-{nodes}n.png")
    p = subprocess.run(["/usr/bin/python3", os.path.join(wf.ROOT, "bench", "workflow", "timeline.py"), trace, png],
                       capture_output=True, text=True)
    text = p.stdout + p.stderr
    with open(os.path.join(outdir, f"trace-{workload}-{nodes}n.txt"), "w") as f:
        f.write(text)
    log(f"traced {workload} on {nodes} nodes: " + ", ".join(f"epoch {e['epoch']} {e['samples_per_s']:.1f} samples/s"
                                                          for e in res["epochs"]) + "\n" + text)
    shutil.rmtree(trace, ignore_errors=True)
    return {"run": res, "summary": text}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_OUTSIDE_ROUNDS", 3)))
    p.add_argument("--nodes", default="2,4")
    p.add_argument("--workloads", default="unet3d_dyad,resnet50_dyad")
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--sizes", default=",".join(FRAME_SIZES))
    p.add_argument("--md-methods", default=md_stream.DEFAULT_METHODS,
                   help=f"the stream's methods, of {','.join(md_stream.ORDER)}; the first DYAD one is judged by "
                   "the goals")
    p.add_argument("--only", choices=["dlio", "md", "trace"])
    p.add_argument("--tables-from", metavar="RESULTS_JSON", help="write the tables and charts again from a "
                   "results.json (no measurement)")
    p.add_argument("--out", default=os.path.join(os.environ.get("BENCH_OUT", os.path.join(wf.ROOT, "build", "bench")),
                                                 "outside"))
    a = p.parse_args()
    if a.tables_from:
        with open(a.tables_from) as fh:
            r = json.load(fh)
        os.makedirs(a.out, exist_ok=True)
        if r.get("dlio"):
            dl = {k: {m: {int(e): v for e, v in s.items()} for m, s in x.items()} for k, x in r["dlio"].items()}
            print(write_dlio(a.out, dl, r["meta"], r["skipped"].get("dlio")))
        md = r.get("md") or r.get("runs")  # a results.json or an md.json
        if md:
            print(md_stream.write_md(a.out, md, r["meta"], {k: r["skipped"].get(k) for k in ("mpi", "adios2")},
                                     r.get("md_failures", r.get("failures", []))))
            md_stream.chart(a.out, md)
        if r.get("dlio"):
            charts(a.out, dl)
        return
    reason = wf.unavailable_reason()
    if reason:
        sys.exit(f"bench-outside: cannot run here: {reason}")
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    machine = f"{os.cpu_count()} cores, namespaces of one machine, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    meta = {"machine": machine, "rounds": a.rounds, "frames": a.frames, "dlio_commit": dlio_commit()}
    skipped = {"dlio": None, "mpi": mpi_unavailable(), "adios2": ox.adios2_unavailable(os.environ.get("ADIOS2_DIR"))}
    results = {"meta": meta, "skipped": skipped}
    texts = []
    if a.only in (None, "dlio"):
        py, skipped["dlio"] = dlio_python(log)
        skipped["dlio"] = skipped["dlio"] or skipped["mpi"]
        runs = {}
        if not skipped["dlio"]:
            meta["torch"] = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                           text=True).stdout.strip()
            for nodes in (int(x) for x in a.nodes.split(",")):
                with wf.Env(nodes) as env:
                    dlio_rounds(env, py, nodes, a.workloads.split(","), a.rounds, log, runs)
        else:
            log(f"bench-outside: DLIO rows skipped: {skipped['dlio']}")
        results["dlio"] = {k: dlio_summary(v) for k, v in runs.items()}
        results["dlio_runs"] = runs
        texts.append(write_dlio(a.out, results["dlio"], meta, skipped["dlio"]))
    if a.only in (None, "md"):
        exe = None
        if not skipped["adios2"]:
            try:
                exe = ox.build_adios2_driver(os.environ["ADIOS2_DIR"], a.out)
            except subprocess.CalledProcessError as e:
                skipped["adios2"] = f"building bench/outside/adios2_frames.cpp failed: {e.stderr.strip()[-300:]}"
        for k in ("mpi", "adios2"):
            if skipped[k]:
                log(f"bench-outside: {k} rows skipped: {skipped[k]}")
        if exe:
            meta["adios2"] = ox.adios2_version(os.environ["ADIOS2_DIR"])
        meta["storage"] = md_stream.storage()
        argv = [x for i, x in enumerate(sys.argv[1:]) if x != "--out" and (i == 0 or sys.argv[i] != "--out")]
        meta["command"] = ("ADIOS2_DIR=... " if exe else "") + "python3 bench/outside/run.py " + " ".join(argv)
        load0 = os.getloadavg()[0]
        with wf.Env(2) as env:
            md, failures = md_stream.md_rounds(env, a.sizes.split(","), a.frames, a.rounds, log,
                                               a.md_methods.split(","), exe, skipped)
        meta["load"] = f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        results["md"], results["md_failures"] = md, failures
        texts.append(md_stream.write_md(a.out, md, meta, {k: skipped[k] for k in ("mpi", "adios2")}, failures))
        md_stream.chart(a.out, md)
    if a.only in (None, "trace") and not skipped["dlio"]:
        py, why = dlio_python(log)
        if py:
            results["trace"] = {wl: traced_dlio(py, wl, max(int(x) for x in a.nodes.split(",")), a.out, log)
                                for wl in a.workloads.split(",")}
    charts(a.out, results.get("dlio"))
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    print("\n".join(texts))
    log(f"bench-outside: tables and charts in {a.out}")


if __name__ == "__main__":
    main()
