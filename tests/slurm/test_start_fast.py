# SPDX-License-Identifier: Apache-2.0
"""The prolog does not wait for dyadd's own start (issue 46, item 8):
`dyad job node-up` binds the node's sockets and hands them to dyadd, so the
job starts while dyadd is still starting, and what the job asks meanwhile
waits in the sockets' backlog. Here every dyadd takes DELAY s more to
start (a wrapper that sleeps before it runs dyadd): the prologs end long
before that, and a status, a produce and a consume issued at once all
complete once dyadd is up. (With the job's own etcd, the default on 3
nodes: with the embedded store the other nodes' prologs wait for node 1's
dyadd, whose port they look up.)"""
import os
import re

import pytest

import harness

from conftest import cluster_with, late_program

from test_hardening import drained, info, submit

DYAD = harness.DYAD
DELAY = 1.0  # (local clients try a refusing socket again for 2 s)


@pytest.fixture(scope="module")
def slurm():
    """The tests' cluster, its plugin running a dyadd that starts DELAY s late
    (the plugin runs the `dyad` beside its `dyadd=`)."""
    dyadd = os.path.join(harness.BUILD, "bin", "dyadd")
    yield from cluster_with(f"dyadd={late_program('slow-dyadd-', 'dyadd', DELAY, dyadd, beside=(DYAD,))}")


def test_the_prolog_does_not_wait_for_dyadds_own_start(slurm, shared):
    out = os.path.join(shared, "out.txt")
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 100_000, seed=5)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N3
#SBATCH -w node[1-3]
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node2 {DYAD} service status | grep '^service' | sed 's/^/status: /'
srun --overlap -N1 -n1 -w node1 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && cp {src} $DYAD_PATH_PRODUCER/r/ && {DYAD} produce $DYAD_PATH_PRODUCER/r/src.bin >/dev/null && echo produced'
srun --overlap -N1 -n1 -w node2 bash -c '{DYAD} consume --timeout 60 $DYAD_PATH_CONSUMER/r/src.bin >/dev/null && cmp {src} $DYAD_PATH_CONSUMER/r/src.bin && echo same'
""")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 120) == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    assert any(line.startswith("status: ") for line in text.splitlines()), info(slurm, job, out)
    assert "produced" in text and "same" in text, info(slurm, job, out)
    assert "error" not in text.lower(), text
    logs = "".join(open(p, errors="replace").read() for p in slurm.logs if "slurmd-" in p)
    ready = {m.group(1): float(m.group(2))
             for m in re.finditer(rf"dyad: job {job}: dyadd ready on (\S+) in ([0-9.]+) s", logs)}
    assert sorted(ready) == ["node1", "node2", "node3"], logs[-3000:]
    assert max(ready.values()) < DELAY, ready  # before: DELAY s and more, dyadd's start
    assert drained(slurm) == {} and slurm.leftovers(job) == []
