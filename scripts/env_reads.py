#!/usr/bin/env python3
"""Checks that library code reads the environment in one place per crate (issue 31).

Every `env::var` / `env::var_os` in `crates/*/src` must be in one of the files below: each
crate's configuration module (its `from_env` is the one reader; docs/CONFIG.md lists the
variables), or a named exception that is not library configuration. Comment lines are
skipped. Exit status 1 lists the reads found elsewhere.
"""
import pathlib
import re
import sys

ALLOWED = {
    # the configuration modules: the only readers of RDMA_SOFT_*, RDMACM_* and RUST_LOG
    "crates/soft/src/config.rs",
    "crates/rdmacm/src/config.rs",
    "crates/cabi/src/config.rs",
    # not library configuration: the tests' root switch, the tools' log filter
    "crates/testhosts/src/ns.rs",
    "crates/tools/src/log.rs",
}
READ = re.compile(r"\benv::var(_os)?\s*\(")


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = []
    for path in sorted(root.glob("crates/*/src/**/*.rs")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.strip()
            if code.startswith("//"):
                continue
            if READ.search(code):
                bad.append(f"{rel}:{n}: {code}")
    if bad:
        print("environment read outside the configuration modules (scripts/env_reads.py):")
        print("\n".join(bad))
        return 1
    print(f"environment reads: only in {len(ALLOWED)} allowed files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
