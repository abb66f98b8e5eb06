//! An address held by a link (an `RTM_NEWADDR` entry): its type and its netlink forms,
//! below the address listing (`addrs.rs`) and the cache that keeps it (`cache.rs`).

use std::net::IpAddr;

use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::AddressFamily;

use crate::nl;
/// Scope of an address, as the kernel stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Global (universe).
    Global,
    /// Site.
    Site,
    /// Link-local, e.g. fe80::/10.
    Link,
    /// Host, e.g. 127.0.0.1, ::1.
    Host,
    /// Nowhere or another value.
    Other(u8),
}

impl From<AddressScope> for Scope {
    fn from(s: AddressScope) -> Self {
        match s {
            AddressScope::Universe => Scope::Global,
            AddressScope::Site => Scope::Site,
            AddressScope::Link => Scope::Link,
            AddressScope::Host => Scope::Host,
            other => Scope::Other(u8::from(other)),
        }
    }
}

/// An address held by a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// ifindex of the link that holds it.
    pub link: u32,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Scope.
    pub scope: Scope,
}

impl Address {
    /// True for IPv6 fe80::/10 (which needs a scope id: the link).
    pub fn is_link_local(&self) -> bool {
        is_link_local(&self.addr)
    }

    pub(crate) fn from_message(m: &AddressMessage) -> Option<Address> {
        let mut addr = None;
        let mut local = None;
        for a in &m.attributes {
            match a {
                AddressAttribute::Address(ip) => addr = Some(*ip),
                AddressAttribute::Local(ip) => local = Some(*ip),
                _ => {}
            }
        }
        Some(Address {
            link: m.header.index,
            addr: local.or(addr)?,
            prefix_len: m.header.prefix_len,
            scope: m.header.scope.into(),
        })
    }

    /// Reads an address from a raw RTM_NEWADDR payload: the `ifaddrmsg` header and only the
    /// IFA_ADDRESS / IFA_LOCAL attributes (what [`Address::from_message`] keeps).
    pub(crate) fn from_raw(payload: &[u8]) -> Option<Address> {
        let head = payload.get(..IFADDRMSG_LEN)?;
        let link = u32::from_ne_bytes(head.get(4..8)?.try_into().ok()?);
        let ip = |v: &[u8]| -> Option<IpAddr> {
            match v.len() {
                4 => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
                16 => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
                _ => None,
            }
        };
        let (mut addr, mut local) = (None, None);
        for (kind, value) in nl::attrs(payload, IFADDRMSG_LEN) {
            match kind {
                libc::IFA_ADDRESS => addr = ip(value),
                libc::IFA_LOCAL => local = ip(value),
                _ => {}
            }
        }
        Some(Address {
            link,
            addr: local.or(addr)?,
            prefix_len: head[1],
            scope: AddressScope::from(head[3]).into(),
        })
    }
}

/// `sizeof(struct ifaddrmsg)`.
const IFADDRMSG_LEN: usize = 8;

/// True for IPv6 link-local unicast (fe80::/10).
pub fn is_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// The netlink family of `ip`.
pub(crate) fn family_of(ip: &IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

impl Address {
    /// Whether this is `ip` (on link `scope`, if given).
    pub(crate) fn is(&self, ip: IpAddr, scope: Option<u32>) -> bool {
        self.addr == ip && scope.is_none_or(|s| s == self.link)
    }
}
