# SPDX-License-Identifier: Apache-2.0
"""DYAD installed with `cmake --install`: the installed dyadd and dyad tool
find the installed libdyad.so and its libfabric plugin (RUNPATH relative to
themselves, nothing from the build tree), and move a file with
DYAD_DTL_MODE=MARGO. A plugin of another build is refused with a message
that names it, both builds and the remedy.

What an installation holds for its users: a C program built with
`pkg-config --cflags --libs dyad` and a CMake project with
`find_package(dyad CONFIG)` move a file through the installed dyadd;
versions agree everywhere; man pages, the systemd unit and its settings
file, bash completion; no installed file names the source or build tree."""
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap

import pytest

import harness

PLUGIN = os.path.join(harness.BUILD, "lib", "libdyad_ofi.so")
PROTOS = {"ofi+tcp": "tcp", "ofi+sockets": "sockets", "ofi+shm": "shm"}


def cache_value(name):
    with open(os.path.join(harness.BUILD, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(rf"^{re.escape(name)}:\w+=(.*)$", line.strip())
            if m:
                return m.group(1)
    return None


def install(prefix):
    """Installs the build into prefix; returns (bin dir, lib dir)."""
    p = subprocess.run(["cmake", "--install", harness.BUILD, "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    libdir = cache_value("CMAKE_INSTALL_LIBDIR") or "lib"
    return os.path.join(prefix, "bin"), os.path.join(prefix, libdir)


def runpath(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", out)
    return m.group(1).split(":") if m else []


def a_protocol():
    """A DYAD_MARGO_PROTO whose libfabric provider this machine has."""
    try:
        out = subprocess.run(["fi_info", "-l"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "ofi+tcp"
    have = {line.rstrip(":") for line in out.splitlines() if line.endswith(":")}
    return next((p for p, prov in PROTOS.items() if prov in have), "ofi+tcp")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    if not os.path.exists(PLUGIN):
        pytest.skip("this build has no libfabric plugin (libfabric-dev not found at configure time)")
    bindir, libdir = install(tmp_path / "prefix")
    # The harness's nodes and tool runs use the installed programs.
    monkeypatch.setattr(harness, "DYADD", os.path.join(bindir, "dyadd"))
    monkeypatch.setattr(harness, "DYAD", os.path.join(bindir, "dyad"))
    return tmp_path / "prefix", bindir, libdir


def test_installed_layout(installed):
    prefix, bindir, libdir = installed
    rel = os.path.relpath(libdir, prefix)
    for name in ["libdyad.so", "libdyad.so.0", "libdyad_ofi.so", "libdyad_wrapper.so"]:
        assert os.path.exists(os.path.join(libdir, name)), name
    assert os.path.islink(os.path.join(libdir, "libdyad.so"))
    assert os.readlink(os.path.join(libdir, "libdyad.so")) == "libdyad.so.0"
    for h in ["client/dyad_client.h", "core/dyad_ctx.h", "common/dyad_rc.h", "common/dyad_envs.h",
              "stream/dyad_stream_api.hpp"]:
        assert os.path.exists(os.path.join(prefix, "include", "dyad", h)), h
    for prog in ["dyadd", "dyad"]:
        rp = runpath(os.path.join(bindir, prog))
        assert rp and rp[0] == f"$ORIGIN/../{rel}", rp
        assert "" not in rp and not any(harness.BUILD in p for p in rp), rp
    for lib in ["libdyad_ofi.so", "libdyad_wrapper.so"]:
        assert runpath(os.path.join(libdir, lib)) == ["$ORIGIN"], lib


def test_installed_moves_a_file_with_margo(installed):
    prefix, bindir, libdir = installed
    proto = a_protocol()
    with harness.Cluster(nodes=2, env={"DYAD_MARGO_PROTO": proto}) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("inst/a.bin"), (9 << 20) + 77, seed=5)
        prod.dyad("produce", prod.path("inst/a.bin"))
        p = cons.dyad("--json", "consume", cons.path("inst/a.bin"),
                      env_extra={"DYAD_DTL_MODE": "MARGO", "DYAD_WAIT_TIMEOUT": 60, "DYAD_TRANSFER_TIMEOUT": 20})
        assert json.loads(p.stdout.splitlines()[-1])["transport"] == "MARGO", p.stdout
        assert harness.sha256(cons.path("inst/a.bin")) == harness.sha256(prod.path("inst/a.bin"))
        assert prod.status()["counters"]["per_transport"]["MARGO"]["served"] == 1
        # The producer's service runs the installed plugin, nothing of the
        # build tree (dyadd links DYAD's layers privately: no libdyad.so).
        with open(f"/proc/{prod.proc.pid}/maps") as f:
            maps = {line.split()[-1] for line in f if "/" in line}
        dyad_libs = {m for m in maps if "libdyad" in os.path.basename(m)}
        assert {os.path.basename(m).split(".so")[0] for m in dyad_libs} == {"libdyad_ofi"}, dyad_libs
        for m in dyad_libs:
            assert os.path.realpath(m).startswith(os.path.realpath(libdir) + os.sep), m


def test_a_plugin_of_another_build_is_refused(installed):
    prefix, bindir, libdir = installed
    plugin = os.path.join(libdir, "libdyad_ofi.so")
    data = open(plugin, "rb").read()
    marker = b"dyad-dtl-plugin-build-id=dyad "
    at = data.find(marker)
    assert at >= 0, "the plugin records no build id"
    start = at + len(marker)
    ours = data[start:data.index(b"\0", start)].decode()
    # Another DYAD version, same length: the plugin's own id now differs.
    theirs = "9" * len(ours.split(";")[0]) + ours[len(ours.split(";")[0]):]
    tmp = plugin + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data[:start] + theirs.encode() + data[start + len(theirs):])
    shutil.copymode(plugin, tmp)
    os.replace(tmp, plugin)
    with harness.Cluster(nodes=2) as c:
        prod, cons = c[0], c[1]
        harness.write_file(prod.path("b.bin"), 1000, seed=1)
        prod.dyad("produce", prod.path("b.bin"))
        p = cons.dyad("consume", cons.path("b.bin"), check=False, timeout=60,
                      env_extra={"DYAD_DTL_MODE": "MARGO", "DYAD_WAIT_TIMEOUT": 20})
        assert p.returncode != 0
        # A fixed transport that cannot work is an error at once (issue 50):
        # exit 1, the message naming DYAD_DTL_MODE and why.
        assert p.returncode == 1, p.stderr
        assert "DYAD_DTL_MODE=MARGO cannot work" in p.stderr, p.stderr
        assert os.path.realpath(plugin) in p.stderr, p.stderr
        assert f"dyad {theirs}" in p.stderr and f"dyad {ours}" in p.stderr, p.stderr
        assert "rebuild and reinstall the plugin" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("b.bin"))


# ---------------------------------------------------------------------------
# What an installation gives its users (one install for all of these).

def project_version():
    """The one version: project(... VERSION X.Y.Z) of CMakeLists.txt."""
    with open(os.path.join(harness.ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*\w+\s+VERSION\s+(\d+\.\d+\.\d+)", f.read())
    assert m, "no project(VERSION) in CMakeLists.txt"
    return m.group(1)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """(prefix, bin dir, lib dir) of one installation, shared by the tests
    below (they change nothing in it)."""
    p = tmp_path_factory.mktemp("inst") / "prefix"
    bindir, libdir = install(p)
    return str(p), bindir, libdir


def clean_env(**extra):
    """The environment without any DYAD_* setting of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_dyadd(dyadd, args, env, log_path):
    """Starts an installed dyadd; returns (process, port)."""
    port = free = harness.free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen([dyadd, "--listen", f"127.0.0.1:{free}", *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        harness.wait_listening("127.0.0.1", port, proc=proc)
    except Exception:
        stop(proc)
        raise AssertionError(open(log_path).read())
    return proc, port


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# One program, built twice: with pkg-config (the producer) and with CMake (the
# consumer). It includes the installed public headers only.
MOVER_C = r"""
#include <stdio.h>
#include <string.h>

#include <dyad/client/dyad_client.h>
#include <dyad/core/dyad_ctx.h>
#include <dyad/dyad_version.h>

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "version") == 0) {
        printf("%s\n", dyad_version());
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s produce|consume PATH | version\n", argv[0]);
        return 1;
    }
    int produce = strcmp(argv[1], "produce") == 0;
    if (DYAD_IS_ERROR(dyad_init_env(produce ? DYAD_COMM_SEND : DYAD_COMM_RECV, NULL))) {
        fprintf(stderr, "init: %s\n", dyad_last_error());
        return 2;
    }
    dyad_rc_t rc = produce ? dyad_produce(dyad_ctx_get(), argv[2])
                           : dyad_consume(dyad_ctx_get(), argv[2]);
    if (DYAD_IS_ERROR(rc)) {
        fprintf(stderr, "%s: %s\n", argv[1], dyad_last_error());
        return 3;
    }
    printf("%s %s\n", argv[1] + 0, argv[2]);
    dyad_finalize();
    return 0;
}
"""

CMAKE_PROJECT = """
cmake_minimum_required(VERSION 3.16)
project(dyad_user C)
find_package(dyad {version} CONFIG REQUIRED)
add_executable(mover mover.c)
target_link_libraries(mover PRIVATE dyad::dyad)
"""


def build_with_pkg_config(prefix, libdir, src, out, rpath=None):
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "dyad"], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    if rpath is None:
        rpath = subprocess.run(["pkg-config", "--variable=libdir", "dyad"], env=env, capture_output=True,
                               text=True, check=True).stdout.strip()
    p = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", out, src, *flags, f"-Wl,-rpath,{rpath}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return flags


def build_with_cmake(prefix, src_dir, build_dir, version):
    with open(os.path.join(src_dir, "CMakeLists.txt"), "w") as f:
        f.write(CMAKE_PROJECT.format(version=".".join(version.split(".")[:2])))
    env = dict(os.environ)
    env.pop("CMAKE_PREFIX_PATH", None)
    p = subprocess.run(["cmake", "-S", src_dir, "-B", build_dir, f"-DCMAKE_PREFIX_PATH={prefix}",
                        "-DCMAKE_C_FLAGS=-Wall -Werror"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run(["cmake", "--build", build_dir], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return os.path.join(build_dir, "mover")


def test_programs_built_against_the_installation_move_a_file(prefix, tmp_path):
    prefix, bindir, libdir = prefix
    version = project_version()
    src = tmp_path / "user"
    src.mkdir()
    (src / "mover.c").write_text(MOVER_C)
    # pkg-config: -I and -L/-ldyad of the installation, its version.
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
    assert subprocess.run(["pkg-config", "--modversion", "dyad"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == version
    flags = build_with_pkg_config(prefix, libdir, str(src / "mover.c"), str(tmp_path / "producer"))
    assert f"-I{os.path.join(prefix, 'include')}" in flags, flags
    assert f"-L{libdir}" in flags and "-ldyad" in flags, flags
    # CMake: find_package(dyad X.Y CONFIG REQUIRED), target dyad::dyad.
    consumer = build_with_cmake(prefix, str(src), str(tmp_path / "user-build"), version)
    for prog in [str(tmp_path / "producer"), consumer]:
        p = subprocess.run([prog, "version"], capture_output=True, text=True, env=clean_env(), timeout=30)
        assert p.returncode == 0 and p.stdout.strip() == version, (prog, p.stdout, p.stderr)
        # The program runs the installed library.
        ldd = subprocess.run(["ldd", prog], capture_output=True, text=True).stdout
        lib = re.search(r"libdyad\.so\.0 => (\S+)", ldd)
        assert lib and os.path.realpath(lib.group(1)).startswith(os.path.realpath(libdir) + os.sep), ldd

    # The installed dyadd; the consumer uses another directory on the same
    # service, and starts first: it waits for the produce.
    prod_dir, cons_dir = tmp_path / "prod", tmp_path / "cons"
    prod_dir.mkdir()
    cons_dir.mkdir()
    dyadd, port = start_dyadd(os.path.join(bindir, "dyadd"), ["--node", "inst", str(prod_dir)], clean_env(),
                              str(tmp_path / "dyadd.log"))
    try:
        uri = f"tcp://127.0.0.1:{port}"
        cons = subprocess.Popen([consumer, "consume", str(cons_dir / "run" / "data.bin")],
                                env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_CONSUMER=cons_dir,
                                              DYAD_WAIT_TIMEOUT=30),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        harness.write_file(str(prod_dir / "run" / "data.bin"), (1 << 20) + 13, seed=7)
        p = subprocess.run([str(tmp_path / "producer"), "produce", str(prod_dir / "run" / "data.bin")],
                           env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_PRODUCER=prod_dir),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out, err = cons.communicate(timeout=60)
        assert cons.returncode == 0, err
        assert harness.sha256(str(cons_dir / "run" / "data.bin")) == harness.sha256(str(prod_dir / "run" / "data.bin"))
    finally:
        stop(dyadd)


def test_the_plugin_is_found_in_a_multiarch_libdir(prefix, tmp_path):
    """libdyad.so loads libdyad_ofi.so from its own directory, whatever its
    name: a copy of the two in lib/x86_64-linux-gnu moves a file with MARGO."""
    prefix, bindir, libdir = prefix
    if not os.path.exists(os.path.join(libdir, "libdyad_ofi.so")):
        pytest.skip("this build has no libfabric plugin")
    multiarch = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    multiarch.mkdir(parents=True)
    shutil.copy2(os.path.join(libdir, "libdyad.so.0"), multiarch / "libdyad.so.0")
    shutil.copy2(os.path.join(libdir, "libdyad_ofi.so"), multiarch / "libdyad_ofi.so")
    (tmp_path / "mover.c").write_text(MOVER_C)
    consumer = str(tmp_path / "consumer")
    build_with_pkg_config(prefix, libdir, str(tmp_path / "mover.c"), consumer, rpath=str(multiarch))
    ldd = subprocess.run(["ldd", consumer], capture_output=True, text=True).stdout
    assert f"{multiarch}/libdyad.so.0" in ldd, ldd
    prod_dir, cons_dir = tmp_path / "prod", tmp_path / "cons"
    prod_dir.mkdir()
    cons_dir.mkdir()
    proto = a_protocol()
    dyadd, port = start_dyadd(os.path.join(bindir, "dyadd"), ["--node", "ma", str(prod_dir)],
                              clean_env(DYAD_MARGO_PROTO=proto), str(tmp_path / "dyadd.log"))
    try:
        uri = f"tcp://127.0.0.1:{port}"
        harness.write_file(str(prod_dir / "m.bin"), (2 << 20) + 5, seed=3)
        subprocess.run([os.path.join(bindir, "dyad"), "produce", str(prod_dir / "m.bin")], check=True,
                       env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_PRODUCER=prod_dir), capture_output=True,
                       timeout=60)
        p = subprocess.run([consumer, "consume", str(cons_dir / "m.bin")], capture_output=True, text=True,
                           timeout=60, env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_CONSUMER=cons_dir,
                                                     DYAD_DTL_MODE="MARGO", DYAD_MARGO_PROTO=proto,
                                                     DYAD_WAIT_TIMEOUT=30, DYAD_TRANSFER_TIMEOUT=20))
        assert p.returncode == 0, p.stderr
        assert harness.sha256(str(cons_dir / "m.bin")) == harness.sha256(str(prod_dir / "m.bin"))
        st = json.loads(subprocess.run([os.path.join(bindir, "dyad"), "--json", "service", "status"],
                                       capture_output=True, text=True, check=True, timeout=30,
                                       env=clean_env(DYAD_SERVICE_URI=uri)).stdout)
        assert st["counters"]["per_transport"]["MARGO"]["served"] == 1, st["counters"]
        # Without the copy beside it, that libdyad.so has no plugin.
        os.unlink(multiarch / "libdyad_ofi.so")
        harness.write_file(str(prod_dir / "n.bin"), 1000, seed=4)
        subprocess.run([os.path.join(bindir, "dyad"), "produce", str(prod_dir / "n.bin")], check=True,
                       env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_PRODUCER=prod_dir), capture_output=True,
                       timeout=60)
        p = subprocess.run([consumer, "consume", str(cons_dir / "n.bin")], capture_output=True, text=True,
                           timeout=60, env=clean_env(DYAD_SERVICE_URI=uri, DYAD_PATH_CONSUMER=cons_dir,
                                                     DYAD_DTL_MODE="MARGO", DYAD_WAIT_TIMEOUT=30))
        assert p.returncode != 0 and f"{multiarch}/libdyad_ofi.so" in p.stderr, p.stderr
    finally:
        stop(dyadd)


def test_versions_agree(prefix):
    prefix, bindir, libdir = prefix
    version = project_version()
    for prog in ["dyadd", "dyad"]:
        p = subprocess.run([os.path.join(bindir, prog), "--version"], capture_output=True, text=True,
                           env=clean_env(), timeout=30)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == f"{prog} {version}", p.stdout
    header = open(os.path.join(prefix, "include", "dyad", "dyad_config.hpp")).read()
    assert f'#define DYAD_VERSION "{version}"' in header
    major, minor, patch = version.split(".")
    for part, value in [("MAJOR", major), ("MINOR", minor), ("PATCH", patch)]:
        assert re.search(rf"#define DYAD_VERSION_{part} {value}\b", header), part
    assert os.path.exists(os.path.join(prefix, "include", "dyad", "dyad_version.h"))
    assert os.path.realpath(os.path.join(libdir, "libdyad.so")).endswith(f"libdyad.so.{version}")
    version_file = os.path.join(libdir, "cmake", "dyad", "dyadConfigVersion.cmake")
    assert f'"{version}"' in open(version_file).read()


def test_cmake_package_exports_only_the_library(prefix):
    prefix, bindir, libdir = prefix
    cmake_dir = os.path.join(libdir, "cmake", "dyad")
    targets = "".join(open(os.path.join(cmake_dir, f)).read()
                      for f in os.listdir(cmake_dir) if f.startswith("dyadTargets"))
    assert set(re.findall(r"add_library\((\S+)", targets)) == {"dyad::dyad"}, targets
    # The layers' archives are inside libdyad.so, never installed.
    archives = [os.path.join(d, f) for d, _, fs in os.walk(prefix) for f in fs if f.endswith(".a")]
    assert not archives, archives
    for name in ["libdyad_client.so", "libdyad_ctx.so", "libdyad_fstream.so"]:
        assert os.readlink(os.path.join(libdir, name)) == "libdyad.so.0", name


def test_man_pages(prefix):
    prefix, bindir, libdir = prefix
    if (cache_value("HELP2MAN_EXECUTABLE") or "NOTFOUND").endswith("NOTFOUND"):
        pytest.skip("help2man was not found at configure time: no man pages")
    for prog, section, option in [("dyadd", 8, "--listen"), ("dyad", 1, "--json")]:
        page = os.path.join(prefix, "share", "man", f"man{section}", f"{prog}.{section}")
        text = open(page).read()
        assert re.search(rf'^\.TH "?{prog.upper()}"? "?{section}"?', text, re.M), text[:300]
        assert "--version" in text.replace("\\-", "-") and option in text.replace("\\-", "-"), prog
        if shutil.which("man"):
            p = subprocess.run(["man", "-l", page], capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80"))
            assert p.returncode == 0, p.stderr
            rendered = re.sub(r".\x08", "", p.stdout)
            assert "NAME" in rendered and prog in rendered and option in rendered.replace("\u2010", "-"), rendered


def read_env_file(path):
    values = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def test_systemd_unit_and_settings_file(prefix, tmp_path):
    prefix, bindir, libdir = prefix
    unit = os.path.join(prefix, "lib", "systemd", "system", "dyadd.service")
    env_file = os.path.join(prefix, "etc", "default", "dyadd")
    text = open(unit).read()
    m = re.search(r"^ExecStart=(\S+) (.*)$", text, re.M)
    assert m and m.group(1) == os.path.join(bindir, "dyadd"), text
    assert f"EnvironmentFile=-{env_file}\n" in text, text
    for option in ["NoNewPrivileges=yes", "ProtectSystem="]:
        assert option in text, option
    assert "PrivateTmp=yes" not in text and "ProtectHome=yes" not in text  # producer dirs there
    # The documented variables, and dyadd started the way the unit starts it
    # (with this test's directory and port).
    doc = open(env_file).read()
    for var in ["DYAD_PATH_PRODUCER", "DYADD_LISTEN", "DYAD_AUTH_KEY_FILE", "DYADD_OPTIONS"]:
        assert var in doc, var
    values = read_env_file(env_file)
    assert set(values) == {"DYAD_PATH_PRODUCER", "DYADD_LISTEN", "DYADD_OPTIONS"}, values
    port = harness.free_port()
    values.update(DYAD_PATH_PRODUCER=str(tmp_path / "served"), DYADD_LISTEN=f"127.0.0.1:{port}",
                  DYADD_OPTIONS=f"--node unit --socket {tmp_path / 'd.sock'}")
    args = m.group(2).replace("${DYADD_LISTEN}", values["DYADD_LISTEN"])
    args = args.replace("$DYADD_OPTIONS", values["DYADD_OPTIONS"]).split()
    log = open(tmp_path / "unit.log", "wb")
    proc = subprocess.Popen([m.group(1), *args], env=clean_env(**values), stdout=log, stderr=subprocess.STDOUT)
    try:
        harness.wait_listening("127.0.0.1", port, proc=proc)
        st = json.loads(subprocess.run([os.path.join(bindir, "dyad"), "--json", "service", "status"],
                                       env=clean_env(DYAD_SERVICE_URI=f"unix:{tmp_path / 'd.sock'}"),
                                       capture_output=True, text=True, check=True, timeout=30).stdout)
        assert st["node"] == "unit" and os.path.realpath(st["producer_dir"]) == os.path.realpath(tmp_path / "served")
    finally:
        stop(proc)
    if not shutil.which("systemd-analyze"):
        return  # the unit's syntax is checked where systemd is installed
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", unit], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    problems = [line for line in (p.stdout + p.stderr).splitlines() if "dyadd.service" in line]
    assert p.returncode == 0 and not problems, p.stdout + p.stderr


def test_bash_completion(prefix):
    prefix, bindir, libdir = prefix
    for prog in ["dyad", "dyadd"]:
        path = os.path.join(prefix, "share", "bash-completion", "completions", prog)
        subprocess.run(["bash", "-n", path], check=True)
        assert f"complete -F _{prog} {prog}" in open(path).read()


def test_nothing_installed_names_the_source_or_build_tree(prefix):
    prefix, bindir, libdir = prefix
    trees = {os.path.realpath(harness.ROOT), os.path.realpath(harness.BUILD), harness.ROOT, harness.BUILD}
    needles = [t.encode() for t in trees]
    found = []
    elves = []
    for d, _, files in os.walk(prefix):
        for f in files:
            path = os.path.join(d, f)
            if os.path.islink(path):
                target = os.readlink(path)
                if any(t in target for t in trees):
                    found.append(f"{path} -> {target}")
                continue
            data = open(path, "rb").read()
            found += [f"{path}: {n.decode()}" for n in needles if n in data]
            if data[:4] == b"\x7fELF":
                elves.append(path)
    assert not found, found
    # Every program and library finds the others through $ORIGIN, inside
    # the installation's library directory only.
    assert elves
    real_libdir = os.path.realpath(libdir)
    for path in elves:
        for entry in runpath(path):
            assert entry.startswith("$ORIGIN"), (path, entry)
            resolved = os.path.realpath(entry.replace("$ORIGIN", os.path.dirname(path)))
            assert resolved == real_libdir or not os.path.exists(resolved), (path, entry)


def sections(path):
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\]\s+(\.\S+)", out))


def test_installed_binaries_ship_without_debug_information(prefix):
    """Programs and libraries are installed stripped of their debug
    information, which lies beside them in .debug/NAME.debug, named by the
    file's .gnu_debuglink (where gdb looks); the split halves are small
    and complete."""
    prefix, bindir, libdir = prefix
    files = [os.path.join(bindir, "dyadd"), os.path.join(bindir, "dyad"),
             os.path.realpath(os.path.join(libdir, "libdyad.so")),
             os.path.join(libdir, "libdyad_wrapper.so")]
    if os.path.exists(os.path.join(libdir, "libdyad_ofi.so")):
        files.append(os.path.join(libdir, "libdyad_ofi.so"))
    for path in files:
        have = sections(path)
        assert ".debug_info" not in have, f"{path} still carries its debug information"
        assert ".symtab" in have, f"{path} lost its symbol table (backtraces need it)"
        assert ".gnu_debuglink" in have, path
        link = subprocess.run(["readelf", "--string-dump=.gnu_debuglink", path], capture_output=True,
                              check=True).stdout.decode(errors="replace")
        name = os.path.basename(path) + ".debug"
        assert name in link, (path, link)
        debug = os.path.join(os.path.dirname(path), ".debug", name)
        assert os.path.exists(debug), debug
        assert ".debug_info" in sections(debug), debug
    assert os.path.getsize(os.path.realpath(os.path.join(libdir, "libdyad.so"))) < 16 << 20
