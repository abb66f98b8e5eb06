#!/usr/bin/env bash
# Builds the drop-in libibverbs.so.1 and librdmacm.so.1 (docs/CABI.md):
#   bash scripts/build-cabi.sh [--debug] [--no-build]
#   export LD_LIBRARY_PATH=$PWD/target/release/cabi     (target/debug/cabi with --debug)
# One shared object, SONAME libibverbs.so.1, with rdma-core 44's symbol versions
# (crates/cabi/cabi.map); librdmacm.so.1 is a symlink to it, so that both names map one file
# and one runtime (one connection manager, one device registry) per process.
set -euo pipefail
cd "$(dirname "$0")/.."
# --no-build: link the static library cargo already built (the tests do this).
profile=release
flag=--release
build=1
for a in "$@"; do
    case $a in
    --debug) profile=debug flag= ;;
    --no-build) build=0 ;;
    *) echo "usage: $0 [--debug] [--no-build]" >&2; exit 2 ;;
    esac
done
target=${CARGO_TARGET_DIR:-target}
if ((build)); then
    cargo build $flag -p rdma-cabi
fi
out=$target/$profile/cabi
lib=$target/$profile/librdma_cabi.a
mkdir -p "$out"
# Symbols rdma-core exports at two versions (the compat one and the default one): the
# archive's definition is renamed __cabi_impl_<name> and two trampolines jump to it, bound
# with .symver to <name>@<old version> and <name>@@<default version> (as rdma-core's
# util/symver.h does with its own renamed definitions).
asm=$out/compat.S
defined=$(nm -g --defined-only "$lib" 2>/dev/null | awk '{print $3}' | sort -u)
renames=$out/renames.txt
: >"$renames"
{
    echo '.text'
    grep -v '^#' crates/cabi/compat.list | while read -r name old new; do
        grep -qx "$name" <<<"$defined" || continue
        grep -q "^$name " "$renames" || echo "$name __cabi_impl_$name" >>"$renames"
        for v in "$old@" "$new@@"; do
            ver=${v%%@*}
            at=${v#"$ver"}
            t="__cabi_${name}_${ver//./_}"
            printf '.globl %s\n.type %s,@function\n%s:\n\tjmp __cabi_impl_%s\n.symver %s, %s%s%s\n' \
                "$t" "$t" "$t" "$name" "$t" "$name" "$at" "$ver"
        done
    done
    echo '.section .note.GNU-stack,"",@progbits'
} >"$asm"
cp "$lib" "$out/librdma_cabi.a"
objcopy --redefine-syms="$renames" "$out/librdma_cabi.a"
lib=$out/librdma_cabi.a
gcc -c -o "$out/compat.o" "$asm"
gcc -shared -o "$out/libibverbs.so.1" -Wl,-soname,libibverbs.so.1 \
    -Wl,--version-script=crates/cabi/cabi.map \
    "$out/compat.o" -Wl,--whole-archive "$lib" -Wl,--no-whole-archive \
    -lpthread -ldl -lm -lrt -lgcc_s -lc
rm -f "$out/librdma_cabi.a" # the renamed copy, linked in now
ln -sf libibverbs.so.1 "$out/librdmacm.so.1"
ln -sf libibverbs.so.1 "$out/libibverbs.so"
ln -sf librdmacm.so.1 "$out/librdmacm.so"
echo "built $out/libibverbs.so.1 (librdmacm.so.1 -> it); export LD_LIBRARY_PATH=$(cd "$out" && pwd)"
