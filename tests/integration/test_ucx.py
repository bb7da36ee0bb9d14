"""The transport conformance cases for DYAD_DTL_MODE=UCX, once per UCX_TLS
this machine's UCX offers (tcp; shared memory). A transport UCX lacks here is
skipped with its name; nothing else is."""
import glob
import hashlib
import json
import os
import subprocess
import time

import pytest

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
BUILT = "UCX" in subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True).stdout


@pytest.fixture(params=sorted(TLS))
def ucluster(request):
    if not BUILT:
        pytest.skip("this build has no UCX transport (libucx-dev not found at configure time)")
    need = TLS[request.param].split(",")[0]
    if need not in AVAILABLE:
        pytest.skip(f"UCX transport '{need}' is not available on this machine (ucx_info -d)")
    env = {"UCX_TLS": TLS[request.param], "UCX_WARN_UNUSED_ENV_VARS": "n"}
    c = harness.Cluster(nodes=2, env=env)
    yield c
    c.cleanup()


def ucx(**extra):
    return {"DYAD_DTL_MODE": "UCX", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20, **extra}




def test_sizes_consumer_first(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    window = 8 << 20
    sizes = {"zero": 0, "one": 1, "page": 4096, "mib": 1 << 20, "window+1": window + 1, "big": 256 << 20}
    names = [f"sz/{k}.bin" for k in sizes]
    p = cons.dyad_async("--json", "consume", *[cons.path(n) for n in names], env_extra=ucx(DYAD_UCX_WINDOW=window))
    time.sleep(0.3)
    for n, s in zip(names, sizes.values()):
        harness.write_file(prod.path(n), s, seed=s)
    prod.dyad("produce", *[prod.path(n) for n in names])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert [json.loads(l)["transport"] for l in out.splitlines()] == ["UCX"] * len(names)
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    st = prod.status()["counters"]["per_transport"]["UCX"]
    assert st["served"] == len(names) and st["bytes_sent"] == sum(sizes.values())


def test_thousand_small_files(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    names = [f"small/f{i:04d}" for i in range(1000)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), 1000 + i, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    cons.dyad("consume", *[cons.path(n) for n in names], env_extra=ucx(), timeout=300)
    for n in names[::97]:
        assert sha(cons.path(n)) == sha(prod.path(n))
    assert prod.status()["counters"]["per_transport"]["UCX"]["served"] == 1000


def test_four_concurrent_consumers(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    procs = [cons.dyad_async("consume", cons.path(f"cc{i}.bin"), env_extra=ucx()) for i in range(4)]
    for i in range(4):
        harness.write_file(prod.path(f"cc{i}.bin"), (24 << 20) + i, seed=i)
    prod.dyad("produce", *[prod.path(f"cc{i}.bin") for i in range(4)])
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert sha(cons.path(f"cc{i}.bin")) == sha(prod.path(f"cc{i}.bin"))


def test_producer_killed_mid_transfer(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    harness.write_file(prod.path("huge.bin"), 1 << 30, seed=3)
    prod.dyad("produce", prod.path("huge.bin"))
    p = cons.dyad_async("consume", cons.path("huge.bin"), env_extra=ucx(DYAD_TRANSFER_TIMEOUT=10))
    killed = harness.kill_when_transfer_starts(prod, p, cons.dir, "huge.bin")
    assert killed, "the transfer ended before it could be interrupted"
    t0 = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "huge.bin" in err
    assert time.monotonic() - t0 < 12
    assert not os.path.exists(cons.path("huge.bin"))
    assert glob.glob(os.path.join(cons.dir, ".huge.bin.dyad-*")) == []
