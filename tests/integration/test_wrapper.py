# SPDX-License-Identifier: Apache-2.0
"""Unmodified programs under LD_PRELOAD=libdyad_wrapper.so, across two nodes,
consumer started first each time."""
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

import harness

sha = harness.sha256

WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
BIN = os.path.join(harness.BUILD, "bin")
PY = "/usr/bin/python3"


PRELOAD = harness.preload_env(WRAPPER)


def wenv(node, **extra):
    return node.env(**{**PRELOAD, "DYAD_WAIT_TIMEOUT": 60, **extra})




def run(cmd, env, **kw):
    p = subprocess.run(cmd, env=env, capture_output=True, timeout=120, **kw)
    assert p.returncode == 0, (cmd, p.returncode, p.stderr)
    return p


# Producers write `path` (on node0) from `src` (a local file outside DYAD).
def produce_cp(node, src, path):
    run(["cp", src, path], wenv(node))


def produce_dd(node, src, path):
    run(["dd", f"if={src}", f"of={path}", "bs=1M", "status=none"], wenv(node))


def produce_python(node, src, path):
    code = "import sys; data=open(sys.argv[1],'rb').read(); f=open(sys.argv[2],'wb'); f.write(data); f.close()"
    run([PY, "-c", code, src, path], wenv(node))


def produce_c_threads(node, src, path):
    # 8 threads pwrite disjoint parts of one file (content from pattern.h).
    run([os.path.join(BIN, "wrap_mt_writer"), "one", path, str(os.path.getsize(src))], wenv(node))


PRODUCERS = {"cp": produce_cp, "dd": produce_dd, "python": produce_python, "c8threads": produce_c_threads}

# Consumers read `path` on node1 and return the bytes they saw.
CONSUMERS = {
    "cat": lambda node, path: ["cat", path],
    "sha256sum": lambda node, path: ["sha256sum", path],
    "head": lambda node, path: ["head", "-c", "100000", path],
    "python": lambda node, path: [PY, "-c", "import sys; sys.stdout.buffer.write(open(sys.argv[1],'rb').read())", path],
    "dd": lambda node, path: ["dd", f"if={path}", "bs=1M", "status=none"],
}


@pytest.fixture(scope="module")
def mcluster():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_tool_pairs(mcluster, tmp_path, producer, consumer):
    prod, cons = mcluster[0], mcluster[1]
    size = (100 << 20) if (producer, consumer) == ("cp", "sha256sum") else (3 << 20) + 17
    src = str(tmp_path / "src.bin")
    harness.write_file(src, size, seed=hash((producer, consumer)) & 0xffff)
    name = f"pairs/{producer}-{consumer}.bin"
    os.makedirs(prod.path("pairs"), exist_ok=True)
    reader = subprocess.Popen(CONSUMERS[consumer](cons, cons.path(name)), env=wenv(cons),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cons.wait_waiters(1, procs=[reader])
    assert reader.poll() is None, "the consumer must be waiting for the file"
    PRODUCERS[producer](prod, src, prod.path(name))
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    data = open(prod.path(name), "rb").read()
    if producer != "c8threads":
        assert data == open(src, "rb").read()
    if consumer == "sha256sum":
        assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    elif consumer == "head":
        assert out == data[:100000]
    else:
        assert out == data
    assert sha(cons.path(name)) == sha(prod.path(name))


def test_eight_writer_threads_then_eight_reader_threads(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    size = (2 << 20) + 3
    d = "threads"
    os.makedirs(prod.path(d), exist_ok=True)
    reader = subprocess.Popen([os.path.join(BIN, "wrap_mt_reader"), cons.path(d), str(size)], env=wenv(cons),
                              stderr=subprocess.PIPE, text=True)
    cons.wait_waiters(8, procs=[reader])  # each of the 8 threads waits for its file
    run([os.path.join(BIN, "wrap_mt_writer"), "many", prod.path(d), str(size)], wenv(prod))
    _, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err


def test_one_file_written_by_eight_threads_is_published_once(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    before = prod.status()["counters"]
    p = prod.path("onefile.bin")
    run([os.path.join(BIN, "wrap_mt_writer"), "one", p, str(8 << 20)], wenv(prod))
    st = json.loads(cons.dyad("--json", "stat", cons.path("onefile.bin")).stdout)
    assert st["generation"] == 1 and st["size"] == 8 << 20
    run(["cat", cons.path("onefile.bin")], wenv(cons))
    assert sha(cons.path("onefile.bin")) == sha(p)


def test_dup_publishes_at_last_close(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    p = prod.path("dup.txt")
    proc = subprocess.Popen([os.path.join(BIN, "wrap_dup_close"), p], env=wenv(prod),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ONE-CLOSED"
    assert cons.dyad("stat", cons.path("dup.txt"), check=False).returncode == 2  # not yet
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "TWO-CLOSED"
    assert cons.dyad("stat", cons.path("dup.txt"), check=False).returncode == 2  # still one open
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
    st = json.loads(cons.dyad("--json", "stat", cons.path("dup.txt")).stdout)
    assert st["size"] == len("first\nsecond\n") and st["generation"] == 1


def test_rdwr_write_is_published_and_read_only_is_not(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    code = ("import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644); os.write(fd, b'rdwr'); os.close(fd)\n"
            "open(sys.argv[2], 'rb').read()\n")
    harness.write_file(prod.path("readonly.bin"), 100)
    # Only a producer directory for this process, so reading is not consuming.
    env = wenv(prod)
    del env["DYAD_PATH_CONSUMER"]
    run([PY, "-c", code, prod.path("rdwr.bin"), prod.path("readonly.bin")], env)
    assert json.loads(cons.dyad("--json", "stat", cons.path("rdwr.bin")).stdout)["size"] == 4
    assert cons.dyad("stat", cons.path("readonly.bin"), check=False).returncode == 2


def test_unmanaged_files_untouched_even_without_a_service(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    harness.write_file(str(a), 1 << 20)
    managed = tmp_path / "managed"
    managed.mkdir()
    env = dict(os.environ, **PRELOAD, DYAD_PATH_PRODUCER=str(managed), DYAD_PATH_CONSUMER=str(managed),
               DYAD_SERVICE_URI="tcp://127.0.0.1:1")
    p = subprocess.run(["cp", str(a), str(b)], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == ""
    assert sha(str(a)) == sha(str(b))
    p = subprocess.run(["sha256sum", str(b)], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == ""


def test_failed_consume_fails_open_with_errno_and_message(mcluster):
    cons = mcluster[1]
    t0 = time.monotonic()
    p = subprocess.run(["cat", cons.path("never.bin")], env=wenv(cons, DYAD_WAIT_TIMEOUT=1),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "Connection timed out" in p.stderr and "never.bin" in p.stderr and "DYAD_WAIT_TIMEOUT" in p.stderr
    assert time.monotonic() - t0 < 5
    code = ("import errno, sys\n"
            "try:\n open(sys.argv[1]).read()\nexcept OSError as e:\n print(errno.errorcode[e.errno])\n")
    p = subprocess.run([PY, "-c", code, cons.path("never2.bin")], env=wenv(cons, DYAD_WAIT_TIMEOUT=0.5),
                       capture_output=True, text=True, timeout=30)
    assert p.stdout.strip() == "ETIMEDOUT"


def test_sync_check_sets_sync_health(mcluster):
    prod = mcluster[0]
    code = ("import ctypes, sys\n"
            "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
            "f = open(sys.argv[1], 'w'); f.write('x'); f.close()\n"
            "print((libc.getenv(b'DYAD_SYNC_HEALTH') or b'').decode())\n")
    p = run([PY, "-c", code, prod.path("health.txt")], wenv(prod, DYAD_SYNC_CHECK=1))
    assert p.stdout.decode().strip() == "ok"


def test_directories_and_probes_pass_through(mcluster):
    cons = mcluster[1]
    os.makedirs(cons.path("adir/sub"), exist_ok=True)
    p = subprocess.run(["ls", cons.path("adir")], env=wenv(cons, DYAD_WAIT_TIMEOUT=1), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and "sub" in p.stdout


def test_forked_child_closing_an_inherited_fd_does_not_publish(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    code = ("import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
            "os.write(fd, b'half')\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    os.close(fd)\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print('CHILD-DONE', flush=True); sys.stdin.readline()\n"
            "os.write(fd, b' and whole'); os.close(fd)\n")
    p = subprocess.Popen([PY, "-c", code, prod.path("forked.txt")], env=wenv(prod), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "CHILD-DONE"
    assert cons.dyad("stat", cons.path("forked.txt"), check=False).returncode == 2  # not published by the child
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.wait(timeout=30) == 0
    run(["cat", cons.path("forked.txt")], wenv(cons))
    assert open(cons.path("forked.txt")).read() == "half and whole"


def test_dyad_internal_files_are_not_consumed(mcluster):
    prod, cons = mcluster[0], mcluster[1]
    harness.write_file(prod.path("int.bin"), 10)
    prod.dyad("produce", prod.path("int.bin"))
    cons.dyad("consume", cons.path("int.bin"))
    locks = os.listdir(cons.path(".dyad/locks"))
    assert locks
    t0 = time.monotonic()
    p = subprocess.run(["cat", cons.path(".dyad/locks/" + locks[0])], env=wenv(cons, DYAD_WAIT_TIMEOUT=5),
                       capture_output=True, timeout=30)
    assert p.returncode == 0 and time.monotonic() - t0 < 2


def penv(node, **extra):
    """A producer's environment alone (no consumer directory), as a job's
    producer step has it."""
    return node.env(consumer=False, **{**PRELOAD, **extra})


def listed(node, prefix):
    """{path: generation} of the records under prefix."""
    out = node.dyad("--json", "ls", prefix).stdout
    return {json.loads(l)["path"]: json.loads(l)["generation"] for l in out.splitlines() if l.strip()}


def consume_bytes(node, rel, timeout=15):
    p = subprocess.run(["cat", node.path(rel)], env=wenv(node, DYAD_WAIT_TIMEOUT=timeout),
                       capture_output=True, timeout=timeout + 60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_rsync_publishes_the_real_name_not_its_temporary(mcluster, tmp_path):
    """rsync writes '.NAME.XXXXXX' and renames it into place: the real name
    is published, the temporary never is."""
    prod, cons = mcluster[0], mcluster[1]
    src = tmp_path / "r.bin"
    harness.write_file(str(src), (1 << 20) + 5, seed=31)
    os.makedirs(prod.path("tools"), exist_ok=True)
    run(["rsync", str(src), prod.path("tools/r.bin")], penv(prod))
    assert consume_bytes(cons, "tools/r.bin") == src.read_bytes()
    names = listed(prod, "tools/")
    assert "tools/r.bin" in names, names
    assert not [n for n in names if n.startswith("tools/.r.bin.")], names


def test_mv_into_the_producer_directory_publishes(mcluster):
    """A rename (mv within one file system) into the producer directory
    publishes the new name."""
    prod, cons = mcluster[0], mcluster[1]
    outside = os.path.normpath(os.path.join(os.path.dirname(prod.dir), "outside-mv.bin"))
    harness.write_file(outside, 4096 + 3, seed=32)
    want = open(outside, "rb").read()
    os.makedirs(prod.path("tools"), exist_ok=True)
    assert os.stat(outside).st_dev == os.stat(prod.dir).st_dev  # a rename, not a copy
    run(["mv", outside, prod.path("tools/moved.bin")], penv(prod))
    assert consume_bytes(cons, "tools/moved.bin") == want
    # and a rename inside the directory publishes the new name too
    run(["mv", prod.path("tools/moved.bin"), prod.path("tools/moved-again.bin")], penv(prod))
    assert consume_bytes(cons, "tools/moved-again.bin") == want


def test_sed_in_place_publishes_the_new_contents(mcluster):
    """sed -i writes 'sedXXXXXX' and renames it onto the file: the file is
    published again (a new generation), its temporary never."""
    prod = mcluster[0]
    os.makedirs(prod.path("tools"), exist_ok=True)
    run(["sh", "-c", f"printf 'alpha\\n' > {prod.path('tools/s.txt')}"], penv(prod))
    before = listed(prod, "tools/s.txt")["tools/s.txt"]
    run(["sed", "-i", "s/alpha/omega/", prod.path("tools/s.txt")], penv(prod))
    after = listed(prod, "tools/")
    assert after["tools/s.txt"] != before, after
    assert not [n for n in after if os.path.basename(n).startswith("sed")], after
    rec = json.loads(prod.dyad("--json", "stat", prod.path("tools/s.txt")).stdout)
    assert rec["size"] == len("omega\n")


def test_an_inert_wrapper_says_so_once(tmp_path):
    """Loaded with no managed directory, the wrapper warns once per process
    tree that it does nothing (it used to be silent)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
    env.update(PRELOAD)
    p = subprocess.run(["sh", "-c", f"cp /etc/hostname {tmp_path}/a; cp {tmp_path}/a {tmp_path}/b"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0
    assert p.stderr.count("neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set") == 1, p.stderr
