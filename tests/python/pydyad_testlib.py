# SPDX-License-Identifier: Apache-2.0
"""Helpers for the pydyad tests: real dyadd services (scripts/harness.py) and
pydyad code run in subprocesses with a node's environment (libdyad keeps one
context per process, so each simulated client is its own process)."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
EXAMPLES_DIR = os.path.join(ROOT, "examples", "python")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, PYTHON_DIR)
import harness  # noqa: E402

# The library of the build whose dyadd the harness runs.
LIBDYAD = os.environ.get("DYAD_LIBRARY") or os.path.join(harness.BUILD, "lib", "libdyad.so")


# A libdyad built with AddressSanitizer loads into Python only with the ASan
# runtime preloaded.
SANITIZER_ENV = harness.sanitizer_runtime_env(LIBDYAD)


def pyenv(node=None, producer=True, consumer=True, library=True, **extra):
    """Environment of a pydyad process on `node` (node.env() plus PYTHONPATH
    and DYAD_LIBRARY); without a node, no DYAD_* variable at all."""
    if node is not None:
        env = node.env(producer=producer, consumer=consumer, **extra)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
        env.update({k: str(v) for k, v in extra.items()})
    env["PYTHONPATH"] = PYTHON_DIR
    if library:
        env["DYAD_LIBRARY"] = LIBDYAD
        env.update(SANITIZER_ENV)
    else:
        env.pop("DYAD_LIBRARY", None)
    return env


PRELUDE = "import json, os, sys, time\nimport pydyad\nfrom pydyad import Dyad, DyadError, dyad_open\n"


def _code(code, defs=""):
    return PRELUDE + textwrap.dedent(defs) + "\n" + textwrap.dedent(code)


def run_py(node, code, *, env=None, timeout=120, check=True, args=(), defs="", **env_extra):
    """Runs `code` (dedented, after PRELUDE and `defs`) as a process of `node`."""
    env = env if env is not None else pyenv(node, **env_extra)
    p = subprocess.run([sys.executable, "-c", _code(code, defs), *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"pydyad process failed ({p.returncode}):\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def spawn_py(node, code, *, env=None, args=(), stdin=None, defs="", **env_extra):
    env = env if env is not None else pyenv(node, **env_extra)
    return subprocess.Popen([sys.executable, "-c", _code(code, defs), *args], env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=120, check=True):
    """Waits for a spawn_py process; returns (stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"pydyad process did not finish in {timeout}s:\nstdout:\n{out}\nstderr:\n{err}")
    if check and proc.returncode != 0:
        raise AssertionError(f"pydyad process failed ({proc.returncode}):\nstdout:\n{out}\nstderr:\n{err}")
    return out, err


def last_json(text):
    """The JSON object printed on the last non-empty line of `text`."""
    lines = [l for l in text.splitlines() if l.strip()]
    assert lines, "the process printed nothing"
    return json.loads(lines[-1])
