# SPDX-License-Identifier: Apache-2.0
"""pydyad.hdf.DyadFile: HDF5 files through DYAD across two nodes."""
import json
import os

import pytest

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

from pydyad_testlib import finish, last_json, run_py, spawn_py  # noqa: E402

HDF = "import numpy as np\nimport h5py\nfrom pydyad.hdf import DyadFile\n"


def stat(node, rel):
    return json.loads(node.dyad("--json", "stat", node.path(rel)).stdout)


def test_round_trip_consumer_first(cluster):
    prod, cons = cluster[0], cluster[1]
    consumer = spawn_py(cons, defs=HDF, code=f"""
        with DyadFile({cons.path('sim/out.h5')!r}, "r") as f:
            x = f["x"][...]
            print(json.dumps({{"x": x.tolist(), "dtype": str(x.dtype), "step": int(f.attrs["step"]),
                              "mode": f.mode, "dyad_mode": f.dyad_mode}}))
    """, DYAD_WAIT_TIMEOUT=60)
    cons.wait_waiters(1, procs=[consumer])
    assert consumer.poll() is None, "DyadFile(..., 'r') must wait for the produce"
    os.makedirs(prod.path("sim"))
    run_py(prod, defs=HDF, code=f"""
        f = DyadFile({prod.path('sim/out.h5')!r}, "w")
        f.create_dataset("x", data=np.arange(1000, dtype=np.float64).reshape(10, 100) / 7)
        f.attrs["step"] = 42
        f.close()
        f.close()   # a second close publishes nothing more
    """)
    out = last_json(finish(consumer, timeout=60)[0])
    assert np.array_equal(np.array(out["x"]), np.arange(1000, dtype=np.float64).reshape(10, 100) / 7)
    assert out["dtype"] == "float64" and out["step"] == 42
    assert (out["mode"], out["dyad_mode"]) == ("r", "r")
    assert stat(prod, "sim/out.h5")["generation"] == 1
    assert prod.status()["counters"]["served"] == 1


@pytest.mark.parametrize("mode", ["w", "w-", "x", "a", "r+"])
def test_write_modes_produce_on_close(cluster, mode):
    prod, cons = cluster[0], cluster[1]
    rel = f"m{mode}.h5"
    if mode in ("a", "r+"):
        with h5py.File(prod.path(rel), "w") as f:   # existing, unpublished
            f["old"] = np.arange(5)
    run_py(prod, defs=HDF, code=f"""
        with DyadFile({prod.path(rel)!r}, {mode!r}) as f:
            f["new"] = np.full((3, 4), 7, dtype=np.int32)
    """)
    assert stat(cons, rel)["size"] == os.path.getsize(prod.path(rel))
    out = last_json(run_py(cons, defs=HDF, code=f"""
        with DyadFile({cons.path(rel)!r}, "r") as f:
            print(json.dumps({{k: f[k][...].tolist() for k in sorted(f.keys())}}))
    """).stdout)
    assert out["new"] == [[7] * 4] * 3
    if mode in ("a", "r+"):
        assert out["old"] == [0, 1, 2, 3, 4]
    else:
        assert "old" not in out


def test_update_with_r_plus_bumps_generation(cluster):
    prod, cons = cluster[0], cluster[1]
    run_py(prod, defs=HDF, code=f"""
        with DyadFile({prod.path('u.h5')!r}, "w") as f:
            f["v"] = np.arange(3)
        with DyadFile({prod.path('u.h5')!r}, "r+") as f:
            f["v"][...] = np.arange(3) * 10
    """)
    assert stat(cons, "u.h5")["generation"] == 2
    out = last_json(run_py(cons, defs=HDF, code=f"""
        with DyadFile({cons.path('u.h5')!r}) as f:   # default mode: r
            print(json.dumps(f["v"][...].tolist()))
    """).stdout)
    assert out == [0, 10, 20]


def test_failed_block_and_read_mode_do_not_produce(cluster):
    prod, cons = cluster[0], cluster[1]
    with h5py.File(prod.path("local.h5"), "w") as f:
        f["a"] = np.arange(2)
    out = last_json(run_py(prod, defs=HDF, code=f"""
        try:
            with DyadFile({prod.path('bad.h5')!r}, "w") as f:
                f["a"] = np.arange(2)
                raise RuntimeError("simulation crashed")
        except RuntimeError:
            pass
        with DyadFile({prod.path('local.h5')!r}, "r") as f:  # no consumer dir: plain open
            a = f["a"][...].tolist()
        try:
            DyadFile({prod.path('local.h5')!r}, "rw")
        except ValueError as e:
            err = str(e)
        print(json.dumps([a, err]))
    """, consumer=False).stdout)
    assert out[0] == [0, 1] and "invalid mode" in out[1]
    for rel in ("bad.h5", "local.h5"):
        p = cons.dyad("stat", cons.path(rel), check=False)
        assert p.returncode == 2, f"{rel} must not have been produced"
