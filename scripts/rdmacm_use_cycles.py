#!/usr/bin/env python3
"""Fails if the modules of a workspace crate refer to each other in a circle (issue 31).

Every crate under crates/ is checked, at every level of its module tree: the nodes are the
modules of one parent (`crate::io`'s are `udp`, `share`, `local`, ...; `io/udp/rx.rs` counts as
`udp` there and as `io` at the crate root), and an edge A -> B is a `use` or an inline path in
A's files (`crate::`, `super::`, `self::`) that names B or something B holds. A name a module
re-exports (`pub use`) counts as the module that defines it. A module and its own children
are one unit (a child using its parent's items is not a circle). Comments, string literals,
unit tests (`#[cfg(test)] mod`) and test-only files are left out.

A circle is allowed only where it is named in EXCEPTIONS below with its reason: the edge
listed there is ignored. An exception whose edge no longer exists is reported, so the list
stays true. Usage: scripts/rdmacm_use_cycles.py [-v] [crate ...]  (-v: also list the pairs of
files that import each other, the figure issue 31 counts).
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (crate, scope, from, to): reason. Removing the edge from -> to (siblings under `scope`,
# "" for the crate root) breaks the circle it closes.
IMPL_SPLIT = "a type's impl split across files"
EXCEPTIONS = {
    # --- a type's impl split across files (the rule's own exception)
    ("soft", "runtime", "apm", "qp_ctx"): IMPL_SPLIT + ": QpCtx's path migration (impl QpCtx in apm.rs)",
    ("soft", "runtime", "mcast", "ud"): IMPL_SPLIT + ": UdState's multicast part (impl UdState in mcast.rs)",
    ("soft", "queues", "cq_wake", "cq"): IMPL_SPLIT + ": the CQ's wake-up of channels and tasks (CqShared)",
    ("soft", "queues", "async_tap", "async_event"): IMPL_SPLIT + ": the async event queue and its taps (AsyncQueue holds Taps)",
    ("soft", "verbs", "rc_modify", "qp"): IMPL_SPLIT + ": QueuePair::modify's RC half (a function of rc_modify.rs over the QP)",
    ("soft", "verbs", "ud", "qp"): IMPL_SPLIT + ": QueuePair's UD side (impl QueuePair in ud.rs)",
    ("proto", "cm", "lap", "conn"): IMPL_SPLIT + ": the agent's LAP/APR methods (impl CmAgent in lap.rs) use the connection as agent.rs does",
    ("proto", "cm", "lap", "agent"): IMPL_SPLIT + ": the agent's LAP/APR methods (impl CmAgent in lap.rs)",
    ("rdmacm", "async_api", "reconnect", "connection"): IMPL_SPLIT + ": Connection::reconnect (impl Connection in reconnect.rs)",
    ("cabi", "", "qp_ex", "qp"): "C ABI object graph: the extended QP (ibv_qp_ex) entry points work on the QP object, which installs them",
    # --- the verbs object graph: as in ibverbs, an object refers to the object that made it
    # (a PD its device, an MR and a QP their PD) and the maker's method creates it
    # (Device::alloc_pd, ProtectionDomain::register, ...). One module per object keeps
    # the files small; the parent link is the edge ignored.
    ("soft", "verbs", "pd", "device"): "verbs object graph: a PD holds its device",
    ("soft", "verbs", "mr", "pd"): "verbs object graph: an MR holds its PD",
    ("soft", "verbs", "qp", "pd"): "verbs object graph: a QP holds its PD",
    ("soft", "verbs", "qp", "device"): "verbs object graph: a QP holds its device's state",
    ("soft", "verbs", "ud", "pd"): "verbs object graph: an address handle holds its PD",
    ("soft", "verbs", "ud", "device"): "verbs object graph: the UD side reaches its device's state",
    ("soft", "verbs", "rc_modify", "device"): "verbs object graph: RC modify reaches its device's state",
    ("soft", "verbs", "srq", "pd"): "verbs object graph: an SRQ holds its PD",
    ("soft", "verbs", "port", "device"): IMPL_SPLIT + ": the device's ports (impl Device, impl DeviceShared in port.rs)",
    ("soft", "verbs", "watch", "device"): IMPL_SPLIT + ": the device's wire watch (impl Device in watch.rs)",
    ("cabi", "", "objects", "device"): "C ABI object graph: the verbs objects hold their ibv_context",
    ("cabi", "", "qp", "device"): "C ABI object graph: a QP holds its ibv_context",
    ("cabi", "", "cq", "device"): "C ABI object graph: a CQ and a completion channel hold their ibv_context",
}


def strip(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(l.split("//", 1)[0] for l in text.splitlines())
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    # unit tests: `super` there is the file's own module; they are not the crate's layers
    m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
    return text[:m.start()] if m else text


def split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out if x.strip()]


def expand(tree):
    """A use tree as the paths it imports (lists of segments)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [[s for s in tree.split("::") if s]]
    prefix = [s for s in tree[:i].split("::") if s]
    return [prefix + p for part in split_top(tree[i + 1:tree.rfind("}")]) for p in expand(part)]


class Crate:
    def __init__(self, src):
        self.files = {}
        for root, _, files in os.walk(src):
            for f in files:
                if f.endswith(".rs"):
                    p = os.path.join(root, f)
                    rel = os.path.relpath(p, src)[:-3].split(os.sep)
                    if rel[-1] in ("mod", "lib", "main"):
                        rel = rel[:-1]
                    self.files[tuple(rel)] = p
        raw = {m: open(p).read() for m, p in self.files.items()}
        for m, t in raw.items():  # test-only files: `#[cfg(test)] mod x;`
            for c in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", t):
                self.files.pop(m + (c,), None)
        self.mods = {m[:i] for m in self.files for i in range(len(m) + 1)}
        self.texts = {m: strip(raw[m]) for m in self.files}
        self.reexp = {}
        for m, t in self.texts.items():
            r = {}
            for u in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", t):
                for p in expand(u):
                    if len(p) < 2:
                        continue
                    if p[0] == "self":
                        p = p[1:]
                    if p[0] == "crate":
                        r[p[-1]] = tuple(p[1:-1])
                    elif m + (p[0],) in self.mods:
                        r[p[-1]] = m + tuple(p[:-1])
            self.reexp[m] = r

    def resolve(self, base, rest, depth=0):
        cur, rest = tuple(base), list(rest)
        while rest and cur + (rest[0],) in self.mods:
            cur += (rest.pop(0),)
        if rest and depth < 8 and rest[0] in self.reexp.get(cur, {}):
            return self.resolve(self.reexp[cur][rest[0]], rest[1:], depth + 1)
        return cur

    def absolute(self, m, path):
        if path[0] == "crate":
            return self.resolve((), path[1:])
        if path[0] in ("super", "self"):
            base = m
            while path and path[0] in ("super", "self"):
                if path[0] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                path = path[1:]
            return self.resolve(base, path)
        return None

    def refs(self, m):
        t = self.texts[m]
        paths = [p for u in re.findall(r"\buse\s+([^;]+);", t) for p in expand(u)]
        paths += [p.split("::") for p in re.findall(r"\b(?:crate|super|self)(?:::\w+)+", t)]
        return {a for a in (self.absolute(m, p) for p in paths if p) if a is not None}

    def edges(self):
        """{(scope, from, to)}: references between sibling modules."""
        e = set()
        for m in self.files:
            for a in self.refs(m):
                n = 0
                while n < len(m) and n < len(a) and m[n] == a[n]:
                    n += 1
                if n < len(m) and n < len(a):
                    e.add((m[:n], m[n], a[n]))
        return e

    def file_pairs(self):
        fe = set()
        for m in self.files:
            for a in self.refs(m):
                while a and a not in self.files:
                    a = a[:-1]
                if a != m:
                    fe.add((m, a))
        return sorted({tuple(sorted(p)) for p in fe if (p[1], p[0]) in fe})


def cycles(edges):
    by = {}
    for s, a, b in edges:
        by.setdefault(s, {}).setdefault(a, set()).add(b)
    out = []
    for s, g in sorted(by.items()):
        state, stack = {}, []

        def dfs(x):
            state[x] = 1
            stack.append(x)
            for y in sorted(g.get(x, ())):
                if state.get(y) == 1:
                    out.append((s, stack[stack.index(y):] + [y]))
                elif y not in state:
                    dfs(y)
            stack.pop()
            state[x] = 2

        for x in sorted(g):
            if x not in state:
                dfs(x)
    return out


def main():
    verbose = "-v" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if a != "-v"]
    crates = names or sorted(os.listdir(os.path.join(ROOT, "crates")))
    failed, pairs_total = False, 0
    for c in crates:
        src = os.path.join(ROOT, "crates", c, "src")
        if not os.path.isdir(src):
            continue
        cr = Crate(src)
        edges = cr.edges()
        named = {(s, a, b) for (k, s, a, b) in EXCEPTIONS if k == c}
        scoped = {(tuple(s.split("::")) if s else (), a, b) for (s, a, b) in named}
        for s, a, b in sorted(scoped - edges):
            print(f"{c}: exception {'::'.join(s) or 'crate'}: {a} -> {b} names no edge: remove it")
            failed = True
        found = cycles(edges - scoped)
        pairs = cr.file_pairs()
        pairs_total += len(pairs)
        for s, cy in found:
            print(f"{c}: cycle in {'::'.join(('crate',) + s)}: " + " -> ".join(cy))
            failed = True
        if verbose:
            print(f"{c}: {len(cr.files)} files, {len(pairs)} pairs importing each other, "
                  f"{len(scoped & edges)} named exceptions")
            for x, y in pairs:
                print(f"    {'/'.join(x) or 'lib'} <-> {'/'.join(y) or 'lib'}")
    if failed:
        return 1
    print(f"no use cycles in {len(crates)} crates beyond the {len(EXCEPTIONS)} named exceptions"
          f" ({pairs_total} pairs of files import each other)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
