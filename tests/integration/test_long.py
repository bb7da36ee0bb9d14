# SPDX-License-Identifier: Apache-2.0
"""Long tests (`make test-long`, CTest label `long`): files over 4 GiB through
every transport this build has. The source is sparse; the copy is real."""
import os
import subprocess

import pytest

import harness

sha = harness.sha256
SIZE = (4 << 30) + 4097  # past the 32-bit boundary, not chunk-aligned


def ucx_transports():
    try:
        out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.split(":", 1)[1].strip() for line in out.splitlines() if "Transport:" in line}


def built(name):
    return name in harness.built_transports()


def sparse_file(path):
    """Random bytes at the start, on both sides of 4 GiB and at the end."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for off in (0, (1 << 32) - 3000, SIZE - 5000):
            f.seek(off)
            f.write(os.urandom(6000 if off < SIZE - 5000 else 5000))


CASES = {
    "stream": ("STREAM", None),
    "ucx-tcp": ("UCX", "tcp"),
    "ucx-shm": ("UCX", "sysv,self"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_file_over_4gib(case):
    mode, tls = CASES[case]
    if not built(mode):
        pytest.skip(f"this build has no {mode} transport")
    if tls and tls.split(",")[0] not in ucx_transports():
        pytest.skip(f"UCX transport '{tls.split(',')[0]}' is not available on this machine (ucx_info -d)")
    env = {"UCX_TLS": tls, "UCX_WARN_UNUSED_ENV_VARS": "n", "DYAD_UCX_SHARED_MEMORY": "1"} if tls else None
    with harness.Cluster(nodes=2, env=env) as c:
        prod, cons = c[0], c[1]
        sparse_file(prod.path("big/over4g.bin"))
        prod.dyad("produce", prod.path("big/over4g.bin"))
        cons.dyad("consume", cons.path("big/over4g.bin"),
                  env_extra={"DYAD_DTL_MODE": mode, "DYAD_WAIT_TIMEOUT": 60}, timeout=1800)
        assert os.path.getsize(cons.path("big/over4g.bin")) == SIZE
        assert sha(cons.path("big/over4g.bin")) == sha(prod.path("big/over4g.bin"))
        st = prod.status()["counters"]["per_transport"][mode]
        assert st["served"] == 1 and st["bytes_sent"] == SIZE
