# SPDX-License-Identifier: Apache-2.0
"""pydyad.torch.DyadDataset with DataLoader workers, across two nodes."""
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from pydyad_testlib import finish, last_json, pyenv, run_py, spawn_py  # noqa: E402

N = 64

# Code shared by the consumer processes.
DEFS = """
import numpy as np
import torch
from torch.utils.data import DataLoader
import pydyad.bindings as B
from pydyad.torch import DyadDataset

def tcp_sockets():
    # inodes of the TCP sockets this process holds
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            mine.add(int(t[8:-1]))
    tcp = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                tcp.add(int(line.split()[9]))
    return mine & tcp

PARENT_SOCKETS = set()

def tag(x):
    # runs where the sample was read: which process, with which DYAD context
    return {"x": torch.from_numpy(x), "pid": os.getpid(),
            "own_ctx": B._ctx_pid == os.getpid(),
            "shared": len(tcp_sockets() & PARENT_SOCKETS)}

def expected(i):
    return np.arange(i * 100, i * 100 + 100, dtype=np.int64) * 3 + 1

def run_epoch(ds, batch_size=4):
    t0 = time.monotonic()
    pids, bad, count, own, shared = set(), [], 0, True, 0
    loader = DataLoader(ds, batch_size=batch_size, num_workers=2, shuffle=False)
    for b, batch in enumerate(loader):
        for k in range(batch["x"].shape[0]):
            i = b * batch_size + k
            if not np.array_equal(batch["x"][k].numpy(), expected(i)):
                bad.append(i)
            count += 1
        pids.update(int(p) for p in batch["pid"])
        own = own and bool(batch["own_ctx"].all())
        shared += int(batch["shared"].sum())
    return {"count": count, "bad": bad, "pids": sorted(pids), "own_ctx": own, "shared": shared,
            "seconds": time.monotonic() - t0}
"""


def lines_of(proc):
    """A queue fed with the process's stdout lines (None at EOF)."""
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def next_json(q, proc, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"no output from the consumer in {timeout}s; stderr:\n{proc.stderr.read()}")
        if line is None:
            proc.wait()
            raise AssertionError(f"consumer exited ({proc.returncode}); stderr:\n{proc.stderr.read()}")
        if line.startswith("{"):
            return json.loads(line)


def counters(node):
    c = node.status()["counters"]
    return {k: c[k] for k in ("served", "bytes_sent", "requests")}


def test_dataloader_two_workers_two_epochs(cluster):
    prod, cons = cluster[0], cluster[1]
    consumer = spawn_py(cons, defs=DEFS, stdin=subprocess.PIPE, code=f"""
        names = [f"samples/s{{i:03d}}.npy" for i in range({N})]
        ds = DyadDataset(names, transform=tag)
        assert ds._dyad is None, "no DYAD context may be created in __init__"
        print(json.dumps({{"event": "ready", "pid": os.getpid()}}), flush=True)
        r1 = run_epoch(ds)
        print(json.dumps(dict(r1, epoch=1)), flush=True)
        sys.stdin.readline()
        r2 = run_epoch(ds)
        print(json.dumps(dict(r2, epoch=2, parent_ctx=B._ctx_pid, parent_lib=B.library_path())), flush=True)
    """, DYAD_WAIT_TIMEOUT=120)
    q = lines_of(consumer)
    ready = next_json(q, consumer, timeout=120)
    assert ready["event"] == "ready"
    cons.wait_waiters(2, procs=[consumer])  # each of the 2 workers waits for its first sample
    assert consumer.poll() is None
    assert not os.path.exists(prod.path("samples")), "the consumer starts before any sample exists"
    # The producer writes while the workers wait.
    producer = spawn_py(prod, f"""
        import numpy as np
        os.makedirs(os.path.join(os.environ["DYAD_PATH_PRODUCER"], "samples"), exist_ok=True)
        for i in range({N}):
            p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], f"samples/s{{i:03d}}.npy")
            with dyad_open(p, "wb") as f:
                np.save(f, np.arange(i * 100, i * 100 + 100, dtype=np.int64) * 3 + 1)
            time.sleep(0.01)  # not an ordering sleep: samples come one by one, as from a simulation
    """)
    e1 = next_json(q, consumer, timeout=300)
    finish(producer, timeout=60)
    assert e1["epoch"] == 1
    assert e1["count"] == N and e1["bad"] == []
    assert len(e1["pids"]) == 2 and ready["pid"] not in e1["pids"], "samples are read by 2 workers"
    assert e1["own_ctx"] is True
    after1 = counters(prod)
    assert after1["served"] == N, "epoch 1 fetches every sample exactly once"
    assert after1["bytes_sent"] == sum(os.path.getsize(prod.path(f"samples/s{i:03d}.npy")) for i in range(N))

    consumer.stdin.write("go\n")
    consumer.stdin.flush()
    e2 = next_json(q, consumer, timeout=300)
    finish(consumer, timeout=60)
    assert e2["epoch"] == 2
    assert e2["count"] == N and e2["bad"] == []
    assert len(e2["pids"]) == 2 and not set(e2["pids"]) & set(e1["pids"]), "new workers in epoch 2"
    assert e2["parent_ctx"] is None and e2["parent_lib"] is None, "the main process never used DYAD"
    assert counters(prod) == after1, "epoch 2 reads local files: no transfer"
    print(f"epoch 1: {e1['seconds']:.2f}s, epoch 2: {e2['seconds']:.2f}s")


def test_workers_do_not_share_the_parent_context(cluster):
    """The main process reads a sample first (its DYAD context keeps pooled
    connections), then forks workers: each drops the inherited context and
    opens its own connections."""
    prod, cons = cluster[0], cluster[1]
    os.makedirs(prod.path("pre"))
    for i in range(8):
        np.save(prod.path(f"pre/{i}.npy"), np.arange(i * 100, i * 100 + 100, dtype=np.int64) * 3 + 1)
    np.save(prod.path("pre/late.npy"), np.arange(5))
    prod.dyad("produce", prod.path("pre/late.npy"), *[prod.path(f"pre/{i}.npy") for i in range(8)])
    out = last_json(run_py(cons, defs=DEFS, code=f"""
        ds = DyadDataset([f"pre/{{i}}.npy" for i in range(8)], transform=tag, use_metadata=True)
        first = ds[0]
        assert first["own_ctx"] and first["pid"] == os.getpid()
        PARENT_SOCKETS.update(tcp_sockets())
        r = run_epoch(ds)
        # the parent's context still fetches after the workers are gone
        late = DyadDataset(["pre/late.npy"])
        print(json.dumps(dict(r, parent_sockets=len(PARENT_SOCKETS), late=late[0].tolist())))
    """).stdout)
    assert out["count"] == 8 and out["bad"] == []
    assert out["parent_sockets"] > 0, "the parent holds pooled connections (else this test proves nothing)"
    assert out["own_ctx"] is True
    assert out["shared"] == 0, "a worker used a socket inherited from the parent"
    assert out["late"] == [0, 1, 2, 3, 4]


def test_dataset_arguments(tmp_path, monkeypatch):
    from pydyad.torch import DyadDataset
    monkeypatch.delenv("DYAD_PATH_CONSUMER", raising=False)
    with pytest.raises(ValueError, match="DYAD_PATH_CONSUMER"):
        DyadDataset(["a.npy"])
    with pytest.raises(ValueError, match="must be relative"):
        DyadDataset(["/abs/a.npy"], root=str(tmp_path))
    ds = DyadDataset(["a.npy", "b/c.npy"], root=str(tmp_path), loader=lambda p: p)
    assert len(ds) == 2 and ds.path(1) == str(tmp_path / "b" / "c.npy")
    assert ds._dyad is None
    import pickle
    ds2 = pickle.loads(pickle.dumps(DyadDataset(["a.npy"], root=str(tmp_path))))
    assert ds2._dyad is None and ds2.samples == ["a.npy"]


SPAWN_SCRIPT = '''
import json, os, sys
import numpy as np
from torch.utils.data import DataLoader
import pydyad.bindings as B
from pydyad.torch import DyadDataset

def tag(x):
    return {"x": x, "pid": os.getpid(), "own_ctx": B._ctx_pid == os.getpid()}

if __name__ == "__main__":
    ds = DyadDataset([f"sp/{i}.npy" for i in range(6)], transform=tag)
    ds[0]   # the parent's context is not pickled into the workers
    xs, pids, own = [], set(), True
    for b in DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn"):
        xs += b["x"].tolist()
        pids.update(int(p) for p in b["pid"])
        own = own and bool(b["own_ctx"].all())
    print(json.dumps({"xs": xs, "pids": sorted(pids), "me": os.getpid(), "own_ctx": own}))
'''


def test_spawned_workers(cluster, tmp_path):
    prod, cons = cluster[0], cluster[1]
    os.makedirs(prod.path("sp"))
    for i in range(6):
        np.save(prod.path(f"sp/{i}.npy"), np.arange(i, i + 3))
    prod.dyad("produce", *[prod.path(f"sp/{i}.npy") for i in range(6)])
    script = tmp_path / "spawn_loader.py"
    script.write_text(SPAWN_SCRIPT)
    p = subprocess.run([sys.executable, str(script)], env=pyenv(cons), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = last_json(p.stdout)
    assert out["xs"] == [list(range(i, i + 3)) for i in range(6)]
    assert len(out["pids"]) == 2 and out["me"] not in out["pids"]
    assert out["own_ctx"] is True
    assert prod.status()["counters"]["served"] == 6


def test_worker_error_reaches_the_parent_whole(cluster):
    """A DyadError in a DataLoader worker is re-raised by torch from one
    string (type(e)(text)): the parent gets a DyadError that names the
    file and DYAD's explanation, not a ValueError from int(text)."""
    cons = cluster[1]
    p = run_py(cons, defs=DEFS, check=False, code="""
        ds = DyadDataset(["samples/never-produced.npy"])
        try:
            for _ in DataLoader(ds, batch_size=1, num_workers=2):
                pass
            print(json.dumps({"raised": None}))
        except Exception as e:
            import pickle
            again = pickle.loads(pickle.dumps(e))
            print(json.dumps({"raised": type(e).__name__, "text": str(e), "rc": getattr(e, "rc", None),
                              "path": getattr(e, "path", None), "again": str(again) == str(e)}))
    """, DYAD_WAIT_TIMEOUT=1)
    out = last_json(p.stdout)
    assert out["raised"] == "DyadError", p.stdout + p.stderr
    assert "never-produced.npy" in out["text"]
    assert "DataLoader worker" in out["text"]
    assert out["rc"] is not None and out["rc"] < 0
    assert out["path"] and out["path"].endswith("never-produced.npy")
    assert out["again"] is True
