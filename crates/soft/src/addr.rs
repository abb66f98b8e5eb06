//! Addresses on a datagram wire: an IP address with the scope that selects its link.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An endpoint address on a datagram wire: an IP address (a RoCEv2 GID) and, for IPv6
/// link-local addresses, the interface index that selects the link.
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, the form a GID takes) are stored as IPv4, so
/// an address compares equal however it was written.
///
/// ```
/// use rdma_soft::io::WireAddr;
/// let a: WireAddr = "127.0.0.2".parse().unwrap();
/// let gid: WireAddr = "::ffff:127.0.0.2".parse().unwrap();
/// assert_eq!(a, gid);
/// let ll: WireAddr = "fe80::1%1".parse().unwrap();
/// assert_eq!(ll.scope_id(), 1);
/// assert_eq!(ll.to_string(), "fe80::1%1");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireAddr {
    ip: IpAddr,
    scope_id: u32,
}

impl WireAddr {
    /// An address with a scope. The scope is kept only for IPv6 link-local addresses (fe80::/10)
    /// and ignored for every other address, where it selects nothing.
    pub fn new(ip: IpAddr, scope_id: u32) -> WireAddr {
        let ip = match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            },
            v4 => v4,
        };
        let scope_id = if is_link_local(&ip) { scope_id } else { 0 };
        WireAddr { ip, scope_id }
    }

    /// The IP address (IPv4 for IPv4-mapped GIDs).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The interface index of a link-local IPv6 address; 0 otherwise.
    pub fn scope_id(&self) -> u32 {
        self.scope_id
    }

    /// True for IPv6 link-local (fe80::/10) addresses.
    pub fn is_link_local(&self) -> bool {
        is_link_local(&self.ip)
    }

    /// The address as a 16-byte RoCEv2 GID (IPv4 as `::ffff:a.b.c.d`).
    pub fn gid(&self) -> [u8; 16] {
        match self.ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }
    }
}

fn is_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

impl From<IpAddr> for WireAddr {
    fn from(ip: IpAddr) -> WireAddr {
        WireAddr::new(ip, 0)
    }
}

impl From<Ipv4Addr> for WireAddr {
    fn from(ip: Ipv4Addr) -> WireAddr {
        WireAddr::new(IpAddr::V4(ip), 0)
    }
}

impl From<Ipv6Addr> for WireAddr {
    fn from(ip: Ipv6Addr) -> WireAddr {
        WireAddr::new(IpAddr::V6(ip), 0)
    }
}

impl fmt::Display for WireAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scope_id != 0 {
            write!(f, "{}%{}", self.ip, self.scope_id)
        } else {
            write!(f, "{}", self.ip)
        }
    }
}

impl fmt::Debug for WireAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error from parsing a [`WireAddr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an IP address with optional %scope: {0:?}")]
pub struct ParseWireAddrError(String);

impl std::str::FromStr for WireAddr {
    type Err = ParseWireAddrError;

    /// Parses `ADDR` or `ADDR%SCOPE` with a numeric scope (interface index). Interface names
    /// are resolved by the layers that know the host's links, not here.
    fn from_str(s: &str) -> Result<WireAddr, ParseWireAddrError> {
        let err = || ParseWireAddrError(s.to_owned());
        let (ip, scope) = match s.split_once('%') {
            Some((ip, scope)) => (ip, scope.parse::<u32>().map_err(|_| err())?),
            None => (s, 0),
        };
        let ip: IpAddr = ip.parse().map_err(|_| err())?;
        Ok(WireAddr::new(ip, scope))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_kept_only_for_link_local() {
        let a = WireAddr::new("::1".parse().unwrap(), 3);
        assert_eq!(a.scope_id(), 0);
        let b = WireAddr::new("fe80::2".parse().unwrap(), 3);
        assert_eq!(b.scope_id(), 3);
        assert!(b.is_link_local());
        assert!("fe80::1%x".parse::<WireAddr>().is_err());
        assert!("nonsense".parse::<WireAddr>().is_err());
    }

    #[test]
    fn gid_is_ipv4_mapped() {
        let a: WireAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(a.gid()[10..], [0xff, 0xff, 10, 1, 2, 3]);
    }
}
