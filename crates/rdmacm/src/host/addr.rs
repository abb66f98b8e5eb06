//! Socket-address helpers: scoped addresses (`fe80::1%eth0`, `fe80::1%3`), GIDs (IPv4-mapped
//! for IPv4), and the classification of addresses into any / loopback / link-local / other.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::error::{Error, Result};

/// The scope of an IPv6 link-local address: a netdev, by index or by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ScopeId {
    /// An ifindex (`fe80::1%3`, or `sin6_scope_id` of a socket address).
    Index(u32),
    /// A netdev name (`fe80::1%eth0`).
    Name(String),
}

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeId::Index(i) => write!(f, "{i}"),
            ScopeId::Name(n) => f.write_str(n),
        }
    }
}

/// An IP address with an optional scope id, as rdma_cm callers give it in a `sockaddr`.
///
/// ```
/// use rdmacm::host::{ScopeId, ScopedIp};
/// let a: ScopedIp = "fe80::1%eth0".parse().unwrap();
/// assert_eq!(a.scope, Some(ScopeId::Name("eth0".into())));
/// let b: ScopedIp = "fe80::1%3".parse().unwrap();
/// assert_eq!(b.scope, Some(ScopeId::Index(3)));
/// let c: ScopedIp = "192.0.2.1".parse().unwrap();
/// assert!(c.scope.is_none());
/// assert!("192.0.2.1%eth0".parse::<ScopedIp>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScopedIp {
    /// The address.
    pub ip: IpAddr,
    /// Its scope, if given (only meaningful for IPv6).
    pub scope: Option<ScopeId>,
}

impl ScopedIp {
    /// An address without scope.
    pub fn new(ip: IpAddr) -> ScopedIp {
        ScopedIp { ip, scope: None }
    }

    /// An address scoped to netdev `index`.
    pub fn with_index(ip: IpAddr, index: u32) -> ScopedIp {
        ScopedIp {
            ip,
            scope: Some(ScopeId::Index(index)),
        }
    }

    /// The class of the address (see [`classify`]).
    pub fn class(&self) -> AddrClass {
        classify(&self.ip)
    }
}

impl From<IpAddr> for ScopedIp {
    fn from(ip: IpAddr) -> Self {
        ScopedIp::new(ip)
    }
}

impl From<SocketAddr> for ScopedIp {
    /// Takes the address and, for IPv6, a non-zero `sin6_scope_id` (0 means "no scope").
    fn from(sa: SocketAddr) -> Self {
        match sa {
            SocketAddr::V4(v4) => ScopedIp::new(IpAddr::V4(*v4.ip())),
            SocketAddr::V6(v6) => ScopedIp {
                ip: IpAddr::V6(*v6.ip()),
                scope: (v6.scope_id() != 0).then_some(ScopeId::Index(v6.scope_id())),
            },
        }
    }
}

impl FromStr for ScopedIp {
    type Err = Error;

    /// Parses `ADDR`, `ADDR%IFNAME` or `ADDR%INDEX` (scope only on IPv6).
    fn from_str(s: &str) -> Result<ScopedIp> {
        let (addr, scope) = match s.split_once('%') {
            Some((a, sc)) => (a, Some(sc)),
            None => (s, None),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("not an IP address: {s:?}")))?;
        let scope = match scope {
            None => None,
            Some(_) if ip.is_ipv4() => {
                return Err(Error::InvalidArgument(format!(
                    "an IPv4 address takes no scope: {s:?}"
                )))
            }
            Some("") => return Err(Error::InvalidArgument(format!("empty scope: {s:?}"))),
            Some(sc) => Some(match sc.parse::<u32>() {
                Ok(0) => return Err(Error::InvalidArgument(format!("scope 0: {s:?}"))),
                Ok(i) => ScopeId::Index(i),
                Err(_) => ScopeId::Name(sc.to_string()),
            }),
        };
        Ok(ScopedIp { ip, scope })
    }
}

impl fmt::Display for ScopedIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Some(s) => write!(f, "{}%{s}", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

/// What kind of address an IP is, for binding and resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrClass {
    /// 0.0.0.0 or `::`: a wildcard.
    Any,
    /// 127.0.0.0/8 or `::1`. Linux's rdma_cm counts these as "any" (`cma_any_addr`); here
    /// they are specific addresses of `lo` (DESIGN.md, loopback row).
    Loopback,
    /// IPv6 fe80::/10: needs a scope id.
    LinkLocal,
    /// Multicast.
    Multicast,
    /// Any other unicast address.
    Unicast,
}

/// Classifies `ip`.
///
/// ```
/// use rdmacm::host::{classify, AddrClass};
/// assert_eq!(classify(&"0.0.0.0".parse().unwrap()), AddrClass::Any);
/// assert_eq!(classify(&"127.0.0.2".parse().unwrap()), AddrClass::Loopback);
/// assert_eq!(classify(&"::1".parse().unwrap()), AddrClass::Loopback);
/// assert_eq!(classify(&"fe80::2".parse().unwrap()), AddrClass::LinkLocal);
/// assert_eq!(classify(&"192.0.2.1".parse().unwrap()), AddrClass::Unicast);
/// ```
pub fn classify(ip: &IpAddr) -> AddrClass {
    if ip.is_unspecified() {
        AddrClass::Any
    } else if ip.is_loopback() {
        AddrClass::Loopback
    } else if rdma_hostview::is_link_local(ip) {
        AddrClass::LinkLocal
    } else if ip.is_multicast() {
        AddrClass::Multicast
    } else {
        AddrClass::Unicast
    }
}

/// The loopback address of `ip`'s family (127.0.0.1 or ::1).
pub fn loopback_of(ip: &IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// The wildcard address of `ip`'s family (0.0.0.0 or ::).
pub fn any_of(ip: &IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// A 128-bit GID. RoCE GIDs are IP addresses: IPv6 as is, IPv4 as IPv4-mapped IPv6
/// (`::ffff:a.b.c.d`, `rdma_ip2gid`).
///
/// ```
/// use rdmacm::host::Gid;
/// let g = Gid::from_ip("192.0.2.1".parse().unwrap());
/// assert_eq!(g.to_string(), "::ffff:192.0.2.1");
/// assert_eq!(g.to_ip(), "192.0.2.1".parse::<std::net::IpAddr>().unwrap());
/// assert_eq!(Gid::from_ip("fe80::1".parse().unwrap()).0[0], 0xfe);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        Gid(match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        })
    }

    /// The IP address of a GID (IPv4 for an IPv4-mapped GID).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

/// Checks that two addresses are of the same family (`EINVAL` otherwise).
pub(crate) fn same_family(a: &IpAddr, b: &IpAddr) -> Result<()> {
    if a.is_ipv4() == b.is_ipv4() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{a} and {b} are of different families"
        )))
    }
}

/// The Ethernet address of group `ip`: IPv4 `01:00:5e` and its low 23 bits, IPv6 `33:33`
/// and its last 32 bits.
///
/// ```
/// let m = rdmacm::cm::CmId::group_mac("239.129.2.3".parse().unwrap());
/// assert_eq!(m.0, [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
/// let m = rdmacm::cm::CmId::group_mac("ff0e::1:2:3:4".parse().unwrap());
/// assert_eq!(m.0, [0x33, 0x33, 0, 3, 0, 4]);
/// ```
pub(crate) fn group_mac(ip: IpAddr) -> rdma_hostview::MacAddr {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            rdma_hostview::MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            rdma_hostview::MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addr_scope_zero_is_none() {
        let sa: SocketAddr = "[fe80::1]:7".parse().unwrap();
        assert_eq!(ScopedIp::from(sa).scope, None);
        let sa = SocketAddr::V6(std::net::SocketAddrV6::new(
            "fe80::1".parse().unwrap(),
            7,
            0,
            4,
        ));
        assert_eq!(ScopedIp::from(sa).scope, Some(ScopeId::Index(4)));
    }

    #[test]
    fn parse_rejects_garbage() {
        for s in ["", "x", "fe80::1%", "fe80::1%0", "1.2.3.4%1"] {
            assert!(s.parse::<ScopedIp>().is_err(), "{s}");
        }
        let s: ScopedIp = "fe80::1%eth0".parse().unwrap();
        assert_eq!(s.to_string(), "fe80::1%eth0");
    }

    #[test]
    fn gid_round_trip() {
        for ip in ["192.0.2.1", "2001:db8::1", "::1", "127.0.0.1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(Gid::from_ip(ip).to_ip(), ip);
        }
    }
}
