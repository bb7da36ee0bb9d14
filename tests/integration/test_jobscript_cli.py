# SPDX-License-Identifier: Apache-2.0
"""The smaller surprises of issue 46 (item 9), each as a user met it: the
names `dyad ls` prints given to `dyad rm`, the remedies the tools suggest,
the replica line of `dyad service status`, dyadd's --allow-uid before the
producer directory."""
import os
import subprocess

import pytest

import harness


@pytest.fixture(scope="module")
def cluster():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


def test_rm_takes_the_names_ls_prints(cluster):
    prod = cluster[0]
    prod.produce_text("rmdir/x.txt", "x")
    listed = prod.dyad("ls", "rmdir/").stdout.split()
    assert "rmdir/x.txt" in listed, listed
    # from a directory that is not the producer directory, as a job script runs
    p = prod.dyad("rm", "rmdir/x.txt", check=False, cwd="/")
    assert p.returncode == 0, p.stderr
    assert prod.dyad("stat", prod.path("rmdir/x.txt"), check=False).returncode == 2


def test_doctor_suggests_a_dyadd_command_that_exists(cluster):
    node = cluster[0]
    p = subprocess.run([harness.DYAD, "doctor"], capture_output=True, text=True, timeout=60,
                       env=node.env(DYAD_SERVICE_URI=f"tcp://127.0.0.1:{harness.free_port()}"))
    assert p.returncode != 0
    assert "--producer-dir" not in p.stdout + p.stderr
    assert "PRODUCER_DIR" in p.stdout + p.stderr, p.stdout


def test_local_across_nodes_names_the_remedy(cluster):
    prod, cons = cluster[0], cluster[1]
    prod.produce_text("local/x.bin", "x" * 1000)
    p = cons.dyad("consume", cons.path("local/x.bin"), check=False,
                  env_extra={"DYAD_DTL_MODE": "LOCAL", "DYAD_WAIT_TIMEOUT": 10})
    assert p.returncode != 0
    assert "LOCAL needs the service's Unix socket" in p.stderr, p.stderr
    assert "from another node" in p.stderr and "(start dyadd with --socket)" not in p.stderr, p.stderr


def test_keygen_keeps_the_site_secret_away_from_dyadd(tmp_path):
    p = subprocess.run([harness.DYAD, "keygen", str(tmp_path / "k")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "site secret" in p.stdout and "give it to no dyadd" in p.stdout, p.stdout


def test_service_status_has_a_replica_line(cluster):
    out = cluster[0].dyad("service", "status").stdout
    assert [l for l in out.splitlines() if l.startswith("replicas: ")], out


def test_allow_uid_before_the_producer_directory(tmp_path):
    """`dyadd --allow-uid any DIR`: DIR is the producer directory, not a
    second uid."""
    port = harness.free_port()
    d = tmp_path / "prod"
    d.mkdir()
    log = open(tmp_path / "dyadd.log", "wb")
    proc = subprocess.Popen([harness.DYADD, "--node", "u", "--listen", f"127.0.0.1:{port}",
                             "--socket", str(tmp_path / "s"), "--allow-uid", "any", str(d)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        harness.wait_listening("127.0.0.1", port, proc=proc)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
        env["DYAD_SERVICE_URI"] = f"tcp://127.0.0.1:{port}"
        p = subprocess.run([harness.DYAD, "service", "status"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0 and f"producer dir: {d}" in p.stdout, (p.stdout, p.stderr)
    finally:
        harness.stop_process(proc)
        log.close()
