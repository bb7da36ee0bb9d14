# SPDX-License-Identifier: Apache-2.0
"""An administrator's and a user's checks on the real Slurm cluster (issue
46, item 5): `dyad doctor --site` on a node passes on the test cluster and
names each mistake with its fix (no PrologFlags=Alloc, a plugstack without
the plugin, a site secret others can read, a node name that resolves
nowhere); `dyad doctor` inside a --dyad job fails when the nodes' dyadds use
different metadata stores (what a prolog run outside the allocation makes),
and passes when they share one."""
import os
import re
import shutil

import harness

DYAD = harness.DYAD


def doctor_site(slurm, conf, node="node1"):
    return slurm.on(node, [DYAD, "doctor", "--site", "--slurm-conf", conf], check=False, timeout=60)


def verdicts(text):
    """{check name: [verdict, ...]} of doctor's lines."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(ok|note|warn|FAIL)\s+(.+?)\s{2,}", line)
        if m:
            out.setdefault(m.group(2).strip(), []).append(m.group(1))
    return out


def test_doctor_site_passes_on_the_cluster(slurm):
    p = doctor_site(slurm, slurm.conf)
    assert p.returncode == 0, p.stdout + p.stderr
    v = verdicts(p.stdout)
    for check in ("slurm.conf", "PrologFlags", "plugstack", "dyadd", "site key", "node names", "ports reachable"):
        assert v.get(check) and "FAIL" not in v[check], (check, p.stdout)
    assert "Nothing blocks DYAD here." in p.stdout


def variant(slurm, tmp, replace=(), plugstack_extra="", key_mode=None):
    """A copy of the cluster's slurm.conf (and plugstack, and site key) with
    one mistake; its path."""
    key = os.path.join(tmp, "site.key")
    shutil.copy(slurm.site_key, key)
    os.chmod(key, key_mode or 0o400)
    with open(os.path.join(slurm.root, "plugstack.conf")) as f:
        line = f.read().replace(slurm.site_key, key)
    ps = os.path.join(tmp, "plugstack.conf")
    with open(ps, "w") as f:
        f.write(plugstack_extra or line)
    with open(slurm.conf) as f:
        text = f.read()
    text = re.sub(r"PlugStackConfig=\S+", f"PlugStackConfig={ps}", text)
    for old, new in replace:
        text = re.sub(old, new, text, flags=re.M)
    conf = os.path.join(tmp, "slurm.conf")
    with open(conf, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    return conf


def test_doctor_site_names_each_mistake_and_its_fix(slurm, shared):
    cases = {
        "PrologFlags": ({"replace": [(r"^PrologFlags=.*$", "")]}, "PrologFlags=Alloc"),
        "plugstack": ({"plugstack_extra": "# nothing here\n"}, "dyad_spank.so"),
        "site key": ({"key_mode": 0o644}, "chmod 0400"),
        "node names": ({"replace": [(r"^(NodeName=.*)$", r"\1\nNodeName=ghost1 NodeAddr=ghost1.invalid CPUs=1")]},
                       "NodeAddr="),
    }
    for check, (kw, fix) in cases.items():
        tmp = os.path.join(shared, check.replace(" ", "_"))
        os.makedirs(tmp)
        p = doctor_site(slurm, variant(slurm, tmp, **kw))
        assert p.returncode == 1, (check, p.stdout)
        v = verdicts(p.stdout)
        assert "FAIL" in v.get(check, []), (check, p.stdout)
        failed = [line for line in p.stdout.splitlines() if line.startswith("FAIL")]
        assert len(failed) == 1, (check, p.stdout)  # that mistake only
        assert fix in p.stdout, (check, fix, p.stdout)


SPLIT = r"""d=$(dirname $DYAD_AUTH_KEY_FILE); pid=$(cat $d/dyadd.pid)
mapfile -d '' args < /proc/$pid/cmdline
new=(); skip=0
for a in "${args[@]}"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in --kvs|--listen-fd|--socket-fd|--ready-fd) skip=1; continue;; esac
  new+=("$a")
done
kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.05; done
( setsid "${new[@]}" >> $d/dyadd.log 2>&1 < /dev/null & echo $! > $d/dyadd.pid )
for i in $(seq 200); do DYAD_DTL_MODE=AUTO {DYAD} service status >/dev/null 2>&1 && break; sleep 0.05; done
echo split"""


def test_doctor_in_a_job_compares_the_nodes_stores(slurm, shared):
    """node2's dyadd is restarted hosting a store of its own, as a prolog run
    outside the allocation would have started it: `dyad doctor` on node1
    then fails naming both stores and PrologFlags=Alloc."""
    out = os.path.join(shared, "out.txt")
    split = os.path.join(shared, "split.sh")
    with open(split, "w") as f:
        f.write("#!/bin/bash\n" + SPLIT.replace("{DYAD}", DYAD) + "\n")
    os.chmod(split, 0o755)
    script = os.path.join(shared, "job.sh")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2
#SBATCH -o {out}
srun --overlap -N1 -n1 -w node1 {DYAD} doctor > {shared}/before.txt 2>&1; echo "rc=$?" >> {shared}/before.txt
srun --overlap -N1 -n1 -w node2 {split}
srun --overlap -N1 -n1 -w node1 {DYAD} doctor > {shared}/after.txt 2>&1; echo "rc=$?" >> {shared}/after.txt
""")
    r = slurm.cmd("sbatch", "--parsable", "--dyad", script)
    job = r.stdout.strip().split(";")[0]
    state = slurm.wait_job_done(job, 90)
    text = open(out).read() if os.path.exists(out) else ""
    assert state == "COMPLETED", (state, text, slurm.tail_logs(20))
    before = open(os.path.join(shared, "before.txt")).read()
    after = open(os.path.join(shared, "after.txt")).read()
    assert "split" in text, text
    assert "ok" in verdicts(before).get("job's stores", []), before
    assert "every node's dyadd (2) uses the same metadata store" in before, before
    assert "FAIL" in verdicts(after).get("job's stores", []), after
    assert "different metadata stores" in after and "PrologFlags=Alloc" in after, after
    assert after.rstrip().endswith("rc=1"), after
    for n in slurm.names:  # the restarted dyadd is stopped by the epilog (its pid file)
        assert slurm.processes(n) == [], (n, slurm.processes(n))
