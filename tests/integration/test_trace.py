# SPDX-License-Identifier: Apache-2.0
"""DYAD_TRACE=DIR (dyadd --trace DIR): every DYAD process writes a Chrome
trace-event file DIR/dyad-NODE-PID.json of what it did, per file, with sizes
and the key (docs/user-guide.md, "Tracing (DYAD_TRACE)")."""
import glob
import json
import os
import subprocess

import pytest

import harness

WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")
PRELOAD = harness.preload_env(WRAPPER)
SIZE = 300_000


def load(path, strict=True):
    """One trace file's events. strict: the process ended normally, so the
    array is closed; otherwise a missing "]" is repaired, as Perfetto does."""
    text = open(path).read()
    if not strict and not text.rstrip().endswith("]"):
        text = text.rstrip().rstrip(",") + "\n]"
    return json.loads(text)


def traces(d):
    """[(process name, [events])], one per file in d (each parsed strictly)."""
    out = []
    for f in sorted(glob.glob(os.path.join(d, "dyad-*.json"))):
        events = load(f)
        names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
        assert len(names) == 1, (f, names)
        assert events[-1]["name"] == "trace_end", f
        for e in events:
            if e["ph"] == "X":
                assert isinstance(e["ts"], int) and e["dur"] >= 0 and e["pid"] > 0 and e["tid"] > 0, e
        out.append((names[0], events))
    return out


def one(events, name, **args):
    found = [e for e in events if e.get("name") == name and all(e["args"].get(k) == v for k, v in args.items())]
    assert found, f"no {name} event with {args} in {[(e['name'], e.get('args')) for e in events]}"
    return found[0]


def process(tr, prefix, having=None):
    """The events of the one process whose name starts with prefix (and
    that has an event named `having`)."""
    found = [events for name, events in tr
             if name.startswith(prefix) and (having is None or any(e["name"] == having for e in events))]
    assert len(found) == 1, (prefix, having, [name for name, _ in tr])
    return found[0]


def test_produce_and_consume_across_two_services_are_traced(tmp_path):
    d = str(tmp_path / "trace")
    with harness.Cluster(nodes=2, dyadd_args=["--trace", d]) as c:
        src = c[0].path("frames/f0.bin")
        harness.write_file(src, SIZE)
        c[0].dyad("produce", src, env_extra={"DYAD_TRACE": d})
        c[1].dyad("consume", c[1].path("frames/f0.bin"), env_extra={"DYAD_TRACE": d})
        st = c[0].status()["trace"]  # dyadd reports its file and counters
        assert st["file"].startswith(d + "/dyad-node0-") and st["events"] >= 2 and st["dropped"] == 0, st
        assert st["max_bytes"] == 64 << 20
        c.stop()  # the services write their last events and close their files
    tr = traces(d)
    # Two services, one producer, one consumer: a file each.
    assert len(tr) == 4, [name for name, _ in tr]
    svc0, svc1 = process(tr, "dyadd (node0)"), process(tr, "dyadd (node1)")
    prod, cons = process(tr, "dyad (", "produce"), process(tr, "dyad (", "consume")

    rel = "frames/f0.bin"
    produced = one(prod, "produce", path=rel, size=SIZE)
    key = produced["args"]["key"]
    assert key and produced["args"]["generation"] > 0
    one(prod, "publish", path=rel, key=key, size=SIZE)
    one(svc0, "service.publish", path=rel, key=key, size=SIZE)

    found = [e for e in cons if e["name"] in ("lookup", "wait-for-create")]
    assert found and found[0]["args"]["key"] == key and found[0]["args"]["size"] == SIZE, found
    moved = one(cons, "transfer", path=rel, key=key, bytes=SIZE, owner="node0")
    assert moved["args"]["transport"], moved
    one(cons, "commit", path=rel, key=key, bytes=SIZE)
    one(cons, "consume", bytes=SIZE, action="fetched")
    served = one(svc0, "service.fetch", upath=rel, key=key, bytes=SIZE, result="ok")
    # The service's event lies inside the consumer's transfer (one clock).
    assert moved["ts"] <= served["ts"] + 1000 and served["ts"] + served["dur"] <= moved["ts"] + moved["dur"] + 1000
    # node1's service traced its store requests only if it served any: it is not node0's.
    assert not any(e["name"] == "service.fetch" for e in svc1)


def test_the_wrapper_traces_unmodified_programs(tmp_path):
    d = str(tmp_path / "trace")
    with harness.Cluster(nodes=2) as c:
        src = str(tmp_path / "src.bin")
        harness.write_file(src, SIZE)
        dst = c[1].path("w/f.bin")
        # The consumer first: it waits for the produce.
        cat = subprocess.Popen(["cat", dst], env=c[1].env(**PRELOAD, DYAD_TRACE=d, DYAD_WAIT_TIMEOUT=60),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        c[1].wait_waiters(1, procs=[cat])
        subprocess.run(["mkdir", "-p", c[0].path("w")], check=True)
        p = subprocess.run(["cp", src, c[0].path("w/f.bin")], env=c[0].env(**PRELOAD, DYAD_TRACE=d),
                           capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out, err = cat.communicate(timeout=60)
        assert cat.returncode == 0, err
        assert len(out) == SIZE
    tr = traces(d)
    cp, cat_events = process(tr, "cp ("), process(tr, "cat (")
    key = one(cp, "produce", path="w/f.bin", size=SIZE)["args"]["key"]
    one(cat_events, "wait-for-create", path="w/f.bin", key=key, size=SIZE)
    one(cat_events, "transfer", path="w/f.bin", bytes=SIZE)
    one(cat_events, "commit", path="w/f.bin", bytes=SIZE)


def test_only_a_set_dyad_trace_writes(tmp_path):
    d, cwd = str(tmp_path / "trace"), str(tmp_path / "cwd")
    os.makedirs(cwd)
    with harness.Cluster(nodes=2) as c:
        c[0].produce_text("a.txt", "a")
        c[0].produce_text("b.txt", "b")
        for value in (None, ""):  # unset, and set to nothing
            env = c[1].env()
            env.pop("DYAD_TRACE", None)
            if value is not None:
                env["DYAD_TRACE"] = value
            p = subprocess.run([harness.DYAD, "consume", c[1].path("a.txt")], env=env, cwd=cwd,
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and "trace" not in p.stderr.lower(), p.stderr
        c[1].dyad("consume", c[1].path("b.txt"), env_extra={"DYAD_TRACE": d})
    # The traced consume wrote one file, the others nothing (anywhere near).
    assert len(os.listdir(d)) == 1, os.listdir(d)
    assert os.listdir(cwd) == []
    events = load(glob.glob(os.path.join(d, "dyad-*.json"))[0])
    one(events, "consume", path=os.path.join(c[1].dir, "b.txt"))


def test_an_unusable_directory_is_one_warning_and_no_failure(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    d = str(blocker / "trace")  # cannot be made, even by root
    with harness.Cluster(nodes=2) as c:
        src = c[0].path("x.bin")
        harness.write_file(src, 1000)
        c[0].dyad("produce", src)
        p = c[1].dyad("consume", c[1].path("x.bin"), env_extra={"DYAD_TRACE": d})
        assert os.path.getsize(c[1].path("x.bin")) == 1000
        # dyadd too: it starts, warns and serves.
        c[0].stop()
        c[0].start(["--trace", d])
        c[0].dyad("produce", src)
        log = open(c[0].log_path, errors="replace").read()
    lines = [line for line in p.stderr.splitlines() if "DYAD_TRACE" in line]
    assert len(lines) == 1 and "not traced" in lines[0] and d in lines[0], p.stderr
    assert log.count("cannot create the trace file") == 1, log[-2000:]


def test_a_trace_file_is_capped_and_counts_what_it_dropped(tmp_path):
    d = str(tmp_path / "trace")
    with harness.Cluster(nodes=2) as c:
        for i in range(40):
            c[0].produce_text(f"m/{i}.txt", str(i))
        env = c[1].env(**PRELOAD, DYAD_TRACE=d, DYAD_TRACE_MAX_SIZE="4K")
        p = subprocess.run(["cat", *[c[1].path(f"m/{i}.txt") for i in range(40)]], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout == "".join(str(i) for i in range(40)), p.stderr
    files = glob.glob(os.path.join(d, "dyad-*.json"))
    assert len(files) == 1
    events = load(files[0])
    end = events[-1]
    assert end["name"] == "trace_end" and end["args"]["dropped"] > 0, end
    assert end["args"]["events"] + end["args"]["dropped"] >= 40 * 4
    # The events within the cap; the head and the last event besides.
    assert os.path.getsize(files[0]) < 4096 + 1024
    assert p.stderr.count("DYAD_TRACE_MAX_SIZE") >= 1, p.stderr


TIMELINE = os.path.join(harness.ROOT, "bench", "workflow", "timeline.py")


def test_timeline_draws_every_process_and_merges_for_perfetto(tmp_path):
    d = tmp_path / "trace"
    d.mkdir()

    def ev(name, ts, dur, pid, tid, **args):
        return {"name": name, "cat": "client", "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}

    def meta(pid, name):
        return {"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}}

    # A closed file (dyadd), and a client that crashed: no "]", its last event cut.
    closed = [meta(10, "dyadd (n0)"), ev("service.fetch", 1_000_500, 300, 10, 10, bytes=5)]
    (d / "dyad-n0-10.json").write_text("[\n" + ",\n".join(json.dumps(e) for e in closed) + "\n]\n")
    crashed = [meta(20, "cat (n1)"), ev("consume", 1_000_000, 1000, 20, 20),
               ev("transfer", 1_000_400, 500, 20, 20, bytes=5)]
    (d / "dyad-n1-20.json").write_text("[\n" + ",\n".join(json.dumps(e) for e in crashed) + ',\n{"name":"com')
    png, merged = tmp_path / "t.png", tmp_path / "m.json"
    p = subprocess.run(["/usr/bin/python3", TIMELINE, str(d), str(png), "--merge", str(merged)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(merged.read_text())["traceEvents"]
    assert sorted(e["name"] for e in events if e["ph"] == "X") == ["consume", "service.fetch", "transfer"]
    assert "3 events" in p.stdout and "transfer" in p.stdout
    # A directory without traces is a clear error.
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run(["/usr/bin/python3", TIMELINE, str(empty), str(png)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "DYAD_TRACE" in p.stderr


PYDYAD_FORK = r"""
import os, sys
from pydyad import Dyad
d = Dyad()
d.init_env()
d.consume(sys.argv[1])
pid = os.fork()
if pid == 0:
    d.consume(sys.argv[2])
    os._exit(0)  # no atexit: the child's array stays open
_, status = os.waitpid(pid, 0)
d.consume(sys.argv[3])
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_pydyad_and_a_forked_child_that_leaves_by_exit_each_write_their_own_file(tmp_path):
    d = str(tmp_path / "trace")
    with harness.Cluster(nodes=2) as c:
        for name in ("a", "b", "c"):
            c[0].produce_text(f"{name}.txt", name * 1000)
        env = c[1].env(DYAD_TRACE=d, PYTHONPATH=os.path.join(harness.ROOT, "python"),
                       DYAD_LIBRARY=os.path.join(harness.BUILD, "lib", "libdyad.so"))
        p = subprocess.run(["/usr/bin/python3", "-c", PYDYAD_FORK, *[c[1].path(f"{n}.txt") for n in "abc"]],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    files = sorted(glob.glob(os.path.join(d, "dyad-*.json")), key=os.path.getmtime)
    assert len(files) == 2, files
    by_consumed = {}
    for f in files:
        text = open(f).read()
        events = load(f, strict=False)
        consumed = sorted(os.path.basename(e["args"]["path"]) for e in events if e["name"] == "consume")
        by_consumed[tuple(consumed)] = (text, events)
    assert set(by_consumed) == {("a.txt", "c.txt"), ("b.txt",)}, list(by_consumed)
    parent_text, parent = by_consumed[("a.txt", "c.txt")]
    child_text, child = by_consumed[("b.txt",)]
    assert parent_text.rstrip().endswith("]") and not child_text.rstrip().endswith("]")
    assert child[0]["name"] == "process_name" and child[0]["pid"] != parent[0]["pid"]
    one(child, "transfer", path="b.txt", bytes=1000)
    one(child, "commit", path="b.txt", bytes=1000)


def test_a_symlinked_trace_directory_is_not_followed(tmp_path):
    """Issue 45, finding 7: DYAD_TRACE=DIR followed a DIR that another user
    had made a symbolic link to a directory of their choosing (a root-only
    one: a root process then wrote its trace there). The directory is now
    opened without following a link: the process is not traced, says why
    once, and runs."""
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    link = tmp_path / "trace"
    os.symlink(target, link)
    with harness.Cluster(nodes=1) as c:
        src = c[0].path("x.bin")
        harness.write_file(src, 1000)
        p = c[0].dyad("produce", src, env_extra={"DYAD_TRACE": str(link)})
    assert os.listdir(target) == [], os.listdir(target)
    lines = [line for line in p.stderr.splitlines() if "DYAD_TRACE" in line]
    assert len(lines) == 1 and "symbolic link" in lines[0] and "not traced" in lines[0], p.stderr
