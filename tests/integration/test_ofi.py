# SPDX-License-Identifier: Apache-2.0
"""The transport conformance cases for DYAD_DTL_MODE=MARGO (libfabric pull),
once per protocol. A protocol whose provider fi_info does not list here is
skipped with its name; nothing else is."""
import json
import os
import re
import signal
import subprocess
import sys
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


@pytest.mark.parametrize("bad", ["ofi+nonsense", "ofi+cxi"])
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
        # A configuration error (test_transport_failfast.py): the consumer
        # fails before it looks for the file.
        assert p.returncode == 1, p.stderr
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


CONCURRENT_CONSUMER = r"""
import json, os, sys, threading
sys.path.insert(0, os.environ["PYDYAD_DIR"])
from pydyad import Dyad
d = Dyad(); d.init_env()
root = os.environ["DYAD_PATH_CONSUMER"]
threads, per = int(sys.argv[1]), int(sys.argv[2])
errors = {}
def run(t):
    names = [os.path.join(root, f"mt/t{t}/f{i:02d}.bin") for i in range(per)]
    errs = d.consume_many(names, window=4, raise_errors=False)
    errors[t] = [None if e is None else f"{e.rc_name} {e.path}: {e.message}" for e in errs]
ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(errors))
"""


def test_threads_consume_many_concurrently(ocluster):
    """Six threads of one process, each consume_many with a window of 4,
    all over MARGO at once: every file arrives byte-identical and the
    owner's registered pool stays within its bound. The consumer process
    shares one libfabric endpoint (its CQ, AV and read windows) between the
    threads. Before, receives were serialised per process; without that
    lock, a receive waiting for the consumer's one read window kept its
    transfer's pool buffers on the owner while the receive holding the
    window waited for a buffer: fetches stalled until their deadline."""
    prod, cons = ocluster[0], ocluster[1]
    threads, per = 6, 8  # 24 receives at once: more than the 16 a process runs (the rest wait)
    sizes = {}
    for t in range(threads):
        for i in range(per):
            n = f"mt/t{t}/f{i:02d}.bin"
            # Small files, a chunk and a bit, and files longer than a window.
            sizes[n] = [1000 + i, (1 << 20) + 7 * i, (5 << 20) + 12345 + i][i % 3]
            harness.write_file(prod.path(n), sizes[n], seed=t * 100 + i)
    prod.dyad("produce", *[prod.path(n) for n in sizes])
    env = cons.env(**ofi(DYAD_WAIT_TIMEOUT=30))
    env.update(harness.sanitizer_runtime_env(os.path.join(harness.BUILD, "lib", "libdyad.so")))
    env["DYAD_LIBRARY"] = os.path.join(harness.BUILD, "lib", "libdyad.so")
    env["PYDYAD_DIR"] = os.path.join(harness.ROOT, "python")
    p = subprocess.run(cons.prefix + [sys.executable, "-c", CONCURRENT_CONSUMER, str(threads), str(per)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    errors = json.loads(p.stdout.strip().splitlines()[-1])
    failed = [e for errs in errors.values() for e in errs if e]
    assert not failed, failed
    for n in sizes:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    st = prod.status()["counters"]["per_transport"]["MARGO"]
    assert st["served"] == len(sizes)
    for pool in st["transport"]["protocols"].values():
        assert 1 <= pool["pool_buffers"] <= 16, pool


def _add_interfaces(ns, host):
    """Makes the namespace `ns` look like a busy node: its eth0 gets an
    unrelated primary IPv4 address (its own becomes secondary) and an IPv6
    one, plus a bridge and a veth pair with IPv4 and IPv6 addresses."""
    def ip(*args):
        subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True, text=True)
    ip("addr", "flush", "dev", "eth0")
    ip("addr", "add", "192.0.2.2/24", "dev", "eth0")
    ip("addr", "add", f"{host}/24", "dev", "eth0")
    ip("addr", "add", "fd13::2/64", "dev", "eth0", "nodad")
    ip("link", "add", "dybr0", "type", "bridge")
    ip("addr", "add", "172.31.213.1/24", "dev", "dybr0")
    ip("addr", "add", "fd31::1/64", "dev", "dybr0", "nodad")
    ip("link", "set", "dybr0", "up")
    ip("link", "add", "dyvx0", "type", "veth", "peer", "name", "dyvx1")
    ip("addr", "add", "198.51.100.2/24", "dev", "dyvx0")
    ip("addr", "add", "fd77::2/64", "dev", "dyvx0", "nodad")
    ip("link", "set", "dyvx0", "up")
    ip("link", "set", "dyvx1", "up")


def test_consumer_reaches_the_service_whatever_its_interfaces():
    """Producer and consumer in network namespaces; the consumer's node has
    a bridge, a veth pair, IPv6 beside IPv4 and an unrelated primary address
    on the interface that reaches the producer. The consumer's libfabric
    endpoint must take its source from the route to the service's advertised
    address. Before, the provider's first choice was used (another family or
    another address: "has 16 bytes where this provider's have 28", or reads
    that never completed: "fi_read queue stayed full"). ofi+tcp only: the
    sockets provider connects from whatever source the kernel picks."""
    proto = "ofi+tcp"
    skip_unless_available(proto)
    c = harness.Cluster(nodes=2, netns=True, env={"DYAD_MARGO_PROTO": proto})
    try:
        if c.mode != "netns":
            pytest.skip("network namespaces cannot be made here")
        prod, cons = c[0], c[1]
        _add_interfaces(c.net.namespaces["n1"], cons.host)
        names = [f"if/f{i}.bin" for i in range(3)]
        for i, n in enumerate(names):
            harness.write_file(prod.path(n), [1, (1 << 20) + 1, (6 << 20) + 3][i], seed=i)
        prod.dyad("produce", *[prod.path(n) for n in names])
        p = cons.dyad("--json", "consume", *[cons.path(n) for n in names], check=False, timeout=120,
                      env_extra=ofi(DYAD_TRANSFER_TIMEOUT=10))
        assert p.returncode == 0, p.stderr
        assert [json.loads(l)["transport"] for l in p.stdout.splitlines()] == ["MARGO"] * len(names)
        for n in names:
            assert sha(cons.path(n)) == sha(prod.path(n)), n
    finally:
        c.cleanup()
