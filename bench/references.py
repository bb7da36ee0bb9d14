# SPDX-License-Identifier: Apache-2.0
"""The references `bench/bench.py` runs beside DYAD, each between node0's
address (the side holding the files, like the producer's dyadd) and node1's
(the side receiving them, like `dyad consume`):

- RsyncDaemon: `rsync --daemon` on node0's address with a module on node0's
  directory; the client `rsync -a rsync://...` from node1's address.
- tar_socat: `socat` listening on node0's address runs `tar cf - -C SRC .`
  for one connection; the client `socat ... | tar xf -` on node1's side.
- PlainCopy: bench/plain_copy.c, a file -> TCP socket -> file copy with
  1 MiB read()/write() loops, one sender and one receiver per file.
- Iperf3: iperf3 TCP memory to memory (writes no file): a ceiling.

Every method times only the receiving side's process (from its start to its
exit; the serving side is started and listening before), and returns a
measurement dict: {"s": wall seconds, "cpu_s", "ctxsw": of every process of
the method, "parts": {process: [cpu_s, ctxsw]}}. With an accounting.Strace,
the same commands run under strace instead (untimed), and the dict is only
valid for the calls strace counted.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import accounting
import harness
from accounting import ZERO, abandon, finish, run_counted, start

PLAIN_COPY = os.path.join(os.path.dirname(harness.DYAD), "bench_plain_copy")


def tcp_listening(host, port):
    """Whether something listens on host:port, read from /proc/net/tcp: no
    probe connection, which a one-shot server would take as its client."""
    want = "%08X:%04X" % (int.from_bytes(bytes(map(int, host.split("."))), "little"), port)
    try:
        with open("/proc/net/tcp") as f:
            return any(line.split()[1] == want and line.split()[3] == "0A" for line in f.readlines()[1:])
    except OSError:
        return False


def wait_tcp_listening(host, port, proc, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not tcp_listening(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start listening on {host}:{port}")
        time.sleep(0.01)  # the poll interval, before the timed step


def measurement(wall, parts):
    """The dict every method returns; parts: {process: Usage}."""
    total = sum(parts.values(), ZERO)
    return {"s": wall, "cpu_s": total.cpu_s, "ctxsw": total.ctxsw,
            "parts": {k: [round(v.cpu_s, 4), v.ctxsw] for k, v in parts.items()}}


def traced(trace, part, cmd):
    return trace.wrap(part, cmd) if trace else cmd


def missing_tools():
    """Names of the reference programs that are not installed."""
    return [t for t in ("rsync", "socat", "tar", "iperf3") if not shutil.which(t)] + \
        ([] if os.access(PLAIN_COPY, os.X_OK) else ["bench_plain_copy (build it: make build)"])


# ---------------------------------------------------------------- rsync

class RsyncDaemon:
    """An rsync daemon of its own (configuration, log and pid file in
    `workdir`), serving `path` read-only as module "mod" on host; one per
    measurement, so that its rusage (it reaps its per-connection children)
    is the transfer's."""

    def __init__(self, workdir, path, host):
        self.host = host
        self.conf = os.path.join(workdir, "rsyncd.conf")
        self.pid_file = os.path.join(workdir, "rsyncd.pid")
        with open(self.conf, "w") as f:
            f.write(f"use chroot = no\nreverse lookup = no\nnumeric ids = yes\n"
                    f"log file = {os.path.join(workdir, 'rsyncd.log')}\npid file = {self.pid_file}\n"
                    f"[mod]\npath = {path}\nread only = yes\nuid = {os.getuid()}\ngid = {os.getgid()}\n")
        self.proc = None
        self.port = None

    def start(self, trace=None):
        if os.path.exists(self.pid_file):
            os.remove(self.pid_file)
        self.port = harness.free_port(self.host)
        cmd = ["rsync", "--daemon", "--no-detach", f"--config={self.conf}", f"--port={self.port}",
               f"--address={self.host}"]
        self.proc = start(traced(trace, "rsync daemon", cmd))
        wait_tcp_listening(self.host, self.port, self.proc, "rsync --daemon")
        harness.wait_for(lambda: os.path.exists(self.pid_file), 10.0, what="the rsync daemon's pid file")

    def stop(self):
        """Stops the daemon once its children are reaped; its Usage (with them)."""
        with open(self.pid_file) as f:
            pid = int(f.read().split()[0])
        accounting.wait_children_reaped(pid)
        os.kill(pid, signal.SIGTERM)
        # rsync exits with 20 (RERR_SIGNAL) on SIGTERM
        _, usage = finish(self.proc, timeout=30, check=False)
        self.proc = None
        return usage

    def kill(self):
        abandon(self.proc)
        self.proc = None


def rsync(daemon, rel_src, dst_dir, client_host, trace=None):
    """rsync -a of module path rel_src/ into dst_dir/ through a fresh run of
    `daemon` (started before the timing, stopped after)."""
    os.makedirs(dst_dir, exist_ok=True)
    try:
        daemon.start(trace)
        cmd = ["rsync", "-a", f"--address={client_host}",
               f"rsync://{daemon.host}:{daemon.port}/mod/{rel_src}/", dst_dir + "/"]
        wall, _, client = run_counted(traced(trace, "rsync client", cmd))
        server = daemon.stop()
    finally:
        daemon.kill()
    return measurement(wall, {"rsync client": client, "rsync daemon": server})


# ---------------------------------------------------------------- tar | socat

def tar_socat(src_dir, dst_dir, server_host, client_host, trace=None):
    """tar cf - SRC | TCP | tar xf - -C DST, with socat on both ends."""
    os.makedirs(dst_dir, exist_ok=True)
    port = harness.free_port(server_host)
    server_cmd = ["socat", "-U", f"TCP-LISTEN:{port},reuseaddr,bind={server_host}",
                  f"EXEC:tar cf - -C {src_dir} ."]
    server = start(traced(trace, "socat+tar (send)", server_cmd))
    try:
        wait_tcp_listening(server_host, port, server, "socat")
        client_cmd = ["bash", "-c", f'set -o pipefail; socat -u TCP:{server_host}:{port},bind={client_host} STDOUT'
                      ' | tar xf - -C "$0"', dst_dir]
        wall, _, client = run_counted(traced(trace, "socat+tar (receive)", client_cmd))
        _, sender = finish(server, timeout=30)
    finally:
        abandon(server)
    return measurement(wall, {"socat+tar receive": client, "socat+tar send": sender})


# ---------------------------------------------------------------- plain copy

def plain_copies(pairs, server_host, client_host, trace=None):
    """One sender and one receiver of bench_plain_copy per (src, dst), all
    receivers started at once; timed from the first receiver's start to the
    last one's exit."""
    senders, receivers = [], []
    try:
        for src, _ in pairs:
            p = start(traced(trace, "plain sender", [PLAIN_COPY, "send", server_host, src]),
                      stdout=subprocess.PIPE)
            senders.append(p)
            line = p.stdout.readline().strip()
            if not line.isdigit():
                raise RuntimeError(f"bench_plain_copy send printed {line!r} instead of its port")
            p.port = line
        t0 = time.perf_counter()
        for s, (_, dst) in zip(senders, pairs):
            receivers.append(start(traced(trace, "plain receiver",
                                          [PLAIN_COPY, "recv", server_host, s.port, dst, client_host])))
        recv_usage = [finish(r)[1] for r in receivers]
        wall = time.perf_counter() - t0
        send_usage = [finish(s, timeout=30)[1] for s in senders]
    finally:
        for p in senders + receivers:
            abandon(p)
    return measurement(wall, {"plain receiver": sum(recv_usage, ZERO), "plain sender": sum(send_usage, ZERO)})


# ---------------------------------------------------------------- iperf3

class Iperf3:
    """One-shot iperf3 server on node0's address, client bound to node1's."""

    def __init__(self):
        self.exe = shutil.which("iperf3")
        self.server = None
        self.server_host, self.client_host = "127.0.0.1", "127.0.0.2"

    def measure(self, nbytes):
        host = self.server_host
        port = harness.free_port(host)
        self.server = subprocess.Popen(
            [self.exe, "-s", "-B", host, "-p", str(port), "-1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_tcp_listening(host, port, self.server, "iperf3 -s")
            wall, out, _ = run_counted([self.exe, "-c", host, "-B", self.client_host, "-p", str(port),
                                        "-n", str(nbytes), "-J"], timeout=300)
            rx = json.loads(out)["end"]["sum_received"]
            self.server.wait(timeout=10)
            return {"bits_per_second": rx["bits_per_second"], "bytes": rx["bytes"],
                    "seconds": rx["seconds"], "client_wall_s": wall}
        finally:
            self.stop()

    def stop(self):
        harness.stop_process(self.server, timeout=5)
        self.server = None
