# SPDX-License-Identifier: Apache-2.0
"""The transport conformance cases for DYAD_DTL_MODE=UCX, once per UCX_TLS
this machine's UCX offers (tcp; shared memory). A transport UCX lacks here is
skipped with its name; nothing else is."""
import os
import subprocess
import sys
import textwrap

import pytest

import conformance
import harness

sha = harness.sha256

TLS = {"tcp": "tcp", "shm-posix": "posix,self", "shm-sysv": "sysv,self"}


def ucx_transports():
    try:
        out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.split(":", 1)[1].strip() for line in out.splitlines() if "Transport:" in line}


AVAILABLE = ucx_transports()
BUILT = "UCX" in harness.built_transports()


@pytest.fixture(params=sorted(TLS))
def ucluster(request):
    if not BUILT:
        pytest.skip("this build has no UCX transport (libucx-dev not found at configure time)")
    need = TLS[request.param].split(",")[0]
    if need not in AVAILABLE:
        pytest.skip(f"UCX transport '{need}' is not available on this machine (ucx_info -d)")
    env = {"UCX_TLS": TLS[request.param], "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if request.param.startswith("shm"):  # dyadd's opt-in (docs/security.md)
        env["DYAD_UCX_SHARED_MEMORY"] = "1"
    c = harness.Cluster(nodes=2, env=env)
    yield c
    c.cleanup()


def ucx(**extra):
    return {"DYAD_DTL_MODE": "UCX", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20, **extra}




def test_sizes_consumer_first(ucluster):
    window = 8 << 20
    sizes = {"zero": 0, "one": 1, "page": 4096, "mib": 1 << 20, "window+1": window + 1, "big": 256 << 20}
    conformance.sizes_consumer_first(ucluster[0], ucluster[1], "UCX", ucx(DYAD_UCX_WINDOW=window), sizes)


def test_thousand_small_files(ucluster):
    conformance.thousand_small_files(ucluster[0], ucluster[1], "UCX", ucx())


def test_four_concurrent_consumers(ucluster):
    conformance.four_concurrent_consumers(ucluster[0], ucluster[1], ucx())


def test_producer_killed_mid_transfer(ucluster):
    conformance.producer_killed_mid_transfer(ucluster[0], ucluster[1], ucx())


def test_protocol_follows_what_ucx_reports(ucluster):
    """Shared memory does put natively: bytes land in the consumer's window
    (read there directly by the service); TCP would emulate put: tags."""
    prod, cons = ucluster[0], ucluster[1]
    harness.write_file(prod.path("rule.bin"), (9 << 20) + 7, seed=9)
    prod.dyad("produce", prod.path("rule.bin"))
    cons.dyad("consume", cons.path("rule.bin"), env_extra=ucx())
    assert sha(cons.path("rule.bin")) == sha(prod.path("rule.bin"))
    t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
    # (the endpoint itself may already be gone: the consumer exited)
    tls = ucluster.nodes[0].extra_env["UCX_TLS"]
    assert tls.split(",")[0] in t["last_endpoint_transports"]
    if tls == "tcp":
        assert t["endpoints_created"] == {"native_put": 0, "emulated_put": 1}
        assert t["tag_transfers"] == 1 and t["put_transfers"] == 0
    else:
        assert t["endpoints_created"] == {"native_put": 1, "emulated_put": 0}
        assert t["put_transfers"] == 1 and t["direct_transfers"] == 1 and t["tag_transfers"] == 0


@pytest.mark.parametrize("proto", ["tag", "put"])
def test_forced_protocol(ucluster, proto):
    """Either protocol works on every transport when asked for (put over TCP
    is UCX's software emulation: slow, but correct)."""
    prod, cons = ucluster[0], ucluster[1]
    window = 8 << 20
    sizes = [0, 1, 4096, window + 1, (20 << 20) + 3]
    names = [f"forced/{proto}{s}.bin" for s in sizes]
    for n, s in zip(names, sizes):
        harness.write_file(prod.path(n), s, seed=s + 1)
    prod.dyad("produce", *[prod.path(n) for n in names])
    cons.dyad("consume", *[cons.path(n) for n in names], env_extra=ucx(DYAD_UCX_PROTO=proto, DYAD_UCX_WINDOW=window))
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
    assert t[f"{proto}_transfers"] == len(sizes)


# Sizes for the concurrency test: single messages, several chunks of a
# window, and files larger than a whole small window.
CONCURRENT_SIZES = [64 << 10, 1, (1 << 20) + 3, (5 << 20) + 7, (9 << 20) + 1, 64 << 10]


def test_concurrent_threads_in_one_process(ucluster):
    """Many threads x many files over UCX in one process, every file checked
    byte for byte: four threads each run consume_many (a window of 8 files
    in flight) while two more call consume file by file, all on one Dyad
    context. Before the UCX receivers were made safe for concurrent use this
    delivered corrupted files (docs/design.md, "UCX concurrency")."""
    prod, cons = ucluster[0], ucluster[1]
    groups = {}
    for g in range(6):
        names = [f"cc/g{g}/f{i}.bin" for i in range(12)]
        for i, n in enumerate(names):
            size = CONCURRENT_SIZES[i % len(CONCURRENT_SIZES)]
            harness.write_file(prod.path(n), size, seed=1000 * g + i)
        groups[g] = names
    prod.dyad("produce", *[prod.path(n) for names in groups.values() for n in names])
    code = textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {os.path.join(harness.ROOT, 'python')!r})
        from pydyad import Dyad
        d = Dyad(); d.init_env()
        groups = {[[cons.path(n) for n in names] for names in groups.values()]!r}
        errors = []
        def many(files):
            try:
                d.consume_many(files, window=8)
            except Exception as e:
                errors.append(repr(e))
        def one_by_one(files):
            try:
                for f in files:
                    d.consume(f)
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=many if g < 4 else one_by_one, args=(files,))
              for g, files in enumerate(groups)]
        for t in ts: t.start()
        for t in ts: t.join()
        print("errors:", errors, flush=True)
        sys.exit(1 if errors else 0)
    """)
    env = cons.env(DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"),
                   **ucx(DYAD_UCX_WINDOW=8 << 20))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr[-3000:])
    for names in groups.values():
        for n in names:
            assert sha(cons.path(n)) == sha(prod.path(n)), n


def test_put_without_direct_mapping():
    """DYAD_UCX_DIRECT=0 on the service: native put from the service's
    buffers instead of reading into the mapped window."""
    if not BUILT:
        pytest.skip("this build has no UCX transport")
    tls = next((t for t in ("sysv,self", "posix,self") if t.split(",")[0] in AVAILABLE), None)
    if not tls:
        pytest.skip("no UCX shared-memory transport (sysv, posix) on this machine")
    env = {"UCX_TLS": tls, "UCX_WARN_UNUSED_ENV_VARS": "n", "DYAD_UCX_DIRECT": "0", "DYAD_UCX_SHARED_MEMORY": "1"}
    with harness.Cluster(nodes=2, env=env) as c:
        prod, cons = c[0], c[1]
        window = 4 << 20
        sizes = [1, window - 1, window, 3 * window + 5, 40 << 20]
        names = [f"nd{s}.bin" for s in sizes]
        for n, s in zip(names, sizes):
            harness.write_file(prod.path(n), s, seed=s)
        prod.dyad("produce", *[prod.path(n) for n in names])
        # Put forced: every file by UCX, the 1-byte one too (DYAD_UCX_PROTO=auto
        # sends small files in batches over the request connection).
        cons.dyad("consume", *[cons.path(n) for n in names],
                  env_extra=ucx(DYAD_UCX_WINDOW=window, DYAD_UCX_PROTO="put"))
        for n in names:
            assert sha(cons.path(n)) == sha(prod.path(n)), n
        t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
        assert t["put_transfers"] == len(sizes) and t["direct_transfers"] == 0


def test_written_behind_over_tcp():
    """DYAD_WRITE_BEHIND=on in tag mode: a writer thread writes each received
    slot of the window while the next receives are posted into the others.
    With a 4 MiB window (four 1 MiB slots, fewer than the ring's 7) the
    receives wait for the writer to give slots back; every size arrives
    byte-identical. A write that
    fails there (a 24 MiB file into an 8 MiB tmpfs) fails the consume naming
    the file and the cause, and leaves nothing behind."""
    if not BUILT or "tcp" not in AVAILABLE:
        pytest.skip("needs the UCX transport and UCX's tcp (ucx_info -d)")
    with harness.Cluster(nodes=2, env={"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}) as c:
        prod, cons = c[0], c[1]
        sizes = [(21 << 20) + 1, 40 << 20, (64 << 20) + 4097]
        names = [f"wb{s}.bin" for s in sizes]
        for n, s in zip(names, sizes):
            harness.write_file(prod.path(n), s, seed=s)
        prod.dyad("produce", *[prod.path(n) for n in names])
        for window in (4 << 20, 8 << 20, 64 << 20):
            cons.dyad("consume", *[cons.path(n) for n in names], timeout=120,
                      env_extra=ucx(DYAD_WRITE_BEHIND="on", DYAD_UCX_PROTO="tag", DYAD_UCX_WINDOW=window))
            for n in names:
                assert sha(cons.path(n)) == sha(prod.path(n)), (window, n)
                os.unlink(cons.path(n))
        with harness.small_tmpfs(cons.path("tiny")):
            harness.write_file(prod.path("tiny/big.bin"), 24 << 20, seed=5)
            prod.dyad("produce", prod.path("tiny/big.bin"))
            p = cons.dyad("consume", cons.path("tiny/big.bin"), check=False, timeout=120,
                          env_extra=ucx(DYAD_WRITE_BEHIND="on", DYAD_UCX_PROTO="tag"))
            assert p.returncode != 0
            assert "big.bin" in p.stderr and "No space left on device" in p.stderr, p.stderr
            assert os.listdir(cons.path("tiny")) == [], os.listdir(cons.path("tiny"))


def test_bad_protocol_name_is_refused(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    harness.write_file(prod.path("p.bin"), 10, seed=1)
    prod.dyad("produce", prod.path("p.bin"))
    p = cons.dyad("consume", cons.path("p.bin"), check=False, timeout=60, env_extra=ucx(DYAD_UCX_PROTO="rdma"))
    assert p.returncode != 0
    assert "DYAD_UCX_PROTO='rdma'" in p.stderr and "auto, tag or put" in p.stderr
    assert not os.path.exists(cons.path("p.bin"))


def test_no_shared_memory_toward_consumers_unless_asked():
    """Over UCX's shared-memory transports a consumer's address names a
    process of this host, and dyadd would write there with its own
    privileges: without DYAD_UCX_SHARED_MEMORY=1 dyadd reaches consumers
    over network transports only, whatever the consumer offers, and says so
    when UCX_TLS leaves it none."""
    if not BUILT:
        pytest.skip("this build has no UCX transport")
    shm = next((t for t in ("sysv", "posix", "cma") if t in AVAILABLE), None)
    if not shm or "tcp" not in AVAILABLE:
        pytest.skip("needs UCX tcp and a shared-memory transport (ucx_info -d)")
    with harness.Cluster(nodes=2, env={"UCX_WARN_UNUSED_ENV_VARS": "n"}) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("d.bin"), (9 << 20) + 7, seed=3)
        prod.dyad("produce", prod.path("d.bin"))
        cons.dyad("consume", cons.path("d.bin"), env_extra=ucx())  # the consumer offers everything
        assert sha(cons.path("d.bin")) == sha(prod.path("d.bin"))
        t = prod.status()["counters"]["per_transport"]["UCX"]["transport"]
        used = t["last_endpoint_transports"]
        assert "tcp" in used and not any(x in used for x in ("sysv", "posix", "cma", "xpmem", "knem")), used
    with harness.Cluster(nodes=2, env={"UCX_TLS": f"{shm},self", "UCX_WARN_UNUSED_ENV_VARS": "n"}) as c:
        prod, cons = c[0], c[1]
        # Over 256 KiB: not a small file, which would travel over the request
        # connection in a batch, without UCX.
        harness.write_file(prod.path("s.bin"), 300 << 10, seed=4)
        prod.dyad("produce", prod.path("s.bin"))
        p = cons.dyad("consume", cons.path("s.bin"), check=False, env_extra=ucx())
        assert p.returncode != 0 and "only shared-memory transports" in p.stderr and "DYAD_UCX_SHARED_MEMORY=1" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("s.bin"))
