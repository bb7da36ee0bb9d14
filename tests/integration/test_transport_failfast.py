# SPDX-License-Identifier: Apache-2.0
"""A transport that cannot work in a consumer's process (issue 50, item 4).

A fixed DYAD_DTL_MODE whose setup fails is an error at once, naming the
setting and the choices: the CLI exits 1 and dyad_init_env returns the
transport's code, instead of waiting out DYAD_WAIT_TIMEOUT for a file the
transport could never move. AUTO leaves such a transport out with one
warning and moves every file by the others. Upstream DYAD's Mercury
protocol names for MARGO: the ones libfabric serves are taken, the others
refused saying they are Mercury-only and what to use instead.

No timing is asserted: the consumers wait up to 600 s for files nobody
produces, so a consumer that waits instead of failing ends on the
subprocess's timeout, which fails the test."""
import json
import os
import subprocess
import sys

import pytest

import harness

sha = harness.sha256
BUILT = harness.built_transports()
LONG_WAIT = {"DYAD_WAIT_TIMEOUT": 600}
GENEROUS = 120  # the subprocess's timeout, in seconds: a consumer that waits fails the test on it

# DYAD_RC_* of include/dyad/common/dyad_rc.h
RC = {"MARGO": -4002, "UCX": -3001}  # DYAD_RC_MARGO_BAD_PROTO, DYAD_RC_UCXINIT_FAIL

# mode -> (the consumer's settings that make it impossible, what the error must name)
BROKEN = {
    "MARGO": ({"DYAD_MARGO_PROTO": "ofi+nosuch"}, ["DYAD_MARGO_PROTO='ofi+nosuch'", "ofi+tcp", "ofi+shm"]),
    "UCX": ({"UCX_TLS": "nosuch", "UCX_WARN_UNUSED_ENV_VARS": "n"},
            ["UCX_TLS='nosuch'", "UCX's transports on this machine are", "tcp"]),
}


def libfabric_protocols_here():
    """The libfabric protocols DYAD finds usable here: what `dyad config`
    says after "available:" for MARGO (fi_getinfo with DYAD's hints)."""
    cfg = json.loads(subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)
    info = next(t.get("info", "") for t in cfg["transports_built"] if t["name"] == "MARGO")
    return set(info.split("available: ", 1)[1].split()) if "available: " in info else set()


def need(mode):
    if mode not in BUILT:
        pytest.skip(f"this build has no {mode} transport")


@pytest.mark.parametrize("mode", sorted(BROKEN))
def test_a_fixed_mode_that_cannot_work_fails_at_once(cluster, mode):
    need(mode)
    cons = cluster[1]
    settings, named = BROKEN[mode]
    env = {**LONG_WAIT, "DYAD_DTL_MODE": mode, **settings}
    p = cons.dyad("consume", cons.path("never.bin"), check=False, timeout=GENEROUS, env_extra=env)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"DYAD_DTL_MODE={mode} cannot work in this process" in p.stderr, p.stderr
    for text in named:
        assert text in p.stderr, (text, p.stderr)
    others = [t for t in BUILT if t != mode] + ["AUTO"]
    for t in others:  # the other choices
        assert t in p.stderr.split("cannot work in this process")[1], (t, p.stderr)
    assert not os.path.exists(cons.path("never.bin"))


C_API = r"""
import ctypes, os, sys
lib = ctypes.CDLL(os.path.join(sys.argv[1], "lib", "libdyad.so"))
lib.dyad_init_env.argtypes = [ctypes.c_int, ctypes.c_void_p]
lib.dyad_init_env.restype = ctypes.c_int
print(lib.dyad_init_env(1, None))  # DYAD_COMM_RECV
"""


@pytest.mark.parametrize("mode", sorted(BROKEN))
def test_the_c_api_returns_the_transports_error_code(cluster, mode):
    """dyad_init_env of a consumer with a fixed transport that cannot work
    returns that transport's code (it used to return DYAD_RC_OK, and the
    first dyad_consume waited for its file)."""
    need(mode)
    cons = cluster[1]
    settings, named = BROKEN[mode]
    env = cons.env(**LONG_WAIT, DYAD_DTL_MODE=mode, **settings)
    p = subprocess.run([sys.executable, "-c", C_API, harness.BUILD], env=env, capture_output=True, text=True,
                       timeout=GENEROUS)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.splitlines()[-1]) == RC[mode], (p.stdout, p.stderr)  # UCX logs to stdout first
    assert named[0] in p.stderr, p.stderr  # logged by dyad_init


@pytest.mark.parametrize("mode", sorted(BROKEN))
def test_auto_leaves_out_a_transport_that_cannot_work_with_one_warning(mode):
    """The owner's figures make `mode` AUTO's choice for every file; the
    consumer cannot set it up: every file still arrives intact, by another
    transport, and the consumer warns once (it used to say so only in debug
    logs)."""
    need(mode)
    c = harness.Cluster(nodes=2, env={"DYAD_DTL_FIGURES": f"{mode}=1/500", "UCX_WARN_UNUSED_ENV_VARS": "n"})
    try:
        prod, cons = c[0], c[1]
        sizes = {f"auto/f{i:02d}.bin": s for i, s in enumerate([0, 1, 4096, 65536, (3 << 20) + 1] * 4)}
        for n, s in sizes.items():
            harness.write_file(prod.path(n), s, seed=len(n) + s)
        prod.dyad("produce", *[prod.path(n) for n in sizes])
        settings, named = BROKEN[mode]
        env = {**LONG_WAIT, "DYAD_DTL_MODE": "AUTO", "DYAD_CONSUME_WINDOW": 8, **settings}
        p = cons.dyad("--json", "consume", *[cons.path(n) for n in sizes], check=False, timeout=GENEROUS,
                      env_extra=env)
        assert p.returncode == 0, p.stderr
        # (UCX writes its own warnings to stdout: UCX_LOG_FILE's default.)
        reports = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert len(reports) == len(sizes) and all(r["transport"] != mode for r in reports), reports
        for n in sizes:
            assert sha(cons.path(n)) == sha(prod.path(n)), n
        warnings = [line for line in p.stderr.splitlines() if f"{mode} cannot work in this process" in line]
        assert len(warnings) == 1, p.stderr
        assert named[0] in warnings[0] and "AUTO leaves it out" in warnings[0], warnings
    finally:
        c.cleanup()


# Mercury's names that a libfabric provider serves -> the protocol DYAD uses.
MERCURY_SERVED = [("na+sm", "ofi+shm"), ("sm", "ofi+shm"), ("tcp", "ofi+tcp"), ("ofi+tcp://", "ofi+tcp"),
                  ("OFI+TCP;OFI_RXM", "ofi+tcp"), ("verbs", "ofi+verbs")]


def test_upstream_protocol_names_that_libfabric_serves(cluster):
    """Each name moves a file over the provider it maps to (the owner's
    counters say which protocol served it); a provider missing here is an
    error naming the protocol it maps to, at once."""
    need("MARGO")
    prod, cons = cluster[0], cluster[1]
    have = libfabric_protocols_here()
    for i, (name, ours) in enumerate(MERCURY_SERVED):
        f = f"names/{i}.bin"
        harness.write_file(prod.path(f), (1 << 20) + i, seed=i)
        prod.dyad("produce", prod.path(f))
        env = {**LONG_WAIT, "DYAD_DTL_MODE": "MARGO", "DYAD_MARGO_PROTO": name}
        p = cons.dyad("--json", "consume", cons.path(f), check=False, timeout=GENEROUS, env_extra=env)
        if ours not in have:
            assert p.returncode == 1, (name, p.stdout, p.stderr)
            assert f"DYAD_MARGO_PROTO='{ours}' is not available on this machine" in p.stderr, (name, p.stderr)
            continue
        assert p.returncode == 0, (name, p.stderr)
        assert json.loads(p.stdout)["transport"] == "MARGO"
        assert sha(cons.path(f)) == sha(prod.path(f)), name
        served = prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"]
        assert any(k.split("@")[0] == ours for k in served), (name, served)


# Mercury-only names -> what the error must say besides "Mercury-only".
MERCURY_ONLY = {
    "ucx+tcp": ["Mercury's UCX plugin", "DYAD_DTL_MODE=UCX with UCX_TLS=tcp"],
    "ucx+all": ["Mercury's UCX plugin", "DYAD_DTL_MODE=UCX,"],
    "ucx": ["Mercury's UCX plugin", "DYAD_DTL_MODE=UCX,"],
    "bmi+tcp": ["Mercury's 'bmi' plugin", "DYAD_DTL_MODE=FLUX_RPC"],
    "ofi+tcp://127.0.0.1:5555": ["a Mercury address", "drop the '://127.0.0.1:5555'"],
}


@pytest.mark.parametrize("name", sorted(MERCURY_ONLY))
def test_mercury_only_protocol_names_are_refused_at_once(cluster, name):
    need("MARGO")
    cons = cluster[1]
    env = {**LONG_WAIT, "DYAD_DTL_MODE": "MARGO", "DYAD_MARGO_PROTO": name}
    p = cons.dyad("consume", cons.path("never.bin"), check=False, timeout=GENEROUS, env_extra=env)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"DYAD_MARGO_PROTO='{name}' is " in p.stderr, p.stderr
    if "://" not in name:
        assert "Mercury-only protocol name" in p.stderr, p.stderr
    for text in MERCURY_ONLY[name]:
        assert text in p.stderr, (text, p.stderr)
    assert "ofi+tcp" in p.stderr  # what to use instead on libfabric
