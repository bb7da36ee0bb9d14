# SPDX-License-Identifier: Apache-2.0
"""A consumer cannot be turned against its own user (issue 31, findings 2, 6
and 8): another user who can write the consumer directory (a sticky /tmp, a
group's project directory) plants links in `.dyad/` or in the tree, or holds
a lock file; a producer publishes through a link into `.dyad/`. The attacker
is a process of its own, as uid nobody; the consumer runs as root, as a
batch job's would. The victim is untouched, and the consume fails with an
error that names the path and says what to do (or succeeds safely)."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

import harness

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (the attacker runs as nobody) and setpriv")


def as_nobody(script, *args, **kw):
    """Runs a Python script as uid/gid nobody."""
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", script,
           *[str(a) for a in args]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True, **kw)


@pytest.fixture
def shared_dir():
    """A consumer directory everyone may write, as /tmp (sticky)."""
    d = tempfile.mkdtemp(prefix="dyad-shared-")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def produce(node, name, text):
    node.produce_text(name, text)


def victim_file(cluster, name="victim", text="precious\n"):
    path = os.path.join(cluster.root, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path, os.stat(path)


def assert_untouched(path, before, text="precious\n"):
    with open(path) as f:
        assert f.read() == text, f"{path} was changed"
    after = os.stat(path)
    assert (after.st_ino, after.st_mode, after.st_uid) == (before.st_ino, before.st_mode, before.st_uid)


PLANT_LOCKS = """
import os, sys
d, victim, how = sys.argv[1:4]
top = os.path.join(d, ".dyad")
if how == "symlink":  # .dyad itself a link to a directory of nobody's
    real = os.path.join(d, "nobodys")
    os.mkdir(real, 0o777)
    os.symlink(real, top)
else:
    os.mkdir(top, 0o777)
os.mkdir(os.path.join(top, "locks"), 0o777)
for i in range(256):
    os.symlink(victim, os.path.join(top, "locks", "%02x.lock" % i))
"""


@pytest.mark.parametrize("how", ["owned", "symlink"])
def test_lock_links_planted_by_another_user_touch_nothing(cluster, shared_dir, how):
    """nobody makes <dir>/.dyad (or a link to a directory of its own) with
    every lock file a link to a root file: a root consumer must neither
    truncate nor write the victim, and says which directory to remove."""
    prod, cons = cluster[0], harness.NodeView(cluster[1], shared_dir)
    victim, before = victim_file(cluster)
    as_nobody(PLANT_LOCKS, shared_dir, victim, how)
    produce(prod, "f.txt", "payload")
    p = cons.dyad("consume", cons.path("f.txt"), check=False, timeout=60, env_extra={"DYAD_WAIT_TIMEOUT": 10})
    assert_untouched(victim, before)
    assert p.returncode != 0, p.stdout
    top = os.path.join(shared_dir, ".dyad")
    assert top in p.stderr, p.stderr
    if how == "owned":
        assert "belongs to uid 65534" in p.stderr and "Remove it" in p.stderr, p.stderr
    else:
        assert "is a symbolic link" in p.stderr and "remove it" in p.stderr, p.stderr
    assert not os.path.exists(cons.path("f.txt"))
    # Once the planted directory is gone, the consumer makes its own: private.
    os.unlink(top) if os.path.islink(top) else shutil.rmtree(top)
    cons.dyad("consume", cons.path("f.txt"), timeout=60, env_extra={"DYAD_WAIT_TIMEOUT": 10})
    with open(cons.path("f.txt")) as f:
        assert f.read() == "payload"
    assert stat.S_IMODE(os.lstat(top).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(os.path.join(top, "locks")).st_mode) == 0o700
    locks = os.listdir(os.path.join(top, "locks"))
    assert locks and all(stat.S_IMODE(os.lstat(os.path.join(top, "locks", n)).st_mode) == 0o600 for n in locks)
    assert_untouched(victim, before)


PLANT_DIR_LINK = """
import os, sys
d, elsewhere = sys.argv[1:3]
os.mkdir(os.path.join(d, "run1"), 0o755)
os.symlink(elsewhere, os.path.join(d, "run1", "x"))
"""


def test_a_symlinked_directory_does_not_lead_the_file_elsewhere(cluster, shared_dir):
    """nobody makes run1/x -> a root directory: a root consumer of
    run1/x/passwd must not replace (nor create anything in) that directory."""
    prod, cons = cluster[0], harness.NodeView(cluster[1], shared_dir)
    elsewhere = os.path.join(cluster.root, "elsewhere")
    os.mkdir(elsewhere)
    victim, before = victim_file(cluster, "elsewhere/passwd", "root:x:0:0::/root:/bin/sh\n")
    as_nobody(PLANT_DIR_LINK, shared_dir, elsewhere)
    produce(prod, "run1/x/passwd", "toor::0:0::/root:/bin/sh\n")
    p = cons.dyad("consume", cons.path("run1/x/passwd"), check=False, timeout=60,
                  env_extra={"DYAD_WAIT_TIMEOUT": 10})
    assert_untouched(victim, before, "root:x:0:0::/root:/bin/sh\n")
    assert os.listdir(elsewhere) == ["passwd"]  # no temporary file left there either
    assert p.returncode != 0, p.stdout
    assert "'run1/x' is a symbolic link" in p.stderr and "run1/x/passwd" in p.stderr, p.stderr
    assert shared_dir in p.stderr, p.stderr
    # The same through the C library's batch path (consume_many / sync).
    p = cons.dyad("consume", cons.path("run1/x/passwd"), cons.path("f2.txt"), check=False, timeout=60,
                  env_extra={"DYAD_WAIT_TIMEOUT": 3})
    assert_untouched(victim, before, "root:x:0:0::/root:/bin/sh\n")
    assert "symbolic link" in p.stderr, p.stderr


HOLD_READ_LOCKS = """
import fcntl, os, sys
locks = sys.argv[1]
held = []
for n in sorted(os.listdir(locks)):
    fd = os.open(os.path.join(locks, n), os.O_RDONLY)
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    held.append(fd)
print(len(held), flush=True)
sys.stdin.read()
"""


def test_a_read_lock_held_by_another_user_ends_at_the_deadline(cluster):
    """Lock files as an older version left them (0644 in a 02775 .dyad of
    the consumer's): nobody opens them and takes a read lock on each. A
    consume with --timeout 3 ends at its deadline, saying which lock file
    another process holds; the files are private from then on."""
    prod = cluster[0]
    d = tempfile.mkdtemp(prefix="dyad-cons-")
    try:
        os.chmod(d, 0o2755)
        cons = harness.NodeView(cluster[1], d)
        locks = os.path.join(d, ".dyad", "locks")
        os.makedirs(locks)
        for p_ in (os.path.dirname(locks), locks):
            os.chmod(p_, 0o2775)
        for i in range(256):
            with open(os.path.join(locks, "%02x.lock" % i), "w"):
                pass
            os.chmod(os.path.join(locks, "%02x.lock" % i), 0o644)
        holder = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                   sys.executable, "-c", HOLD_READ_LOCKS, locks],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "256"
            produce(prod, "held.txt", "bytes")
            t0 = time.monotonic()
            try:
                p = cons.dyad("consume", "--timeout", "3", cons.path("held.txt"), check=False, timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("the consume was still waiting for the lock 17 s after its deadline")
            took = time.monotonic() - t0
            assert p.returncode == 3, p.stderr  # timeout
            assert 2.5 < took < 10, took
            assert os.path.join(d, ".dyad", "locks") in p.stderr and "held by another process" in p.stderr, p.stderr
            assert not os.path.exists(cons.path("held.txt"))
            # Private from now on: nobody cannot open a lock file again.
            assert stat.S_IMODE(os.stat(os.path.join(d, ".dyad")).st_mode) == 0o700
            r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                sys.executable, "-c", f"open({os.path.join(locks, '00.lock')!r})"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr
        finally:
            holder.stdin.close()
            holder.wait(timeout=10)
        cons.dyad("consume", "--timeout", "10", cons.path("held.txt"), timeout=60)
        with open(cons.path("held.txt")) as f:
            assert f.read() == "bytes"
        assert all(stat.S_IMODE(os.stat(os.path.join(locks, n)).st_mode) in (0o600, 0o644)
                   for n in os.listdir(locks))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_publishing_through_a_link_into_dyad_is_refused(cluster):
    """m -> .dyad, then `dyad produce <dir>/m/x`: refused, as is a link to a
    file in .dyad; links that stay out of .dyad still work."""
    prod, cons = cluster[0], cluster[1]
    reserved = prod.path(".dyad")
    os.makedirs(reserved, exist_ok=True)
    with open(os.path.join(reserved, "secret"), "w") as f:
        f.write("dyad's own\n")
    os.symlink(".dyad", prod.path("m"))
    os.symlink(".dyad/secret", prod.path("e"))
    for name in ("m/secret", "e"):
        p = prod.dyad("produce", prod.path(name), check=False)
        assert p.returncode != 0, (name, p.stdout)
        assert ".dyad" in p.stderr and "symbolic link" in p.stderr, p.stderr
        p = cons.dyad("consume", cons.path(name), check=False, env_extra={"DYAD_WAIT_TIMEOUT": 1})
        assert p.returncode == 3, p.stderr  # never produced
        assert not os.path.exists(cons.path(name))
    # A link inside the producer directory, outside .dyad: served as before.
    os.makedirs(prod.path("real"))
    with open(prod.path("real/ok.txt"), "w") as f:
        f.write("fine\n")
    os.symlink("real", prod.path("alias"))
    prod.dyad("produce", prod.path("alias/ok.txt"))
    cons.dyad("consume", cons.path("alias/ok.txt"), env_extra={"DYAD_WAIT_TIMEOUT": 10})
    with open(cons.path("alias/ok.txt")) as f:
        assert f.read() == "fine\n"


def test_consumer_directories_are_private(cluster):
    """Issue 45, finding 7: the directories a consumer made for a file were
    02775 under the umask (0755): a 0644 file that the producer's 0700
    directory kept from other users was installed where every user could
    read it. What DYAD makes for the consumer is now 0700, whatever the
    umask lets; the file keeps its mode; a directory that exists is kept as
    it is."""
    prod, cons = cluster[0], cluster[1]
    os.makedirs(prod.path("private/deep"))
    os.chmod(prod.path("private"), 0o700)
    with open(prod.path("private/deep/f.txt"), "w") as f:
        f.write("for the producer's eyes\n")
    os.chmod(prod.path("private/deep/f.txt"), 0o644)
    os.makedirs(cons.path("shared"))
    os.chmod(cons.path("shared"), 0o755)
    os.makedirs(prod.path("shared"), exist_ok=True)
    with open(prod.path("shared/h.txt"), "w") as f:
        f.write("in a directory the consumer made itself\n")
    prod.dyad("produce", prod.path("private/deep/f.txt"), prod.path("shared/h.txt"))
    old = os.umask(0o022)
    try:
        cons.dyad("consume", cons.path("private/deep/f.txt"), cons.path("shared/h.txt"))
    finally:
        os.umask(old)
    for d in ("private", "private/deep"):
        assert stat.S_IMODE(os.stat(cons.path(d)).st_mode) == 0o700, (d, oct(os.stat(cons.path(d)).st_mode))
    assert stat.S_IMODE(os.stat(cons.path("private/deep/f.txt")).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(cons.path("shared")).st_mode) == 0o755  # the consumer's own, as it was
    # Another user cannot reach the file through what DYAD made (all above
    # it lets them through).
    os.chmod(cluster.root, 0o711)
    os.chmod(cons.dir, 0o755)
    p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat",
                        cons.path("private/deep/f.txt")], capture_output=True, text=True)
    assert p.returncode != 0 and "Permission denied" in p.stderr, (p.returncode, p.stderr)
