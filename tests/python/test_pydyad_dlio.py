# SPDX-License-Identifier: Apache-2.0
"""pydyad.dlio.DyadTorchDataLoader driven as DLIO drives a custom loader,
against real dyadds, without DLIO installed.

A stand-in of the few DLIO modules the loader imports (written to a
temporary directory put first on PYTHONPATH) and a driver that does what
dlio_benchmark/main.py does with `reader.data_loader_classname`: imports
the class, checks it subclasses BaseDataLoader, calls Class(format_type,
dataset_type, epoch), read() once, then per epoch iterates next() and calls
finalize(). Its reader returns the sample's bytes (DLIO's returns a fixed
image), so the test sees which sample each rank read.

Each rank is a process of its own node (a dyadd each) whose dataset
directory holds only the files DLIO's sharding gives that rank (ownership is
computed here from DLIO's rule, not from the loader): a loader that reads a
file it does not own from the dataset, or waits for a produce that its owner
never makes, fails.
"""
import json
import math
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("torch")

from pydyad_testlib import finish, harness, pyenv  # noqa: E402

FILES = 12
PER_FILE = 2  # samples per file: sample g is column g % 2 of file g // 2
BATCH = 2
RANKS = 3
CLASSNAME = "pydyad.dlio.DyadTorchDataLoader"

# The stand-in of DLIO: only what pydyad.dlio and the driver touch.
STANDIN = {
    "dlio_benchmark/__init__.py": "",
    "dlio_benchmark/common/__init__.py": "",
    "dlio_benchmark/common/enumerations.py": """
import enum
class DataLoaderType(enum.Enum):
    PYTORCH = "pytorch"
    CUSTOM = "custom"
class DatasetType(enum.Enum):
    TRAIN = "train"
    VALID = "valid"
    def __str__(self):
        return self.value
""",
    "dlio_benchmark/utils/__init__.py": "",
    "dlio_benchmark/utils/config.py": """
import logging
class ConfigArguments:
    _instance = None
    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.logger = logging.getLogger("DLIO")
        ConfigArguments._instance = self
    def __getstate__(self):
        s = dict(self.__dict__); s.pop("logger"); return s
    def __setstate__(self, s):
        self.__dict__.update(s); self.logger = logging.getLogger("DLIO"); ConfigArguments._instance = self
    @staticmethod
    def get_instance():
        return ConfigArguments._instance
""",
    "dlio_benchmark/data_loader/__init__.py": "",
    "dlio_benchmark/data_loader/base_data_loader.py": """
from abc import ABC, abstractmethod
from dlio_benchmark.common.enumerations import DatasetType
from dlio_benchmark.utils.config import ConfigArguments
class BaseDataLoader(ABC):
    def __init__(self, format_type, dataset_type, epoch_number, data_loader_type):
        self._args = ConfigArguments.get_instance()
        self.dataset_type, self.format_type, self.epoch_number = dataset_type, format_type, epoch_number
        self.data_loader_type = data_loader_type
        self.num_samples = self._args.total_samples_train
        self.batch_size = self._args.batch_size
        self.logger = self._args.logger
    @abstractmethod
    def read(self): pass
    @abstractmethod
    def next(self): pass
    @abstractmethod
    def finalize(self): pass
""",
    "dlio_benchmark/reader/__init__.py": "",
    "dlio_benchmark/reader/reader_factory.py": """
import numpy as np
from dlio_benchmark.utils.config import ConfigArguments
class NPZReader:
    def __init__(self, dataset_type, thread_index, epoch):
        self.global_index_map = ConfigArguments.get_instance().train_global_index_map
    def read_index(self, g, step):
        filename, s = self.global_index_map[g]
        return np.load(filename, allow_pickle=False)["x"][..., s]
class ReaderFactory:
    @staticmethod
    def get_reader(type, dataset_type, thread_index, epoch_number):
        assert type == "npz", type
        return NPZReader(dataset_type, thread_index, epoch_number)
""",
}

# What dlio_benchmark/main.py does with a custom loader, reduced: prints one
# JSON line per epoch (the samples read, in order) and the loader's state.
DRIVER = r"""
import importlib, inspect, json, logging, math, os, sys, time
from dlio_benchmark.utils.config import ConfigArguments
from dlio_benchmark.common.enumerations import DatasetType
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
rank, world, data, files, epochs, workers = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                            int(sys.argv[5]), int(sys.argv[6]))
file_list = [os.path.join(data, "train", f"img_{f:02d}_of_{files}.npz") for f in range(files)]
args = ConfigArguments(my_rank=rank, comm_size=world, data_folder=data, file_list_train=file_list,
                       file_list_eval=[], num_samples_per_file=%(per_file)d, batch_size=%(batch)d,
                       total_samples_train=files * %(per_file)d, seed=123, seed_change_epoch=False,
                       read_threads=workers, multiprocessing_context="fork", prefetch_size=2, pin_memory=False,
                       train_global_index_map={})
modname, _, clsname = %(classname)r.rpartition(".")
cls = dict(inspect.getmembers(importlib.import_module(modname)))[clsname]
assert issubclass(cls, BaseDataLoader)
loader = cls("npz", DatasetType.TRAIN, 1)
loader.read()
max_steps = math.floor(files * %(per_file)d / %(batch)d / world)
for epoch in range(1, epochs + 1):
    read, step = [], 1
    for batch in loader.next():
        if step > max_steps:
            break
        read += [int(row[0]) for row in batch]
        step += 1
    loader.finalize()
    print(json.dumps({"epoch": epoch, "read": read, "requested": list(loader.sampler.requested),
                      "groups": getattr(loader.sampler, "groups", None),
                      "launched": getattr(loader.sampler, "launched", None)}), flush=True)
    go = os.environ.get("DLIO_TEST_PAUSE")
    if go and epoch < epochs:  # the test changes the dataset between epochs
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{go}.{rank}") and time.monotonic() < deadline:
            time.sleep(0.02)
"""


def dlio_owner(f, files=FILES, per_file=PER_FILE, ranks=RANKS):
    """DLIO's sharding (utils/config.py get_global_map_index): rank r reads
    samples [r * ceil(N / ranks), (r + 1) * ceil(N / ranks)); a file belongs
    to the rank of its first sample."""
    return (f * per_file) // math.ceil(files * per_file / ranks)


def write_standin(root):
    for rel, text in STANDIN.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text.lstrip("\n"))


def write_sample_file(path, f, pad=0, plus=0):
    """File f's samples: every value of sample g is g + plus; `pad` bytes
    more (uncompressed) make it that much bigger."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    x = np.zeros((8, PER_FILE), dtype=np.int64)
    for s in range(PER_FILE):
        x[:, s] = f * PER_FILE + s + plus
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp.npz")
    np.savez(tmp, x=x, pad=np.zeros(pad, dtype=np.uint8))
    os.rename(tmp, path)  # never half a file under its name


def run_ranks(cluster, tmp_path, ranks, epochs=2, workers=1, timeout=120, **env_extra):
    """Starts rank r (for r in `ranks`) of RANKS on node r; returns the
    processes (rank -> Popen)."""
    standin = tmp_path / "standin"
    if not standin.exists():
        write_standin(str(standin))
    procs = {}
    driver = DRIVER % {"per_file": PER_FILE, "batch": BATCH, "classname": CLASSNAME}
    extra = {"DYAD_WAIT_TIMEOUT": 60, "DYAD_DLIO_AHEAD": 4, "DYAD_DLIO_PREFIX": "ds", **env_extra}
    for r in ranks:
        node = cluster[r]
        env = pyenv(node, consumer=False, DYAD_PATH_CONSUMER=str(tmp_path / f"cons{r}"), **extra)
        env["PYTHONPATH"] = f"{standin}{os.pathsep}{env['PYTHONPATH']}"
        procs[r] = subprocess.Popen([sys.executable, "-c", driver, str(r), str(RANKS), str(tmp_path / f"data{r}"),
                                     str(FILES), str(epochs), str(workers)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
    return procs


@pytest.fixture
def three():
    c = harness.Cluster(nodes=RANKS)
    yield c
    c.cleanup()


def make_datasets(tmp_path, cluster, already_produced=(), pad=0):
    """Rank r's dataset has only the files DLIO's sharding gives it; a file
    in already_produced is instead in its owner's producer directory."""
    for f in range(FILES):
        r = dlio_owner(f)
        rel = os.path.join("train", f"img_{f:02d}_of_{FILES}.npz")
        write_sample_file(os.path.join(cluster[r].dir, "ds", rel) if f in already_produced
                          else str(tmp_path / f"data{r}" / rel), f, pad=pad)


def epochs_of(out):
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def test_dlio_loader_ownership_consume_and_prefetch_order(three, tmp_path):
    make_datasets(tmp_path, three, already_produced={0})
    procs = run_ranks(three, tmp_path, range(RANKS))
    results = {}
    for r, p in procs.items():
        out, err = finish(p, timeout=180)
        results[r] = (epochs_of(out), err)
    total = FILES * PER_FILE
    for epoch in (1, 2):
        everything = []
        for r in range(RANKS):
            e = results[r][0][epoch - 1]
            assert e["epoch"] == epoch
            everything += e["read"]
        # One epoch reads every sample exactly once over the ranks, each
        # with the bytes of its own file (the reader returned the value g).
        assert sorted(everything) == list(range(total)), everything
    for r in range(RANKS):
        (e1, e2), err = results[r]
        owned = {f for f in range(FILES) if dlio_owner(f) == r}
        others = [g for g in e1["read"] if g // PER_FILE not in owned]
        assert others, f"rank {r} read only samples it owns: nothing went through DYAD"
        # Prefetch: the files of others' samples, in the order the epoch
        # read them (first sample of each file), none owned by the rank.
        want = []
        for g in e1["read"]:
            name = os.path.join("ds", "train", f"img_{g // PER_FILE:02d}_of_{FILES}.npz")
            if g // PER_FILE not in owned and name not in want:
                want.append(name)
        assert e1["requested"] == want, (r, e1["requested"], want)
        # Epoch 2 (same seed: seed_change_epoch off) reads the same samples,
        # all on the node already: the prefetch checks the same files again
        # (batched lookups: a copy here must still be the current produce).
        assert sorted(e2["read"]) == sorted(e1["read"])
        assert e2["requested"] == e1["requested"] + want
        # Staging: the owned files, copied from the dataset (file 0 was in
        # rank 0's producer directory already and is published as it is).
        copied = len(owned) - (1 if r == 0 else 0)
        assert f"({copied} copied from the dataset, {len(owned) - copied} already in" in err, err
        # Consumed copies of others' files, and only those, in the consumer dir.
        got = sorted(os.listdir(tmp_path / f"cons{r}" / "ds" / "train"))
        assert got == sorted(os.path.basename(n) for n in want), got
    # Each node's service published exactly the files its rank owns.
    for r in range(RANKS):
        listed = harness_ls(three[r])
        want = sorted(f"ds/train/img_{f:02d}_of_{FILES}.npz" for f in range(FILES) if dlio_owner(f) == r)
        assert listed == want, (r, listed, want)


def harness_ls(node):
    """Files whose record names `node` (dyad ls --json: one object a line)."""
    rows = [json.loads(l) for l in node.dyad("--json", "ls").stdout.splitlines() if l.strip()]
    return sorted(row["path"] for row in rows if row["node"] == node.name)


def test_dlio_loader_error_names_the_sample(three, tmp_path):
    # Rank 1 never runs: rank 0's first sample owned by rank 1 cannot come.
    make_datasets(tmp_path, three)
    procs = run_ranks(three, tmp_path, [0], epochs=1, DYAD_WAIT_TIMEOUT=3)
    out, err = finish(procs[0], timeout=120, check=False)
    assert procs[0].returncode != 0, out
    assert "pydyad.dlio: rank 0 could not read sample " in err, err
    assert "owned by rank 1)" in err or "owned by rank 2)" in err, err


def test_rank_and_world_without_dlio(monkeypatch):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    from pydyad import dlio
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                "PMIX_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "DYAD_DLIO_RANK", "DYAD_DLIO_WORLD"):
        monkeypatch.delenv(var, raising=False)
    assert dlio.rank_and_world() == (0, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert dlio.rank_and_world() == (2, 4)

    class Args:
        my_rank, comm_size = 1, 3
    assert dlio.rank_and_world(Args()) == (1, 3)
    # DLIO's sharding of 10 files x 3 samples over 4 ranks (blocks of 8).
    assert [dlio.owner_of(f, 10, 3, 4) for f in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]


def read_trace(directory):
    """Events of every trace file in `directory` (a file cut short by a
    process's exit is closed here)."""
    events = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            text = f.read().rstrip().rstrip(",")
        events += json.loads(text if text.endswith("]") else text + "]")
    return [e for e in events if e.get("ph") == "X"]


def test_prefetch_holds_its_byte_budget_and_brings_the_first_batch_first(three, tmp_path):
    # Files of ~64 KiB; a budget of 150000 bytes holds two of them.
    pad, budget = 64 << 10, 150000
    make_datasets(tmp_path, three, pad=pad)
    trace = tmp_path / "trace0"
    procs = run_ranks(three, tmp_path, [1, 2], epochs=1, DYAD_DLIO_AHEAD=64, DYAD_DLIO_INFLIGHT_BYTES=budget)
    procs.update(run_ranks(three, tmp_path, [0], epochs=1, DYAD_DLIO_AHEAD=64, DYAD_DLIO_INFLIGHT_BYTES=budget,
                           DYAD_TRACE=str(trace)))
    results = {r: epochs_of(finish(p, timeout=180)[0]) for r, p in procs.items()}
    (e1,) = results[0]
    events = read_trace(trace)
    commits = [e for e in events if e["name"] == "commit"]
    assert [e for e in events if e["name"] == "consume_many"] and commits, events
    # What rank 0's prefetch had in flight: a file from the start of the
    # consume_many call that asked for it (the loader's record) to the end of
    # its commit (libdyad's own trace, with the bytes it installed).
    # (A loader without that record: from the start of the last consume_many
    # call before the commit, which can only count less.)
    launched = e1["launched"] or []
    started = {name: t * 1e6 for t, names in launched for name in names}
    calls = sorted(e["ts"] for e in events if e["name"] == "consume_many")
    spans = []
    for c in commits:
        start = started.get(c["args"]["path"], max([t for t in calls if t <= c["ts"]], default=c["ts"]))
        spans.append((start, c["ts"] + c["dur"], c["args"]["bytes"]))
    held = [sum(b for s, e, b in spans if s <= t <= e) for t, _, _ in spans]
    assert max(held) <= budget, (held, budget)
    # The first call brings exactly the first batch's files owned elsewhere.
    owned = {f for f in range(FILES) if dlio_owner(f) == 0}
    first = {os.path.join("ds", "train", f"img_{g // PER_FILE:02d}_of_{FILES}.npz") for g in e1["read"][:BATCH]
             if g // PER_FILE not in owned}
    assert launched and set(launched[0][1]) == first, (launched[:1], first, e1["read"][:BATCH])


def test_local_samples_are_read_without_a_lookup_and_never_stale(three, tmp_path):
    make_datasets(tmp_path, three)
    trace = tmp_path / "trace0"
    go = tmp_path / "go"
    procs = run_ranks(three, tmp_path, [1, 2], DLIO_TEST_PAUSE=str(go))
    procs.update(run_ranks(three, tmp_path, [0], DLIO_TEST_PAUSE=str(go), DYAD_TRACE=str(trace)))
    first = {}
    for r, p in procs.items():  # each rank's epoch 1, then it waits
        line = p.stdout.readline()
        assert line.startswith("{"), (r, line, p.stderr.read() if p.poll() is not None else "")
        first[r] = json.loads(line)
    # A file rank 0 read from another rank is produced again, changed.
    owned0 = {f for f in range(FILES) if dlio_owner(f) == 0}
    f = next(g // PER_FILE for g in first[0]["read"] if g // PER_FILE not in owned0)
    q = dlio_owner(f)
    path = os.path.join(three[q].dir, "ds", "train", f"img_{f:02d}_of_{FILES}.npz")
    write_sample_file(path, f, plus=1000)
    three[q].dyad("produce", path)
    for r in range(RANKS):
        (go.parent / f"{go.name}.{r}").touch()
    second = {}
    for r, p in procs.items():
        out, _ = finish(p, timeout=180)
        second[r] = epochs_of(out)[0]
    # Rank 0 read others' samples in both epochs without a lookup of its
    # own in its DataLoader worker: no single-file consume in its trace.
    events = read_trace(trace)
    assert [e for e in events if e["name"] == "consume_many"], events
    assert [e["args"].get("path") for e in events if e["name"] == "consume"] == []
    # Every rank read the file produced again as it is now, never stale.
    for r in range(RANKS):
        want = sorted(g + 1000 if g // PER_FILE == f else g for g in first[r]["read"])
        assert sorted(second[r]["read"]) == want, (r, f, second[r]["read"], want)
