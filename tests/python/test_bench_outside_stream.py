# SPDX-License-Identifier: Apache-2.0
"""bench/outside's stream rows (issue 49): the figures every method's run is
reduced to, the ratios taken round by round (a failed run leaves its round
out, it is never filled in), and the table written again from md.json."""
import json
import os
import subprocess
import sys

import pytest

from pydyad_testlib import ROOT

OUTSIDE = os.path.join(ROOT, "bench", "outside")
sys.path.insert(0, OUTSIDE)
import md_stream  # noqa: E402

ox = md_stream.ox


def run(fps, load=3.0):
    """A run's figures as stream_figures makes them, `fps` frames/s steady."""
    done = [100.0 + i / fps for i in range(8)]
    return dict(ox.stream_figures({"load1": load}, 1_000_000, 99.5, done), frame_done=None)


def test_stream_figures_steady_and_end_to_end():
    r = ox.stream_figures({}, 2_000_000, 9.5, [10.0, 10.1, 10.2, 10.3])
    assert r["steady_fps"] == pytest.approx(10.0)  # 3 frames after the first in 0.3 s
    assert r["steady_MB_per_s"] == pytest.approx(20.0)
    assert r["frames_per_s"] == pytest.approx(5.0)  # 4 frames in 0.8 s from the start
    assert r["gaps"] == pytest.approx([0.1, 0.1, 0.1])


def test_ratios_are_per_round_and_skip_failed_rounds():
    md = {"644KiB": {"pydyad": [run(100), run(300), run(200)],
                     "adios2-sst": [run(50), None, run(400)],
                     "mpi": [run(1000), run(1000), run(1000)]}}
    s = md_stream.summarize(md)["644KiB"]
    sst = s["ratios"]["pydyad / adios2-sst"]["steady_fps"]
    assert sst == pytest.approx([1.25, 0.5, 2.0])  # rounds 1 and 3 only: 2.0 and 0.5
    assert s["ratios"]["pydyad / mpi"]["steady_fps"] == pytest.approx([0.2, 0.1, 0.3])
    assert s["methods"]["adios2-sst"]["runs"] == 2 and s["methods"]["adios2-sst"]["failed"] == 1


def test_table_again_from_md_json(tmp_path):
    md = {"2.46MiB": {"pydyad": [run(200)], "adios2-sst": [None]}}
    meta = {"machine": "test", "rounds": 1, "frames": 8, "adios2": "2.12.1"}
    failure = "round 1 2.46MiB adios2-sst: \x1b[1;36mwriter\x1b[0m: /tmp/dyad-cluster-x/a.stream gone"
    md_stream.write_md(str(tmp_path), md, meta, {"mpi": "mpirun is missing"}, [failure])
    out = tmp_path / "again"
    p = subprocess.run([sys.executable, os.path.join(OUTSIDE, "run.py"), "--tables-from",
                        str(tmp_path / "md.json"), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = (out / "md.md").read_text()
    assert "| 2.46MiB | pydyad | 200 (200-200) |" in text
    assert "Skipped mpi: mpirun is missing" in text
    assert "Failed run (left out): round 1 2.46MiB adios2-sst: writer: <cluster>/a.stream gone" in text
    assert "\x1b" not in text and json.loads((out / "md.json").read_text())["summary"]
