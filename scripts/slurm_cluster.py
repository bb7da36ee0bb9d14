# SPDX-License-Identifier: Apache-2.0
"""A real Slurm cluster on one machine (tests/slurm).

Each node is a network namespace (harness.NetnsNetwork) plus a mount
namespace of its own in which /tmp, /dev/shm and /etc/hosts are the node's:
node-local storage that no other node sees, and node names that resolve to
the nodes' addresses, as on a real cluster. slurmd runs in both through
`nsenter --net=... --mount=...` (never `ip netns exec`, which remounts /sys:
see the reference notes on Slurm on one machine), munged with its own
socket and key, slurmctld in the root namespace on the bridge's address.
Nothing of the distribution's munge/Slurm services is used or started.

cleanup() (also at exit) stops every daemon, kills what still runs in the
namespaces, unmounts and removes everything, whatever state a test left.
"""
import atexit
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import harness

SBIN = ("/usr/sbin", "/usr/bin")
SPANK = os.path.join(harness.BUILD, "lib", "dyad_spank.so")
WRAPPER = os.path.join(harness.BUILD, "lib", "libdyad_wrapper.so")


def _which(name):
    for d in SBIN:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def unavailable_reason():
    """None where a Slurm cluster can run here, else why not."""
    reason = harness.netns_unavailable_reason()
    if reason:
        return reason
    for prog in ("slurmctld", "slurmd", "munged", "sbatch", "srun", "unshare", "nsenter"):
        if not _which(prog):
            return f"{prog} is not installed (scripts/install-deps.sh installs Slurm and munge)"
    if not os.path.exists(SPANK):
        return f"{SPANK} was not built (no <slurm/spank.h> at configure time: libslurm-dev)"
    return None


def _run(args, check=True, **kw):
    return subprocess.run(args, check=check, capture_output=True, text=True, **kw)


def _under_tmp(paths):
    """Those of `paths` (resolved) that lie under /tmp, none inside another."""
    found = sorted({os.path.realpath(p) for p in paths if os.path.realpath(p).startswith("/tmp/")})
    return [p for p in found if not any(p != q and p.startswith(q + "/") for q in found)]


class SlurmCluster:
    def __init__(self, nodes=4, plugstack_args=()):
        base = os.path.join(harness.BUILD, "slurm-test")  # not under /tmp: every node has its own /tmp
        os.makedirs(base, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base)
        os.chmod(self.root, 0o755)
        self.names = [f"node{i + 1}" for i in range(nodes)]
        self.net = None
        self.mnt = os.path.join(self.root, "mnt")
        self.mnt_mounted = False
        self.node_mounts = []
        self.procs = {}
        self.logs = []
        self.conf = os.path.join(self.root, "slurm.conf")
        self.plugstack_args = list(plugstack_args)
        _live.add(self)
        try:
            self._build()
        except BaseException:
            self.cleanup()
            raise

    # -- nodes ---------------------------------------------------------
    def _build(self):
        self.net = harness.NetnsNetwork(self.names)
        hosts = os.path.join(self.root, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for n in self.names:
                f.write(f"{self.net.hosts[n]} {n}\n")
        os.chmod(hosts, 0o644)
        os.makedirs(self.mnt)
        _run(["mount", "--bind", self.mnt, self.mnt])
        self.mnt_mounted = True
        _run(["mount", "--make-private", self.mnt])
        for n in self.names:
            tmp = self.node_tmp(n)
            os.makedirs(tmp)
            os.chmod(tmp, 0o1777)
            ns_file = os.path.join(self.mnt, n)
            open(ns_file, "w").close()
            # A checkout under /tmp (a CI clone) would vanish behind the
            # node's own /tmp, and with it dyadd, the plugin and this
            # cluster's files: it is bound into the node's /tmp at its path.
            keep = ""
            for path in _under_tmp([harness.ROOT, harness.BUILD]):
                inner = os.path.join(tmp, os.path.relpath(path, "/tmp"))
                os.makedirs(inner, exist_ok=True)
                keep += f"mount --bind {shlex.quote(path)} {shlex.quote(inner)} && "
            _run(["unshare", f"--mount={ns_file}", "--propagation", "private", "sh", "-c",
                  f"mount --bind {hosts} /etc/hosts && {keep}mount --rbind {tmp} /tmp && "
                  "mount -t tmpfs -o size=64m,mode=1777 dyad-test-shm /dev/shm"])
            self.node_mounts.append(ns_file)
        self._munge()
        self._slurm_conf()
        self._start_daemons()

    def node_tmp(self, node):
        """The node's /tmp, as seen from outside its namespaces."""
        return os.path.join(self.root, node, "tmp")

    def prefix(self, node):
        """Runs a command on `node` (its network and mount namespaces)."""
        return ["nsenter", f"--net=/run/netns/{self.net.namespaces[node]}", f"--mount={os.path.join(self.mnt, node)}"]

    def launcher_template(self):
        """`dyad job start --launcher` for these nodes ({host} is the node)."""
        ns = self.net.namespaces[self.names[0]]
        ns_prefix = ns[: -len(self.names[0])]
        return f"nsenter --net=/run/netns/{ns_prefix}{{host}} --mount={self.mnt}/{{host}}"

    def on(self, node, args, check=True, timeout=60, env=None, **kw):
        return subprocess.run(self.prefix(node) + list(args), check=check, capture_output=True, text=True,
                              timeout=timeout, env=env, **kw)

    # -- munge and Slurm -------------------------------------------------
    def _munge(self):
        d = os.path.join(self.root, "munge")
        os.makedirs(d)
        os.chmod(d, 0o755)  # "Socket is inaccessible: execute permissions for all required"
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = os.path.join(d, "munge.sock")
        log = os.path.join(d, "munged.log")
        self.logs.append(log)
        _run([_which("munged"), "--socket", self.munge_socket, "--key-file", key, "--pid-file",
              os.path.join(d, "munged.pid"), "--log-file", log, "--seed-file", os.path.join(d, "seed"), "--force"])
        self.munge_pidfile = os.path.join(d, "munged.pid")
        harness.wait_for(lambda: os.path.exists(self.munge_socket), 10, what="munged's socket")
        # The DYAD site secret of the SPANK plugin (root only, on every node).
        self.site_key = os.path.join(self.root, "dyad-site.key")
        _run([harness.DYAD, "keygen", self.site_key])
        os.chmod(self.site_key, 0o400)

    def _slurm_conf(self):
        ctl_host = socket.gethostname()
        ctl_addr = self.net.bridge_address
        self.ctl_port = harness.free_port(ctl_addr)
        d = self.root
        for sub in ["state", "log", "run"] + [f"spool/{n}" for n in self.names]:
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        addrs = ",".join(self.net.hosts[n] for n in self.names)
        plugstack = os.path.join(d, "plugstack.conf")
        with open(plugstack, "w") as f:
            f.write(" ".join(["required", SPANK, f"site_key={self.site_key}"] + self.plugstack_args) + "\n")
        conf = f"""ClusterName=dyadtest
SlurmctldHost={ctl_host}({ctl_addr})
SlurmctldPort={self.ctl_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmdDebug=info
SlurmctldDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
PrologFlags=Alloc
PlugStackConfig={plugstack}
KillWait=2
MinJobAge=5
InactiveLimit=0
SlurmdTimeout=30
SchedulerType=sched/backfill
NodeName=node[1-{len(self.names)}] NodeAddr={addrs} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=node[1-{len(self.names)}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""
        with open(self.conf, "w") as f:
            f.write(conf)
        self.logs += [f"{d}/log/slurmctld.log"] + [f"{d}/log/slurmd-{n}.log" for n in self.names]

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DYAD_"))}
        e["SLURM_CONF"] = self.conf
        e.update(extra)
        return e

    def _start_daemons(self):
        log = open(os.path.join(self.root, "log", "daemons.out"), "ab")
        self.procs["slurmctld"] = subprocess.Popen([_which("slurmctld"), "-D", "-c", "-i", "-f", self.conf],
                                                   stdout=log, stderr=subprocess.STDOUT, env=self.env())
        harness.wait_listening(self.net.bridge_address, self.ctl_port, timeout=30,
                               proc=self.procs["slurmctld"], what="slurmctld")
        for n in self.names:
            self.procs[n] = subprocess.Popen(self.prefix(n) + [_which("slurmd"), "-D", "-f", self.conf, "-N", n],
                                             stdout=log, stderr=subprocess.STDOUT, env=self.env())

        def idle():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see {self.root}/log")
            r = self.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return len(states) == len(self.names) and all(s == "idle" for s in states.values())

        harness.wait_for(idle, 60, what="every node idle (sinfo)", interval=0.1)

    def cmd(self, *args, check=True, timeout=60, **kw):
        """A Slurm command (sbatch, srun, squeue...) from the root namespace."""
        env = kw.pop("env", None) or self.env()
        # A job's default output (slurm-N.out) lands in the submitting
        # directory: the cluster's own, never the checkout's.
        kw.setdefault("cwd", self.root)
        return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=timeout, env=env, **kw)

    # -- jobs ------------------------------------------------------------
    def job_state(self, job):
        r = self.cmd("scontrol", "-o", "show", "job", str(job), check=False)
        for word in r.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "GONE"

    def wait_job_done(self, job, timeout=60):
        """Until the job has ended and its epilog has run on every node
        (no node COMPLETING). Returns the final state."""
        final = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE"}

        def done():
            st = self.job_state(job)
            if st not in final:
                return None
            r = self.cmd("sinfo", "-h", "-N", "-o", "%t", check=False)
            if any("comp" in s for s in r.stdout.split()):
                return None
            return st

        return harness.wait_for(done, timeout, what=f"job {job} to end and its epilog to finish", interval=0.05)

    def job_dir(self, node, job, uid=0):
        """The --dyad job's directory on `node`, seen from outside (the SPANK
        plugin's PARENT/UID/JOBID, PARENT /tmp/dyad)."""
        return os.path.join(self.node_tmp(node), "dyad", str(uid), str(job))

    def record(self, job, node):
        """The plugin's record of a --dyad job on `node` (root's), as a dict."""
        with open(os.path.join(self.node_tmp(node), "dyad", f"job-{job}")) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)

    def leftovers(self, job):
        """What the job left on any node: dyadd processes, its directory (of
        `dyad job start`, or of the plugin, with its record), files in the
        node's /dev/shm."""
        left = []
        for n in self.names:
            tmp = self.node_tmp(n)
            found = [os.path.join(tmp, f"dyad-{job}"), os.path.join(tmp, "dyad", f"job-{job}")]
            if os.path.isdir(os.path.join(tmp, "dyad")) and not os.path.islink(os.path.join(tmp, "dyad")):
                found += [os.path.join(tmp, "dyad", u, str(job)) for u in os.listdir(os.path.join(tmp, "dyad"))]
            for d in found:
                if os.path.lexists(d):
                    left.append(f"{n}: {d} ({os.listdir(d) if os.path.isdir(d) else 'file'})")
            shm = self.on(n, ["ls", "-A", "/dev/shm"], check=False).stdout.split()
            if shm:
                left.append(f"{n}: /dev/shm holds {shm}")
        for ns in self.net.namespaces.values():
            for pid in harness._ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    continue
                if comm.startswith("dyad"):
                    left.append(f"{ns}: process {pid} {comm}")
        return left

    def processes(self, node, name="dyadd"):
        """[(pid, uid)] of the processes called `name` on `node` (its
        network namespace: ps would list every namespace's)."""
        found = []
        for pid in harness._ip("netns", "pids", self.net.namespaces[node], check=False).stdout.split():
            try:
                with open(f"/proc/{pid}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if fields.get("Name", "").strip() == name:
                found.append((int(pid), int(fields["Uid"].split()[0])))
        return found

    def tail_logs(self, lines=30):
        out = []
        for path in self.logs:
            try:
                with open(path, errors="replace") as f:
                    out.append(f"--- {path}\n" + "".join(f.readlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)

    # -- teardown --------------------------------------------------------
    def cleanup(self):
        try:
            if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
                self.cmd("scancel", "--quiet", "-u", "root", check=False, timeout=10)
        except Exception:
            pass
        for name in list(self.procs):
            if name != "slurmctld":
                harness.stop_process(self.procs.pop(name), timeout=5)
        if "slurmctld" in self.procs:
            harness.stop_process(self.procs.pop("slurmctld"), timeout=5)
        try:
            with open(self.munge_pidfile) as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
        except (OSError, ValueError, AttributeError):
            pass
        if self.net:
            self.net.remove()  # kills whatever still runs in the namespaces (dyadds, steps)
            self.net = None
        for ns_file in self.node_mounts:
            subprocess.run(["umount", ns_file], capture_output=True)
        self.node_mounts = []
        if self.mnt_mounted:
            subprocess.run(["umount", self.mnt], capture_output=True)
            self.mnt_mounted = False
        shutil.rmtree(self.root, ignore_errors=True)
        _live.discard(self)


_live = set()


@atexit.register
def _cleanup_live():
    for c in list(_live):
        try:
            c.cleanup()
        except Exception as e:  # keep cleaning the others
            print(f"slurm_cluster: cleanup at exit: {e}")
