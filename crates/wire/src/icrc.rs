//! The RoCEv2 invariant CRC (ICRC): the last 4 bytes of every RoCEv2 UDP payload.
//!
//! It is the standard reflected CRC-32 (the one zlib and `crc32fast` compute) over:
//! 8 bytes of `0xFF` (standing for the masked InfiniBand LRH), the IP header with its variant
//! fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label,
//! hop limit), the UDP header with its checksum set to all ones, the BTH with byte 4
//! (FECN/BECN/Resv6a) set to `0xFF`, then everything after the BTH up to the ICRC. The value
//! goes on the wire little-endian. The IPv4 Identification field **is** covered.
//!
//! The IP and UDP length fields are derived from the length of the RoCEv2 payload, so an
//! [`IpInfo`] only holds the invariant fields that cannot be derived. IPv4 headers with
//! options are not supported (Linux rxe assumes a 20-byte header too).
//!
//! ## The IPv4 Identification problem
//!
//! A receiver holding only a UDP socket does not see the IPv4 Identification that the sender's
//! kernel chose (Linux rxe takes it from a per-destination counter, `__ip_select_ident`, so
//! it looks random to the receiver). [`recover_ipv4_identification`] decides whether
//! *some* Identification makes the ICRC valid, using that a CRC is affine: for a fixed length,
//! `crc(id = x) ^ crc(id = 0)` is a linear function of the 16 bits of `x`. [`Ipv4IdSolver`]
//! holds the 16 basis syndromes for one payload length in reduced echelon form, so that
//! solving for `x` is a 16-step elimination over GF(2). A basis syndrome is the CRC of a
//! 14-byte prefix times `x^(8n) mod P` for the `n` bytes that follow, so building a solver
//! costs O(log n), about 1 µs, whatever the length; recovering an Identification costs that
//! plus one ordinary ICRC computation.
//!
//! The price: such a check guards 16 bits fewer. Of the 2^32 possible ICRC values, 2^16 are
//! accepted, so a random corruption passes with probability 2^-16 instead of 2^-32. A single
//! flipped bit is worse: whether some Identification explains it depends only on the bit's
//! place, so about one place in 2^16 bits is always accepted. Ethernet's FCS still protects
//! each hop. Prefer the exact check when the real header is known (a packet socket, or our
//! own sender, which uses Identification 0); `rdma-soft` trusts a recovered Identification
//! only from a source not known to send 0 (its `io/icrc.rs`).

use crate::bth::BTH_LEN;
use crate::{Error, Result};

/// Length of the ICRC in bytes.
pub const ICRC_LEN: usize = 4;

/// IP protocol / next header number of UDP.
pub const IPPROTO_UDP: u8 = 17;

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
/// Offset of the IPv4 Identification in the CRC input (after the 8 bytes of 0xFF).
const ID_AT: usize = 8 + 4;

/// The invariant IPv4 header fields that the ICRC covers and that cannot be derived.
///
/// ```
/// use rdma_wire::icrc::Ipv4Info;
/// let hdr = [0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 2, 192, 0, 2, 3];
/// let ip = Ipv4Info::from_header(&hdr).unwrap();
/// assert_eq!(ip, Ipv4Info { identification: 0x1234, ..Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3]) });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Info {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// Identification.
    pub identification: u16,
    /// Flags (3 bits) and fragment offset (13 bits), as the 16-bit word on the wire.
    pub flags_frag: u16,
    /// Protocol, 17 (UDP).
    pub protocol: u8,
}

impl Ipv4Info {
    /// Don't Fragment, as `flags_frag`.
    pub const DF: u16 = 0x4000;

    /// The header a Linux UDP socket with DF forced sends: Identification 0, DF, UDP.
    pub const fn new(src: [u8; 4], dst: [u8; 4]) -> Self {
        Ipv4Info {
            src,
            dst,
            identification: 0,
            flags_frag: Self::DF,
            protocol: IPPROTO_UDP,
        }
    }

    /// Takes the fields from a raw IPv4 header. [`Error::BadField`] if it is not version 4
    /// or has options (IHL other than 5).
    pub fn from_header(h: &[u8]) -> Result<Self> {
        crate::field::check_len(h, IPV4_LEN)?;
        if h[0] >> 4 != 4 {
            return Err(Error::BadField("ipv4.version"));
        }
        if h[0] & 0xf != 5 {
            return Err(Error::BadField("ipv4.ihl"));
        }
        Ok(Ipv4Info {
            src: [h[12], h[13], h[14], h[15]],
            dst: [h[16], h[17], h[18], h[19]],
            identification: u16::from_be_bytes([h[4], h[5]]),
            flags_frag: u16::from_be_bytes([h[6], h[7]]),
            protocol: h[9],
        })
    }

    fn masked(&self, total_len: u16) -> [u8; IPV4_LEN] {
        let [tl0, tl1] = total_len.to_be_bytes();
        let [id0, id1] = self.identification.to_be_bytes();
        let [ff0, ff1] = self.flags_frag.to_be_bytes();
        let (s, d) = (self.src, self.dst);
        [
            0x45,
            0xff,
            tl0,
            tl1,
            id0,
            id1,
            ff0,
            ff1,
            0xff,
            self.protocol,
            0xff,
            0xff,
            s[0],
            s[1],
            s[2],
            s[3],
            d[0],
            d[1],
            d[2],
            d[3],
        ]
    }
}

/// The invariant IPv6 header fields that the ICRC covers and that cannot be derived.
///
/// ```
/// use rdma_wire::icrc::Ipv6Info;
/// let mut hdr = [0u8; 40];
/// hdr[0] = 0x60;
/// hdr[6] = 17;
/// hdr[23] = 2;
/// hdr[39] = 3;
/// let ip = Ipv6Info::from_header(&hdr).unwrap();
/// assert_eq!((ip.src[15], ip.dst[15], ip.next_header), (2, 3, 17));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Info {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Next header, 17 (UDP).
    pub next_header: u8,
}

impl Ipv6Info {
    /// A UDP header between two addresses.
    pub const fn new(src: [u8; 16], dst: [u8; 16]) -> Self {
        Ipv6Info {
            src,
            dst,
            next_header: IPPROTO_UDP,
        }
    }

    /// Takes the fields from a raw 40-byte IPv6 header; [`Error::BadField`] if not version 6.
    pub fn from_header(h: &[u8]) -> Result<Self> {
        crate::field::check_len(h, IPV6_LEN)?;
        if h[0] >> 4 != 6 {
            return Err(Error::BadField("ipv6.version"));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&h[8..24]);
        dst.copy_from_slice(&h[24..40]);
        Ok(Ipv6Info {
            src,
            dst,
            next_header: h[6],
        })
    }

    fn masked(&self, payload_len: u16) -> [u8; IPV6_LEN] {
        let mut h = [0xffu8; IPV6_LEN];
        h[0] = 0x6f;
        h[4..6].copy_from_slice(&payload_len.to_be_bytes());
        h[6] = self.next_header;
        h[8..24].copy_from_slice(&self.src);
        h[24..40].copy_from_slice(&self.dst);
        h
    }
}

/// The IP header a RoCEv2 datagram travels in, as far as the ICRC needs it.
///
/// ```
/// use rdma_wire::icrc::{IpInfo, Ipv4Info};
/// let hdr = [0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 2, 192, 0, 2, 3];
/// assert_eq!(IpInfo::from_header(&hdr), Ok(IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3]))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpInfo {
    /// IPv4.
    V4(Ipv4Info),
    /// IPv6.
    V6(Ipv6Info),
}

impl IpInfo {
    /// Takes the fields from a raw IPv4 or IPv6 header, by its version nibble.
    pub fn from_header(h: &[u8]) -> Result<Self> {
        match h.first().map(|b| b >> 4) {
            None => Err(Error::Truncated { need: 1, have: 0 }),
            Some(4) => Ipv4Info::from_header(h).map(IpInfo::V4),
            Some(6) => Ipv6Info::from_header(h).map(IpInfo::V6),
            Some(_) => Err(Error::BadField("ip.version")),
        }
    }
}

/// The outer headers of a RoCEv2 datagram as far as the ICRC covers them: IP and UDP ports.
///
/// ```
/// use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
/// let encap = Encap::new(IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])), 49152, 4791);
/// let mut pkt = [0x11, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1, 0, 0, 0, 0];
/// let icrc = encap.compute(&pkt[..16]).unwrap();
/// pkt[16..].copy_from_slice(&icrc.to_le_bytes());
/// assert_eq!(encap.verify(&pkt), Ok(()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encap {
    /// The IP header fields.
    pub ip: IpInfo,
    /// UDP source port.
    pub udp_src: u16,
    /// UDP destination port (4791).
    pub udp_dst: u16,
}

impl Encap {
    /// Bundles the fields.
    pub const fn new(ip: IpInfo, udp_src: u16, udp_dst: u16) -> Self {
        Encap {
            ip,
            udp_src,
            udp_dst,
        }
    }

    /// Takes the fields from raw IP and UDP headers as on the wire.
    pub fn from_headers(ip_header: &[u8], udp_header: &[u8]) -> Result<Self> {
        crate::field::check_len(udp_header, UDP_LEN)?;
        Ok(Encap {
            ip: IpInfo::from_header(ip_header)?,
            udp_src: u16::from_be_bytes([udp_header[0], udp_header[1]]),
            udp_dst: u16::from_be_bytes([udp_header[2], udp_header[3]]),
        })
    }

    /// See [`compute`].
    pub fn compute(&self, payload: &[u8]) -> Result<u32> {
        compute(&self.ip, self.udp_src, self.udp_dst, payload)
    }

    /// See [`verify`].
    pub fn verify(&self, packet: &[u8]) -> Result<()> {
        verify(&self.ip, self.udp_src, self.udp_dst, packet)
    }
}

/// Largest RoCEv2 payload (BTH to ICRC, without the ICRC) whose lengths fit the IP/UDP fields.
pub const MAX_PAYLOAD: usize = u16::MAX as usize - IPV4_LEN - UDP_LEN - ICRC_LEN;

/// Computes the ICRC of a RoCEv2 UDP payload given without its ICRC (`payload` = BTH .. pad).
///
/// Errors: [`Error::Truncated`] if `payload` is shorter than a BTH, [`Error::TooLong`] if the
/// datagram would not fit the IP length fields.
pub fn compute(ip: &IpInfo, udp_src: u16, udp_dst: u16, payload: &[u8]) -> Result<u32> {
    crate::field::check_len(payload, BTH_LEN)?;
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::TooLong {
            field: "RoCEv2 payload",
            max: MAX_PAYLOAD,
            len: payload.len(),
        });
    }
    // Fits: checked above.
    let udp_len = (UDP_LEN + payload.len() + ICRC_LEN) as u16;
    // The masked headers in front of the payload, in one buffer: a CRC call per piece costs
    // more than the piece for small packets. A short packet joins them, for one call in all.
    let mut buf = [0u8; SMALL];
    buf[..8].fill(0xff);
    let mut n = 8;
    match ip {
        IpInfo::V4(v4) => {
            buf[n..n + IPV4_LEN].copy_from_slice(&v4.masked(udp_len + IPV4_LEN as u16));
            n += IPV4_LEN;
        }
        IpInfo::V6(v6) => {
            buf[n..n + IPV6_LEN].copy_from_slice(&v6.masked(udp_len));
            n += IPV6_LEN;
        }
    }
    let [s0, s1] = udp_src.to_be_bytes();
    let [d0, d1] = udp_dst.to_be_bytes();
    let [l0, l1] = udp_len.to_be_bytes();
    buf[n..n + UDP_LEN].copy_from_slice(&[s0, s1, d0, d1, l0, l1, 0xff, 0xff]);
    n += UDP_LEN;
    buf[n..n + BTH_LEN].copy_from_slice(&payload[..BTH_LEN]);
    buf[n + 4] = 0xff;
    n += BTH_LEN;
    let rest = &payload[BTH_LEN..];
    if n + rest.len() <= SMALL {
        buf[n..n + rest.len()].copy_from_slice(rest);
        return Ok(crc32fast::hash(&buf[..n + rest.len()]));
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..n]);
    h.update(rest);
    Ok(h.finalize())
}

/// Packets up to this many bytes with their masked headers take one CRC call.
const SMALL: usize = 256;

/// The ICRC stored at the end of `packet` (the last 4 bytes, little-endian).
pub fn stored(packet: &[u8]) -> Result<u32> {
    crate::field::check_len(packet, ICRC_LEN)?;
    let n = packet.len();
    Ok(u32::from_le_bytes([
        packet[n - 4],
        packet[n - 3],
        packet[n - 2],
        packet[n - 1],
    ]))
}

/// Checks the ICRC at the end of a whole RoCEv2 UDP payload; [`Error::BadIcrc`] if it is wrong.
pub fn verify(ip: &IpInfo, udp_src: u16, udp_dst: u16, packet: &[u8]) -> Result<()> {
    crate::field::check_len(packet, BTH_LEN + ICRC_LEN)?;
    let found = stored(packet)?;
    let computed = compute(ip, udp_src, udp_dst, &packet[..packet.len() - ICRC_LEN])?;
    if found == computed {
        Ok(())
    } else {
        Err(Error::BadIcrc { found, computed })
    }
}

/// Solves for the IPv4 Identification that makes an ICRC valid, for one payload length.
///
/// ```
/// use rdma_wire::icrc::{self, IpInfo, Ipv4Info, Ipv4IdSolver};
/// let sent = Ipv4Info { identification: 0xbeef, ..Ipv4Info::new([192, 0, 2, 3], [192, 0, 2, 2]) };
/// let mut pkt = [0x11, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1, 0, 0, 0, 0];
/// let crc = icrc::compute(&IpInfo::V4(sent), 49152, 4791, &pkt[..16]).unwrap();
/// pkt[16..].copy_from_slice(&crc.to_le_bytes());
/// // The receiver does not know the Identification: it tries with 0 and solves.
/// let guess = Ipv4Info { identification: 0, ..sent };
/// assert_eq!(icrc::recover_ipv4_identification(&guess, 49152, 4791, &pkt), Ok(0xbeef));
/// let solver = Ipv4IdSolver::new(16).unwrap();
/// let with0 = icrc::compute(&IpInfo::V4(guess), 49152, 4791, &pkt[..16]).unwrap();
/// assert_eq!(solver.solve(crc ^ with0), Some(0xbeef));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdSolver {
    payload_len: usize,
    /// Reduced basis: (syndrome vector, combination of Identification bits, pivot bit mask).
    rows: [(u32, u16, u32); 16],
    rank: usize,
}

impl Ipv4IdSolver {
    /// Precomputes the 16 basis syndromes for RoCEv2 payloads of `payload_len` bytes
    /// (without the ICRC). [`Error::TooLong`] if the length cannot be carried by IPv4.
    pub fn new(payload_len: usize) -> Result<Self> {
        if payload_len > MAX_PAYLOAD {
            return Err(Error::TooLong {
                field: "RoCEv2 payload",
                max: MAX_PAYLOAD,
                len: payload_len,
            });
        }
        // Bytes of CRC input after the Identification: rest of IPv4 (6), UDP (8), payload.
        let trailing = IPV4_LEN - 6 + UDP_LEN + payload_len;
        // crc(A || 0^n) = x^(8n) * crc(A) + crc(0^n) (mod P), so the syndrome of id bit i is
        // x^(8n) * (crc(prefix with bit i) ^ crc(prefix with 0)): O(log n), not O(n).
        let shift = x_pow_8n(trailing);
        let zero = crc_prefix(0);
        let mut solver = Ipv4IdSolver {
            payload_len,
            rows: [(0, 0, 0); 16],
            rank: 0,
        };
        for bit in 0..16 {
            solver.insert(mul_mod_p(shift, crc_prefix(1 << bit) ^ zero), 1 << bit);
        }
        Ok(solver)
    }

    /// The payload length this solver is for.
    pub const fn payload_len(&self) -> usize {
        self.payload_len
    }

    fn insert(&mut self, mut v: u32, mut mask: u16) {
        for &(rv, rm, pivot) in &self.rows[..self.rank] {
            if v & pivot != 0 {
                v ^= rv;
                mask ^= rm;
            }
        }
        if v == 0 || self.rank == self.rows.len() {
            return;
        }
        let pivot = v & v.wrapping_neg();
        for row in &mut self.rows[..self.rank] {
            if row.0 & pivot != 0 {
                row.0 ^= v;
                row.1 ^= mask;
            }
        }
        self.rows[self.rank] = (v, mask, pivot);
        self.rank += 1;
    }

    /// The Identification `x` with `icrc(id = x) ^ icrc(id = 0) == syndrome`, if there is one
    /// (there is at most one: CRC-32 detects every burst of 16 bits).
    pub fn solve(&self, syndrome: u32) -> Option<u16> {
        let mut v = syndrome;
        let mut mask = 0u16;
        for &(rv, rm, pivot) in &self.rows[..self.rank] {
            if v & pivot != 0 {
                v ^= rv;
                mask ^= rm;
            }
        }
        (v == 0).then_some(mask)
    }
}

/// CRC of the first 14 bytes of CRC input with everything zero but the Identification.
fn crc_prefix(id: u16) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0; ID_AT]);
    h.update(&id.to_be_bytes());
    h.finalize()
}

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xedb8_8320;

/// `a * b mod P` for polynomials over GF(2) in the reflected representation (bit 31 is x^0).
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut m = 1u32 << 31;
    while m != 0 {
        if a & m != 0 {
            product ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `X8[k] = x^(8 * 2^k) mod P`, for lengths below 2^32 bytes.
const X8: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut p = 1u32 << 30; // x^1
    p = mul_mod_p(p, p);
    p = mul_mod_p(p, p);
    p = mul_mod_p(p, p); // x^8
    let mut k = 0;
    while k < 32 {
        t[k] = p;
        p = mul_mod_p(p, p);
        k += 1;
    }
    t
};

/// `x^(8n) mod P`: the effect of `n` zero bytes on a CRC (`n` < 2^32).
fn x_pow_8n(n: usize) -> u32 {
    let mut acc = 1u32 << 31; // x^0
    for (k, &x) in X8.iter().enumerate() {
        if (n >> k) & 1 != 0 {
            acc = mul_mod_p(acc, x);
        }
    }
    acc
}

/// For a received IPv4 RoCEv2 packet whose Identification is unknown (`ip.identification` is
/// ignored), returns the Identification that makes its ICRC valid, or [`Error::BadIcrc`]
/// (with the ICRC computed for Identification 0) if none does. See the module docs for what
/// this costs in protection.
pub fn recover_ipv4_identification(
    ip: &Ipv4Info,
    udp_src: u16,
    udp_dst: u16,
    packet: &[u8],
) -> Result<u16> {
    crate::field::check_len(packet, BTH_LEN + ICRC_LEN)?;
    let found = stored(packet)?;
    let body = &packet[..packet.len() - ICRC_LEN];
    let zero_id = IpInfo::V4(Ipv4Info {
        identification: 0,
        ..*ip
    });
    let computed = compute(&zero_id, udp_src, udp_dst, body)?;
    Ipv4IdSolver::new(body.len())?
        .solve(found ^ computed)
        .ok_or(Error::BadIcrc { found, computed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // write-imm frame 4 style: an RC ACK between 192.0.2.3 and 192.0.2.2.
    fn v4(id: u16) -> IpInfo {
        IpInfo::V4(Ipv4Info {
            identification: id,
            ..Ipv4Info::new([192, 0, 2, 3], [192, 0, 2, 2])
        })
    }

    #[test]
    fn rxe_seed_is_the_state_after_eight_ff() {
        // rxe starts from 0xdebb20e3, which is the raw CRC register after 8 bytes of 0xFF.
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(!h.finalize(), 0xdebb_20e3);
    }

    #[test]
    fn masked_fields_do_not_matter_and_covered_ones_do() {
        let mut pkt = [0u8; 20];
        pkt[0] = 0x11;
        pkt[12] = 0x1f;
        let base = compute(&v4(7), 1, 4791, &pkt[..16]).unwrap();
        pkt[4] = 0xc0; // FECN/BECN
        assert_eq!(compute(&v4(7), 1, 4791, &pkt[..16]).unwrap(), base);
        assert_ne!(compute(&v4(8), 1, 4791, &pkt[..16]).unwrap(), base);
        assert_ne!(compute(&v4(7), 2, 4791, &pkt[..16]).unwrap(), base);
        pkt[5] = 1;
        assert_ne!(compute(&v4(7), 1, 4791, &pkt[..16]).unwrap(), base);
    }

    #[test]
    fn errors() {
        assert_eq!(
            compute(&v4(0), 1, 2, &[0; 11]),
            Err(Error::Truncated { need: 12, have: 11 })
        );
        assert_eq!(
            verify(&v4(0), 1, 2, &[0; 15]),
            Err(Error::Truncated { need: 16, have: 15 })
        );
        assert!(matches!(
            verify(&v4(0), 1, 2, &[0; 16]),
            Err(Error::BadIcrc { found: 0, .. })
        ));
        assert!(matches!(
            Ipv4IdSolver::new(70_000),
            Err(Error::TooLong { .. })
        ));
        assert_eq!(
            IpInfo::from_header(&[]),
            Err(Error::Truncated { need: 1, have: 0 })
        );
        assert_eq!(
            IpInfo::from_header(&[0x50; 40]),
            Err(Error::BadField("ip.version"))
        );
        let mut opts = [0u8; 24];
        opts[0] = 0x46;
        assert_eq!(IpInfo::from_header(&opts), Err(Error::BadField("ipv4.ihl")));
        assert_eq!(
            Ipv6Info::from_header(&[0x45; 40]),
            Err(Error::BadField("ipv6.version"))
        );
        assert!(Encap::from_headers(&opts, &[0; 7]).is_err());
    }

    /// The slow, obvious way: CRC of 12 zero bytes, `id`, `trailing` zero bytes.
    fn crc_with_id(id: u16, trailing: usize) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&[0; ID_AT]);
        h.update(&id.to_be_bytes());
        h.update(&vec![0; trailing]);
        h.finalize()
    }

    #[test]
    fn fast_basis_matches_direct_crc() {
        for len in [12, 13, 100, 1036, 4124, MAX_PAYLOAD] {
            let trailing = IPV4_LEN - 6 + UDP_LEN + len;
            let zero = crc_with_id(0, trailing);
            let solver = Ipv4IdSolver::new(len).unwrap();
            for bit in 0..16 {
                let syndrome = crc_with_id(1 << bit, trailing) ^ zero;
                assert_eq!(
                    solver.solve(syndrome),
                    Some(1 << bit),
                    "len {len} bit {bit}"
                );
            }
            let both = crc_with_id(0xa5a5, trailing) ^ zero;
            assert_eq!(solver.solve(both), Some(0xa5a5));
        }
    }

    #[test]
    fn solver_has_full_rank_for_many_lengths() {
        for len in [12, 16, 13, 100, 1036, 4096 + 28, MAX_PAYLOAD] {
            let s = Ipv4IdSolver::new(len).unwrap();
            assert_eq!(s.rank, 16, "len {len}");
            assert_eq!(s.solve(0), Some(0));
        }
    }

    proptest! {
        #[test]
        fn recovers_any_identification(id in any::<u16>(), body in proptest::collection::vec(any::<u8>(), 12..300)) {
            let crc = compute(&v4(id), 50000, 4791, &body).unwrap();
            let mut pkt = body.clone();
            pkt.extend_from_slice(&crc.to_le_bytes());
            prop_assert_eq!(verify(&v4(id), 50000, 4791, &pkt), Ok(()));
            let IpInfo::V4(guess) = v4(id.wrapping_add(1)) else { unreachable!() };
            prop_assert_eq!(recover_ipv4_identification(&guess, 50000, 4791, &pkt), Ok(id));
            // Corrupt one payload bit: only 2^-16 of such errors could be explained by an id.
            let last = pkt.len() - 5;
            pkt[last] ^= 1;
            prop_assert!(verify(&v4(id), 50000, 4791, &pkt).is_err());
        }
    }
}
