#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libdyad.so exports DYAD's API and nothing else (src/libdyad.map).

Fails when libdyad.so exports a symbol that is neither a C function of
DYAD's API (dyad_*) nor a member of the C++ stream API (dyad::dyad_stream_core
of include/dyad/stream/), apart from the allow-list below: an internal class
of namespace dyad (the client, the service, a store, a transport) exported
is a failure; when a C function declared in the public headers is not
exported; and, given --plugin, when the transport plugin exports anything but
its entry point or needs libdyad.so (it links the layers it uses itself).

usage: check_symbols.py LIBDYAD INCLUDE_DIR [--plugin LIBDYAD_OFI]
"""
import argparse
import os
import re
import subprocess
import sys

# Mangled names of C++ entities in namespace dyad: functions, members and
# static data (_ZN4dyad.., _ZNK4dyad.. for const members), their vtables,
# type information and names, guard variables, local statics and thunks.
DYAD_CXX = re.compile(r"^_Z(?:T[VIST]|GV|Z|Th-?\d+_|Tv-?\d+_-?\d+_)*N[rVKRO]*4dyad")
# Of those, the C++ stream API's: the members of dyad::dyad_stream_core.
STREAM_API = re.compile(r"^_ZN[rVKRO]*4dyad16dyad_stream_core")
DYAD_C = re.compile(r"^dyad_\w+$")

# The documented exceptions (docs/design.md, "Library surface and plugins").
ALLOWED = [
    # The symbol versions themselves (src/libdyad.map: DYAD_1, DYAD_2), which
    # nm lists as absolute symbols.
    (re.compile(r"^DYAD_\d+$"), "a symbol version of libdyad.so (src/libdyad.map)"),
]

HEADERS = ["dyad/client/dyad_client.h", "dyad/core/dyad_ctx.h", "dyad/core/dyad_consume_many.h",
           "dyad/dyad_version.h"]


def exported(lib):
    """Defined dynamic symbols of lib: {name: nm type letter}."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        syms[parts[2].split("@")[0]] = parts[1]
    return syms


def needed_libraries(lib):
    """The DT_NEEDED entries of lib."""
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def demangle(names):
    if not names:
        return []
    p = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return p.stdout.splitlines() if p.returncode == 0 else list(names)


def declared_functions(path):
    """Names of the C functions a public header declares."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    names = []
    for stmt in re.split(r"[;{}]", text):
        stmt = stmt.strip()
        if not stmt or stmt.startswith("typedef"):
            continue
        m = re.match(r"^(?:extern\s+)?[A-Za-z_][\w\s\*]*?\b(dyad_\w+)\s*\(", stmt)
        if m:
            names.append(m.group(1))
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libdyad")
    ap.add_argument("include_dir")
    ap.add_argument("--plugin")
    a = ap.parse_args()
    problems = []

    syms = exported(a.libdyad)
    foreign, internal, allowed = [], [], []
    for name in sorted(syms):
        if DYAD_C.match(name) or STREAM_API.match(name):
            continue
        why = next((w for pat, w in ALLOWED if pat.match(name)), None)
        if why:
            allowed.append((name, why))
        elif DYAD_CXX.match(name):
            internal.append((name, None))
        else:
            foreign.append((name, None))
    if foreign:
        problems.append(f"{len(foreign)} exported symbol(s) are neither DYAD's C API nor its C++ stream API "
                        "(hide them: src/libdyad.map, or allow-list them here with a reason):")
        problems += [f"  {d}   [{n}]" for d, (n, _) in zip(demangle([n for n, _ in foreign]), foreign)]
    if internal:
        problems.append(f"{len(internal)} exported symbol(s) are DYAD's internals, not its API: programs and "
                        "plugins link the layers themselves (dyad::internal); keep src/libdyad.map to the API:")
        problems += [f"  {d}   [{n}]" for d, (n, _) in zip(demangle([n for n, _ in internal]), internal)]

    for header in HEADERS:
        names = declared_functions(os.path.join(a.include_dir, header))
        if not names:
            problems.append(f"{header}: no function declarations found (is the parser out of date?)")
        for name in names:
            if name not in syms:
                problems.append(f"{header} declares {name}, which libdyad.so does not export")
            elif syms[name] not in "TW":
                problems.append(f"{name} is exported as '{syms[name]}', not as a function")

    if a.plugin:
        needed = needed_libraries(a.plugin)
        if any(n.startswith("libdyad.so") for n in needed):
            problems.append(f"{a.plugin} needs libdyad.so ({', '.join(needed)}): it must link the layers it uses "
                            "(dyad::internal), which libdyad.so does not export")
        extra = sorted(set(exported(a.plugin)) - {"dyad_dtl_plugin_v1"})
        if "dyad_dtl_plugin_v1" not in exported(a.plugin):
            problems.append(f"{a.plugin} does not export its entry point dyad_dtl_plugin_v1")
        if extra:
            problems.append(f"{a.plugin} exports more than its entry point (src/dtl/plugin.map):")
            problems += [f"  {d}" for d in demangle(extra)]

    dyad_c = sum(1 for n in syms if DYAD_C.match(n))
    stream = sum(1 for n in syms if STREAM_API.match(n))
    print(f"{a.libdyad}: {len(syms)} exported: {dyad_c} C API, {stream} C++ stream API, "
          f"{len(internal)} internal, {len(allowed)} allow-listed, {len(foreign)} foreign")
    for d, (_, why) in zip(demangle([n for n, _ in allowed]), allowed):
        print(f"  allowed: {d} ({why})")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
