# SPDX-License-Identifier: Apache-2.0
"""bench/plot.py turns benchmark JSON into PNG charts; the benchmarks write
under build/bench/, never into the tracked bench/results/."""
import json
import os
import re
import subprocess
import sys

from pydyad_testlib import ROOT

PLOT = os.path.join(ROOT, "bench", "plot.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SAMPLE = {
    "latest.json": {
        "quick": True,
        "summary": {
            "big": {"bytes": 1 << 28, "dyad_consume_wall_GBps": 0.5, "dyad_consume_wall_GBps_range": [0.4, 0.6],
                    "dyad_transfer_GBps": 0.6, "cp_GBps": 2.0, "iperf3_GBps": 2.5, "dd_GBps": 1.8},
            "small": {"files": 200, "file_bytes": 65536, "dyad_consume_files_per_s": 900.0,
                      "dyad_produce_files_per_s": 4000.0, "cp_r_files_per_s": 5000.0},
        },
    },
    "wrapper_overhead.json": {"files": 1000, "reps": 2, "without_s": [0.010, 0.011], "with_s": [0.011, 0.012],
                              "ratio": 0.92},
}


def plot(*args):
    return subprocess.run([sys.executable, PLOT, *map(str, args)], capture_output=True, text=True, timeout=120)


def assert_png(path):
    assert os.path.exists(path), path
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000, (path, len(data))


def test_sample_json_becomes_png(tmp_path):
    for name, data in SAMPLE.items():
        (tmp_path / name).write_text(json.dumps(data))
    p = plot(tmp_path, "--out", tmp_path / "png")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path / "png")) == ["bench.png", "wrapper_overhead.png"]
    for f in ("bench.png", "wrapper_overhead.png"):
        assert_png(tmp_path / "png" / f)


def test_every_tracked_reference_result_plots(tmp_path):
    results = os.path.join(ROOT, "bench", "results")
    p = plot(results, "--out", tmp_path)
    assert p.returncode == 0, p.stderr
    expected = {"latest.json": "bench.png", "ucx.json": "ucx.png", "ofi.json": "ofi.png", "auto.json": "auto.png",
                "fairness.json": "fairness.png", "auth.json": "auth.png",
                "wrapper_overhead.json": "wrapper_overhead.png"}
    for js, png in expected.items():
        if os.path.exists(os.path.join(results, js)):
            assert_png(tmp_path / png)


def test_no_results_is_an_error(tmp_path):
    p = plot(tmp_path)
    assert p.returncode == 1 and "no benchmark results" in p.stderr


def test_benchmarks_write_under_the_build_directory_only(tmp_path):
    code = ("import sys, os; sys.path.insert(0, sys.argv[1]); import bench_output as b; "
            "print(b.out_dir()); print(b.results_path('x'))")
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_OUT", "DYAD_BUILD_DIR")}
    p = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "bench")], env=env, capture_output=True,
                       text=True, check=True)
    assert p.stdout.splitlines()[0] == os.path.join(ROOT, "build", "bench")
    env["BENCH_OUT"] = str(tmp_path / "out")
    p = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "bench")], env=env, capture_output=True,
                       text=True, check=True)
    assert p.stdout.splitlines() == [str(tmp_path / "out"), str(tmp_path / "out" / "x.json")]
    # No benchmark script names bench/results/ as a place to write.
    for f in os.listdir(os.path.join(ROOT, "bench")):
        if f.endswith(".py"):
            with open(os.path.join(ROOT, "bench", f)) as fh:
                src = fh.read()
            assert not re.search(r"""["']results["']\s*,""", src), f"bench/{f} writes into bench/results"
