# SPDX-License-Identifier: Apache-2.0
"""The SPANK plugin and `dyad job` against another user of the nodes
(issue 45, item 1) and against everyday mistakes (issue 46, items 5-7), on
the real Slurm cluster of this directory. The attacker is `nobody`, run on a
node with setpriv; the victim's jobs are root's (sbatch's default here)."""
import hashlib
import hmac
import os
import re
import shutil
import subprocess

import harness
import pytest

DYAD = harness.DYAD
WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
LIBRARY = os.path.join(harness.BUILD, "lib", "libdyad.so")
ATTACKER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def submit(slurm, script, *args):
    return slurm.cmd("sbatch", "--parsable", *args, script).stdout.strip().split(";")[0]


def info(slurm, job=None, out=None):
    text = ""
    if out and os.path.exists(out):
        with open(out, errors="replace") as f:
            text += f"--- job output {out}\n{f.read()}\n"
    if job:
        text += slurm.cmd("scontrol", "show", "job", str(job), check=False).stdout
    return text + slurm.tail_logs(20)


def node_states(slurm):
    r = slurm.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False)
    return dict(line.split() for line in r.stdout.splitlines() if line.strip())


def drained(slurm):
    return {n: s for n, s in node_states(slurm).items() if "drain" in s or s.startswith("dr")}


@pytest.fixture(autouse=True)
def nodes_back_in_service(slurm):
    """Whatever a test did (on old code a node drains): every node resumed."""
    yield
    bad = drained(slurm)
    if bad:
        slurm.cmd("scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME", check=False)


def transfer_script(shared, out, extra=""):
    """node1 produces, node2 consumes (dyad produce / dyad consume)."""
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 256 << 10, seed=11)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -w node[1-2]
#SBATCH -o {out}
set -e
echo "uri $DYAD_SERVICE_URI"
{extra}
srun --overlap -N1 -n1 -w node1 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && cp {src} $DYAD_PATH_PRODUCER/r/f.bin && {DYAD} produce $DYAD_PATH_PRODUCER/r/f.bin >/dev/null'
srun --overlap -N1 -n1 -w node2 bash -c '{DYAD} consume --timeout 30 $DYAD_PATH_CONSUMER/r/f.bin >/dev/null && cmp {src} $DYAD_PATH_CONSUMER/r/f.bin && echo same'
""")
    return script


def as_attacker(slurm, node, shell):
    r = slurm.on(node, ATTACKER + ["sh", "-c", shell], check=False)
    assert r.returncode == 0, r


def snapshot(root):
    """Every entry of nobody's under `root`: inode -> (type, content)."""
    seen = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            if st.st_uid != 65534:
                continue
            if os.path.islink(p):
                what = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    what = ("file", f.read())
            else:
                what = ("dir" if os.path.isdir(p) else "other", None)
            seen[st.st_ino] = (p, what)
    return seen


UNIX_SOCKET = "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])"


def test_planted_entries_drain_nothing_and_are_left_alone(slurm, shared):
    """Another user plants, on both nodes, what the old layout and the new
    one could be fooled by: job directories, dyadd.pid files, sockets, fake
    records, and the plugin's parent itself (a directory of theirs on node1,
    a symbolic link to theirs on node2). The victim's --dyad job and a plain
    job both complete, no node drains, the plain job gets no DYAD_*, and
    every planted entry is still there, unchanged (moved aside at most)."""
    out_v, out_p = os.path.join(shared, "victim.txt"), os.path.join(shared, "plain.txt")
    victim = submit(slurm, transfer_script(shared, out_v), "--dyad", "--hold")
    plain_script = os.path.join(shared, "plain.sh")
    with open(plain_script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH -N2\n#SBATCH -w node[1-2]\n#SBATCH -o {out_p}\n"
                "env | grep ^DYAD_ || true\necho end\n")
    plain = submit(slurm, plain_script, "--hold")
    try:
        for n in ("node1", "node2"):
            shutil.rmtree(os.path.join(slurm.node_tmp(n), "dyad"), ignore_errors=True)
        for j in (victim, plain):
            for n in ("node1", "node2"):
                as_attacker(slurm, n, f"mkdir -p /tmp/dyad-{j} && echo 1 > /tmp/dyad-{j}/dyadd.pid && "
                                      f"/usr/bin/python3 -c '{UNIX_SOCKET}' /tmp/dyad-{j}/dyadd.sock")
        record = lambda j, d: f"printf 'uid=0\\ngid=0\\nstate=ready\\ndir={d}\\n' > /tmp/atk/job-{j}"
        # node1: /tmp/dyad is the attacker's directory, holding the victim's job directory
        as_attacker(slurm, "node1", f"mkdir -p /tmp/atk /tmp/dyad/0/{victim} && chmod 777 /tmp/dyad /tmp/dyad/0 && "
                                    f"echo 1 > /tmp/dyad/0/{victim}/dyadd.pid && "
                                    f"/usr/bin/python3 -c '{UNIX_SOCKET}' /tmp/dyad/0/{victim}/dyadd.sock && "
                                    f"{record(plain, '/tmp/atk')} && cp /tmp/atk/job-{plain} /tmp/dyad/")
        # node2: /tmp/dyad is a symbolic link to the attacker's directory, with records
        as_attacker(slurm, "node2", f"mkdir -p /tmp/atk/0 && {record(victim, '/tmp/atk')} && "
                                    f"{record(plain, '/tmp/atk')} && ln -s /tmp/atk /tmp/dyad")
        before = {n: snapshot(slurm.node_tmp(n)) for n in ("node1", "node2")}
        slurm.cmd("scontrol", "release", victim, plain)
        assert slurm.wait_job_done(victim, 90) == "COMPLETED", info(slurm, victim, out_v)
        assert slurm.wait_job_done(plain, 60) == "COMPLETED", info(slurm, plain, out_p)
        assert drained(slurm) == {}, info(slurm, victim, out_v)
        text = open(out_v).read()
        assert f"uri unix:/tmp/dyad/0/{victim}/dyadd.sock" in text and "same" in text, text
        assert open(out_p).read().strip() == "end", info(slurm, plain, out_p)
        for n in ("node1", "node2"):
            after = snapshot(slurm.node_tmp(n))
            for ino, (path, what) in before[n].items():
                assert ino in after and after[ino][1] == what, (n, path, after.get(ino))
            st = os.lstat(os.path.join(slurm.node_tmp(n), "dyad"))
            assert st.st_uid == 0 and not os.path.islink(os.path.join(slurm.node_tmp(n), "dyad")), n
        assert os.listdir(os.path.join(slurm.node_tmp("node2"), "atk", "0")) == []  # nothing made through the link
        for n in ("node1", "node2"):  # the victim's own files are gone (the planted ones stay)
            assert not os.path.lexists(slurm.job_dir(n, victim)), n
            assert not os.path.lexists(os.path.join(slurm.node_tmp(n), "dyad", f"job-{victim}")), n
            assert slurm.processes(n) == [], n
    finally:
        slurm.cmd("scancel", victim, plain, check=False)
        for n in ("node1", "node2"):
            for j in (victim, plain):
                shutil.rmtree(os.path.join(slurm.node_tmp(n), f"dyad-{j}"), ignore_errors=True)
            shutil.rmtree(os.path.join(slurm.node_tmp(n), "atk"), ignore_errors=True)
            for e in os.listdir(slurm.node_tmp(n)):
                if e.startswith("dyad.moved-"):
                    shutil.rmtree(os.path.join(slurm.node_tmp(n), e), ignore_errors=True)
            if os.path.islink(os.path.join(slurm.node_tmp(n), "dyad")):
                os.unlink(os.path.join(slurm.node_tmp(n), "dyad"))


def job_key(slurm, job, uid=0):
    """The job key the plugin derives (docs/security.md)."""
    with open(slurm.site_key, "rb") as f:
        secret = f.read()[:4096]
    msg = b"\0".join([b"dyad-slurm-job-key-v1", b"dyadtest", str(job).encode(), str(uid).encode()])
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def job_ports(key_hex, lo=20000, hi=29999, count=8):
    """The job's candidate ports (tools/job/ready.cpp), in order."""
    def part(b):
        return len(b).to_bytes(8, "little") + b
    out, i = [], 0
    while len(out) < count:
        mac = hmac.new(key_hex.encode(), part(b"dyad-job-port-v1") + part(str(i).encode()), hashlib.sha256)
        p = lo + int(mac.hexdigest()[:8], 16) % (hi - lo + 1)
        if p not in out:
            out.append(p)
        i += 1
    return out


SQUAT = r"""
import socket, sys, threading, time
mode, socks = sys.argv[1], []
for p in sys.argv[2:]:
    s = socket.socket()
    s.bind(("0.0.0.0", int(p)))
    s.listen(64)
    socks.append(s)
def serve(s):
    held = []
    while True:
        c, _ = s.accept()
        if mode == "garbage":
            c.sendall(b"HTTP/1.0 200 OK\r\n\r\nnot a dyadd\n")
        held.append(c)
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("listening", flush=True)
while True:
    time.sleep(1)
"""


def test_squatted_ports_are_skipped(slurm, shared):
    """Another user listens, on both nodes, on the port the old plugin used
    (20000 + job id % 10000) and on the job's first port (which only the
    key's holders can compute: the worst case), silent on node1, answering
    garbage on node2. The job starts on other ports, proven with the key,
    completes a transfer; the listeners are untouched; no node drains."""
    out = os.path.join(shared, "out.txt")
    extra = 'srun --overlap -N2 -n2 bash -c \'echo "addr $SLURMD_NODENAME $(grep ^address= /tmp/dyad/job-$SLURM_JOB_ID)"\''
    job = submit(slurm, transfer_script(shared, out, extra), "--dyad", "--hold")
    ports = job_ports(job_key(slurm, job))
    squat = [str(20000 + int(job) % 10000), str(ports[0])]
    squatters = []
    try:
        for n, mode in (("node1", "silent"), ("node2", "garbage")):
            p = subprocess.Popen(slurm.prefix(n) + ATTACKER + ["/usr/bin/python3", "-c", SQUAT, mode] + squat,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "listening", p.stderr.read()
            squatters.append(p)
        slurm.cmd("scontrol", "release", job)
        assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
        text = open(out).read()
        assert "same" in text, text
        used = dict(re.findall(r"addr (node\d) address=[\d.]+:(\d+)", text))
        assert sorted(used) == ["node1", "node2"], text
        assert not set(used.values()) & set(squat), (used, squat)
        assert all(p.poll() is None for p in squatters)  # still listening, untouched
        assert drained(slurm) == {}
    finally:
        slurm.cmd("scancel", job, check=False)
        for p in squatters:
            p.kill()
            p.wait()


def test_node_names_that_do_not_resolve(slurm, shared):
    """No node name resolves on the nodes (no /etc/hosts entries, no DNS):
    the job's dyadds find each other at Slurm's NodeAddr."""
    hosts = os.path.join(slurm.root, "hosts")
    with open(hosts) as f:
        saved = f.read()
    out = os.path.join(shared, "out.txt")
    script = transfer_script(shared, out, "getent hosts node1 node2 || echo names-do-not-resolve")
    try:
        with open(hosts, "w") as f:  # the same file, bound over every node's /etc/hosts
            f.write("127.0.0.1 localhost\n")
        job = submit(slurm, script, "--dyad")
        assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
    finally:
        with open(hosts, "w") as f:
            f.write(saved)
    text = open(out).read()
    assert "names-do-not-resolve" in text and "same" in text, text
    assert drained(slurm) == {}


@pytest.mark.parametrize("value,reason", [
    ("mode=FOO", "mode 'FOO' is not a transport"),
    ("wait=abc", "wait 'abc' is not a duration"),
    ("wait=-1", "wait '-1' is not a duration"),
    ("dir=/scratch/{jobid}", "dir= is not allowed on this cluster"),
    ("colour=blue", "'colour=blue' is not mode=TRANSPORT"),
])
def test_bad_dyad_values_are_refused_at_submission(slurm, value, reason):
    for cmd in (["sbatch", "--wrap", "true"], ["salloc", "-N1", "true"], ["srun", "-N1", "true"]):
        r = slurm.cmd(cmd[0], f"--dyad={value}", *cmd[1:], check=False)
        assert r.returncode != 0 and reason in r.stderr, (cmd, r.stderr)


def test_good_values_reach_the_tasks(slurm):
    """wait= takes the durations `dyad consume --timeout` takes; the tasks
    also get the wrapper's and libdyad's paths."""
    r = slurm.cmd("srun", "-N1", "--dyad=wait=1.5m,mode=stream", "printenv", "DYAD_WAIT_TIMEOUT", "DYAD_DTL_MODE",
                  "DYAD_WRAPPER", "DYAD_LIBRARY", timeout=90, check=False)
    assert r.returncode == 0, r.stderr + slurm.tail_logs()
    assert r.stdout.split() == ["90", "STREAM", WRAPPER, LIBRARY], r.stdout


def test_a_second_job_start_of_a_running_job_is_refused(slurm):
    """`dyad job start` of a job id that runs: refused with the reason, and
    the running job keeps its services, key and data."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DYAD_"))}
    job = f"r{os.getpid()}"
    base = ["--launcher", slurm.launcher_template(), "--nodes", "node[3-4]", "--job-id", job]
    r = subprocess.run([DYAD, "job", "start", *base, "--timeout", "30"], capture_output=True, text=True,
                       env=env, timeout=90)
    try:
        assert r.returncode == 0, r.stderr
        job_env = dict(env)
        for m in re.finditer(r"^export (\w+)='([^']*)'$", r.stdout, re.M):
            job_env[m.group(1)] = m.group(2)
        key = os.path.join(slurm.node_tmp("node3"), f"dyad-{job}", "job.key")
        with open(key) as f:
            key_text = f.read()
        again = subprocess.run([DYAD, "job", "start", *base, "--timeout", "30"], capture_output=True, text=True,
                               env=env, timeout=90)
        assert again.returncode != 0 and "runs already" in again.stderr, again.stderr
        with open(key) as f:
            assert f.read() == key_text
        for n in ("node3", "node4"):
            st = slurm.on(n, [DYAD, "service", "status"], env=job_env, check=False)
            assert st.returncode == 0, (n, st.stderr)
    finally:
        subprocess.run([DYAD, "job", "stop", *base], capture_output=True, text=True, env=env, timeout=90)
    assert slurm.leftovers(job) == []


def test_prolog_flags_without_alloc_is_named(slurm):
    """node-up, as the plugin's prolog runs it, refuses a slurm.conf without
    PrologFlags=Alloc, naming the setting (the job then fails with this
    message; the node stays in service)."""
    conf = os.path.join(slurm.root, "no-alloc.conf")  # not under /tmp: every node has its own
    with open(conf, "w") as f:
        f.write(open(slurm.conf).read().replace("PrologFlags=Alloc", ""))
    r = slurm.on("node1", [DYAD, "job", "node-up", "--node", "node1", "--nodes", "node1", "--dir",
                           f"/tmp/pf{os.getpid()}", "--job-id", "1", "--from-prolog", "--slurm-conf", conf,
                           "--timeout", "5"], input="ab" * 32 + "\n", check=False)
    assert r.returncode != 0 and "PrologFlags=Alloc" in r.stderr, r.stderr
    shutil.rmtree(os.path.join(slurm.node_tmp("node1"), f"pf{os.getpid()}"), ignore_errors=True)


def test_store_gone_says_what_the_user_can_do(slurm, shared):
    """The first node's dyadd (the job's store) dies: a consumer on another
    node is told what it can do under the plugin, not to restart a service
    it cannot restart."""
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -w node[1-2]
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node2 true  # node2's prolog (its dyadd) is done: a task ran there
srun --overlap -N1 -n1 -w node1 bash -c 'kill -9 $(cat $(dirname $DYAD_AUTH_KEY_FILE)/dyadd.pid)'
srun --overlap -N1 -n1 -w node2 {DYAD} consume --timeout 5 $DYAD_PATH_CONSUMER/never.bin
echo "rc $?"
""")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    assert "Submit the job again" in text and "dyad job start" in text, text
    assert "rc 0" not in text, text
    assert drained(slurm) == {} and slurm.leftovers(job) == []


def test_a_start_the_job_cannot_have_fails_its_tasks_not_the_node(slurm, shared):
    """Every port of the job is held on node2 (possible only with the job
    key; a stand-in for any failure that is the job's): the job's tasks on
    node2 fail with the reason in the job's output, node1's work, and no
    node drains."""
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH -N2\n#SBATCH -w node[1-2]\n#SBATCH -o {out}\n"
                f"srun --overlap -N1 -n1 -w node1 {DYAD} service status >/dev/null && echo node1-ok\n"
                f"srun --overlap -N1 -n1 -w node2 true; echo \"node2 rc $?\"\n")
    job = submit(slurm, script, "--dyad", "--hold")
    squatter = subprocess.Popen(slurm.prefix("node2") + ATTACKER + ["/usr/bin/python3", "-c", SQUAT, "garbage"] +
                                [str(p) for p in job_ports(job_key(slurm, job))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "listening", squatter.stderr.read()
        slurm.cmd("scontrol", "release", job)
        assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
        text = open(out).read()
        assert "node1-ok" in text and "node2 rc 0" not in text, text
        assert "node node2: DYAD did not start on this node" in text and "held by another program" in text, text
        assert drained(slurm) == {} and slurm.leftovers(job) == []
    finally:
        slurm.cmd("scancel", job, check=False)
        squatter.kill()
        squatter.wait()


def test_dyad_job_env_gives_a_shell_the_environment(slurm):
    """A shell on a node of the job without the DYAD environment (salloc's,
    on a node) gets it from `dyad job env`, the same as a step's."""
    shell = (f'want="$DYAD_SERVICE_URI $DYAD_AUTH_KEY_FILE"; unset DYAD_SERVICE_URI DYAD_AUTH_KEY_FILE; '
             f'eval "$({DYAD} job env)" && [ "$want" = "$DYAD_SERVICE_URI $DYAD_AUTH_KEY_FILE" ] && echo same-env')
    r = slurm.cmd("srun", "-N1", "--dyad", "bash", "-c", shell, timeout=90, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "same-env", r.stdout + r.stderr
    r = slurm.cmd("srun", "-N1", "bash", "-c", f"{DYAD} job env", timeout=90, check=False)
    assert r.returncode != 0 and "no DYAD of job" in r.stderr, r.stderr
