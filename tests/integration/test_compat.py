# SPDX-License-Identifier: Apache-2.0
"""Drop-in for the original DYAD's users: programs written against its API
and names only (tests/compat/, written here from its public headers) build
the way its users build them and run against ours. See
docs/migrating-from-dyad.md."""
import glob
import json
import os
import shutil
import subprocess

import pytest

import harness

SRC = os.path.join(harness.ROOT, "tests", "compat")
INCLUDE = os.path.join(harness.ROOT, "include")
LIB = os.path.join(harness.BUILD, "lib")
CC = shutil.which("cc") or shutil.which("gcc")
CXX = shutil.which("c++") or shutil.which("g++")
UPSTREAM_NAMES = ["libdyad_client.so", "libdyad_ctx.so", "libdyad_fstream.so"]
C_API = ["dyad_ctx_get", "dyad_ctx_init", "dyad_ctx_fini", "dyad_init", "dyad_init_env",
         "dyad_set_prod_path", "dyad_set_cons_path", "dyad_set_and_init_dtl_mode", "dyad_clear",
         "dyad_finalize", "dyad_produce", "dyad_get_metadata", "dyad_free_metadata", "dyad_consume",
         "dyad_consume_w_metadata", "dyad_ctx_default", "dyad_consume_range", "dyad_init_16"]


def build(out_dir, name, src, libs, cxx=False):
    """Compiles as the original's Makefiles do: -DDYAD_HAS_CONFIG=1, -I, -L, -rpath, -l."""
    exe = os.path.join(out_dir, name)
    cmd = ([CXX, "-std=c++11"] if cxx else [CC, "-std=c11"]) + [
        "-Wall", "-Werror", "-DDYAD_HAS_CONFIG=1", f"-I{INCLUDE}", os.path.join(SRC, src), "-o", exe,
        f"-L{LIB}", f"-Wl,-rpath={LIB}"] + [f"-l{l}" for l in libs]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"
    return exe


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("compat"))
    return {
        "prod": build(d, "prod", "prod.c", ["dyad_client", "dyad_ctx"]),
        "cons": build(d, "cons", "cons.c", ["dyad_client", "dyad_ctx"]),
        "hostile": build(d, "hostile", "hostile.c", ["dyad_client", "dyad_ctx"]),
        "layout": build(d, "layout", "layout.c", ["dyad_ctx"]),
    }


@pytest.fixture(scope="module")
def stream_prog(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("compat_stream")), "stream", "stream.cpp", ["dyad_fstream"],
                 cxx=True)


def run(node, argv, timeout=60, **env):
    p = subprocess.run(argv, env=node.env(**env), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


# -- the surface ----------------------------------------------------------------

def test_library_names_are_one_library():
    real = os.path.realpath(os.path.join(LIB, "libdyad.so"))
    for name in UPSTREAM_NAMES:
        path = os.path.join(LIB, name)
        assert os.path.islink(path), f"{name}: a symbolic link to libdyad.so.0 (ctypes cannot load a linker script)"
        assert os.path.realpath(path) == real
        dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        soname = dyn.split("Library soname: [", 1)[1].split("]", 1)[0]
        assert os.path.exists(os.path.join(LIB, soname)), f"{name}: SONAME {soname} must resolve beside it"
        syms = [w.split("@")[0] for w in subprocess.run(["nm", "-D", "--defined-only", path],
                                                         capture_output=True, text=True,
                                                         check=True).stdout.split()]
        missing = [s for s in C_API if s not in syms]
        assert not missing, f"{name} does not define {missing}"
    # No internal archive under an original name, anywhere in the build.
    for name in UPSTREAM_NAMES:
        archive = name.replace(".so", ".a")
        found = glob.glob(os.path.join(harness.BUILD, "**", archive), recursive=True)
        assert not found, f"an internal archive under a public name: {found}"


HEADERS = sorted(os.path.relpath(p, INCLUDE) for p in glob.glob(os.path.join(INCLUDE, "dyad", "**", "*.h*"),
                                                                 recursive=True))


@pytest.mark.parametrize("config", [False, True], ids=["plain", "DYAD_HAS_CONFIG"])
def test_every_header_compiles_alone_and_together(tmp_path, config):
    assert "dyad/common/dyad_dtl.h" in HEADERS and "dyad/stream/dyad_stream_core.hpp" in HEADERS
    defs = ["-DDYAD_HAS_CONFIG=1"] if config else []
    jobs = []
    for h in HEADERS + ["ALL"]:
        names = HEADERS if h == "ALL" else [h]
        for lang, std, compiler in (("c", "-std=c11", CC), ("c++", "-std=c++11", CXX)):
            if lang == "c" and any(n.endswith(".hpp") and n != "dyad/dyad_config.hpp" for n in names):
                if h != "ALL":
                    continue
                names = [n for n in names if not n.endswith(".hpp") or n == "dyad/dyad_config.hpp"]
            src = tmp_path / f"t_{len(jobs)}.{'c' if lang == 'c' else 'cpp'}"
            src.write_text("".join(f"#include <{n}>\n" for n in names) + "int dyad_header_check;\n")
            cmd = [compiler, std, "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only",
                   *defs, f"-I{INCLUDE}", str(src)]
            jobs.append((h, lang, cmd))
    for h, lang, cmd in jobs:
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, f"{h} ({lang}): {p.stderr}"


def test_layout_values_and_fields(cluster, progs):
    """struct dyad_ctx and the constants are the original's (static
    assertions in layout.c); the fields hold the configuration in effect and
    follow the dyad_set_* functions."""
    n = cluster[1]
    other = os.path.join(cluster.root, "elsewhere")
    os.makedirs(other)
    out = json.loads(run(n, [progs["layout"], other], producer=False, DYAD_KEY_DEPTH=2,
                         DYAD_KEY_BINS=64, DYAD_SHARED_STORAGE="", DYAD_KVS_NAMESPACE="ns1"))
    assert out["null_before"] is True
    assert out["prod_managed_path"] is None and out["cons_managed_path"] == n.dir
    assert out["cons_real_path"] == os.path.realpath(n.dir) and out["prod_real_path"] is None
    assert out["kvs_namespace"] == "ns1" and out["prod_managed_len"] == 0
    assert (out["key_depth"], out["key_bins"], out["service_mux"]) == (2, 64, 1)
    assert out["shared_storage"] == 1  # set means on, as in DYAD
    assert out["rank"] == 1 and out["node_idx"] == 1  # node1 registered second
    assert out["pid"] > 0 and out["initialized"] == 1
    assert out["set_cons_same_ctx"] == 1 and out["cons_after_set"] == other
    assert out["bad_mode"] == -1004 and out["flux_rpc_mode"] == 0
    assert out["clear"] == 0 and out["initialized_after_clear"] == 0
    assert out["produce_after_clear"] == -1000 and out["ctx_after_clear"] is True
    assert out["ctx_after_finalize"] is None


# -- moving files -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["consume", "metadata", "handmade"])
def test_c_programs_linked_with_the_original_names(cluster, progs, mode):
    prod, cons = cluster[0], cluster[1]
    consumer = subprocess.Popen([progs["cons"], mode, "6", cons.dir], env=cons.env(DYAD_WAIT_TIMEOUT=60),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cons.wait_waiters(1, procs=[consumer])
    run(prod, [progs["prod"], "6", prod.dir])
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert out.splitlines() == [f"File {i}: OK" for i in range(6)]


def test_hostile_metadata_is_an_error_not_a_crash(cluster, progs):
    prod, cons = cluster[0], cluster[1]
    run(prod, [progs["prod"], "1", prod.dir])
    out = run(cons, [progs["hostile"], cons.path("data0.bin")], DYAD_WAIT_TIMEOUT=10)
    res = dict(line.split(" ", 1) for line in out.splitlines())
    assert res["unreadable_struct"] == "-1010"    # DYAD_RC_BADBUF
    assert res["unreadable_fpath"] == "-1001"     # DYAD_RC_BADMETADATA
    assert res["unterminated_fpath"] == "-1001"
    assert res["other_file"] == "-1001"
    assert "someone/else.bin" in res["other_file_error"] and "data0.bin" in res["other_file_error"]
    assert res["free_foreign"] == "-1010"
    assert not os.path.exists(cons.path("someone/else.bin"))


def test_cpp_streams_with_get_stream_and_ldyad_fstream(cluster, stream_prog):
    prod, cons = cluster[0], cluster[1]
    consumer = subprocess.Popen([stream_prog, "cons", "5", cons.dir], env=cons.env(DYAD_WAIT_TIMEOUT=60),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cons.wait_waiters(1, procs=[consumer])
    run(prod, [stream_prog, "prod", "5", prod.dir])
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert out.splitlines() == [f"File {i}: OK" for i in range(5)]


def test_ctypes_loader_with_upstreams_2026_bindings_and_ranges(cluster):
    """Every function upstream's current pydyad binds, bound as it does; its
    21-argument dyad_init sets the grown context; dyad_consume_range from
    the producer's node (in place) and from another node (fetched)."""
    prod, cons = cluster[0], cluster[1]
    py = ["/usr/bin/python3", os.path.join(SRC, "ctypes_loader.py")]
    env = dict(LD_LIBRARY_PATH=LIB, DYAD_WAIT_TIMEOUT=60)
    run(prod, py + ["produce", "3", prod.dir], **env)
    for node in (prod, cons):
        out = json.loads(run(node, py + ["range", "3", node.dir], **env))
        assert out["cache"] == [2, 32 << 20, 0.5, 9, None], out["cache"]  # DYAD_CACHE_FIFO
        assert out["cons"] == node.dir
        want = []
        for i in range(3):
            size = 1000 + i
            want += [[0, 1, 0, 1, True], [size - 1, 1, 0, 1, True], [17, 500, 0, 500, True],
                     [size, 0, 0, 0, True], [size - 1, 2, -1002, 0, False]]
        assert out["ranges"] == want


def test_a_binary_linked_before_2026_calls_the_16_argument_dyad_init(cluster, tmp_path):
    """Linked against a libdyad.so.0 without symbol versions (as every one
    before 2026), run against ours: it binds to dyad_init@DYAD_1, the
    16-argument one, and to the 152-byte dyad_ctx_default."""
    stub = tmp_path / "stub"
    stub.mkdir()
    p = subprocess.run([CC, "-shared", "-fPIC", "-Wl,-soname,libdyad.so.0", os.path.join(SRC, "old16_stub.c"),
                        "-o", str(stub / "libdyad.so")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    exe = str(tmp_path / "old16")
    p = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", os.path.join(SRC, "old16.c"), "-o", exe,
                        f"-L{stub}", "-ldyad"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    node = cluster[1]
    p = subprocess.run([exe, node.dir], env=node.env(LD_LIBRARY_PATH=LIB), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == f"rc=0 key_depth=2 key_bins=64 cons={node.dir} default_key_bins=1024"
    assert "different size" not in p.stderr, p.stderr  # no copy-relocation warning


def test_ctypes_loader_takes_the_local_path_exactly_on_the_producers_node(cluster):
    """The DLIO readers' rule, owner_rank == ctx->rank, with the original
    pydyad's ctypes field lists and library names."""
    prod, cons = cluster[0], cluster[1]
    py = ["/usr/bin/python3",
          os.path.join(SRC, "ctypes_loader.py")]
    env = dict(LD_LIBRARY_PATH=LIB, DYAD_WAIT_TIMEOUT=60)
    p = json.loads(run(prod, py + ["produce", "6", prod.dir], **env))
    assert p["rank"] == 0 and p["same_ctx"] is True and p["prod"] == prod.dir
    here = json.loads(run(prod, py + ["load", "6", prod.dir], **env))
    assert here["local"] == list(range(6)) and here["fetched"] == here["handmade"] == []
    there = json.loads(run(cons, py + ["load", "6", cons.dir], **env))
    assert there["rank"] == 1 and there["local"] == []
    assert there["fetched"] == [0, 2, 4] and there["handmade"] == [1, 3, 5]


# -- ranks --------------------------------------------------------------------------

def test_rank_sources(tmp_path):
    """--rank, then DYAD_NODE_RANK, then the resource manager's node rank,
    else the store's registration order; metadata and status agree."""
    c = harness.Cluster(nodes=4, start=False, root=str(tmp_path))
    try:
        c[0].start()                                   # the store's first registration: 0
        c[1].start(extra_args=["--rank", "7"])
        c[2].extra_env["SLURM_NODEID"] = "5"
        c[2].start()
        c[3].extra_env["DYAD_NODE_RANK"] = "9"
        c[3].extra_env["SLURM_NODEID"] = "5"          # DYAD_NODE_RANK wins
        c[3].start()
        ranks = [n.status().get("rank") for n in c.nodes]
        assert ranks == [0, 7, 5, 9], ranks
        with open(c[1].path("r.bin"), "wb") as f:
            f.write(b"r" * 100)
        c[1].dyad("produce", c[1].path("r.bin"))
        st = json.loads(c[2].dyad("--json", "stat", c[2].path("r.bin")).stdout)
        assert st["owner_rank"] == st["rank"] == 7, st
    finally:
        c.cleanup()
