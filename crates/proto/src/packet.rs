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

/// Where a received RDMA WRITE or SEND packet's data is, when a peer process on the same host
/// sends it ([`crate::rc::RcQp::set_pull_min`]).
///
/// ```
/// use rdma_proto::packet::Placement;
/// assert_eq!(Placement::Inline.len(b"abc"), Some(3));
/// let p = Placement::Pull { len: 65536, psns: 16, source: &[] };
/// assert_eq!(p.len(&[]), Some(65536));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    /// In the packet's payload.
    Inline,
    /// A whole WRITE or SEND in one packet (opcode Only) that the responder copies from the
    /// sender's memory ([`crate::memory::MemoryTable::pull_remote`] with `source`; a SEND
    /// into its receive with [`crate::memory::MemoryTable::pull_local`]). It stands
    /// for `len` bytes and `psns` PSNs, as many as the message's packets would have
    /// taken (as a READ request does).
    Pull {
        /// Bytes of the message.
        len: u32,
        /// PSNs it takes: the message's length over the path MTU, rounded up (at least 1).
        psns: u32,
        /// Where the message is, in the memory table's format.
        source: &'a [u8],
    },
}

impl<'a> Placement<'a> {
    /// The placement a packet sent with `tx` and `payload` arrives with (the prefix of
    /// [`TxPlacement::Pull`] read); `None` when the payload is too short for it.
    ///
    /// ```
    /// use rdma_proto::packet::{Placement, TxPlacement};
    /// let p = [0, 0, 1, 0, 16, 0, 0, 0, 1, 2];
    /// assert_eq!(Placement::decode(TxPlacement::Pull, &p),
    ///            Some(Placement::Pull { len: 65536, psns: 16, source: &[1, 2] }));
    /// assert_eq!(Placement::decode(TxPlacement::Pull, &p[..7]), None);
    /// assert_eq!(Placement::decode(TxPlacement::Inline, &p), Some(Placement::Inline));
    /// ```
    pub fn decode(tx: TxPlacement, payload: &'a [u8]) -> Option<Placement<'a>> {
        let word = |o: usize| Some(u32::from_le_bytes(payload.get(o..o + 4)?.try_into().ok()?));
        match tx {
            TxPlacement::Inline => Some(Placement::Inline),
            TxPlacement::Pull => Some(Placement::Pull {
                len: word(0)?,
                psns: word(4)?,
                source: &payload[8..],
            }),
        }
    }

    /// The bytes a packet with `payload` stands for (`None`: more than 4 GiB).
    pub fn len(&self, payload: &[u8]) -> Option<u32> {
        match self {
            Placement::Inline => u32::try_from(payload.len()).ok(),
            Placement::Pull { len, .. } => Some(*len),
        }
    }
}

/// How a transmitted packet carries its data ([`Placement`] on the receiving side).
///
/// With [`TxPlacement::Pull`] the payload written is the message's length and the PSNs it
/// takes (4 bytes little-endian each), then where the message is, as the memory table
/// described it ([`crate::memory::MemoryTable::locate`]). Only a same-host wire can
/// carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TxPlacement {
    /// The data is the payload.
    #[default]
    Inline,
    /// A whole WRITE or SEND the responder copies from the sender's memory.
    Pull,
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
    /// How the payload carries the data.
    pub placement: TxPlacement,
}
