# SPDX-License-Identifier: Apache-2.0
"""Where `make bench` writes: $BENCH_OUT, else $DYAD_BUILD_DIR/bench, else
build/bench. Never bench/results/, whose JSON files are tracked reference
results (see bench/README.md)."""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def out_dir():
    d = os.environ.get("BENCH_OUT")
    if not d:
        d = os.path.join(os.environ.get("DYAD_BUILD_DIR") or os.path.join(ROOT, "build"), "bench")
    return os.path.abspath(d)


def results_path(name):
    """Path of NAME.json in the output directory (created)."""
    d = out_dir()
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, f"{name}.json")


def save(name, results):
    """Writes a benchmark's results to NAME.json in the output directory;
    returns the path."""
    path = results_path(name)
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2)
    return path
