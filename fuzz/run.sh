#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (CI: 60; the targets in `half` below, added later
# with narrower inputs, for SECONDS/2 to keep CI's total short) and fails if any of them
# crashes (a panic, a failed assertion, an input slower than 30 s or over the memory limit).
#
#   bash fuzz/run.sh SECONDS
#
# Each target starts from its working corpus (fuzz/corpus/<target>, not checked in, where new
# inputs go) and, when there is one, its checked-in seeds (fuzz/seeds/<target>, made from
# ../shared/captures by fuzz/make_corpus.py). A crashing input is saved under
# fuzz/artifacts/<target>/; replay it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
# Needs cargo-fuzz (`cargo install cargo-fuzz`); the stable toolchain does with RUSTC_BOOTSTRAP=1.
set -euo pipefail
secs=${1:?usage: fuzz/run.sh SECONDS}
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
half=" gro gsi icrc_id local_bell local_ring pull steer ud_qp "
failed=()
for t in $(cargo fuzz list); do
    t_secs=$secs
    [[ "$half" == *" $t "* ]] && t_secs=$(( (secs + 1) / 2 ))
    mkdir -p "corpus/$t"
    dirs=("corpus/$t")
    [ -d "seeds/$t" ] && dirs+=("seeds/$t")
    echo "=== fuzz $t for ${t_secs}s (${dirs[*]})"
    if ! cargo fuzz run -O "$t" "${dirs[@]}" -- -max_total_time="$t_secs" -timeout=30 \
        -print_final_stats=1; then
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: ${secs}s each (${half# } at half), no crash"
