# SPDX-License-Identifier: Apache-2.0
"""DYAD on a real Slurm cluster: `sbatch --dyad` (the SPANK plugin) and
`dyad job start|stop` through a launcher, without Slurm."""
import os
import re
import signal
import subprocess
import time

import harness
import slurm_cluster

DYAD = harness.DYAD
WRAPPER = slurm_cluster.WRAPPER
# pydyad (through libdyad's C API) from the source tree, on the build's library.
PY = (f"env PYTHONPATH={os.path.join(harness.ROOT, 'python')} "
      f"DYAD_LIBRARY={os.path.join(harness.BUILD, 'lib', 'libdyad.so')} /usr/bin/python3")


def same(a, b):
    return subprocess.run(["cmp", a, b], capture_output=True).returncode == 0


def submit(slurm, script, *args):
    r = slurm.cmd("sbatch", "--parsable", *args, script)
    return r.stdout.strip().split(";")[0]


def info(slurm, job=None, out=None):
    text = ""
    if out and os.path.exists(out):
        with open(out, errors="replace") as f:
            text += f"--- job output {out}\n{f.read()}\n"
    if job:
        text += slurm.cmd("scontrol", "show", "job", str(job), check=False).stdout
    return text + slurm.tail_logs(20)


def test_sbatch_dyad_consumer_first_producer_elsewhere(slurm, shared):
    """A consumer step starts first on node2 and waits; the producer step on
    node1 writes with an unmodified cp under the LD_PRELOAD wrapper and
    publishes another file with `dyad produce`; both arrive byte-identical
    (cat under the wrapper, `dyad consume`); a third goes through pydyad
    (libdyad's C API) both ways. At the end nothing is left."""
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 3 << 20, seed=7)
    out = os.path.join(shared, "out.txt")
    pyd = os.path.join(shared, "pyd.py")  # pydyad, libdyad's C API, both ways
    with open(pyd, "w") as f:
        f.write("import os, sys, pydyad\n"
                "d = pydyad.Dyad()\n"
                "d.init_env()\n"
                "if sys.argv[1] == 'produce':\n"
                "    d.produce(os.environ['DYAD_PATH_PRODUCER'] + '/run/c.bin')\n"
                "else:\n"
                "    d.consume(os.environ['DYAD_PATH_CONSUMER'] + '/run/c.bin')\n")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -o {out}
set -e
echo "batch: $DYAD_SERVICE_URI $DYAD_PATH_PRODUCER $DYAD_PATH_CONSUMER $DYAD_AUTH_KEY_FILE $DYAD_KVS_NAMESPACE"
srun --overlap -N1 -n1 -w node2 bash -c 'LD_PRELOAD={WRAPPER} cat $DYAD_PATH_CONSUMER/run/a.bin > {shared}/a.copy' &
srun --overlap -N1 -n1 -w node2 {DYAD} consume --timeout 60 $DYAD_PATH_CONSUMER/run/b.bin &
srun --overlap -N1 -n1 -w node2 bash -c '{PY} {pyd} consume && cp $DYAD_PATH_CONSUMER/run/c.bin {shared}/c.copy' &
srun --overlap -N1 -n1 -w node1 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/run &&
  LD_PRELOAD={WRAPPER} cp {src} $DYAD_PATH_PRODUCER/run/a.bin &&
  cp {src} $DYAD_PATH_PRODUCER/run/b.bin && {DYAD} produce $DYAD_PATH_PRODUCER/run/b.bin &&
  cp {src} $DYAD_PATH_PRODUCER/run/c.bin && {PY} {pyd} produce &&
  stat -c "key %a %U" $DYAD_AUTH_KEY_FILE && stat -c "dir %a %U" $(dirname $DYAD_AUTH_KEY_FILE)'
wait
srun --overlap -N1 -n1 -w node2 cp $DYAD_PATH_CONSUMER/run/b.bin {shared}/b.copy
echo done
""")
    job = submit(slurm, script, "--dyad")
    state = slurm.wait_job_done(job, 90)
    assert state == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    assert f"batch: unix:/tmp/dyad/0/{job}/dyadd.sock" in text, text
    assert "key 600 root" in text and "dir 700 root" in text, text
    assert "fetched 3.0 MiB" in text, text
    assert same(src, os.path.join(shared, "a.copy")), info(slurm, job, out)
    assert same(src, os.path.join(shared, "b.copy")), info(slurm, job, out)
    assert same(src, os.path.join(shared, "c.copy")), info(slurm, job, out)  # pydyad, the C API
    assert slurm.leftovers(job) == [], info(slurm, job, out)


def test_without_dyad_nothing_happens(slurm, shared):
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH -N2\n#SBATCH -o {out}\nenv | grep ^DYAD_ || true\n"
                "ls -d /tmp/dyad-$SLURM_JOB_ID /tmp/dyad/*/$SLURM_JOB_ID /tmp/dyad/job-$SLURM_JOB_ID 2>/dev/null || true\n"
                "echo end\n")
    job = submit(slurm, script)
    assert slurm.wait_job_done(job, 60) == "COMPLETED", info(slurm, job, out)
    assert open(out).read().strip() == "end", info(slurm, job, out)


def test_scancel_stops_and_cleans_every_node(slurm, shared):
    """A 4-node --dyad job cancelled while it runs: its epilog stops every
    dyadd and removes key, directory and /dev/shm files on every node. Also
    the measurements: prolog to every dyadd ready, end to everything removed."""
    out = os.path.join(shared, "out.txt")
    ready = os.path.join(shared, "ready")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N4
#SBATCH -o {out}
srun --overlap -N4 -n4 bash -c '{DYAD} service status >/dev/null && echo "$SLURMD_NODENAME ok"' > {shared}/status.txt
# a consumer waiting for a file nobody produces: cancelled mid-wait
srun --overlap -N1 -n1 -w node3 {DYAD} consume $DYAD_PATH_CONSUMER/never.bin &
touch {ready}
sleep 300
""")
    job = submit(slurm, script, "--dyad")
    harness.wait_for(lambda: os.path.exists(ready) or slurm.job_state(job) not in ("PENDING", "RUNNING"), 60,
                     what=f"job {job} to run")
    with open(os.path.join(shared, "status.txt")) as f:
        assert sorted(f.read().splitlines()) == [f"{n} ok" for n in slurm.names], info(slurm, job, out)
    started = [n for n in slurm.names if os.path.exists(os.path.join(slurm.job_dir(n, job), "job.key"))]
    assert started == slurm.names, info(slurm, job, out)
    t = time.monotonic()
    slurm.cmd("scancel", job)
    assert slurm.wait_job_done(job, 60) == "CANCELLED", info(slurm, job, out)
    ended = time.monotonic() - t
    assert slurm.leftovers(job) == [], info(slurm, job, out)
    logs = "".join(open(p, errors="replace").read() for p in slurm.logs if "slurmd-" in p)
    def stamped(pattern):  # [(log time in s, duration in s)] of the plugin's lines
        found = re.findall(r"\[\d{4}-\d\d-\d\dT(\d\d):(\d\d):([\d.]+)\] " + pattern, logs)
        return [(int(h) * 3600 + int(m) * 60 + float(sec), float(d)) for h, m, sec, d in found]

    up = stamped(rf"dyad: job {job}: dyadd ready on node\d in ([\d.]+) s")
    down = stamped(rf"dyad: job {job}: stopped and cleaned in ([\d.]+) s")
    assert len(up) == 4 and len(down) == 4, logs[-3000:]
    # first prolog's start to the last node's dyadd ready; first epilog's start to the last one's end
    all_up = max(t for t, _ in up) - min(t - d for t, d in up)
    all_down = max(t for t, _ in down) - min(t - d for t, d in down)
    line = (f"4 nodes: first prolog start to every dyadd ready {all_up:.3f} s (slowest node's prolog "
            f"{max(d for _, d in up):.3f} s); first epilog start to every node clean {all_down:.3f} s; "
            f"scancel to nothing left on any node {ended:.2f} s")
    print(line)
    with open(os.path.join(harness.BUILD, "slurm-timings.txt"), "a") as f:
        f.write(line + "\n")


def test_job_start_stop_with_a_launcher(slurm):
    """Without Slurm: `dyad job start --launcher 'nsenter ... {host}'` on the
    four nodes, a transfer between two of them, a crashed dyadd, then
    `dyad job stop` leaves nothing; a second stop is harmless."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DYAD_"))}
    job = f"t{os.getpid()}"
    base = ["--launcher", slurm.launcher_template(), "--nodes", "node[1-4]", "--job-id", job]
    env_file = os.path.join(slurm.root, f"{job}.env")
    r = subprocess.run([DYAD, "job", "start", *base, "--env-file", env_file, "--timeout", "30"],
                       capture_output=True, text=True, env=env, timeout=90)
    try:
        assert r.returncode == 0, r.stderr + slurm.tail_logs()
        assert "4 dyadd ready" in r.stderr, r.stderr
        with open(os.path.join(harness.BUILD, "slurm-timings.txt"), "a") as f:
            f.write(r.stderr.strip().splitlines()[-1] + "\n")
        assert open(env_file).read() == r.stdout
        job_env = dict(env)
        for m in re.finditer(r"^export (\w+)='([^']*)'$", r.stdout, re.M):
            job_env[m.group(1)] = m.group(2)
        assert job_env["DYAD_SERVICE_URI"] == f"unix:/tmp/dyad-{job}/dyadd.sock"
        data = job_env["DYAD_PATH_PRODUCER"]
        for n in slurm.names:
            st = os.stat(os.path.join(slurm.node_tmp(n), f"dyad-{job}", "job.key"))
            assert st.st_mode & 0o777 == 0o600
        # 4 nodes: the job's own etcd, a member on each of the first three
        assert [len(slurm.processes(n, "etcd")) for n in slurm.names] == [1, 1, 1, 0]
        payload = os.urandom(1 << 20)
        # consumer first (node3, waits), producer on node4: unmodified cat under the wrapper
        consumer = subprocess.Popen(slurm.prefix("node3") + ["cat", f"{data}/x/f.bin"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=dict(job_env, LD_PRELOAD=WRAPPER))
        p = subprocess.run(slurm.prefix("node4") + ["sh", "-c", f"mkdir -p {data}/x && cat > {data}/x/f.bin"],
                           input=payload, capture_output=True, env=dict(job_env, LD_PRELOAD=WRAPPER), timeout=60)
        assert p.returncode == 0, p.stderr
        got, err = consumer.communicate(timeout=60)
        assert consumer.returncode == 0 and got == payload, err
        # node2's dyadd crashes: stop still cleans everything.
        pid = int(open(os.path.join(slurm.node_tmp("node2"), f"dyad-{job}", "dyadd.pid")).read())
        os.kill(pid, signal.SIGKILL)
    finally:
        s = subprocess.run([DYAD, "job", "stop", *base], capture_output=True, text=True, env=env, timeout=90)
    assert s.returncode == 0, s.stderr
    with open(os.path.join(harness.BUILD, "slurm-timings.txt"), "a") as f:
        f.write(s.stderr.strip().splitlines()[-1] + "\n")
    assert slurm.leftovers(job) == []
    assert all(not slurm.processes(n, "etcd") for n in slurm.names)
    again = subprocess.run([DYAD, "stop", *base], capture_output=True, text=True, env=env, timeout=90)
    assert again.returncode == 0, again.stderr


def test_job_start_names_the_failing_node(slurm):
    """A node whose dyadd cannot start: start fails, naming that node and
    its log, and leaves no service running anywhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DYAD_"))}
    job = f"f{os.getpid()}"
    base = ["--launcher", slurm.launcher_template(), "--nodes", "node[1-2]", "--job-id", job]
    r = subprocess.run([DYAD, "job", "start", *base, "--dyadd-arg=--transports=NOPE", "--timeout", "20"],
                       capture_output=True, text=True, env=env, timeout=90)
    try:
        assert r.returncode != 0
        assert "node node1" in r.stderr and f"/tmp/dyad-{job}/dyadd.log" in r.stderr, r.stderr
        # a failed start removes what it made: no process, directory nor launch logs
        assert slurm.leftovers(job) == []
        launch = os.path.join(env.get("TMPDIR", "/tmp"), f"dyad-{job}-0.launch")
        assert not os.path.exists(launch), r.stderr
    finally:
        subprocess.run([DYAD, "job", "stop", *base], capture_output=True, text=True, env=env, timeout=90)
    assert slurm.leftovers(job) == []


def test_unprivileged_user_job(slurm, shared):
    """A job of an unprivileged user (nobody): its dyadds run as that user,
    the key is theirs with mode 0600; another user (daemon) can neither read
    the key nor get a file from the job's dyadd."""
    import pwd
    user = pwd.getpwnam("nobody")
    other = pwd.getpwnam("daemon")
    os.chmod(shared, 0o777)
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 1 << 20, seed=3)
    os.chmod(src, 0o644)
    out = os.path.join(shared, "out.txt")
    ready = os.path.join(shared, "ready")
    release = os.path.join(shared, "release")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node1 bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && cp {src} $DYAD_PATH_PRODUCER/r/f.bin && {DYAD} produce $DYAD_PATH_PRODUCER/r/f.bin'
srun --overlap -N1 -n1 -w node2 bash -c '{DYAD} consume $DYAD_PATH_CONSUMER/r/f.bin && cmp {src} $DYAD_PATH_CONSUMER/r/f.bin && echo same'
echo "$DYAD_SERVICE_URI" > {ready}
while [ ! -e {release} ]; do sleep 0.1; done
""")
    os.chmod(script, 0o755)
    job = submit(slurm, script, "--dyad", f"--uid={user.pw_uid}", f"--gid={user.pw_gid}")
    try:
        harness.wait_for(lambda: os.path.exists(ready) or slurm.job_state(job) not in ("PENDING", "RUNNING"), 60,
                         what=f"job {job} to run")
        assert os.path.exists(ready), info(slurm, job, out)
        d = f"/tmp/dyad/{user.pw_uid}/{job}"
        for n in ("node1", "node2"):
            st = os.stat(os.path.join(slurm.job_dir(n, job, user.pw_uid), "job.key"))
            assert (st.st_uid, st.st_mode & 0o777) == (user.pw_uid, 0o600), n
            owners = [uid for _, uid in slurm.processes(n)]
            assert owners == [user.pw_uid], (n, owners)
        as_other = ["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}", "--clear-groups"]
        r = slurm.on("node2", as_other + ["cat", f"{d}/job.key"], check=False)
        assert r.returncode != 0 and "Permission denied" in r.stderr, r
        env = {"PATH": os.environ["PATH"], "DYAD_SERVICE_URI": f"unix:{d}/dyadd.sock",
               "DYAD_PATH_CONSUMER": "/tmp/other", "DYAD_PATH_PRODUCER": "/tmp/other"}
        r = slurm.on("node2", as_other + [DYAD, "consume", "--timeout", "2", "/tmp/other/r/f.bin"], check=False,
                     env=env)
        assert r.returncode != 0, r
        # Over TCP, without the key: refused.
        env["DYAD_SERVICE_URI"] = "tcp://" + slurm.record(job, "node1")["address"]
        r = slurm.on("node2", as_other + [DYAD, "consume", "--timeout", "2", "/tmp/other/r/f.bin"], check=False,
                     env=env)
        assert r.returncode == 4, r
    finally:
        open(release, "w").close()
    assert slurm.wait_job_done(job, 60) == "COMPLETED", info(slurm, job, out)
    assert "same" in open(out).read(), info(slurm, job, out)
    assert slurm.leftovers(job) == [], info(slurm, job, out)


def test_two_jobs_at_once_do_not_see_each_other(slurm, shared):
    """Two --dyad jobs run at the same time on different nodes and publish
    the same path: each job sees its own file only."""
    jobs, outs = [], []
    for k in range(2):
        out = os.path.join(shared, f"out{k}.txt")
        script = os.path.join(shared, f"job{k}.sh")
        with open(script, "w") as f:
            f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -o {out}
set -e
srun --overlap -N1 -n1 -w $(scontrol show hostnames | head -1) bash -c 'mkdir -p $DYAD_PATH_PRODUCER/r && echo job{k} > $DYAD_PATH_PRODUCER/r/same.txt && {DYAD} produce $DYAD_PATH_PRODUCER/r/same.txt >/dev/null'
touch {shared}/produced{k}
while [ ! -e {shared}/produced0 ] || [ ! -e {shared}/produced1 ]; do sleep 0.1; done
srun --overlap -N1 -n1 -w $(scontrol show hostnames | tail -1) bash -c '{DYAD} consume $DYAD_PATH_CONSUMER/r/same.txt >/dev/null && cat $DYAD_PATH_CONSUMER/r/same.txt && {DYAD} ls | wc -l'
echo "nodes $SLURM_JOB_NODELIST"
""")
        jobs.append(submit(slurm, script, "--dyad"))
        outs.append(out)
    for job, out in zip(jobs, outs):
        assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
    texts = [open(o).read() for o in outs]
    for k in range(2):
        lines = texts[k].split()
        assert lines[:2] == [f"job{k}", "1"], texts
        assert slurm.leftovers(jobs[k]) == []
    assert texts[0].split()[-1] != texts[1].split()[-1], texts  # different nodes


def test_time_limit_ends_and_cleans(slurm, shared):
    """A --dyad job killed by its time limit (1 minute, Slurm's smallest):
    nothing left on its nodes."""
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH -N2\n#SBATCH -t 1\n#SBATCH -o {out}\n"
                f"srun --overlap -N2 -n2 {DYAD} service status >/dev/null && echo up\nsleep 600\n")
    job = submit(slurm, script, "--dyad")
    assert slurm.wait_job_done(job, 150) == "TIMEOUT", info(slurm, job, out)
    assert open(out).read().startswith("up"), info(slurm, job, out)
    assert slurm.leftovers(job) == [], info(slurm, job, out)


def test_job_start_inside_slurm_without_the_plugin(slurm, shared):
    """`dyad job start` in a batch script without --dyad: nodes from
    SLURM_JOB_NODELIST, one `srun --overlap` per node (the key on its
    standard input), a transfer, then `dyad job stop`: nothing left."""
    src = os.path.join(shared, "src.bin")
    harness.write_file(src, 1 << 20, seed=5)
    out = os.path.join(shared, "out.txt")
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N3
#SBATCH -o {out}
set -e
eval "$({DYAD} job start --env-file {shared}/env)"
srun --overlap -N1 -n1 -w node3 bash -c 'LD_PRELOAD={WRAPPER} cat $DYAD_PATH_CONSUMER/f.bin > {shared}/copy' &
srun --overlap -N1 -n1 -w node1 bash -c 'LD_PRELOAD={WRAPPER} cp {src} $DYAD_PATH_PRODUCER/f.bin'
wait
{DYAD} job stop
echo stopped
""")
    job = submit(slurm, script)
    assert slurm.wait_job_done(job, 90) == "COMPLETED", info(slurm, job, out)
    text = open(out).read()
    assert "3 dyadd ready" in text and "stopped" in text, text
    assert f"DYAD_SERVICE_URI='unix:/tmp/dyad-{job}/dyadd.sock'" in open(os.path.join(shared, "env")).read()
    assert same(src, os.path.join(shared, "copy")), text
    assert slurm.leftovers(job) == [], text


def test_salloc_dyad(slurm):
    """`salloc --dyad=mode=STREAM,wait=30 srun ...`: every step has the DYAD
    environment (with the user's options) and reaches its node's dyadd."""
    r = slurm.cmd("salloc", "-N2", "--dyad=mode=STREAM,wait=30", "srun", "-N2", "bash", "-c",
                  f'{DYAD} service status >/dev/null && echo "$SLURMD_NODENAME $DYAD_DTL_MODE $DYAD_WAIT_TIMEOUT"',
                  timeout=90, check=False)
    assert r.returncode == 0, r.stderr + slurm.tail_logs()
    assert sorted(r.stdout.split("\n"))[1:] == ["node1 STREAM 30", "node2 STREAM 30"], r.stdout
    job = re.search(r"Granted job allocation (\d+)", r.stderr).group(1)
    slurm.wait_job_done(job, 60)
    assert slurm.leftovers(job) == []


def test_bad_dyad_option_fails_at_submission(slurm, shared):
    r = slurm.cmd("sbatch", "--dyad=colour=blue", "--wrap", "true", check=False)
    assert r.returncode != 0 and "colour=blue" in r.stderr, r
