"""DYAD installed with `cmake --install`: the installed dyadd and dyad tool
find the installed libdyad.so and its libfabric plugin (RUNPATH relative to
themselves, nothing from the build tree), and move a file with
DYAD_DTL_MODE=MARGO. A plugin of another build is refused with a message
that names it, both builds and the remedy."""
import json
import os
import re
import shutil
import subprocess

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
        # The producer's service runs the installed libdyad.so and plugin,
        # nothing of the build tree.
        with open(f"/proc/{prod.proc.pid}/maps") as f:
            maps = {line.split()[-1] for line in f if "/" in line}
        dyad_libs = {m for m in maps if "libdyad" in os.path.basename(m)}
        assert {os.path.basename(m).split(".so")[0] for m in dyad_libs} == {"libdyad", "libdyad_ofi"}, dyad_libs
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
        assert "DYAD_RC_MARGOINIT_FAIL" in p.stderr, p.stderr
        assert os.path.realpath(plugin) in p.stderr, p.stderr
        assert f"dyad {theirs}" in p.stderr and f"dyad {ours}" in p.stderr, p.stderr
        assert "rebuild and reinstall the plugin" in p.stderr, p.stderr
        assert not os.path.exists(cons.path("b.bin"))
