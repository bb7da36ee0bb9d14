#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Charts of `make bench` results: one PNG per benchmark family, from the JSON
files the benchmark scripts write.

    /usr/bin/python3 bench/plot.py [DIR] [--out OUTDIR]

DIR: where the JSON files are (default: build/bench/, where `make bench`
writes; bench/results/ holds tracked reference results). OUTDIR: where the
PNG files go (default: DIR, except for bench/results/, whose charts go to
build/bench/reference/: nothing is written into the source tree). Families whose JSON file is absent are skipped;
the script fails if it found none at all.

| JSON | PNG | what it shows |
|---|---|---|
| latest.json | bench.png | files/s by file size and file system: DYAD vs rsync daemon, tar piped through socat, cp -r; GB/s: 1 GiB file vs the plain copy, cp, iperf3; 256 MiB by transport vs the stream; 8 concurrent consumers vs 8 plain copies (results of the older bench.py: 1 GiB vs cp, iperf3, dd; 2,000 small files vs cp -r) |
| ucx.json | ucx.png | UCX per UCX_TLS: DYAD (auto, tag) vs cp and ucx_perftest |
| ofi.json | ofi.png | MARGO per protocol: DYAD (process, transfer) vs cp and the raw fi_read loop |
| auto.json | auto.png | every DYAD_DTL_MODE and AUTO vs cp, other node and same node |
| fairness.json | fairness.png | fast consumers alone vs beside a slow one, per memory budget |
| auth.json | auth.png | with vs without the job key |
| wrapper_overhead.json | wrapper_overhead.png | open/read/close loop with vs without the LD_PRELOAD wrapper |

Bars are medians, whiskers the range over the measured rounds (when the
JSON has them), and the label above a DYAD bar its ratio to the baseline
(DYAD / baseline throughput: 1.0 = as fast).
"""
import argparse
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_output  # noqa: E402

DYAD_COLOR = "#1f77b4"
BASE_COLOR = "#bbbbbb"
REF_COLOR = "#7f7f7f"


def _median(v):
    if isinstance(v, (list, tuple)):
        return statistics.median(v) if v else None
    return v


def _span(v):
    return (min(v), max(v)) if isinstance(v, (list, tuple)) and len(v) > 1 else None


class Bar:
    """One bar: a label, a value (or the list of rounds: median shown), an
    optional (low, high) range, and its kind (dyad, baseline, reference)."""

    def __init__(self, label, value, span=None, kind="dyad", ratio_to=None):
        self.label = label
        self.value = _median(value)
        self.span = span if span is not None else _span(value)
        self.kind = kind
        self.ratio_to = ratio_to  # label of the bar this one is compared with


def _fmt(v):
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _draw(ax, title, bars, unit, log=False):
    bars = [b for b in bars if b.value is not None]
    xs = range(len(bars))
    colors = [{"dyad": DYAD_COLOR, "baseline": BASE_COLOR}.get(b.kind, REF_COLOR) for b in bars]
    hatches = ["//" if b.kind == "reference" else "" for b in bars]
    rects = ax.bar(xs, [b.value for b in bars], color=colors, edgecolor="black", linewidth=0.5)
    for r, h in zip(rects, hatches):
        r.set_hatch(h)
    for x, b in zip(xs, bars):
        if b.span and b.span[0] != b.span[1]:
            lo, hi = b.span
            ax.plot([x, x], [lo, hi], color="black", linewidth=1)
            ax.plot([x - 0.08, x + 0.08], [lo, lo], color="black", linewidth=1)
            ax.plot([x - 0.08, x + 0.08], [hi, hi], color="black", linewidth=1)
    by_label = {b.label: b for b in bars}
    for x, b in zip(xs, bars):
        text = _fmt(b.value)
        ref = by_label.get(b.ratio_to)
        if ref is not None and ref.value:
            text += f"\n×{b.value / ref.value:.2f} vs\n{ref.label.replace(chr(10), ' ')}"
        top = max(b.value, b.span[1] if b.span else 0)
        ax.annotate(text, (x, top), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b.label for b in bars], fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ymax = max([max(b.value, b.span[1] if b.span else 0) for b in bars] or [1])
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=ymax * 4)
    else:
        ax.set_ylim(0, ymax * 1.3)
    ax.grid(axis="y", alpha=0.3)


def _figure(panels, title, path, cols=None):
    """panels: [(subtitle, bars, unit, log)]; one row unless cols is given."""
    panels = [p for p in panels if any(b.value is not None for b in p[1])]
    if not panels:
        return None
    cols = cols or len(panels)
    rows = (len(panels) + cols - 1) // cols
    width = max(6.5, 4.2 * cols, max(len(p[1]) for p in panels) * 1.15 * cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 4.0 * rows), squeeze=False)
    for ax, (sub, bars, unit, log) in zip(axes.flat, panels):
        _draw(ax, sub, bars, unit, log)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    kinds = {b.kind for p in panels for b in p[1] if b.value is not None}
    legend = [matplotlib.patches.Patch(facecolor=c, edgecolor="black", hatch=h, label=t)
              for k, c, h, t in (("dyad", DYAD_COLOR, "", "DYAD"), ("baseline", BASE_COLOR, "", "baseline"),
                                 ("reference", REF_COLOR, "//", "for reference"))
              if k in kinds]
    fig.legend(handles=legend, loc="upper right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _runs(rounds, key):
    return [r[key] for r in rounds if isinstance(r, dict) and key in r] or None


# -- one function per family: (data, out path) -> path or None ------------------------

def plot_bench(d, path):
    s = d["summary"]
    big, small = s.get("big", {}), s.get("small", {})
    quick = " (BENCH_QUICK)" if d.get("quick") else ""
    size = big.get("bytes")
    if not size:
        size_txt = "one large file"
    elif size >= 1 << 30:
        size_txt = f"{size / 2**30:.3g} GiB file"
    else:
        size_txt = f"{size / 2**20:.4g} MiB file"

    def rng(prefix):
        return tuple(big.get(prefix + "_range")) if big.get(prefix + "_range") else None

    big_bars = [
        Bar("DYAD consume\n(process)", big.get("dyad_consume_wall_GBps"), rng("dyad_consume_wall_GBps"),
            ratio_to="cp"),
        Bar("DYAD\ntransfer", big.get("dyad_transfer_GBps"), rng("dyad_transfer_GBps"), ratio_to="cp"),
        Bar("cp", big.get("cp_GBps"), rng("cp_GBps"), kind="baseline"),
        Bar("iperf3\n(TCP, no file)", big.get("iperf3_GBps"), rng("iperf3_GBps"), kind="reference"),
        Bar("dd bs=1M", big.get("dd_GBps"), rng("dd_GBps"), kind="reference"),
    ]
    n, fb = small.get("files"), small.get("file_bytes")
    small_txt = f"{n} files × {fb // 1024} KiB" if n and fb else "small files"
    srng = lambda k: tuple(small[k]) if small.get(k) else None  # noqa: E731
    small_bars = [
        Bar("DYAD\nconsume", small.get("dyad_consume_files_per_s"), srng("dyad_consume_files_per_s_range"),
            ratio_to="cp -r"),
        Bar("DYAD\nproduce", small.get("dyad_produce_files_per_s"), srng("dyad_produce_files_per_s_range"),
            kind="reference"),
        Bar("cp -r", small.get("cp_r_files_per_s"), srng("cp_r_files_per_s_range"), kind="baseline"),
    ]
    return _figure([(f"Workload 1: {size_txt}", big_bars, "GB/s", False),
                    (f"Workload 2: {small_txt}", small_bars, "files/s", False)],
                   f"DYAD vs baselines, node0 → node1 on loopback{quick}", path)


def dyad_beside_plain_copy(m, dyad_label, copy_label):
    """DYAD's bar (with its ratio) beside the plain copy's, from a row's methods."""
    return [Bar(dyad_label, m["DYAD"]["GBps"], tuple(m["DYAD"]["GBps_range"]), ratio_to=copy_label),
            Bar(copy_label, m["plain copy"]["GBps"], tuple(m["plain copy"]["GBps_range"]), kind="baseline")]


def plot_bench_rows(d, path):
    """bench.py's issue 17 rows: files/s by file size beside rsync and
    tar | socat (each file system), GB/s beside the plain copy and iperf3,
    per transport beside the stream, and concurrent consumers."""
    w = d["workloads"]
    quick = " (BENCH_QUICK)" if d.get("quick") else ""
    panels = []
    by_size = {}
    for wl in w.get("small") or []:
        by_size.setdefault((wl["files"], wl["file_bytes"]), []).append(wl)
    for (n, size), wls in by_size.items():
        bars = []
        for wl in wls:
            for name, m in wl["methods"].items():
                label = f"{name}\n{wl['fs']}"
                ref = f"rsync daemon\n{wl['fs']}" if name == "DYAD" else None
                bars.append(Bar(label, m["files_per_s"], tuple(m["files_per_s_range"]),
                                kind="dyad" if name == "DYAD" else "baseline" if name != "cp -r" else "reference",
                                ratio_to=ref))
        panels.append((f"{n:,} files × {size // 1024} KiB", bars, "files/s", False))
    big = w.get("big")
    if big:
        m = big["methods"]
        bars = dyad_beside_plain_copy(m, "DYAD", "plain copy")
        for name in ("cp", "iperf3"):
            if name in m:
                bars.append(Bar(name if name == "cp" else "iperf3\n(no file)", m[name]["GBps"],
                                tuple(m[name]["GBps_range"]), kind="reference"))
        size = big["bytes"]
        panels.append((f"one {size / 2**30:g} GiB file" if size >= 2**30 else f"one {size / 2**20:g} MiB file", bars,
                       "GB/s", False))
    tr = w.get("transports")
    if tr:
        stream = "stream (FLUX_RPC)"
        bars = [Bar(k.replace(" (", "\n("), v, kind="baseline" if k == stream else "reference" if k == "cp" else "dyad",
                    ratio_to=stream.replace(" (", "\n(") if k not in (stream, "cp") else None)
                for k, v in tr["runs_GBps"].items()]
        panels.append((f"{tr['bytes'] / 2**20:,.0f} MiB file by transport", bars, "GB/s", False))
    conc = w.get("concurrent")
    if conc:
        m = conc["methods"]
        bars = dyad_beside_plain_copy(m, "DYAD\n(consumers)", "plain\ncopies")
        panels.append((f"{conc['bytes'] / 2**30:.3g} GiB in 8 files at once", bars, "GB/s", False))
    return _figure(panels, f"DYAD vs references, node0 → node1 on loopback{quick}", path, cols=2)


def plot_ucx(d, path):
    panels = []
    for label, r in d.items():
        runs = r.get("runs_GBps", {})
        bars = [Bar(f"DYAD auto\n({r.get('auto_protocol', '?')})", runs.get("auto") or r.get("dyad_auto_GBps"),
                    ratio_to="cp"),
                Bar("DYAD tag", runs.get("tag") or r.get("dyad_tag_GBps"), ratio_to="cp"),
                Bar("cp", runs.get("cp") or r.get("cp_GBps"), kind="baseline"),
                Bar("ucx_perftest\ntag bw", r.get("perftest_tag_bw_GBps"), kind="reference"),
                Bar("ucx_perftest\nput bw", r.get("perftest_put_bw_GBps"), kind="reference")]
        panels.append((f"UCX_TLS={r.get('UCX_TLS', label)}", bars, "GB/s (log)", True))
    return _figure(panels, "DYAD_DTL_MODE=UCX: one large file", path)


def plot_ofi(d, path):
    panels = []
    for proto, r in d.items():
        runs = r.get("runs_GBps", {})
        raw = r.get("raw_runs") or []
        bars = [Bar("DYAD consume\n(process)", runs.get("dyad") or r.get("dyad_GBps"), ratio_to="raw client\n(process)"),
                Bar("DYAD\ntransfer", r.get("transfer_runs_GBps") or r.get("dyad_transfer_GBps"),
                    ratio_to="raw fi_read\nloop"),
                Bar("raw client\n(process)", [x[1] for x in raw] or r.get("raw_process_GBps"), kind="baseline"),
                Bar("raw fi_read\nloop", [x[0] for x in raw] or r.get("raw_fi_read_GBps"), kind="baseline"),
                Bar("cp", runs.get("cp") or r.get("cp_GBps"), kind="reference")]
        panels.append((proto, bars, "GB/s", False))
    return _figure(panels, "DYAD_DTL_MODE=MARGO (libfabric): one large file", path)


def plot_auto(d, path):
    panels = []
    for placement, r in d.items():
        modes = [m for m, v in r.items() if isinstance(v, dict) and "big_GBps" in v and m != "cp"]
        best = r.get("best_fixed", {})
        big = [Bar(m, r[m].get("big_runs_GBps") or r[m]["big_GBps"],
                   kind="dyad" if m == "AUTO" else "reference",
                   ratio_to=best.get("big") if m == "AUTO" else None) for m in modes]
        if "cp" in r:
            big.append(Bar("cp", r["cp"].get("big_GBps"), kind="baseline"))
        small = [Bar(m, r[m].get("small_runs_files_per_s") or r[m].get("small_files_per_s"),
                     kind="dyad" if m == "AUTO" else "reference",
                     ratio_to=best.get("small") if m == "AUTO" else None) for m in modes]
        panels.append((f"{placement}: large file", big, "GB/s", False))
        panels.append((f"{placement}: small files", small, "files/s", False))
    return _figure(panels, "DYAD_DTL_MODE=AUTO vs each fixed transport", path, cols=2)


def plot_fairness(d, path):
    bars = []
    for label, r in d.items():
        bars.append(Bar(f"{label}\nalone", r.get("alone_GBps"), kind="baseline"))
        bars.append(Bar(f"{label}\nbeside slow", r.get("beside_slow_GBps"), ratio_to=f"{label}\nalone"))
    return _figure([("four fast consumers, alone and beside one at 1 MB/s", bars, "GB/s", False)],
                   "Fairness under the service's memory budget", path)


def plot_auth(d, path):
    s = d.get("summary", {})
    panels = []
    for kind, title in (("big", "one large file"), ("small", "small files")):
        r = s.get(kind)
        if not r:
            continue
        runs = r.get("runs", {})
        bars = [Bar("with key", runs.get("key") or r.get("key"), ratio_to="no key"),
                Bar("no key", runs.get("no key") or r.get("no_key"), kind="baseline")]
        panels.append((title, bars, r.get("unit", ""), False))
    hs = d.get("handshake")
    if hs:
        panels.append(("connection handshake (median)",
                       [Bar("with key", hs.get("key_median_us"), ratio_to="no key"),
                        Bar("no key", hs.get("no_key_median_us"), kind="baseline")], "µs", False))
    return _figure(panels, "Cost of the job key (DYAD_AUTH_KEY_FILE)", path)


def plot_wrapper(d, path):
    n = d.get("files")
    rate = lambda v: [n / x for x in v] if n and v else None  # noqa: E731
    bars = [Bar("with wrapper\n(active)", rate(d.get("with_s")), ratio_to="without"),
            Bar("without", rate(d.get("without_s")), kind="baseline")]
    return _figure([(f"open/read/close of {n} unmanaged files", bars, "opens/s", False)],
                   "LD_PRELOAD wrapper overhead", path)


FAMILIES = [
    ("latest.json", "bench.png", lambda d, path: (plot_bench_rows if "workloads" in d else plot_bench)(d, path)),
    ("ucx.json", "ucx.png", plot_ucx),
    ("ofi.json", "ofi.png", plot_ofi),
    ("auto.json", "auto.png", plot_auto),
    ("fairness.json", "fairness.png", plot_fairness),
    ("auth.json", "auth.png", plot_auth),
    ("wrapper_overhead.json", "wrapper_overhead.png", plot_wrapper),
]


def plot_dir(src, out):
    """Plots every family found in src into out; returns the PNG paths."""
    os.makedirs(out, exist_ok=True)
    written = []
    for js, png, fn in FAMILIES:
        path = os.path.join(src, js)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            data = json.load(f)
        made = fn(data, os.path.join(out, png))
        if made:
            written.append(made)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=bench_output.out_dir(),
                    help="directory of the JSON results (default: %(default)s)")
    ap.add_argument("--out", help="directory for the PNG files (default: DIR)")
    args = ap.parse_args(argv)
    out = args.out
    if out is None:
        tracked = os.path.realpath(os.path.join(HERE, "results"))
        out = os.path.join(bench_output.out_dir(), "reference") if os.path.realpath(args.dir) == tracked else args.dir
    written = plot_dir(args.dir, out)
    if not written:
        print(f"plot: no benchmark results in {args.dir} ({', '.join(j for j, _, _ in FAMILIES)})",
              file=sys.stderr)
        return 1
    for p in written:
        print(f"plot: wrote {os.path.relpath(p, os.getcwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
