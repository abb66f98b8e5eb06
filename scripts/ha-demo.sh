#!/usr/bin/env bash
# Seed 002 on one machine (root): two namespace hosts joined by two veth pairs, a verifying
# rping between them under RDMACM_HA, the client's first link taken down and brought back.
#
#   sudo bash scripts/ha-demo.sh            # RDMACM_HA=migrate with device groups
#   sudo bash scripts/ha-demo.sh rails      # the same on two rails with no cross routes
#   sudo bash scripts/ha-demo.sh align      # the RFC's mode: the connection ends, saying why
#
# migrate and align give H a second route to B's 192.0.2.2 through h1 (via B's h1 address);
# rails adds none (each link its own subnet, the common multi-rail layout) and B's server
# listens on the wildcard: the two CMs complete the alternate path in the exchange
# (docs/HA.md, "Two rails without cross routes").
#
# Environment: PINGS (iterations, default 20000). Only addresses inside the two namespaces
# it creates are used; both are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-migrate}
case $mode in migrate | rails | align) ;; *) echo "usage: $0 [migrate|rails|align]" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "$0: needs root (network namespaces)" >&2; exit 1; }
pings=${PINGS:-20000}
H=rdmacm-demo-h-$$ B=rdmacm-demo-b-$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    ip netns del "$H" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT

echo "== building rping (release)"
cargo build -q --release -p rdma-tools --bin rping
rping=$PWD/target/release/rping

echo "== two hosts, two links: $H (h0 192.0.2.1, h1 198.51.100.1) — $B (b0 192.0.2.2, b1 198.51.100.2)"
ip netns add "$H"
ip netns add "$B"
ip link add h0 netns "$H" type veth peer name b0 netns "$B"
ip link add h1 netns "$H" type veth peer name b1 netns "$B"
hip() { ip -n "$H" "$@"; }
bip() { ip -n "$B" "$@"; }
hip addr add 192.0.2.1/24 dev h0
hip addr add 198.51.100.1/24 dev h1
bip addr add 192.0.2.2/24 dev b0
bip addr add 198.51.100.2/24 dev b1
for d in lo h0 h1; do hip link set "$d" up; done
for d in lo b0 b1; do bip link set "$d" up; done
if [ "$mode" != rails ]; then
    # B's address over h0 first, over h1 (through B's address there) as the fallback
    hip route add 192.0.2.2/32 dev h0 metric 10
    hip route add 192.0.2.2/32 via 198.51.100.2 dev h1 metric 100
fi
for ns in "$H" "$B"; do
    for d in all default; do ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$d.rp_filter=0"; done
done
sleep 1 # carrier

srv_addr=(-a 192.0.2.2)
[ "$mode" = rails ] && srv_addr=() # the wildcard
if [ "$mode" != align ]; then
    henv=(RDMACM_HA=migrate RDMACM_DEVICES=ha=h0+h1)
    benv=(RDMACM_HA=migrate RDMACM_DEVICES=hb=b0+b1)
else
    henv=(RDMACM_HA=align)
    benv=(RDMACM_HA=notify)
fi
echo "== server on $B: ${benv[*]} rping -s ${srv_addr[*]} -C $pings -S 200 -V"
ip netns exec "$B" env "${benv[@]}" "$rping" -s "${srv_addr[@]}" -C "$pings" -S 200 -V &
pids+=($!)
srv=$!
sleep 0.5
echo "== client on $H: ${henv[*]} rping -c -a 192.0.2.2 -C $pings -S 200 -V"
ip netns exec "$H" env "${henv[@]}" "$rping" -c -a 192.0.2.2 -C "$pings" -S 200 -V 2>&1 &
pids+=($!)
cli=$!
sleep 1
echo "== $(date +%T.%3N) ip link set h0 down (on $H)"
hip link set h0 down
sleep 2
echo "== $(date +%T.%3N) ip link set h0 up, its route back"
hip link set h0 up
[ "$mode" = rails ] || hip route replace 192.0.2.2/32 dev h0 metric 10
set +e
wait "$cli"
crc=$?
wait "$srv"
src=$?
set -e
echo "== client exit $crc, server exit $src"
if [ "$mode" != align ]; then
    echo "   ($mode: both 0, every iteration verified; the client's ADDR_CHANGE lines are"
    echo "    the CM's reports of the moves to h1 and back, which rping ignores as rdma-core's does)"
else
    echo "   (align: the client ends non-zero saying why; reconnecting is the application's part)"
fi
