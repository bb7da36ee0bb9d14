# SPDX-License-Identifier: Apache-2.0
"""The workflow bench's workloads (bench/workflow, `make bench-workflow`) at a
tiny size: network-namespace nodes with their dyadd, a real GlusterFS volume
served from a namespace of its own and FUSE-mounted on every node. Each
workload goes through DYAD and through GlusterFS; every frame and sample is
checked byte for byte (by the programs themselves, and here against the
producer's copy). Skips with the reason where namespaces or GlusterFS cannot
run (not root, /dev/fuse or the packages missing)."""
import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "workflow"))
import workflow as wf  # noqa: E402

sha = wf.harness.sha256


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # ctest's SIGTERM: unwind, unmount, remove the namespaces


signal.signal(signal.SIGTERM, _terminate)


@pytest.fixture(scope="module")
def env():
    reason = wf.unavailable_reason()
    if reason:
        pytest.skip(reason)
    e = wf.Env(3)
    yield e
    e.close()


def tree(d):
    """{relative path: sha256} of the regular files under d."""
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, d)] = sha(p)
    return out


@pytest.mark.parametrize("size", ["644KiB", "2.46MiB"])
def test_md_pipeline_smoke(env, size):
    """One pair, producer on node0 and consumer on node1, 4 frames: through
    the LD_PRELOAD wrapper and pydyad, and through GlusterFS with a polling
    and a barrier consumer. The consumer's frames are the producer's. The
    wrapper also with DYAD_ASYNC_PUBLISH=1, at one size."""
    nbytes = wf.FRAME_SIZES[size]
    extra = ["dyad-wrapper-async"] if size == "644KiB" else []
    for method in ["local", "dyad-wrapper", "pydyad", "gfs-poll", "gfs-barrier"] + extra:
        r = wf.run_md(env, method, nbytes, 4, sim=0.01, keep=True, timeout=60)
        try:
            assert r["production"] is not None and r["production"] > 0
            if method == "local":
                continue
            assert r["movement"] is not None and r["consumption"] >= r["movement"] * 0.999
            assert len(r["frame_latency"]) == 4
            pdir, cdir = r["dirs"]
            produced, consumed = tree(pdir), tree(cdir)
            frames = {k: v for k, v in consumed.items() if k.endswith(".bin")}
            assert len(frames) == 4, (method, sorted(consumed))
            assert all(produced[k] == v for k, v in frames.items()), method
            sizes = {os.path.getsize(os.path.join(cdir, k)) for k in frames}
            assert sizes == {nbytes}, (method, sizes)
        finally:
            wf.cleanup_dirs(r["dirs"])


@pytest.mark.parametrize("workload,count,size,batch", [("resnet50", 48, 150_528, 16), ("unet3d", 3, 6_000_000, 1)])
def test_dl_reads_smoke(env, workload, count, size, batch):
    """Samples produced on node0 and node1, read on node2 by a torch
    DataLoader (2 workers) for 2 epochs: DyadDataset with the prefetch
    sampler, and plain np.load over GlusterFS and local disk. The reader
    checks every sample's bytes and order; DYAD's copies are the
    producers'."""
    for method in wf.DL_METHODS:
        r = wf.run_dl(env, method, count, size, batch, keep=True, timeout=120)
        try:
            assert [e["samples"] for e in r["epochs"]] == [count, count], method
            assert all(len(e["waits"]) == -(-count // batch) for e in r["epochs"]), method
            if method == "dyad":
                consumed = tree(r["dir"])
                assert len(consumed) == count
                run = os.path.basename(r["dir"])
                produced = {}
                for n in env.nodes[:-1]:
                    produced.update(tree(os.path.join(n.dir, run)))
                assert consumed == produced
        finally:
            dirs = [r["dir"]]
            if method == "dyad":
                dirs += [os.path.join(n.dir, os.path.basename(r["dir"])) for n in env.nodes[:-1]]
            wf.cleanup_dirs(dirs)
