#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Figures of the code's shape, for architecture reviews (docs/design.md,
"Second pass"): run it from the repository's root before and after a
redesign and compare.

  python3 scripts/arch_stats.py [--json]

It prints: the members and methods of class Service; the longest source
files and functions under src/ and tools/; how often the wire's field
names (the JSON keys of docs/wire-protocol.md's examples) are spelled as a
string literal outside the message layer (src/proto/); and how many
places use each of the service's store pointers. It reads text only; the
function lengths come from brace matching (a definition starts at column 0
and ends at the next column-0 closing brace), a close approximation for
this code base's clang-format style.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ["src", "tools"]
MESSAGE_LAYER = os.path.join("src", "proto")
EXTS = (".cpp", ".hpp", ".h", ".c")


def sources():
    for d in SOURCE_DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(base, f), ROOT)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as fh:
        return fh.read()


def functions(rel, text):
    out = []
    lines = text.split("\n")
    start = None
    name = None
    for i, line in enumerate(lines):
        if start is None:
            if line and not line[0].isspace() and line.rstrip().endswith("{") and "(" in line:
                if re.match(r"(namespace|struct|class|enum|extern|union)\b", line):
                    continue
                m = re.search(r"([A-Za-z_][\w:~]*)\s*\(", line)
                start, name = i, (m.group(1) if m else "?")
        elif line.startswith("}"):
            out.append((i - start + 1, rel + ":" + str(start + 1), name))
            start = None
    return out


def service_members(text):
    m = re.search(r"\nclass Service \{(.*?)\n\};", text, re.S)
    if not m:
        return 0, 0
    body = m.group(1)
    # Only the class's own lines (nested structs indented further are skipped).
    members = methods = 0
    depth = 0
    for line in body.split("\n"):
        s = line.strip()
        if depth == 0 and line.startswith("    ") and not line.startswith("     "):
            if re.match(r"(struct|class)\s+\w+\s*\{", s):
                pass
            elif re.search(r"\w+_(\s*(\{[^}]*\}|=[^;]*|\[[^\]]*\][^;]*))?;", s) and "(" not in s.split("=")[0]:
                members += 1
            elif re.search(r"\w+\s*\(", s) and not s.startswith("//") and not s.startswith("using"):
                methods += 1
        depth += line.count("{") - line.count("}")
    return members, methods


def wire_fields():
    text = read(os.path.join("docs", "wire-protocol.md"))
    return sorted(set(re.findall(r'"([a-z_0-9]+)"\s*:', text)))


def main():
    files = list(sources())
    texts = {f: read(f) for f in files}
    sizes = sorted(((t.count("\n"), f) for f, t in texts.items()), reverse=True)
    funcs = []
    for f, t in texts.items():
        if f.endswith((".cpp", ".c")):
            funcs += functions(f, t)
    funcs.sort(reverse=True)
    fields = wire_fields()
    literal_uses = {}
    literal_files = set()
    for f, t in texts.items():
        if f.startswith(MESSAGE_LAYER + os.sep):
            continue
        for name in fields:
            n = t.count('"' + name + '"')
            if n:
                literal_uses[name] = literal_uses.get(name, 0) + n
                literal_files.add(f)
    svc = texts.get(os.path.join("src", "service", "service.hpp"), "")
    members, methods = service_members(svc)
    store_refs = {}
    for f, t in texts.items():
        if f.startswith(os.path.join("src", "service")):
            for ptr in ("ext_", "remote_", "store_", "store_watch_"):
                n = len(re.findall(r"\b" + ptr + r"(?!\w)", t))
                if n:
                    store_refs[ptr] = store_refs.get(ptr, 0) + n
    report = {
        "service": {"members": members, "methods": methods},
        "files_over_800_lines": [[n, f] for n, f in sizes if n > 800],
        "longest_files": [[n, f] for n, f in sizes[:8]],
        "functions_over_80_lines": len([x for x in funcs if x[0] > 80]),
        "longest_functions": [[n, where, name] for n, where, name in funcs[:10]],
        "wire_field_literals": {
            "fields": len(literal_uses),
            "uses": sum(literal_uses.values()),
            "files": len(literal_files),
            "top": sorted(literal_uses.items(), key=lambda kv: -kv[1])[:10],
        },
        "service_store_pointer_uses": store_refs,
    }
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
        return
    print("class Service: %d members, %d methods" % (members, methods))
    print("files over 800 lines: %s" % (", ".join("%s (%d)" % (f, n) for n, f in sizes if n > 800) or "none"))
    print("longest files:")
    for n, f in sizes[:8]:
        print("  %5d %s" % (n, f))
    print("functions over 80 lines: %d; longest:" % report["functions_over_80_lines"])
    for n, where, name in funcs[:10]:
        print("  %5d %s %s" % (n, where, name))
    w = report["wire_field_literals"]
    print("wire field names as literals outside %s: %d names, %d uses, %d files" %
          (MESSAGE_LAYER, w["fields"], w["uses"], w["files"]))
    print("  most: " + ", ".join("%s %d" % kv for kv in w["top"]))
    print("service store pointers (uses in src/service): %s" % json.dumps(store_refs))


if __name__ == "__main__":
    main()
