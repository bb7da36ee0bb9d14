# SPDX-License-Identifier: Apache-2.0
"""UCX for small files (issue 50, item 2): with DYAD_DTL_MODE=UCX, the small
files (at most 256 KiB) of a consume of many travel many to a request, in
dyad.fetch_many's answers over the request connection, counted under UCX;
larger ones by UCX itself. Concurrent consumers, every file checked by
SHA-256, per UCX_TLS this machine's UCX offers (tcp; shared memory).
DYAD_UCX_PROTO=tag or put still moves every file by UCX."""
import json
import subprocess

import pytest

import harness

sha = harness.sha256
TLS = {"tcp": "tcp", "shm-sysv": "sysv,self"}
SMALL_MAX = 256 << 10  # dtl::kFetchManyFileMax


def ucx_transports():
    try:
        out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.split(":", 1)[1].strip() for line in out.splitlines() if "Transport:" in line}


@pytest.fixture(params=sorted(TLS))
def ucluster(request):
    if "UCX" not in harness.built_transports():
        pytest.skip("this build has no UCX transport")
    if TLS[request.param].split(",")[0] not in ucx_transports():
        pytest.skip(f"UCX transport {TLS[request.param]} is not available here (ucx_info -d)")
    env = {"UCX_TLS": TLS[request.param], "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if request.param.startswith("shm"):
        env["DYAD_UCX_SHARED_MEMORY"] = "1"
    c = harness.Cluster(nodes=2, env=env)
    yield c
    c.cleanup()


def ucx(**extra):
    return {"DYAD_DTL_MODE": "UCX", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20, **extra}


def reports(p):
    # (UCX writes its own warnings to stdout: UCX_LOG_FILE's default.)
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def test_concurrent_small_file_batches(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    sizes = [64 << 10, 1, 0, 4096, SMALL_MAX, 64 << 10, 1000, SMALL_MAX + 1]
    groups = []
    for g in range(4):
        names = [f"b/g{g}/f{i:03d}.bin" for i in range(120)]
        for i, n in enumerate(names):
            harness.write_file(prod.path(n), sizes[i % len(sizes)], seed=1000 * g + i)
        groups.append(names)
    every = [n for names in groups for n in names]
    large = sum(1 for i in range(120) if sizes[i % len(sizes)] > SMALL_MAX) * len(groups)
    prod.dyad("produce", *[prod.path(n) for n in every])
    before = prod.status()["counters"]
    procs = [cons.dyad_async("--json", "consume", "--window", "8", *[cons.path(n) for n in names],
                             env_extra=ucx()) for names in groups]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(got) == 120 and {r["transport"] for r in got} == {"UCX"}, got[:3]
    for n in every:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    after = prod.status()["counters"]
    ucx_after, ucx_before = after["per_transport"]["UCX"], before["per_transport"]["UCX"]
    assert ucx_after["served"] - ucx_before["served"] == len(every)
    # The small files went many to a request; the larger ones by UCX.
    batches = after["fetch_many_requests"] - before["fetch_many_requests"]
    assert len(groups) <= batches <= (len(every) - large) // 2, batches
    t = ucx_after["transport"]
    moved = t["tag_transfers"] + t["put_transfers"] - (ucx_before["transport"]["tag_transfers"] +
                                                       ucx_before["transport"]["put_transfers"])
    assert moved == large, (moved, large, t)


def test_a_forced_ucx_protocol_moves_small_files_by_ucx(ucluster):
    prod, cons = ucluster[0], ucluster[1]
    names = [f"forced/f{i:02d}.bin" for i in range(20)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), 64 << 10, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    before = prod.status()["counters"]
    p = cons.dyad("--json", "consume", *[cons.path(n) for n in names], env_extra=ucx(DYAD_UCX_PROTO="tag"))
    assert {r["transport"] for r in reports(p)} == {"UCX"}
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n
    after = prod.status()["counters"]
    assert after["fetch_many_requests"] == before["fetch_many_requests"]
    tags = after["per_transport"]["UCX"]["transport"]["tag_transfers"]
    assert tags - before["per_transport"]["UCX"]["transport"]["tag_transfers"] == len(names)
