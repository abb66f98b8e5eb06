//! The BTH opcode table: transport service, extended headers, payload and position of each
//! opcode (IBA Vol. 1 §9.2; the RoCEv2 annex for CNP).
//!
//! The top three bits of an opcode name the transport (RC `0x00`, UC `0x20`, RD `0x40`,
//! UD `0x60`, CNP `0x80`), the low five bits the operation.

use core::fmt;

use crate::{Error, Result};

/// The transport service an opcode belongs to.
///
/// ```
/// use rdma_wire::opcode::{Opcode, Transport};
/// assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection.
    Rc,
    /// Unreliable Connection.
    Uc,
    /// Reliable Datagram.
    Rd,
    /// Unreliable Datagram.
    Ud,
    /// RoCEv2 Congestion Notification Packet.
    Cnp,
}

/// Where a packet sits in its message.
///
/// ```
/// use rdma_wire::opcode::{Opcode, Position};
/// assert_eq!(Opcode::RcRdmaWriteMiddle.position(), Position::Middle);
/// assert_eq!(Opcode::RcAcknowledge.position(), Position::None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
    /// Not part of a segmented message (read request, acknowledgements, atomics, resync, CNP).
    None,
}

/// One extended transport header kind, listed in wire order.
///
/// ```
/// use rdma_wire::opcode::ExtHeader;
/// assert_eq!(ExtHeader::Reth.len(), 16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExtHeader {
    /// Reliable Datagram ETH, 4 bytes.
    Rdeth = 0,
    /// Datagram ETH, 8 bytes.
    Deth = 1,
    /// RDMA ETH, 16 bytes.
    Reth = 2,
    /// Atomic ETH, 28 bytes.
    AtomicEth = 3,
    /// ACK ETH, 4 bytes.
    Aeth = 4,
    /// Atomic ACK ETH, 8 bytes.
    AtomicAckEth = 5,
    /// Immediate data, 4 bytes.
    ImmDt = 6,
    /// Invalidate ETH, 4 bytes.
    Ieth = 7,
}

impl ExtHeader {
    /// Every kind, in wire order.
    pub const ALL: [ExtHeader; 8] = [
        ExtHeader::Rdeth,
        ExtHeader::Deth,
        ExtHeader::Reth,
        ExtHeader::AtomicEth,
        ExtHeader::Aeth,
        ExtHeader::AtomicAckEth,
        ExtHeader::ImmDt,
        ExtHeader::Ieth,
    ];

    /// Length of this header in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(self) -> usize {
        match self {
            ExtHeader::Rdeth | ExtHeader::Aeth | ExtHeader::ImmDt | ExtHeader::Ieth => 4,
            ExtHeader::Deth | ExtHeader::AtomicAckEth => 8,
            ExtHeader::Reth => 16,
            ExtHeader::AtomicEth => 28,
        }
    }

    /// The header's name as the IBA spells it.
    pub const fn name(self) -> &'static str {
        match self {
            ExtHeader::Rdeth => "RDETH",
            ExtHeader::Deth => "DETH",
            ExtHeader::Reth => "RETH",
            ExtHeader::AtomicEth => "AtomicETH",
            ExtHeader::Aeth => "AETH",
            ExtHeader::AtomicAckEth => "AtomicAckETH",
            ExtHeader::ImmDt => "ImmDt",
            ExtHeader::Ieth => "IETH",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Length of the BTH in bytes: the extended headers follow it.
pub const BTH_LEN: usize = 12;

/// The length of every set of extended headers, by its bits (bit k: `ExtHeader::ALL[k]`).
const LENS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut bits = 0;
    while bits < 256 {
        let mut k = 0;
        while k < 8 {
            if bits & (1 << k) != 0 {
                t[bits] += ExtHeader::ALL[k].len() as u8;
            }
            k += 1;
        }
        bits += 1;
    }
    t
};

/// The set of extended headers that follow the BTH for one opcode.
///
/// ```
/// use rdma_wire::opcode::{ExtHeader, Opcode};
/// let h = Opcode::RcRdmaWriteOnlyImm.ext_headers();
/// assert!(h.contains(ExtHeader::Reth) && h.contains(ExtHeader::ImmDt));
/// assert_eq!(h.len(), 20);
/// assert_eq!(h.offset(ExtHeader::ImmDt), Some(12 + 16));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders(u8);

impl ExtHeaders {
    /// No extended header.
    pub const NONE: ExtHeaders = ExtHeaders(0);

    const fn of(list: &[ExtHeader]) -> ExtHeaders {
        let mut bits = 0;
        let mut i = 0;
        while i < list.len() {
            bits |= list[i].bit();
            i += 1;
        }
        ExtHeaders(bits)
    }

    /// The set as bits: bit k stands for `ExtHeader::ALL[k]`.
    #[inline]
    pub(crate) const fn bits(self) -> u8 {
        self.0
    }

    /// Whether `h` is present.
    #[inline]
    pub const fn contains(self, h: ExtHeader) -> bool {
        self.0 & h.bit() != 0
    }

    /// Total length in bytes of the extended headers.
    #[allow(clippy::len_without_is_empty)]
    #[inline]
    pub const fn len(self) -> usize {
        LENS[self.0 as usize] as usize
    }

    /// Offset of `h` from the start of the BTH, if present.
    #[inline]
    pub const fn offset(self, h: ExtHeader) -> Option<usize> {
        if !self.contains(h) {
            return None;
        }
        // the headers before `h` in wire order are the lower bits
        Some(BTH_LEN + ExtHeaders(self.0 & (h.bit() - 1)).len())
    }

    /// The headers present, in wire order.
    #[inline]
    pub fn iter(self) -> impl Iterator<Item = ExtHeader> {
        ExtHeader::ALL
            .into_iter()
            .filter(move |h| self.contains(*h))
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $val:literal, $label:literal, $pos:ident, $payload:literal,
        [$($h:ident),*]; )*) => {
        /// A BTH opcode known to this crate.
        ///
        /// ```
        /// use rdma_wire::opcode::Opcode;
        /// use rdma_wire::Error;
        /// assert_eq!(Opcode::try_from(0x64), Ok(Opcode::UdSendOnly));
        /// assert_eq!(Opcode::try_from(0x72), Err(Error::UnknownOpcode(0x72)));
        /// assert_eq!(u8::from(Opcode::RcSendOnlyInv), 0x17);
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $name = $val, )*
        }

        impl Opcode {
            /// Every known opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// The IBA name of the opcode, e.g. `"RC RDMA WRITE First"`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$name => $label, )* }
            }

            /// Where a packet with this opcode sits in its message.
            #[inline]
            pub const fn position(self) -> Position {
                match self { $( Opcode::$name => Position::$pos, )* }
            }

            /// Whether packets with this opcode carry a payload (possibly empty).
            #[inline]
            pub const fn has_payload(self) -> bool {
                match self { $( Opcode::$name => $payload, )* }
            }

            /// The extended headers that follow the BTH, in wire order.
            #[inline]
            pub const fn ext_headers(self) -> ExtHeaders {
                // each arm a constant: evaluated at compile time, not per call
                match self {
                    $( Opcode::$name => {
                        const H: ExtHeaders = ExtHeaders::of(&[$(ExtHeader::$h),*]);
                        H
                    } )*
                }
            }
        }

        impl TryFrom<u8> for Opcode {
            type Error = Error;
            fn try_from(v: u8) -> Result<Opcode> {
                match v {
                    $( $val => Ok(Opcode::$name), )*
                    _ => Err(Error::UnknownOpcode(v)),
                }
            }
        }
    };
}

opcodes! {
    /// RC SEND First.
    RcSendFirst = 0x00, "RC SEND First", First, true, [];
    /// RC SEND Middle.
    RcSendMiddle = 0x01, "RC SEND Middle", Middle, true, [];
    /// RC SEND Last.
    RcSendLast = 0x02, "RC SEND Last", Last, true, [];
    /// RC SEND Last with Immediate.
    RcSendLastImm = 0x03, "RC SEND Last with Immediate", Last, true, [ImmDt];
    /// RC SEND Only.
    RcSendOnly = 0x04, "RC SEND Only", Only, true, [];
    /// RC SEND Only with Immediate.
    RcSendOnlyImm = 0x05, "RC SEND Only with Immediate", Only, true, [ImmDt];
    /// RC RDMA WRITE First.
    RcRdmaWriteFirst = 0x06, "RC RDMA WRITE First", First, true, [Reth];
    /// RC RDMA WRITE Middle.
    RcRdmaWriteMiddle = 0x07, "RC RDMA WRITE Middle", Middle, true, [];
    /// RC RDMA WRITE Last.
    RcRdmaWriteLast = 0x08, "RC RDMA WRITE Last", Last, true, [];
    /// RC RDMA WRITE Last with Immediate.
    RcRdmaWriteLastImm = 0x09, "RC RDMA WRITE Last with Immediate", Last, true, [ImmDt];
    /// RC RDMA WRITE Only.
    RcRdmaWriteOnly = 0x0a, "RC RDMA WRITE Only", Only, true, [Reth];
    /// RC RDMA WRITE Only with Immediate.
    RcRdmaWriteOnlyImm = 0x0b, "RC RDMA WRITE Only with Immediate", Only, true, [Reth, ImmDt];
    /// RC RDMA READ Request.
    RcRdmaReadRequest = 0x0c, "RC RDMA READ Request", None, false, [Reth];
    /// RC RDMA READ Response First.
    RcRdmaReadResponseFirst = 0x0d, "RC RDMA READ Response First", First, true, [Aeth];
    /// RC RDMA READ Response Middle.
    RcRdmaReadResponseMiddle = 0x0e, "RC RDMA READ Response Middle", Middle, true, [];
    /// RC RDMA READ Response Last.
    RcRdmaReadResponseLast = 0x0f, "RC RDMA READ Response Last", Last, true, [Aeth];
    /// RC RDMA READ Response Only.
    RcRdmaReadResponseOnly = 0x10, "RC RDMA READ Response Only", Only, true, [Aeth];
    /// RC Acknowledge.
    RcAcknowledge = 0x11, "RC Acknowledge", None, false, [Aeth];
    /// RC ATOMIC Acknowledge.
    RcAtomicAcknowledge = 0x12, "RC ATOMIC Acknowledge", None, false, [Aeth, AtomicAckEth];
    /// RC CmpSwap.
    RcCompareSwap = 0x13, "RC CmpSwap", None, false, [AtomicEth];
    /// RC FetchAdd.
    RcFetchAdd = 0x14, "RC FetchAdd", None, false, [AtomicEth];
    /// RC SEND Last with Invalidate.
    RcSendLastInv = 0x16, "RC SEND Last with Invalidate", Last, true, [Ieth];
    /// RC SEND Only with Invalidate.
    RcSendOnlyInv = 0x17, "RC SEND Only with Invalidate", Only, true, [Ieth];
    /// UC SEND First.
    UcSendFirst = 0x20, "UC SEND First", First, true, [];
    /// UC SEND Middle.
    UcSendMiddle = 0x21, "UC SEND Middle", Middle, true, [];
    /// UC SEND Last.
    UcSendLast = 0x22, "UC SEND Last", Last, true, [];
    /// UC SEND Last with Immediate.
    UcSendLastImm = 0x23, "UC SEND Last with Immediate", Last, true, [ImmDt];
    /// UC SEND Only.
    UcSendOnly = 0x24, "UC SEND Only", Only, true, [];
    /// UC SEND Only with Immediate.
    UcSendOnlyImm = 0x25, "UC SEND Only with Immediate", Only, true, [ImmDt];
    /// UC RDMA WRITE First.
    UcRdmaWriteFirst = 0x26, "UC RDMA WRITE First", First, true, [Reth];
    /// UC RDMA WRITE Middle.
    UcRdmaWriteMiddle = 0x27, "UC RDMA WRITE Middle", Middle, true, [];
    /// UC RDMA WRITE Last.
    UcRdmaWriteLast = 0x28, "UC RDMA WRITE Last", Last, true, [];
    /// UC RDMA WRITE Last with Immediate.
    UcRdmaWriteLastImm = 0x29, "UC RDMA WRITE Last with Immediate", Last, true, [ImmDt];
    /// UC RDMA WRITE Only.
    UcRdmaWriteOnly = 0x2a, "UC RDMA WRITE Only", Only, true, [Reth];
    /// UC RDMA WRITE Only with Immediate.
    UcRdmaWriteOnlyImm = 0x2b, "UC RDMA WRITE Only with Immediate", Only, true, [Reth, ImmDt];
    /// RD SEND First.
    RdSendFirst = 0x40, "RD SEND First", First, true, [Rdeth, Deth];
    /// RD SEND Middle.
    RdSendMiddle = 0x41, "RD SEND Middle", Middle, true, [Rdeth, Deth];
    /// RD SEND Last.
    RdSendLast = 0x42, "RD SEND Last", Last, true, [Rdeth, Deth];
    /// RD SEND Last with Immediate.
    RdSendLastImm = 0x43, "RD SEND Last with Immediate", Last, true, [Rdeth, Deth, ImmDt];
    /// RD SEND Only.
    RdSendOnly = 0x44, "RD SEND Only", Only, true, [Rdeth, Deth];
    /// RD SEND Only with Immediate.
    RdSendOnlyImm = 0x45, "RD SEND Only with Immediate", Only, true, [Rdeth, Deth, ImmDt];
    /// RD RDMA WRITE First.
    RdRdmaWriteFirst = 0x46, "RD RDMA WRITE First", First, true, [Rdeth, Deth, Reth];
    /// RD RDMA WRITE Middle.
    RdRdmaWriteMiddle = 0x47, "RD RDMA WRITE Middle", Middle, true, [Rdeth, Deth];
    /// RD RDMA WRITE Last.
    RdRdmaWriteLast = 0x48, "RD RDMA WRITE Last", Last, true, [Rdeth, Deth];
    /// RD RDMA WRITE Last with Immediate.
    RdRdmaWriteLastImm = 0x49, "RD RDMA WRITE Last with Immediate", Last, true, [Rdeth, Deth, ImmDt];
    /// RD RDMA WRITE Only.
    RdRdmaWriteOnly = 0x4a, "RD RDMA WRITE Only", Only, true, [Rdeth, Deth, Reth];
    /// RD RDMA WRITE Only with Immediate.
    RdRdmaWriteOnlyImm = 0x4b, "RD RDMA WRITE Only with Immediate", Only, true,
        [Rdeth, Deth, Reth, ImmDt];
    /// RD RDMA READ Request.
    RdRdmaReadRequest = 0x4c, "RD RDMA READ Request", None, false, [Rdeth, Deth, Reth];
    /// RD RDMA READ Response First.
    RdRdmaReadResponseFirst = 0x4d, "RD RDMA READ Response First", First, true, [Rdeth, Aeth];
    /// RD RDMA READ Response Middle.
    RdRdmaReadResponseMiddle = 0x4e, "RD RDMA READ Response Middle", Middle, true, [Rdeth];
    /// RD RDMA READ Response Last.
    RdRdmaReadResponseLast = 0x4f, "RD RDMA READ Response Last", Last, true, [Rdeth, Aeth];
    /// RD RDMA READ Response Only.
    RdRdmaReadResponseOnly = 0x50, "RD RDMA READ Response Only", Only, true, [Rdeth, Aeth];
    /// RD Acknowledge.
    RdAcknowledge = 0x51, "RD Acknowledge", None, false, [Rdeth, Aeth];
    /// RD ATOMIC Acknowledge.
    RdAtomicAcknowledge = 0x52, "RD ATOMIC Acknowledge", None, false, [Rdeth, Aeth, AtomicAckEth];
    /// RD CmpSwap.
    RdCompareSwap = 0x53, "RD CmpSwap", None, false, [Rdeth, Deth, AtomicEth];
    /// RD FetchAdd.
    RdFetchAdd = 0x54, "RD FetchAdd", None, false, [Rdeth, Deth, AtomicEth];
    /// RD RESYNC.
    RdResync = 0x55, "RD RESYNC", None, false, [Rdeth, Deth];
    /// UD SEND Only.
    UdSendOnly = 0x64, "UD SEND Only", Only, true, [Deth];
    /// UD SEND Only with Immediate.
    UdSendOnlyImm = 0x65, "UD SEND Only with Immediate", Only, true, [Deth, ImmDt];
    /// RoCEv2 Congestion Notification Packet; its 16 reserved bytes are carried as payload.
    Cnp = 0x81, "CNP", None, true, [];
}

impl Opcode {
    /// The transport service, from the top three bits.
    #[inline]
    pub const fn transport(self) -> Transport {
        match self as u8 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            _ => Transport::Cnp,
        }
    }

    /// Whether the packet is sent by a requester (sends, writes, read requests, atomics,
    /// resync and CNPs).
    pub const fn is_request(self) -> bool {
        !self.is_response()
    }

    /// Whether the packet is sent by a responder (read responses and acknowledgements).
    #[inline]
    pub const fn is_response(self) -> bool {
        matches!(self as u8 & 0xe0, 0x00 | 0x40) && matches!(self as u8 & 0x1f, 0x0d..=0x12)
    }

    /// Whether the opcode carries immediate data (ImmDt).
    pub const fn has_immediate(self) -> bool {
        self.ext_headers().contains(ExtHeader::ImmDt)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), *self as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_from_round_trips_and_rejects_the_rest() {
        let mut known = 0;
        for v in 0..=255u8 {
            match Opcode::try_from(v) {
                Ok(op) => {
                    assert_eq!(u8::from(op), v);
                    known += 1;
                }
                Err(e) => assert_eq!(e, Error::UnknownOpcode(v)),
            }
        }
        assert_eq!(known, Opcode::ALL.len());
        assert_eq!(known, 23 + 12 + 22 + 2 + 1);
    }

    #[test]
    fn table_facts() {
        assert_eq!(Opcode::RcAtomicAcknowledge.ext_headers().len(), 12);
        assert_eq!(Opcode::RcFetchAdd.ext_headers().len(), 28);
        assert_eq!(
            Opcode::UdSendOnlyImm.ext_headers().offset(ExtHeader::ImmDt),
            Some(20)
        );
        assert_eq!(
            Opcode::RdRdmaWriteOnlyImm.ext_headers().len(),
            4 + 8 + 16 + 4
        );
        assert!(Opcode::RcRdmaReadResponseMiddle.is_response());
        assert!(Opcode::RdAtomicAcknowledge.is_response());
        assert!(Opcode::RcRdmaReadRequest.is_request());
        assert!(Opcode::UdSendOnly.is_request());
        assert!(Opcode::UcRdmaWriteLast.is_request());
        assert!(!Opcode::RcRdmaReadRequest.has_payload());
        assert_eq!(Opcode::UcSendOnly.transport(), Transport::Uc);
        assert_eq!(Opcode::RdResync.transport(), Transport::Rd);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert_eq!(
            Opcode::RcSendLastInv.to_string(),
            "RC SEND Last with Invalidate (0x16)"
        );
        for op in Opcode::ALL {
            // Everything after the BTH is in wire order and the headers never overlap.
            let h = op.ext_headers();
            let mut at = 12;
            for x in h.iter() {
                assert_eq!(h.offset(x), Some(at));
                at += x.len();
            }
        }
    }
}
