# SPDX-License-Identifier: Apache-2.0
"""Dyad.consume_many (dyad_consume_many) and the DataLoader's prefetching
sampler (pydyad.torch.DyadPrefetchSampler)."""
import hashlib
import os

import pytest

from pydyad_testlib import harness, last_json, run_py


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_consume_many_results_callbacks_and_errors(cluster):
    prod, cons = cluster[0], cluster[1]
    names = [f"m/f{i:03d}" for i in range(200)]
    for i, n in enumerate(names):
        harness.write_file(prod.path(n), 100 + 37 * i, seed=i)
    prod.dyad("produce", *[prod.path(n) for n in names])
    p = run_py(cons, """
        d = Dyad(); d.init_env()
        root = os.environ["DYAD_PATH_CONSUMER"]
        names = [os.path.join(root, f"m/f{i:03d}") for i in range(200)]
        missing = [os.path.join(root, "m/never1"), os.path.join(root, "m/never2")]
        seen = []
        errs = d.consume_many(names + missing + ["/etc/hostname"], window=8,
                              on_done=lambda f, e: seen.append((f, None if e is None else e.rc_name)),
                              raise_errors=False)
        out = {"errs": [None if e is None else [e.rc_name, e.path, e.message] for e in errs],
               "seen": sorted(seen, key=lambda x: x[0])}
        try:
            d.consume_many(missing)
        except DyadError as e:
            out["raised"] = [e.rc_name, e.path]
        print(json.dumps(out))
    """, DYAD_WAIT_TIMEOUT=2)
    out = last_json(p.stdout)
    errs = out["errs"]
    assert errs[:200] == [None] * 200
    for k, n in enumerate(("m/never1", "m/never2")):
        rc, path, msg = errs[200 + k]
        assert rc == "DYAD_RC_TIMEOUT" and path == cons.path(n), errs[200 + k]
        assert f"'{n}' was not produced within 2 s" in msg, msg
    assert errs[202] is None, "an unmanaged path is left alone, as by consume"
    assert len(out["seen"]) == 203, "one callback per file"
    assert out["raised"] == ["DYAD_RC_TIMEOUT", cons.path("m/never1")]
    for n in names:
        assert sha(cons.path(n)) == sha(prod.path(n)), n


def test_prefetch_sampler_brings_samples_ahead(cluster):
    pytest.importorskip("numpy")
    pytest.importorskip("torch")
    prod, cons = cluster[0], cluster[1]
    run_py(prod, """
        import numpy as np
        root = os.environ["DYAD_PATH_PRODUCER"]
        os.makedirs(os.path.join(root, "samples"), exist_ok=True)
        d = Dyad(); d.init_env()
        for i in range(96):
            p = os.path.join(root, f"samples/s{i:03d}.npy")
            np.save(p, np.full(50, i, dtype=np.int32))
            d.produce(p)
    """)
    p = run_py(cons, """
        import numpy as np
        import torch
        from torch.utils.data import DataLoader, RandomSampler
        from pydyad.torch import DyadDataset
        names = [f"samples/s{i:03d}.npy" for i in range(96)]
        ds = DyadDataset(names)
        sampler = ds.prefetch_sampler(RandomSampler(ds, generator=torch.Generator().manual_seed(3)),
                                      ahead=32, window=8)
        got = []
        for batch in DataLoader(ds, sampler=sampler, batch_size=8, num_workers=2):
            got += [int(x[0]) for x in batch]
        print(json.dumps({"got": sorted(got), "prefetched": sampler.prefetched}))
    """, DYAD_WAIT_TIMEOUT=60)
    out = last_json(p.stdout)
    assert out["got"] == list(range(96))
    # The sampler's thread consumed samples (the workers may have been first
    # for some).
    assert out["prefetched"] > 0
    # Each sample is installed once. Its bytes travel twice only when a
    # worker fetched it alone while the sampler's batch had asked for it
    # (design.md, "Many small files in one request"): at most once per
    # lone fetch.
    c = prod.status()["counters"]
    assert 96 <= c["served"] <= 96 + c["requests"], c
