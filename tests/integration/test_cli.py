# SPDX-License-Identifier: Apache-2.0
"""The dyad tool and dyadd when something is wrong: fast failures with messages
that name the command, the file, the cause and what to do; exit codes; --json
anywhere; stat formatting; the progress line; stale temporary files."""
import glob
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import harness


@pytest.fixture(scope="module")
def nodes():
    c = harness.Cluster(nodes=2)
    yield c
    c.cleanup()


class FakePeer:
    """A TCP listener that is not a dyadd: `behaviour` is "silent" (accepts,
    never answers), "http" (answers like a web server, then closes),
    "garbage" (sends bytes that are no frame) or "close" (closes at once)."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.uri = f"tcp://127.0.0.1:{self.port}"
        self.conns = []
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.behaviour == "silent":
                self.conns.append(c)  # kept open, never answered
                continue
            try:
                if self.behaviour == "http":
                    c.settimeout(2)
                    c.recv(4096)  # the hello
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                elif self.behaviour == "garbage":
                    c.sendall(bytes(range(7, 71)))
            except OSError:
                pass
            c.close()

    def close(self):
        self.stopped = True
        self.sock.close()
        for c in self.conns:
            c.close()


def client_env(tmp_path, **extra):
    """A client environment without any service behind it."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_") or k == "DYAD_BUILD_DIR"}
    d = tmp_path / "cons"
    d.mkdir(exist_ok=True)
    e.update(DYAD_PATH_CONSUMER=str(d), DYAD_PATH_PRODUCER=str(d))
    e.update({k: str(v) for k, v in extra.items()})
    return e, str(d)


def dyad(*args, env, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run([harness.DYAD, *args], env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


# ---- a peer that is not a DYAD service ----

def test_silent_peer_fails_within_five_seconds(tmp_path):
    peer = FakePeer("silent")
    try:
        env, d = client_env(tmp_path, DYAD_SERVICE_URI=peer.uri)
        p, dt = dyad("stat", f"{d}/x.bin", env=env)
        assert p.returncode == 4, p.stderr
        assert dt < 5, dt
        assert f"dyad stat {d}/x.bin: the service at {peer.uri} did not answer like a DYAD service" in p.stderr
        assert "DYAD_SERVICE_URI" in p.stderr and "DYAD_RC_" not in p.stderr
        # Several files: the first failure ends the command (not one hello per file).
        p, dt = dyad("consume", f"{d}/a.bin", f"{d}/b.bin", f"{d}/c.bin", env=env)
        assert p.returncode == 4 and dt < 5, (dt, p.stderr)
        assert "did not answer like a DYAD service" in p.stderr
        assert "2 more files not attempted" in p.stderr
        p, dt = dyad("service", "status", "--uri", peer.uri, env=env)
        assert p.returncode == 4 and dt < 5 and "did not answer like a DYAD service" in p.stderr, p.stderr
    finally:
        peer.close()


@pytest.mark.parametrize("behaviour,words", [
    ("http", 'it sent "HTTP/1.1 400 Bad Request" instead of a DYAD frame'),
    ("garbage", "instead of a DYAD frame"),
    ("close", "closed the connection during the hello"),
])
def test_peer_that_is_not_dyad(tmp_path, behaviour, words):
    peer = FakePeer(behaviour)
    try:
        env, d = client_env(tmp_path, DYAD_SERVICE_URI=peer.uri)
        p, dt = dyad("consume", f"{d}/x.bin", env=env)
        assert p.returncode == 4, p.stderr
        assert dt < 5, dt
        assert f"the service at {peer.uri} did not answer like a DYAD service" in p.stderr, p.stderr
        assert words in p.stderr, p.stderr
    finally:
        peer.close()


def test_a_real_http_server(tmp_path):
    """Python's http.server waits for the end of a request line that a DYAD
    hello never sends: a silent peer, found out by the hello's deadline."""
    import http.server

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        uri = f"tcp://127.0.0.1:{srv.server_address[1]}"
        env, _ = client_env(tmp_path, DYAD_SERVICE_URI=uri)
        p, dt = dyad("ls", env=env)
        assert p.returncode == 4 and dt < 5, (dt, p.stderr)
        assert f"dyad ls: the service at {uri} did not answer like a DYAD service" in p.stderr, p.stderr
    finally:
        srv.shutdown()
        srv.server_close()


def test_nothing_listening(tmp_path):
    env, d = client_env(tmp_path, DYAD_SERVICE_URI="tcp://127.0.0.1:1")
    p, dt = dyad("consume", f"{d}/x.bin", env=env)
    assert p.returncode == 4 and dt < 5
    assert p.stderr.strip() == (f"dyad consume {d}/x.bin: cannot reach the DYAD service at tcp://127.0.0.1:1 "
                                "(connection refused): start dyadd on this node, or set DYAD_SERVICE_URI to "
                                "its address")


# ---- the metadata store ----

def test_store_stopped_or_gone_fails_fast(cluster):
    store, cons = cluster[0], cluster[1]
    harness.write_file(store.path("s.bin"), 1000)
    store.dyad("produce", store.path("s.bin"))
    store.proc.send_signal(signal.SIGSTOP)  # up, but not answering
    try:
        t0 = time.monotonic()
        p = cons.dyad("stat", cons.path("s.bin"), check=False)
        assert p.returncode == 4, p.stderr
        assert time.monotonic() - t0 < 5
        assert f"the metadata store at {store.uri} is unreachable (no answer to the hello" in p.stderr, p.stderr
        assert "the one started without --kvs" in p.stderr
        t0 = time.monotonic()
        p = cons.dyad("consume", cons.path("s.bin"), check=False)
        assert p.returncode == 4 and time.monotonic() - t0 < 5
        assert "metadata store" in p.stderr and "unreachable" in p.stderr
    finally:
        store.proc.send_signal(signal.SIGCONT)
    store.stop()
    t0 = time.monotonic()
    p = cons.dyad("stat", cons.path("s.bin"), check=False)
    assert p.returncode == 4 and time.monotonic() - t0 < 5
    assert f"the metadata store at {store.uri} is unreachable (connection refused)" in p.stderr, p.stderr


# ---- messages ----

def test_messages_name_command_file_cause_and_remedy(nodes):
    cons = nodes[1]
    f = cons.path("never.bin")
    # A bad setting value: the variable and its valid values, no DYAD_RC_ name.
    p = cons.dyad("consume", f, check=False, env_extra={"DYAD_KEY_DEPTH": "abc"})
    assert p.returncode == 1
    assert p.stderr.startswith("dyad consume: DYAD_KEY_DEPTH='abc' is not an integer"), p.stderr
    assert "fix or unset it" in p.stderr and "DYAD_RC_" not in p.stderr
    p = cons.dyad("stat", f, check=False, env_extra={"DYAD_WAIT_TIMEOUT": "soon"})
    assert p.returncode == 1 and p.stderr.startswith("dyad stat: DYAD_WAIT_TIMEOUT='soon'"), p.stderr
    assert "NOCTX" not in p.stderr
    # dyad config still lists the settings, to show where the bad one came from, then fails.
    p = cons.dyad("config", check=False, env_extra={"DYAD_KEY_DEPTH": "abc"})
    assert p.returncode == 1 and re.search(r"^DYAD_KEY_DEPTH=abc +# env$", p.stdout, re.M), p.stdout
    assert p.stderr.startswith("dyad config: DYAD_KEY_DEPTH='abc'")
    # A wait timeout: how long, which limit, what to do; no errno text.
    p = cons.dyad("consume", f, check=False, env_extra={"DYAD_WAIT_TIMEOUT": "0.5"})
    assert p.returncode == 3
    assert p.stderr.startswith(f"dyad consume {f}: 'never.bin' was not produced within 0.5 s (DYAD_WAIT_TIMEOUT)")
    assert "produce it first, or wait longer" in p.stderr
    assert "timed out" not in p.stderr and "DYAD_RC_" not in p.stderr
    p = cons.dyad("consume", "--timeout", "0.3", f, check=False)
    assert p.returncode == 3 and "not produced within 0.3 s (--timeout)" in p.stderr, p.stderr
    # Not produced, for stat: where to look.
    p = cons.dyad("stat", f, check=False)
    assert p.returncode == 2
    assert p.stderr.startswith(f"dyad stat {f}: 'never.bin' has not been produced (yet)") and "dyad ls" in p.stderr
    # Outside the managed directory.
    p = cons.dyad("consume", "/etc/hostname", check=False)
    assert p.returncode == 2 and p.stderr.startswith("dyad consume /etc/hostname: ")
    assert "not inside the consumer directory" in p.stderr and "DYAD_PATH_CONSUMER" in p.stderr
    # A usage error names the subcommand; exit code 1.
    p = cons.dyad("consume", "--bogus", f, check=False)
    assert p.returncode == 1 and p.stderr.startswith("dyad consume: ") and "--bogus" in p.stderr, p.stderr
    p = cons.dyad("consume", "--progress", "--no-progress", f, check=False)
    assert p.returncode == 1
    # DYAD_LOG_LEVEL=debug adds the code's name, for whoever debugs the library.
    p = cons.dyad("stat", f, check=False, env_extra={"DYAD_LOG_LEVEL": "debug"})
    assert "[DYAD_RC_NOTFOUND]" in p.stderr


def test_json_anywhere_on_the_command_line(nodes):
    prod, cons = nodes[0], nodes[1]
    harness.write_file(prod.path("j.bin"), 100)
    prod.dyad("produce", prod.path("j.bin"))
    outs = [json.loads(cons.dyad(*args).stdout) for args in (
        ("--json", "stat", cons.path("j.bin")),
        ("stat", "--json", cons.path("j.bin")),
        ("stat", cons.path("j.bin"), "--json"))]
    assert outs[0] == outs[1] == outs[2] and outs[0]["size"] == 100
    assert json.loads(cons.dyad("service", "status", "--json").stdout)["node"] == "node1"
    assert "transports_built" in json.loads(cons.dyad("config", "--json").stdout)
    line = json.loads(cons.dyad("consume", cons.path("j.bin"), "--json").stdout)
    assert line["file"] == cons.path("j.bin") and line["bytes"] == 100
    # After "--", "--json" is a file name (relative: taken from the consumer directory).
    p = cons.dyad("consume", "--timeout", "0.2", "--", "--json", check=False)
    assert p.returncode == 3 and "'--json' was not produced within 0.2 s" in p.stderr, p.stderr


def test_stat_formats_mode_and_mtime(nodes):
    prod, cons = nodes[0], nodes[1]
    path = prod.path("fmt.bin")
    harness.write_file(path, 10)
    os.chmod(path, 0o640)
    mtime_ns = 1609556645123456789  # 2021-01-02T03:04:05.123456789Z
    os.utime(path, ns=(mtime_ns, mtime_ns))
    prod.dyad("produce", path)
    out = cons.dyad("stat", cons.path("fmt.bin"), env_extra={"TZ": "UTC"}).stdout
    assert "mode: 0640\n" in out, out
    assert "mtime: 2021-01-02T03:04:05.123456789+00:00\n" in out, out
    out = cons.dyad("stat", cons.path("fmt.bin"), env_extra={"TZ": "XYZ-5:30"}).stdout
    assert "mtime: 2021-01-02T08:34:05.123456789+05:30\n" in out, out
    j = json.loads(cons.dyad("stat", "--json", cons.path("fmt.bin")).stdout)
    assert j["mode"] == 0o640 and j["mtime_ns"] == mtime_ns


# ---- progress ----

def test_progress_only_on_a_terminal_unless_forced(nodes):
    prod, cons = nodes[0], nodes[1]
    for name in ("p1.bin", "p2.bin", "p3.bin"):
        harness.write_file(prod.path(name), 8 << 20)
    prod.dyad("produce", prod.path("p1.bin"), prod.path("p2.bin"), prod.path("p3.bin"))
    # stderr is a pipe: nothing.
    p = cons.dyad("consume", cons.path("p1.bin"))
    assert p.stderr == "", p.stderr
    # Forced: one line per update, the last one complete.
    p = cons.dyad("consume", "--progress", cons.path("p2.bin"))
    lines = p.stderr.splitlines()
    assert lines, p.stderr
    assert all(line.startswith(f"dyad consume {cons.path('p2.bin')}: ") for line in lines), lines
    assert re.search(r": 8\.0 MiB of 8\.0 MiB \(100%\), .*/s, done in ", lines[-1]), lines
    assert "\r" not in p.stderr and "\033" not in p.stderr
    # --no-progress wins on a terminal; --progress on a terminal redraws one line.
    for flag, shown in (("--no-progress", False), ("--progress", True)):
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen([harness.DYAD, "consume", flag, cons.path("p3.bin")], env=cons.env(),
                                    stdout=subprocess.PIPE, stderr=slave)
            os.close(slave)
            slave = None
            out = b""
            while True:
                r, _, _ = select.select([master], [], [], 30)
                if not r:
                    break
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the other side closed
                    break
                if not chunk:
                    break
                out += chunk
            proc.wait(timeout=30)
            assert proc.returncode == 0
        finally:
            os.close(master)
            if slave is not None:
                os.close(slave)
        if shown:
            assert b"\r" in out and b"\033[K" in out and b"(100%)" in out, out
        else:
            assert out == b"", out
        os.unlink(cons.path("p3.bin"))


# ---- stale temporary files ----

def test_temporary_file_of_a_killed_consumer_is_removed_by_the_next(nodes):
    prod, cons = nodes[0], nodes[1]
    size = 256 << 20
    harness.write_file(prod.path("k/big.bin"), size)
    prod.dyad("produce", prod.path("k/big.bin"))
    pattern = os.path.join(cons.dir, "k", ".big.bin.dyad-*")
    consumer = cons.dyad_async("consume", cons.path("k/big.bin"), env_extra={"DYAD_DTL_MODE": "FLUX_RPC"})

    def writing():
        if consumer.poll() is not None:
            return "ended"
        for t in glob.glob(pattern):
            try:
                if os.path.getsize(t) > 0:
                    return t
            except OSError:
                pass
        return None

    temp = harness.wait_for(writing, 60, what="the consumer's temporary file", interval=0.002)
    assert temp != "ended", "the transfer ended before it could be interrupted"
    consumer.kill()
    consumer.wait()
    # The temporary file names the writer's pid.
    assert os.path.basename(temp).startswith(f".big.bin.dyad-{consumer.pid}-"), temp
    assert os.path.exists(temp) and not os.path.exists(cons.path("k/big.bin"))
    p = cons.dyad("consume", cons.path("k/big.bin"))
    assert p.returncode == 0
    assert not os.path.exists(temp), "the dead consumer's temporary file is still there"
    assert glob.glob(pattern) == []
    assert harness.sha256(cons.path("k/big.bin")) == harness.sha256(prod.path("k/big.bin"))
    os.unlink(cons.path("k/big.bin"))
    os.unlink(prod.path("k/big.bin"))


# ---- dyadd ----

def test_dyadd_exit_codes(tmp_path):
    p = subprocess.run([harness.DYADD, "--bogus"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and p.stderr.startswith("dyadd: ") and "--bogus" in p.stderr, p.stderr
    p = subprocess.run([harness.DYADD, "--allow-uid", "x", str(tmp_path)], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1 and "--allow-uid" in p.stderr
    p = subprocess.run([harness.DYADD, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "Exit codes:" in p.stdout
    # The --kvs store is not there: 4, as the dyad tool's "could not be reached".
    port = harness.free_port()
    p = subprocess.run([harness.DYADD, "--listen", f"127.0.0.1:{port}", "--kvs", "tcp://127.0.0.1:1",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 4 and "cannot register in the metadata store" in p.stderr, p.stderr
    # The address is taken.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        p = subprocess.run([harness.DYADD, "--listen", f"127.0.0.1:{s.getsockname()[1]}", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 4 and "cannot listen" in p.stderr, p.stderr


def test_doctor_passes_a_good_environment_and_names_what_to_fix(nodes, tmp_path):
    """dyad doctor: every check ok on a node set up right; a producer
    directory the service does not serve, a bad setting, a missing key file
    and an unreachable service each fail with the fix named."""
    a = nodes[0]
    p = a.dyad("doctor", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAIL" not in p.stdout
    assert re.search(r"^ok +service ", p.stdout, re.M), p.stdout
    assert re.search(r"^ok +metadata store ", p.stdout, re.M), p.stdout
    # the same directory for both: said, not failed
    assert re.search(r"^note +directories +producer and consumer directories are the same", p.stdout, re.M)

    other = tmp_path / "elsewhere"
    other.mkdir()
    p = a.dyad("--json", "doctor", check=False, env_extra={"DYAD_PATH_PRODUCER": str(other)})
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["ok"] is False
    bad = {c["check"]: c for c in out["checks"] if c["verdict"] == "FAIL"}
    assert "producer dir" in bad and a.dir in bad["producer dir"]["fix"], out

    p = a.dyad("doctor", check=False, env_extra={"DYAD_KEY_DEPTH": "lots"})
    assert p.returncode == 1 and re.search(r"^FAIL +settings .*DYAD_KEY_DEPTH", p.stdout, re.M), p.stdout

    p = a.dyad("doctor", check=False, env_extra={"DYAD_AUTH_KEY_FILE": str(tmp_path / "no-such.key")})
    assert p.returncode == 1 and re.search(r"^FAIL +key ", p.stdout, re.M), p.stdout

    p = a.dyad("doctor", check=False, env_extra={"DYAD_SERVICE_URI": "tcp://127.0.0.1:1"})
    assert p.returncode == 1 and re.search(r"^FAIL +service ", p.stdout, re.M), p.stdout


# ---- issue 34: everyday use without surprises ----

def test_produce_refuses_a_file_still_open_for_writing(nodes):
    prod, cons = nodes[0], nodes[1]
    path = prod.path("growing.log")
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nf = open(sys.argv[1], 'w')\nf.write('first line\\n')\nf.flush()\n"
         "print('open', flush=True)\nsys.stdin.read()\nf.write('last line\\n')\nf.close()\n", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "open\n"
        p = prod.dyad("produce", path, check=False)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith(f"dyad produce {path}: ") and "still has it open for writing" in p.stderr
        assert "once the writer has closed it" in p.stderr and "resource busy" not in p.stderr, p.stderr
        p = prod.dyad("produce", "--json", path, check=False)
        line = json.loads(p.stdout)
        assert p.returncode == 2 and line["ok"] is False and line["exit"] == 2 and line["file"] == path
        assert line["rc"] == "DYAD_RC_BADFIO" and "open for writing" in line["error"]
        assert cons.dyad("stat", cons.path("growing.log"), check=False).returncode == 2  # nothing published
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    prod.dyad("produce", path)
    cons.dyad("consume", cons.path("growing.log"))
    with open(cons.path("growing.log")) as f:
        assert f.read() == "first line\nlast line\n"


def test_changed_file_timeout_names_the_option_given(nodes):
    prod, cons = nodes[0], nodes[1]
    path = prod.path("changed.txt")
    with open(path, "w") as f:
        f.write("v1")
    prod.dyad("produce", path)
    with open(path, "a") as f:
        f.write(" and more")
    p = cons.dyad("consume", "--timeout", "0.5", cons.path("changed.txt"), check=False)
    assert p.returncode != 0
    assert "not produced again within 0.5 s (--timeout)" in p.stderr, p.stderr
    assert "DYAD_WAIT_TIMEOUT" not in p.stderr, p.stderr
    prod.dyad("produce", path)


def test_json_errors_are_json(nodes):
    cons = nodes[1]
    f = cons.path("never-json.bin")
    p = cons.dyad("consume", "--json", "--timeout", "0.2", f, check=False)
    assert p.returncode == 3
    line = json.loads(p.stdout)
    assert line == {"ok": False, "file": f, "exit": 3, "rc": "DYAD_RC_TIMEOUT", "error": line["error"],
                    "command": "dyad consume"}
    assert "was not produced within 0.2 s (--timeout)" in line["error"]
    assert "was not produced" in p.stderr  # the text stays on stderr
    # Several files: one line per file, failed or not.
    harness.write_file(nodes[0].path("ok-json.bin"), 10)
    nodes[0].dyad("produce", nodes[0].path("ok-json.bin"))
    p = cons.dyad("consume", "--json", "--timeout", "0.2", cons.path("ok-json.bin"), f, check=False)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert [x["ok"] for x in lines] == [True, False] and lines[1]["exit"] == 3, lines
    p = cons.dyad("stat", "--json", f, check=False)
    j = json.loads(p.stdout)
    assert p.returncode == 2 and j["ok"] is False and j["rc"] == "DYAD_RC_NOTFOUND" and j["exit"] == 2
    p = cons.dyad("produce", "--json", "/etc/hostname", check=False)
    j = json.loads(p.stdout)
    assert p.returncode == 2 and j["ok"] is False and "not inside the producer directory" in j["error"]


def test_service_uri_and_key_file_words(nodes, tmp_path):
    cons = nodes[1]
    for uri, why in (("http://localhost:80", "unknown scheme"), ("tcp://127.0.0.1:70000", "bad port"),
                     ("tcp://127.0.0.1:0", "port 0")):
        p = cons.dyad("ls", check=False, env_extra={"DYAD_SERVICE_URI": uri})
        assert p.returncode == 1, p.stderr
        assert f"DYAD_SERVICE_URI '{uri}' is not a DYAD service address ({why})" in p.stderr, p.stderr
        assert "unix:PATH" in p.stderr and "tcp://HOST:PORT" in p.stderr and "port 1-65535" in p.stderr
        assert "invalid argument" not in p.stderr
    p = cons.dyad("service", "status", "--uri", "https://x:1", check=False)
    assert p.returncode == 1 and "--uri 'https://x:1' is not a DYAD service address" in p.stderr, p.stderr
    # A key file that is not there: a configuration error.
    p = cons.dyad("ls", check=False, env_extra={"DYAD_AUTH_KEY_FILE": str(tmp_path / "no.key")})
    assert p.returncode == 1 and "cannot open key file" in p.stderr, p.stderr
    # Another job's key: the service is named once.
    other = tmp_path / "other.key"
    cons.dyad("keygen", str(other))
    p = cons.dyad("ls", check=False, env_extra={"DYAD_AUTH_KEY_FILE": str(other)})
    assert p.returncode == 4, p.stderr
    assert p.stderr.count("service at ") == 1, p.stderr


def test_timeout_takes_units(nodes):
    prod, cons = nodes[0], nodes[1]
    harness.write_file(prod.path("units.bin"), 10)
    prod.dyad("produce", prod.path("units.bin"))
    for t in ("1m", "90s", "0.5h", "30"):
        cons.dyad("consume", "--timeout", t, cons.path("units.bin"))
    p = cons.dyad("consume", "--timeout", "1x", cons.path("units.bin"), check=False)
    assert p.returncode == 1 and "'1x' is not a duration" in p.stderr and "(90s, 10m, 1h)" in p.stderr


def test_produce_directory_itself_and_recursive(nodes):
    prod, cons = nodes[0], nodes[1]
    p = prod.dyad("produce", prod.dir, check=False)
    assert p.returncode == 2 and "is the producer directory itself" in p.stderr, p.stderr
    assert "not inside" not in p.stderr and "dyad produce -r" in p.stderr
    tree = prod.path("tree")
    os.makedirs(os.path.join(tree, "sub"))
    for rel in ("a.txt", "sub/b.txt", ".b.txt.Ab12Cd", "sub/sedAb12Cd"):
        with open(os.path.join(tree, rel), "w") as f:
            f.write(rel)
    p = prod.dyad("produce", tree, check=False)
    assert p.returncode == 2 and "is a directory" in p.stderr and f"dyad produce -r {tree}" in p.stderr, p.stderr
    p = prod.dyad("produce", "-r", tree)
    assert p.stdout.splitlines() == [f"produced {tree}/a.txt", f"produced {tree}/sub/b.txt"], p.stdout
    names = cons.dyad("ls", "tree/").stdout
    assert "tree/a.txt" in names and "tree/sub/b.txt" in names and "Ab12Cd" not in names, names


def test_relative_names_of_ls_and_unmatched_globs(nodes, tmp_path):
    prod, cons = nodes[0], nodes[1]
    prod.produce_text("rel/x3.txt", "x3")
    env = cons.env()
    p = subprocess.run([harness.DYAD, "consume", "rel/x3.txt"], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(cons.path("rel/x3.txt") + ": "), p.stderr
    p = subprocess.run([harness.DYAD, "stat", "rel/x3.txt"], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "path: rel/x3.txt\n" in p.stdout, p.stdout + p.stderr
    p = cons.dyad("consume", "--timeout", "0.2", cons.path("rel/*.csv"), check=False)
    assert p.returncode == 3
    assert "does not exist and contains *, ? or [" in p.stderr and "matched nothing" in p.stderr, p.stderr


def _on_a_terminal(cons, args, until, then=None, timeout=30):
    """Runs dyad with stderr on a pty; reads it until `until` appears, then
    sends signal `then` (if any); returns (returncode, stderr bytes)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([harness.DYAD, *args], env=cons.env(), stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    sent = False
    try:
        end = time.time() + timeout
        while time.time() < end:
            if not sent and until in out:
                if then is None:
                    break
                proc.send_signal(then)
                sent = True
            r, _, _ = select.select([master], [], [], 0.5)
            if not r:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if then is None:
            proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, out


def test_waiting_line_and_ctrl_c_on_a_terminal(nodes):
    cons = nodes[1]
    f = cons.path("awaited.bin")
    rc, out = _on_a_terminal(cons, ["consume", f], b"to be produced", signal.SIGINT)
    text = out.decode()
    assert f"dyad consume: waiting for {f} to be produced (Ctrl-C to stop; --timeout S to give up)..." in text, text
    assert f"dyad consume: interrupted while waiting for {f} to be produced: nothing was installed" in text, text
    assert rc == 128 + signal.SIGINT
    assert not os.path.exists(f)
    # Not on a terminal: no waiting line.
    p = cons.dyad("consume", "--timeout", "1.5", f, check=False)
    assert p.returncode == 3 and "waiting for" not in p.stderr


def test_service_status_wait():
    c = harness.Cluster(nodes=1)
    try:
        n = c[0]
        assert n.dyad("service", "status", "--wait").returncode == 0
        n.stop()
        p = n.dyad("service", "status", "--wait", "0.5", check=False)
        assert p.returncode == 4 and "did not answer within <1 s (--wait)" in p.stderr, p.stderr
        waiter = n.dyad_async("service", "status", "--wait", "1m")
        time.sleep(0.5)
        assert waiter.poll() is None
        n.start()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and "service " in out, err
    finally:
        c.cleanup()


def test_rm_unpublishes_only_this_nodes_files(nodes):
    """Issue 34, item 4: `dyad rm` removes the record of a file this node
    produced (the file stays): ls no longer lists it, a consumer waits for
    it again, a fetch of it is refused; another node's file is refused,
    naming its owner."""
    from rawwire import ERROR, Raw
    prod, cons = nodes[0], nodes[1]
    harness.write_file(prod.path("rmt/a.bin"), 4096, seed=3)
    prod.dyad("produce", prod.path("rmt/a.bin"))
    cons.dyad("consume", cons.path("rmt/a.bin"))
    # Another node cannot unpublish it (its own file of the same name).
    p = cons.dyad("rm", cons.path("rmt/a.bin"), check=False)
    assert p.returncode != 0, p.stdout
    assert "produced by service 'node0'" in p.stderr and "rmt/a.bin" in p.stderr, p.stderr
    p = prod.dyad("rm", prod.path("rmt/a.bin"))
    assert "unpublished" in p.stdout and "stays on disk" in p.stdout, p.stdout
    assert os.path.exists(prod.path("rmt/a.bin"))
    assert "rmt/a.bin" not in prod.dyad("ls").stdout
    # Not published any more: a consumer waits, a fetch is refused.
    os.unlink(cons.path("rmt/a.bin"))
    p = cons.dyad("consume", "--timeout", "1", cons.path("rmt/a.bin"), check=False)
    assert p.returncode != 0 and not os.path.exists(cons.path("rmt/a.bin")), p.stderr
    r = Raw.to(prod)
    tag = r.request("dyad.fetch", upath="rmt/a.bin", transport="FLUX_RPC")
    f, _ = r.collect(tag)
    r.close()
    assert f["type"] == ERROR and "has not been produced" in f["meta"]["msg"], f
    # Again: not published, a clear ENOENT; --json has a line per file.
    p = prod.dyad("--json", "rm", prod.path("rmt/a.bin"), check=False)
    assert p.returncode != 0 and "is not published" in p.stderr, p.stderr
    assert "is not published" in p.stdout, p.stdout
    # Published again, it is served again.
    prod.dyad("produce", prod.path("rmt/a.bin"))
    cons.dyad("consume", "--timeout", "10", cons.path("rmt/a.bin"))
    assert harness.sha256(cons.path("rmt/a.bin")) == harness.sha256(prod.path("rmt/a.bin"))
    # node1 keeps its records in node0's store (kvs.remove): its own file goes too.
    harness.write_file(cons.path("rmt/b.bin"), 100, seed=5)
    cons.dyad("produce", cons.path("rmt/b.bin"))
    assert "rmt/b.bin" in prod.dyad("ls").stdout
    cons.dyad("rm", cons.path("rmt/b.bin"))
    assert "rmt/b.bin" not in prod.dyad("ls").stdout
