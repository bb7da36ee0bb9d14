# SPDX-License-Identifier: Apache-2.0
"""A real GlusterFS volume for the workflow bench: served from a network
namespace of its own, FUSE-mounted on every node of a harness cluster.

The server: `glusterd -N` (foreground, no system service) inside the server
namespace and inside a private mount namespace whose /var/lib/glusterd,
/var/log/glusterfs and /run are directories of this run (so it shares no
state with the machine nor with another run), one brick on the disk under
the run's directory. Each node mounts the volume with the glusterfs FUSE
client running in that node's network namespace (`nsenter --net`): its
traffic crosses the node's veth to the server like a remote mount's. The
mount point is in the initial mount namespace, so every program of that
node (started with the node's `ip netns exec` prefix) sees it.

Debian 12's glusterfs-server and glusterfs-client (scripts/install-deps.sh,
which leaves their services disabled). unavailable_reason() says why the
volume cannot start here (not root, no /dev/fuse, packages missing).
"""
import atexit
import os
import shutil
import signal
import subprocess
import time

GLUSTERD = shutil.which("glusterd") or "/usr/sbin/glusterd"
GLUSTER = shutil.which("gluster") or "/usr/sbin/gluster"
MOUNT_HELPER = "/sbin/mount.glusterfs"
VOLUME = "wfvol"
_live = set()  # volumes not stopped yet: stopped at exit (before the harness removes the namespaces)


@atexit.register
def _stop_live():
    for v in list(_live):
        try:
            v.stop()
        except Exception as e:  # keep stopping the others
            print(f"gluster: stop at exit: {e}")


def unavailable_reason():
    """None where a volume can be served and mounted here, else why not."""
    if os.geteuid() != 0:
        return f"GlusterFS needs root (running as uid {os.geteuid()})"
    for prog, pkg in ((GLUSTERD, "glusterfs-server"), (GLUSTER, "glusterfs-server"),
                      (MOUNT_HELPER, "glusterfs-client")):
        if not os.access(prog, os.X_OK):
            return f"{prog} is missing: install {pkg} (make deps, scripts/install-deps.sh)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: the GlusterFS client mounts through FUSE"
    for prog in ("nsenter", "unshare"):
        if shutil.which(prog) is None:
            return f"{prog} (util-linux) is missing"
    return None


def _wait(pred, timeout, what, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = pred()
        except Exception as e:  # keep polling; say the last error at the deadline
            last, r = e, None
        if r:
            return r
        time.sleep(interval)
    raise TimeoutError(f"GlusterFS: {what} within {timeout:.0f} s" + (f" (last error: {last})" if last else ""))


class Volume:
    """serve(netns_name, address) then mount(node) for each node; stop()
    unmounts everything and stops the server (also on errors, idempotent).

    root: a directory of this run (brick, state, logs, mount points)."""

    def __init__(self, root, server_netns, server_address):
        self.root = os.path.abspath(root)
        self.netns = server_netns
        self.address = server_address
        self.state = os.path.join(self.root, "gluster-state")
        self.brick = os.path.join(self.root, "gluster-brick")
        self.logs = os.path.join(self.root, "gluster-logs")
        self.run = os.path.join(self.root, "gluster-run")
        self.glusterd = None
        self.mounts = {}  # node name -> mount point
        self.started = False
        _live.add(self)

    def _ns(self):
        return ["nsenter", f"--net=/run/netns/{self.netns}"]

    def cli(self, *args, check=True, timeout=60):
        """The gluster CLI inside glusterd's mount and network namespaces."""
        cmd = ["nsenter", "-t", str(self.glusterd.pid), "-m", "-n", GLUSTER, "--mode=script", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"GlusterFS: `gluster {' '.join(args)}` failed ({p.returncode}): "
                               f"{(p.stderr or p.stdout).strip()}; glusterd's log: {self.logs}")
        return p

    def serve(self):
        for d in (self.state, self.brick, self.logs, self.run):
            os.makedirs(d, exist_ok=True)
        # A private mount namespace: our state, logs and sockets over the
        # system's paths, seen by glusterd and the brick processes it forks.
        script = (f"mount --bind {self.state} /var/lib/glusterd && "
                  f"mount --bind {self.logs} /var/log/glusterfs && "
                  f"mount --bind {self.run} /run && "
                  f"exec {GLUSTERD} -N --log-file={os.path.join(self.logs, 'glusterd.log')}")
        self._glusterd_log = open(os.path.join(self.logs, "glusterd.out"), "ab")
        self.glusterd = subprocess.Popen(self._ns() + ["unshare", "-m", "--propagation", "private",
                                                       "sh", "-c", script],
                                         stdout=self._glusterd_log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def up():
            if self.glusterd.poll() is not None:
                raise RuntimeError(f"glusterd exited with {self.glusterd.returncode}: see {self.logs}")
            return self.cli("volume", "list", check=False).returncode == 0

        try:
            _wait(up, 30, "glusterd to answer")
        except RuntimeError as e:
            raise RuntimeError(f"GlusterFS: {e}") from None
        self.cli("volume", "create", VOLUME, f"{self.address}:{self.brick}", "force")
        self.cli("volume", "start", VOLUME)
        self.started = True
        return self

    def mount(self, name, netns):
        """Mounts the volume for node `name` with its client in `netns`;
        returns the mount point."""
        mnt = os.path.join(self.root, f"gluster-mnt-{name}")
        os.makedirs(mnt, exist_ok=True)
        log = os.path.join(self.logs, f"client-{name}.log")
        p = subprocess.run(["nsenter", f"--net=/run/netns/{netns}", "mount", "-t", "glusterfs",
                            "-o", f"log-file={log}", f"{self.address}:/{VOLUME}", mnt],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"GlusterFS: mounting {self.address}:/{VOLUME} on {mnt} for {name} failed: "
                               f"{(p.stderr or p.stdout).strip()}; see {log}")
        self.mounts[name] = mnt
        _wait(lambda: os.path.ismount(mnt), 20, f"{mnt} to be mounted")
        return mnt

    def stop(self):
        for name, mnt in list(self.mounts.items()):
            subprocess.run(["umount", mnt], capture_output=True, timeout=60)
            if os.path.ismount(mnt):
                subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=60)
            del self.mounts[name]
        if self.glusterd is not None and self.glusterd.poll() is None:
            if self.started:
                self.cli("volume", "stop", VOLUME, "force", check=False)
                self.started = False
            # glusterd and the bricks it forked are in its session: end them all.
            try:
                os.killpg(self.glusterd.pid, signal.SIGTERM)
                self.glusterd.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(self.glusterd.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.glusterd.wait()
        self.glusterd = None
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
