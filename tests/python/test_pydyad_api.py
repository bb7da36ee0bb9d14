# SPDX-License-Identifier: Apache-2.0
"""pydyad.Dyad over libdyad: loading, initialisation, errors and their codes."""
import inspect
import os
import pickle
import time

import pytest

import pydyad
from pydyad import DyadError, DyadRC
from pydyad_testlib import LIBDYAD, ROOT, harness, last_json, pyenv, run_py

# Prints {"rc": ..., "name": ..., "msg": ...} for the DyadError `expr` raises.
EXPECT_ERROR = """
def outcome(f):
    try:
        f()
    except DyadError as e:
        return {"rc": e.rc, "name": e.rc_name, "msg": e.message, "text": str(e)}
    return {"rc": 0}
"""


def errors_of(node, exprs, **kw):
    """Runs each expression (after d = Dyad(); d.init_env(), unless
    `setup` is given) in one process; returns their outcomes."""
    setup = kw.pop("setup", "d = Dyad(); d.init_env()")
    code = EXPECT_ERROR + setup + "\nres = []\n"
    for e in exprs:
        code += f"res.append(outcome(lambda: {e}))\n"
    code += "print(json.dumps(res))\n"
    return last_json(run_py(node, code, **kw).stdout)


# -- library loading ---------------------------------------------------------

def test_library_found_relative_to_package_without_env():
    """Without DYAD_LIBRARY, an installed libdyad comes first (none on a test
    machine, normally), then the build tree beside the source."""
    p = run_py(None, """
        import ctypes.util
        b = pydyad.bindings
        installed = ctypes.util.find_library("dyad") or [
            os.path.join(d, n) for d in b.install_dirs() for n in b._LIB_NAMES
            if os.path.isfile(os.path.join(d, n))]
        Dyad()
        print(json.dumps([bool(installed), b.library_path()]))
    """, env=pyenv(None, library=False))
    installed, path = last_json(p.stdout)
    if installed:
        pytest.skip(f"a libdyad is installed on this machine ({path}): it comes before the build tree")
    assert os.path.realpath(path) == os.path.realpath(os.path.join(ROOT, "build", "lib", "libdyad.so"))


def test_library_env_var_wins_and_bad_path_is_a_clear_error(tmp_path):
    env = pyenv(None)
    env["DYAD_LIBRARY"] = str(tmp_path / "nope.so")
    p = run_py(None, "Dyad()", env=env, check=False)
    assert p.returncode != 0
    assert "DyadLibraryError" in p.stderr and "DYAD_LIBRARY=" in p.stderr and "nope.so" in p.stderr
    notlib = tmp_path / "notlib.so"
    notlib.write_text("not an ELF file")
    env["DYAD_LIBRARY"] = str(notlib)
    p = run_py(None, "Dyad()", env=env, check=False)
    assert p.returncode != 0
    assert f"cannot load {notlib}" in p.stderr


def test_import_does_not_load_the_library():
    env = pyenv(None)
    env["DYAD_LIBRARY"] = "/nonexistent/libdyad.so"
    p = run_py(None, "print(json.dumps(pydyad.bindings.library_path()))", env=env)
    assert last_json(p.stdout) is None


# -- pure Python parts (in-process: no libdyad call) ----------------------------

def test_init_defaults_match_the_environment_defaults():
    sig = inspect.signature(pydyad.Dyad.init)
    assert sig.parameters["key_depth"].default == 3
    assert sig.parameters["key_bins"].default == 1024
    assert sig.parameters["dtl_comm_mode"].default == pydyad.DTLCommMode.DYAD_COMM_RECV
    assert list(sig.parameters)[1:] == [
        "debug", "check", "shared_storage", "reinit", "async_publish", "fsync_write", "key_depth",
        "key_bins", "service_mux", "kvs_namespace", "prod_managed_path", "cons_managed_path",
        "relative_to_managed_path", "dtl_mode", "dtl_comm_mode", "flux_handle",
        # upstream's since 2026, with its defaults
        "cache_capacity_bytes", "cache_policy", "cache_low_watermark", "cache_grace_period_sec",
        "origin_path"]
    assert [sig.parameters[n].default for n in list(sig.parameters)[-5:]] == [0, None, 0.8, 5, None]


def test_rc_names_and_error_object():
    assert pydyad.rc_name(-2002) == "DYAD_RC_NOTFOUND"
    assert pydyad.rc_name(-2008) == "DYAD_RC_TIMEOUT"
    assert pydyad.rc_name(-77) == "DYAD_RC_UNKNOWN(-77)"
    e = DyadError(-2002, "'x' has not been produced (yet)", "dyad_get_metadata", "/d/x")
    assert (e.rc, e.rc_name) == (-2002, "DYAD_RC_NOTFOUND")
    assert str(e) == "dyad_get_metadata('/d/x') failed: DYAD_RC_NOTFOUND (-2002): 'x' has not been produced (yet)"
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.rc, e2.message, str(e2)) == (e.rc, e.message, str(e))
    assert isinstance(e, RuntimeError)  # as the original pydyad raises
    assert pydyad.DTLMode.DYAD_DTL_FLUX_RPC is pydyad.DTLMode.FLUX_RPC
    assert {m.value for m in pydyad.DTLMode} >= {"UCX", "MARGO", "FLUX_RPC", "STREAM"}


# -- init ---------------------------------------------------------------------

def test_calls_before_init_raise_noctx(cluster):
    res = errors_of(cluster[0], ["d.consume(os.environ['DYAD_PATH_CONSUMER'] + '/f')",
                                 "d.produce(os.environ['DYAD_PATH_PRODUCER'] + '/f')",
                                 "d.get_metadata(os.environ['DYAD_PATH_CONSUMER'] + '/f')"],
                    setup="d = Dyad()")
    for r in res:
        assert r["rc"] == DyadRC.DYAD_RC_NOCTX == -1000
        assert "not initialised" in r["msg"]


def test_init_errors_carry_their_codes(cluster):
    d = cluster[0].dir
    res = errors_of(cluster[0], [
        f"d.init(prod_managed_path={d!r}, dtl_mode='NOPE')",
        "d.init(prod_managed_path='')",
        f"d.init(cons_managed_path={d!r}, dtl_comm_mode=7)",
        f"d.init(prod_managed_path={d!r}, dtl_mode=pydyad.DTLMode.STREAM)",
    ], setup="d = Dyad()")
    assert res[0]["rc"] == DyadRC.DYAD_RC_BADDTLMODE == -1004
    assert res[0]["name"] == "DYAD_RC_BADDTLMODE" and "NOPE" in res[0]["msg"] and "FLUX_RPC" in res[0]["msg"]
    assert res[1]["rc"] == DyadRC.DYAD_RC_BADMANAGEDPATH == -1003
    assert res[2]["rc"] == DyadRC.DYAD_RC_BAD_COMM_MODE == -1007
    assert res[3]["rc"] == 0


def test_init_env_with_a_bad_variable_names_it(cluster):
    res = errors_of(cluster[0], ["d.init_env()"], setup="d = Dyad()", DYAD_KEY_BINS="abc")
    assert res[0]["rc"] == DyadRC.DYAD_RC_NOCTX
    assert "DYAD_KEY_BINS" in res[0]["msg"] and "abc" in res[0]["msg"]


def test_explicit_init_meets_init_env_across_nodes(cluster):
    """A producer initialised with Dyad.init's defaults and a consumer
    initialised from the environment compute the same keys."""
    prod, cons = cluster[0], cluster[1]
    with open(prod.path("explicit.bin"), "wb") as f:
        f.write(b"explicit init" * 100)
    run_py(prod, f"""
        d = Dyad(); d.init(prod_managed_path={prod.dir!r})
        assert (d.prod_path, d.cons_path) == ({prod.dir!r}, None), (d.prod_path, d.cons_path)
        d.produce({prod.path('explicit.bin')!r})
    """, producer=False, consumer=False)
    run_py(cons, f"d = Dyad(); d.init_env(); d.consume({cons.path('explicit.bin')!r})", DYAD_WAIT_TIMEOUT=10)
    with open(cons.path("explicit.bin"), "rb") as f:
        assert f.read() == b"explicit init" * 100


def test_second_init_is_a_noop_unless_reinit(cluster):
    n = cluster[0]
    out = last_json(run_py(n, f"""
        a = Dyad(); a.init(prod_managed_path={n.dir!r})
        ctx = a.ctx
        b = Dyad(); b.init(cons_managed_path="/elsewhere")       # no-op: the context exists
        r = [ctx == b.ctx, b.prod_path, b.cons_path]
        b.init(cons_managed_path={n.dir!r}, reinit=True)         # reconfigures it
        r += [ctx == b.ctx, b.prod_path, b.cons_path]            # (same address, as DYAD's)
        b.finalize()
        r.append(a.ctx)
        print(json.dumps(r))
    """, producer=False, consumer=False).stdout)
    assert out == [True, n.dir, None, True, None, n.dir, None]


# -- produce / consume errors ----------------------------------------------------

def test_produce_and_consume_errors(cluster):
    n = cluster[0]
    with open(n.path("there.bin"), "wb") as f:
        f.write(b"x")
    res = errors_of(n, [
        "d.produce('')",
        f"d.produce({n.path('missing.bin')!r})",
        f"d.consume('')",
        f"d.get_metadata('/etc/hostname')",
        f"d.produce('/etc/hostname')",   # unmanaged: ignored, as in DYAD
        f"d.consume('/etc/hostname')",
        f"d.produce({n.path('there.bin')!r})",
    ])
    assert [r["rc"] for r in res] == [-1002, -1002, -1002, -1005, 0, 0, 0]
    assert "empty file name" in res[0]["msg"]
    assert "missing.bin" in res[1]["msg"] and "No such file" in res[1]["msg"]
    assert res[3]["name"] == "DYAD_RC_UNTRACKED" and "not inside the consumer directory" in res[3]["msg"]


def test_produce_without_producer_dir_and_consume_without_consumer_dir(cluster):
    n = cluster[0]
    res = errors_of(n, [f"d.produce({n.path('a.bin')!r})"], consumer=True, producer=False)
    assert res[0]["rc"] == DyadRC.DYAD_RC_BADMANAGEDPATH and "DYAD_PATH_PRODUCER" in res[0]["msg"]
    res = errors_of(n, [f"d.consume({n.path('a.bin')!r})"], consumer=False, producer=True)
    assert res[0]["rc"] == DyadRC.DYAD_RC_BADMANAGEDPATH and "DYAD_PATH_CONSUMER" in res[0]["msg"]


def test_producer_dir_not_served_by_the_node_service(cluster):
    """node1's process claims node0's directory as its producer directory."""
    with open(cluster[0].path("wrong.bin"), "wb") as f:
        f.write(b"x")
    env = pyenv(cluster[1])
    env["DYAD_PATH_PRODUCER"] = cluster[0].dir
    code = EXPECT_ERROR + f"d = Dyad(); d.init_env(); print(json.dumps(outcome(lambda: d.produce({cluster[0].path('wrong.bin')!r}))))"
    r = last_json(run_py(None, code, env=env).stdout)
    assert r["rc"] == DyadRC.DYAD_RC_BADMANAGEDPATH
    assert "is not the directory the node's service" in r["msg"]


def test_unreachable_service_is_connfail(cluster):
    n = cluster[0]
    with open(n.path("c.bin"), "wb") as f:
        f.write(b"x")
    dead = f"tcp://127.0.0.1:{harness.free_port()}"
    res = errors_of(n, [f"d.produce({n.path('c.bin')!r})", f"d.consume({n.path('other.bin')!r})"],
                    DYAD_SERVICE_URI=dead)
    for r in res:
        assert r["rc"] == DyadRC.DYAD_RC_CONNFAIL == -2009
        assert dead in r["msg"]


def test_inert_context_without_managed_paths(cluster):
    n = cluster[0]
    res = errors_of(n, ["d.consume('/tmp/x')", "d.produce('/tmp/x')"], producer=False, consumer=False)
    for r in res:
        assert r["rc"] == DyadRC.DYAD_RC_NOCTX and "inert" in r["msg"]


def test_consume_wait_timeout(cluster):
    n = cluster[1]
    t0 = time.monotonic()
    res = errors_of(n, [f"d.consume({n.path('never.bin')!r})"], DYAD_WAIT_TIMEOUT=1)
    elapsed = time.monotonic() - t0
    assert res[0]["rc"] == DyadRC.DYAD_RC_TIMEOUT == -2008
    assert "DYAD_WAIT_TIMEOUT" in res[0]["msg"]
    assert 1.0 <= elapsed < 30
    assert not os.path.exists(n.path("never.bin"))


def test_return_codes_match_the_one_list_in_the_c_header():
    import re
    header = open(os.path.join(ROOT, "include", "dyad", "common", "dyad_rc.h")).read()
    listed = {name: int(value) for name, value in re.findall(r"X\((DYAD_RC_\w+), (-?\d+),", header)}
    assert len(listed) > 30
    assert {rc.name: rc.value for rc in DyadRC} == listed


def test_unmanaged_paths_are_ignored_but_said_once(cluster):
    """Outside the managed directory produce and consume do nothing and
    return OK (as upstream DYAD), with a warning the first time and debug
    lines after."""
    n = cluster[0]
    code = EXPECT_ERROR + ("d = Dyad(); d.init_env()\n"
                           "res = [outcome(lambda: d.produce('/etc/hostname')), outcome(lambda: d.produce('/etc/passwd')),"
                           " outcome(lambda: d.consume('/etc/hostname')), outcome(lambda: d.consume('/etc/passwd'))]\n"
                           "print(json.dumps(res))\n")
    p = run_py(n, code)
    assert [r["rc"] for r in last_json(p.stdout)] == [0, 0, 0, 0]
    lines = [x for x in p.stderr.splitlines() if "ignored" in x]
    assert len(lines) == 2, p.stderr
    assert "dyad_produce('/etc/hostname'): not under " + n.dir + " (DYAD_PATH_PRODUCER): ignored" in lines[0]
    assert "dyad_consume('/etc/hostname'): not under " + n.dir + " (DYAD_PATH_CONSUMER): ignored" in lines[1]
    assert "/etc/passwd" not in p.stderr
    p = run_py(n, code, DYAD_LOG_LEVEL="debug")
    assert "dyad_produce('/etc/passwd'): not under" in p.stderr and "dyad_consume('/etc/passwd'): not under" in p.stderr


# -- upstream's 2026 API: consume_range and the five new init arguments --------------

def test_consume_range_returns_bytes_and_init_takes_the_cache_settings(cluster):
    prod, cons = cluster[0], cluster[1]
    data = os.urandom(3 << 20)
    with open(prod.path("ranged.bin"), "wb") as f:
        f.write(data)
    run_py(prod, f"d = Dyad(); d.init_env(); d.produce({prod.path('ranged.bin')!r})")
    setup = (f"d = Dyad(); d.init(cons_managed_path={cons.dir!r}, cache_capacity_bytes=1 << 24, "
             f"cache_policy=pydyad.CachePolicyMode.DYAD_CACHE_FIFO, cache_low_watermark=0.25, "
             f"cache_grace_period_sec=11, origin_path='/origin')")
    p = cons.path("ranged.bin")
    out = last_json(run_py(cons, f"""
        import hashlib
        {setup}
        from pydyad.bindings import _ctx_struct
        c = _ctx_struct(d._lib)
        r = [d.has_2026_api, c.cache_policy_mode, c.cache_capacity_bytes, c.cache_low_watermark_frac,
             c.cache_grace_period_sec, c.origin_path.decode()]
        for off, n in [(0, 1), ((3 << 20) - 1, 1), (12345, 1 << 20), (7, 0)]:
            b = d.consume_range({p!r}, off, n)
            r.append([type(b).__name__, len(b), hashlib.sha256(b).hexdigest()])
        r.append(os.path.exists({p!r}))
        print(json.dumps(r))
    """, producer=False, consumer=False, DYAD_WAIT_TIMEOUT=30).stdout)
    assert out[:6] == [True, 2, 1 << 24, 0.25, 11, "/origin"]
    import hashlib
    for got, (off, n) in zip(out[6:10], [(0, 1), ((3 << 20) - 1, 1), (12345, 1 << 20), (7, 0)]):
        assert got == ["bytes", n, hashlib.sha256(data[off:off + n]).hexdigest()]
    assert out[10] is False  # no local file
    errs = errors_of(cons, [f"d.consume_range({p!r}, (3 << 20) - 1, 2)",
                            "d.init(cons_managed_path='/x', reinit=True, cache_policy='RANDOM')"],
                     DYAD_WAIT_TIMEOUT=30)
    assert errs[0]["rc"] == DyadRC.DYAD_RC_BADFIO and "past its end (3145728 bytes)" in errs[0]["msg"], errs[0]
    assert errs[1]["rc"] == DyadRC.DYAD_RC_NOCTX and "unknown cache policy 'RANDOM'" in errs[1]["msg"], errs[1]
