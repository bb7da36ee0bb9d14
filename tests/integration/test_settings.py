# SPDX-License-Identifier: Apache-2.0
"""The settings table is the one place that reads DYAD_* variables, the
user guide's table is generated from it, and `dyad config` reports sources."""
import json
import os
import re
import subprocess

import harness

ROOT = harness.ROOT


def test_user_guide_table_is_generated_from_the_table():
    generated = subprocess.run([harness.DYAD, "config", "--markdown"], capture_output=True, text=True,
                               check=True).stdout
    guide = open(os.path.join(ROOT, "docs", "user-guide.md")).read()
    m = re.search(r"<!-- settings:begin[^>]*-->\n(.*?)<!-- settings:end -->", guide, re.S)
    assert m, "docs/user-guide.md has no generated settings table"
    assert m.group(1) == generated, "docs/user-guide.md is stale: paste `dyad config --markdown` between the markers"


def test_no_dyad_variable_is_read_outside_the_table():
    offenders = []
    for top, _, files in os.walk(os.path.join(ROOT, "src")):
        for f in files:
            path = os.path.join(top, f)
            if f.startswith("settings.") or not f.endswith((".cpp", ".hpp", ".h")):
                continue
            for n, line in enumerate(open(path), 1):
                if re.search(r'getenv\s*\(\s*"DYAD_|\benv\s*\(\s*"DYAD_', line):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not offenders, "DYAD_* read outside src/common/settings.cpp:\n" + "\n".join(offenders)


def test_every_variable_the_code_names_is_in_the_table():
    table = {s["name"] for s in json.loads(subprocess.run([harness.DYAD, "--json", "config"], capture_output=True,
                                                          text=True, check=True).stdout)["settings"]}
    named = set()
    for top, _, files in os.walk(os.path.join(ROOT, "src")):
        for f in files:
            if f.endswith((".cpp", ".hpp")):
                named |= set(re.findall(r'settings::\w+\(\s*"(DYAD_\w+)"', open(os.path.join(top, f)).read()))
    assert named, "no settings lookups found: the pattern is stale"
    assert named <= table, f"read but not in the table: {named - table}"


def test_config_reports_each_source(tmp_path):
    conf = tmp_path / "dyad.conf"
    conf.write_text("DYAD_KEY_BINS=64\nDYAD_UCX_WINDOW=8M\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
    env.update(DYAD_CONFIG_FILE=str(conf), DYAD_UCX_WINDOW="16M", DYAD_OFI_PLACEMENT="0")
    out = subprocess.run([harness.DYAD, "--json", "config"], capture_output=True, text=True, check=True,
                         env=env).stdout
    got = {s["name"]: (s["value"], s["source"]) for s in json.loads(out)["settings"]}
    assert got["DYAD_KEY_BINS"] == ("64", "file")
    assert got["DYAD_UCX_WINDOW"] == ("16M", "env")
    assert got["DYAD_KEY_DEPTH"] == ("3", "default")
    assert got["DYAD_PATH_CONSUMER"] == (None, "unset")
    assert got["DYAD_OFI_PLACEMENT"] == ("0", "env")
    text = subprocess.run([harness.DYAD, "config"], capture_output=True, text=True, check=True, env=env).stdout
    assert re.search(r"^DYAD_KEY_BINS=64\s+# file$", text, re.M), text
    bad = subprocess.run([harness.DYAD, "config"], capture_output=True, text=True,
                         env={**env, "DYAD_CONFIG_FILE": str(tmp_path / "missing.conf")})
    assert bad.returncode != 0 and "missing.conf" in bad.stderr


def test_service_status_reports_options_as_their_source(cluster):
    node = cluster[1]
    node.stop()
    node.start(extra_args=["--memory", "64M"])
    st = node.status()
    got = {s["name"]: (s["value"], s["source"]) for s in st["settings"]}
    assert got["DYAD_SERVICE_MEMORY"] == ("64M", "option")
    assert "DYAD_PATH_CONSUMER" not in got  # not a dyadd setting
