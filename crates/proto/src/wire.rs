//! Conversion between the transport's [`PacketHeader`] and `rdma-wire`'s [`PacketRepr`], and
//! helpers that emit and parse whole packets (BTH through ICRC).
//!
//! ```
//! use rdma_proto::packet::{Aeth, Opcode, PacketHeader};
//! use rdma_proto::wire::{emit, parse};
//! use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
//! use rdma_wire::packet::IcrcCheck;
//! let encap = Encap::new(IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])), 49152, 4791);
//! let mut h = PacketHeader::new(Opcode::RcSendOnly, 0x12, 7);
//! h.ack_req = true;
//! let mut buf = [0u8; 64];
//! let n = emit(&h, b"hello", &mut buf, Some(&encap)).unwrap();
//! let pkt = parse(&buf[..n], IcrcCheck::Exact(&encap)).unwrap();
//! assert_eq!(pkt.header, h);
//! assert_eq!(pkt.payload, b"hello");
//! buf[14] ^= 1; // corrupt one payload byte: the ICRC catches it
//! assert!(parse(&buf[..n], IcrcCheck::Exact(&encap)).is_err());
//! ```

use crate::packet::{Aeth, AtomicEth, Deth, Opcode, Packet, PacketHeader, Reth};
use rdma_wire::aeth::{AethRepr, AethSyndrome};
use rdma_wire::atomic::{AtomicAckEthRepr, AtomicEthRepr};
use rdma_wire::bth::BthRepr;
use rdma_wire::deth::DethRepr;
use rdma_wire::icrc::Encap;
use rdma_wire::opcode::Opcode as WireOpcode;
use rdma_wire::packet::{IcrcCheck, Packet as WirePacket, PacketRepr};
use rdma_wire::reth::RethRepr;

/// Converts a transport header to the wire crate's representation for a payload of
/// `payload_len` bytes.
pub fn to_repr(h: &PacketHeader, payload_len: usize) -> Result<PacketRepr, rdma_wire::Error> {
    let opcode = WireOpcode::try_from(h.opcode.as_u8())?;
    let mut r = PacketRepr::new(BthRepr {
        opcode,
        se: h.solicited,
        mig_req: h.mig_req,
        pad_cnt: PacketRepr::pad_for(payload_len),
        p_key: h.pkey,
        fecn: false,
        becn: false,
        resv6a: 0,
        dest_qp: h.dest_qp,
        ack_req: h.ack_req,
        resv7: 0,
        psn: h.psn,
    });
    r.deth = h.deth.map(|d| DethRepr {
        q_key: d.qkey,
        resv8: 0,
        src_qp: d.src_qp,
    });
    r.reth = h.reth.map(|x| RethRepr {
        va: x.va,
        r_key: x.rkey,
        dma_len: x.len,
    });
    r.atomic_eth = h.atomic.map(|a| AtomicEthRepr {
        va: a.va,
        r_key: a.rkey,
        swap_add_data: a.swap_add,
        compare_data: a.compare,
    });
    r.aeth = match h.aeth {
        Some(a) => Some(AethRepr {
            syndrome: AethSyndrome::from_byte(a.syndrome)?,
            msn: a.msn,
        }),
        None => None,
    };
    r.atomic_ack_eth = h.atomic_ack.map(|v| AtomicAckEthRepr { orig_rem_dt: v });
    r.imm_dt = h.imm;
    r.ieth = h.ieth;
    Ok(r)
}

/// Converts a parsed wire representation; `None` for opcodes this transport does not handle
/// (UC, RD, CNP, FLUSH, ...) and syndromes it cannot encode.
pub fn from_repr(r: &PacketRepr) -> Option<PacketHeader> {
    let opcode = Opcode::from_u8(u8::from(r.bth.opcode))?;
    let mut h = PacketHeader::new(opcode, r.bth.dest_qp, r.bth.psn);
    h.solicited = r.bth.se;
    h.pkey = r.bth.p_key;
    h.ack_req = r.bth.ack_req;
    h.mig_req = r.bth.mig_req;
    h.deth = r.deth.map(|d| Deth {
        qkey: d.q_key,
        src_qp: d.src_qp,
    });
    h.reth = r.reth.map(|x| Reth {
        va: x.va,
        rkey: x.r_key,
        len: x.dma_len,
    });
    h.atomic = r.atomic_eth.map(|a| AtomicEth {
        va: a.va,
        rkey: a.r_key,
        swap_add: a.swap_add_data,
        compare: a.compare_data,
    });
    h.aeth = match r.aeth {
        Some(a) => Some(Aeth {
            syndrome: a.syndrome.to_byte().ok()?,
            msn: a.msn,
        }),
        None => None,
    };
    h.atomic_ack = r.atomic_ack_eth.map(|a| a.orig_rem_dt);
    h.imm = r.imm_dt;
    h.ieth = r.ieth;
    h.is_consistent().then_some(h)
}

/// Why a received datagram was not handed to the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// The wire crate refused it (truncated, bad ICRC, bad pad, ...).
    Wire(rdma_wire::Error),
    /// A valid packet of a kind this transport does not handle.
    Unsupported,
}

/// Emits headers, payload, pad and ICRC into `out`; returns the length.
pub fn emit(
    h: &PacketHeader,
    payload: &[u8],
    out: &mut [u8],
    encap: Option<&Encap>,
) -> Result<usize, rdma_wire::Error> {
    to_repr(h, payload.len())?.emit(payload, out, encap)
}

/// Parses a datagram (BTH through ICRC), checking the ICRC as `check` says.
pub fn parse<'a>(bytes: &'a [u8], check: IcrcCheck<'_>) -> Result<Packet<'a>, ParseError> {
    let p = WirePacket::new_checked(bytes).map_err(ParseError::Wire)?;
    let r = PacketRepr::parse(&p, check).map_err(ParseError::Wire)?;
    let header = from_repr(&r).ok_or(ParseError::Unsupported)?;
    // validated by the parse above: headers, payload, pad, 4-byte ICRC
    let start = r.header_len();
    let end = bytes.len().saturating_sub(4 + usize::from(r.bth.pad_cnt));
    let payload = bytes.get(start..end).ok_or(ParseError::Unsupported)?;
    Ok(Packet { header, payload })
}
