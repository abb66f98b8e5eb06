//! The transport's description of a packet: BTH fields and extended headers, without bytes.
//!
//! The runtime converts between this and the wire (see [`crate::wire`] for the conversion
//! through `rdma-wire`). Payload bytes travel separately: on receive as a slice, on transmit
//! written by the transport into the caller's buffer.
//!
//! ```
//! use rdma_proto::packet::{Opcode, PacketHeader, Aeth};
//! let mut h = PacketHeader::new(Opcode::RcAcknowledge, 0x12, 100);
//! h.aeth = Some(Aeth::ack(3));
//! assert!(h.opcode.is_response());
//! assert_eq!(h.header_len(), 12 + 4);
//! ```

/// BTH opcodes this transport produces or consumes (IBA values; RC and UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Opcode {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastImm = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyImm = 0x05,
    RcWriteFirst = 0x06,
    RcWriteMiddle = 0x07,
    RcWriteLast = 0x08,
    RcWriteLastImm = 0x09,
    RcWriteOnly = 0x0A,
    RcWriteOnlyImm = 0x0B,
    RcReadRequest = 0x0C,
    RcReadResponseFirst = 0x0D,
    RcReadResponseMiddle = 0x0E,
    RcReadResponseLast = 0x0F,
    RcReadResponseOnly = 0x10,
    RcAcknowledge = 0x11,
    RcAtomicAcknowledge = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    RcSendLastInv = 0x16,
    RcSendOnlyInv = 0x17,
    UdSendOnly = 0x64,
    UdSendOnlyImm = 0x65,
}

impl Opcode {
    /// From the BTH byte; `None` for opcodes this transport does not handle.
    pub fn from_u8(b: u8) -> Option<Self> {
        use Opcode::*;
        Some(match b {
            0x00 => RcSendFirst,
            0x01 => RcSendMiddle,
            0x02 => RcSendLast,
            0x03 => RcSendLastImm,
            0x04 => RcSendOnly,
            0x05 => RcSendOnlyImm,
            0x06 => RcWriteFirst,
            0x07 => RcWriteMiddle,
            0x08 => RcWriteLast,
            0x09 => RcWriteLastImm,
            0x0A => RcWriteOnly,
            0x0B => RcWriteOnlyImm,
            0x0C => RcReadRequest,
            0x0D => RcReadResponseFirst,
            0x0E => RcReadResponseMiddle,
            0x0F => RcReadResponseLast,
            0x10 => RcReadResponseOnly,
            0x11 => RcAcknowledge,
            0x12 => RcAtomicAcknowledge,
            0x13 => RcCompareSwap,
            0x14 => RcFetchAdd,
            0x16 => RcSendLastInv,
            0x17 => RcSendOnlyInv,
            0x64 => UdSendOnly,
            0x65 => UdSendOnlyImm,
            _ => return None,
        })
    }
    /// The BTH byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
    /// Packets sent by a responder (READ responses, ACKs, atomic ACKs).
    pub fn is_response(self) -> bool {
        (0x0D..=0x12).contains(&(self as u8))
    }
    /// Starts a message (FIRST or ONLY, READ request, atomic).
    pub fn is_first(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcSendFirst
                | RcSendOnly
                | RcSendOnlyImm
                | RcSendOnlyInv
                | RcWriteFirst
                | RcWriteOnly
                | RcWriteOnlyImm
                | RcReadRequest
                | RcCompareSwap
                | RcFetchAdd
                | UdSendOnly
                | UdSendOnlyImm
        )
    }
    /// Ends a message (LAST or ONLY, READ request, atomic).
    pub fn is_last(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcSendLast
                | RcSendLastImm
                | RcSendLastInv
                | RcSendOnly
                | RcSendOnlyImm
                | RcSendOnlyInv
                | RcWriteLast
                | RcWriteLastImm
                | RcWriteOnly
                | RcWriteOnlyImm
                | RcReadRequest
                | RcCompareSwap
                | RcFetchAdd
                | UdSendOnly
                | UdSendOnlyImm
        )
    }
    /// A SEND flavour (RC).
    pub fn is_send(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcSendFirst
                | RcSendMiddle
                | RcSendLast
                | RcSendLastImm
                | RcSendOnly
                | RcSendOnlyImm
                | RcSendLastInv
                | RcSendOnlyInv
        )
    }
    /// An RDMA WRITE flavour.
    pub fn is_write(self) -> bool {
        (0x06..=0x0B).contains(&(self as u8))
    }
    /// Carries immediate data.
    pub fn has_imm(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcSendLastImm | RcSendOnlyImm | RcWriteLastImm | RcWriteOnlyImm | UdSendOnlyImm
        )
    }
    /// Carries a RETH.
    pub fn has_reth(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcWriteFirst | RcWriteOnly | RcWriteOnlyImm | RcReadRequest
        )
    }
    /// Carries an AETH.
    pub fn has_aeth(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RcReadResponseFirst
                | RcReadResponseLast
                | RcReadResponseOnly
                | RcAcknowledge
                | RcAtomicAcknowledge
        )
    }
    /// Carries an IETH.
    pub fn has_ieth(self) -> bool {
        matches!(self, Opcode::RcSendLastInv | Opcode::RcSendOnlyInv)
    }
    /// Carries an AtomicETH.
    pub fn is_atomic(self) -> bool {
        matches!(self, Opcode::RcCompareSwap | Opcode::RcFetchAdd)
    }
    /// Carries a DETH.
    pub fn is_ud(self) -> bool {
        matches!(self, Opcode::UdSendOnly | Opcode::UdSendOnlyImm)
    }
    /// May carry payload.
    pub fn has_payload(self) -> bool {
        use Opcode::*;
        !matches!(
            self,
            RcReadRequest | RcAcknowledge | RcAtomicAcknowledge | RcCompareSwap | RcFetchAdd
        )
    }
}

/// RDMA extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub len: u32,
}

/// Atomic extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (compare-swap) or add (fetch-add) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
}

/// Datagram extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

/// NAK codes of the AETH (syndrome `011x_xxxx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// PSN sequence error.
    PsnSeqErr = 0,
    /// Invalid request.
    InvalidRequest = 1,
    /// Remote access error.
    RemoteAccess = 2,
    /// Remote operational error.
    RemoteOperational = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

/// ACK extended transport header: syndrome and MSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Aeth {
    /// Syndrome byte.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// What an AETH syndrome means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// ACK with a credit count (0x1F: invalid).
    Ack(u8),
    /// Receiver not ready, with the 5-bit timer code.
    Rnr(u8),
    /// NAK.
    Nak(NakCode),
    /// A reserved syndrome.
    Reserved(u8),
}

impl Aeth {
    /// An ACK ("credits invalid", as rxe sends).
    pub fn ack(msn: u32) -> Self {
        Aeth {
            syndrome: 0x1F,
            msn,
        }
    }
    /// An RNR NAK with a timer code.
    pub fn rnr(timer: u8, msn: u32) -> Self {
        Aeth {
            syndrome: 0x20 | (timer & 0x1F),
            msn,
        }
    }
    /// A NAK.
    pub fn nak(code: NakCode, msn: u32) -> Self {
        Aeth {
            syndrome: 0x60 | code as u8,
            msn,
        }
    }
    /// Decodes the syndrome.
    pub fn kind(&self) -> AethKind {
        let low = self.syndrome & 0x1F;
        match self.syndrome >> 5 {
            0 => AethKind::Ack(low),
            1 => AethKind::Rnr(low),
            3 => match low {
                0 => AethKind::Nak(NakCode::PsnSeqErr),
                1 => AethKind::Nak(NakCode::InvalidRequest),
                2 => AethKind::Nak(NakCode::RemoteAccess),
                3 => AethKind::Nak(NakCode::RemoteOperational),
                4 => AethKind::Nak(NakCode::InvalidRdRequest),
                _ => AethKind::Reserved(self.syndrome),
            },
            _ => AethKind::Reserved(self.syndrome),
        }
    }
}

/// One packet's headers as the transport sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketHeader {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event bit.
    pub solicited: bool,
    /// P_Key.
    pub pkey: u16,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request bit.
    pub ack_req: bool,
    /// Migration request bit (BTH MigReq): set by an RC QP in the Migrated state once it
    /// has used path migration; clear otherwise (and always for QPs without an alternate
    /// path, as rxe sends).
    pub mig_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// RETH.
    pub reth: Option<Reth>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH: rkey to invalidate.
    pub ieth: Option<u32>,
}

impl PacketHeader {
    /// A header with no extended headers, P_Key 0xFFFF.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        PacketHeader {
            opcode,
            solicited: false,
            pkey: 0xFFFF,
            dest_qp,
            ack_req: false,
            mig_req: false,
            psn,
            deth: None,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
        }
    }
    /// Bytes of BTH plus the extended headers the opcode carries.
    pub fn header_len(&self) -> usize {
        let o = self.opcode;
        12 + if o.is_ud() { 8 } else { 0 }
            + if o.has_reth() { 16 } else { 0 }
            + if o.is_atomic() { 28 } else { 0 }
            + if o.has_aeth() { 4 } else { 0 }
            + if o == Opcode::RcAtomicAcknowledge {
                8
            } else {
                0
            }
            + if o.has_imm() || o.has_ieth() { 4 } else { 0 }
    }
    /// Whether the extended headers present match what the opcode requires.
    pub fn is_consistent(&self) -> bool {
        let o = self.opcode;
        self.deth.is_some() == o.is_ud()
            && self.reth.is_some() == o.has_reth()
            && self.atomic.is_some() == o.is_atomic()
            && self.aeth.is_some() == o.has_aeth()
            && self.atomic_ack.is_some() == (o == Opcode::RcAtomicAcknowledge)
            && self.imm.is_some() == o.has_imm()
            && self.ieth.is_some() == o.has_ieth()
    }
}

/// A received packet: headers and payload (without pad and ICRC).
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// Headers.
    pub header: PacketHeader,
    /// Payload.
    pub payload: &'a [u8],
}

/// A packet the transport wants sent: its headers; its payload was written to the start of
/// the buffer given to `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Headers.
    pub header: PacketHeader,
    /// Payload bytes written at the start of the caller's buffer.
    pub payload_len: usize,
    /// The port (path) to send it from: the QP's current primary port
    /// ([`crate::verbs::QpAttr::port_num`], which path migration changes).
    pub port: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn opcodes_round_trip() {
        for b in 0..=255u8 {
            if let Some(o) = Opcode::from_u8(b) {
                assert_eq!(o.as_u8(), b);
            }
        }
        assert_eq!(Aeth::nak(NakCode::RemoteAccess, 0).syndrome, 0x62);
        assert_eq!(Aeth::rnr(0, 0).kind(), AethKind::Rnr(0));
        assert_eq!(
            Aeth {
                syndrome: 0x40,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x40)
        );
    }
}
