# SPDX-License-Identifier: Apache-2.0
"""The harness's ground floor (scripts/harness.py re-exports all of it):
free ports, waits with a deadline, stopping processes, and the set of
things the harness cleans up at exit."""
import random
import shutil
import signal
import socket
import subprocess
import time

ETCD = shutil.which("etcd") or "/usr/bin/etcd"  # Debian's etcd-server
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"  # Debian's etcd-client
# every Cluster, NetnsNetwork, own-root Etcd not cleaned up yet (harness.py cleans them at exit)
_live = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host="127.0.0.1"):
    """A port free on `host`, below the kernel's ephemeral range: a port
    from that range can be taken by any outgoing connection (a dyadd's to
    etcd, in its namespace) between this check and the service's bind."""
    low = _ephemeral_low()
    if low > 12000:
        for _ in range(200):
            p = random.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind((host, p))
                except OSError:
                    continue
                return p
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout=10.0, what="the condition", interval=0.02):
    """Polls `predicate` every `interval` seconds until it returns something
    true, and returns that; after `timeout` seconds raises TimeoutError naming
    `what`. Exceptions of `predicate` propagate. Tests wait for events (a
    counter, a file, a process's output) with it instead of sleeping."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"still waiting for {what} after {timeout}s")
        time.sleep(interval)  # the poll interval


def wait_listening(host, port, timeout=10.0, proc=None, what="dyadd"):
    def listening():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_for(listening, timeout, what=f"a service listening on {host}:{port}")


def stop_process(proc, sig=signal.SIGTERM, timeout=10):
    """Sends `sig` to a running Popen, waits `timeout` s, then kills it;
    returns its exit code (None for no process)."""
    if proc and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode if proc else None


def rss_kib(pid):
    """Resident set size of process `pid` in KiB (0 if unknown)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
