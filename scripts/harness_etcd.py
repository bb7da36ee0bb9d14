# SPDX-License-Identifier: Apache-2.0
"""A real etcd of its own, one member or a cluster, for the harness
(scripts/harness.py re-exports it)."""
import json
import os
import shutil
import signal
import subprocess
import tempfile

from harness_base import ETCD, ETCDCTL, _live, free_port, stop_process, wait_for


class Etcd:
    """A real etcd (Debian's etcd-server, one member) of its own: a data
    directory under `root` (a temporary one by default), free ports unless
    given, run with `prefix` (e.g. ["ip", "netns", "exec", NS]). restart()
    keeps the data (a member restart). The distribution's etcd service plays
    no part (scripts/install-deps.sh leaves it disabled)."""

    def __init__(self, root=None, host="127.0.0.1", prefix=(), port=None, peer_port=None, start=True,
                 name="dyad-test"):
        self.own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="dyad-etcd-")
        self.host = host
        self.prefix = list(prefix)
        bind = "127.0.0.1" if self.prefix else host  # in a namespace of its own every port is free
        self.port = port or free_port(bind)
        self.peer_port = peer_port or free_port(bind)
        while self.peer_port == self.port:
            self.peer_port = free_port(bind)
        self.name = name
        self.initial_cluster = None  # "name=peer-url,..." for a member of several; None: alone
        self.data = os.path.join(self.root, "etcd.data")
        self.log = os.path.join(self.root, "etcd.log")
        self.proc = None
        self._logf = None
        if self.own_root:
            _live.add(self)
        if start:
            try:
                self.start()
            except BaseException:
                self.cleanup()
                raise

    @property
    def endpoint(self):
        return f"{self.host}:{self.port}"

    @property
    def client_url(self):
        return f"http://{self.endpoint}"

    @property
    def uri(self):
        """What dyadd --kvs takes."""
        return f"etcd://{self.endpoint}"

    @staticmethod
    def _env():
        # ETCD_* / ETCDCTL_* variables of the caller would configure it.
        return {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}

    def start(self, timeout=30.0, wait=True):
        """wait: until it answers (a member of several answers once a
        majority of them runs: start them all with wait=False, then wait)."""
        peer = f"http://{self.host}:{self.peer_port}"
        args = [ETCD, "--name", self.name, "--data-dir", self.data,
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial_cluster or f"{self.name}={peer}", "--initial-cluster-state", "new",
                "--initial-cluster-token", f"dyad-test-{os.getpid()}", "--logger", "zap", "--log-level", "warn"]
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(self.prefix + args, stdout=self._logf, stderr=subprocess.STDOUT, env=self._env())
        if wait:
            self.wait_healthy(timeout)
        return self

    def ctl(self, *args, check=True, timeout=30):
        """Runs etcdctl (v3 API) against this member; check: raise
        CalledProcessError when it fails."""
        env = dict(self._env(), ETCDCTL_API="3")
        return subprocess.run(self.prefix + [ETCDCTL, "--endpoints", self.client_url, *args], capture_output=True,
                              text=True, check=check, timeout=timeout, env=env)

    def wait_healthy(self, timeout=30.0):
        def healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log}")
            return self.ctl("endpoint", "health", check=False, timeout=10).returncode == 0

        wait_for(healthy, timeout, what=f"etcd healthy on {self.endpoint}", interval=0.1)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        rc = stop_process(self.proc, sig, timeout)
        self.proc = None
        if self._logf:
            self._logf.close()
            self._logf = None
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)

    def restart(self, sig=signal.SIGTERM):
        """Stops etcd (sig=signal.SIGKILL: without a clean shutdown) and
        starts it again on the same ports and data directory."""
        self.stop(sig)
        return self.start()

    def cleanup(self):
        self.stop(signal.SIGKILL)
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        _live.discard(self)


class EtcdCluster:
    """A real etcd cluster of several members (Debian's etcd-server), each
    an Etcd with a data directory under `root`/<name> and, in a cluster of
    namespaces, a namespace of its own. `hosts`: member name -> (host,
    prefix, client port, peer port). uri names every member (dyadd --kvs
    etcd://A,B,C). leader() / kill_leader() find the member that leads."""

    def __init__(self, root, hosts):
        self.members = []
        for name, (host, prefix, port, peer_port) in hosts.items():
            d = os.path.join(root, name)
            os.makedirs(d, exist_ok=True)
            self.members.append(Etcd(d, host, prefix=prefix, port=port, peer_port=peer_port, start=False, name=name))
        initial = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial

    @property
    def endpoints(self):
        return [m.endpoint for m in self.members]

    @property
    def uri(self):
        return "etcd://" + ",".join(self.endpoints)

    @property
    def logs(self):
        return [m.log for m in self.members]

    def running(self):
        return [m for m in self.members if m.proc and m.proc.poll() is None]

    def start(self, timeout=60.0):
        """Starts every member not running, then waits until each answers
        (a member answers once a majority runs)."""
        started = [m.start(wait=False) for m in self.members if not (m.proc and m.proc.poll() is None)]
        for m in started:
            m.wait_healthy(timeout)
        return self

    def ctl(self, *args, check=True, timeout=30):
        """etcdctl against every running member (it picks one that answers)."""
        live = self.running()
        if not live:
            raise RuntimeError("no etcd member runs")
        m = live[0]
        env = dict(Etcd._env(), ETCDCTL_API="3")
        urls = ",".join(x.client_url for x in live)
        return subprocess.run(m.prefix + [ETCDCTL, "--endpoints", urls, *args], capture_output=True, text=True,
                              check=check, timeout=timeout, env=env)

    def status(self):
        """etcdctl endpoint status of the running members: a list of dicts
        (Endpoint, Status: header.member_id, leader, dbSize, raftIndex...)."""
        out = self.ctl("endpoint", "status", "-w", "json", check=False, timeout=15).stdout
        try:
            return json.loads(out or "[]")
        except json.JSONDecodeError:
            return []

    def leader(self, timeout=30.0):
        """The member that leads now (waits for an election, up to `timeout` s)."""
        def find():
            for st in self.status():
                s = st.get("Status", {})
                if s.get("leader") and s.get("leader") == s.get("header", {}).get("member_id"):
                    ep = st.get("Endpoint", "")
                    for m in self.running():
                        if m.client_url == ep or m.endpoint == ep:
                            return m
            return None

        return wait_for(find, timeout, what="an etcd leader", interval=0.2)

    def kill_leader(self):
        """SIGKILLs the leader; returns that member (restart it with .start())."""
        m = self.leader()
        m.kill()
        return m

    def metrics(self, member=None):
        """Prometheus text of a member's /metrics (the first running one)."""
        import urllib.request
        m = member or self.running()[0]
        # The bridge's address reaches every namespace of the cluster.
        with urllib.request.urlopen(f"{m.client_url}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self, sig=signal.SIGTERM, timeout=20):
        for m in self.members:
            m.stop(sig, timeout)

    def kill(self):
        self.stop(signal.SIGKILL)

    def restart(self, sig=signal.SIGTERM):
        self.stop(sig)
        return self.start()
