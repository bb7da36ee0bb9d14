# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the multi-node tests: clusters of network namespaces (see
README.md). They skip, with the reason, where namespaces cannot be made, and
the etcd variants where etcd or dyadd's etcd backend is missing."""
import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402


def _terminate(signum, frame):
    # ctest and CI stop a run with SIGTERM: unwind, so that fixture finalizers
    # and atexit remove the namespaces (a SIGKILL leaves them to the next
    # run's harness.remove_leftover_namespaces()).
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # The outcome of each phase, for fixtures (item.rep_call.failed).
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "long: many nodes or chaos: `make test-long` (ctest -L long) only")


def require_store(store):
    # etcd is a dependency (scripts/install-deps.sh) and every dyadd has the
    # etcd backend: their absence is a failure, not a reason to skip.
    if store == "etcd":
        assert os.access(harness.ETCD, os.X_OK), f"etcd is not installed ({harness.ETCD}): make deps"
        assert "etcd://" in harness.dyadd_help(), "this dyadd has no etcd backend"


def _tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({e})\n"


@pytest.fixture
def make_cluster(request):
    """make_cluster(nodes, store, dyadd_args=()) -> a started harness.Cluster
    of `nodes` namespaces (and one for etcd with store="etcd"), removed after
    the test whatever its outcome; the tails of its logs are printed then
    when the test failed (pytest shows them)."""
    made = []

    def make(nodes, store, dyadd_args=(), start=True, etcd_only=False, etcd_members=1):
        """etcd_only: a cluster whose etcd starts, its dyadds not (any dyadd).
        etcd_members: with store="etcd", the members of its etcd cluster."""
        if etcd_only:
            if not os.access(harness.ETCD, os.X_OK):
                pytest.skip(f"etcd is not installed ({harness.ETCD}): run scripts/install-deps.sh")
        else:
            require_store(store)
        reason = harness.netns_unavailable_reason()
        if reason:
            pytest.skip(reason)
        try:
            c = harness.Cluster(nodes=nodes, netns="require", store=store, dyadd_args=dyadd_args,
                                start=start and not etcd_only, etcd_members=etcd_members)
        except harness.NetnsUnavailable as e:
            pytest.skip(str(e))
        made.append(c)
        if etcd_only:
            c.etcd.start()
        return c

    yield make
    for c in made:
        etcd_logs = (c.etcd.logs if isinstance(c.etcd, harness.EtcdCluster) else [c.etcd.log]) if c.etcd else []
        logs = [n.log_path for n in c.nodes][:8] + etcd_logs  # the first 8 nodes' of a large cluster
        rep = getattr(request.node, "rep_call", None)
        try:
            for path in (logs if rep is None or rep.failed else []):
                print(f"--- {os.path.relpath(path, c.root)} (last lines)\n{_tail(path)}")
        finally:
            c.cleanup()
