# SPDX-License-Identifier: Apache-2.0
"""dyad_open: every open() mode, across two nodes."""
import json
import os
import subprocess

import pytest

from pydyad import DyadRC
from pydyad.context import mode_actions
from pydyad_testlib import finish, harness, last_json, pyenv, run_py, spawn_py

TEXT = "héllo\nwörld\n" * 50
HEAD = "head line\n"
MORE = "appended by the consumer\n"

READ_MODES = ["r", "rt", "rb", "r+", "rt+", "r+t", "rb+", "r+b"]
WRITE_MODES = ["w", "wt", "wb", "w+", "w+t", "wb+", "w+b", "a", "at", "ab", "a+", "a+t", "ab+", "a+b",
               "x", "xt", "xb", "x+", "x+t", "xb+", "x+b"]


def stat(node, rel):
    return json.loads(node.dyad("--json", "stat", node.path(rel)).stdout)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_mode_table():
    for m in READ_MODES:
        assert mode_actions(m) == (True, "+" in m), m
    for m in WRITE_MODES:
        assert mode_actions(m) == (False, True), m
    for bad in ["", "rw", "rr", "bt", "rbt", "wx", "q", "r++", "U"]:
        with pytest.raises(ValueError):
            mode_actions(bad)


@pytest.mark.parametrize("mode", READ_MODES)
def test_read_mode_consumes_before_opening(cluster, mode):
    prod, cons = cluster[0], cluster[1]
    rel = f"read/{mode}.txt"
    os.makedirs(os.path.dirname(prod.path(rel)), exist_ok=True)
    with open(prod.path(rel), "w", encoding="utf-8") as f:
        f.write(TEXT)
    prod.dyad("produce", prod.path(rel))
    out = last_json(run_py(cons, f"""
        mode = {mode!r}
        kw = {{}} if "b" in mode else {{"encoding": "utf-8"}}
        with dyad_open({cons.path(rel)!r}, mode, **kw) as f:
            data = f.read()
            if "+" in mode:
                f.write({MORE!r}.encode() if "b" in mode else {MORE!r})
        print(json.dumps(data.decode() if isinstance(data, bytes) else data))
    """).stdout)
    assert out == TEXT
    assert prod.status()["counters"]["served"] == 1
    if "+" in mode:
        # r+ also writes: the consumer's node published its new version on close.
        assert read_bytes(cons.path(rel)) == (TEXT + MORE).encode()
        s = stat(prod, rel)
        assert s["owner"] == "node1" and s["generation"] == 2 and s["size"] == len((TEXT + MORE).encode())
    else:
        assert read_bytes(cons.path(rel)) == TEXT.encode()
        assert stat(prod, rel)["generation"] == 1


@pytest.mark.parametrize("mode", WRITE_MODES)
def test_write_mode_produces_after_close(cluster, mode):
    prod, cons = cluster[0], cluster[1]
    rel = f"write-{mode}.txt"
    if mode.startswith("a"):
        with open(prod.path(rel), "w", encoding="utf-8") as f:
            f.write(HEAD)   # written before, never produced
    out = last_json(run_py(prod, f"""
        mode = {mode!r}
        kw = {{}} if "b" in mode else {{"encoding": "utf-8"}}
        with dyad_open({prod.path(rel)!r}, mode, **kw) as f:
            f.write({TEXT!r}.encode() if "b" in mode else {TEXT!r})
            back = None
            if "+" in mode:
                f.seek(0)
                back = f.read()
                back = back.decode() if isinstance(back, bytes) else back
        print(json.dumps(back))
    """).stdout)
    expected = (HEAD + TEXT if mode.startswith("a") else TEXT).encode()
    if "+" in mode:
        assert out.encode() == expected
    # Published after close: the record has the whole file's size.
    s = stat(cons, rel)
    assert s["owner"] == "node0" and s["generation"] == 1 and s["size"] == len(expected)
    cons.dyad("consume", cons.path(rel))
    assert read_bytes(cons.path(rel)) == expected


def test_consumer_first_then_producer_across_nodes(cluster):
    prod, cons = cluster[0], cluster[1]
    names = ["one.bin", "deep/er/two.bin", "three.bin"]
    blobs = {n: os.urandom(50_000 + 1000 * i) for i, n in enumerate(names)}
    consumer = spawn_py(cons, f"""
        import hashlib
        res = {{}}
        for n in {names!r}:
            with dyad_open(os.path.join(os.environ["DYAD_PATH_CONSUMER"], n), "rb") as f:
                res[n] = hashlib.sha256(f.read()).hexdigest()
        print(json.dumps(res))
    """, DYAD_WAIT_TIMEOUT=60)
    cons.wait_waiters(1, procs=[consumer])
    assert consumer.poll() is None, "the consumer must be waiting for the files"
    assert not [n for n in os.listdir(prod.dir) if n != ".dyad"]  # (.dyad/: the store's epoch)
    for n in names:
        os.makedirs(os.path.dirname(prod.path(n)), exist_ok=True)
        with open(prod.path(n) + ".src", "wb") as f:
            f.write(blobs[n])
    run_py(prod, f"""
        for n in {names!r}:
            p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], n)
            with open(p + ".src", "rb") as src, dyad_open(p, "wb") as f:
                f.write(src.read())
    """)
    import hashlib
    got = last_json(finish(consumer, timeout=60)[0])
    assert got == {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
    assert prod.status()["counters"]["served"] == 3


def test_exception_in_block_does_not_produce(cluster):
    prod, cons = cluster[0], cluster[1]
    out = last_json(run_py(prod, f"""
        try:
            with dyad_open({prod.path('broken.txt')!r}, "w") as f:
                f.write("half")
                raise RuntimeError("writer failed")
        except RuntimeError as e:
            print(json.dumps([str(e), f.closed]))
    """).stdout)
    assert out == ["writer failed", True]
    p = cons.dyad("stat", cons.path("broken.txt"), check=False)
    assert p.returncode == 2 and "not been produced" in p.stderr


def test_unmanaged_paths_are_plain_opens(cluster, tmp_path):
    """Files outside the managed directories never reach the service: here it
    is unreachable, and every open still works."""
    n = cluster[0]
    dead = f"tcp://127.0.0.1:{harness.free_port()}"
    outside = str(tmp_path / "plain.txt")
    out = last_json(run_py(n, f"""
        with dyad_open({outside!r}, "w") as f:
            f.write("plain")
        with dyad_open(file={outside!r}, mode="r") as f:
            a = f.read()
        with dyad_open({outside!r}, "a+") as f:
            f.write("!")
        fd = os.open({outside!r}, os.O_RDONLY)
        with dyad_open(fd, "r") as f:       # a file descriptor: no path, no DYAD
            b = f.read()
        print(json.dumps([a, b]))
    """, DYAD_SERVICE_URI=dead).stdout)
    assert out == ["plain", "plain!"]


def test_only_producer_dir_reads_without_consuming(cluster):
    """A producer-only process reads its own files: no consume (which would
    fail without a consumer directory)."""
    n = cluster[0]
    with open(n.path("own.txt"), "w") as f:
        f.write("mine")
    out = last_json(run_py(n, f"""
        with dyad_open({n.path('own.txt')!r}) as f:
            print(json.dumps(f.read()))
    """, consumer=False).stdout)
    assert out == "mine"
    # ...whereas the C call itself refuses.
    p = run_py(n, f"d = Dyad(); d.init_env(); d.consume({n.path('own.txt')!r})", consumer=False, check=False)
    assert p.returncode != 0 and "DYAD_RC_BADMANAGEDPATH" in p.stderr


def test_explicit_dyad_ctx_and_register(cluster):
    """Without DYAD_PATH_* in the environment, only the Dyad passed as
    dyad_ctx knows the directories."""
    prod, cons = cluster[0], cluster[1]
    run_py(prod, f"""
        d = Dyad(); d.init(prod_managed_path={prod.dir!r})
        with dyad_open({prod.path('ctx.txt')!r}, "w", dyad_ctx=d, register_dyad_ctx=True) as f:
            f.write("via ctx")
        assert pydyad.get_default_dyad() is d
    """, producer=False, consumer=False)
    out = last_json(run_py(cons, f"""
        d = Dyad(); d.init(cons_managed_path={cons.dir!r})
        with dyad_open({cons.path('ctx.txt')!r}, dyad_ctx=d) as f:
            print(json.dumps(f.read()))
    """, producer=False, consumer=False, DYAD_WAIT_TIMEOUT=30).stdout)
    assert out == "via ctx"


def test_dyad_open_with_metadata_wrapper(cluster):
    prod, cons = cluster[0], cluster[1]
    with open(prod.path("mw.txt"), "w") as f:
        f.write("with metadata")
    prod.dyad("produce", prod.path("mw.txt"))
    out = last_json(run_py(cons, f"""
        d = pydyad.get_default_dyad()
        m = d.get_metadata({cons.path('mw.txt')!r}, should_wait=True)
        with dyad_open({cons.path('mw.txt')!r}, "r", metadata_wrapper=m) as f:
            print(json.dumps(f.read()))
    """, DYAD_WAIT_TIMEOUT=30).stdout)
    assert out == "with metadata"


def test_errors_surface_from_dyad_open(cluster):
    n = cluster[1]
    out = last_json(run_py(n, f"""
        r = []
        try:
            with dyad_open({n.path('never.txt')!r}, "r") as f:
                pass
        except DyadError as e:
            r.append([e.rc, e.rc_name])
        try:
            with dyad_open({n.path('never.txt')!r}, "rw") as f:
                pass
        except ValueError as e:
            r.append(str(e))
        try:
            with dyad_open({n.path('x.txt')!r}, "w", dyad_ctx=Dyad()) as f:
                pass
        except DyadError as e:
            r.append([e.rc, e.rc_name])
        print(json.dumps(r))
    """, DYAD_WAIT_TIMEOUT=1).stdout)
    assert out[0] == [DyadRC.DYAD_RC_TIMEOUT, "DYAD_RC_TIMEOUT"]
    assert "invalid mode" in out[1]
    assert out[2] == [DyadRC.DYAD_RC_NOCTX, "DYAD_RC_NOCTX"]
    assert not os.path.exists(n.path("x.txt")), "nothing is opened when DYAD fails first"


# -- dyad_open as a plain function ------------------------------------------------

def test_plain_function_returns_a_file_produced_at_close(cluster):
    """Without `with`: dyad_open returns an open file object (of io's
    classes); the file is published by close(), not before."""
    prod, cons = cluster[0], cluster[1]
    p = spawn_py(prod, f"""
        import io
        f = dyad_open({prod.path('plain.txt')!r}, "w", encoding="utf-8")
        f.write("plain ")
        b = dyad_open({prod.path('plain.bin')!r}, "wb", buffering=0)
        b.write(b"raw")
        print(json.dumps([isinstance(f, io.TextIOWrapper), f.mode, f.name, isinstance(b, io.FileIO)]), flush=True)
        sys.stdin.readline()             # the test looks: nothing is produced yet
        f.write("text")
        f.close()
        b.close()
        f.close()                        # closing twice is harmless (produced once)
        print(json.dumps("closed"), flush=True)
    """, stdin=subprocess.PIPE)
    first = json.loads(p.stdout.readline())
    assert first == [True, "w", prod.path("plain.txt"), True]
    assert cons.dyad("stat", cons.path("plain.txt"), check=False).returncode == 2, "produced before close"
    out, _ = p.communicate("go\n", timeout=60)
    assert p.returncode == 0 and json.loads(out.splitlines()[-1]) == "closed"
    assert stat(cons, "plain.txt")["size"] == len("plain text")
    got = last_json(run_py(cons, f"""
        f = dyad_open({cons.path('plain.txt')!r})
        g = dyad_open({cons.path('plain.bin')!r}, "rb")
        print(json.dumps([f.read(), g.read().decode()]))
        f.close(); g.close()
    """, DYAD_WAIT_TIMEOUT=30).stdout)
    assert got == ["plain text", "raw"]


def test_a_file_never_closed_is_not_produced(cluster):
    """A writer that drops its file without closing it (e.g. it failed half
    way) does not publish what may be incomplete, as when a `with` block
    raises; the data itself is flushed as by open()."""
    prod, cons = cluster[0], cluster[1]
    run_py(prod, f"""
        import gc, warnings
        warnings.simplefilter("ignore", ResourceWarning)
        f = dyad_open({prod.path('dropped.txt')!r}, "w")
        f.write("half")
        del f
        gc.collect()
        g = dyad_open({prod.path('kept.txt')!r}, "a")
        g.write("kept")
        g.detach().close()               # the buffer detach() hands over publishes in its place
    """)
    with open(prod.path("dropped.txt")) as f:
        assert f.read() == "half"
    assert cons.dyad("stat", cons.path("dropped.txt"), check=False).returncode == 2
    assert stat(cons, "kept.txt")["size"] == 4
