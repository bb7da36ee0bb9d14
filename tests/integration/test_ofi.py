# SPDX-License-Identifier: Apache-2.0
"""The transport conformance cases for DYAD_DTL_MODE=MARGO (libfabric pull),
once per protocol. A protocol whose provider fi_info does not list here is
skipped with its name; nothing else is."""
import os
import re
import signal
import subprocess
import time

import pytest

import conformance
import harness

sha = harness.sha256

PROTOS = {"ofi+tcp": "tcp;ofi_rxm", "ofi+sockets": "sockets", "ofi+shm": "shm"}


def providers():
    try:
        out = subprocess.run(["fi_info", "-l"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.rstrip(":") for line in out.splitlines() if line.endswith(":")}


AVAILABLE = providers()
BUILT = "MARGO" in harness.built_transports()


def skip_unless_available(proto):
    if not BUILT:
        pytest.skip("this build has no libfabric transport (libfabric-dev not found at configure time)")
    need = PROTOS[proto].split(";")
    missing = [p for p in need if p not in AVAILABLE]
    if missing:
        pytest.skip(f"libfabric provider(s) {', '.join(missing)} for {proto} not available here (fi_info -l)")


@pytest.fixture(params=sorted(PROTOS))
def ocluster(request):
    skip_unless_available(request.param)
    c = harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": request.param})
    c.proto = request.param
    yield c
    c.cleanup()


def ofi(**extra):
    return {"DYAD_DTL_MODE": "MARGO", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20, **extra}


def test_sizes_consumer_first(ocluster):
    chunk = 1 << 20
    sizes = {"zero": 0, "one": 1, "page": 4096, "mib": 1 << 20, "chunk": chunk, "chunk+1": chunk + 1,
             "odd": 5 * chunk + 12345, "big": 256 << 20}
    st = conformance.sizes_consumer_first(ocluster[0], ocluster[1], "MARGO", ofi(), sizes)
    served = st["transport"]["protocols"]
    assert [k.split("@")[0] for k in served] == [ocluster.proto]
    # The registered pool is bounded: at most 4 buffers per transfer, 16 in all.
    assert 1 <= list(served.values())[0]["pool_buffers"] <= 4


def test_service_stopped_and_continued_still_serves(ocluster):
    """dyadd stopped and continued (SIGSTOP/SIGCONT: a batch system's suspend
    and resume, a debugger attaching) interrupts its progress thread's wait
    (EINTR, without a signal handler): it waits again, and the next fetch
    completes. Before, the thread ended and every later fetch of the protocol
    waited out its deadline."""
    prod, cons = ocluster[0], ocluster[1]
    for n in ("before.bin", "after.bin"):
        harness.write_file(prod.path(n), (8 << 20) + 3, seed=len(n))
    prod.dyad("produce", prod.path("before.bin"), prod.path("after.bin"))
    cons.dyad("consume", cons.path("before.bin"), env_extra=ofi())  # the protocol is served from here on
    prod.proc.send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    prod.proc.send_signal(signal.SIGCONT)
    time.sleep(0.3)
    p = cons.dyad("consume", cons.path("after.bin"), check=False, timeout=60,
                  env_extra=ofi(DYAD_TRANSFER_TIMEOUT=10))
    assert p.returncode == 0, p.stderr
    assert sha(cons.path("after.bin")) == sha(prod.path("after.bin"))
    assert "fi_cq_sread" not in open(prod.log_path, errors="replace").read()
    served = prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"]
    assert all(p["progress_failures"] == 0 for p in served.values()), served


def test_thousand_small_files(ocluster):
    conformance.thousand_small_files(ocluster[0], ocluster[1], "MARGO", ofi())


def test_four_concurrent_consumers(ocluster):
    prod = ocluster[0]
    conformance.four_concurrent_consumers(prod, ocluster[1], ofi())
    pool = list(prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"].values())[0]
    assert pool["pool_buffers"] <= 16


@pytest.mark.parametrize("proto", sorted(PROTOS))
def test_consumers_contending_for_one_buffer_each_finish(proto):
    """With --memory-per-peer at its minimum (4M), a peer's transfers share one
    registered buffer: every release must reach a transfer that still wants
    one. Waking only the first waiter lost buffers (that waiter could be
    reading or done), and consumers then waited out their deadline with a
    free buffer in the pool (2 of 8 failed in every round)."""
    skip_unless_available(proto)
    with harness.Cluster(nodes=2, start=False, env={"DYAD_MARGO_PROTO": proto}) as c:
        prod, cons = c[0], c[1]
        prod.start(["--memory-per-peer", "4M"])
        cons.start()
        for r in range(3):
            names = [f"r{r}/c{i}.bin" for i in range(8)]
            procs = [cons.dyad_async("consume", cons.path(n), env_extra=ofi()) for n in names]
            for i, n in enumerate(names):
                harness.write_file(prod.path(n), (9 << 20) + i, seed=i)
            prod.dyad("produce", *[prod.path(n) for n in names])
            for n, p in zip(names, procs):
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err
                assert sha(cons.path(n)) == sha(prod.path(n)), n
        protos = prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"]
        assert sum(p["peer_waits"] for p in protos.values()) > 0, protos


def test_consumers_leave_nothing_in_dev_shm(ocluster):
    """libfabric's shm provider makes a 16 MiB region in /dev/shm per
    endpoint and removes it only when the endpoint closes or on a fatal
    signal; consumers keep theirs to the end of the process, so each
    `dyad consume` left one behind. Names are PID:N:N."""
    if ocluster.proto != "ofi+shm":
        pytest.skip("only the shm provider makes regions in /dev/shm")
    prod, cons = ocluster[0], ocluster[1]
    before = set(os.listdir("/dev/shm"))
    for i in range(3):
        harness.write_file(prod.path(f"shm{i}.bin"), 1 << 20)
        prod.dyad("produce", prod.path(f"shm{i}.bin"))
        cons.dyad("consume", cons.path(f"shm{i}.bin"), env_extra=ofi())
        assert sha(cons.path(f"shm{i}.bin")) == sha(prod.path(f"shm{i}.bin"))
    left = [n for n in set(os.listdir("/dev/shm")) - before if re.fullmatch(r"\d+:\d+:\d+", n)]
    assert not left, f"consumers left regions in /dev/shm: {left}"


def test_producer_killed_mid_transfer(ocluster):
    conformance.producer_killed_mid_transfer(ocluster[0], ocluster[1], ofi())


@pytest.mark.parametrize("bad", ["ofi+nonsense", "tcp", "ofi+cxi"])
def test_bad_protocol_lists_the_available_ones(bad):
    if not BUILT:
        pytest.skip("this build has no libfabric transport")
    if bad == "ofi+cxi" and "cxi" in AVAILABLE:
        pytest.skip("this machine has a cxi provider")
    with harness.Cluster(nodes=2) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("p.bin"), 10, seed=1)
        prod.dyad("produce", prod.path("p.bin"))
        p = cons.dyad("consume", cons.path("p.bin"), check=False, timeout=60, env_extra=ofi(DYAD_MARGO_PROTO=bad))
        assert p.returncode != 0
        assert f"DYAD_MARGO_PROTO='{bad}'" in p.stderr, p.stderr
        assert p.returncode == 6, p.stderr  # DYAD_RC_MARGO_BAD_PROTO (its name only at DYAD_LOG_LEVEL=debug)
        assert "available" in p.stderr and "ofi+tcp" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("p.bin"))


def test_sizes_placed_in_the_file(ocluster):
    """Reads go through the registered window and write(2); with
    DYAD_OFI_PLACEMENT=1 they land in the destination file itself, where it
    can be reserved (fallocate). That path moves every size too."""
    chunk = 1 << 20
    sizes = {"zero": 0, "one": 1, "chunk+1": chunk + 1, "odd": 5 * chunk + 12345}
    conformance.sizes_consumer_first(ocluster[0], ocluster[1], "MARGO", ofi(DYAD_OFI_PLACEMENT=1), sizes)


def test_no_room_for_the_file_is_a_clear_error():
    """The consumer's directory is an 8 MiB tmpfs and the file 16 MiB: the
    consume fails naming the file and the cause, whether the reads land in
    the file (blocks reserved first: no SIGBUS) or go through the window,
    and nothing is left behind."""
    if not BUILT or "tcp" not in AVAILABLE:
        pytest.skip("this build has no libfabric transport, or no tcp provider here")
    with harness.Cluster(nodes=2) as c:
        prod, cons = c[0], c[1]
        with harness.small_tmpfs(cons.path("tiny")):
            for k, extra in enumerate(({}, {"DYAD_OFI_PLACEMENT": 1})):
                name = f"tiny/big{k}.bin"
                harness.write_file(prod.path(name), 16 << 20, seed=k)
                prod.dyad("produce", prod.path(name))
                p = cons.dyad("consume", cons.path(name), check=False, timeout=120, env_extra=ofi(**extra))
                assert p.returncode != 0, extra
                assert f"big{k}.bin" in p.stderr and "No space left on device" in p.stderr, p.stderr
                assert os.listdir(cons.path("tiny")) == [], os.listdir(cons.path("tiny"))
            assert_serving = cons.dyad("--json", "service", "status")
            assert assert_serving.returncode == 0
