# SPDX-License-Identifier: Apache-2.0
"""The job's metadata store survives the loss of any one node (issue 46,
item 4): with 3 nodes or more, a --dyad job keeps its metadata in an etcd of
its own on its first three nodes (tools/job/etcd.cpp), which refuses anyone
without the job's credentials. On the real Slurm cluster of this directory."""
import hashlib
import hmac
import os
import re
import subprocess

import harness

from test_hardening import ATTACKER, SQUAT, drained, info, job_key, job_ports, submit

DYAD = harness.DYAD
ETCDCTL = "/usr/bin/etcdctl"


def etcd_urls(slurm, node):
    """(pid, uid, client URL, peer URL) of the job's etcd member on `node`."""
    procs = slurm.processes(node, "etcd")
    assert len(procs) == 1, procs
    pid, uid = procs[0]
    args = open(f"/proc/{pid}/cmdline").read().split("\0")
    return pid, uid, args[args.index("--listen-client-urls") + 1], args[args.index("--listen-peer-urls") + 1]


def no_etcd_left(slurm):
    return {n: slurm.processes(n, "etcd") for n in slurm.names if slurm.processes(n, "etcd")}


def test_job_survives_the_loss_of_node1(slurm, shared):
    """node1 produces six files with DYAD_REPLICAS=1, then its dyadd and its
    etcd member are killed: every file is still consumed on the other nodes,
    and `dyad ls` works. Before the job's own etcd, node1's dyadd hosted the
    store, and nothing could be consumed after it died."""
    out = os.path.join(shared, "out.txt")
    for i in range(6):
        harness.write_file(os.path.join(shared, f"f{i}.bin"), 64 << 10, seed=100 + i)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N4
#SBATCH -o {out}
export DYAD_REPLICAS=1 DYAD_REPLICAS_SYNC=1
srun --overlap -N4 -n4 true  # every node's prolog is done
srun --overlap -N1 -n1 -w node1 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && for i in 0 1 2 3 4 5; do cp {shared}/f$i.bin $DYAD_PATH_PRODUCER/r/ && {DYAD} produce $DYAD_PATH_PRODUCER/r/f$i.bin >/dev/null || exit 1; done; echo produced'
srun --overlap -N1 -n1 -w node1 bash -c 'd=$(dirname $DYAD_AUTH_KEY_FILE); kill -9 $(cat $d/dyadd.pid) $(cat $d/etcd.pid) && echo killed'
echo "t_kill $(date +%s.%N)"
srun --overlap -N1 -n1 -w node2 bash -c '{DYAD} consume --timeout 60 $DYAD_PATH_CONSUMER/r/f0.bin >/dev/null && echo "t_first $(date +%s.%N)" && cmp {shared}/f0.bin $DYAD_PATH_CONSUMER/r/f0.bin && echo same-f0'
for i in 1 2 3 4 5; do
  n=node$((2 + i % 3))
  srun --overlap -N1 -n1 -w $n bash -c "{DYAD} consume --timeout 60 \\$DYAD_PATH_CONSUMER/r/f$i.bin >/dev/null && cmp {shared}/f$i.bin \\$DYAD_PATH_CONSUMER/r/f$i.bin && echo same-f$i"
done
srun --overlap -N1 -n1 -w node3 {DYAD} ls r/ | sed 's/^/ls: /'
echo "rc-ls ${{PIPESTATUS[0]}}"
""")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 120) == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    assert "produced" in text and "killed" in text, info(slurm, job, out)
    for i in range(6):
        assert f"same-f{i}" in text, info(slurm, job, out)
    listed = [line for line in text.splitlines() if line.startswith("ls: ")]
    assert "rc-ls 0" in text and all(any(f"f{i}.bin" in line for line in listed) for i in range(6)), text
    t_kill = float(re.search(r"t_kill ([\d.]+)", text).group(1))
    t_first = float(re.search(r"t_first ([\d.]+)", text).group(1))
    line = f"store-ha: node1 (dyadd and etcd member) killed to the first consume done on node2 {t_first - t_kill:.2f} s"
    print(line)
    with open(os.path.join(harness.BUILD, "slurm-timings.txt"), "a") as f:
        f.write(line + "\n")
    assert drained(slurm) == {} and slurm.leftovers(job) == [] and no_etcd_left(slurm) == {}


def test_the_jobs_etcd_refuses_strangers(slurm, shared):
    """A 3-node --dyad job of an unprivileged user (nobody): its etcd members
    run as that user in the job directory; a client without the job's
    certificate is refused on the client and the peer port, one with the
    certificate but without the password can read nothing, and the job's
    files are not readable by another user (daemon). All gone at the job's
    end."""
    import pwd
    user = pwd.getpwnam("nobody")
    other = pwd.getpwnam("daemon")
    stranger = ["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}", "--clear-groups"]
    os.chmod(shared, 0o777)
    ready = os.path.join(shared, "ready")
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH -N3\n#SBATCH -w node[1-3]\n#SBATCH -o {out}\n"
                f"srun --overlap -N3 -n3 {DYAD} service status >/dev/null && touch {ready}\nsleep 300\n")
    os.chmod(script, 0o755)
    job = submit(slurm, script, "--dyad", f"--uid={user.pw_uid}", f"--gid={user.pw_gid}")
    try:
        harness.wait_for(lambda: os.path.exists(ready) or slurm.job_state(job) not in ("PENDING", "RUNNING"), 90,
                         what=f"job {job} to run")
        assert os.path.exists(ready), info(slurm, job, out)
        pid, uid, client, peer = etcd_urls(slurm, "node1")
        assert uid == user.pw_uid and client.startswith("https://") and peer.startswith("https://")
        jobdir = slurm.job_dir("node1", job, user.pw_uid)
        tls = os.path.join(jobdir, "etcd-tls")
        # No certificate: refused at the handshake, on both ports.
        for url in (client, peer):
            assert not slurm_handshake(slurm, url, None, stranger), url
        # A certificate of another CA (what a stranger can make): refused.
        other_ca = os.path.join(shared, "other")
        os.makedirs(other_ca)
        os.chmod(other_ca, 0o755)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-subj", "/CN=root",
                        "-keyout", f"{other_ca}/k.pem", "-out", f"{other_ca}/c.pem", "-days", "1"],
                       check=True, capture_output=True)
        for f in ("k.pem", "c.pem"):
            os.chmod(os.path.join(other_ca, f), 0o644)
        for url in (client, peer):
            assert not slurm_handshake(slurm, url, other_ca, stranger), url
        # The job's certificate without the password: nothing readable.
        base = [ETCDCTL, "--endpoints", client, "--cacert", f"{tls}/ca.crt", "--cert", f"{tls}/node.crt",
                "--key", f"{tls}/node.key", "--dial-timeout", "3s", "--command-timeout", "3s"]
        env = dict(os.environ, ETCDCTL_API="3")
        r = slurm.on("node1", base + ["get", "--prefix", "/"], check=False, env=env)
        assert r.returncode != 0 and ("permission denied" in r.stderr or "user name" in r.stderr), r
        # With a wrong password: refused.
        r = slurm.on("node1", base + ["--user", "root:guess", "get", "--prefix", "/"], check=False, env=env)
        assert r.returncode != 0 and "authentication failed" in r.stderr, r
        # The job's own password (derived from the key, in the job directory) reads the records.
        pw = open(os.path.join(jobdir, "etcd.password")).read().strip()
        # Nothing of it on etcd's command line, which every user of the node can read.
        cmdline = open(f"/proc/{pid}/cmdline").read()
        assert not any(pw[i:i + 8] in cmdline for i in range(len(pw) - 7)), cmdline
        r = slurm.on("node1", base + ["--user", f"root:{pw}", "get", "--prefix", "/dyad/services/", "--keys-only"],
                     check=False, env=env)
        assert r.returncode == 0 and r.stdout.count("/dyad/services/") == 3, r
        # Another user cannot read the job's certificates or password.
        for f in ("etcd-tls/node.key", "etcd.password", "etcd/member"):
            r = slurm.on("node1", stranger + ["ls", f"/tmp/dyad/{user.pw_uid}/{job}/{f}"], check=False)
            assert r.returncode != 0 and "Permission denied" in r.stderr, r
    finally:
        slurm.cmd("scancel", job, check=False)
    assert slurm.wait_job_done(job, 60) == "CANCELLED", info(slurm, job, out)
    assert drained(slurm) == {} and slurm.leftovers(job) == [] and no_etcd_left(slurm) == {}


def slurm_handshake(slurm, url, cert_dir, who):
    """A TLS client on node4 (another node), as user `who` (setpriv words), that
    presents `cert_dir`'s certificate (or none) to `url`: True when the
    server let it through to an answer."""
    cert = f"ctx.load_cert_chain('{cert_dir}/c.pem', '{cert_dir}/k.pem')" if cert_dir else "pass"
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    code = f"""
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
{cert}
s = socket.create_connection(('{host}', {port}), timeout=5)
try:
    t = ctx.wrap_socket(s, server_hostname='dyad-job-etcd')
    t.sendall(b'GET /version HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')
    sys.exit(0 if t.recv(100) else 1)
except (ssl.SSLError, OSError):
    sys.exit(1)
"""
    r = slurm.on("node4", who + ["/usr/bin/python3", "-c", code], check=False)
    return r.returncode == 0


def etcd_port(key_hex, label, taken):
    """The job's etcd port derived under `label` (tools/job/etcd.cpp)."""
    def part(b):
        return len(b).to_bytes(8, "little") + b
    i = 0
    while True:
        mac = hmac.new(key_hex.encode(), part(label.encode()) + part(str(i).encode()), hashlib.sha256)
        p = 20000 + int(mac.hexdigest()[:8], 16) % 10000
        if p not in taken:
            return p
        i += 1


def test_a_held_etcd_port_costs_one_member_not_the_job(slurm, shared):
    """Another user holds, on node2, the client port of the job's etcd: node2's
    member cannot start, the job runs on the other two members (a transfer
    between node2 and node3 works) and slurmd's log says why."""
    out = os.path.join(shared, "out.txt")
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 64 << 10, seed=7)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N3
#SBATCH -w node[1-3]
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node2 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && cp {src} $DYAD_PATH_PRODUCER/r/ && {DYAD} produce $DYAD_PATH_PRODUCER/r/src.bin >/dev/null && echo produced'
srun --overlap -N1 -n1 -w node3 bash -c '{DYAD} consume --timeout 30 $DYAD_PATH_CONSUMER/r/src.bin >/dev/null && cmp {src} $DYAD_PATH_CONSUMER/r/src.bin && echo same'
""")
    job = submit(slurm, script, "--dyad", "--hold")
    key = job_key(slurm, job)
    dyadd_ports = job_ports(key)
    client = etcd_port(key, "dyad-job-etcd-client-v1", dyadd_ports)
    squatter = subprocess.Popen(slurm.prefix("node2") + ATTACKER + ["/usr/bin/python3", "-c", SQUAT, "garbage", str(client)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "listening", squatter.stderr.read()
        slurm.cmd("scontrol", "release", job)
        assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
        text = open(out).read()
        assert "produced" in text and "same" in text, info(slurm, job, out)
        logs = "".join(open(p, errors="replace").read() for p in slurm.logs if "slurmd-node2" in p)
        assert "this node's etcd member" in logs and "ended during its start" in logs, logs[-3000:]
        assert drained(slurm) == {} and slurm.leftovers(job) == [] and no_etcd_left(slurm) == {}
    finally:
        slurm.cmd("scancel", job, check=False)
        squatter.kill()
        squatter.wait()
