# SPDX-License-Identifier: Apache-2.0
"""dyadd --store-late (issue 46, item 8: a job with its own etcd starts as
fast as one without): the service is ready before its etcd answers; its
clients' first publishes and lookups ride through etcd's start; a store
that refuses it for good still ends dyadd with its clear message."""
import hashlib
import json
import os
import subprocess
import time

import pytest

import harness


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def late_etcd():
    """An etcd not started yet: its ports are chosen, nothing runs on them."""
    e = harness.Etcd(start=False)
    yield e
    e.cleanup()


def test_dyadd_is_ready_before_its_etcd_and_requests_ride_through(late_etcd):
    """Two dyadds with --store-late against an etcd that is not running yet:
    each answers its hello and `dyad service status` (the store STARTING); a
    publish on one and a consume on the other, issued meanwhile, wait (no
    error) and complete once etcd is started; the status then says the store
    is reachable and the services registered."""
    c = harness.Cluster(nodes=2, start=False, kvs=late_etcd.uri)
    try:
        t0 = time.monotonic()
        for n in c.nodes:
            n.start(["--store-late", "--lease-ttl", "2"])
        ready_s = time.monotonic() - t0
        prod, cons = c[0], c[1]
        st = prod.status()["metadata_store"]
        assert st["reachable"] is False and st["starting"] is True, st
        assert st["backend"] == "etcd" and late_etcd.endpoint in st["endpoint"], st
        text = prod.dyad("service", "status").stdout
        assert "STARTING (not reached yet)" in text, text

        harness.write_file(prod.path("late/a.bin"), 200_000, seed=5)
        consume = cons.dyad_async("consume", cons.path("late/a.bin"), env_extra={"DYAD_WAIT_TIMEOUT": 60})
        produce = prod.dyad_async("produce", prod.path("late/a.bin"))
        time.sleep(1.0)
        assert produce.poll() is None and consume.poll() is None, (produce.communicate(), consume.communicate())

        late_etcd.start()
        out, err = produce.communicate(timeout=60)
        assert produce.returncode == 0, err
        assert "waits for the metadata store" not in err and "error" not in err.lower(), err
        out, err = consume.communicate(timeout=60)
        assert consume.returncode == 0, err
        assert "error" not in err.lower() and "trying again" not in err, err
        assert sha(cons.path("late/a.bin")) == sha(prod.path("late/a.bin"))

        st = prod.wait_status(lambda s: s["metadata_store"].get("reachable"), "etcd reached")["metadata_store"]
        assert st["reached_after_s"] > 0.5, st
        keys = late_etcd.ctl("get", "--prefix", "/dyad/services/", "--keys-only").stdout.split()
        assert sorted(k.rsplit("/", 1)[-1] for k in keys) == ["node0", "node1"], keys
        print(f"store-late: both dyadds ready in {ready_s:.2f} s without etcd")
    finally:
        c.cleanup()


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def tls_files(d):
    """A CA, and one certificate of it for the server (127.0.0.1) and the client."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", "/CN=test-ca", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "1")
    ext = f"{d}/ext.cnf"
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=node",
            "-keyout", f"{d}/node.key", "-out", f"{d}/node.csr")
    openssl("x509", "-req", "-in", f"{d}/node.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
            "-CAcreateserial", "-out", f"{d}/node.crt", "-days", "1", "-extfile", ext)


def test_a_wrong_etcd_password_still_ends_dyadd_with_its_message(tmp_path):
    """An etcd with TLS and its auth on, and a dyadd --store-late whose
    password file is wrong: dyadd, ready at first, ends with exit code 4 (as
    without --store-late) and says that etcd refused the user, naming the
    password file."""
    d = str(tmp_path)
    tls_files(d)
    port, peer = harness.free_port(), harness.free_port()
    url = f"https://127.0.0.1:{port}"
    args = [harness.ETCD, "--name", "tls", "--data-dir", f"{d}/data", "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster",
            f"tls=http://127.0.0.1:{peer}", "--client-cert-auth", "--trusted-ca-file", f"{d}/ca.crt",
            "--cert-file", f"{d}/node.crt", "--key-file", f"{d}/node.key", "--logger", "zap",
            "--log-level", "warn"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    log = open(f"{d}/etcd.log", "ab")
    etcd = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        ctl = [harness.ETCDCTL, "--endpoints", url, "--cacert", f"{d}/ca.crt", "--cert", f"{d}/node.crt",
               "--key", f"{d}/node.key"]
        cenv = dict(env, ETCDCTL_API="3")
        harness.wait_for(lambda: subprocess.run(ctl + ["endpoint", "health"], capture_output=True,
                                                env=cenv).returncode == 0, 30, what="etcd with TLS")
        for step in (["user", "add", "root:right-password"], ["user", "grant-role", "root", "root"],
                     ["auth", "enable"]):
            subprocess.run(ctl + step, check=True, capture_output=True, env=cenv)
        with open(f"{d}/wrong", "w") as f:
            f.write("wrong-password\n")
        kvs = (f"etcd://127.0.0.1:{port}?tls-ca={d}/ca.crt&tls-cert={d}/node.crt&tls-key={d}/node.key"
               f"&tls-name=localhost&auth-user=root&password-file={d}/wrong")
        p = subprocess.run([harness.DYADD, "--listen", f"127.0.0.1:{harness.free_port()}", "--kvs", kvs,
                            "--store-late", f"{d}/p"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 4, p.stderr
        assert "refused user 'root'" in p.stderr and f"{d}/wrong" in p.stderr, p.stderr
        assert "cannot use the metadata store" in p.stderr, p.stderr  # said loudly in its log too
    finally:
        etcd.kill()
        etcd.wait()
        log.close()


def test_a_publish_at_the_start_waits_for_holders_to_register():
    """Replicas at a job's start (issue 46: the job's dyadds register once
    its etcd answers, after they are ready): a file published with
    DYAD_REPLICAS=1 while the only other service has not registered yet
    gets its replica once that service registers (within the first 5 s of
    the owner's start), not "0 of the 1 replicas"."""
    etcd = harness.Etcd()
    c = harness.Cluster(nodes=2, start=False, kvs=etcd.uri)
    try:
        owner, other = c[0], c[1]
        owner.start(["--store-late"])
        harness.write_file(owner.path("early/a.bin"), 50_000, seed=9)
        produce = owner.dyad_async("produce", owner.path("early/a.bin"), env_extra={"DYAD_REPLICAS": 1})
        time.sleep(1.5)  # the other service is not there yet
        other.start(["--store-late"])
        out, err = produce.communicate(timeout=60)
        assert produce.returncode == 0, err
        assert "0 of the 1" not in err, err

        def held():
            out = owner.dyad("--json", "ls", env_extra={"DYAD_KVS_NAMESPACE": "dyad.replicas"}).stdout
            return "early/a.bin" in out and other.name in out

        harness.wait_for(held, 20, interval=0.2, what=f"a replica of early/a.bin held by {other.name}")
        log = open(owner.log_path, errors="replace").read()
        assert "0 of the 1" not in log, log[-3000:]
    finally:
        c.cleanup()
        etcd.cleanup()
