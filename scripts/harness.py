# SPDX-License-Identifier: Apache-2.0
"""Starts real dyadd services as simulated nodes and runs the dyad tool.

Used by the demo, the integration tests and the benchmarks. Each node is a
dyadd with its own loopback address (127.0.0.N) and its own directory; the
first node hosts the metadata store, the others use it (--kvs).
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DYAD_BUILD_DIR", os.path.join(ROOT, "build"))
DYADD = os.path.join(BUILD, "bin", "dyadd")
DYAD = os.path.join(BUILD, "bin", "dyad")


def built_transports():
    """Names of the transports this build has (`dyad --json config`)."""
    cfg = json.loads(subprocess.run([DYAD, "--json", "config"], capture_output=True, text=True, check=True).stdout)
    return [t["name"] for t in cfg["transports_built"]]


def free_port(host="127.0.0.1"):
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


def wait_listening(host, port, timeout=10.0, proc=None):
    def listening():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"dyadd exited with {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_for(listening, timeout, what=f"a service listening on {host}:{port}")


class Node:
    def __init__(self, cluster, index, name, host, port, directory, kvs_uri, extra_env=None):
        self.cluster = cluster
        self.index = index
        self.name = name
        self.host = host
        self.port = port
        self.dir = directory
        self.kvs_uri = kvs_uri
        self.proc = None
        self.log_path = os.path.join(cluster.root, f"{name}.log")
        self.prefix = []  # e.g. ["ip", "netns", "exec", NS] to run inside a namespace
        self.extra_env = dict(extra_env or {})  # for the service and every client of this node
        # The service's Unix socket (dyadd --socket), as on a real node:
        # consumers of this node reach their owner through it (LOCAL needs it).
        self.socket = None

    @property
    def uri(self):
        return f"tcp://{self.host}:{self.port}"

    @property
    def key(self):
        """The job key file of this node's cluster (None without one)."""
        return self.cluster.key

    @property
    def unix_uri(self):
        return f"unix:{self.socket}" if self.socket else None

    def start(self, extra_args=()):
        args = [DYADD, "--node", self.name, "--listen", f"{self.host}:{self.port}", self.dir]
        if self.kvs_uri:
            args += ["--kvs", self.kvs_uri]
        if self.socket:
            args += ["--socket", self.socket]
        args += list(extra_args)
        self.log = open(self.log_path, "ab")
        env = dict(os.environ)
        for var in ("SLURM_NODEID", "FLUX_TASK_RANK", "PMIX_RANK"):  # ranks come from the test
            env.pop(var, None)
        env.update(self.extra_env)
        self.proc = subprocess.Popen(self.prefix + args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_listening(self.host, self.port, proc=self.proc)
        return self

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)

    def env(self, producer=True, consumer=True, **extra):
        e = dict(os.environ)
        for k in [k for k in e if k.startswith("DYAD_") and k != "DYAD_BUILD_DIR"]:
            del e[k]
        e.update(self.extra_env)
        e["DYAD_SERVICE_URI"] = self.uri
        if producer:
            e["DYAD_PATH_PRODUCER"] = self.dir
        if consumer:
            e["DYAD_PATH_CONSUMER"] = self.dir
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def dyad(self, *args, check=True, timeout=600, env_extra=None, **kw):
        """Runs the dyad tool as a process of this node."""
        env = self.env(**(env_extra or {}))
        p = subprocess.run(self.prefix + [DYAD, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"dyad {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def dyad_async(self, *args, env_extra=None):
        env = self.env(**(env_extra or {}))
        return subprocess.Popen(self.prefix + [DYAD, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def path(self, rel):
        return os.path.join(self.dir, rel)

    def status(self):
        return json.loads(self.dyad("--json", "service", "status").stdout)

    def wait_status(self, predicate, what, timeout=30.0):
        """Polls this node's status until predicate(status) is true; returns
        that status. TimeoutError (naming `what`) at the deadline."""
        def check():
            st = self.status()
            return st if predicate(st) else None

        return wait_for(check, timeout, what=f"{what} ({self.name}'s service status)")

    def store_host(self):
        """The node whose service hosts the metadata store this node uses."""
        if not self.kvs_uri:
            return self
        return next(n for n in self.cluster.nodes if n.uri == self.kvs_uri)

    def wait_waiters(self, n, procs=(), timeout=30.0):
        """Waits until at least `n` consumers wait for a key in the metadata
        store this node uses (its service status: store.waiters), i.e. they
        are blocked waiting for a produce. Returns the count, or None as soon
        as one of `procs` (Popen objects) has ended: the caller's own checks
        then report that process."""
        host = self.store_host()

        def check():
            if any(p.poll() is not None for p in procs):
                return "ended"
            w = host.status()["store"]["waiters"]
            return w if w >= n else None

        r = wait_for(check, timeout, what=f"{n} consumer(s) waiting in {host.name}'s metadata store")
        return None if r == "ended" else r


class NodeView(Node):
    """Another process directory on an existing node: the same service (and
    node id), its own consumer directory. The producer directory stays the
    node's (a producer must use its service's)."""

    def __init__(self, node, consumer_dir):
        super().__init__(node.cluster, node.index, node.name, node.host, node.port, consumer_dir, node.kvs_uri,
                         node.extra_env)
        self.prefix = node.prefix
        self.socket = node.socket
        self.producer_dir = node.dir
        os.makedirs(consumer_dir, exist_ok=True)

    def start(self, extra_args=()):
        raise RuntimeError("a NodeView has no service of its own")

    def stop(self, sig=signal.SIGTERM, timeout=10):
        return None

    def env(self, producer=True, consumer=True, **extra):
        e = super().env(producer=False, consumer=consumer, **extra)
        if producer:
            e["DYAD_PATH_PRODUCER"] = self.producer_dir
        return e


class Cluster:
    """N simulated nodes. With netns=True each node is a Linux network
    namespace joined to the others by a veth pair on a bridge (10.213.X.N/24);
    where namespaces cannot be made (not root, no ip), it falls back to
    distinct loopback addresses 127.0.0.1 .. 127.0.0.N (self.mode says which)."""

    def __init__(self, nodes=2, root=None, start=True, netns=False, env=None, auth=True, kvs=None):
        """auth: the services and their clients share a job key (made here
        with `dyad keygen`); False runs them without one (loopback only).
        kvs: a store every node uses (etcd://...); default: node 0 hosts it."""
        self.root = root or tempfile.mkdtemp(prefix="dyad-cluster-")
        self.key = None
        if auth:
            self.key = os.path.join(self.root, "job.key")
            subprocess.run([DYAD, "keygen", self.key], check=True, capture_output=True)
            env = dict(env or {}, DYAD_AUTH_KEY_FILE=self.key)
        self.nodes = []
        self.namespaces = []
        self.bridge = None
        self.mode = "loopback"
        hosts = [f"127.0.0.{i + 1}" for i in range(nodes)]
        if netns:
            try:
                hosts = self._make_namespaces(nodes)
                self.mode = "netns"
            except (OSError, subprocess.CalledProcessError) as e:
                self._remove_namespaces()
                print(f"harness: network namespaces unavailable ({e}); using loopback addresses")
        shared_kvs = kvs
        kvs = shared_kvs
        for i in range(nodes):
            host = hosts[i]
            port = free_port("127.0.0.1") if self.mode == "netns" else free_port(host)
            d = os.path.join(self.root, f"node{i}")
            os.makedirs(d, exist_ok=True)
            n = Node(self, i, f"node{i}", host, port, d, kvs, env)
            sock = os.path.join(self.root, f"node{i}.sock")
            if len(sock.encode()) < 100:  # sun_path holds 107 bytes
                n.socket = sock
            if self.mode == "netns":
                n.prefix = ["ip", "netns", "exec", self.namespaces[i]]
            self.nodes.append(n)
            if kvs is None and shared_kvs is None:
                kvs = n.uri
        if start:
            try:
                for n in self.nodes:
                    n.start()
            except Exception:
                self.cleanup()
                raise

    def _make_namespaces(self, nodes):
        if os.geteuid() != 0 or not shutil.which("ip"):
            raise OSError("needs root and iproute2")
        tag = f"{os.getpid() % 100000}"
        subnet = 1 + os.getpid() % 250

        def ip(*a):
            subprocess.run(["ip", *a], check=True, capture_output=True)

        self.bridge = f"dybr{tag}"
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"10.213.{subnet}.254/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        hosts = []
        for i in range(nodes):
            ns = f"dyad{tag}n{i}"
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            host_if = f"dyv{tag}n{i}"
            ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", host_if, "master", self.bridge)
            ip("link", "set", host_if, "up")
            addr = f"10.213.{subnet}.{i + 1}"
            ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            hosts.append(addr)
        return hosts

    def _remove_namespaces(self):
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces = []
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self.bridge = None

    def __getitem__(self, i):
        return self.nodes[i]

    def stop(self):
        for n in reversed(self.nodes):
            n.stop()

    def cleanup(self):
        self.stop()
        self._remove_namespaces()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


def write_file(path, size, seed=0, chunk=1 << 20):
    """Writes `size` pseudo-random bytes (fast, deterministic per seed)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    block = os.urandom(min(size, chunk)) if size else b""
    with open(path, "wb") as f:
        left = size
        i = seed
        while left > 0:
            n = min(left, len(block))
            # vary each block so repeated blocks do not hide misplaced chunks
            prefix = i.to_bytes(8, "little")
            f.write(prefix[: min(8, n)] + block[min(8, n):n])
            left -= n
            i += 1


def sanitizer_runtime_env(lib):
    """For a library built with AddressSanitizer (make test-asan): the ASan
    runtime to preload into uninstrumented programs that load it, with leak
    checking off for them. {} for an ordinary build."""
    try:
        ldd = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    for line in ldd.splitlines():
        if "libasan" in line and "=>" in line:
            runtime = line.split("=>")[1].split("(")[0].strip()
            return {"LD_PRELOAD": runtime, "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"}
    return {}


def preload_env(lib):
    """Environment to LD_PRELOAD `lib` into arbitrary programs."""
    env = sanitizer_runtime_env(lib)
    env["LD_PRELOAD"] = (env["LD_PRELOAD"] + ":" if "LD_PRELOAD" in env else "") + lib
    return env


def kill_when_transfer_starts(node, consumer, cons_dir, name, timeout=30):
    """SIGKILLs `node`'s service as soon as bytes of `name` start landing in
    the consumer's temporary file. True if it killed before `consumer` ended."""
    import glob
    pattern = os.path.join(cons_dir, os.path.dirname(name), "." + os.path.basename(name) + ".dyad-*")

    def started_or_ended():
        if consumer.poll() is not None:
            return "ended"
        tmp = glob.glob(pattern)
        try:
            if tmp and os.path.getsize(tmp[0]) > 0:
                return "started"
        except OSError:
            pass  # renamed or removed between glob and stat
        return None

    try:
        if wait_for(started_or_ended, timeout, what=f"bytes of {name} in {pattern}", interval=0.002) == "started":
            node.kill()
            return True
    except TimeoutError:
        pass
    return False


def sha256(path):
    """SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class Etcd:
    """A real etcd (Debian's etcd-server) of its own: loopback, free ports, a
    temporary data directory. restart() keeps the data (a member restart)."""

    def __init__(self, root=None, host="127.0.0.1", prefix=()):
        self.root = root or tempfile.mkdtemp(prefix="dyad-etcd-")
        self.host = host
        self.prefix = list(prefix)  # e.g. ["ip", "netns", "exec", NS]
        self.port = free_port("127.0.0.1" if self.prefix else host)
        self.peer_port = free_port("127.0.0.1" if self.prefix else host)
        self.data = os.path.join(self.root, "etcd.data")
        self.log = os.path.join(self.root, "etcd.log")
        self.proc = None
        self.start()

    @property
    def endpoint(self):
        return f"{self.host}:{self.port}"

    @property
    def uri(self):
        return f"etcd://{self.endpoint}"

    def start(self, timeout=30.0):
        client = f"http://{self.endpoint}"
        peer = f"http://{self.host}:{self.peer_port}"
        args = [ETCD, "--name", "dyad-test", "--data-dir", self.data,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"dyad-test={peer}", "--log-level", "warn"]
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        self.proc = subprocess.Popen(self.prefix + args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)
        self.wait_healthy(timeout)

    def ctl(self, *args, check=True, timeout=30):
        return subprocess.run(self.prefix + ["etcdctl", "--endpoints", self.endpoint, *args], capture_output=True,
                              text=True, check=check, timeout=timeout, env=dict(os.environ, ETCDCTL_API="3"))

    def wait_healthy(self, timeout=30.0):
        def healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log}")
            return self.ctl("endpoint", "health", check=False, timeout=10).returncode == 0
        wait_for(healthy, timeout, what=f"etcd healthy on {self.endpoint}", interval=0.1)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self):
        self.stop()
        self.start()

    def cleanup(self):
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
