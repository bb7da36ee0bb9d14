# SPDX-License-Identifier: Apache-2.0
"""The public API cannot be talked into fetching a file it did not look up."""
import os

from pydyad_testlib import run_py


def test_consume_w_metadata_with_another_files_record_is_refused(cluster):
    prod, cons = cluster[0], cluster[1]
    for name, text in (("a.txt", "public"), ("b.txt", "never produced")):
        with open(prod.path(name), "w") as f:
            f.write(text)
    prod.dyad("produce", prod.path("a.txt"))
    p = run_py(cons, f"""
        d = Dyad()
        d.init_env()
        meta = d.get_metadata({cons.path("a.txt")!r}, should_wait=True)
        try:
            d.consume_w_metadata({cons.path("b.txt")!r}, meta)
            print("installed")
        except DyadError as e:
            print("refused", e.rc.name if hasattr(e.rc, "name") else e.rc, e)
    """)
    assert p.stdout.startswith("refused"), p.stdout + p.stderr
    assert "DYAD_RC_BADMETADATA" in p.stdout and "a.txt" in p.stdout
    assert not os.path.exists(cons.path("b.txt"))
    # The service never saw a fetch of b.txt; the record of a.txt still works.
    assert prod.status()["counters"]["requests"] == 0
    p = run_py(cons, f"""
        d = Dyad()
        d.init_env()
        d.consume_w_metadata({cons.path("a.txt")!r}, d.get_metadata({cons.path("a.txt")!r}))
    """)
    with open(cons.path("a.txt")) as f:
        assert f.read() == "public"
