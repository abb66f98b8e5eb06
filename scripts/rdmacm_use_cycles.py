#!/usr/bin/env python3
"""Fails if the modules of crates/rdmacm/src refer to each other in a circle.

A module is a top-level module of the crate (`resolve/active.rs` counts as `resolve`);
an edge A -> B is a `use crate::B` or an inline `crate::B::` path in A (comments and doc
comments excluded; `lib.rs` only re-exports and is left out, a name it re-exports counts
as its module). Prints the cycles found.
Usage: scripts/rdmacm_use_cycles.py [crate-src-dir]
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "crates", "rdmacm", "src")
src = os.path.normpath(src)

def module_of(path):
    rel = os.path.relpath(path, src)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first

def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(l.split("//", 1)[0] for l in text.splitlines())

mods, edges = set(), {}
for root, _, files in os.walk(src):
    for f in files:
        if f.endswith(".rs"):
            p = os.path.join(root, f)
            m = module_of(p)
            if m == "lib":
                continue
            mods.add(m)
            text = strip_comments(open(p).read())
            # `use crate::{a, b::c}` groups and plain `crate::x` paths.
            refs = set(re.findall(r"\bcrate::(\w+)", text))
            for g in re.findall(r"\bcrate::\{([^}]*)\}", text):
                refs.update(re.findall(r"(?:^|,)\s*(\w+)", g))
            edges.setdefault(m, set()).update(r for r in refs if r != m)

# Names lib.rs re-exports (`crate::PortSpace`) count as their module.
lib = strip_comments(open(os.path.join(src, "lib.rs")).read())
reexport = {}
for m, names in re.findall(r"pub use (\w+)::\{?([^;}]*)\}?;", lib):
    for n in re.findall(r"\w+", names):
        reexport.setdefault(n, m)
edges = {m: {reexport.get(r, r) for r in rs} for m, rs in edges.items()}
edges = {m: {r for r in rs if r in mods and r != m} for m, rs in edges.items()}

cycles, state, stack = [], {}, []
def dfs(m):
    state[m] = 1
    stack.append(m)
    for r in sorted(edges.get(m, ())):
        if state.get(r) == 1:
            cycles.append(stack[stack.index(r):] + [r])
        elif r not in state:
            dfs(r)
    stack.pop()
    state[m] = 2

for m in sorted(mods):
    if m not in state:
        dfs(m)

if cycles:
    for c in cycles:
        print("cycle: " + " -> ".join(c))
    sys.exit(1)
print(f"no use cycles among {len(mods)} rdmacm modules")
