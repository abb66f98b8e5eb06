#!/usr/bin/env bash
# CPU contention: rdma-perf write_bw (64 KiB) and send_lat (64 B) over loopback, and UCX over
# TCP (ucx_perftest tag_bw / tag_lat, same sizes) beside it, first on a quiet machine, then
# with HOGS busy-looping processes (default 2: one per core here) started by this script.
# Prints one table: each figure quiet and under the hogs, and how much it degraded. A
# benchmark, not a test: nothing here passes or fails on a number.
#
# Usage: bench/contention.sh [--hogs N] [--runs K] [--out FILE]
#   --hogs N   busy-looping processes during the loaded runs (default 2)
#   --runs K   runs per figure; the median is reported (default 3)
#   --out FILE also append the table to FILE (e.g. docs/BENCHMARKS.md)
# Needs target/release/rdma-perf (cargo build --release -p rdma-tools) and, for the UCX rows,
# ucx_perftest (Debian: ucx-utils).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PERF=${RDMA_PERF:-$ROOT/target/release/rdma-perf}
HOGS=2
RUNS=3
OUT=
while [ $# -gt 0 ]; do
    case "$1" in
        --hogs) HOGS=$2; shift ;;
        --runs) RUNS=$2; shift ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "contention.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$PERF" ] || { echo "contention.sh: $PERF not built" >&2; exit 1; }
PORT=19500
HOG_PIDS=()
cleanup() { for p in "${HOG_PIDS[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT

start_hogs() {
    for _ in $(seq 1 "$HOGS"); do
        bash -c 'while :; do :; done' &
        HOG_PIDS+=($!)
    done
}
stop_hogs() { cleanup; HOG_PIDS=(); }

# wait_listen PORT: until a server listens on TCP PORT (rdma-perf's out-of-band socket).
wait_listen() {
    for _ in $(seq 1 100); do
        ss -ltn "sport = :$1" 2>/dev/null | grep -q LISTEN && return 0
        sleep 0.05
    done
    return 1
}

# ours TEST SIZE ITERS COLUMN -> the figure (perftest layout: bw average col 4, lat median col 5)
ours() {
    local test=$1 size=$2 iters=$3 col=$4 spid out
    PORT=$((PORT + 1))
    timeout 120 "$PERF" "$test" -R -s "$size" -n "$iters" -p "$PORT" --bind 127.0.0.61 \
        >/dev/null 2>&1 &
    spid=$!
    wait_listen "$PORT"
    out=$(timeout 120 "$PERF" "$test" -R -s "$size" -n "$iters" -p "$PORT" --bind 127.0.0.62 \
        127.0.0.61 2>&1)
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    awk -v c="$col" '$1 ~ /^[0-9]+$/ && NF >= c { print $c; exit }' <<<"$out"
}

# ucx TEST SIZE ITERS COLUMN (ucx_perftest -f: iters lat_p50 lat_avg lat_all bw_avg bw_all ...)
ucx() {
    local test=$1 size=$2 iters=$3 col=$4 spid out
    command -v ucx_perftest >/dev/null || { echo "-"; return; }
    PORT=$((PORT + 1))
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
    spid=$!
    wait_listen "$PORT"
    out=$(UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p "$PORT" \
        -t "$test" -s "$size" -n "$iters" -w 100 -f 2>&1)
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    awk -v c="$col" 'NF == 8 && $1 ~ /^[0-9]+$/ { v = $c } END { print v }' <<<"$out"
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }

# measure NAME CMD... -> median of RUNS runs
measure() {
    local v
    for _ in $(seq 1 "$RUNS"); do
        v=$("$@")
        [ -n "$v" ] && echo "$v"
    done | median
}

declare -A R
rows=(
    "ours_bw|rdma-perf write_bw 64 KiB|MB/s|ours write_bw 65536 3000 4"
    "ucx_bw|UCX tcp tag_bw 64 KiB|MB/s|ucx tag_bw 65536 3000 6"
    "ours_lat|rdma-perf send_lat 64 B|µs|ours send_lat 64 5000 5"
    "ucx_lat|UCX tcp tag_lat 64 B|µs|ucx tag_lat 64 20000 2"
)
for phase in quiet loaded; do
    [ "$phase" = loaded ] && start_hogs
    for r in "${rows[@]}"; do
        IFS='|' read -r key label unit cmd <<<"$r"
        echo "contention.sh: $phase: $label" >&2
        # shellcheck disable=SC2086
        R[$key.$phase]=$(measure $cmd)
    done
    [ "$phase" = loaded ] && stop_hogs
done

table() {
    echo "| figure | quiet | with $HOGS CPU hogs | loaded / quiet |"
    echo "| --- | --- | --- | --- |"
    for r in "${rows[@]}"; do
        IFS='|' read -r key label unit _ <<<"$r"
        q=${R[$key.quiet]}
        l=${R[$key.loaded]}
        ratio=$(awk -v q="$q" -v l="$l" 'BEGIN { if (q + 0 > 0 && l + 0 > 0) printf "%.2fx", l / q; else print "-" }')
        echo "| $label | $q $unit | $l $unit | $ratio |"
    done
}
echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg), median of $RUNS runs, $(date -u +%F)"
echo
table
if [ -n "$OUT" ]; then
    {
        echo
        echo "Machine: $(nproc) cores, median of $RUNS runs, $(date -u +%F)"
        echo
        table
    } >>"$OUT"
fi
