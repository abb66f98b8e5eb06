//! A whole RoCEv2 UDP payload: BTH, the extended headers its opcode calls for, payload, pad
//! and ICRC.
//!
//! [`Packet`] is a zero-copy view; [`PacketRepr`] names the opcode's headers as values, and
//! its [`emit`](PacketRepr::emit) writes headers, payload, zero pad bytes and the ICRC.
//!
//! Validation on parse ([`Packet::new_checked`], [`PacketRepr::parse`]): a known opcode
//! ([`Error::UnknownOpcode`]), TVer 0 ([`Error::BadTransportVersion`]), room for every header
//! the opcode needs plus the ICRC ([`Error::Truncated`]), a pad count no larger than the bytes
//! between the headers and the ICRC ([`Error::BadPadCount`]), and those bytes a multiple of 4,
//! and none at all for opcodes without payload ([`Error::BadPayloadLength`]). The contents of
//! the pad bytes are not checked (they are covered by the ICRC); emit writes zeros.

use crate::aeth::{Aeth, AethRepr};
use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::bth::{Bth, BthRepr, BTH_LEN};
use crate::deth::{Deth, DethRepr};
use crate::icrc::{self, Encap, ICRC_LEN};
use crate::imm::{Ieth, IethRepr, ImmDt, ImmDtRepr};
use crate::opcode::{ExtHeader, ExtHeaders, Opcode};
use crate::rdeth::{Rdeth, RdethRepr};
use crate::reth::{Reth, RethRepr};
use crate::{Error, Result};

/// How a parser checks the ICRC.
///
/// ```
/// use rdma_wire::packet::IcrcCheck;
/// let check = IcrcCheck::Skip;
/// assert_eq!(check, IcrcCheck::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcCheck<'a> {
    /// Do not check it.
    #[default]
    Skip,
    /// Check it against these outer headers.
    Exact(&'a Encap),
    /// IPv4 only: the Identification in `Encap` is unknown; accept the packet if some
    /// Identification makes the ICRC valid (see [`icrc::recover_ipv4_identification`]; this
    /// guards 16 bits fewer). For IPv6 this is the same as `Exact`.
    AnyIpv4Id(&'a Encap),
}

/// Where the parts of a packet lie.
#[derive(Debug, Clone, Copy)]
struct Layout {
    headers: ExtHeaders,
    payload_start: usize,
    payload_end: usize,
    icrc_start: usize,
}

fn layout(b: &[u8]) -> Result<Layout> {
    crate::field::check_len(b, BTH_LEN + ICRC_LEN)?;
    let bth = Bth::new_unchecked(b);
    let opcode = Opcode::try_from(bth.opcode())?;
    if bth.tver() != 0 {
        return Err(Error::BadTransportVersion(bth.tver()));
    }
    let headers = opcode.ext_headers();
    let payload_start = BTH_LEN + headers.len();
    crate::field::check_len(b, payload_start + ICRC_LEN)?;
    let icrc_start = b.len() - ICRC_LEN;
    let area = icrc_start - payload_start;
    let pad = usize::from(bth.pad_cnt());
    if pad > area {
        return Err(Error::BadPadCount(bth.pad_cnt()));
    }
    if area % 4 != 0 || (area > 0 && !opcode.has_payload()) {
        return Err(Error::BadPayloadLength {
            opcode: opcode.into(),
            len: area,
        });
    }
    Ok(Layout {
        headers,
        payload_start,
        payload_end: icrc_start - pad,
        icrc_start,
    })
}

/// A zero-copy view of a RoCEv2 UDP payload (BTH through ICRC).
///
/// ```
/// use rdma_wire::packet::Packet;
/// use rdma_wire::opcode::Opcode;
/// // An RC ACK: BTH, AETH (ACK, credits invalid, MSN 1), ICRC.
/// let bytes = [0x11, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 9, 0x1f, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd];
/// let pkt = Packet::new_checked(&bytes[..]).unwrap();
/// assert_eq!(pkt.opcode(), Ok(Opcode::RcAcknowledge));
/// assert_eq!(pkt.aeth().unwrap().msn(), 1);
/// assert!(pkt.payload().is_empty());
/// assert_eq!(pkt.icrc(), 0xddcc_bbaa);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without validating it. Accessors never panic: on a malformed buffer the
    /// header getters return `None` and the slices are empty.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a buffer after validating its layout (see the module docs).
    pub fn new_checked(buffer: T) -> Result<Self> {
        layout(buffer.as_ref())?;
        Ok(Packet { buffer })
    }

    /// Validates the layout of the buffer (what [`new_checked`](Self::new_checked) does).
    pub fn check_len(&self) -> Result<()> {
        layout(self.buffer.as_ref()).map(|_| ())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole buffer.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The BTH; `None` if the buffer is shorter than a BTH.
    pub fn bth(&self) -> Option<Bth<&[u8]>> {
        Bth::new_checked(self.buffer.as_ref()).ok()
    }

    /// The BTH opcode; [`Error::Truncated`] or [`Error::UnknownOpcode`].
    pub fn opcode(&self) -> Result<Opcode> {
        match self.buffer.as_ref().first() {
            Some(&op) => Opcode::try_from(op),
            None => Err(Error::Truncated {
                need: BTH_LEN,
                have: 0,
            }),
        }
    }

    /// The bytes of extended header `h`, if the packet is valid and its opcode has one.
    pub fn ext_header(&self, h: ExtHeader) -> Option<&[u8]> {
        let l = layout(self.buffer.as_ref()).ok()?;
        let at = l.headers.offset(h)?;
        self.buffer.as_ref().get(at..at + h.len())
    }

    /// The RDETH, if any.
    pub fn rdeth(&self) -> Option<Rdeth<&[u8]>> {
        self.ext_header(ExtHeader::Rdeth).map(Rdeth::new_unchecked)
    }

    /// The DETH, if any.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.ext_header(ExtHeader::Deth).map(Deth::new_unchecked)
    }

    /// The RETH, if any.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.ext_header(ExtHeader::Reth).map(Reth::new_unchecked)
    }

    /// The AtomicETH, if any.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.ext_header(ExtHeader::AtomicEth)
            .map(AtomicEth::new_unchecked)
    }

    /// The AETH, if any.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.ext_header(ExtHeader::Aeth).map(Aeth::new_unchecked)
    }

    /// The AtomicAckETH, if any.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.ext_header(ExtHeader::AtomicAckEth)
            .map(AtomicAckEth::new_unchecked)
    }

    /// The ImmDt header, if any.
    pub fn imm_dt(&self) -> Option<ImmDt<&[u8]>> {
        self.ext_header(ExtHeader::ImmDt).map(ImmDt::new_unchecked)
    }

    /// The IETH, if any.
    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.ext_header(ExtHeader::Ieth).map(Ieth::new_unchecked)
    }

    /// The payload, pad bytes excluded (empty if the packet is malformed).
    pub fn payload(&self) -> &[u8] {
        match layout(self.buffer.as_ref()) {
            Ok(l) => &self.buffer.as_ref()[l.payload_start..l.payload_end],
            Err(_) => &[],
        }
    }

    /// The pad bytes (empty if the packet is malformed).
    pub fn pad(&self) -> &[u8] {
        match layout(self.buffer.as_ref()) {
            Ok(l) => &self.buffer.as_ref()[l.payload_end..l.icrc_start],
            Err(_) => &[],
        }
    }

    /// The ICRC carried in the last 4 bytes, as a CRC value (stored little-endian); 0 if the
    /// buffer is shorter than 4 bytes.
    pub fn icrc(&self) -> u32 {
        icrc::stored(self.buffer.as_ref()).unwrap_or(0)
    }

    /// Checks the ICRC as `check` says.
    pub fn check_icrc(&self, check: IcrcCheck<'_>) -> Result<()> {
        let b = self.buffer.as_ref();
        match check {
            IcrcCheck::Skip => Ok(()),
            IcrcCheck::Exact(encap) => encap.verify(b),
            IcrcCheck::AnyIpv4Id(encap) => match &encap.ip {
                icrc::IpInfo::V4(v4) => {
                    icrc::recover_ipv4_identification(v4, encap.udp_src, encap.udp_dst, b)
                        .map(|_| ())
                }
                icrc::IpInfo::V6(_) => encap.verify(b),
            },
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The payload, mutable (empty if the packet is malformed).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match layout(self.buffer.as_ref()) {
            Ok(l) => &mut self.buffer.as_mut()[l.payload_start..l.payload_end],
            Err(_) => &mut [],
        }
    }

    /// Stores `icrc` in the last 4 bytes (little-endian); no-op on a buffer shorter than 4.
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        if let Some(at) = b.len().checked_sub(ICRC_LEN) {
            b[at..].copy_from_slice(&icrc.to_le_bytes());
        }
    }

    /// Computes the ICRC over everything before it and stores it.
    pub fn fill_icrc(&mut self, encap: &Encap) -> Result<()> {
        let b = self.buffer.as_ref();
        crate::field::check_len(b, BTH_LEN + ICRC_LEN)?;
        let crc = encap.compute(&b[..b.len() - ICRC_LEN])?;
        self.set_icrc(crc);
        Ok(())
    }
}

/// The headers of one RoCEv2 packet: the BTH and exactly the extended headers its opcode
/// calls for.
///
/// ```
/// use rdma_wire::bth::BthRepr;
/// use rdma_wire::deth::DethRepr;
/// use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
/// use rdma_wire::opcode::Opcode;
/// use rdma_wire::packet::{IcrcCheck, Packet, PacketRepr};
///
/// let bth = BthRepr {
///     opcode: Opcode::UdSendOnly, se: false, mig_req: false, pad_cnt: PacketRepr::pad_for(5),
///     p_key: 0xffff, fecn: false, becn: false, resv6a: 0, dest_qp: 1, ack_req: false, resv7: 0,
///     psn: 0,
/// };
/// let repr = PacketRepr { deth: Some(DethRepr { q_key: 0x8001_0000, resv8: 0, src_qp: 1 }), ..PacketRepr::new(bth) };
/// let encap = Encap::new(IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])), 49152, 4791);
/// let mut buf = [0u8; 64];
/// let n = repr.emit(b"hello", &mut buf, Some(&encap)).unwrap();
/// assert_eq!(n, 12 + 8 + 5 + 3 + 4);
/// let pkt = Packet::new_checked(&buf[..n]).unwrap();
/// assert_eq!(pkt.payload(), b"hello");
/// assert_eq!(PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap)), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// BTH.
    pub bth: BthRepr,
    /// RDETH (RD).
    pub rdeth: Option<RdethRepr>,
    /// DETH (UD, RD requests).
    pub deth: Option<DethRepr>,
    /// RETH (RDMA WRITE First/Only, RDMA READ Request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (acknowledgements, READ responses First/Last/Only).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC Acknowledge).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt: immediate data (the "with Immediate" opcodes).
    pub imm_dt: Option<u32>,
    /// IETH: the R_Key to invalidate (the "with Invalidate" opcodes).
    pub ieth: Option<u32>,
}

impl PacketRepr {
    /// A packet with `bth` and no extended header; fill in the ones its opcode needs.
    pub const fn new(bth: BthRepr) -> Self {
        PacketRepr {
            bth,
            rdeth: None,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm_dt: None,
            ieth: None,
        }
    }

    /// The pad count for a payload of `payload_len` bytes.
    pub const fn pad_for(payload_len: usize) -> u8 {
        ((4 - payload_len % 4) % 4) as u8
    }

    /// Parses the headers of a packet (validating its layout), checking the ICRC as `icrc`
    /// says. The payload is [`Packet::payload`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>, icrc: IcrcCheck<'_>) -> Result<Self> {
        let b = packet.buffer.as_ref();
        let l = layout(b)?;
        packet.check_icrc(icrc)?;
        let mut repr = PacketRepr::new(BthRepr::parse(&Bth::new_unchecked(b))?);
        // the present headers in order, each read once (the layout checked their room)
        let mut at = BTH_LEN;
        for h in l.headers.iter() {
            let s = &b[at..at + h.len()];
            at += h.len();
            match h {
                ExtHeader::Rdeth => repr.rdeth = Some(RdethRepr::parse(&Rdeth::new_unchecked(s))?),
                ExtHeader::Deth => repr.deth = Some(DethRepr::parse(&Deth::new_unchecked(s))?),
                ExtHeader::Reth => repr.reth = Some(RethRepr::parse(&Reth::new_unchecked(s))?),
                ExtHeader::AtomicEth => {
                    repr.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(s))?)
                }
                ExtHeader::Aeth => repr.aeth = Some(AethRepr::parse(&Aeth::new_unchecked(s))?),
                ExtHeader::AtomicAckEth => {
                    repr.atomic_ack_eth =
                        Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(s))?)
                }
                ExtHeader::ImmDt => {
                    repr.imm_dt = Some(ImmDtRepr::parse(&ImmDt::new_unchecked(s))?.imm_dt)
                }
                ExtHeader::Ieth => {
                    repr.ieth = Some(IethRepr::parse(&Ieth::new_unchecked(s))?.r_key)
                }
            }
        }
        Ok(repr)
    }

    /// Length of the BTH and extended headers.
    #[inline]
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.bth.opcode.ext_headers().len()
    }

    /// Length of the emitted packet with a payload of `payload_len` bytes: headers, payload,
    /// pad and ICRC.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + usize::from(Self::pad_for(payload_len)) + ICRC_LEN
    }

    /// Checks that exactly the extended headers the opcode calls for are present.
    #[inline]
    pub fn check_headers(&self) -> Result<()> {
        let want = self.bth.opcode.ext_headers();
        let present = [
            self.rdeth.is_some(),
            self.deth.is_some(),
            self.reth.is_some(),
            self.atomic_eth.is_some(),
            self.aeth.is_some(),
            self.atomic_ack_eth.is_some(),
            self.imm_dt.is_some(),
            self.ieth.is_some(),
        ];
        // bit k: ExtHeader::ALL[k]
        let bits = present
            .iter()
            .enumerate()
            .fold(0u8, |b, (k, &p)| b | (u8::from(p) << k));
        // the first header (in wire order) present without the opcode calling for it, or
        // the other way round
        match bits ^ want.bits() {
            0 => Ok(()),
            diff => Err(Error::HeaderMismatch {
                opcode: self.bth.opcode.into(),
                header: ExtHeader::ALL[diff.trailing_zeros() as usize].name(),
            }),
        }
    }

    /// Writes headers, `payload`, zero pad bytes and the ICRC (computed over `encap`, or 0
    /// when `encap` is `None`) to the start of `buf`; returns the number of bytes written.
    ///
    /// Errors: [`Error::HeaderMismatch`] if the headers do not match the opcode,
    /// [`Error::BadPayloadLength`] for a payload on an opcode without one,
    /// [`Error::BadPadCount`] if `bth.pad_cnt` is not [`pad_for`](Self::pad_for) the payload,
    /// [`Error::BadField`] for a field too wide for its bits, [`Error::BufferTooSmall`].
    pub fn emit(&self, payload: &[u8], buf: &mut [u8], encap: Option<&Encap>) -> Result<usize> {
        let need = self.check_emit(payload.len(), buf.len())?;
        let start = self.header_len();
        buf[start..start + payload.len()].copy_from_slice(payload);
        self.emit_around(payload.len(), &mut buf[..need], encap)
    }

    /// [`PacketRepr::emit`] around a payload of `payload_len` bytes that is in place already,
    /// at `buf[self.header_len()..]`: writes the headers before it and the pad and ICRC
    /// after it, and returns the length. The payload is not copied.
    ///
    /// ```
    /// use rdma_wire::packet::{IcrcCheck, Packet, PacketRepr};
    ///
    /// // an RC SEND_ONLY of "hello" (pad 3) to QP 0x11, PSN 9
    /// let mut bytes = vec![0x04, 0x30, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 9];
    /// bytes.extend_from_slice(b"hello\0\0\0\0\0\0\0");
    /// let pkt = Packet::new_checked(&bytes[..]).unwrap();
    /// let h = PacketRepr::parse(&pkt, IcrcCheck::Skip).unwrap();
    /// let mut buf = [0u8; 64];
    /// buf[12..17].copy_from_slice(b"hello");
    /// let n = h.emit_in_place(5, &mut buf, None).unwrap();
    /// let mut copy = [0u8; 64];
    /// assert_eq!(h.emit(b"hello", &mut copy, None).unwrap(), n);
    /// assert_eq!(buf[..n], copy[..n]);
    /// ```
    pub fn emit_in_place(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        encap: Option<&Encap>,
    ) -> Result<usize> {
        let need = self.check_emit(payload_len, buf.len())?;
        self.emit_around(payload_len, &mut buf[..need], encap)
    }

    /// Checks that the headers, a payload of `payload_len` bytes and its pad count make a
    /// packet that fits in `have` bytes; returns its length.
    fn check_emit(&self, payload_len: usize, have: usize) -> Result<usize> {
        self.check_headers()?;
        let opcode = self.bth.opcode;
        if !opcode.has_payload() && payload_len != 0 {
            return Err(Error::BadPayloadLength {
                opcode: opcode.into(),
                len: payload_len,
            });
        }
        if self.bth.pad_cnt != Self::pad_for(payload_len) {
            return Err(Error::BadPadCount(self.bth.pad_cnt));
        }
        let need = self.buffer_len(payload_len);
        if have < need {
            return Err(Error::BufferTooSmall { need, have });
        }
        Ok(need)
    }

    /// The headers, pad and ICRC around a payload in place; `buf` is the whole packet,
    /// checked by [`PacketRepr::check_emit`].
    fn emit_around(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        encap: Option<&Encap>,
    ) -> Result<usize> {
        let need = buf.len();
        let opcode = self.bth.opcode;
        self.bth.emit(&mut Bth::new_unchecked(&mut *buf))?;
        let headers = opcode.ext_headers();
        if let Some(r) = &self.rdeth {
            r.emit(&mut Rdeth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::Rdeth,
            )))?;
        }
        if let Some(r) = &self.deth {
            r.emit(&mut Deth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::Deth,
            )))?;
        }
        if let Some(r) = &self.reth {
            r.emit(&mut Reth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::Reth,
            )))?;
        }
        if let Some(r) = &self.atomic_eth {
            r.emit(&mut AtomicEth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::AtomicEth,
            )))?;
        }
        if let Some(r) = &self.aeth {
            r.emit(&mut Aeth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::Aeth,
            )))?;
        }
        if let Some(r) = &self.atomic_ack_eth {
            r.emit(&mut AtomicAckEth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::AtomicAckEth,
            )))?;
        }
        if let Some(v) = self.imm_dt {
            ImmDtRepr { imm_dt: v }.emit(&mut ImmDt::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::ImmDt,
            )))?;
        }
        if let Some(v) = self.ieth {
            IethRepr { r_key: v }.emit(&mut Ieth::new_unchecked(slot(
                buf,
                headers,
                ExtHeader::Ieth,
            )))?;
        }
        let end = self.header_len() + payload_len;
        buf[end..need - ICRC_LEN].fill(0);
        let crc = match encap {
            Some(e) => e.compute(&buf[..need - ICRC_LEN])?,
            None => 0,
        };
        buf[need - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Ok(need)
    }
}

/// The bytes of header `h` in an emit buffer long enough for every header of `headers`.
fn slot(buf: &mut [u8], headers: ExtHeaders, h: ExtHeader) -> &mut [u8] {
    let at = headers.offset(h).unwrap_or(BTH_LEN);
    &mut buf[at..at + h.len()]
}

#[cfg(test)]
mod tests;
