# SPDX-License-Identifier: Apache-2.0
"""A job with its own etcd starts without waiting for it (issue 46, item 8):
on a cluster whose etcd (plugstack.conf etcd=) takes 3 s more to start, the
prologs are done long before the job's etcd serves, `dyad service status`
says the store is STARTING, and a publish and a consume issued meanwhile
complete once it serves."""
import os
import re

import pytest

import harness

from conftest import cluster_with, late_program

from test_hardening import drained, info, submit
from test_store_ha import no_etcd_left

DYAD = harness.DYAD
DELAY = 3


@pytest.fixture(scope="module")
def slurm():
    """The tests' cluster, with an etcd that sleeps DELAY s before it starts."""
    yield from cluster_with(f"etcd={late_program('slow-etcd-', 'etcd', DELAY, harness.ETCD)}")


def test_the_prolog_does_not_wait_for_the_jobs_etcd(slurm, shared):
    out = os.path.join(shared, "out.txt")
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 100_000, seed=11)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N3
#SBATCH -w node[1-3]
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node1 {DYAD} service status | grep '^metadata store' | sed 's/^/status: /'
srun --overlap -N1 -n1 -w node2 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && cp {src} $DYAD_PATH_PRODUCER/r/ && {DYAD} produce $DYAD_PATH_PRODUCER/r/src.bin >/dev/null && echo produced' &
srun --overlap -N1 -n1 -w node3 bash -c '{DYAD} consume --timeout 60 $DYAD_PATH_CONSUMER/r/src.bin >/dev/null && cmp {src} $DYAD_PATH_CONSUMER/r/src.bin && echo same'
wait
srun --overlap -N1 -n1 -w node1 {DYAD} service status | grep '^metadata store' | sed 's/^/after: /'
""")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 120) == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    status = [line for line in text.splitlines() if line.startswith("status: ")]
    assert status and "STARTING (not reached yet)" in status[0], info(slurm, job, out)
    assert "produced" in text and "same" in text, info(slurm, job, out)
    assert "error" not in text.lower() and "waits for the metadata store" not in text, text
    assert any(line.startswith("after: ") and ", reachable" in line for line in text.splitlines()), text
    logs = "".join(open(p, errors="replace").read() for p in slurm.logs if "slurmd-" in p)
    ready = {m.group(1): float(m.group(2))
             for m in re.finditer(rf"dyad: job {job}: dyadd ready on (\S+) in ([0-9.]+) s", logs)}
    assert sorted(ready) == ["node1", "node2", "node3"], logs[-3000:]
    assert max(ready.values()) < DELAY, ready  # before: the election after the etcd's start
    assert drained(slurm) == {} and slurm.leftovers(job) == [] and no_etcd_left(slurm) == {}


def test_a_job_that_ends_before_its_etcd_serves_leaves_nothing(slurm, shared):
    """The job's script ends at once: its epilogs stop the services while the
    job's etcd is still starting (DELAY s late), so every member's
    dyad-etcd-auth is still waiting for it. Nothing of the job may stay
    behind: no helper, no member, no directory, no drained node."""
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N3
#SBATCH -w node[1-3]
#SBATCH -o {out}
echo ended
""")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 120) == "COMPLETED", info(slurm, job, out)
    assert "ended" in open(out).read(), info(slurm, job, out)
    assert drained(slurm) == {} and slurm.leftovers(job) == [] and no_etcd_left(slurm) == {}
