# SPDX-License-Identifier: Apache-2.0
"""A dyadd is ready before UCX and libfabric are set up (issue 46, item 8):
they are set up right after, on a thread of their own, and registered
again once ready, so that AUTO then picks them; --mode names one set up
before (a fixed mode that cannot work is still an error at start);
--transports-at-start sets up every one before. No timing is asserted
(bench/startup_bench.py measures it): the order of the log's lines says it."""
import json

import pytest

import harness

BUILT = harness.built_transports()
LATE = [t for t in ("UCX", "MARGO") if t in BUILT]


def log_text(node):
    with open(node.log_path, errors="replace") as f:
        return f.read()


def registered_transports(node):
    """The transport names of node's registry entry, as consumers read it."""
    st = node.status()
    return {t.get("name") for t in st.get("transports", []) if isinstance(t, dict)}


@pytest.mark.skipif(not LATE, reason="this build has neither UCX nor libfabric")
def test_late_transports_are_set_up_after_ready_and_registered():
    c = harness.Cluster(nodes=2)
    try:
        for node in c.nodes:
            text = log_text(node)
            ready = text.find(" ready: rank")
            assert ready >= 0, text
            for t in LATE:
                line = f"transport {t} ready (set up in"
                assert line in text or f"transport {t} unavailable" in text, (t, text)
                if line in text:
                    assert text.find(line) > ready, (t, text)  # after the service was ready
        # The registry (what AUTO reads) lists them once set up.
        prod, cons = c[0], c[1]
        for t in LATE:
            if f"transport {t} ready" in log_text(prod):
                harness.wait_for(lambda: t in registered_transports(prod), 10, what=f"{t} in the registry")
        for t in LATE:  # a fixed mode asks for it by name, and gets it
            if f"transport {t} ready" not in log_text(prod):
                continue
            dest = f"late/{t}.bin"
            harness.write_file(prod.path(dest), 3 << 20, seed=3)
            prod.dyad("produce", prod.path(dest))
            p = cons.dyad("--json", "consume", cons.path(dest), env_extra={"DYAD_DTL_MODE": t})
            assert json.loads(p.stdout)["transport"] == t, p.stdout
            assert harness.sha256(cons.path(dest)) == harness.sha256(prod.path(dest))
    finally:
        c.cleanup()


@pytest.mark.skipif(not LATE, reason="this build has neither UCX nor libfabric")
def test_mode_and_transports_at_start_set_up_before_ready():
    for args, before in ((["--mode", LATE[0]], [LATE[0]]), (["--transports-at-start"], LATE)):
        c = harness.Cluster(nodes=1, dyadd_args=args)
        try:
            text = log_text(c[0])
            assert " ready: rank" in text, text
            for t in before:  # set up with the others, before the service was ready
                assert f"transport {t} ready (set up in" not in text, (args, text)
                assert t in registered_transports(c[0]), (args, text)
        finally:
            c.cleanup()


@pytest.mark.skipif("UCX" not in BUILT, reason="this build has no UCX")
def test_a_fixed_mode_that_cannot_work_still_fails_the_start():
    """dyadd --mode UCX where UCX cannot work exits at start (1), naming it."""
    c = harness.Cluster(nodes=1, start=False)
    try:
        node = c[0]
        node.extra_env.update({"UCX_TLS": "nosuch", "UCX_WARN_UNUSED_ENV_VARS": "n"})
        with pytest.raises(RuntimeError) as e:
            node.start(["--mode", "UCX"])
        assert "exited with 1" in str(e.value), str(e.value)
        assert "--mode UCX is not served" in log_text(node), log_text(node)
    finally:
        c.cleanup()


@pytest.mark.skipif("MARGO" not in LATE, reason="this build has no libfabric")
def test_sigterm_while_transports_are_set_up_stops_cleanly(tmp_path):
    """A SIGTERM that comes while libfabric is being set up (after the
    service is ready) waits for the set-up, then stops dyadd as usual (exit
    0): a library's own handler never gets it."""
    import subprocess
    import time
    key = str(tmp_path / "key")
    subprocess.run([harness.DYAD, "keygen", key], check=True, capture_output=True)
    log = tmp_path / "dyadd.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([harness.DYADD, "--node", "n0", "--listen", f"127.0.0.1:{harness.free_port('127.0.0.1')}",
                              "--auth-key", key, str(tmp_path / "prod")], stdout=out, stderr=subprocess.STDOUT)
    try:
        harness.wait_for(lambda: "after the start" in log.read_text(), 30, what="the late set-up", interval=0.001)
        p.terminate()
        assert p.wait(timeout=30) == 0, log.read_text()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = log.read_text()
    assert "signal 15: shutting down" in text and "stopped" in text, text
