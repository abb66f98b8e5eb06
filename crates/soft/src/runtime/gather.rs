//! An RC QP's packets over UDP, their payload gathered straight into the send batch.
//!
//! The transport writes a packet's payload into the buffer it is given; here that buffer is
//! the datagram's own slot in the wire's send batch, after [`HEADROOM`] bytes, and the
//! headers go right before the payload: one copy (registered memory to the slot) where a
//! packet built in a buffer of its own and then queued takes two.

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::Transmit;
use rdma_proto::rc::RcQp;

use super::apm::WirePath;
use crate::io::{DatagramWire, TxMeta, TxPlacement};
use crate::Result;

/// Room before the payload: more than the longest RC headers (BTH and AtomicETH, 40
/// bytes; a test checks every opcode).
pub(super) const HEADROOM: usize = 64;

/// The next packet of `rc`, gathered into the batch slot of path `p` (at most `max` bytes)
/// and queued: the transmit (for the caller's counters and trace) and whether the wire took
/// it; `Ok(None)` when the transport has nothing to send. An error when the wire refused
/// the path before asking for a packet (its address is not open, say): the transport still
/// has it, and the caller takes it as lost (the transport retransmits, and in the end
/// reports the failure).
pub(super) fn transmit<M: MemoryTable + ?Sized>(
    wire: &mut dyn DatagramWire,
    rc: &mut RcQp,
    p: &WirePath,
    (now, mem): (u64, &mut M),
    max: usize,
) -> Result<Option<(Transmit, Result<()>)>> {
    let meta = TxMeta {
        tclass: p.tclass,
        placement: TxPlacement::Inline,
        ifindex: 0,
    };
    let mut sent = None;
    let r = wire.emit_from_port(p.local, p.remote, p.sport, meta, max, &mut |room| {
        let t = room
            .get_mut(HEADROOM..)
            .and_then(|body| rc.poll_transmit(now, mem, body));
        let Some(t) = sent.insert(t) else {
            return 0..0;
        };
        let Some(start) = HEADROOM.checked_sub(t.header.header_len()) else {
            return 0..0;
        };
        // a pulled WRITE goes over the host-local wire only: refused (lost, resent inline)
        if t.placement != TxPlacement::Inline {
            return 0..0;
        }
        let n = rdma_proto::wire::emit_in_place(&t.header, t.payload_len, &mut room[start..], None)
            .unwrap_or(0);
        start..start + n
    });
    match (sent, r) {
        (None, Err(e)) => Err(e),
        (sent, r) => Ok(sent.flatten().map(|t| (t, r))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{UdpConfig, UdpWire, WireAddr};
    use rdma_proto::memory::InMemoryTable;
    use rdma_proto::rc::RcConfig;
    use rdma_proto::sim::{connect, ConnParams};
    use rdma_proto::verbs::{AccessFlags, PdId, SendOp, SendWr};
    use rdma_wire::opcode::Opcode;

    /// A path whose address the wire has not open is refused before a packet is asked
    /// for: the error comes back and the transport still has the packet (the runtime then
    /// takes it as lost, so the QP's sending does not stop unnoticed).
    #[test]
    fn a_refused_path_leaves_the_packet_with_the_transport() {
        let pd = PdId(1);
        let mut mem = InMemoryTable::new(0x10000, 1 << 16);
        let k = mem.register(pd, 0x10000, 4096, AccessFlags::all()).unwrap();
        let mut qp = RcQp::new(RcConfig::new(0x11, pd));
        connect(&mut qp, 0x22, 1000, 0, &ConnParams::default());
        let wr = SendWr::new(1, SendOp::Send).with_sge(rdma_proto::verbs::Sge {
            addr: 0x10000,
            length: 64,
            lkey: k.lkey,
        });
        qp.post_send(&mem, &wr).unwrap();
        let mut wire = UdpWire::new(UdpConfig {
            port: 47933,
            share: false,
            ..UdpConfig::default()
        })
        .unwrap();
        let addr = |s: &str| s.parse::<WireAddr>().unwrap();
        let path = WirePath {
            local: addr("127.0.9.31"), // never opened
            remote: addr("127.0.9.32"),
            port: 1,
            tclass: 0,
            sport: 0,
        };
        let r = transmit(&mut wire, &mut qp, &path, (0, &mut mem), 4096 + 128);
        assert!(r.is_err(), "refused: {r:?}");
        assert!(qp.may_transmit(), "the packet is still the transport's");
        let mut buf = [0u8; 4096];
        let t = qp.poll_transmit(0, &mut mem, &mut buf).expect("the SEND");
        assert_eq!(t.header.bth.opcode, Opcode::RcSendOnly);
    }

    /// Every opcode's headers fit before the payload: a packet whose headers did not would
    /// be taken from the transport and never sent.
    #[test]
    fn every_opcode_s_headers_fit_in_the_headroom() {
        let mut seen = 0;
        for b in 0..=u8::MAX {
            if let Ok(op) = Opcode::try_from(b) {
                let len = rdma_wire::bth::BTH_LEN + op.ext_headers().len();
                assert!(len <= HEADROOM, "{op:?}: {len} bytes of headers");
                seen += 1;
            }
        }
        assert!(seen > 40, "the opcodes were walked ({seen})");
    }
}
