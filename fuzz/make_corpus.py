#!/usr/bin/env python3
"""Regenerates the seed corpora of the stateful fuzz targets from ../shared/captures.

    python3 fuzz/make_corpus.py [CAPTURES_DIR]

Writes fuzz/seeds/rc_qp/<capture>-<side> and fuzz/seeds/cm_agent/<capture>-<side> (the
input formats are described at the top of fuzz_targets/rc_qp.rs and cm_agent.rs). Python 3
standard library only; the output is deterministic.

rc_qp: for the RC connection of each capture with the most kinds of RC packets (paired with its
REQ and REP), one seed per side: the fuzzed QP takes that side's QPN, its peer's QPN and the first
request PSNs of each direction; the packets to that side are delivered in capture order (with
the time between them), each message the peer starts that consumes a receive is preceded by a
posted receive, RETH/AtomicETH addresses aimed at the fuzzed side are moved into its region A
(its rkey, the offsets from the lowest address the capture used with that rkey), and each
message the fuzzed side itself sent becomes a posted send WR of the same kind and length, so
that the peer's ACKs, NAKs and READ/atomic responses meet the requests they answer.

cm_agent: one seed per capture and side: the MADs the other side sent, in order. As the
passive side (the server, vm2), each REQ/SIDR_REQ to a service the target listens on is
delivered as it is (it makes a new connection, the target's index 10, 11, ...), the later MADs
of that exchange get that connection's ids, and what the server answered in the capture
becomes the application's action (REP, REJ, MRA, DREP ...). As the active side (vm1), the
answers to the capture's first REQ get the ids of the target's connection in REQ_SENT (index
4), and vm1's own RTU/DREQ/DREP/MRA become the application's actions.
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_RC_SEED = 6000
MAX_CM_RECORDS = 16

# --- pcap -----------------------------------------------------------------------------


def read_pcap(path):
    """(time, src ip, dst ip, udp payload) of every UDP/4791 datagram of an Ethernet pcap."""
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nano = magic in (0xA1B23C4D, 0x4D3CB2A1)
    off = 24
    out = []
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(end + "IIII", data[off : off + 16])
        frame = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        t = sec + frac / (1e9 if nano else 1e6)
        etype = struct.unpack(">H", frame[12:14])[0]
        p = frame[14:]
        if etype == 0x0800:
            ihl = (p[0] & 15) * 4
            if p[9] != 17:
                continue
            src, dst, l4 = p[12:16], p[16:20], p[ihl:]
        elif etype == 0x86DD:
            if p[6] != 17:
                continue
            src, dst, l4 = p[8:24], p[24:40], p[40:]
        else:
            continue
        if len(l4) < 8 or struct.unpack(">H", l4[2:4])[0] != 4791:
            continue
        ulen = struct.unpack(">H", l4[4:6])[0]
        out.append((t, bytes(src), bytes(dst), bytes(l4[8:ulen])))
    return out


def u24(b):
    return (b[0] << 16) | (b[1] << 8) | b[2]


# --- RC -------------------------------------------------------------------------------

# extended header bytes after the BTH, by RC opcode
EXT = {0x00: 0, 0x01: 0, 0x02: 0, 0x03: 4, 0x04: 0, 0x05: 4, 0x06: 16, 0x07: 0,
       0x08: 0, 0x09: 4, 0x0A: 16, 0x0B: 20, 0x0C: 16, 0x0D: 4, 0x0E: 0, 0x0F: 4,
       0x10: 4, 0x11: 4, 0x12: 12, 0x13: 28, 0x14: 28, 0x16: 4, 0x17: 4}
REQUESTS = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
            0x13, 0x14, 0x16, 0x17}
SEND_START = {0x00, 0x04, 0x05, 0x17}
WRITE_START = {0x06, 0x0A, 0x0B}
LAST_OR_ONLY = {0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0A, 0x0B, 0x16, 0x17}
A_ADDR = 0x1000_0000 + (64 << 10)  # region A of rc_qp.rs
A_KEY = 0x19D
A_WINDOW = 32 << 10


def payload_len(p):
    return len(p) - 12 - EXT[p[0]] - ((p[1] >> 4) & 3) - 4


def message_kind(pkts, i):
    """Kind (rc_qp.rs numbering), length and ends-with-immediate of the message starting at
    pkts[i] (same destination QP, in order)."""
    p = pkts[i][3]
    op, qp = p[0], u24(p[5:8])
    if op == 0x0C:
        return 5, struct.unpack(">I", p[24:28])[0]
    if op in (0x13, 0x14):
        return (6 if op == 0x13 else 7), 8
    total = 0
    for t, s, d, q in pkts[i:]:
        if u24(q[5:8]) != qp or q[0] not in REQUESTS:
            continue
        total += payload_len(q)
        if q[0] in LAST_OR_ONLY:
            last = q[0]
            break
    else:
        last = op
    if op in SEND_START:
        return {0x03: 1, 0x05: 1, 0x16: 2, 0x17: 2}.get(last, 0), total
    return (4 if last in (0x09, 0x0B) else 3), total


def rc_seed(pkts, me, peer, mtu_code):
    """Seed for the QP `me` = (ip, qpn) against `peer`."""
    mine = [x for x in pkts if x[2] == me[0] and u24(x[3][5:8]) == me[1]]
    theirs = [x for x in pkts if x[2] == peer[0] and u24(x[3][5:8]) == peer[1]]
    if not mine:
        return None
    first_req = lambda xs: next((u24(x[3][9:12]) for x in xs if x[3][0] in REQUESTS), 0)
    rq_psn, sq_psn = first_req(mine), first_req(theirs)
    # lowest address per rkey the peer used toward us, to keep offsets
    base = {}
    for _, _, _, p in mine:
        if p[0] in (0x06, 0x0A, 0x0B, 0x0C, 0x13, 0x14):
            va, rkey = struct.unpack(">QI", p[12:24])
            base[rkey] = min(base.get(rkey, va), va)
    out = bytearray()
    out += me[1].to_bytes(3, "big") + peer[1].to_bytes(3, "big")
    out += rq_psn.to_bytes(3, "big") + sq_psn.to_bytes(3, "big")
    out += bytes([((mtu_code - 1) % 5) | 8, 14, 7 | (7 << 3), 16])
    both = sorted([(x, True) for x in mine] + [(x, False) for x in theirs], key=lambda y: y[0][0])
    mine_order = [x for x, m in both if m]
    theirs_order = [x for x, m in both if not m]
    last_t = None
    recvs = 0
    for x, to_me in both:
        t, _, _, p = x
        cmd = bytearray()
        if last_t is not None and t - last_t > 0.001:
            cmd += b"\x03" + struct.pack(">I", min(int((t - last_t) * 1e6), 10_000_000))
        last_t = t
        op = p[0]
        if to_me:
            i = mine_order.index(x)
            starts = op in SEND_START or op in WRITE_START
            if starts and (op in SEND_START or message_kind(mine_order, i)[0] == 4):
                cmd += b"\x02" + struct.pack(">HHB", 16384, (recvs * 4096) % A_WINDOW, 0)
                recvs += 1
            q = bytearray(p)
            if op in (0x06, 0x0A, 0x0B, 0x0C, 0x13, 0x14):
                va, rkey = struct.unpack(">QI", p[12:24])
                va = A_ADDR + (va - base[rkey]) % A_WINDOW
                q[12:24] = struct.pack(">QI", va, A_KEY)
            cmd += b"\x00" + struct.pack(">H", len(q)) + q
        else:
            if op not in SEND_START | WRITE_START | {0x0C, 0x13, 0x14}:
                continue
            i = theirs_order.index(x)
            kind, length = message_kind(theirs_order, i)
            va, rkey = (0, 0)
            if EXT[op] >= 16 and op not in SEND_START:
                va, rkey = struct.unpack(">QI", p[12:24])
            imm = 0
            if op in (0x05, 0x0B):
                imm = struct.unpack(">I", p[12 + EXT[op] - 4 : 12 + EXT[op]])[0]
            off = (i * 4096) % A_WINDOW
            cmd += b"\x01" + struct.pack(">BBHHQII", kind, 1, min(length, 0xFFFF), off, va,
                                         rkey, imm)
        if len(out) + len(cmd) > MAX_RC_SEED:
            break
        out += cmd
    out += b"\x04"
    return bytes(out)


# --- CM -------------------------------------------------------------------------------

TCP, UDP = 0x0000_0000_0106_0000, 0x0000_0000_0111_0000
LISTEN = {TCP | 7000, TCP | 7005, TCP | 7174, TCP | 7471, TCP | 18515, UDP | 7174, UDP | 18515}
REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP = (
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18)
PASSIVE_ACT = {REP: 1, REJ: 4, MRA: 5, DREQ: 3, DREP: 3, SIDR_REP: 7}
ACTIVE_ACT = {RTU: 2, DREQ: 3, DREP: 3, MRA: 5}
SETUP_CONNS = 10
REQ_SENT = 4


def mads(pkts):
    """(time, src ip, attr, mad) of every CM MAD (QP1, UD SEND only)."""
    out = []
    for t, s, d, p in pkts:
        if p[0] == 0x64 and u24(p[5:8]) == 1 and len(p) >= 12 + 8 + 256:
            m = p[20:276]
            if m[1] == 7:  # CM class
                out.append((t, s, struct.unpack(">H", m[16:18])[0], m))
    return out


def ids(m, attr):
    """(sender's comm id, receiver's comm id or None)."""
    local = struct.unpack(">I", m[24:28])[0]
    if attr in (REQ, SIDR_REQ, SIDR_REP):
        return local, None
    return local, struct.unpack(">I", m[28:32])[0]


def cm_seed(ms, server_ip, passive):
    """Records for the agent playing the server (passive) or the client."""
    recs = []  # [ctl, act, mad]
    conn_of = {}  # peer's comm id -> target conn index
    next_idx = SETUP_CONNS
    last_t = None
    for t, src, attr, m in ms:
        from_server = src == server_ip
        if passive == from_server:
            # our own side's message: the application's action on the last record
            acts = PASSIVE_ACT if passive else ACTIVE_ACT
            if not passive and attr == REQ and not conn_of:
                conn_of[ids(m, attr)[0]] = REQ_SENT
            if attr not in acts or not recs:
                continue
            if passive:
                # answers name the peer's id in their remote comm id field
                _, remote = ids(m, attr)
                key = remote if attr != SIDR_REP else struct.unpack(">I", m[24:28])[0]
                idx = conn_of.get(key)
            else:
                idx = REQ_SENT if conn_of else None
            if idx is None or idx > 15:
                continue
            act = (idx << 4) | acts[attr]
            if recs[-1][1] != 0:
                recs.append([0x10, 0, bytes(256)])  # a MAD that parses as nothing
            recs[-1][1] = act
            continue
        gap = 0 if last_t is None else t - last_t
        last_t = t
        ctl = 0x80 if gap > 1 else (0x40 if gap > 0.0005 else 0)
        local, remote = ids(m, attr)
        if attr in (REQ, SIDR_REQ):
            sid = struct.unpack(">Q", m[32:40])[0]
            if passive and local not in conn_of and sid in LISTEN:
                conn_of[local] = next_idx
                next_idx += 1
            ctl |= 0x10  # delivered as it is
        else:
            idx = REQ_SENT if not passive and conn_of else conn_of.get(local)
            ctl |= idx if idx is not None and idx <= 15 else 0x10
        recs.append([ctl, 0, m])
        if len(recs) >= MAX_CM_RECORDS:
            break
    if not recs:
        return None
    return b"\x00" + b"".join(bytes([c, a]) + bytes(m) for c, a, m in recs)


def main():
    caps = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared",
                                                              "captures")
    rc_dir = os.path.join(HERE, "seeds", "rc_qp")
    cm_dir = os.path.join(HERE, "seeds", "cm_agent")
    for d in (rc_dir, cm_dir):
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
    n = 0
    for name in sorted(os.listdir(caps)):
        if not name.endswith(".pcap"):
            continue
        case = name[:-5]
        pkts = read_pcap(os.path.join(caps, name))
        ms = mads(pkts)
        # connections: REQ (client ip, its QPN, comm id) paired with the REP answering it
        reqs = {}
        conns = []
        for t, s, attr, m in ms:
            if attr == REQ:
                reqs.setdefault(struct.unpack(">I", m[24:28])[0], (s, u24(m[56:59]), m[74] >> 4))
            elif attr == REP:
                lid, rid = ids(m, attr)
                if rid in reqs and (s, u24(m[36:39])) not in [c[1] for c in conns]:
                    cs, cq, mtu = reqs[rid]
                    conns.append(((cs, cq), (s, u24(m[36:39])), mtu))
        rc = [x for x in pkts if x[3][0] in EXT]
        of = lambda c: [x for x in rc if (x[2], u24(x[3][5:8])) in (c[0], c[1])]
        # the most varied connection (perftest's data one rather than its handshake)
        variety = lambda c: (len({x[3][0] for x in of(c)}), len(of(c)))
        conns = [c for c in conns if of(c)]
        if conns:
            client, server, mtu = max(conns, key=variety)
            for side, me, peer in (("server", server, client), ("client", client, server)):
                seed = rc_seed(rc, me, peer, mtu)
                if seed:
                    open(os.path.join(rc_dir, f"{case}-{side}"), "wb").write(seed)
                    n += 1
        if ms:
            server_ip = next((c[1][0] for c in conns), None)
            if server_ip is None:
                # no REP: the server is whoever the first REQ went to
                first = next(x for x in pkts if x[3][0] == 0x64 and u24(x[3][5:8]) == 1)
                server_ip = first[2]
            for side, passive in (("server", True), ("client", False)):
                seed = cm_seed(ms, server_ip, passive)
                if seed:
                    open(os.path.join(cm_dir, f"{case}-{side}"), "wb").write(seed)
                    n += 1
    print(f"{n} seeds written under {os.path.join(HERE, 'seeds')}")


if __name__ == "__main__":
    main()
