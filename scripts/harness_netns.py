# SPDX-License-Identifier: Apache-2.0
"""Simulated nodes as Linux network namespaces joined by veth pairs on a
bridge (scripts/harness.py re-exports all of it)."""
import os
import re
import shutil
import signal
import subprocess

from harness_base import _live, wait_for


class NetnsUnavailable(OSError):
    """Network namespaces cannot be made here (not root, no iproute2, no
    CAP_NET_ADMIN/CAP_SYS_ADMIN); the message says which."""


# Names of everything NetnsNetwork creates: the pid of the creating process and
# a letter per network of that process, so that leftovers of a killed run are
# recognized (their pid is gone) and never confused with another live run's.
# Interface names stay within IFNAMSIZ (15 characters).
_NS_RE = re.compile(r"^dyadh-(\d+)-[a-z]-(?:n\d+|node\d+|etcd\d*)$")
_LINK_RE = re.compile(r"^dyh[bv](\d+)[a-z]\d*$")
_letters = iter(())


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _pid_alive(pid):
    """Whether process `pid` runs (a zombie does not: its parent may be gone
    and nobody reaps it)."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_namespace_processes(ns):
    """SIGKILLs the processes inside namespace `ns` (one the harness made)."""
    r = _ip("netns", "pids", ns, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def remove_leftover_namespaces():
    """Removes the namespaces and bridges that a harness run left behind when
    it was killed (SIGKILL, a ctest timeout): only names of the harness's own
    pattern whose creating process is gone, with the processes inside them."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = _NS_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _LINK_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("link", "del", name, check=False)


def netns_unavailable_reason():
    """None where the harness can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed (scripts/install-deps.sh)"
    return None


class NetnsNetwork:
    """Network namespaces joined by veth pairs on a bridge, on a private /24
    of 10.213.0.0/16 that no interface of this machine uses: the bridge
    (in the initial namespace) has .254, the namespaces .1, .2, ... in the
    order of `members`. Nothing routes out of it: the namespaces have no
    default route and only their own loopback besides. remove() (also run
    at exit, and for leftovers of killed runs by remove_leftover_namespaces)
    kills what still runs inside and deletes all of it."""

    def __init__(self, members):
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        remove_leftover_namespaces()
        global _letters
        self.namespaces = {}  # member -> namespace name
        self.hosts = {}  # member -> address
        self.links = {}  # member -> its veth's end on the bridge (set down: the member is cut off)
        self.bridge = None
        _live.add(self)
        try:
            letter = next(_letters, None)
            if letter is None:
                _letters = iter("abcdefghijklmnopqrstuvwxyz")
                letter = next(_letters)
            tag = f"{os.getpid()}{letter}"
            subnet = self._free_subnet()
            self.bridge = f"dyhb{tag}"
            self._setup(tag, subnet, members)
        except subprocess.CalledProcessError as e:
            self.remove()
            raise NetnsUnavailable(f"cannot make network namespaces: `{' '.join(e.cmd)}` failed: "
                                   f"{(e.stderr or '').strip()}") from e
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def _free_subnet():
        used = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", "show", "table", "all",
                                                                          check=False).stdout
        start = os.getpid() % 250
        for k in range(250):
            x = 1 + (start + k) % 250
            if f"10.213.{x}." not in used:
                return x
        raise NetnsUnavailable("every 10.213.X.0/24 test subnet is in use on this machine")

    def _setup(self, tag, subnet, members):
        _ip("link", "add", self.bridge, "type", "bridge")
        self.bridge_address = f"10.213.{subnet}.254"  # the initial namespace's address on the bridge
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, member in enumerate(members):
            ns = f"dyadh-{tag[:-1]}-{tag[-1]}-{member}"
            _ip("netns", "add", ns)
            self.namespaces[member] = ns
            host_if = f"dyhv{tag}{i}"
            _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_if, "master", self.bridge)
            _ip("link", "set", host_if, "up")
            self.links[member] = host_if
            addr = f"10.213.{subnet}.{i + 1}"
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self.hosts[member] = addr

    def prefix(self, member):
        """The command prefix that runs a program inside `member`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[member]]

    def set_link(self, member, up):
        """Cuts `member` off the bridge (up=False: its veth's bridge end
        down, so its packets go nowhere, as a failed link or switch port)
        or joins it again."""
        _ip("link", "set", self.links[member], "up" if up else "down")

    def _quiet(self):
        """True when no TCP connection in the namespaces is open or closing:
        a socket still closing when its namespace goes (its peer's namespace
        gone first) keeps that namespace, and its veth, alive for minutes."""
        for ns in self.namespaces.values():
            r = _ip("netns", "exec", ns, "ss", "-Htan", "state", "connected", "exclude", "time-wait", check=False)
            if r.returncode == 0 and r.stdout.strip():
                return False
        return True

    def remove(self):
        for ns in self.namespaces.values():
            _kill_namespace_processes(ns)
        if self.namespaces:
            try:
                wait_for(self._quiet, 10.0, what="the namespaces' TCP connections to close", interval=0.05)
            except TimeoutError as e:
                print(f"harness: {e}; removing the namespaces anyway")
        for ns in self.namespaces.values():
            _ip("netns", "del", ns, check=False)
        self.namespaces = {}
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)  # its veths went with their namespaces
            self.bridge = None
        _live.discard(self)
