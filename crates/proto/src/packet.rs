//! The transport's packets: `rdma-wire`'s [`PacketRepr`] for the headers, plus the payload.
//!
//! The transport builds and reads [`PacketRepr`] (BTH, RETH, AETH, DETH, AtomicETH,
//! AtomicAckETH, ImmDt, IETH) directly; [`crate::wire`] emits and parses whole packets.
//! Payload bytes travel separately: on receive as a slice, on transmit written by the
//! transport into the caller's buffer.
//!
//! ```
//! use rdma_proto::packet::{ack, header};
//! use rdma_wire::opcode::Opcode;
//! let mut h = header(Opcode::RcAcknowledge, 0x12, 100);
//! h.aeth = Some(ack(3));
//! assert!(h.bth.opcode.is_response());
//! assert!(h.check_headers().is_ok());
//! assert_eq!(h.header_len(), 12 + 4);
//! ```

use rdma_wire::aeth::{AethRepr, AethSyndrome};
use rdma_wire::bth::BthRepr;
use rdma_wire::opcode::Opcode;
use rdma_wire::packet::PacketRepr;

/// A packet with `opcode`, no extended header, P_Key 0xFFFF and every BTH flag clear (pad
/// count 0: [`crate::wire::emit`] sets it from the payload); fill in the extended headers
/// the opcode needs.
///
/// ```
/// use rdma_proto::packet::header;
/// use rdma_wire::opcode::Opcode;
/// let h = header(Opcode::RcSendOnly, 0x12, 7);
/// assert_eq!((h.bth.p_key, h.bth.dest_qp, h.bth.psn), (0xFFFF, 0x12, 7));
/// assert!(!h.bth.ack_req && h.reth.is_none());
/// ```
pub const fn header(opcode: Opcode, dest_qp: u32, psn: u32) -> PacketRepr {
    PacketRepr::new(BthRepr {
        opcode,
        se: false,
        mig_req: false,
        pad_cnt: 0,
        p_key: 0xFFFF,
        fecn: false,
        becn: false,
        resv6a: 0,
        dest_qp,
        ack_req: false,
        resv7: 0,
        psn,
    })
}

/// The AETH of an ACK as this transport sends it: "credit count invalid" (as rxe sends).
///
/// ```
/// use rdma_proto::packet::ack;
/// use rdma_wire::aeth::AethSyndrome;
/// assert_eq!(ack(3).syndrome.to_byte(), Ok(0x1F));
/// assert_eq!(ack(3).msn, 3);
/// ```
pub const fn ack(msn: u32) -> AethRepr {
    AethRepr {
        syndrome: AethSyndrome::Ack {
            credits: AethSyndrome::CREDITS_INVALID,
        },
        msn,
    }
}

/// A received packet: headers and payload (without pad and ICRC).
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Headers.
    pub header: PacketRepr,
    /// Payload.
    pub payload: &'a [u8],
}

/// A packet the transport wants sent: its headers; its payload was written to the start of
/// the buffer given to `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Headers.
    pub header: PacketRepr,
    /// Payload bytes written at the start of the caller's buffer.
    pub payload_len: usize,
    /// The port (path) to send it from: the QP's current primary port
    /// ([`crate::verbs::QpAttr::port_num`], which path migration changes).
    pub port: u8,
}
