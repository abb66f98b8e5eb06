#!/usr/bin/env python3
"""Fails if the modules of crates/rdmacm/src refer to each other in a circle.

A module is a top-level module of the crate (`ports/config.rs` counts as `ports`), or in
the layer folders (`LAYERS`) a module of the folder (`host/resolve/active.rs` counts as
`host::resolve`, the folder's `mod.rs` as the folder); an edge A -> B is a `use crate::B`
or an inline `crate::B::` path in A (comments and doc comments excluded; `lib.rs` only
re-exports and is left out, a name it or a folder's `mod.rs` re-exports counts as its
module). Prints the cycles found.
Usage: scripts/rdmacm_use_cycles.py [crate-src-dir]
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "crates", "rdmacm", "src")
src = os.path.normpath(src)

LAYERS = {"cm", "context", "engine", "ha", "host"}

def module_of(path):
    parts = [p[:-3] if p.endswith(".rs") else p for p in os.path.relpath(path, src).split(os.sep)]
    if parts[0] in LAYERS and len(parts) > 1 and parts[1] != "mod":
        return parts[0] + "::" + parts[1]
    return parts[0]

def ref_of(path):
    """The module a `crate::` path names (its first one or two segments)."""
    parts = path.split("::")
    if parts[0] in LAYERS and len(parts) > 1 and parts[0] + "::" + parts[1] in mods:
        return parts[0] + "::" + parts[1]
    if parts[0] in LAYERS and len(parts) > 1:
        return reexport.get(parts[0] + "::" + parts[1], parts[0])
    return parts[0]

def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(l.split("//", 1)[0] for l in text.splitlines())

mods, edges, reexport = set(), {}, {}
for root, _, files in os.walk(src):
    for f in files:
        if f.endswith(".rs"):
            mods.add(module_of(os.path.join(root, f)))
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
            refs = set(re.findall(r"\bcrate::(\w+(?:::\w+)?)", text))
            for g in re.findall(r"\bcrate::\{([^}]*)\}", text):
                refs.update(re.findall(r"(?:^|,)\s*(\w+)", g))
            if f == "mod.rs" and m in LAYERS:
                # a layer folder's facade: `pub use crate::cm::cma::Cma;` makes `cm::Cma` cma's
                for use in re.findall(r"pub use crate::([^;]*);", text):
                    path, _, names = use.partition("::{")
                    if not names:
                        path, _, names = use.rpartition("::")
                    for n in re.findall(r"\w+", names):
                        reexport.setdefault(m + "::" + n, path)
            edges.setdefault(m, set()).update(r for r in refs if r != m)

# Names lib.rs re-exports (`crate::PortSpace`) count as their module.
lib = strip_comments(open(os.path.join(src, "lib.rs")).read())
for m, names in re.findall(r"pub use (\w+)::\{?([^;}]*)\}?;", lib):
    for n in re.findall(r"\w+", names):
        reexport.setdefault(n, m)
edges = {m: {ref_of(reexport.get(r, r)) for r in rs} for m, rs in edges.items()}
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
