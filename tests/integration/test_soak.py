# SPDX-License-Identifier: Apache-2.0
"""The soak (`make test-long`; SOAK_SECONDS, default 1800): three nodes on an
etcd of their own, for SOAK_SECONDS: producers and consumers at random
(some killed with SIGKILL mid-way), a service killed and restarted now and
then, and random bad frames to every service. At the end, with every
service up: each file whose produce succeeded is either delivered
byte-identical or reported as failed; no partial file is visible under a
real name; the services never killed hold as many descriptors as after the
warm-up and their RSS stayed flat. Prints the figures."""
import json
import os
import random
import socket
import subprocess
import time

import harness
from rawwire import HDR, MAGIC, REQUEST, VERSION, Raw

SECONDS = float(os.environ.get("SOAK_SECONDS", "1800"))


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


sha = harness.sha256


def bad_frame(node, rng):
    """One of: garbage bytes, a frame with a lying length, a bad request
    after a good hello. dyadd must drop the connection, not die."""
    kind = rng.randrange(3)
    try:
        if kind == 0:
            with socket.create_connection((node.host, node.port), timeout=2) as s:
                s.sendall(os.urandom(rng.randrange(1, 4096)))
        elif kind == 1:
            with socket.create_connection((node.host, node.port), timeout=2) as s:
                s.sendall(HDR.pack(MAGIC, VERSION, REQUEST, 0, 1, 0, 1 << 30, 0) + b"{")
        else:
            r = Raw.to(node, timeout=2)
            meta = json.dumps({"topic": rng.choice(["dyad.fetch", "kvs.get", "kvs.list", "dyad.publish"]),
                               "upath": "../" * rng.randrange(5) + "x", "ns": 7, "keys": "no"}).encode()
            r.s.sendall(r.frame(REQUEST, 9, meta))
            r.s.settimeout(2)
            try:
                r.recv()
            except (OSError, ValueError):
                pass
            r.s.close()
    except OSError:
        pass  # a service being restarted


def test_soak():
    rng = random.Random(int(os.environ.get("SOAK_SEED", "1")))
    etcd = harness.Etcd()
    c = harness.Cluster(nodes=3, start=False, kvs=etcd.uri)
    produced = {}  # name -> (node index, sha256)
    stats = {"produced": 0, "produce_killed": 0, "produce_failed": 0, "consumed": 0, "consume_failed": 0,
             "consume_killed": 0, "service_kills": 0, "bad_frames": 0, "bytes": 0}
    try:
        for n in c.nodes:
            n.start(["--lease-ttl", "3"])
        steady = c[0]  # never killed: its descriptors and RSS must stay flat

        def produce(i):
            node = c[rng.randrange(3)]
            name = f"soak/n{node.index}/f{i:06d}.bin"
            # mostly small files; big ones until 2 GiB were written
            sizes = [0, 1, 4096, 65536] + ([1 << 20, 3 << 20] if stats["bytes"] < (2 << 30) else [])
            size = rng.choice(sizes) + rng.randrange(100)
            stats["bytes"] += size
            harness.write_file(node.path(name), size, seed=i)
            digest = sha(node.path(name))
            if rng.random() < 0.1:  # killed mid-way: published or not, never half
                p = node.dyad_async("produce", node.path(name))
                time.sleep(rng.random() * 0.02)
                p.kill()
                p.communicate()
                stats["produce_killed"] += 1
                if p.returncode == 0:
                    produced[name] = (node.index, digest)
                return
            p = node.dyad("produce", node.path(name), check=False, timeout=120)
            if p.returncode == 0:
                produced[name] = (node.index, digest)
                stats["produced"] += 1
            else:
                stats["produce_failed"] += 1

        def consume():
            if not produced:
                return
            name = rng.choice(list(produced))
            owner = produced[name][0]
            node = c[(owner + 1 + rng.randrange(2)) % 3]
            env = {"DYAD_WAIT_TIMEOUT": 10}
            if rng.random() < 0.1:
                p = node.dyad_async("consume", node.path(name), env_extra=env)
                time.sleep(rng.random() * 0.05)
                p.kill()
                p.communicate()
                stats["consume_killed"] += 1
                return
            p = node.dyad("consume", node.path(name), check=False, timeout=120, env_extra=env)
            stats["consumed" if p.returncode == 0 else "consume_failed"] += 1

        # warm-up, then the baseline of the steady service
        for i in range(20):
            produce(i)
            consume()
        base_fds, base_rss = fds(steady.proc.pid), harness.rss_kib(steady.proc.pid)
        peak_rss = base_rss
        t_end = time.monotonic() + SECONDS
        next_kill = time.monotonic() + 60
        i = 20
        while time.monotonic() < t_end:
            r = rng.random()
            if r < 0.45:
                produce(i)
                i += 1
            elif r < 0.9:
                consume()
            else:
                bad_frame(c[rng.randrange(3)], rng)
                stats["bad_frames"] += 1
            if time.monotonic() >= next_kill:
                victim = c[1 + rng.randrange(2)]
                victim.kill()
                time.sleep(rng.random() * 3)
                victim.start(["--lease-ttl", "3"])
                stats["service_kills"] += 1
                next_kill = time.monotonic() + 30 + rng.random() * 60
            peak_rss = max(peak_rss, harness.rss_kib(steady.proc.pid))

        # Every produced file: delivered byte-identical or reported failed
        # (pipelined: one `dyad consume` of many files per node and batch).
        delivered = failed = 0
        names = sorted(produced)
        for k in range(3):
            mine = [n for n in names if (produced[n][0] + 1) % 3 == k]
            node = c[k]
            for b in range(0, len(mine), 500):
                batch = mine[b:b + 500]
                p = node.dyad("--json", "consume", *[node.path(n) for n in batch], check=False, timeout=600,
                              env_extra={"DYAD_WAIT_TIMEOUT": 10})
                ok = {json.loads(line).get("file") for line in p.stdout.splitlines()
                      if line.startswith("{") and json.loads(line).get("action") in ("fetched", "present")}
                for n in batch:
                    if node.path(n) in ok:
                        assert sha(node.path(n)) == produced[n][1], f"{n} delivered with other bytes"
                        delivered += 1
                    else:
                        assert node.path(n) in p.stderr or n in p.stderr, f"{n}: failed without saying why"
                        failed += 1
        # Nothing partial under a real name: every visible file of a consumer
        # directory is a whole copy of what its producer published.
        for n in c.nodes:
            for root, _, files in os.walk(n.path("soak")):
                for f in files:
                    if f.startswith("."):
                        continue  # a killed consumer's hidden temporary file
                    name = os.path.relpath(os.path.join(root, f), n.dir)
                    if name in produced and produced[name][0] != n.index:
                        assert sha(os.path.join(root, f)) == produced[name][1], f"partial or wrong: {name}"
        end_fds, end_rss = fds(steady.proc.pid), harness.rss_kib(steady.proc.pid)
        figures = dict(stats, seconds=SECONDS, files=len(produced), delivered=delivered, failed=failed,
                       fds_start=base_fds, fds_end=end_fds, rss_start_mib=base_rss / 1024,
                       rss_end_mib=end_rss / 1024, rss_peak_mib=peak_rss / 1024)
        print("soak:", json.dumps(figures))
        assert delivered + failed == len(produced)
        assert end_fds <= base_fds + 8, figures
        assert end_rss - base_rss < 64 * 1024, figures
        assert steady.proc.poll() is None
    finally:
        c.cleanup()
        etcd.cleanup()
