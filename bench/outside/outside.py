# SPDX-License-Identifier: Apache-2.0
"""The runs of `make bench-outside` (bench/outside/run.py): DLIO with DYAD's
loader, on GlusterFS and on local disk; the MD frame stream through DYAD and
over MPI; ADIOS2 when it is installed. Each run is one measurement on a
bench/workflow Env (network-namespace nodes, their dyadds, a GlusterFS
volume mounted on each, a local directory each).

Programs reach their "nodes" as real jobs do: DLIO's ranks and the MPI
frames are started by OpenMPI's mpirun (run inside the first node's
namespace), which starts its daemon on the other nodes through
bench/outside/nsenter-agent.sh (its rsh agent) instead of ssh. MPI moves
bytes over TCP between the namespaces (pml ob1, btl self,tcp): the same
veths DYAD's transfers cross, no shared memory.
"""
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "workflow"))
import workflow as wf  # noqa: E402

AGENT = os.path.join(HERE, "nsenter-agent.sh")
CONFIGS = os.path.join(HERE, "configs")
MPI_FRAMES = os.path.join(HERE, "mpi_frames.py")
LOADER = "pydyad.dlio.DyadTorchDataLoader"
DLIO_METHODS = ["dyad", "gfs", "local"]


def mpirun_base(env, nodes):
    """mpirun's command line (run in node 0's namespace) and environment."""
    used = env.nodes[:nodes]
    subnet = used[0].host.rsplit(".", 1)[0] + ".0/24"
    cmd = used[0].prefix + ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                            "--mca", "plm_rsh_agent", AGENT, "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
                            "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet]
    e = wf.Env.plain_env()
    e["OUTSIDE_NETNS_MAP"] = " ".join(f"{n.host}={env.cluster.net.namespaces[n.member]}" for n in used)
    return cmd, e


def mpmd(contexts):
    """`-np 1 --host H env K=V... ARGV : ...`: rank k on contexts[k]'s node."""
    out = []
    for k, (node, argv, extra) in enumerate(contexts):
        if k:
            out.append(":")
        out += ["-np", "1", "--host", node.host, "env"] + [f"{a}={b}" for a, b in extra.items()] + list(argv)
    return out


def run_logged(cmd, env, log_path, timeout, what):
    with open(log_path, "w") as log:
        try:
            p = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                               start_new_session=True)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{what}: still running after {timeout} s (killed); log {log_path}") from None
    if p.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"{what}: exit {p.returncode}; last lines of {log_path}:\n{tail}")


# -- DLIO ---------------------------------------------------------------------

def dlio_argv(python, workload, data_folder, out, extra=()):
    return [python, "-m", "dlio_benchmark.main", "--config-dir", CONFIGS, f"workload={workload}",
            f"++workload.dataset.data_folder={data_folder}", f"++workload.output.folder={out}",
            f"hydra.run.dir={out}/hydra", "hydra.output_subdir=null", *extra]


def generate(python, workload, dest, log_dir, files=None):
    """DLIO's own generator (one process), untimed: the dataset every
    method reads (copied or linked into place by place_dataset)."""
    extra = ["++workload.workflow.generate_data=True", "++workload.workflow.train=False"]
    if files:
        extra.append(f"++workload.dataset.num_files_train={files}")
    out = os.path.join(log_dir, f"generate-{workload}")
    run_logged(dlio_argv(python, workload, dest, out, extra), wf.Env.plain_env(),
               os.path.join(log_dir, f"generate-{workload}.log"), 1200, f"DLIO generating {workload}")
    n = len(glob.glob(os.path.join(dest, "train", "*")))
    if not n:
        raise RuntimeError(f"DLIO generated no file in {dest}/train (see {out})")
    return n


def place_dataset(env, workload, template, nodes, gfs=True):
    """The dataset where each method reads it: every node's local directory
    (hard links to the generated files: one disk here), and the GlusterFS
    volume (a copy through node 0's mount). Returns {method: [data_folder
    of rank k]}. DYAD's ranks get the local folders: its loader reads only
    the files its rank owns from them, the others come through DYAD."""
    local = []
    for n in env.nodes[:nodes]:
        d = os.path.join(env.local[n.name], workload)
        if not os.path.isdir(d):
            for sub in sorted(os.listdir(template)):  # train/, valid/ (DLIO lists both)
                if not os.path.isdir(os.path.join(template, sub)):
                    continue
                os.makedirs(os.path.join(d, sub))
                for f in sorted(os.listdir(os.path.join(template, sub))):
                    os.link(os.path.join(template, sub, f), os.path.join(d, sub, f))
        local.append(d)
    if not gfs:
        return {"dyad": local, "local": local}
    g0 = os.path.join(env.mounts[env.nodes[0].name], workload)
    if not os.path.isdir(os.path.join(g0, "train")):
        tmp = g0 + ".part"
        shutil.copytree(template, tmp)
        os.rename(tmp, g0)
    gfs = [os.path.join(env.mounts[n.name], workload) for n in env.nodes[:nodes]]
    return {"dyad": local, "local": local, "gfs": gfs}


def run_dlio(env, python, method, workload, batch, folders, nodes, epochs=2, files=None, trace_dir=None,
             timeout=1200):
    """One DLIO run of `nodes` ranks (rank k on node k): returns DLIO's
    figures and ours (per epoch: samples/s, batch waits)."""
    run = f"dlio-{workload}-{method}-{nodes}n-{uuid.uuid4().hex[:6]}"
    out = os.path.join(env.cluster.root, run)
    os.makedirs(out)
    cmd, menv = mpirun_base(env, nodes)
    contexts, cons_dirs = [], []
    for k, node in enumerate(env.nodes[:nodes]):
        extra = ["++workload.reader.data_loader_classname=" + LOADER,
                 "++workload.reader.data_loader_sampler=index"] if method == "dyad" else []
        if files:
            extra.append(f"++workload.dataset.num_files_train={files}")
        argv = dlio_argv(python, workload, folders[k], out, [f"++workload.train.epochs={epochs}", *extra])
        if method == "dyad":
            cdir = os.path.join(env.cluster.root, f"{run}-cons{k}")
            cons_dirs.append(cdir)
            ev = {"DYAD_SERVICE_URI": node.uri, "DYAD_PATH_PRODUCER": node.dir, "DYAD_PATH_CONSUMER": cdir,
                  "DYAD_WAIT_TIMEOUT": 300, "DYAD_LIBRARY": wf.LIBDYAD,
                  "PYTHONPATH": os.path.join(ROOT, "python"), "DYAD_DLIO_PREFIX": workload}
            if node.key:
                ev["DYAD_AUTH_KEY_FILE"] = node.key
            if trace_dir:
                ev["DYAD_TRACE"] = trace_dir
        else:
            ev = {}
        contexts.append((node, argv, ev))
    try:
        run_logged(cmd + mpmd(contexts), menv, os.path.join(out, "mpirun.log"), timeout,
                   f"DLIO {workload} ({method}) on {nodes} nodes")
        return parse_dlio(out, nodes, method, workload, batch)
    finally:
        for d in cons_dirs:
            shutil.rmtree(d, ignore_errors=True)


def _ts(s):
    return datetime.datetime.fromisoformat(s).timestamp()


def parse_dlio(out, nodes, method, workload, batch):
    """Per epoch: samples/s over all ranks (samples / (last end - first
    start)), the batch waits (DLIO's own 'load' time of each step), DLIO's
    reported throughput and AU."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    ranks = []
    for k in range(nodes):
        with open(os.path.join(out, f"{k}_output.json")) as f:
            o = json.load(f)
        with open(os.path.join(out, f"{k}_per_epoch_stats.json")) as f:
            s = json.load(f)
        ranks.append((o, s))
    epochs = []
    for e in sorted({int(x) for x in ranks[0][1]}):
        key = str(e)
        per_rank = [[w for blk in o[key]["load"].values() for w in blk] for o, _ in ranks]
        steps = sum(len(w) for w in per_rank)
        start = min(_ts(s[key]["start"]) for _, s in ranks)
        end = max(_ts(s[key]["end"]) for _, s in ranks)
        # Batch waits without each rank's first step of the epoch (its
        # DataLoader's start: DLIO's own metric excludes it too); kept apart.
        epochs.append({"epoch": e, "wall": end - start, "steps": steps, "samples_per_s": steps * batch / (end - start),
                       "waits": [w for ws in per_rank for w in ws[1:]], "first_waits": [ws[0] for ws in per_rank if ws]})
    m = summary.get("metric", {})
    return {"method": method, "workload": workload, "nodes": nodes, "epochs": epochs, "batch": batch,
            "dlio": {"throughput_samples_per_s": m.get("train_throughput_samples_per_second"),
                     "au_percent": m.get("train_au_percentage"),
                     "io_MB_per_s": m.get("train_io_mean_MB_per_second")},
            "out": out}


# -- the MD frame stream --------------------------------------------------------
#
# Every stream run returns the same figures, from the receiver's per-frame
# wall-clock times ("frame_done": frame i read and checked; one machine, one
# clock):
#   steady_fps / steady_MB_per_s   frames 2..N over (last done - first done):
#                                  the stream once running, start-up left out
#                                  for every method alike
#   frames_per_s / MB_per_s        N frames over the whole run, start-up in:
#                                  DYAD from the producer process's start,
#                                  ADIOS2 from the earlier of the writer's start
#                                  and the reader's Open (its rendezvous in),
#                                  MPI from the barrier after MPI_Init
#   gaps                           the times between two frames done
# MB is 10^6 bytes.


def stream_figures(res, size, t_begin, done):
    n = len(done)
    res["frame_done"] = done
    res["gaps"] = [b - a for a, b in zip(done, done[1:])]
    span = done[-1] - done[0] if n > 1 else None
    res["steady_fps"] = (n - 1) / span if span else None
    res["steady_MB_per_s"] = res["steady_fps"] * size / 1e6 if span else None
    wall = done[-1] - t_begin
    res["e2e_wall"] = wall
    res["frames_per_s"] = n / wall if wall > 0 else None
    res["MB_per_s"] = n * size / wall / 1e6 if wall > 0 else None
    res["MiB_per_s"] = n * size / wall / (1 << 20) if wall > 0 else None
    return res


def run_mpi_frames(env, size, frames, timeout=600):
    """MPI send/recv of the frames between node 0 and node 1."""
    out = os.path.join(env.cluster.root, f"mpi-{uuid.uuid4().hex[:6]}.json")
    cmd, menv = mpirun_base(env, 2)
    # A receiver that busy-polls for the next frame is starved or not by
    # whatever else shares the cores: 84 to 4,504 frames/s of 644 KiB from
    # round to round on the loaded 2 cores here. Yielding while idle, as
    # OpenMPI advises for oversubscribed nodes, made it steady (3,354-4,404).
    cmd = cmd + ["--mca", "mpi_yield_when_idle", "1"]
    argv = ["/usr/bin/python3", MPI_FRAMES, "--frames", str(frames), "--size", str(size), "--out", out]
    run_logged(cmd + mpmd([(env.nodes[0], argv, {}), (env.nodes[1], argv, {})]), menv, out + ".log", timeout,
               "MPI frames")
    with open(out) as f:
        r = json.load(f)
    os.unlink(out)
    return stream_figures(r, size, r["t_start"], r["frame_done"])


def run_dyad_frames(env, method, size, frames):
    """DYAD's MD pair (bench/workflow: producer on node 0, consumer on node
    1, sim 0: frames back to back). Frames per second over the stream's wall
    time (first write to last frame read and checked)."""
    r = wf.run_md(env, method, size, frames, pairs=1, nodes=2, sim=0.0)
    r = {k: v for k, v in r.items() if k != "dirs"}
    done = r["frame_done"]
    return stream_figures(r, size, done[-1] - r["wall"], done)


def adios2_unavailable(adios2_dir):
    if not adios2_dir:
        return "ADIOS2_DIR is not set (ADIOS2 is not in Debian 12: build it from source with SST on)"
    if not adios2_cxx_lib(adios2_dir):
        return f"ADIOS2_DIR={adios2_dir} has no lib/libadios2_cxx.so (2.10+) or lib/libadios2_cxx11.so: not an install"
    return None


def adios2_cxx_lib(adios2_dir):
    """(library directory, C++ binding's link name): libadios2_cxx from 2.10 on,
    libadios2_cxx11 before."""
    for name in ("adios2_cxx", "adios2_cxx11"):
        hits = glob.glob(os.path.join(adios2_dir, "lib*", f"lib{name}.so"))
        if hits:
            return os.path.dirname(hits[0]), name
    return None


def adios2_version(adios2_dir):
    """ADIOS2's version from its installed config header, with the source
    (tag and commit) scripts/bench-outside-adios2.sh recorded, if it did."""
    version = "unknown"
    for h in glob.glob(os.path.join(adios2_dir, "include", "adios2", "common", "ADIOSConfig.h")):
        with open(h) as f:
            for line in f:
                if line.startswith("#define ADIOS2_VERSION_STR"):
                    version = line.split()[-1].strip('"')
    note = os.path.join(adios2_dir, "bench-outside-adios2.txt")
    if os.path.exists(note):
        with open(note) as f:
            src = f.readline().strip()
        if src:
            version += f" ({src})"
    return version


def build_adios2_driver(adios2_dir, build_dir):
    """Compiles bench/outside/adios2_frames.cpp against ADIOS2_DIR."""
    lib, name = adios2_cxx_lib(adios2_dir)
    exe = os.path.join(build_dir, "adios2_frames")
    subprocess.run(["g++", "-O2", "-std=c++17", os.path.join(HERE, "adios2_frames.cpp"), "-o", exe,
                    f"-I{adios2_dir}/include", f"-L{lib}", f"-Wl,-rpath,{lib}", f"-l{name}", "-ladios2_core"],
                   check=True, capture_output=True, text=True)
    return exe


def run_adios2_frames(env, exe, engine, size, frames, timeout=600):
    """ADIOS2 (engine SST: reader on node 1, writer on node 0, TCP data
    plane; BP5: written to the GlusterFS volume on node 0, read on node 1
    as steps appear). Returns the reader's figures."""
    run = f"adios2-{engine}-{uuid.uuid4().hex[:6]}"
    work = os.path.join(env.cluster.root, run)
    os.makedirs(work)
    if engine == "BP5":
        wdir, rdir = env.mounts[env.nodes[0].name], env.mounts[env.nodes[1].name]
    else:
        wdir = rdir = work  # SST's contact file: any directory both see
    stream = f"{run}.stream"
    out, wout = os.path.join(work, "reader.json"), os.path.join(work, "writer.json")
    common = ["--engine", engine, "--frames", str(frames), "--size", str(size)]
    logs = [open(os.path.join(work, n), "w") for n in ("reader.log", "writer.log")]
    procs = [("ADIOS2 reader", env.spawn(env.nodes[1], [exe, "read", os.path.join(rdir, stream), *common,
                                                      "--out", out], wf.Env.plain_env(), logs[0])),
             ("ADIOS2 writer", env.spawn(env.nodes[0], [exe, "write", os.path.join(wdir, stream), *common,
                                                       "--out", wout],
                                         wf.Env.plain_env(), logs[1]))]
    wf._finish(procs, logs, timeout)
    with open(out) as f:
        r = json.load(f)
    with open(wout) as f:
        w = json.load(f)
    shutil.rmtree(work, ignore_errors=True)
    if engine == "BP5":
        shutil.rmtree(os.path.join(wdir, stream), ignore_errors=True)
    return stream_figures(r, size, min(w["t_start"], r["t_open"]), r["frame_done"])
