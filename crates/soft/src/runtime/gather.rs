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
    use super::HEADROOM;
    use rdma_wire::opcode::Opcode;

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
