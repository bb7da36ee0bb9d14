# SPDX-License-Identifier: Apache-2.0
"""A DYAD data loader for DLIO (github argonne-lcf/dlio_benchmark), PyTorch.

In the workload's YAML (or as hydra overrides)::

    reader:
      data_loader: pytorch
      data_loader_classname: pydyad.dlio.DyadTorchDataLoader
      data_loader_sampler: index

with ``python/`` on PYTHONPATH and each rank's DYAD environment
(DYAD_SERVICE_URI of its node's dyadd, DYAD_PATH_PRODUCER, DYAD_PATH_CONSUMER,
DYAD_AUTH_KEY_FILE...). No Flux: the rank and the number of ranks come from
DLIO's configuration (which has them from MPI), else from mpi4py when MPI
is initialised, else from the launcher's environment (OMPI_COMM_WORLD_*,
PMI_*, SLURM_*), else DYAD_DLIO_RANK / DYAD_DLIO_WORLD.

What each rank does:

- Ownership. File f of DLIO's file list is owned by the rank DLIO's own
  sharding gives its first sample to: contiguous blocks of
  ceil(samples / ranks) samples (owner_of()).
- Produce or consume. Before the first epoch (read()) every rank publishes
  the files it owns: a file already in the producer directory (produced
  there earlier, e.g. by the workflow that made it) is published as it is,
  otherwise it is read from the dataset (DLIO's data_folder) into the
  producer directory first. A rank never reads a file of the dataset it does
  not own: those come through DYAD into the consumer directory.
- Order. By default (DYAD_DLIO_SHUFFLE=global) the samples of an epoch are
  one permutation of every sample, the same on every rank (seeded with
  DLIO's seed, plus the epoch when reader.seed_change_epoch is true), cut
  into one contiguous piece per rank: each rank reads others' samples.
  DYAD_DLIO_SHUFFLE=none keeps DLIO's own blocks (a rank reads only what it
  owns; DYAD moves nothing).
- Prefetch. Each epoch (a pass of the sampler), a thread of the process
  that iterates the loader consumes the files of the epoch's samples owned
  elsewhere with Dyad.consume_many, in reading order, in groups: at most
  DYAD_DLIO_INFLIGHT_BYTES (default 64 MiB) in flight, the first group the
  first batch's files, then groups twice the last up to half the budget
  (DyadPrefetchSampler). A worker reads a file the prefetch consumed in this
  pass without a lookup when the copy still carries the install stamp the
  prefetch saw (local_mark()), waits for one the prefetch has not finished
  (asking for it first), or consumes it itself.
- Names. A file's DYAD name is DYAD_DLIO_PREFIX (default: the last
  component of data_folder) / its path under data_folder, in the producer
  and consumer directories of DYAD.
- Errors name the sample: a sample that cannot be read (its owner never
  published it within DYAD_WAIT_TIMEOUT, an owned file missing from the
  dataset) raises DyadDLIOError with the sample's index, file and owner.

The samples are read with DLIO's own reader for the format (so DLIO's
per-format cost and profiling stay), from the copy DYAD brought to this node.
Every pass checks every file again (batched lookups): a file produced again
between epochs is never read stale.

Everything but DyadTorchDataLoader (owner_of, Plan, stage_owned,
DyadSampleSet, DyadPrefetchSampler) is plain Python without DLIO: the tests
drive it with a stand-in of DLIO (tests/python/test_pydyad_dlio.py).
"""
import hashlib
import math
import multiprocessing
import os
import pickle
import random
import shutil
import stat
import threading
import time

from .bindings import Dyad, DyadError

__all__ = ["DyadDLIOError", "DyadPrefetchSampler", "DyadSampleSet", "Plan", "local_mark", "owner_of",
           "rank_and_world", "stage_owned", "DyadTorchDataLoader"]


class DyadDLIOError(RuntimeError):
    """A sample the DYAD loader could not deliver (the message names it)."""


def _env_int(names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise DyadDLIOError(f"pydyad.dlio: {n}={v!r} is not an integer") from None
    return None


def rank_and_world(args=None):
    """(rank, world): DLIO's configuration (args.my_rank, args.comm_size),
    else MPI's COMM_WORLD when mpi4py is loaded and MPI initialised, else the
    launcher's environment, else DYAD_DLIO_RANK/DYAD_DLIO_WORLD, else (0, 1)."""
    if args is not None and getattr(args, "comm_size", None):
        return int(args.my_rank), int(args.comm_size)
    import sys
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    for rn, wn in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                   ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                   ("DYAD_DLIO_RANK", "DYAD_DLIO_WORLD")):
        r, w = _env_int([rn]), _env_int([wn])
        if r is not None and w is not None:
            return r, w
    return 0, 1


def owner_of(file_index, num_files, samples_per_file, world):
    """The rank that owns file `file_index`: the one DLIO's sharding gives
    the file's first sample to (blocks of ceil(samples / world))."""
    total = num_files * samples_per_file
    per_rank = max(1, math.ceil(total / world))
    return min(world - 1, (file_index * samples_per_file) // per_rank)


class Plan:
    """Who owns what and who reads what, identical on every rank.

    files: DLIO's file list (paths of the dataset); root: the directory the
    names are relative to (DLIO's data_folder); the DYAD name of a file is
    prefix/(its path relative to root), prefix defaulting to root's last
    component (so that two datasets of one job do not collide)."""

    def __init__(self, files, root, samples_per_file, rank, world, seed=123, seed_change_epoch=True,
                 shuffle="global", prefix=None):
        if world < 1 or not 0 <= rank < world:
            raise DyadDLIOError(f"pydyad.dlio: rank {rank} of {world} ranks is not a valid rank")
        if shuffle not in ("global", "none"):
            raise DyadDLIOError(f"pydyad.dlio: DYAD_DLIO_SHUFFLE={shuffle!r}: use 'global' or 'none'")
        self.files = [os.fspath(f) for f in files]
        self.root = os.path.abspath(os.fspath(root))
        self.samples_per_file = max(1, int(samples_per_file))
        self.rank, self.world = int(rank), int(world)
        self.seed, self.seed_change_epoch, self.shuffle = int(seed), bool(seed_change_epoch), shuffle
        if prefix is None:
            prefix = os.path.basename(self.root.rstrip(os.sep))
        if os.path.isabs(prefix) or ".." in prefix.split(os.sep):
            raise DyadDLIOError(f"pydyad.dlio: DYAD_DLIO_PREFIX={prefix!r} must be a relative path without '..'")
        self.names = []
        for f in self.files:
            rel = os.path.relpath(os.path.abspath(f), self.root)
            if rel.startswith(".." + os.sep) or rel == "..":
                raise DyadDLIOError(f"pydyad.dlio: dataset file {f} is not under the data folder {self.root}")
            self.names.append(os.path.normpath(os.path.join(prefix, rel)))

    @property
    def total(self):
        return len(self.files) * self.samples_per_file

    def owner(self, file_index):
        return owner_of(file_index, len(self.files), self.samples_per_file, self.world)

    def owned(self):
        """Indices of the files this rank owns."""
        return [f for f in range(len(self.files)) if self.owner(f) == self.rank]

    def file_of(self, sample):
        return sample // self.samples_per_file

    def order(self, epoch):
        """The global sample indices this rank reads in `epoch`, in order."""
        if getattr(self, "_order", (None,))[0] != epoch:
            self._order = (epoch, self._make_order(epoch))
        return self._order[1]

    def _make_order(self, epoch):
        per_rank = math.ceil(self.total / self.world)
        if self.shuffle == "none":
            start = self.rank * per_rank
            return list(range(start, min(self.total, start + per_rank)))
        perm = list(range(self.total))
        random.Random(self.seed + (epoch if self.seed_change_epoch else 0)).shuffle(perm)
        return perm[self.rank * per_rank:(self.rank + 1) * per_rank]


def _dyad():
    d = Dyad()
    d.init_env()
    return d


def stage_owned(plan, dyad=None, prod_dir=None, log=None):
    """Publishes every file this rank owns (before the first epoch): a file
    already in the producer directory is published as it is, else it is
    copied there from the dataset first (through a temporary name, so that
    no partial file is ever visible). Returns (copied, already_there)."""
    dyad = dyad or _dyad()
    prod_dir = prod_dir or dyad.prod_path
    if not prod_dir:
        raise DyadDLIOError("pydyad.dlio: no producer directory: set DYAD_PATH_PRODUCER to the directory "
                            "this node's dyadd serves")
    copied = there = 0
    for f in plan.owned():
        src, dst = plan.files[f], os.path.join(prod_dir, plan.names[f])
        if os.path.abspath(src) != os.path.abspath(dst) and not os.path.exists(dst):
            if not os.path.exists(src):
                raise DyadDLIOError(f"pydyad.dlio: rank {plan.rank} owns file {plan.names[f]} (samples "
                                    f"{f * plan.samples_per_file}..{(f + 1) * plan.samples_per_file - 1}) but the "
                                    f"dataset has no {src}: generate the dataset on this node, or produce the file "
                                    f"into {prod_dir}")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.dlio-{os.getpid()}.tmp")
            shutil.copyfile(src, tmp)
            os.rename(tmp, dst)
            copied += 1
        else:
            there += 1
        try:
            dyad.produce(dst)
        except DyadError as e:
            raise DyadDLIOError(f"pydyad.dlio: rank {plan.rank} could not publish its file {plan.names[f]} "
                                f"({dst}): {e}") from e
    if log:
        log(f"pydyad.dlio: rank {plan.rank} published {copied + there} files it owns "
            f"({copied} copied from the dataset, {there} already in {prod_dir})")
    return copied, there


_STAMP_ATTR = "user.dyad"  # the install stamp libdyad's consumer store sets on a copy it installed
# Per-file state in the shared table: pass * 4 + one of these.
_PLANNED, _SCHEDULED, _READY, _FAILED = 0, 1, 2, 3


def local_mark(path):
    """A 56-bit digest of which produce the copy at `path` is: its install
    stamp (the user.dyad attribute libdyad's consumer store writes: owner,
    generation, mtime, size installed), else its size and mtime (file systems
    without user xattrs, as the consumer store's own check). None when there
    is no regular file."""
    try:
        mark = os.getxattr(path, _STAMP_ATTR)
    except OSError:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        mark = f"{st.st_size} {st.st_mtime_ns}".encode()
    return int.from_bytes(hashlib.blake2b(mark, digest_size=7).digest(), "little")


class _FileTable:
    """What the prefetch knows, shared with the DataLoader's worker
    processes (an anonymous shared mapping: inherited by fork, handed over
    when a worker is spawned): slot 0 the current pass (epoch iteration);
    per file its state (pass * 4 + _PLANNED.._FAILED), the mark of the copy
    the prefetch checked, and the pass a worker wants it in."""

    def __init__(self, nfiles):
        self.arr = multiprocessing.RawArray("q", 1 + 3 * nfiles)

    @property
    def current(self):
        return self.arr[0]

    def begin_pass(self):
        self.arr[0] += 1
        return self.arr[0]

    def state(self, f):
        v = self.arr[1 + 3 * f]
        return divmod(v, 4)

    def set(self, f, pass_, state, mark=0):
        if state == _READY:
            self.arr[2 + 3 * f] = mark  # the mark before the state that vouches for it
        self.arr[1 + 3 * f] = pass_ * 4 + state

    def mark(self, f):
        return self.arr[2 + 3 * f]

    def want(self, f, pass_):
        self.arr[3 + 3 * f] = pass_

    def wanted(self, f, pass_):
        return self.arr[3 + 3 * f] == pass_


class DyadSampleSet:
    """Where sample g is on this node, and making it be there: path(g) (the
    producer copy for owned files, the consumer copy otherwise) and
    fetch(g). A file the prefetch consumed in the current pass is read as it
    is once its copy still carries the mark the prefetch saw (one getxattr, no
    lookup); a file the prefetch has scheduled is waited for; else the
    worker consumes it itself (a lookup: the copy is checked against the
    current produce). Errors raise DyadDLIOError naming the sample."""

    def __init__(self, plan, prod_dir=None, cons_dir=None):
        self.plan = plan
        self.prod_dir = os.path.abspath(prod_dir or os.environ.get("DYAD_PATH_PRODUCER", ""))
        self.cons_dir = os.path.abspath(cons_dir or os.environ.get("DYAD_PATH_CONSUMER", ""))
        if not (prod_dir or os.environ.get("DYAD_PATH_PRODUCER")) or not (
                cons_dir or os.environ.get("DYAD_PATH_CONSUMER")):
            raise DyadDLIOError("pydyad.dlio: set DYAD_PATH_PRODUCER (the directory this node's dyadd serves) and "
                                "DYAD_PATH_CONSUMER (where samples of other ranks arrive)")
        self.table = _FileTable(len(plan.files))
        wait = _env_int(["DYAD_WAIT_TIMEOUT"])
        self.wait_s = 60.0 if not wait or wait <= 0 else float(wait)
        self.local_reads = 0  # samples of others read as the prefetch left them (no lookup)
        self.own_consumes = 0  # files this process consumed itself (a lookup each)
        self._dyad = None
        self._pid = None

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_dyad"], s["_pid"] = None, None
        return s

    @property
    def dyad(self):
        if self._dyad is None or self._pid != os.getpid():
            self._dyad, self._pid = _dyad(), os.getpid()
        return self._dyad

    def mine(self, g):
        return self.plan.owner(self.plan.file_of(g)) == self.plan.rank

    def file_path(self, f):
        owned = self.plan.owner(f) == self.plan.rank
        return os.path.join(self.prod_dir if owned else self.cons_dir, self.plan.names[f])

    def path(self, g):
        return self.file_path(self.plan.file_of(g))

    def describe(self, g):
        f = self.plan.file_of(g)
        return f"sample {g} (file {self.plan.names[f]}, owned by rank {self.plan.owner(f)})"

    def _await_prefetch(self, f, pass_):
        """Waits (up to DYAD_WAIT_TIMEOUT) while the prefetch has file f
        planned or under way in this pass; True when it is ready here."""
        deadline = time.monotonic() + self.wait_s
        nap = 0.0005
        wanted = False
        while True:
            p, st = self.table.state(f)
            if p != pass_ or self.table.current != pass_ or st == _FAILED:
                return False
            if st == _READY:
                return True
            if not wanted:  # planned, not yet scheduled: ask for it next
                self.table.want(f, pass_)
                wanted = True
            if time.monotonic() >= deadline:
                return False
            time.sleep(nap)
            nap = min(nap * 2, 0.005)

    def fetch(self, g):
        """Makes sample g's file present on this node; returns its path."""
        f = self.plan.file_of(g)
        path = self.file_path(f)
        if self.plan.owner(f) == self.plan.rank:
            return path
        pass_ = self.table.current
        if pass_ > 0 and self._await_prefetch(f, pass_):
            if local_mark(path) == self.table.mark(f):
                self.local_reads += 1
                return path
        try:
            self.dyad.consume(path)
        except DyadError as e:
            raise DyadDLIOError(f"pydyad.dlio: rank {self.plan.rank} could not read {self.describe(g)} "
                                f"through DYAD into {path}: {e}. Is rank {self.plan.owner(f)} running the same "
                                f"workload (same files, same number of ranks) and publishing?") from e
        self.own_consumes += 1
        if pass_ > 0 and self.table.current == pass_:
            mark = local_mark(path)
            if mark is not None:
                self.table.set(f, pass_, _READY, mark)
        return path


class DyadPrefetchSampler:
    """A torch sampler (duck-typed: __iter__, __len__) over this rank's
    samples of each epoch (plan.order(epoch()); epoch is a callable). Each
    iteration is a pass: a thread consumes the files of this epoch's samples
    owned by other ranks with consume_many, in groups, at most `budget` bytes
    in flight at once (estimated from the sizes seen so far, each file's
    share given back as it lands; copies already here count nothing, they
    cost a batched lookup only). The first group is the first batch's files,
    then each group may be twice the last up to half the budget (ramp), so
    that one moves while the last files of the one before land; files a
    worker is waiting for go first. With ahead > 0 the prefetch stays within
    `ahead` samples of the samples handed out. requested: the file names
    asked for, in order; groups: the groups, as lists of names; launched:
    (time.time() at its start, names) per group."""

    def __init__(self, samples, epoch, ahead=0, window=0, budget=64 << 20, first=1):
        self.samples = samples
        self.epoch = epoch
        self.ahead = max(0, int(ahead))
        self.window = int(window)
        self.budget = max(1, int(budget))
        self.first = max(1, int(first))
        self.requested = []
        self.groups = []
        self.launched = []  # (time.time() when started, the group's names)
        self.failed = 0
        self._sizes = [0, 0]  # bytes, files seen
        self._thread = None
        self._stop = threading.Event()
        self._pos = 0
        self._cv = threading.Condition()
        self._bcv = threading.Condition()  # bytes in flight (estimated): self._inflight
        self._inflight = 0

    def __len__(self):
        return len(self.samples.plan.order(self.epoch()))

    def _files_ahead(self, order):
        """(position, file) of the samples owned elsewhere, in reading order,
        the first sample of each file only."""
        seen = set()
        for pos, g in enumerate(order):
            f = self.samples.plan.file_of(g)
            if f in seen or self.samples.mine(g):
                continue
            seen.add(f)
            yield pos, f

    def _estimate(self):
        total, n = self._sizes
        if n == 0:  # the sizes of files this rank owns, a first guess
            for f in self.samples.plan.owned()[:32]:
                try:
                    total += os.stat(self.samples.file_path(f)).st_size
                    n += 1
                except OSError:
                    pass
            self._sizes = [total, n]
        return total // n if n else 1 << 20

    def _next_group(self, ahead, i, target, count, pass_):
        """The next group from ahead[i:] (files wanted by a worker first), at
        most `target` bytes and `count` files to move: (group, the estimated
        bytes of each, new i)."""
        table = self.samples.table
        wanted = [k for k in range(i, len(ahead)) if table.wanted(ahead[k][1], pass_)]
        first = set(wanted)
        picks = wanted + [k for k in range(i, len(ahead)) if k not in first]
        group, costs, used, moves, est = [], [], 0, 0, self._estimate()
        for k in picks:
            pos, f = ahead[k]
            if k not in first and self.ahead and pos >= self._pos + self.ahead and group:
                break
            if table.state(f) != (pass_, _PLANNED):
                continue
            cost = 0 if local_mark(self.samples.file_path(f)) is not None else est
            if group and (used + cost > target or moves + (cost > 0) > count or len(group) >= 256):
                break
            group.append(f)
            costs.append(cost)
            used += cost
            moves += cost > 0
        while i < len(ahead) and table.state(ahead[i][1]) != (pass_, _PLANNED):
            i += 1
        return group, costs, i

    def _release(self, nbytes):
        with self._bcv:
            self._inflight -= nbytes
            self._bcv.notify_all()

    def _consume_group(self, group, costs, pass_):
        table, samples = self.samples.table, self.samples
        paths = {samples.file_path(f): (f, c) for f, c in zip(group, costs)}
        held = dict(paths)

        def done(name, error):
            f, cost = paths[name]
            if held.pop(name, None) is not None:
                self._release(cost)
            if error is None:
                mark = local_mark(name)
                try:
                    self._sizes[0] += os.stat(name).st_size
                    self._sizes[1] += 1
                except OSError:
                    pass
                if mark is not None:
                    table.set(f, pass_, _READY, mark)
                    return
            self.failed += 1  # the worker reading it consumes it and reports the error
            table.set(f, pass_, _FAILED)

        try:
            samples.dyad.consume_many(list(paths), window=self.window, on_done=done, raise_errors=False)
        finally:
            for f, c in held.values():  # any the callback did not see: the worker consumes it
                table.set(f, pass_, _FAILED)
            self._release(sum(c for _, c in held.values()))

    def _launch(self, group, costs, pass_, calls):
        """Starts consuming `group` once its bytes fit in the budget beside
        those in flight (or nothing is in flight)."""
        need = sum(costs)
        with self._bcv:
            while not self._stop.is_set() and self._inflight and self._inflight + need > self.budget:
                self._bcv.wait(1.0)
            if self._stop.is_set():
                return
            self._inflight += need
        table, names = self.samples.table, [self.samples.plan.names[f] for f in group]
        for f in group:
            table.set(f, pass_, _SCHEDULED)
        self.requested += names
        self.groups.append(names)
        self.launched.append((time.time(), names))
        t = threading.Thread(target=self._consume_group, args=(group, costs, pass_), daemon=True,
                             name="dyad-dlio-group")
        t.start()
        calls.append(t)

    def _prefetch(self, ahead, pass_, first):
        """Groups one after another, each started when its bytes fit: a
        group is at most half the budget after the first, so that the next
        one moves while the last of the one before finish."""
        i, target, count, calls = 0, None, None, []
        try:
            while i < len(ahead) and not self._stop.is_set() and self.samples.table.current == pass_:
                if target is None:  # the first group: the first batch's files
                    count = max(1, sum(1 for pos, _ in ahead if pos < first))
                    target = max(1, min(self.budget, count * self._estimate()))
                else:  # then wider, in bytes and in files to move (a copy already here costs a lookup)
                    target, count = max(1, min(self.budget // 2, target * 2)), min(256, count * 2)
                if self.ahead:
                    with self._cv:
                        self._cv.wait_for(lambda: self._stop.is_set() or ahead[i][0] < self._pos + self.ahead
                                          or any(self.samples.table.wanted(f, pass_) for _, f in ahead[i:]), 1.0)
                group, costs, i = self._next_group(ahead, i, target, count, pass_)
                # Copies already here in a call of their own: one lookup and
                # they are ready, not after the transfers of the same group.
                for part in ([k for k, c in enumerate(costs) if c == 0], [k for k, c in enumerate(costs) if c]):
                    if part:
                        self._launch([group[k] for k in part], [costs[k] for k in part], pass_, calls)
                calls = [t for t in calls if t.is_alive()]
        finally:
            for t in calls:
                t.join()
            # Files this pass will not bring (stopped, or an error here): no
            # worker waits for them, it consumes them itself.
            for _, f in ahead:
                if self.samples.table.state(f) in ((pass_, _PLANNED), (pass_, _SCHEDULED)):
                    self.samples.table.set(f, pass_, _FAILED)

    def close(self):
        """Stops the prefetch (after the group under way) and waits for its
        thread: no thread of ours inside libdyad after an epoch's finalize."""
        if self._thread is not None:
            self._stop.set()
            with self._cv:
                self._cv.notify_all()
            self._thread.join()
            self._thread = None
        self._stop.clear()

    def __iter__(self):
        # A pass the reader left early (DLIO stops at its step count) ends
        # here. The sampler hands out its last index long before the workers
        # have read the epoch: its thread goes on until the epoch's files are
        # here, or the next pass, or close().
        self.close()
        order = self.samples.plan.order(self.epoch())
        ahead = list(self._files_ahead(order))
        table = self.samples.table
        pass_ = table.begin_pass()
        for _, f in ahead:
            table.set(f, pass_, _PLANNED)
        self._pos = 0
        self._thread = threading.Thread(target=self._prefetch, args=(ahead, pass_, self.first), daemon=True,
                                        name="dyad-dlio-prefetch")
        self._thread.start()
        for pos, g in enumerate(order):
            if self.ahead:
                with self._cv:
                    self._pos = pos
                    self._cv.notify_all()
            yield g


def _dlio_config():
    """Loader settings from the environment (DLIO's configuration has no
    place for them)."""
    ahead = _env_int(["DYAD_DLIO_AHEAD"])
    budget = _env_int(["DYAD_DLIO_INFLIGHT_BYTES"])
    return {"ahead": ahead or 0, "budget": budget if budget and budget > 0 else 64 << 20,
            "shuffle": os.environ.get("DYAD_DLIO_SHUFFLE", "global"),
            "prefix": os.environ.get("DYAD_DLIO_PREFIX"),
            "window": _env_int(["DYAD_CONSUME_WINDOW"]) or 0}


try:  # The DLIO-facing class exists where DLIO is installed.
    import torch.utils.data as _tud
    from dlio_benchmark.common.enumerations import DataLoaderType as _DLT, DatasetType as _DST
    from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader as _Base
    from dlio_benchmark.reader.reader_factory import ReaderFactory as _ReaderFactory
    _DLIO_IMPORT_ERROR = None
except ImportError as _e:  # noqa: F841
    _DLIO_IMPORT_ERROR = _e
    _Base = None


class _SampleMap(dict):
    """sample -> (path of its file on this node, index in the file), filled
    on first use: holds the samples this process read, as DLIO's per-rank
    map holds that rank's."""

    def __init__(self, samples):
        super().__init__()
        self.samples = samples

    def __missing__(self, g):
        v = (self.samples.path(g), g % self.samples.plan.samples_per_file)
        self[g] = v
        return v


if _Base is not None:
    class _DyadTorchDataset(_tud.Dataset):
        """DLIO's sample reads (its format reader) on the files DYAD brings."""

        def __init__(self, samples, format_type, dataset_type, epoch, batch_size, num_workers):
            from dlio_benchmark.utils.config import ConfigArguments
            self.samples = samples
            self.format_type, self.dataset_type, self.epoch = format_type, dataset_type, epoch
            self.batch_size = batch_size
            self.serial_args = pickle.dumps(ConfigArguments.get_instance())
            self.reader = None
            self.reads = 0
            if num_workers == 0:
                self.worker_init(-1)

        def __len__(self):
            return self.samples.plan.total

        def worker_init(self, worker_id):
            from dlio_benchmark.utils.config import ConfigArguments
            pickle.loads(self.serial_args)  # DLIO's settings in this process
            args = ConfigArguments.get_instance()
            if hasattr(args, "configure_dlio_logging"):
                args.configure_dlio_logging(is_child=True)
            self.reader = _ReaderFactory.get_reader(type=self.format_type, dataset_type=self.dataset_type,
                                                    thread_index=worker_id, epoch_number=self.epoch)
            # The reader finds each sample's file in its global_index_map:
            # every sample at the copy on this node, entered as it is first
            # read (DLIO's reader formats the whole map into a debug string
            # for every sample: a map of all samples would cost more than
            # DLIO's own per-rank one).
            self.reader.global_index_map = _SampleMap(self.samples)

        def __getitem__(self, g):
            self.samples.fetch(g)
            self.reads += 1
            step = int(math.ceil(self.reads / self.batch_size))
            try:
                return self.reader.read_index(g, step)
            except OSError as e:
                raise DyadDLIOError(f"pydyad.dlio: rank {self.samples.plan.rank}: reading "
                                    f"{self.samples.describe(g)} from {self.samples.path(g)} failed: {e}") from e

    class DyadTorchDataLoader(_Base):
        """DLIO's custom data loader (reader.data_loader_classname:
        pydyad.dlio.DyadTorchDataLoader): see the module's documentation."""

        def __init__(self, format_type, dataset_type, epoch):
            super().__init__(format_type, dataset_type, epoch, _DLT.CUSTOM)
            a = self._args
            files = a.file_list_train if dataset_type is _DST.TRAIN else a.file_list_eval
            rank, world = rank_and_world(a)
            cfg = _dlio_config()
            root = os.path.join(a.data_folder)
            self.plan = Plan(files, root, a.num_samples_per_file, rank, world, seed=a.seed,
                             seed_change_epoch=a.seed_change_epoch, shuffle=cfg["shuffle"], prefix=cfg["prefix"])
            self.samples = DyadSampleSet(self.plan)
            self.cfg = cfg
            self._loader = None
            self.sampler = None
            self._reading = epoch

        def read(self):
            """Once, before the first epoch: publish what this rank owns,
            set up the torch DataLoader (DLIO's settings)."""
            a = self._args
            t0 = time.perf_counter()
            stage_owned(self.plan, self.samples.dyad, self.samples.prod_dir, log=self.logger.info)
            self.logger.info(f"pydyad.dlio: rank {self.plan.rank} staged in {time.perf_counter() - t0:.2f} s")
            workers = a.read_threads
            dataset = _DyadTorchDataset(self.samples, self.format_type, self.dataset_type, self.epoch_number,
                                        self.batch_size, workers)
            self.sampler = DyadPrefetchSampler(self.samples, lambda: self._reading, ahead=self.cfg["ahead"],
                                               window=self.cfg["window"], budget=self.cfg["budget"],
                                               first=self.batch_size)
            kw = {}
            if workers > 0:
                kw = {"multiprocessing_context": a.multiprocessing_context, "persistent_workers": True,
                      "prefetch_factor": max(2, math.ceil(a.prefetch_size / workers))}
            self._loader = _tud.DataLoader(dataset, batch_size=self.batch_size, sampler=self.sampler,
                                           num_workers=workers, pin_memory=a.pin_memory, drop_last=True,
                                           worker_init_fn=dataset.worker_init, **kw)

        def next(self):
            super().next()
            # The epoch being read, for the sampler; counted when the epoch
            # starts (DLIO may stop iterating before the end).
            self._reading = self.epoch_number
            self.epoch_number += 1
            for batch in self._loader:
                yield batch

        def finalize(self):
            """After each epoch (DLIO calls it): the prefetch stops."""
            if self.sampler is not None:
                self.sampler.close()
else:
    def __getattr__(name):
        if name == "DyadTorchDataLoader":
            raise ImportError(f"pydyad.dlio.DyadTorchDataLoader needs DLIO (dlio_benchmark) and PyTorch: "
                              f"{_DLIO_IMPORT_ERROR}")
        raise AttributeError(name)
