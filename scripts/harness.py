# SPDX-License-Identifier: Apache-2.0
"""Starts real dyadd services as simulated nodes and runs the dyad tool.

Used by the demo, the integration tests and the benchmarks. Each node is a
dyadd with its own loopback address (127.0.0.N), or its own network namespace
(Cluster(netns=True)), and its own directory; the first node hosts the
metadata store, the others use it (--kvs), or an etcd started here holds it
(Cluster(store="etcd")).
"""
import atexit
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DYAD_BUILD_DIR", os.path.join(ROOT, "build"))
DYADD = os.path.join(BUILD, "bin", "dyadd")
DYAD = os.path.join(BUILD, "bin", "dyad")


@functools.lru_cache(maxsize=None)
def dyadd_help():
    """dyadd --help of this build: tests detect features in it ('etcd://')."""
    return subprocess.run([DYADD, "--help"], capture_output=True, text=True, timeout=60).stdout


def built_transports():
    """Names of the transports this build has (`dyad --json config`)."""
    cfg = json.loads(subprocess.run([DYAD, "--json", "config"], capture_output=True, text=True, check=True).stdout)
    return [t["name"] for t in cfg["transports_built"]]



# The ground floor, the namespaces and etcd live in their own files; the
# tests use them through this module.
from harness_base import (  # noqa: E402,F401
    ETCD, ETCDCTL, _ephemeral_low, _live, free_port, rss_kib, stop_process, wait_for, wait_listening)
from harness_netns import (  # noqa: E402,F401
    NetnsNetwork, NetnsUnavailable, _ip, _kill_namespace_processes, _pid_alive, netns_unavailable_reason,
    remove_leftover_namespaces)
from harness_etcd import Etcd, EtcdCluster  # noqa: E402,F401



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
        args += self.cluster.dyadd_args + list(extra_args)
        self.log = open(self.log_path, "ab")
        ranks = ("SLURM_NODEID", "FLUX_TASK_RANK", "PMIX_RANK")  # ranks come from the test
        env = {**{k: v for k, v in os.environ.items() if k not in ranks}, **self.extra_env}
        self.proc = subprocess.Popen(self.prefix + args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_listening(self.host, self.port, proc=self.proc)
            if self.socket:  # dyadd binds it before its TCP port; make sure anyway
                wait_for(lambda: os.path.exists(self.socket), 10.0, what=f"{self.socket} to appear")

            # dyadd listens once it has registered in its store and is ready; its answer to a
            # status says so (and checks the socket), and when UCX and libfabric are set up too.
            def answers():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"dyadd exited with {self.proc.returncode} during its start")
                p = self.dyad("--json", "service", "status", check=False, timeout=30)
                return p.returncode == 0 and not json.loads(p.stdout).get("transports_starting")

            wait_for(answers, 30.0, what=f"{self.name}'s service to answer")
        except RuntimeError as e:  # it exited: say why
            self.log.flush()
            with open(self.log_path, errors="replace") as f:
                tail = "".join(f.readlines()[-5:])
            raise RuntimeError(f"{self.name}: {e}; last lines of {self.log_path}:\n{tail}") from None
        return self

    def stop(self, sig=signal.SIGTERM, timeout=10):
        rc = stop_process(self.proc, sig, timeout)
        self.proc = None
        return rc

    def kill(self):
        return self.stop(signal.SIGKILL)

    @property
    def member(self):
        return f"n{self.index}"

    def set_link(self, up):
        """Cuts this node's network link (up=False) or restores it; needs a
        cluster of namespaces (the service and its processes keep running)."""
        if not self.cluster.net:
            raise RuntimeError(f"{self.name} has no link of its own to cut: the cluster runs on loopback")
        self.cluster.net.set_link(self.member, up)

    def fd_count(self):
        """Open descriptors of this node's running dyadd (None: not running)."""
        if not self.proc or self.proc.poll() is not None:
            return None
        try:
            return len(os.listdir(f"/proc/{self.service_pid()}/fd"))
        except OSError:
            return None

    def service_pid(self):
        """The dyadd's pid (the process `ip netns exec` became: it execs)."""
        return self.proc.pid

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

    def dyad(self, *args, check=True, timeout=240, env_extra=None, **kw):
        """Runs the dyad tool as a process of this node. One that outlives
        `timeout` gets SIGTERM (its last line says what it waited for) and
        fails the test with its stderr and the tail of every service's log."""
        env = self.env(**(env_extra or {}))
        with subprocess.Popen(self.prefix + [DYAD, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, **kw) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    _, err = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                raise AssertionError(self.hung(args, timeout, err)) from None
        p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and p.returncode != 0:
            raise RuntimeError(f"dyad {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def hung(self, args, timeout, stderr):
        """What a dyad command that did not end within `timeout` s printed,
        and the last lines of every service of the cluster."""
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
        text = [f"dyad {' '.join(map(str, args))} on {self.name} still ran after {timeout} s; its stderr:",
                stderr or "(nothing)"]
        for n in getattr(self.cluster, "nodes", []):
            log = getattr(n, "log_path", None)
            if log and os.path.exists(log):
                with open(log, errors="replace") as f:
                    text.append(f"--- last lines of {log}:\n" + "".join(f.readlines()[-30:]))
        return "\n".join(text)

    def dyad_async(self, *args, env_extra=None):
        env = self.env(**(env_extra or {}))
        return subprocess.Popen(self.prefix + [DYAD, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def path(self, rel):
        return os.path.join(self.dir, rel)

    def produce_text(self, rel, text):
        """Writes `text` to `rel` beneath this node's directory and publishes it."""
        path = self.path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        self.dyad("produce", path)

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
        if not self.kvs_uri or self.kvs_uri.startswith("etcd://"):
            return self  # with etcd: the service that watches for this node's consumers
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
            st = host.status()
            # The embedded store's host: store.waiters; with etcd each service
            # reports the consumers its watch serves: metadata_store.waiters.
            for section in ("store", "metadata_store"):
                if isinstance(st.get(section), dict) and "waiters" in st[section]:
                    w = st[section]["waiters"]
                    break
            else:
                raise RuntimeError(f"{host.name}'s service status has no store.waiters nor metadata_store.waiters "
                                   f"(metadata store {host.kvs_uri or 'embedded'}): it cannot tell who waits")
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
    """N simulated nodes.

    netns: False: node i is a dyadd on loopback address 127.0.0.(i+1).
    True: each node is a Linux network namespace joined to the others by a
    veth pair on a bridge (NetnsNetwork); where namespaces cannot be made
    (not root, no ip), it falls back to loopback addresses (self.mode says
    which). "require": namespaces or NetnsUnavailable.

    store: "embedded": node0's dyadd hosts the metadata store, the others use
    it (--kvs tcp://NODE0). "etcd": an etcd of its own (self.etcd; in a
    namespace of its own with netns) holds it, every dyadd uses --kvs
    etcd://HOST:PORT. etcd_members: with store="etcd", an etcd cluster of
    that many members (EtcdCluster, each in a namespace of its own; every
    dyadd gets all their endpoints). dyadd_args go to every dyadd."""

    def __init__(self, nodes=2, root=None, start=True, netns=False, env=None, auth=True, store="embedded",
                 dyadd_args=(), kvs=None, etcd_members=1):
        """auth: the services and their clients share a job key (made here
        with `dyad keygen`); False runs them without one (loopback only).
        kvs: a store every node uses (etcd://..., e.g. a standalone Etcd's
        uri) instead of node0's or the cluster's own etcd."""
        if store not in ("embedded", "etcd"):
            raise ValueError(f"store must be 'embedded' or 'etcd', not {store!r}")
        if kvs and store == "etcd":
            raise ValueError("store='etcd' starts the cluster's own etcd: give no kvs with it")
        if etcd_members < 1 or (etcd_members > 1 and store != "etcd"):
            raise ValueError("etcd_members: 1, or several with store='etcd'")
        self.etcd_members = etcd_members
        self.shared_kvs = kvs
        self.root = root or tempfile.mkdtemp(prefix="dyad-cluster-")
        self.key = None
        self.store = store
        self.dyadd_args = list(dyadd_args)
        self.nodes = []
        self.net = None
        self.etcd = None
        self.mode = "loopback"
        _live.add(self)
        try:
            self._build(nodes, start, netns, env, auth)
        except BaseException:
            self.cleanup()
            raise

    def _build(self, nodes, start, netns, env, auth):
        if auth:
            self.key = os.path.join(self.root, "job.key")
            subprocess.run([DYAD, "keygen", self.key], check=True, capture_output=True)
            env = dict(env or {}, DYAD_AUTH_KEY_FILE=self.key)
        etcds = []
        if self.store == "etcd":
            etcds = ["etcd"] if self.etcd_members == 1 else [f"etcd{k}" for k in range(self.etcd_members)]
        members = [f"n{i}" for i in range(nodes)] + etcds
        hosts = {m: f"127.0.0.{i + 1}" for i, m in enumerate(members)}
        for k, m in enumerate(etcds):
            hosts[m] = "127.0.0.1" if len(etcds) == 1 else f"127.0.1.{k + 1}"
        if netns:
            try:
                self.net = NetnsNetwork(members)
                hosts = self.net.hosts
                self.mode = "netns"
            except NetnsUnavailable as e:
                if netns == "require":
                    raise
                print(f"harness: network namespaces unavailable ({e}); using loopback addresses")
        taken = set()

        def port(host):
            # distinct within the cluster: etcd and a dyadd may share a host
            while True:
                p = free_port("127.0.0.1" if self.mode == "netns" else host)
                if p not in taken:
                    taken.add(p)
                    return p

        if self.store == "etcd" and len(etcds) == 1:
            self.etcd = Etcd(self.root, hosts["etcd"], prefix=self.net.prefix("etcd") if self.net else (),
                             port=port(hosts["etcd"]), peer_port=port(hosts["etcd"]), start=False)
        elif self.store == "etcd":
            self.etcd = EtcdCluster(self.root, {m: (hosts[m], self.net.prefix(m) if self.net else (), port(hosts[m]),
                                                    port(hosts[m])) for m in etcds})
        kvs = self.etcd.uri if self.etcd else self.shared_kvs
        for i in range(nodes):
            host = hosts[f"n{i}"]
            d = os.path.join(self.root, f"node{i}")
            os.makedirs(d, exist_ok=True)
            n = Node(self, i, f"node{i}", host, port(host), d, kvs, env)
            sock = os.path.join(self.root, f"node{i}.sock")
            if len(sock.encode()) < 100:  # sun_path holds 107 bytes
                n.socket = sock
            if self.net:
                n.prefix = self.net.prefix(f"n{i}")
            self.nodes.append(n)
            if kvs is None:
                kvs = n.uri
        if start:
            if self.etcd:
                self.etcd.start()
            elif not self.shared_kvs:  # node0 hosts the store: it runs before the others register
                self.nodes[0].start()
            self.start_nodes(n for n in self.nodes if n.proc is None)

    def start_nodes(self, nodes, workers=8):
        """Starts the services of `nodes`: one after the other up to 16 (the
        store then gives node i rank i, as tests expect), else 8 at a time
        (each start waits for its service to answer; ranks come in any
        order). The first failure is raised."""
        nodes = list(nodes)
        if len(nodes) <= 16:
            for n in nodes:
                n.start()
            return
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(nodes))) as pool:
            for f in [pool.submit(n.start) for n in nodes]:
                f.result()

    @property
    def namespaces(self):
        return list(self.net.namespaces.values()) if self.net else []

    def __getitem__(self, i):
        return self.nodes[i]

    def stop(self):
        for n in reversed(self.nodes):
            n.stop()
        if self.etcd:
            self.etcd.stop()  # its data goes with the cluster's directory

    def cleanup(self):
        """Stops every process of the cluster, removes its namespaces and
        its directory. Idempotent; also run at exit for clusters a test left."""
        try:
            self.stop()
        finally:
            if self.net:
                self.net.remove()
            _live.discard(self)
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


@atexit.register
def _cleanup_live():
    for thing in list(_live):
        try:
            if isinstance(thing, NetnsNetwork):
                thing.remove()
            else:
                thing.cleanup()
        except Exception as e:  # keep cleaning the others
            print(f"harness: cleanup at exit: {e}")


@contextlib.contextmanager
def small_tmpfs(path, size="8m"):
    """A tmpfs of `size` mounted on `path` (created) while the block runs,
    for tests of a full consumer directory; the test is skipped where this
    process may not mount."""
    os.makedirs(path, exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    if m.returncode != 0:
        import pytest
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


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
