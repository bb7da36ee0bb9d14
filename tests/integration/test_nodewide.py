# SPDX-License-Identifier: Apache-2.0
"""The keyless node-wide service (issue 45, findings 3 and 4): a root dyadd
with --allow-uid any, several users on its Unix socket and loopback port,
decides access as the kernel does (docs/security.md, "The node-wide
service"). Real processes of two real users made for the test (useradd):
the victim and the attacker, who is in a group the victim's file excludes.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "userdel", "groupadd", "setpriv")),
    reason="needs root, useradd and setpriv (real users)")

TAG = f"{os.getpid() % 100000}"
VICTIM, ATTACKER, GROUP = f"dyadv{TAG}", f"dyada{TAG}", f"dyadg{TAG}"


def _id(flag, name):
    return int(subprocess.run(["id", flag, name], check=True, capture_output=True, text=True).stdout)


@pytest.fixture(scope="module")
def users():
    """Two users: the victim, and the attacker (a member of GROUP)."""
    made = []
    try:
        subprocess.run(["groupadd", GROUP], check=True, capture_output=True)
        made.append(("groupdel", GROUP))
        subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", VICTIM], check=True, capture_output=True)
        made.append(("userdel", VICTIM))
        subprocess.run(["useradd", "-M", "-U", "-G", GROUP, "-s", "/usr/sbin/nologin", ATTACKER], check=True,
                       capture_output=True)
        made.append(("userdel", ATTACKER))
        yield {"victim": _id("-u", VICTIM), "attacker": _id("-u", ATTACKER),
               "group": int(subprocess.run(["getent", "group", GROUP], check=True, capture_output=True,
                                           text=True).stdout.split(":")[2])}
    finally:
        for cmd, name in reversed(made):
            subprocess.run([cmd, name], capture_output=True)


def as_user(name):
    return ["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups"]


@pytest.fixture(scope="module")
def service(users):
    """A root dyadd without a key serving every local user: the producer
    directory a shared one (1777, like /tmp), a Unix socket and loopback."""
    with harness.Cluster(nodes=1, start=False, auth=False, dyadd_args=["--allow-uid", "any"]) as c:
        node = c[0]
        os.chmod(c.root, 0o755)
        node.socket = os.path.join(c.root, "dyadd.sock")
        os.makedirs(node.dir, exist_ok=True)
        os.chmod(node.dir, 0o1777)
        node.start()
        for who in ("victim", "attacker"):
            d = os.path.join(c.root, f"cons-{who}")
            os.mkdir(d, 0o700)
            os.chown(d, users[who], users[who])
        yield node


def run_as(node, who, *args, uri=None):
    name = VICTIM if who == "victim" else ATTACKER
    env = node.env(producer=False, consumer=False, DYAD_PATH_PRODUCER=node.dir,
                   DYAD_PATH_CONSUMER=os.path.join(node.cluster.root, f"cons-{who}"), DYAD_WAIT_TIMEOUT=5,
                   DYAD_SERVICE_URI=uri or node.unix_uri)
    return subprocess.run(as_user(name) + [harness.DYAD, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def victim_file(node, users, rel, mode, size=3000, seed=1):
    """A file of the victim's, produced by the victim."""
    path = node.path(rel)
    harness.write_file(path, size, seed=seed)
    os.chown(path, users["victim"], users["victim"])
    os.chmod(path, mode)
    return path


def produce_as_victim(node, path):
    p = run_as(node, "victim", "produce", path)
    assert p.returncode == 0, p.stderr


def consumed(node, who, rel):
    return os.path.join(node.cluster.root, f"cons-{who}", rel)


def refused_to_attacker(node, rel):
    p = run_as(node, "attacker", "consume", consumed(node, "attacker", rel))
    assert p.returncode != 0, f"the attacker consumed {rel}: {p.stdout} {p.stderr}"
    assert not os.path.exists(consumed(node, "attacker", rel))
    return p


def test_a_file_the_attacker_may_read_is_served_to_it(service, users):
    """The control of the refusals below: the same users, the same service."""
    path = victim_file(service, users, "open.bin", 0o644, seed=2)
    produce_as_victim(service, path)
    p = run_as(service, "attacker", "consume", consumed(service, "attacker", "open.bin"))
    assert p.returncode == 0, p.stderr
    assert harness.sha256(consumed(service, "attacker", "open.bin")) == harness.sha256(path)


def test_a_file_in_the_victims_0700_directory_is_not_served_to_another_user(service, users):
    """Before: the 0644 file inside the victim's 0700 directory was served
    to the attacker (only the file's mode bits were looked at)."""
    d = service.path("vdir")
    os.mkdir(d, 0o700)
    os.chown(d, users["victim"], users["victim"])
    path = victim_file(service, users, "vdir/secret.bin", 0o644, seed=3)
    produce_as_victim(service, path)
    p = refused_to_attacker(service, "vdir/secret.bin")
    assert f"is not readable by uid {users['attacker']}" in p.stderr, p.stderr
    # The victim itself is served it (opened with its credentials).
    p = run_as(service, "victim", "consume", consumed(service, "victim", "vdir/secret.bin"))
    assert p.returncode == 0, p.stderr
    # Nor may the attacker publish it itself (it cannot open it).
    p = run_as(service, "attacker", "produce", path)
    assert p.returncode != 0, p.stdout
    assert "no open file came with it" in p.stderr, p.stderr


@pytest.mark.skipif(not shutil.which("setfacl"), reason="needs setfacl (the acl package: scripts/install-deps.sh)")
def test_an_acl_that_excludes_the_attacker_is_kept(service, users):
    """Before: a 0644 file with the ACL entry user:attacker:--- was served
    to the attacker (docs/security.md said ACLs could only make DYAD refuse)."""
    path = victim_file(service, users, "acl.bin", 0o644, seed=4)
    subprocess.run(["setfacl", "-m", f"u:{ATTACKER}:---", path], check=True)
    produce_as_victim(service, path)
    refused_to_attacker(service, "acl.bin")


def test_the_group_class_comes_before_the_others_bits(service, users):
    """Before: a 0604 file whose group (the attacker's) may not read it was
    served to the attacker by its others bit; the kernel refuses it."""
    path = victim_file(service, users, "grp.bin", 0o604, seed=5)
    os.chown(path, users["victim"], users["group"])
    produce_as_victim(service, path)
    refused_to_attacker(service, "grp.bin")


def test_a_publish_of_another_uid_needs_its_open_file(service, users):
    """Over loopback TCP no descriptor can pass: another user's publish is
    refused there (before: published, by any local user)."""
    path = victim_file(service, users, "tcp.bin", 0o644, seed=6)
    p = run_as(service, "victim", "produce", path, uri=service.uri)
    assert p.returncode != 0, p.stdout
    assert "Unix socket" in p.stderr, p.stderr
    produce_as_victim(service, path)  # over the Unix socket it is


def test_another_users_rm_is_refused(service, users):
    """Before: any local user unpublished any other user's file (every
    record is the one root service's)."""
    path = victim_file(service, users, "mine.bin", 0o644, seed=7)
    produce_as_victim(service, path)
    p = run_as(service, "attacker", "rm", path)
    assert p.returncode != 0, p.stdout
    assert f"published by uid {users['victim']}" in p.stderr, p.stderr
    # Still published: the victim's consumer gets it, and the victim may remove it.
    p = run_as(service, "victim", "consume", consumed(service, "victim", "mine.bin"))
    assert p.returncode == 0, p.stderr
    p = run_as(service, "victim", "rm", path)
    assert p.returncode == 0, p.stderr


FORGE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import rawwire
sock, host, port, sid, key, gen, value = sys.argv[2:9]
out = {}
for how in ("unix", "tcp"):
    try:
        if how == "unix":
            r = rawwire.Raw(unix_path=sock, role="service", service_id=sid)
        else:
            r = rawwire.Raw(host, int(port), role="service", service_id=sid)
    except OSError as e:
        out[how] = {"hello": "closed: " + str(e)}
        continue
    if r.info["type"] != rawwire.HELLO:
        out[how] = {"hello": "refused", "msg": (r.info["meta"] or {}).get("msg", "")}
        continue
    t = r.request("kvs.put", ns="dyad", key=key, value=value, replaces=int(gen))
    f, _ = r.collect(t)
    out[how] = {"hello": "admitted", "put": f["type"] == rawwire.END, "msg": (f["meta"] or {}).get("msg", "")}
print(json.dumps(out))
"""


def test_a_forged_service_hello_and_put_are_refused(service, users):
    """Before: the attacker said role "service" with the root service's own
    id and rewrote the victim's record with `replaces` (the victim's
    consumers would then fetch the attacker's bytes)."""
    path = victim_file(service, users, "rec.bin", 0o644, seed=8)
    produce_as_victim(service, path)
    before = json.loads(run_as(service, "victim", "--json", "stat", path).stdout)
    forged = dict(before)
    for k in ("generation", "owner_rank", "key", "replicas", "replicas_error"):
        forged.pop(k, None)
    forged["node"] = "attacker"
    p = subprocess.run(as_user(ATTACKER) + [sys.executable, "-c", FORGE, HERE, service.socket, service.host,
                                            str(service.port), before["owner"], before["key"],
                                            str(before["generation"]), json.dumps(forged)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for how in ("unix", "tcp"):
        assert out[how]["hello"] == "refused", out
        assert "may not speak as a service" in out[how]["msg"], out
    after = json.loads(run_as(service, "victim", "--json", "stat", path).stdout)
    assert after["node"] == before["node"] and after["generation"] == before["generation"], after


def test_a_planted_dot_dyad_refuses_the_start(users):
    """Before: a .dyad another user made before the root dyadd's first start
    was used as is (its lock, epoch and ledger inside)."""
    with harness.Cluster(nodes=1, start=False, auth=False, dyadd_args=["--allow-uid", "any"]) as c:
        node = c[0]
        os.makedirs(node.dir, exist_ok=True)
        planted = os.path.join(node.dir, ".dyad")
        os.mkdir(planted, 0o755)
        os.chown(planted, users["attacker"], users["attacker"])
        with pytest.raises(RuntimeError) as e:
            node.start()
        assert f"belongs to uid {users['attacker']}" in str(e.value), str(e.value)
        assert os.stat(planted).st_uid == users["attacker"]  # left as it was
        assert os.listdir(planted) == []
