//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`; not an API).
//! Each takes untrusted bytes as a hostile peer would write them and panics only when a
//! check of the code under test fails.

/// A host-local ring written by a hostile producer, read to the end by its consumer.
pub fn ring_consume(input: &[u8]) {
    crate::io::local::fuzz_ring_consume(input);
}

/// A pull payload from a hostile peer: resolved against two region files, then copied.
pub fn pull_rewrite(payload: &[u8]) {
    crate::io::local::fuzz_pull_rewrite(payload);
}

/// `copy_range` over arbitrary resolved pairs (never dereferenced).
pub fn copy_range(source: &[u8], skip: u64, len: u64) {
    crate::pull::fuzz_copy_range(source, skip, len);
}

/// Bell datagrams from a same-user process, each with a descriptor of some kind
/// (eventfd, ring, region file, pipe, socket), read by the host-local wire.
pub fn drain_bell(input: &[u8]) {
    crate::io::local::fuzz_drain_bell(input);
}

/// One UDP GRO receive from a hostile sender, split into its datagrams and each checked as
/// the receive path does (`io/udp/rx_fuzz.rs` has the input format and the checks).
pub fn gro_receive(input: &[u8]) {
    crate::io::fuzz_gro_receive(input);
}

/// Datagrams to QP1 from hostile peers, queued by the GSI between takes; checks that every
/// MAD queued passes the GSI's checks (UD SEND_ONLY, headers as the opcode says, 256 bytes,
/// the GSI Q_Key, the default partition, an address opened with `gsi_open`), comes out in
/// order with its addresses and DETH source QP, that the bounds hold (in total and per
/// peer), that every datagram is counted once, and that the GSI eventfd is readable exactly
/// while MADs are queued.
///
/// Input: commands. Byte `op`: bit 7 takes one MAD; else bits 0-1 pick the local address
/// (0, 1 opened, 2-3 not), bits 2-4 the remote, bit 5 a raw datagram (2 bytes length, then
/// its bytes) or a built one (1 byte of flags: bit 0 a wrong Q_Key, 1 the limited P_Key
/// 0x7FFF, 2 another P_Key, 3 a short payload, 4 with immediate data; 3 bytes source QP; the
/// MAD's first 8 bytes).
pub fn gsi_deliver(input: &[u8]) {
    gsi_fuzz::run(input);
}

mod gsi_fuzz {
    use std::collections::VecDeque;

    use rdma_proto::packet::{header, Packet};
    use rdma_wire::deth::DethRepr;
    use rdma_wire::opcode::Opcode;
    use rdma_wire::packet::IcrcCheck;

    use crate::gsi::{Gsi, GsiLimits, GsiMad, DEFAULT_PKEY, GSI_QKEY, MAD_LEN};
    use crate::io::{Arrival, TxPlacement, WireAddr};

    const LIMITS: GsiLimits = GsiLimits {
        queue_len: 8,
        per_peer: 3,
    };

    fn readable(fd: i32) -> bool {
        crate::fd::wait_readable(&[fd], Some(std::time::Instant::now())).unwrap_or(false)
    }

    fn total(s: &crate::gsi::GsiStats) -> u64 {
        s.received
            + s.bad_opcode
            + s.bad_length
            + s.bad_qkey
            + s.bad_pkey
            + s.not_open
            + s.queue_full
            + s.peer_full
    }

    /// Whether the GSI may queue `pkt` arriving on `local` (one of the opened ones or not).
    fn acceptable(pkt: &Packet<'_>, opened: bool) -> bool {
        let h = &pkt.header;
        h.bth.opcode == Opcode::UdSendOnly
            && h.check_headers().is_ok()
            && h.deth.is_some_and(|d| d.q_key == GSI_QKEY)
            && h.bth.p_key & 0x7FFF == 0x7FFF
            && pkt.payload.len() == MAD_LEN
            && opened
    }

    pub(super) fn run(input: &[u8]) {
        let Ok(mut gsi) = Gsi::new() else { return };
        gsi.set_limits(LIMITS);
        let locals: [WireAddr; 4] =
            ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"].map(|a| a.parse().unwrap());
        gsi.add_open(locals[0]);
        gsi.add_open(locals[1]);
        let mut model: VecDeque<GsiMad> = VecDeque::new();
        let mut buf = vec![0u8; 2048];
        let mut at = 0usize;
        let mut take = |n: usize| {
            let b = input.get(at..at + n)?;
            at += n;
            Some(b)
        };
        while let Some(&[op]) = take(1) {
            if op & 0x80 != 0 {
                let got = gsi.pop();
                assert_eq!(got, model.pop_front(), "MADs come out in order");
            } else {
                let local = locals[usize::from(op & 3)];
                let remote: WireAddr = format!("10.1.0.{}", (op >> 2) & 7).parse().unwrap();
                let bytes: Vec<u8> = if op & 0x20 != 0 {
                    let Some(n) = take(2) else { break };
                    let n = usize::from(u16::from_be_bytes([n[0], n[1]])) % 1024;
                    let Some(b) = take(n) else { break };
                    b.to_vec()
                } else {
                    let (Some(&[f]), Some(s), Some(m)) = (take(1), take(3), take(8)) else {
                        break;
                    };
                    let mut h = header(
                        if f & 16 != 0 {
                            Opcode::UdSendOnlyImm
                        } else {
                            Opcode::UdSendOnly
                        },
                        1,
                        0,
                    );
                    h.bth.p_key = match f & 6 {
                        0 => DEFAULT_PKEY,
                        2 => 0x7FFF,
                        _ => 0x8001,
                    };
                    h.deth = Some(DethRepr {
                        q_key: if f & 1 != 0 { GSI_QKEY ^ 1 } else { GSI_QKEY },
                        resv8: 0,
                        src_qp: u32::from_be_bytes([0, s[0], s[1], s[2]]),
                    });
                    if f & 16 != 0 {
                        h.imm_dt = Some(7);
                    }
                    let mut mad = vec![0u8; if f & 8 != 0 { MAD_LEN - 4 } else { MAD_LEN }];
                    mad[..8].copy_from_slice(m);
                    let Ok(n) = rdma_proto::wire::emit(&h, &mad, &mut buf, None) else {
                        continue;
                    };
                    buf[..n].to_vec()
                };
                let Ok(pkt) = rdma_proto::wire::parse(&bytes, IcrcCheck::Skip) else {
                    continue;
                };
                let arr = Arrival {
                    local,
                    remote,
                    ifindex: 3,
                    tclass: 0,
                    hop_limit: 64,
                    placement: TxPlacement::Inline,
                };
                let before = gsi.stats();
                gsi.deliver(&arr, &pkt);
                let after = gsi.stats();
                assert_eq!(total(&after), total(&before) + 1, "counted once: {after:?}");
                if after.received > before.received {
                    assert!(
                        acceptable(&pkt, usize::from(op & 3) < 2),
                        "queued a MAD that must be dropped: {:?}",
                        pkt.header
                    );
                    let mad = <[u8; MAD_LEN]>::try_from(pkt.payload).unwrap();
                    let src_qp = pkt.header.deth.map_or(0, |d| d.src_qp);
                    model.push_back(GsiMad {
                        local,
                        remote,
                        ifindex: 3,
                        src_qp,
                        pkey: pkt.header.bth.p_key,
                        mad,
                    });
                } else if acceptable(&pkt, usize::from(op & 3) < 2) {
                    // dropped only for a bound
                    let from_peer = model.iter().filter(|m| m.remote == remote).count();
                    assert!(
                        model.len() >= LIMITS.queue_len || from_peer >= LIMITS.per_peer,
                        "a MAD within the bounds dropped: {after:?}"
                    );
                }
            }
            assert!(model.len() <= LIMITS.queue_len);
            assert_eq!(gsi.is_empty(), model.is_empty());
            assert_eq!(
                readable(gsi.event_fd()),
                !model.is_empty(),
                "the eventfd is readable exactly while MADs are queued"
            );
        }
        while let Some(m) = model.pop_front() {
            assert_eq!(gsi.pop(), Some(m));
        }
        assert_eq!(gsi.pop(), None);
        assert!(!readable(gsi.event_fd()));
    }
}
