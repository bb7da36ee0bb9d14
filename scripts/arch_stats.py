#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Figures of the code's shape, and the guard that keeps it (docs/design.md,
"The shape guard").

  python3 scripts/arch_stats.py            the figures, for reviews
  python3 scripts/arch_stats.py --json     the same as JSON
  python3 scripts/arch_stats.py --check    the guard (ctest arch.shape): lists
                                           every offender, exits 1 if any

The figures: the members and methods of class Service; the longest source
files and functions under src/, tools/ and scripts/; how often the wire's
field names (the JSON keys of docs/wire-protocol.md's examples) are spelled
as a string literal outside the message layer (src/proto/); the includes
that go up the layers; and how many places use each of the service's store
pointers.

The guard fails when
  - a source file (C, C++, Python, shell) in src/, tools/ or scripts/ has
    more than 800 lines;
  - a function has more than 80 lines, unless scripts/arch_allow.txt lists
    it with its reason (tables only);
  - a file includes the header of a layer above its own (LAYERS below, from
    docs/design.md and /src/*/CMakeLists.txt's target links);
  - the wire field names spelled as string literals outside src/proto number
    more than the ceiling recorded in scripts/arch_allow.txt (a ratchet: lower
    it when the count goes down, never raise it).

It reads text only. C and C++ functions are found by their layout, which
clang-format makes regular: a definition begins at a line of class or
namespace scope whose statement (the signature, possibly wrapped over several
more-indented lines, a member-initializer list included) ends with "{", and
ends at the next line holding only "}" (or "};") at the indentation of its
first line. Comments and raw string literals are blanked first. Python's
functions come from its own parser (ast).
"""
import ast
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ["src", "tools", "scripts"]
MESSAGE_LAYER = os.path.join("src", "proto")
C_EXTS = (".cpp", ".hpp", ".h", ".c")
EXTS = C_EXTS + (".py", ".sh")
ALLOW_FILE = os.path.join("scripts", "arch_allow.txt")
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80

# Each layer (a folder under src/, or tools/) and the layers it may include.
# common <- proto <- rpc <- {kvs, dtl} <- client <- capi <- {wrapper, tools}
# (capi: the bindings, over the client's public C++ interface);
# service composes rpc, kvs, dtl. proto (the wire's messages) sits above
# common and below every layer that speaks the wire (src/proto/CMakeLists.txt).
# The public headers (include/dyad/) are open to every layer.
_BELOW = {
    "common": [],
    "proto": ["common"],
    "rpc": ["common", "proto"],
    "kvs": ["common", "proto", "rpc"],
    "dtl": ["common", "proto", "rpc"],
    "client": ["common", "proto", "rpc", "kvs", "dtl"],
    "service": ["common", "proto", "rpc", "kvs", "dtl"],
    "capi": ["common", "proto", "rpc", "kvs", "dtl", "client"],
    "wrapper": ["common", "proto", "rpc", "kvs", "dtl", "client", "capi"],
    "tools": ["common", "proto", "rpc", "kvs", "dtl", "client", "capi"],
    "slurm": [],
    "dyadd": ["common", "proto", "rpc", "kvs", "dtl", "client", "service"],
}
LAYERS = {name: set(below) | {name} for name, below in _BELOW.items()}
# Layers that never speak DYAD's wire: their strings are other formats (the
# Slurm plugin's root-only job record), not wire field names.
NO_WIRE = {"slurm"}


def sources():
    for d in SOURCE_DIRS:
        for base, dirs, files in os.walk(os.path.join(ROOT, d)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(base, f), ROOT)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as fh:
        return fh.read()


def line_count(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def blank_comments_and_raw_strings(text):
    """The text with block comments, line comments and raw string literals
    replaced by blanks (newlines kept, so line numbers stay)."""

    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    pattern = re.compile(
        r'R"([^()\\ ]{0,16})\(.*?\)\1"'  # raw string literal
        r'|"(?:\\.|[^"\\\n])*"'  # ordinary string literal (kept)
        r"|'(?:\\.|[^'\\\n])*'"  # character literal (kept)
        r"|/\*.*?\*/"  # block comment
        r"|//[^\n]*",  # line comment
        re.S)

    def sub(m):
        s = m.group(0)
        if s.startswith('"') or s.startswith("'"):
            return s
        return blank(m)

    return pattern.sub(sub, text)


_NOT_FUNCTION = re.compile(r"(namespace|struct|class|enum|union|extern|typedef|using|return|if|for|while|switch|"
                           r"do|else|case|default|public|private|protected)\b")


def _function_name(signature):
    head = signature.split("(")[0]
    m = re.search(r"(operator\s*\S+|[A-Za-z_~][\w:~<>,\s]*?)\s*$", head)
    if not m:
        return "?"
    name = re.sub(r"\s+", " ", m.group(1)).strip()
    return name.split(" ")[-1] if not name.startswith("operator") else name


def c_functions(rel, text):
    """[(lines, "file:line", name)] of the functions defined in C/C++ text."""
    lines = blank_comments_and_raw_strings(text).split("\n")
    out = []
    scopes = []  # [(indentation, class name)] of the class bodies we are in
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        s = line.strip()
        indent = len(line) - len(line.lstrip())
        while scopes and s.startswith("}") and indent <= scopes[-1][0]:
            scopes.pop()
        m = re.match(r"(?:template\s*<.*>\s*)?(class|struct)\s+(?:\[\[\w+\]\]\s*)?(\w+)[^;(]*\{$", s)
        if m:
            scopes.append((indent, m.group(2)))
            i += 1
            continue
        if not s or s.startswith(("#", "}", ")", ":", ",", "{")) or _NOT_FUNCTION.match(s):
            i += 1
            continue
        if s.startswith("template") and not s.endswith(("{", ";")):
            i += 1
            continue
        # The statement: this line and its more-indented continuations.
        stmt = [s]
        j = i
        while not stmt[-1].endswith(("{", ";", "}", "};")) and j + 1 < n and j - i < 16:
            nxt = lines[j + 1]
            if not nxt.strip() or len(nxt) - len(nxt.lstrip()) <= indent:
                break
            j += 1
            stmt.append(nxt.strip())
        signature = " ".join(stmt)
        if not signature.endswith("{") or "(" not in signature or re.search(r"=\s*\{$", signature):
            i = j + 1
            continue
        # The body ends at the first line that is only "}" at this indentation.
        closing = re.compile(r"^" + " " * indent + r"\}[;,]?\s*$")
        k = j + 1
        while k < n and not closing.match(lines[k]):
            k += 1
        if k >= n:
            i = j + 1
            continue
        name = _function_name(signature)
        if scopes and "::" not in name:
            name = "::".join(c for _, c in scopes) + "::" + name
        out.append((k - i + 1, "%s:%d" % (rel, i + 1), name))
        i = k + 1
    return out


def py_functions(rel, text):
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child.end_lineno - child.lineno + 1, "%s:%d" % (rel, child.lineno), prefix + child.name))
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")

    walk(tree, "")
    return out


def functions(rel, text):
    if rel.endswith(C_EXTS):
        return c_functions(rel, text)
    if rel.endswith(".py"):
        return py_functions(rel, text)
    return []


# dyadd, the program (not the service library): it composes the service with
# the client, whose fetch path pulls replicas (src/service/CMakeLists.txt
# builds these files into dyadd alone; the library dyad_service never links
# the client).
PROGRAM_FILES = {os.path.join("src", "service", f) for f in ("main.cpp", "replica_pull.cpp", "replica_pull.hpp")}


def layer_of(rel):
    parts = rel.split(os.sep)
    if rel in PROGRAM_FILES:
        return "dyadd"
    if parts[0] == "tools":
        return "tools"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    return None


def upward_includes(rel, text):
    """[(file:line, included, its layer)] for includes of a layer above rel's."""
    own = layer_of(rel)
    if own not in LAYERS or not rel.endswith(C_EXTS):
        return []
    out = []
    for no, line in enumerate(text.split("\n"), 1):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        if not m:
            continue
        inc = m.group(1)
        first = inc.split("/")[0]
        if "/" not in inc or os.path.exists(os.path.join(ROOT, os.path.dirname(rel), inc)):
            continue  # beside the including file: its own layer
        if first not in LAYERS or first == "dyad":
            continue
        if first not in LAYERS[own]:
            out.append(("%s:%d" % (rel, no), inc, first))
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


def load_allow():
    """(allowed functions {(file, name): reason}, wire literal ceiling,
    debt {(file, name or None): lines})."""
    allowed, ceiling, debt = {}, None, {}
    path = os.path.join(ROOT, ALLOW_FILE)
    if not os.path.exists(path):
        return allowed, ceiling, debt
    for no, raw in enumerate(read(ALLOW_FILE).split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split(None, 3)
        if words[0] == "function" and len(words) == 4:
            allowed[(words[1], words[2])] = words[3]
        elif words[0] == "wire_field_literals" and len(words) == 2 and words[1].isdigit():
            ceiling = int(words[1])
        elif words[0] == "file_debt" and len(words) == 3 and words[2].isdigit():
            debt[(words[1], None)] = int(words[2])
        elif words[0] == "function_debt" and len(words) == 4 and words[3].isdigit():
            debt[(words[1], words[2])] = int(words[3])
        else:
            sys.exit("%s:%d: not understood: %r (see the file's header)" % (ALLOW_FILE, no, line))
    return allowed, ceiling, debt


def measure():
    files = list(sources())
    texts = {f: read(f) for f in files}
    sizes = sorted(((line_count(t), f) for f, t in texts.items()), reverse=True)
    funcs = []
    for f, t in texts.items():
        funcs += functions(f, t)
    funcs.sort(key=lambda x: (-x[0], x[1]))
    fields = wire_fields()
    literal_uses, literal_files = {}, {}
    for f, t in texts.items():
        if f.startswith(MESSAGE_LAYER + os.sep) or not f.endswith(C_EXTS) or layer_of(f) in NO_WIRE:
            continue
        for name in fields:
            n = t.count('"' + name + '"')
            if n:
                literal_uses[name] = literal_uses.get(name, 0) + n
                literal_files[f] = literal_files.get(f, 0) + n
    upward = []
    for f, t in texts.items():
        upward += upward_includes(f, t)
    svc = texts.get(os.path.join("src", "service", "service.hpp"), "")
    members, methods = service_members(svc)
    store_refs = {}
    for f, t in texts.items():
        if f.startswith(os.path.join("src", "service")):
            for ptr in ("ext_", "remote_", "store_", "store_watch_"):
                n = len(re.findall(r"\b" + ptr + r"(?!\w)", t))
                if n:
                    store_refs[ptr] = store_refs.get(ptr, 0) + n
    return {
        "service": {"members": members, "methods": methods},
        "files_over_800_lines": [[n, f] for n, f in sizes if n > MAX_FILE_LINES],
        "longest_files": [[n, f] for n, f in sizes[:8]],
        "all_files": [[n, f] for n, f in sizes],
        "functions_over_80_lines": [[n, where, name] for n, where, name in funcs if n > MAX_FUNCTION_LINES],
        "longest_functions": [[n, where, name] for n, where, name in funcs[:10]],
        "upward_includes": [list(x) for x in sorted(upward)],
        "wire_field_literals": {
            "fields": len(literal_uses),
            "uses": sum(literal_uses.values()),
            "files": len(literal_files),
            "top": sorted(literal_uses.items(), key=lambda kv: -kv[1])[:10],
            "by_file": sorted(literal_files.items(), key=lambda kv: -kv[1]),
        },
        "service_store_pointer_uses": store_refs,
    }


def check(report):
    """The guard: prints every offender; returns the number of problems."""
    allowed, ceiling, debt = load_allow()
    problems = 0
    over = report["files_over_800_lines"]
    print("files over %d lines: %d" % (MAX_FILE_LINES, len(over)))
    for n, f in over:
        owed = debt.get((f, None))
        if owed is not None and n <= owed:
            print("  debt %5d %s (recorded at %d in %s: may shrink, never grow)" % (n, f, owed, ALLOW_FILE))
            continue
        print("  FAIL %5d %s: split it into named parts" % (n, f))
        problems += 1
    long_funcs = report["functions_over_80_lines"]
    listed = [x for x in long_funcs if (x[1].split(":")[0], x[2]) in allowed]
    owing = [x for x in long_funcs if x not in listed and x[0] <= debt.get((x[1].split(":")[0], x[2]), -1)]
    for n, where, name in owing:
        print("  debt %5d %s %s (recorded at %d: may shrink, never grow)" %
              (n, where, name, debt[(where.split(":")[0], name)]))
    bad = [x for x in long_funcs if x not in listed and x not in owing]
    print("functions over %d lines: %d (%d listed in %s)" % (MAX_FUNCTION_LINES, len(long_funcs), len(listed),
                                                               ALLOW_FILE))
    for n, where, name in bad:
        print("  FAIL %5d %s %s: split it, or list it in %s if it is a table" % (n, where, name, ALLOW_FILE))
    for n, where, name in listed:
        print("  ok   %5d %s %s (listed: %s)" % (n, where, name, allowed[(where.split(":")[0], name)]))
    problems += len(bad)
    present = {(x[1].split(":")[0], x[2]) for x in report["functions_over_80_lines"]}
    for key in sorted(set(allowed) - present):
        print("  note: %s lists %s %s, which is no longer over %d lines: remove the line" %
              (ALLOW_FILE, key[0], key[1], MAX_FUNCTION_LINES))
    # A debt paid (the file or function is back under the limit) or smaller
    # than recorded: the line must go or be lowered, so the ratchet holds.
    sizes = {f: n for n, f in report["all_files"]}
    funcs = {(w.split(":")[0], name): n for n, w, name in report["functions_over_80_lines"]}
    for (f, name), owed in sorted(debt.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        now = sizes.get(f, 0) if name is None else funcs.get((f, name), 0)
        limit = MAX_FILE_LINES if name is None else MAX_FUNCTION_LINES
        if now <= limit:
            print("  FAIL %s lists %s%s as debt, which is no longer over %d lines: remove the line" %
                  (ALLOW_FILE, f, " " + name if name else "", limit))
            problems += 1
        elif now < owed:
            print("  FAIL %s records %s%s at %d lines, now %d: lower it (the ratchet)" %
                  (ALLOW_FILE, f, " " + name if name else "", owed, now))
            problems += 1
    up = report["upward_includes"]
    print("includes of a higher layer: %d" % len(up))
    for where, inc, layer in up:
        print("  FAIL %s includes \"%s\" (layer %s is above this one)" % (where, inc, layer))
    problems += len(up)
    w = report["wire_field_literals"]
    if ceiling is None:
        print("wire field literals outside %s: %d; no ceiling recorded in %s" % (MESSAGE_LAYER, w["uses"],
                                                                                  ALLOW_FILE))
        problems += 1
    elif w["uses"] > ceiling:
        print("  FAIL wire field names spelled as literals outside %s: %d, over the ceiling %d (%s): use the "
              "message types of src/proto" % (MESSAGE_LAYER, w["uses"], ceiling, ALLOW_FILE))
        for f, k in w["by_file"]:
            print("       %4d %s" % (k, f))
        problems += 1
    else:
        print("wire field literals outside %s: %d (ceiling %d%s)" %
              (MESSAGE_LAYER, w["uses"], ceiling, "; lower it in " + ALLOW_FILE if w["uses"] < ceiling else ""))
    print("shape guard: %s" % ("%d problem(s)" % problems if problems else "ok"))
    return problems


def main():
    report = measure()
    if "--check" in sys.argv:
        sys.exit(1 if check(report) else 0)
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
        return
    s = report["service"]
    print("class Service: %d members, %d methods" % (s["members"], s["methods"]))
    print("files over %d lines: %s" % (MAX_FILE_LINES, ", ".join("%s (%d)" % (f, n)
                                                               for n, f in report["files_over_800_lines"]) or "none"))
    print("longest files:")
    for n, f in report["longest_files"]:
        print("  %5d %s" % (n, f))
    print("functions over %d lines: %d; longest:" % (MAX_FUNCTION_LINES, len(report["functions_over_80_lines"])))
    for n, where, name in report["longest_functions"]:
        print("  %5d %s %s" % (n, where, name))
    print("includes of a higher layer: %d" % len(report["upward_includes"]))
    w = report["wire_field_literals"]
    print("wire field names as literals outside %s: %d names, %d uses, %d files" %
          (MESSAGE_LAYER, w["fields"], w["uses"], w["files"]))
    print("  most: " + ", ".join("%s %d" % kv for kv in w["top"]))
    print("service store pointers (uses in src/service): %s" % json.dumps(report["service_store_pointer_uses"]))


if __name__ == "__main__":
    main()
