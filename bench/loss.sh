#!/usr/bin/env bash
# Loss recovery: rping -C COUNT -S SIZE between two namespace hosts (testhosts two-hosts,
# 192.0.2.1 -> 192.0.2.2), with RDMA_SOFT_FAULTS on both sides, for N seed pairs per fault
# mix: the issue's mix (loss 5 %, dup 2 %, reorder 5 %), 1 % loss, and clean. Prints one
# line per run (wall time of the client, from its start to its exit, connection included;
# the transport's retransmissions counted from both sides' debug logs) and a summary per
# mix. A benchmark, not a test: nothing here passes or fails on a number.
#
# Usage: bench/loss.sh [--seeds N] [--count C] [--size S] [--mix NAME]... [--bin DIR]
#   --seeds N  seed pairs per mix (default 10); pair k: server seed 2k+1, client 2k+2
#   --count C  rping iterations (default 200)     --size S  rping size (default 4000)
#   --mix NAME issue | loss1 | clean (repeatable; default all three)
#   --bin DIR  where rping and testhosts are (default target/release)
#   --keep DIR keep each run's logs there (MIX-PAIR-{s,c}.{log,out}; RUST_LOG adds to them)
# Needs root and cargo build --release -p rdma-tools -p rdma-testhosts. Uses (and removes)
# the two-hosts namespaces: it refuses to run if they exist already.
#
# Counts, per run and side summed: timeouts (local ACK timer expiries), probes (early
# retransmission timer expiries), spurious (probes found spurious: the peer acknowledged the
# probed packet twice), resent (request packets resent by go-back-N, timeouts and probes).
# A binary without the probe timer shows probes 0; one without the check, spurious 0.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release
SEEDS=10
COUNT=200
SIZE=4000
MIXES=()
KEEP=
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds) SEEDS=$2; shift ;;
        --count) COUNT=$2; shift ;;
        --size) SIZE=$2; shift ;;
        --mix) MIXES+=("$2"); shift ;;
        --bin) BIN=$2; shift ;;
        --keep) KEEP=$2; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "loss.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ ${#MIXES[@]} -gt 0 ] || MIXES=(issue loss1 clean)
[ "$(id -u)" = 0 ] || { echo "loss.sh: needs root (network namespaces)" >&2; exit 1; }
for b in rping testhosts; do
    [ -x "$BIN/$b" ] || { echo "loss.sh: $BIN/$b not built" >&2; exit 1; }
done
NS_A=rthcli-two-hosts-a
NS_B=rthcli-two-hosts-b
if ip netns list | grep -q "^$NS_A\b"; then
    echo "loss.sh: $NS_A exists (someone else's run?); remove it with testhosts down two-hosts" >&2
    exit 1
fi
"$BIN/testhosts" up two-hosts >/dev/null || exit 1
TMP=$(mktemp -d)
SERVER=
cleanup() {
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
    "$BIN/testhosts" down two-hosts >/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

spec() {
    case "$1" in
        issue) echo "loss=0.05,dup=0.02,reorder=0.05" ;;
        loss1) echo "loss=0.01" ;;
        clean) echo "" ;;
        *) echo "loss.sh: unknown mix $1" >&2; exit 2 ;;
    esac
}

# counts in a debug log: timeouts probes spurious resent
counts() {
    awk '
        /local ACK timeout/ { t++ }
        /probe: (last packet resent|go-back-N)/ { p++ }
        /probe: spurious/ { s++ }
        /probe: last packet resent/ { r++ }
        /retransmitting \(go-back-N\)/ {
            if (match($0, /packets=[0-9]+/)) r += substr($0, RSTART + 8, RLENGTH - 8)
        }
        END { printf "%d %d %d %d\n", t, p, s, r }' "$@"
}

# one run: prints "secs ok timeouts probes spurious resent"
run() {
    local mix=$1 k=$2 f s_env c_env
    f=$(spec "$mix") || exit 2
    s_env= c_env=
    if [ -n "$f" ]; then
        s_env="$f,seed=$((2 * k + 1))"
        c_env="$f,seed=$((2 * k + 2))"
    fi
    ip netns exec $NS_B env RDMA_SOFT_FAULTS="$s_env" RUST_LOG=${RUST_LOG:-rdma_proto=debug} \
        "$BIN/rping" -s -a 192.0.2.2 -C "$COUNT" -S "$SIZE" -V \
        >"$TMP/s.out" 2>"$TMP/s.log" &
    SERVER=$!
    sleep 0.5
    local t0 t1 ok=ok
    t0=$(date +%s.%N)
    ip netns exec $NS_A env RDMA_SOFT_FAULTS="$c_env" RUST_LOG=${RUST_LOG:-rdma_proto=debug} \
        timeout 300 "$BIN/rping" -c -a 192.0.2.2 -C "$COUNT" -S "$SIZE" -V \
        >"$TMP/c.out" 2>"$TMP/c.log" || ok=FAIL
    t1=$(date +%s.%N)
    wait "$SERVER" || ok=FAIL
    SERVER=
    if [ -n "$KEEP" ]; then
        mkdir -p "$KEEP"
        for f in s.log c.log s.out c.out; do cp "$TMP/$f" "$KEEP/$mix-$k-$f"; done
    fi
    echo "$(echo "$t1 - $t0" | bc) $ok $(counts "$TMP/s.log" "$TMP/c.log")"
}

printf "rping -C %s -S %s, %s seed pairs per mix, binaries %s\n" "$COUNT" "$SIZE" "$SEEDS" "$BIN"
for mix in "${MIXES[@]}"; do
    spec "$mix" >/dev/null || exit 2
    secs=()
    fails=0
    tt=0 tp=0 ts=0 tr=0
    for k in $(seq 0 $((SEEDS - 1))); do
        read -r s ok t p sp r < <(run "$mix" "$k")
        printf "%-6s pair %2d: %7.2f s %-4s timeouts %4d probes %4d spurious %3d resent %5d\n" \
            "$mix" "$k" "$s" "$ok" "$t" "$p" "$sp" "$r"
        secs+=("$s")
        [ "$ok" = ok ] || fails=$((fails + 1))
        tt=$((tt + t)) tp=$((tp + p)) ts=$((ts + sp)) tr=$((tr + r))
    done
    sorted=$(printf "%s\n" "${secs[@]}" | sort -g)
    printf "%-6s: median %.2f s, min %.2f, max %.2f; failed %d; timeouts %d probes %d spurious %d resent %d (all runs)\n" \
        "$mix" "$(echo "$sorted" | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')" \
        "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)" "$fails" "$tt" "$tp" "$ts" "$tr"
done
