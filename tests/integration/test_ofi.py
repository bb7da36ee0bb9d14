"""The transport conformance cases for DYAD_DTL_MODE=MARGO (libfabric pull),
once per protocol. A protocol whose provider fi_info does not list here is
skipped with its name; nothing else is."""
import glob
import json
import os
import subprocess
import time

import pytest

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
BUILT = "MARGO" in subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True).stdout


@pytest.fixture(params=sorted(PROTOS))
def ocluster(request):
    if not BUILT:
        pytest.skip("this build has no libfabric transport (libfabric-dev not found at configure time)")
    need = PROTOS[request.param].split(";")
    missing = [p for p in need if p not in AVAILABLE]
    if missing:
        pytest.skip(f"libfabric provider(s) {', '.join(missing)} for {request.param} not available here (fi_info -l)")
    c = harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": request.param})
    c.proto = request.param
    yield c
    c.cleanup()


def ofi(**extra):
    return {"DYAD_DTL_MODE": "MARGO", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20, **extra}


def test_sizes_consumer_first(ocluster):
    prod, cons = ocluster[0], ocluster[1]
    chunk = 4 << 20
    sizes = {"zero": 0, "one": 1, "page": 4096, "mib": 1 << 20, "chunk": chunk, "chunk+1": chunk + 1,
             "odd": 5 * chunk + 12345, "big": 256 << 20}
    names = [f"sz/{k}.bin" for k in sizes]
    p = cons.dyad_async("--json", "consume", *[cons.path(n) for n in names], env_extra=ofi())
    time.sleep(0.3)
    for n, s in zip(names, sizes.values()):
        harness.write_file(prod.path(n), s, seed=s)
    prod.dyad("produce", *[prod.path(n) for n in names])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert [json.loads(l)["transport"] for l in out.splitlines()] == ["MARGO"] * len(names)
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    st = prod.status()["counters"]["per_transport"]["MARGO"]
    assert st["served"] == len(names) and st["bytes_sent"] == sum(sizes.values())
    served = st["transport"]["protocols"]
    assert [k.split("@")[0] for k in served] == [ocluster.proto]
    # The registered pool is bounded: at most 4 buffers per transfer, 16 in all.
    assert 1 <= list(served.values())[0]["pool_buffers"] <= 4


def test_thousand_small_files(ocluster):
    prod, cons = ocluster[0], ocluster[1]
    names = [f"small/f{i:04d}" for i in range(1000)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), 1000 + i, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    cons.dyad("consume", *[cons.path(n) for n in names], env_extra=ofi(), timeout=300)
    for n in names[::97]:
        assert sha(cons.path(n)) == sha(prod.path(n))
    assert prod.status()["counters"]["per_transport"]["MARGO"]["served"] == 1000


def test_four_concurrent_consumers(ocluster):
    prod, cons = ocluster[0], ocluster[1]
    procs = [cons.dyad_async("consume", cons.path(f"cc{i}.bin"), env_extra=ofi()) for i in range(4)]
    for i in range(4):
        harness.write_file(prod.path(f"cc{i}.bin"), (24 << 20) + i, seed=i)
    prod.dyad("produce", *[prod.path(f"cc{i}.bin") for i in range(4)])
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert sha(cons.path(f"cc{i}.bin")) == sha(prod.path(f"cc{i}.bin"))
    pool = list(prod.status()["counters"]["per_transport"]["MARGO"]["transport"]["protocols"].values())[0]
    assert pool["pool_buffers"] <= 16


def test_producer_killed_mid_transfer(ocluster):
    prod, cons = ocluster[0], ocluster[1]
    harness.write_file(prod.path("huge.bin"), 1 << 30, seed=3)
    prod.dyad("produce", prod.path("huge.bin"))
    p = cons.dyad_async("consume", cons.path("huge.bin"), env_extra=ofi(DYAD_TRANSFER_TIMEOUT=10))
    killed = harness.kill_when_transfer_starts(prod, p, cons.dir, "huge.bin")
    assert killed, "the transfer ended before it could be interrupted"
    t0 = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "huge.bin" in err
    assert time.monotonic() - t0 < 12
    assert not os.path.exists(cons.path("huge.bin"))
    assert glob.glob(os.path.join(cons.dir, ".huge.bin.dyad-*")) == []


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
        assert "DYAD_RC_MARGO_BAD_PROTO" in p.stderr, p.stderr
        assert "available" in p.stderr and "ofi+tcp" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("p.bin"))
