//! The RDMA IP CM service (IBTA Annex A11): the 36-byte header rdma_cm puts at the start of
//! REQ and SIDR_REQ private data, the port-space service ids, and private-data capacities.
//!
//! Header layout (Linux `struct cma_hdr`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | MajV (4 bits) / MinV (4 bits); Linux sends and requires 0x00 |
//! | 1 | 1 | IPV (4 bits: 4 or 6) / reserved (4 bits) |
//! | 2 | 2 | source port |
//! | 4 | 16 | source IP |
//! | 20 | 16 | destination IP |
//!
//! An IPv4 address is 12 zero bytes then the 4 address bytes (not `::ffff:a.b.c.d`). The
//! destination port is the low 16 bits of the service id.
//!
//! Parsing is strict where Linux is lenient: an IPV other than 4 or 6 is
//! [`Error::BadField`]`("ip_cm.ipv")` (Linux rejects it too), and so is an IPv4 address whose
//! 12 leading bytes are not zero (`"ip_cm.src_ip"` / `"ip_cm.dst_ip"`; Linux reads only the
//! last 4 bytes). Being strict keeps `emit(parse(b)) == b` and catches corrupted headers. The
//! reserved low nibble of byte 1 is ignored and emitted as zero. MajV/MinV are returned as is
//! (`version`); checking them is the CM's business.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::cm::{
    DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN, MRA_PRIVATE_DATA_LEN, REJ_PRIVATE_DATA_LEN,
    REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN, SIDR_REP_PRIVATE_DATA_LEN,
    SIDR_REQ_PRIVATE_DATA_LEN,
};
use crate::layout::{check_out, view};
use crate::{Error, Result};

/// Length of the IP CM service header.
pub const IP_CM_HEADER_LEN: usize = 36;
/// The MajV/MinV byte Linux sends (`CMA_VERSION`).
pub const IP_CM_VERSION: u8 = 0x00;

/// Private data an rdma_cm user can put in a REQ: 92 − 36 = 56 bytes.
pub const REQ_USER_PRIVATE_DATA_MAX: usize = REQ_PRIVATE_DATA_LEN - IP_CM_HEADER_LEN;
/// Private data an rdma_cm user can put in a SIDR_REQ: 216 − 36 = 180 bytes.
pub const SIDR_REQ_USER_PRIVATE_DATA_MAX: usize = SIDR_REQ_PRIVATE_DATA_LEN - IP_CM_HEADER_LEN;
/// Private data of a REP (no header): 196 bytes.
pub const REP_USER_PRIVATE_DATA_MAX: usize = REP_PRIVATE_DATA_LEN;
/// Private data of a REJ (no header): 148 bytes.
pub const REJ_USER_PRIVATE_DATA_MAX: usize = REJ_PRIVATE_DATA_LEN;
/// Private data of a SIDR_REP (no header): 136 bytes.
pub const SIDR_REP_USER_PRIVATE_DATA_MAX: usize = SIDR_REP_PRIVATE_DATA_LEN;
/// Private data of an RTU: 224 bytes.
pub const RTU_USER_PRIVATE_DATA_MAX: usize = RTU_PRIVATE_DATA_LEN;
/// Private data of a DREQ: 220 bytes.
pub const DREQ_USER_PRIVATE_DATA_MAX: usize = DREQ_PRIVATE_DATA_LEN;
/// Private data of a DREP: 224 bytes.
pub const DREP_USER_PRIVATE_DATA_MAX: usize = DREP_PRIVATE_DATA_LEN;
/// Private data of an MRA: 222 bytes (rdma_cm never sends any).
pub const MRA_USER_PRIVATE_DATA_MAX: usize = MRA_PRIVATE_DATA_LEN;

view! {
    /// A zero-copy view of the IP CM service header.
    ///
    /// ```
    /// use rdma_wire::ip_cm::IpCmHeader;
    /// let mut buf = [0u8; 36];
    /// let mut h = IpCmHeader::new_checked(&mut buf[..]).unwrap();
    /// h.set_ip_v(4);
    /// h.set_src_port(0x8e2a);
    /// assert_eq!(&buf[..4], &[0x00, 0x40, 0x8e, 0x2a]);
    /// ```
    pub struct IpCmHeader, len = IP_CM_HEADER_LEN;
    /// MajV (4 bits).
    maj_v / set_maj_v: bits(0, 4, 4);
    /// MinV (4 bits).
    min_v / set_min_v: bits(0, 0, 4);
    /// IPV (4 bits): 4 or 6.
    ip_v / set_ip_v: bits(1, 4, 4);
    /// Source port.
    src_port / set_src_port: u16(2);
    /// Source IP, 16 bytes.
    src_ip / set_src_ip: gid(4);
    /// Destination IP, 16 bytes.
    dst_ip / set_dst_ip: gid(20);
}

/// The IP CM service header as plain values.
///
/// ```
/// use rdma_wire::ip_cm::IpCmHeaderRepr;
/// use std::net::{IpAddr, Ipv4Addr};
///
/// let h = IpCmHeaderRepr {
///     version: 0,
///     src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
///     dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3)),
///     src_port: 0x8e2a,
/// };
/// let mut buf = [0u8; 36];
/// h.emit(&mut buf).unwrap();
/// assert_eq!(&buf[4..20], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 0, 2, 2]);
/// assert_eq!(IpCmHeaderRepr::parse(&buf).unwrap(), h);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpCmHeaderRepr {
    /// MajV/MinV byte (0x00 for Linux).
    pub version: u8,
    /// Source IP (the requester's address).
    pub src: IpAddr,
    /// Destination IP (the address the request is for).
    pub dst: IpAddr,
    /// Source port (the requester's rdma_cm port).
    pub src_port: u16,
}

impl IpCmHeaderRepr {
    /// Length on the wire.
    pub const LEN: usize = IP_CM_HEADER_LEN;

    /// Reads the header from the first 36 bytes of `buf` (e.g. REQ private data).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = IpCmHeader::new_checked(buf)?;
        let (src, dst) = match h.ip_v() {
            4 => (
                v4_of(h.src_ip(), "ip_cm.src_ip")?,
                v4_of(h.dst_ip(), "ip_cm.dst_ip")?,
            ),
            6 => (IpAddr::V6(h.src_ip()), IpAddr::V6(h.dst_ip())),
            _ => return Err(Error::BadField("ip_cm.ipv")),
        };
        Ok(IpCmHeaderRepr {
            version: buf[0],
            src,
            dst,
            src_port: h.src_port(),
        })
    }

    /// Writes the header into the first 36 bytes of `buf`. Both addresses must be of the
    /// same family ([`Error::BadField`]`("ip_cm.family")` otherwise).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        let (ipv, src, dst) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4, v4_in_16(s), v4_in_16(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s, d),
            _ => return Err(Error::BadField("ip_cm.family")),
        };
        buf[..Self::LEN].fill(0);
        buf[0] = self.version;
        let mut h = IpCmHeader::new_unchecked(buf);
        h.set_ip_v(ipv);
        h.set_src_port(self.src_port);
        h.set_src_ip(src);
        h.set_dst_ip(dst);
        Ok(())
    }
}

/// An IPv4 address as the header carries it: 12 zero bytes then the address.
fn v4_in_16(a: Ipv4Addr) -> Ipv6Addr {
    let mut b = [0u8; 16];
    b[12..].copy_from_slice(&a.octets());
    Ipv6Addr::from(b)
}

fn v4_of(a: Ipv6Addr, field: &'static str) -> Result<IpAddr> {
    let o = a.octets();
    if o[..12].iter().any(|&b| b != 0) {
        return Err(Error::BadField(field));
    }
    Ok(IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15])))
}

/// Builds REQ private data: the header, then `user` (at most
/// [`REQ_USER_PRIVATE_DATA_MAX`] = 56 bytes, else [`Error::TooLong`]), zero padded.
///
/// ```
/// use rdma_wire::ip_cm::{req_private_data, IpCmHeaderRepr};
/// use rdma_wire::Error;
/// use std::net::{IpAddr, Ipv6Addr};
///
/// let h = IpCmHeaderRepr {
///     version: 0,
///     src: IpAddr::V6("2001:db8::2".parse().unwrap()),
///     dst: IpAddr::V6("2001:db8::3".parse().unwrap()),
///     src_port: 1234,
/// };
/// let pd = req_private_data(&h, b"hello").unwrap();
/// assert_eq!(pd[1], 0x60);
/// assert_eq!(&pd[36..41], b"hello");
/// assert!(matches!(req_private_data(&h, &[0; 57]), Err(Error::TooLong { max: 56, .. })));
/// ```
pub fn req_private_data(
    header: &IpCmHeaderRepr,
    user: &[u8],
) -> Result<[u8; REQ_PRIVATE_DATA_LEN]> {
    private_data_with_header(header, user, "REQ private data")
}

/// Builds SIDR_REQ private data: the header, then `user` (at most
/// [`SIDR_REQ_USER_PRIVATE_DATA_MAX`] = 180 bytes, else [`Error::TooLong`]), zero padded.
///
/// ```
/// use rdma_wire::ip_cm::{sidr_req_private_data, IpCmHeaderRepr};
/// use std::net::{IpAddr, Ipv4Addr};
/// let h = IpCmHeaderRepr {
///     version: 0,
///     src: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
///     dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3)),
///     src_port: 0x8ffd,
/// };
/// let pd = sidr_req_private_data(&h, &[]).unwrap();
/// assert_eq!(&pd[..4], &[0x00, 0x40, 0x8f, 0xfd]);
/// ```
pub fn sidr_req_private_data(
    header: &IpCmHeaderRepr,
    user: &[u8],
) -> Result<[u8; SIDR_REQ_PRIVATE_DATA_LEN]> {
    private_data_with_header(header, user, "SIDR_REQ private data")
}

fn private_data_with_header<const N: usize>(
    header: &IpCmHeaderRepr,
    user: &[u8],
    field: &'static str,
) -> Result<[u8; N]> {
    let max = N - IP_CM_HEADER_LEN;
    if user.len() > max {
        return Err(Error::TooLong {
            field,
            max,
            len: user.len(),
        });
    }
    let mut out = [0u8; N];
    header.emit(&mut out)?;
    out[IP_CM_HEADER_LEN..IP_CM_HEADER_LEN + user.len()].copy_from_slice(user);
    Ok(out)
}

/// An rdma_cm port space: the upper bits of an IP-based service id (also `rdmacm::cm::PortSpace`,
/// which keys its bind tables by it).
///
/// ```
/// use rdma_wire::ip_cm::PortSpace;
/// assert_eq!(PortSpace::Tcp.value(), 0x0106);
/// assert_eq!(PortSpace::from_value(0x0111), Some(PortSpace::Udp));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpace {
    /// RDMA_PS_TCP, 0x0106: reliable connections.
    Tcp,
    /// RDMA_PS_UDP, 0x0111: unreliable datagrams (SIDR).
    Udp,
    /// RDMA_PS_IB, 0x013F: any QP type.
    Ib,
    /// RDMA_PS_IPOIB, 0x0002.
    IpoIb,
}

impl PortSpace {
    /// The port-space number (`enum rdma_ucm_port_space`).
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
            PortSpace::IpoIb => 0x0002,
        }
    }

    /// The port space with number `v`, if any.
    pub const fn from_value(v: u16) -> Option<PortSpace> {
        match v {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            0x0002 => Some(PortSpace::IpoIb),
            _ => None,
        }
    }
}

/// A CM service id (64 bits). rdma_cm's are `(port space << 16) | port`, i.e.
/// `0x0000_0000_01PP_pppp` for the TCP, UDP and IB spaces.
///
/// ```
/// use rdma_wire::ip_cm::{PortSpace, ServiceId};
/// let sid = ServiceId::new(PortSpace::Tcp, 7000);
/// assert_eq!(sid.0, 0x0000_0000_0106_1b58);
/// assert_eq!(sid.split(), Ok((PortSpace::Tcp, 7000)));
/// assert!(ServiceId(0x1000_0000_0106_1b58).split().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// The service id of `port` in port space `ps`.
    pub const fn new(ps: PortSpace, port: u16) -> ServiceId {
        ServiceId(((ps.value() as u64) << 16) | port as u64)
    }

    /// The port space and port; [`Error::BadField`]`("service_id")` if the upper 48 bits
    /// are not a known port space (the service id is not an IP-based one).
    pub fn split(self) -> Result<(PortSpace, u16)> {
        let upper = self.0 >> 16;
        let ps = u16::try_from(upper)
            .ok()
            .and_then(PortSpace::from_value)
            .ok_or(Error::BadField("service_id"))?;
        Ok((ps, (self.0 & 0xffff) as u16))
    }

    /// The port space ([`Self::split`]).
    pub fn port_space(self) -> Result<PortSpace> {
        self.split().map(|(ps, _)| ps)
    }

    /// The port: the low 16 bits (meaningful for IP-based service ids).
    pub const fn port(self) -> u16 {
        (self.0 & 0xffff) as u16
    }
}

impl From<u64> for ServiceId {
    fn from(v: u64) -> Self {
        ServiceId(v)
    }
}

impl From<ServiceId> for u64 {
    fn from(v: ServiceId) -> Self {
        v.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_bytes(ipv: u8, src: [u8; 16], dst: [u8; 16]) -> [u8; 36] {
        let mut b = [0u8; 36];
        b[1] = ipv << 4;
        b[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
        b[4..20].copy_from_slice(&src);
        b[20..36].copy_from_slice(&dst);
        b
    }

    #[test]
    fn malformed_headers() {
        let v4 = {
            let mut a = [0u8; 16];
            a[12..].copy_from_slice(&[192, 0, 2, 2]);
            a
        };
        let mapped = {
            let mut a = v4;
            a[10] = 0xff;
            a[11] = 0xff;
            a
        };
        assert!(IpCmHeaderRepr::parse(&header_bytes(4, v4, v4)).is_ok());
        assert_eq!(
            IpCmHeaderRepr::parse(&header_bytes(4, mapped, v4)),
            Err(Error::BadField("ip_cm.src_ip"))
        );
        assert_eq!(
            IpCmHeaderRepr::parse(&header_bytes(4, v4, mapped)),
            Err(Error::BadField("ip_cm.dst_ip"))
        );
        for ipv in [0, 5, 15] {
            assert_eq!(
                IpCmHeaderRepr::parse(&header_bytes(ipv, v4, v4)),
                Err(Error::BadField("ip_cm.ipv"))
            );
        }
        // The mapped form is a valid IPv6 header.
        let h = IpCmHeaderRepr::parse(&header_bytes(6, mapped, mapped)).unwrap();
        assert!(matches!(h.src, IpAddr::V6(_)));
        assert_eq!(
            IpCmHeaderRepr::parse(&[0u8; 35]),
            Err(Error::Truncated { need: 36, have: 35 })
        );
    }

    #[test]
    fn mixed_families_are_not_emitted() {
        let h = IpCmHeaderRepr {
            version: 0,
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: IpAddr::V6(Ipv6Addr::LOCALHOST),
            src_port: 1,
        };
        assert_eq!(h.emit(&mut [0u8; 36]), Err(Error::BadField("ip_cm.family")));
        assert_eq!(
            h.emit(&mut [0u8; 10]),
            Err(Error::BufferTooSmall { need: 36, have: 10 })
        );
    }

    #[test]
    fn service_ids() {
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::IpoIb,
        ] {
            for port in [0, 1, 7000, 18515, u16::MAX] {
                assert_eq!(ServiceId::new(ps, port).split(), Ok((ps, port)));
            }
        }
        assert_eq!(
            ServiceId::new(PortSpace::Udp, 18515).0,
            0x0000_0000_0111_4853
        );
        assert_eq!(ServiceId::new(PortSpace::Ib, 1).0, 0x0000_0000_013f_0001);
        assert_eq!(ServiceId::new(PortSpace::IpoIb, 2).0, 0x0000_0000_0002_0002);
        for bad in [0u64, 0x0107_0000, 0x1_0106_0000, u64::MAX] {
            assert_eq!(ServiceId(bad).split(), Err(Error::BadField("service_id")));
        }
    }

    #[test]
    fn capacities() {
        assert_eq!(REQ_USER_PRIVATE_DATA_MAX, 56);
        assert_eq!(SIDR_REQ_USER_PRIVATE_DATA_MAX, 180);
        assert_eq!(REP_USER_PRIVATE_DATA_MAX, 196);
        assert_eq!(REJ_USER_PRIVATE_DATA_MAX, 148);
        assert_eq!(SIDR_REP_USER_PRIVATE_DATA_MAX, 136);
        assert_eq!(RTU_USER_PRIVATE_DATA_MAX, 224);
        assert_eq!(DREQ_USER_PRIVATE_DATA_MAX, 220);
        assert_eq!(DREP_USER_PRIVATE_DATA_MAX, 224);
        assert_eq!(MRA_USER_PRIVATE_DATA_MAX, 222);
    }
}
