#!/usr/bin/env bash
# Benchmarks side by side, in one run on this machine, over loopback:
#   - the physical limits of loopback, measured by crates/bench (rdma-bench):
#     UDP ping-pong (64 B, 4 KiB), one TCP stream, TCP connect/accept/close;
#   - our rdma-perf (send/write/read latency and bandwidth; on the host-local wire, the
#     same-host default, and on RoCEv2/UDP with RDMA_SOFT_LOCAL_WIRE=0) and cmtime, when built;
#   - the alternatives a user would pick instead, when installed: libfabric's tcp and shm
#     providers (fi_pingpong; fabtests when Debian packages them) and UCX over TCP and over
#     shared memory (ucx_perftest).
# Prints one table (each figure and its ratio to the physical limit) and writes it, with the
# machine it ran on, to docs/BENCHMARKS.md.
#
# Usage: bench/compare.sh [--install] [--quick] [--runs N] [--wait-quiet SECS] [--no-pin]
#                         [--out FILE] [--no-write] [-h]
#   --install   install the alternatives from Debian's packages (apt-get update once, then
#               apt-get install libfabric-bin ucx-utils [fabtests]); needs root
#   --quick     fewer iterations and shorter streams (a smoke run, figures are noisier)
#   --runs N    measure everything N times (one whole run after the other) and report, per row,
#               the median with the spread: min, max, and the worst run over the median (ratios
#               are taken within each run, then their median is shown)
#   --wait-quiet SECS  before measuring, wait up to SECS for the 1-minute load average to
#               drop below 0.5 (the machine is shared; other builds skew the figures)
#   --no-pin    do not pin the RDMA pairs (ours, fi_pingpong, ucx_perftest); by default the
#               server runs on CPU 0 and the client on CPU 1 (taskset), as perftest users do
#   --out FILE  where to write the Markdown (default docs/BENCHMARKS.md)
#   --no-write  print the table only
# A tool that is missing or fails gives a row that says so; the script still finishes.

set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/docs/BENCHMARKS.md"
INSTALL=0
QUICK=0
WRITE=1
WAIT_QUIET=0
WAITED=0
PIN=1
RUNS=1
ROWS_OUT=""

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --install) INSTALL=1 ;;
        --quick) QUICK=1 ;;
        --out)
            [ $# -ge 2 ] || { echo "compare.sh: --out needs a file" >&2; exit 2; }
            OUT=$2
            shift
            ;;
        --out=*) OUT=${1#--out=} ;;
        --no-write) WRITE=0 ;;
        --no-pin) PIN=0 ;;
        --runs)
            if [ $# -lt 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
                echo "compare.sh: --runs needs a count of at least 1" >&2
                exit 2
            fi
            RUNS=$2
            shift
            ;;
        --rows-out) # internal: one run of --runs N writes its raw rows here
            ROWS_OUT=$2
            shift
            ;;
        --wait-quiet)
            if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
                echo "compare.sh: --wait-quiet needs seconds" >&2
                exit 2
            fi
            WAIT_QUIET=$2
            shift
            ;;
        -h | --help) usage; exit 0 ;;
        *) echo "compare.sh: unknown option '$1' (try -h)" >&2; exit 2 ;;
    esac
    shift
done

# Sizes of the run. Latency: iterations; bandwidth: messages (or seconds for tcp-stream).
if [ "$QUICK" = 1 ]; then
    LAT_ITERS=2000 BW_SECS=0.5 CONNS=200 BW_ITERS_64K=500 BW_ITERS_1M=100
else
    LAT_ITERS=50000 BW_SECS=3 CONNS=1000 BW_ITERS_64K=20000 BW_ITERS_1M=2000
fi
CONC=8
SERVER_IP=127.0.0.1   # our tools: server address
CLIENT_IP=127.0.0.2   # our tools: client address (one process per address, DESIGN.md)
TOOL_TIMEOUT=60       # seconds for any one external command
# Each RDMA pair pinned, server on CPU 0, client on CPU 1: unpinned, the scheduler may put
# both busy pollers (and their helper threads) on one core for a while, and a run's figure
# then depends on where they landed (ours: 64 B host-local 1.2-1.5 µs unpinned, 0.8 pinned).
PIN_SRV=()
PIN_CLI=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PIN_SRV=(taskset -c 0)
    PIN_CLI=(taskset -c 1)
fi

START_S=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
LOG=$(mktemp -d "${TMPDIR:-/tmp}/compare.XXXXXX")
trap 'rm -rf "$LOG"' EXIT

say() { printf 'compare.sh: %s\n' "$*" >&2; }

# ----------------------------------------------------------------------------------------
# Table rows: section|measure|tool|figure|unit|ratio|notes
ROWS=()
row() { ROWS+=("$1|$2|$3|$4|$5|$6|${7//|//}"); }

# ratio FIGURE LIMIT -> FIGURE/LIMIT with 2 decimals, or "-" when either is not a number.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'
}
fmt() { awk -v a="$1" -v d="${2:-2}" 'BEGIN { if (a ~ /^[0-9.]+$/) printf "%.*f", d, a; else printf "%s", a }'; }
twice() { awk -v a="$1" 'BEGIN { if (a ~ /^[0-9.]+$/) printf "%.3f", a * 2; else printf "-" }'; }
half() { awk -v a="$1" 'BEGIN { if (a ~ /^[0-9.]+$/) printf "%.3f", a / 2; else printf "-" }'; }

# JSON helpers for the flat one-line output of crates/bench: jnum JSON KEY -> the number.
jnum() { grep -o "\"$2\":[-0-9.e+]*" <<<"$1" | head -n1 | cut -d: -f2; }
# jobj JSON KEY VALUE -> the object of "results" whose KEY is VALUE.
jobj() { tr '{' '\n' <<<"$1" | grep "\"$2\":\"$3\"" | head -n1; }

# wait_port PROTO PORT: until something listens (at most ~5 s).
wait_port() {
    if ! command -v ss >/dev/null; then
        sleep 0.5
        return 0
    fi
    for _ in $(seq 1 50); do
        if ss -Hln"${1:0:1}" 2>/dev/null | awk '{print $4}' | grep -q ":$2\$"; then return 0; fi
        sleep 0.1
    done
    return 1
}

# stop_bg PID: end a server this script started, if it is still running.
stop_bg() {
    if kill -0 "$1" 2>/dev/null; then
        kill "$1" 2>/dev/null
        sleep 0.2
        kill -9 "$1" 2>/dev/null
    fi
    wait "$1" 2>/dev/null
}

# ----------------------------------------------------------------------------------------
# The machine
cpu_model=$(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}')
cpus=$(nproc 2>/dev/null || echo "?")
mem=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)
kernel=$(uname -r)
# shellcheck disable=SC1091
os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")
when=$(date -u '+%Y-%m-%d %H:%M UTC')
rustc_v=$(rustc --version 2>/dev/null || echo "?")
commit=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo "?")
say "machine: ${cpu_model:-?}, $cpus CPUs, $mem, Linux $kernel, load $LOAD_START"

# ----------------------------------------------------------------------------------------
# Install the alternatives on request
apt_has() { apt-cache show "$1" >/dev/null 2>&1; }
PKG_NOTES=()
if [ "$INSTALL" = 1 ]; then
    if ! command -v apt-get >/dev/null; then
        say "--install: no apt-get here, skipping"
        PKG_NOTES+=("--install given but this machine has no apt-get")
    else
        say "apt-get update"
        if ! apt-get update -qq >"$LOG/apt-update" 2>&1; then
            say "apt-get update failed (see below); trying the install anyway"
            tail -n 3 "$LOG/apt-update" >&2
        fi
        pkgs=()
        for p in libfabric-bin ucx-utils fabtests; do
            if apt_has "$p"; then pkgs+=("$p"); else PKG_NOTES+=("Debian package '$p' does not exist here"); fi
        done
        if [ ${#pkgs[@]} -gt 0 ]; then
            say "apt-get install ${pkgs[*]}"
            if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >"$LOG/apt-install" 2>&1; then
                PKG_NOTES+=("installed: ${pkgs[*]}")
            else
                say "apt-get install failed:"
                tail -n 5 "$LOG/apt-install" >&2
                PKG_NOTES+=("apt-get install ${pkgs[*]} failed")
            fi
        fi
    fi
fi
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "not installed"; }

# ----------------------------------------------------------------------------------------
# Build
cd "$ROOT" || exit 1
say "cargo build --release -p rdma-bench"
if ! cargo build --release -q -p rdma-bench 2>"$LOG/build-bench"; then
    cat "$LOG/build-bench" >&2
    say "the baselines do not build: nothing to compare against, stopping"
    exit 1
fi
TARGET=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
    grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
TARGET=${TARGET:-$ROOT/target}
BIN=$TARGET/release

TOOLS_NOTE=""
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"rdma-tools"'; then
    say "cargo build --release -p rdma-tools"
    if ! cargo build --release -q -p rdma-tools 2>"$LOG/build-tools"; then
        TOOLS_NOTE=" (rdma-tools does not build: $(grep -m1 '^error' "$LOG/build-tools" | cut -c1-60))"
        say "rdma-tools does not build:"
        tail -n 3 "$LOG/build-tools" >&2
    fi
else
    TOOLS_NOTE=" (no rdma-tools package)"
fi
RDMA_PERF=""
CMTIME=""
[ -x "$BIN/rdma-perf" ] && RDMA_PERF=$BIN/rdma-perf
[ -x "$BIN/cmtime" ] && CMTIME=$BIN/cmtime
PERF_NOTE="not built yet${TOOLS_NOTE}"
CMTIME_NOTE="not built yet${TOOLS_NOTE}"

# ----------------------------------------------------------------------------------------
# Wait for a quiet machine on request
if [ "$WAIT_QUIET" -gt 0 ]; then
    wait_start=$(date +%s)
    deadline=$((wait_start + WAIT_QUIET))
    while awk '{ exit !($1 >= 0.5) }' /proc/loadavg && [ "$(date +%s)" -lt "$deadline" ]; do
        say "load $(cut -d' ' -f1 /proc/loadavg): waiting for a quiet machine"
        sleep 10
    done
    LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
    WAITED=$(($(date +%s) - wait_start))
    START_S=$((START_S + WAITED))
fi

LAT="Latency, one-way (half the round trip; READ: the round trip), µs: lower is better"
BW="Bandwidth, MB/s (2^20 B): higher is better"
CM="Connection setup, connections/s: higher is better"

# ----------------------------------------------------------------------------------------
# One whole measurement: every row once (--runs N calls this script N times, see below).
measure() {
# Physical limits (crates/bench)

# Measured limits by name, e.g. V[udp_64_busy_med].
declare -gA V

# udp SIZE -> V[udp_SIZE_{busy,block}_{med,avg}] (one-way, µs)
udp() {
    local size=$1 j b k
    say "udp-pingpong, $size B"
    if j=$("$BIN/udp-pingpong" -n "$LAT_ITERS" -s "$size" --json -q 2>"$LOG/udp$size"); then
        b=$(jobj "$j" mode busy-poll)
        k=$(jobj "$j" mode blocking)
        V[udp_${size}_busy_med]=$(jnum "$b" one_way_median_us)
        V[udp_${size}_busy_avg]=$(jnum "$b" one_way_avg_us)
        V[udp_${size}_block_med]=$(jnum "$k" one_way_median_us)
    else
        say "udp-pingpong failed: $(tail -n1 "$LOG/udp$size")"
        V[udp_${size}_busy_med]=failed
        V[udp_${size}_busy_avg]=failed
        V[udp_${size}_block_med]=failed
    fi
}
udp 64
udp 4096

# tcp SIZE -> V[tcp_SIZE] (MB/s)
tcp() {
    local size=$1 j
    say "tcp-stream, $size B writes, ${BW_SECS}s"
    if j=$("$BIN/tcp-stream" -d "$BW_SECS" -s "$size" --json -q 2>"$LOG/tcp$size"); then
        V[tcp_${size}]=$(jnum "$j" mb_per_s)
    else
        say "tcp-stream failed: $(tail -n1 "$LOG/tcp$size")"
        V[tcp_${size}]=failed
    fi
}
tcp 65536
tcp 1048576

say "tcp-connect, $CONNS connections, sequential and $CONC at a time"
if j=$("$BIN/tcp-connect" -n "$CONNS" -c "$CONC" --json -q 2>"$LOG/conn"); then
    s=$(jobj "$j" mode sequential)
    c=$(jobj "$j" mode concurrent)
    CONN_SEQ=$(jnum "$s" conn_per_s) CONN_SEQ_US=$(jnum "$s" us_per_conn)
    CONN_CONC=$(jnum "$c" conn_per_s) CONN_CONC_US=$(jnum "$c" us_per_conn)
else
    say "tcp-connect failed: $(tail -n1 "$LOG/conn")"
    CONN_SEQ=failed CONN_SEQ_US=- CONN_CONC=failed CONN_CONC_US=-
fi

# ----------------------------------------------------------------------------------------
# Our tools. Invocations follow perftest (server: no address; client: server address, -R for
# rdma_cm); adjust here when crates/tools lands.
PORT=18600
next_port() { PORT=$((PORT + 1)); }

# perftest_field OUTPUT COLUMN -> the COLUMN-th field of the result line (the first line that
# starts with a byte count).
perftest_field() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && NF >= c { print $c; exit }' <<<"$1"; }

# The rdma_cm port space's claims (crates/soft/src/io/claim.rs): a listener of ours on port P
# holds claim-NS-0106-P-PID-SEQ in the runtime directory.
RUNDIR=${RDMA_SOFT_RUNDIR:-}
if [ -z "$RUNDIR" ]; then
    if [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -d "${XDG_RUNTIME_DIR}" ]; then
        RUNDIR=$XDG_RUNTIME_DIR/rdma-soft
    else
        RUNDIR=/tmp/rdma-soft-$(id -u)
    fi
fi
# wait_listen PORT PID: until a process of ours listens on rdma_cm port PORT (10 s at most,
# or until PID ends)
wait_listen() {
    for _ in $(seq 1 100); do
        if compgen -G "$RUNDIR/claim-*-0106-$1-*" >/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# ours_perf WIRE TEST SIZE ITERS [ARGS...] -> prints the output of the client, status of the
# pair (ARGS: more rdma-perf options, on both sides).
# WIRE: local (the host-local wire, the default for same-host peers) or udp
# (RDMA_SOFT_LOCAL_WIRE=0: RoCEv2 over UDP on lo). A client that starts before its server
# listens is rejected (REJ 8): the server is awaited, and a rejected row is run once more.
ours_perf() {
    local wire=$1 test=$2 size=$3 iters=$4 spid out rc try lw=1
    shift 4
    [ "$wire" = udp ] && lw=0
    for try in 1 2; do
        next_port
        RDMA_SOFT_LOCAL_WIRE=$lw "${PIN_SRV[@]}" timeout "$TOOL_TIMEOUT" "$RDMA_PERF" "$test" -R \
            -s "$size" -n "$iters" -p "$PORT" --bind "$SERVER_IP" "$@" >"$LOG/ours-srv" 2>&1 &
        spid=$!
        wait_listen "$PORT" "$spid" || sleep 0.3
        out=$(RDMA_SOFT_LOCAL_WIRE=$lw "${PIN_CLI[@]}" timeout "$TOOL_TIMEOUT" "$RDMA_PERF" "$test" \
            -R -s "$size" -n "$iters" -p "$PORT" --bind "$CLIENT_IP" "$@" "$SERVER_IP" 2>&1)
        rc=$?
        stop_bg "$spid"
        if [ "$rc" != 0 ] && [ "$try" = 1 ] && grep -q "REJECTED" <<<"$out"; then
            say "rdma-perf $test: rejected (server not listening yet?), once more"
            continue
        fi
        break
    done
    printf '%s\n' "$out"
    return $rc
}

wire_label() {
    if [ "$1" = udp ]; then echo "rdma-perf, RoCEv2/UDP (ours)"; else echo "rdma-perf, host-local (ours)"; fi
}

# ours_lat WIRE TEST SIZE LIMIT_MED -> a row; perftest's latency columns: #bytes #iterations
# t_min t_max t_typical t_avg ...; t_typical is the median.
ours_lat() {
    local wire=$1 test=$2 size=$3 limit=$4 out v label
    label=$(wire_label "$wire")
    if [ -z "$RDMA_PERF" ]; then
        row "$LAT" "$test $size B" "$label" "-" µs "-" "$PERF_NOTE"
        return
    fi
    say "rdma-perf $test $size B ($wire)"
    if out=$(ours_perf "$wire" "$test" "$size" "$LAT_ITERS") && v=$(perftest_field "$out" 5) && [ -n "$v" ]; then
        if [ "$test" = read_lat ]; then
            # perftest (and rdma-perf) report a READ's whole round trip, not half of it: its
            # ratio is to UDP's round trip (twice the one-way limit).
            row "$LAT" "$test $size B" "$label" "$(fmt "$v")" µs "$(ratio "$v" "$(twice "$limit")")" "median (t_typical); a READ's round trip, ratio to UDP's round trip"
        else
            row "$LAT" "$test $size B" "$label" "$(fmt "$v")" µs "$(ratio "$v" "$limit")" "median (t_typical)"
        fi
    else
        row "$LAT" "$test $size B" "$label" failed µs "-" "$(tail -n1 <<<"$out")"
    fi
}

# ours_bw WIRE TEST SIZE ITERS LIMIT -> a row; perftest's bandwidth columns: #bytes
# #iterations BW_peak BW_average MsgRate.
ours_bw() {
    local wire=$1 test=$2 size=$3 iters=$4 limit=$5 out v label
    label=$(wire_label "$wire")
    if [ -z "$RDMA_PERF" ]; then
        row "$BW" "$test $(human "$size")" "$label" "-" MB/s "-" "$PERF_NOTE"
        return
    fi
    say "rdma-perf $test $size B ($wire)"
    if out=$(ours_perf "$wire" "$test" "$size" "$iters") && v=$(perftest_field "$out" 4) && [ -n "$v" ]; then
        row "$BW" "$test $(human "$size")" "$label" "$(fmt "$v" 0)" MB/s "$(ratio "$v" "$limit")" "BW average"
    else
        row "$BW" "$test $(human "$size")" "$label" failed MB/s "-" "$(tail -n1 <<<"$out")"
    fi
}

human() {
    case "$1" in
        65536) echo "64 KiB" ;;
        1048576) echo "1 MiB" ;;
        4096) echo "4 KiB" ;;
        *) echo "$1 B" ;;
    esac
}

# ----------------------------------------------------------------------------------------
# libfabric: fi_pingpong (libfabric-bin), one-way latency; tcp provider with MSG endpoints
# (like RC), shm provider with RDM endpoints (its only kind).
# fi_lat PROV SIZE LIMIT_AVG (fi_pingpong reports the average only, so it is compared to UDP's)
fi_lat() {
    local prov=$1 size=$2 limit=$3 spid out v ep=msg
    [ "$prov" = shm ] && ep=rdm
    if ! command -v fi_pingpong >/dev/null; then
        row "$LAT" "send $(human "$size")" "libfabric $prov (fi_pingpong)" "-" µs "-" "not installed (Debian: libfabric-bin; run with --install)"
        return
    fi
    say "fi_pingpong -p $prov -e $ep, $size B"
    next_port
    "${PIN_SRV[@]}" timeout "$TOOL_TIMEOUT" fi_pingpong -p "$prov" -e "$ep" -I "$LAT_ITERS" -S "$size" -B "$PORT" >"$LOG/fi-srv" 2>&1 &
    spid=$!
    wait_port tcp "$PORT"
    out=$("${PIN_CLI[@]}" timeout "$TOOL_TIMEOUT" fi_pingpong -p "$prov" -e "$ep" -I "$LAT_ITERS" -S "$size" -P "$PORT" 127.0.0.1 2>&1)
    stop_bg "$spid"
    # columns: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    v=$(awk 'NF == 8 && $7 ~ /^[0-9.]+$/ { print $7; exit }' <<<"$out")
    if [ -n "$v" ]; then
        row "$LAT" "send $(human "$size")" "libfabric $prov (fi_pingpong)" "$(fmt "$v")" µs "$(ratio "$v" "$limit")" "average (fi_pingpong reports no median); ratio to UDP average"
    else
        row "$LAT" "send $(human "$size")" "libfabric $prov (fi_pingpong)" failed µs "-" "$(tail -n1 <<<"$out" | cut -c1-80)"
    fi
}

# fabtests bandwidth, when Debian packages it (it does not in bookworm).
fi_bw_note() {
    if command -v fi_msg_bw >/dev/null; then
        echo "fabtests installed: fi_msg_bw rows not wired yet"
    else
        echo "no bandwidth tool: fabtests (fi_msg_bw, fi_rma_bw) is not packaged by Debian"
    fi
}

# UCX: ucx_perftest (ucx-utils), over TCP on lo (UCX_TLS=tcp UCX_NET_DEVICES=lo: without the
# device restriction UCX also stripes over eth0's address) or shared memory
# (UCX_TLS=posix,sysv,cma,self). -f prints one line:
# iterations lat_p50 lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall
ucx_env() {
    if [ "$1" = shm ]; then echo "UCX_TLS=posix,sysv,cma,self"; else echo "UCX_TLS=tcp UCX_NET_DEVICES=lo"; fi
}
ucx_run() {
    local tls=$1 test=$2 size=$3 iters=$4 warm=$5 spid out
    next_port
    env $(ucx_env "$tls") "${PIN_SRV[@]}" timeout "$TOOL_TIMEOUT" ucx_perftest -p "$PORT" >"$LOG/ucx-srv" 2>&1 &
    spid=$!
    wait_port tcp "$PORT"
    out=$(env $(ucx_env "$tls") "${PIN_CLI[@]}" timeout "$TOOL_TIMEOUT" ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$iters" -w "$warm" -f 2>&1)
    stop_bg "$spid"
    awk 'NF == 8 && $1 ~ /^[0-9]+$/ { line = $0 } END { print line }' <<<"$out"
    [ -n "$(awk 'NF == 8 && $1 ~ /^[0-9]+$/' <<<"$out")" ] || { tail -n1 <<<"$out" >&2; return 1; }
}
ucx_lat() {
    local tls=$1 label=$2 test=$3 size=$4 limit=$5 line v
    if ! command -v ucx_perftest >/dev/null; then
        row "$LAT" "$label $(human "$size")" "UCX $tls ($test)" "-" µs "-" "not installed (Debian: ucx-utils; run with --install)"
        return
    fi
    say "ucx_perftest -t $test, $size B ($tls)"
    if line=$(ucx_run "$tls" "$test" "$size" "$LAT_ITERS" 1000 2>"$LOG/ucx-err"); then
        v=$(awk '{ print $2 }' <<<"$line")
        row "$LAT" "$label $(human "$size")" "UCX $tls ($test)" "$(fmt "$v")" µs "$(ratio "$v" "$limit")" "median"
    else
        row "$LAT" "$label $(human "$size")" "UCX $tls ($test)" failed µs "-" "$(cut -c1-80 "$LOG/ucx-err")"
    fi
}
ucx_bw() {
    local tls=$1 label=$2 test=$3 size=$4 iters=$5 limit=$6 line v
    if ! command -v ucx_perftest >/dev/null; then
        row "$BW" "$label $(human "$size")" "UCX $tls ($test)" "-" MB/s "-" "not installed (Debian: ucx-utils; run with --install)"
        return
    fi
    say "ucx_perftest -t $test, $size B ($tls)"
    if line=$(ucx_run "$tls" "$test" "$size" "$iters" 100 2>"$LOG/ucx-err"); then
        v=$(awk '{ print $6 }' <<<"$line")
        row "$BW" "$label $(human "$size")" "UCX $tls ($test)" "$(fmt "$v" 0)" MB/s "$(ratio "$v" "$limit")" "overall"
    else
        row "$BW" "$label $(human "$size")" "UCX $tls ($test)" failed MB/s "-" "$(cut -c1-80 "$LOG/ucx-err")"
    fi
}

# ----------------------------------------------------------------------------------------
# Latency rows
for size in 64 4096; do
    lim_med=${V[udp_${size}_busy_med]:-failed}
    lim_avg=${V[udp_${size}_busy_avg]:-failed}
    blk=${V[udp_${size}_block_med]:-failed}
    row "$LAT" "$(human "$size")" "**UDP ping-pong, busy-poll (limit)**" "$(fmt "$lim_med")" µs "1.00x" "median; average $(fmt "$lim_avg")"
    row "$LAT" "$(human "$size")" "UDP ping-pong, blocking" "$(fmt "$blk")" µs "$(ratio "$blk" "$lim_med")" "median"
    for wire in udp local; do
        ours_lat "$wire" send_lat "$size" "$lim_med"
        ours_lat "$wire" write_lat "$size" "$lim_med"
        ours_lat "$wire" read_lat "$size" "$lim_med"
    done
    fi_lat tcp "$size" "$lim_avg"
    fi_lat shm "$size" "$lim_avg"
    for tls in tcp shm; do
        ucx_lat "$tls" send "tag_lat" "$size" "$lim_med"
        ucx_lat "$tls" write "ucp_put_lat" "$size" "$lim_med"
    done
done
row "$LAT" "read" "UCX" "-" µs "-" "ucx_perftest has no get latency test (ucp_get is a bandwidth test)"

# Bandwidth rows
for size in 65536 1048576; do
    lim=${V[tcp_${size}]:-failed}
    if [ "$size" = 65536 ]; then iters=$BW_ITERS_64K; else iters=$BW_ITERS_1M; fi
    row "$BW" "$(human "$size")" "**TCP stream (limit)**" "$(fmt "$lim" 0)" MB/s "1.00x" "one stream, $(human "$size") writes, ${BW_SECS} s"
    for wire in udp local; do
        ours_bw "$wire" send_bw "$size" "$iters" "$lim"
        ours_bw "$wire" write_bw "$size" "$iters" "$lim"
        ours_bw "$wire" read_bw "$size" "$iters" "$lim"
    done
    for tls in tcp shm; do
        ucx_bw "$tls" send tag_bw "$size" "$iters" "$lim"
        ucx_bw "$tls" write ucp_put_bw "$size" "$iters" "$lim"
        ucx_bw "$tls" read ucp_get "$size" "$iters" "$lim"
    done
done
row "$BW" "any" "libfabric tcp, shm" "-" MB/s "-" "$(fi_bw_note)"

# Connection setup rows
row "$CM" "$CONNS connections" "TCP connect/accept/close, sequential" "$(fmt "$CONN_SEQ" 0)" conn/s "$(ratio "$CONN_SEQ" "$CONN_CONC")" "$(fmt "$CONN_SEQ_US") µs per connection"
row "$CM" "$CONNS connections" "**TCP connect/accept/close, $CONC at a time (limit)**" "$(fmt "$CONN_CONC" 0)" conn/s "1.00x" "$(fmt "$CONN_CONC_US") µs per connection (cmtime also has many connections in flight)"
if [ -z "$CMTIME" ]; then
    row "$CM" "$CONNS connections" "cmtime (ours)" "-" conn/s "-" "$CMTIME_NOTE"
else
    say "cmtime, $CONNS connections"
    next_port
    timeout "$TOOL_TIMEOUT" "$CMTIME" -b "$SERVER_IP" -c "$CONNS" -p "$PORT" >"$LOG/cm-srv" 2>&1 &
    spid=$!
    wait_listen "$PORT" "$spid" || sleep 0.3
    out=$(timeout "$TOOL_TIMEOUT" "$CMTIME" -s "$SERVER_IP" -b "$CLIENT_IP" -c "$CONNS" -p "$PORT" 2>&1)
    stop_bg "$spid"
    # rdma-core's cmtime table: "step  total ms  max ms  min us  us / conn", one line per step
    # (create id, [bind addr,] resolve addr, resolve route, create qp, connect, disconnect,
    # destroy); each total is the wall time of that step for all connections in flight. The
    # rate is over all steps, as a TCP cycle is connect to close.
    total=$(awk -F':' 'NF == 2 { split($2, f, " "); if (f[1] ~ /^[0-9.]+$/) t += f[1]; n++ } END { if (n) print t }' <<<"$out")
    conn_ms=$(awk -F':' '$1 ~ /^connect/ { split($2, f, " "); print f[1]; exit }' <<<"$out")
    if [ -n "$total" ] && [ -n "$conn_ms" ]; then
        v=$(awk -v n="$CONNS" -v ms="$total" 'BEGIN { if (ms > 0) printf "%.0f", n * 1000 / ms; else print "failed" }')
        c=$(awk -v n="$CONNS" -v ms="$conn_ms" 'BEGIN { if (ms > 0) printf "%.0f", n * 1000 / ms; else print "-" }')
        row "$CM" "$CONNS connections" "cmtime (ours)" "$v" conn/s "$(ratio "$v" "$CONN_CONC")" "all steps, create id to destroy: $(fmt "$total") ms; the connect step alone: $c conn/s"
    else
        row "$CM" "$CONNS connections" "cmtime (ours)" failed conn/s "-" "$(tail -n1 <<<"$out" | cut -c1-80)"
    fi
fi
row "$CM" "-" "libfabric tcp, UCX tcp" "-" conn/s "-" "no packaged tool measures their connection setup"

# ----------------------------------------------------------------------------------------
# C ABI rows (issue 32): Debian's perftest over our libibverbs.so.1 (crates/cabi, built by
# scripts/build-cabi.sh) against rdma-perf's same test, run next to it on the same wire. Our
# CM picks the host-local wire; perftest connects through rdma_cm (-R) on both wires, as
# rdma-perf does (Debian's perftest 4.5 races its own second listen, docs/CABI.md: a failed
# pair runs once more). Over TCP (-x 0) its server would block in read() and our engine
# thread would wake for every READ it serves; through rdma_cm it busy-polls, as rdma-perf's.
# The reference's latency tests signal every send (-Q 1) as perftest 4.5's do: perftest
# caps its cq_mod at the send queue depth, 1 in latency tests (perftest_parameters.c), and a
# signaled send asks for an ACK (a second datagram per message). The ratio is perftest's
# figure over rdma-perf's (goal: within 10 %: latency at most 1.10x, bandwidth at least
# 0.90x). docs/BENCHMARKS.md, "C ABI vs rdma-perf", has the counts behind these choices.
# The write_bw rows need no option: at 64 KiB both post 128 deep and signal every WRITE
# (perftest turns CQ moderation off above 8 KiB, MSG_SIZE_CQ_MOD_LIMIT; its banner says
# "CQ Moderation : 1"), and the packets, ACKs and system calls per message match
# (BENCHMARKS.md, "ib_write_bw over RoCEv2/UDP, counted").
CABI="C ABI: Debian's perftest over our libraries against rdma-perf, same wire (ratio to rdma-perf)"
say "bash scripts/build-cabi.sh"
CABI_DIR=""
if bash "$ROOT/scripts/build-cabi.sh" >"$LOG/build-cabi" 2>&1; then
    CABI_DIR=$BIN/cabi
else
    say "the C ABI libraries do not build: $(grep -m1 '^error' "$LOG/build-cabi")"
fi
# cabi_perf WIRE TEST SIZE ITERS -> the client's output (Debian's perftest over our libraries).
# Two tries, five when the client was rejected: perftest -R's client may dial its test
# connection before its server listens again (REJ 8, docs/CABI.md "Not yet"): up to 6 runs
# in 8 of perftest against perftest on 127.0.0.1 over UDP on a loaded machine (2026-12-04).
cabi_perf() {
    local wire=$1 test=$2 size=$3 iters=$4 spid out rc lw=1 try args
    for try in 1 2 3 4 5; do
        next_port
        args=(-d lo -F -s "$size" -n "$iters" -p "$PORT")
        args+=(-R)
        [ "$wire" = udp ] && lw=0
        LD_LIBRARY_PATH=$CABI_DIR RDMA_SOFT_LOCAL_WIRE=$lw "${PIN_SRV[@]}" timeout "$TOOL_TIMEOUT" \
            "$test" "${args[@]}" >"$LOG/cabi-srv" 2>&1 &
        spid=$!
        wait_listen "$PORT" "$spid" || sleep 0.3
        out=$(LD_LIBRARY_PATH=$CABI_DIR RDMA_SOFT_LOCAL_WIRE=$lw "${PIN_CLI[@]}" timeout "$TOOL_TIMEOUT" \
            "$test" "${args[@]}" 127.0.0.1 2>&1)
        rc=$?
        # perftest prints inf when its own CPU-frequency calibration fails (get_cpu_mhz 0 after
        # "Correlation coefficient r^2 < 0.9", about 1 run in 40 on a VM): not a figure.
        if [ "$rc" = 0 ] && awk '$1 ~ /^[0-9]+$/ && /inf|nan/ { f = 1 } END { exit !f }' <<<"$out"; then
            rc=1 out+=$'\n'"perftest's CPU-frequency calibration failed (inf)"
        fi
        stop_bg "$spid"
        [ "$rc" = 0 ] && break
        if [ "$try" -ge 5 ] || { [ "$try" -ge 2 ] && ! grep -q REJECTED <<<"$out"; }; then break; fi
        say "$test ($wire) failed, once more: $(grep -m1 REJECTED <<<"$out" || tail -n1 <<<"$out")"
    done
    printf '%s\n' "$out"
    return $rc
}
# cabi_row WIRE TEST SIZE ITERS COLUMN UNIT: rdma-perf's TEST, then perftest's ib_TEST.
cabi_row() {
    local wire=$1 test=$2 size=$3 iters=$4 col=$5 unit=$6 out ref v d=2 what
    [ "$unit" = MB/s ] && d=0
    what="ib_$test $(human "$size"), $([ "$wire" = udp ] && echo "RoCEv2/UDP" || echo "host-local")"
    if [ -z "$RDMA_PERF" ] || [ -z "$CABI_DIR" ] || ! command -v "ib_$test" >/dev/null; then
        row "$CABI" "$what" "perftest over our libraries" "-" "$unit" "-" "needs rdma-perf, the C ABI libraries and Debian's perftest"
        return
    fi
    say "rdma-perf $test and ib_$test $size B ($wire)"
    ref=""
    local sig=()
    [ "$unit" = µs ] && sig=(-Q 1)
    if out=$(ours_perf "$wire" "$test" "$size" "$iters" "${sig[@]}"); then ref=$(perftest_field "$out" "$col"); fi
    row "$CABI" "$what" "$(wire_label "$wire")" "$(fmt "${ref:-failed}" "$d")" "$unit" "1.00x" "the reference"
    if out=$(cabi_perf "$wire" "ib_$test" "$size" "$iters") && v=$(perftest_field "$out" "$col") && [ -n "$v" ]; then
        row "$CABI" "$what" "Debian's ib_$test over crates/cabi" "$(fmt "$v" "$d")" "$unit" "$(ratio "$v" "$ref")" "same figure as the reference's (median or BW average)"
    else
        row "$CABI" "$what" "Debian's ib_$test over crates/cabi" failed "$unit" "-" "$(tail -n1 <<<"$out" | cut -c1-80)"
    fi
}
for wire in local udp; do
    cabi_row "$wire" send_lat 64 "$LAT_ITERS" 5 µs
    cabi_row "$wire" read_lat 64 "$LAT_ITERS" 5 µs
    cabi_row "$wire" write_bw 65536 "$BW_ITERS_64K" 4 MB/s
done

}

# aggregate FILE... -> ROWS: per row (section|measure|tool, in first-seen order), the median
# figure of the runs, the median ratio, and the spread in the notes. The worst run is the
# highest figure in the latency section and the lowest elsewhere.
aggregate() {
    local line
    while IFS= read -r line; do
        ROWS+=("$line")
    done < <(awk -F'|' -v lat="$LAT" -v n="$#" '
        function med(a, k,   i, j, t) {
            for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        {
            key = $1 "|" $2 "|" $3
            if (!(key in seen)) { seen[key] = 1; order[++keys] = key; unit[key] = $5; note[key] = $7; first[key] = $4 }
            if ($4 ~ /^[0-9.]+$/) { nf[key]++; fig[key, nf[key]] = $4 + 0 } else fails[key]++
            r = $6; sub(/x$/, "", r)
            if (r ~ /^[0-9.]+$/) { nr[key]++; rat[key, nr[key]] = r + 0 }
        }
        END {
            for (o = 1; o <= keys; o++) {
                key = order[o]; split(key, kk, "|")
                k = nf[key] + 0
                if (k == 0) { print key "|" first[key] "|" unit[key] "|-|" note[key] " (" n " runs, none measured)"; continue }
                delete a; lo = ""; hi = ""
                for (i = 1; i <= k; i++) { v = fig[key, i]; a[i] = v; if (lo == "" || v < lo) lo = v; if (hi == "" || v > hi) hi = v }
                m = med(a, k)
                d = (unit[key] == "µs") ? 2 : 0
                worst = (kk[1] == lat) ? (hi > 0 ? m / hi : 0) : (m > 0 ? lo / m : 0)
                delete b; q = "-"
                if (nr[key] > 0) { for (i = 1; i <= nr[key]; i++) b[i] = rat[key, i]; q = sprintf("%.2fx", med(b, nr[key])) }
                sp = sprintf("median of %d runs: min %.*f, max %.*f, worst %.2f of median", k, d, lo, d, hi, worst)
                if (fails[key]) sp = sp sprintf(", %d failed", fails[key])
                printf "%s|%.*f|%s|%s|%s; %s\n", key, d, m, unit[key], q, sp, note[key]
            }
        }' "$@")
}

if [ "$RUNS" -gt 1 ]; then
    PASS=()
    [ "$QUICK" = 1 ] && PASS+=(--quick)
    [ "$PIN" = 0 ] && PASS+=(--no-pin)
    FILES=()
    for i in $(seq 1 "$RUNS"); do
        say "run $i of $RUNS (load $(cut -d' ' -f1 /proc/loadavg))"
        if bash "$0" "${PASS[@]}" --no-write --rows-out "$LOG/rows.$i" >"$LOG/run.$i" 2>"$LOG/run-err.$i"; then
            FILES+=("$LOG/rows.$i")
        else
            say "run $i failed: $(tail -n1 "$LOG/run-err.$i")"
        fi
    done
    [ ${#FILES[@]} -gt 0 ] || { say "no run finished"; exit 1; }
    aggregate "${FILES[@]}"
else
    measure
    [ -n "$ROWS_OUT" ] && printf '%s\n' "${ROWS[@]}" >"$ROWS_OUT"
fi

END_S=$(date +%s)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
ELAPSED=$((END_S - START_S))

# ----------------------------------------------------------------------------------------
# Output: the table on stdout, Markdown in $OUT
table_md() {
    local sec="" r s m t f u q n
    for r in "${ROWS[@]}"; do
        IFS='|' read -r s m t f u q n <<<"$r"
        if [ "$s" != "$sec" ]; then
            [ -n "$sec" ] && echo
            echo "### $s"
            echo
            echo "| measure | tool | figure | unit | ratio to limit | notes |"
            echo "| --- | --- | ---: | --- | ---: | --- |"
            sec=$s
        fi
        echo "| $m | $t | $f | $u | $q | $n |"
    done
}

table_text() {
    local sec="" r s m t f u q n
    for r in "${ROWS[@]}"; do
        IFS='|' read -r s m t f u q n <<<"$r"
        if [ "$s" != "$sec" ]; then
            printf '\n%s\n' "$s"
            sec=$s
        fi
        printf '  %-16s %-48s %10s %-6s %7s  %s\n' "$m" "${t//\*/}" "$f" "$u" "$q" "$n"
    done
}

table_text
echo
echo "run took ${ELAPSED}s$([ "$RUNS" -gt 1 ] && echo " for $RUNS runs") (plus ${WAITED}s waiting for a quiet machine); load average ${LOAD_START} at start, ${LOAD_END} at end"

# Keep the analysis a person wrote in an earlier BENCHMARKS.md.
ANALYSIS=""
if [ -f "$OUT" ] && grep -q '^## Analysis' "$OUT"; then
    ANALYSIS=$(sed -n '/^## Analysis/,$p' "$OUT")
fi
if [ "$WRITE" = 1 ]; then
    mkdir -p "$(dirname "$OUT")"
    {
        echo "# Benchmarks"
        echo
        echo "Written by \`bench/compare.sh\` (do not edit the tables by hand: rerun it). All figures"
        echo "come from one run on the machine below, over loopback; client and server share its CPUs."
        echo
        echo "## Machine"
        echo
        echo "| | |"
        echo "| --- | --- |"
        echo "| CPU | ${cpu_model:-?} |"
        echo "| CPUs | $cpus |"
        echo "| memory | $mem |"
        echo "| kernel | Linux $kernel |"
        echo "| OS | $os |"
        echo "| date | $when |"
        echo "| commit | $commit ($rustc_v)$(case "$commit" in *-dirty) echo "; built from a work tree with uncommitted changes (other engineers' work in progress)" ;; esac) |"
        echo "| run | ${ELAPSED} s$([ "$RUNS" -gt 1 ] && echo " for $RUNS whole runs, each row the median (spread in its notes)")$([ "$QUICK" = 1 ] && echo ", --quick")$([ "$WAITED" -gt 0 ] && echo " (after ${WAITED} s waiting for a quiet machine)") |"
        echo "| load average (1/5/15 min) | ${LOAD_START} at start, ${LOAD_END} at end |"
        if [ ${#PIN_SRV[@]} -gt 0 ]; then
            echo "| RDMA pairs | pinned: server on CPU 0, client on CPU 1 (\`taskset\`; \`--no-pin\` to turn off) |"
        else
            echo "| RDMA pairs | not pinned |"
        fi
        echo "| libfabric-bin | $(pkg_version libfabric-bin) |"
        echo "| ucx-utils | $(pkg_version ucx-utils) |"
        echo "| fabtests | $(pkg_version fabtests) |"
        echo
        echo "This machine is shared: other engineers' builds may have been running during the run"
        echo "(see the load average above; with 2 CPUs, a load above ~1 means the client, the server"
        echo "and someone else's compiler competed for them). Figures from a loaded run are pessimistic"
        echo "and noisier, the busy-poll ones most of all."
        echo
        echo "## How it is measured"
        echo
        echo "- **Limits** are measured by \`crates/bench\` (package \`rdma-bench\`): \`udp-pingpong\`"
        echo "  (one-way = half the round trip, as \`ib_send_lat\` reports; busy-poll is the limit because"
        echo "  rdma-perf, fi_pingpong and ucx_perftest all poll), \`tcp-stream\` (one stream, the size is"
        echo "  the write size), \`tcp-connect\` (connect, accept, one byte from the server, close)."
        echo "- **Ratio to limit**: figure divided by the limit of its size. Latency: lower is better"
        echo "  (goals for 64 B send: RoCEv2/UDP at most 1.5x; host-local at most 0.6 µs). Bandwidth and"
        echo "  connections/s: higher is better (goals for 64 KiB and 1 MiB WRITE: RoCEv2/UDP at least"
        echo "  0.7x and UCX tcp's tag_bw; host-local at least 2x; connection setup at least 0.5x)."
        echo "- **Ours**: \`rdma-perf\` (perftest's subcommands and output) and \`cmtime\`, server on"
        echo "  $SERVER_IP, client on $CLIENT_IP, two processes. *host-local*: the default for peers on"
        echo "  one host, the QPs' packets through shared-memory rings (\`docs/SHARING.md\`);"
        echo "  *RoCEv2/UDP*: the same with \`RDMA_SOFT_LOCAL_WIRE=0\`, RoCEv2 over UDP on lo, as"
        echo "  between hosts. Each client starts once its server listens (its claim file is there)."
        echo "- **libfabric**: \`fi_pingpong -p tcp -e msg\` (MSG endpoints, like RC) and"
        echo "  \`fi_pingpong -p shm -e rdm\` (shared memory), $LAT_ITERS iterations."
        echo "- **UCX**: \`ucx_perftest\` with \`UCX_TLS=tcp UCX_NET_DEVICES=lo\` (without the"
        echo "  device restriction UCX also stripes over eth0's address, which is local too) and with"
        echo "  \`UCX_TLS=posix,sysv,cma,self\` (shared memory); latency tests report the median,"
        echo "  bandwidth tests the overall figure."
        echo "- **C ABI**: Debian's perftest (\`ib_send_lat\`, \`ib_read_lat\`, \`ib_write_bw\`) over"
        echo "  our \`libibverbs.so.1\` (\`scripts/build-cabi.sh\`), QP data over its TCP exchange,"
        echo "  next to \`rdma-perf\`'s same test on the same wire; its ratio is to \`rdma-perf\`."
        echo "- Latency runs: $LAT_ITERS iterations; bandwidth: $BW_ITERS_64K x 64 KiB, $BW_ITERS_1M x 1 MiB"
        echo "  (TCP: ${BW_SECS} s); connections: $CONNS."
        if [ ${#PKG_NOTES[@]} -gt 0 ]; then
            notes=$(IFS=';'; echo "${PKG_NOTES[*]}")
            echo "- Packages: ${notes//;/; }."
        fi
        echo
        echo "## Results"
        echo
        table_md
        echo
        if [ -n "$ANALYSIS" ]; then
            printf '%s\n' "$ANALYSIS"
        else
            echo "## Analysis"
            echo
            echo "_To be written by a person after reading the table: where we stand against each goal,"
            echo "what dominates our figures (profiles), and what the next run should change._"
        fi
    } >"$OUT.tmp" && mv "$OUT.tmp" "$OUT"
    say "wrote $OUT"
fi
