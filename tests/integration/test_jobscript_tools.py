# SPDX-License-Identifier: Apache-2.0
"""A job script's everyday tools under LD_PRELOAD=libdyad_wrapper.so with the
Slurm plugin's defaults: the producer directory is the consumer directory
and there is no wait limit (issue 46, items 1 and 2). Every tool runs with a
deadline, so that a wait nobody asked for fails the test instead of hanging
it; what it wrote is then consumed on the other node."""
import os
import subprocess

import pytest

import harness

WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
PY = "/usr/bin/python3"
DEADLINE = 60  # seconds a tool may take here: far more than any needs


@pytest.fixture(scope="module")
def job():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


def jenv(node, **extra):
    """A job step's environment: DYAD_PATH_PRODUCER == DYAD_PATH_CONSUMER,
    DYAD_WAIT_TIMEOUT unset, the wrapper preloaded."""
    return node.env(**{**harness.preload_env(WRAPPER), **extra})


def run(cmd, env, **kw):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=DEADLINE, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cmd} did not end within {DEADLINE} s: it waits for something nobody produces")
    assert p.returncode == 0, (cmd, p.returncode, p.stderr)
    return p


def consumed(node, rel):
    """The bytes of `rel` read on `node` under the wrapper (waiting for its
    produce, with a deadline)."""
    return run(["cat", node.path(rel)], jenv(node, DYAD_WAIT_TIMEOUT=30)).stdout


def tree(tmp_path, name):
    src = tmp_path / name
    (src / "sub").mkdir(parents=True)
    harness.write_file(str(src / "a.bin"), 70001, seed=1)
    harness.write_file(str(src / "sub" / "b.bin"), 1234, seed=2)
    return src


def test_rsync_into_the_job_directory(job, tmp_path):
    """rsync opens its destination read-only as a delta basis (absent the
    first time) and its temporary again: neither waits."""
    prod, cons = job[0], job[1]
    src = tree(tmp_path, "rs")
    run(["rsync", "-a", f"{src}/", prod.path("rs/")], jenv(prod))
    assert consumed(cons, "rs/sub/b.bin") == (src / "sub" / "b.bin").read_bytes()
    # Again, one file changed: the basis is there now, the new contents are
    # published (a new generation) and consumed.
    harness.write_file(str(src / "a.bin"), 70002, seed=3)
    run(["rsync", "-a", f"{src}/", prod.path("rs/")], jenv(prod))
    assert consumed(cons, "rs/a.bin") == (src / "a.bin").read_bytes()


def test_sed_in_place_of_a_file_never_published(job):
    """A file written here without the wrapper is read as it is: sed -i
    does not wait for a produce of it."""
    prod, cons = job[0], job[1]
    os.makedirs(prod.path("sed"), exist_ok=True)
    with open(prod.path("sed/plain.txt"), "w") as f:
        f.write("alpha\n")
    run(["sed", "-i", "s/alpha/omega/", prod.path("sed/plain.txt")], jenv(prod))
    assert consumed(cons, "sed/plain.txt") == b"omega\n"


def test_h5py_creates_a_file(job):
    """h5py.File(path, 'w') first opens the path O_RDWR (HDF5's probe for an
    open file): a write mode never waits."""
    prod, cons = job[0], job[1]
    code = ("import sys, h5py\n"
            "with h5py.File(sys.argv[1], 'w') as f:\n    f['x'] = list(range(100))\n")
    os.makedirs(prod.path("h5"), exist_ok=True)
    run([PY, "-c", code, prod.path("h5/out.h5")], jenv(prod))
    read = "import sys, h5py\nprint(sum(h5py.File(sys.argv[1], 'r')['x'][:]))\n"
    p = run([PY, "-c", read, cons.path("h5/out.h5")], jenv(cons, DYAD_WAIT_TIMEOUT=30))
    assert p.stdout.strip() == b"4950"


def test_tar_extract_cp_r_and_mv(job, tmp_path):
    prod, cons = job[0], job[1]
    src = tree(tmp_path, "t")
    archive = str(tmp_path / "t.tar")
    subprocess.run(["tar", "cf", archive, "-C", str(src), "."], check=True)
    os.makedirs(prod.path("tar"), exist_ok=True)
    run(["tar", "xf", archive, "-C", prod.path("tar")], jenv(prod))
    assert consumed(cons, "tar/sub/b.bin") == (src / "sub" / "b.bin").read_bytes()
    run(["cp", "-r", str(src), prod.path("cpr")], jenv(prod))
    assert consumed(cons, "cpr/a.bin") == (src / "a.bin").read_bytes()
    # cp -r inside the job directory reads what is there
    run(["cp", "-r", prod.path("cpr"), prod.path("cpr2")], jenv(prod))
    assert consumed(cons, "cpr2/sub/b.bin") == (src / "sub" / "b.bin").read_bytes()
    run(["mv", prod.path("cpr2/a.bin"), prod.path("moved.bin")], jenv(prod))
    assert consumed(cons, "moved.bin") == (src / "a.bin").read_bytes()


def test_shell_redirections(job):
    """`>` and `>>` of builtins and of programs the shell runs: each file is
    published once its writing ends (item 2: a program writing through a
    descriptor it inherited used to publish nothing)."""
    prod, cons = job[0], job[1]
    d = prod.path("redir")
    os.makedirs(d, exist_ok=True)
    script = (f"echo hi > {d}/builtin.txt; echo more >> {d}/builtin.txt; "
              f"printf 'one\\n' > {d}/prog.txt; /bin/echo two >> {d}/prog.txt; "
              f"{{ /bin/echo a; echo b; /bin/echo c; }} > {d}/group.txt; "
              f"cat {d}/prog.txt > {d}/copy.txt")
    run(["bash", "-c", script], jenv(prod))
    assert consumed(cons, "redir/builtin.txt") == b"hi\nmore\n"
    assert consumed(cons, "redir/prog.txt") == b"one\ntwo\n"
    assert consumed(cons, "redir/group.txt") == b"a\nb\nc\n"
    assert consumed(cons, "redir/copy.txt") == b"one\ntwo\n"


def test_bash_echo_redirected_is_consumed_on_another_node(job):
    """The issue's own case, a program exec'd with its output redirected,
    the consumer waiting first on the other node."""
    prod, cons = job[0], job[1]
    reader = subprocess.Popen(["cat", cons.path("echo-f")], env=jenv(cons), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        cons.wait_waiters(1, procs=[reader])
        run(["bash", "-c", f"exec /bin/echo hi > {prod.path('echo-f')}"], jenv(prod))
        out, err = reader.communicate(timeout=DEADLINE)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    assert out == b"hi\n"


def test_exec_redirection_is_published_by_the_last_writer(job, tmp_path):
    """`exec > f` in a script: the programs it runs write f through the
    descriptor they inherit; none of them publishes it while the shell still
    writes it, the shell does at its exit."""
    prod, cons = job[0], job[1]
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo)
    f = prod.path("exec.txt")
    script = f"exec > {f}; echo a; /bin/echo b; read x < {fifo}; echo c"
    shell = subprocess.Popen(["bash", "-c", script], env=jenv(prod), stderr=subprocess.PIPE)
    try:
        harness.wait_for(lambda: os.path.exists(f) and open(f).read() == "a\nb\n", 30,
                         what="the shell and /bin/echo to write their lines")
        # /bin/echo has exited: it was not the last writer.
        st = prod.dyad("stat", f, check=False)
        assert st.returncode == 2, (st.stdout, st.stderr)
        with open(fifo, "w") as w:
            w.write("go\n")
        assert shell.wait(timeout=DEADLINE) == 0, shell.stderr.read()
    finally:
        shell.kill()
    assert consumed(cons, "exec.txt") == b"a\nb\nc\n"


def test_a_reader_still_waits_for_an_absent_file(job):
    """What still waits: a read-only open of an absent path by name, until
    it is produced (here with a deadline, to show it waited)."""
    cons = job[1]
    p = subprocess.run(["cat", cons.path("nobody/makes/this")], env=jenv(cons, DYAD_WAIT_TIMEOUT=1),
                       capture_output=True, text=True, timeout=DEADLINE)
    assert p.returncode != 0 and "was not produced within" in p.stderr, p.stderr
