# SPDX-License-Identifier: Apache-2.0
"""What a benchmarked method costs besides wall time: CPU seconds and context
switches of every process it runs, and (in separate, untimed rounds) its
system calls counted by `strace -f -c`.

- A child the bench starts is reaped with os.wait4, whose rusage covers the
  child and every descendant it waited for (an rsync daemon's per-connection
  children, a shell's pipeline): `start` + `finish`, or `run_counted`.
- A long-running service (dyadd) is read from /proc before and after:
  utime + stime of the process, and the voluntary + nonvoluntary context
  switches summed over its threads (`proc_usage`).
- `Strace` counts system calls, either of a command it starts (`wrap`, with
  its children: -f) or of a running process and all its threads (`attach`).
  Tracing slows everything down, so traced rounds are never timed.
"""
import collections
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
STRACE = shutil.which("strace")


class Usage(collections.namedtuple("Usage", "cpu_s ctxsw")):
    """CPU seconds (user + system) and context switches (voluntary +
    nonvoluntary) of one or more processes."""

    def __add__(self, other):
        return Usage(self.cpu_s + other.cpu_s, self.ctxsw + other.ctxsw)

    def __sub__(self, other):
        return Usage(self.cpu_s - other.cpu_s, self.ctxsw - other.ctxsw)


ZERO = Usage(0.0, 0)


def rusage_usage(ru):
    return Usage(ru.ru_utime + ru.ru_stime, ru.ru_nvcsw + ru.ru_nivcsw)


def proc_usage(pid):
    """Usage so far of a running process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat)
    ctxsw = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        ctxsw += int(line.split()[1])
        except OSError:
            pass  # a thread that ended meanwhile
    return Usage(cpu, ctxsw)


class Services:
    """Usage of running services (name -> pid) between snapshot() and delta()."""

    def __init__(self, pids):
        self.pids = dict(pids)
        self.before = {}

    def snapshot(self):
        self.before = {name: proc_usage(pid) for name, pid in self.pids.items()}

    def delta(self):
        return {name: proc_usage(pid) - self.before[name] for name, pid in self.pids.items()}


def start(cmd, env=None, stdout=None):
    """Starts cmd with stdout (and stderr) in temporary files unless stdout
    is given (e.g. subprocess.PIPE); reap it with finish()."""
    out = stdout if stdout is not None else tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
    p.out_file = out if stdout is None else None
    p.err_file = err
    return p


def _read(f):
    if f is None:
        return ""
    f.seek(0)
    return f.read().decode(errors="replace")


def finish(p, timeout=600, check=True):
    """Waits for a process of start(); returns (stdout, Usage) of it and its
    waited-for descendants. Killed after `timeout` s. check: raise
    RuntimeError (with its stderr) unless it exited with 0."""
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        _, status, ru = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = _read(p.out_file), _read(p.err_file)
    for f in (p.out_file, p.err_file):
        if f is not None:
            f.close()
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, p.args[:3]))} ... failed ({p.returncode}): {err.strip()[-2000:]}")
    return out, rusage_usage(ru)


def abandon(p):
    """Kills and reaps a process of start() that was not finished (after an
    error); nothing if it was."""
    if p is not None and p.returncode is None:
        p.kill()
        finish(p, timeout=30, check=False)


def run_counted(cmd, env=None, timeout=600):
    """Runs cmd to its end: (wall seconds, stdout, Usage)."""
    t0 = time.perf_counter()
    p = start(cmd, env=env)
    out, usage = finish(p, timeout)
    return time.perf_counter() - t0, out, usage


def wait_children_reaped(pid, timeout=10.0):
    """Waits until process `pid` has no children left (a daemon that reaps
    its per-connection children): only then do they count in its rusage."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                if not f.read().split():
                    return True
        except OSError:
            return True
        time.sleep(0.01)  # the poll interval (untimed: after the measured step)
    return False


# ---------------------------------------------------------------- strace

def parse_strace_summary(text):
    """{syscall: calls} and the total from `strace -c` output."""
    calls, total = {}, 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[3].isdigit():
            continue  # the header, the rules
        if parts[-1] == "total":
            total = int(parts[3])
        else:
            calls[parts[-1]] = int(parts[3])
    return calls, total or sum(calls.values())


class Strace:
    """Syscall counts of one untimed accounting round: wrap() the commands
    the round starts, attach() to the services it uses; counts() after the
    traced processes have ended (attached ones are detached by it)."""

    def __init__(self, directory, label):
        self.dir = tempfile.mkdtemp(prefix=f"strace-{label}-", dir=directory)
        self.outputs = {}  # part -> [summary files]
        self.attached = []  # (part, strace Popen)

    def _out(self, part):
        path = os.path.join(self.dir, f"{part}.{len(self.outputs.get(part, []))}.txt")
        self.outputs.setdefault(part, []).append(path)
        return path

    def wrap(self, part, cmd):
        """cmd run under strace -f -c, counted as `part`."""
        return [STRACE, "-f", "-c", "-S", "calls", "-o", self._out(part), "--", *cmd]

    def attach(self, part, pid, timeout=10.0):
        """Starts counting the calls of running process `pid` (all threads)."""
        err = os.path.join(self.dir, f"{part}.attach.err")
        with open(err, "wb") as ef:
            p = subprocess.Popen([STRACE, "-f", "-c", "-S", "calls", "-o", self._out(part), "-p", str(pid)],
                                 stdout=subprocess.DEVNULL, stderr=ef)
        self.attached.append((part, p))
        deadline = time.monotonic() + timeout
        while True:
            with open(err, errors="replace") as f:
                if "attached" in f.read():
                    return
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"strace could not attach to {part} (pid {pid}); see {err}")
            time.sleep(0.01)  # the poll interval (untimed round)

    def detach(self):
        for _, p in self.attached:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for _, p in self.attached:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.attached = []

    def counts(self):
        """{part: {"syscalls": total, "top": {name: calls} (8 most called)}}."""
        self.detach()
        res = {}
        for part, paths in self.outputs.items():
            merged = collections.Counter()
            for path in paths:
                try:
                    with open(path, errors="replace") as f:
                        calls, _ = parse_strace_summary(f.read())
                except OSError:
                    calls = {}
                merged.update(calls)
            res[part] = {"syscalls": sum(merged.values()), "top": dict(merged.most_common(8))}
        shutil.rmtree(self.dir, ignore_errors=True)
        return res
