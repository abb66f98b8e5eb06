//! Emitting and parsing whole packets (BTH through ICRC) for the transport, on top of
//! `rdma-wire`'s [`PacketRepr`]: [`emit`] derives the pad count from the payload, [`parse`]
//! slices the payload out and refuses opcodes this transport does not handle.
//!
//! ```
//! use rdma_proto::packet::header;
//! use rdma_proto::wire::{emit, parse};
//! use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
//! use rdma_wire::opcode::Opcode;
//! use rdma_wire::packet::IcrcCheck;
//! let encap = Encap::new(IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])), 49152, 4791);
//! let mut h = header(Opcode::RcSendOnly, 0x12, 7);
//! h.bth.ack_req = true;
//! let mut buf = [0u8; 64];
//! let n = emit(&h, b"hello", &mut buf, Some(&encap)).unwrap();
//! let pkt = parse(&buf[..n], IcrcCheck::Exact(&encap)).unwrap();
//! h.bth.pad_cnt = 3; // emit wrote the pad count for the 5-byte payload
//! assert_eq!(pkt.header, h);
//! assert_eq!(pkt.payload, b"hello");
//! buf[14] ^= 1; // corrupt one payload byte: the ICRC catches it
//! assert!(parse(&buf[..n], IcrcCheck::Exact(&encap)).is_err());
//! ```

use crate::packet::Packet;
use rdma_wire::icrc::Encap;
use rdma_wire::opcode::{Opcode, Transport};
use rdma_wire::packet::{IcrcCheck, Packet as WirePacket, PacketRepr};

/// Whether this transport handles packets with `opcode`: the RC and UD opcodes (not UC, RD
/// or CNP). [`parse`] refuses the others with [`ParseError::Unsupported`].
///
/// ```
/// use rdma_proto::wire::is_supported;
/// use rdma_wire::opcode::Opcode;
/// assert!(is_supported(Opcode::RcFetchAdd) && is_supported(Opcode::UdSendOnlyImm));
/// assert!(!is_supported(Opcode::UcSendOnly) && !is_supported(Opcode::Cnp));
/// ```
pub const fn is_supported(opcode: Opcode) -> bool {
    matches!(opcode.transport(), Transport::Rc | Transport::Ud)
}

/// Why a received datagram was not handed to the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// The wire crate refused it (truncated, bad ICRC, bad pad, ...).
    Wire(rdma_wire::Error),
    /// A valid packet of a kind this transport does not handle.
    Unsupported,
}

/// Emits headers, payload, pad and ICRC into `out`; returns the length. The pad count of
/// `h` is ignored: the one `payload` needs is written.
pub fn emit(
    h: &PacketRepr,
    payload: &[u8],
    out: &mut [u8],
    encap: Option<&Encap>,
) -> Result<usize, rdma_wire::Error> {
    with_pad(h, payload.len(), |h| h.emit(payload, out, encap))
}

/// [`emit`] around a payload of `payload_len` bytes already at `out[h.header_len()..]`
/// (the transport gathered it there): headers, pad and ICRC, no payload copy.
pub fn emit_in_place(
    h: &PacketRepr,
    payload_len: usize,
    out: &mut [u8],
    encap: Option<&Encap>,
) -> Result<usize, rdma_wire::Error> {
    with_pad(h, payload_len, |h| h.emit_in_place(payload_len, out, encap))
}

/// `f` of `h` with the pad count a payload of `payload_len` bytes needs (most payloads: `h`
/// itself, no copy of the headers to set it).
fn with_pad<R>(h: &PacketRepr, payload_len: usize, f: impl FnOnce(&PacketRepr) -> R) -> R {
    let pad = PacketRepr::pad_for(payload_len);
    if h.bth.pad_cnt == pad {
        return f(h);
    }
    let mut r = *h;
    r.bth.pad_cnt = pad;
    f(&r)
}

/// Parses a datagram (BTH through ICRC), checking the ICRC as `check` says.
pub fn parse<'a>(bytes: &'a [u8], check: IcrcCheck<'_>) -> Result<Packet<'a>, ParseError> {
    // PacketRepr::parse checks the layout itself: new_checked would do it twice
    let p = WirePacket::new_unchecked(bytes);
    let header = PacketRepr::parse(&p, check).map_err(ParseError::Wire)?;
    if !is_supported(header.bth.opcode) {
        return Err(ParseError::Unsupported);
    }
    // validated by the parse above: headers, payload, pad, 4-byte ICRC
    let start = header.header_len();
    let end = bytes
        .len()
        .saturating_sub(4 + usize::from(header.bth.pad_cnt));
    let payload = bytes.get(start..end).ok_or(ParseError::Unsupported)?;
    Ok(Packet { header, payload })
}
