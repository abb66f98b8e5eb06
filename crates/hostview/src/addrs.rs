//! Addresses: which link holds which IPv4/IPv6 address, with scope.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::error::{Error, Result};
use crate::links::Link;
use crate::{nl, HostView};

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

impl HostView {
    /// Every address of every link, IPv4 and IPv6.
    pub async fn addresses(&self) -> Result<Vec<Address>> {
        match self.kept_addresses() {
            Some(kept) => Ok(kept?.to_vec()),
            None => self.dump_addresses(AddressFamily::Unspec),
        }
    }

    /// The kept addresses (dumped if stale); `None` for an uncached view.
    fn kept_addresses(&self) -> Option<Result<std::sync::Arc<[Address]>>> {
        let c = self.cache.as_ref()?;
        Some(c.addresses(self.sync_first(), || {
            self.dump_addresses(AddressFamily::Unspec)
        }))
    }

    /// The addresses of one family (`Unspec`: both); the kernel dumps only that family.
    fn dump_addresses(&self, family: AddressFamily) -> Result<Vec<Address>> {
        let mut req = AddressMessage::default();
        req.header.family = family;
        let mut out = Vec::new();
        self.nl.exchange(
            "RTM_GETADDR",
            RouteNetlinkMessage::GetAddress(req),
            NLM_F_DUMP,
            |h, payload| {
                if h.message_type == libc::RTM_NEWADDR {
                    out.extend(Address::from_raw(payload));
                }
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// The link that holds `ip`. For a link-local address `scope` (an ifindex) selects among
    /// links holding the same address. `EADDRNOTAVAIL` if no link holds it.
    pub async fn link_holding(&self, ip: IpAddr, scope: Option<u32>) -> Result<Link> {
        let index = self.index_holding(ip, scope).await?;
        self.link(index).await
    }

    /// The ifindex of the link that holds `ip`, as [`HostView::link_holding`] finds it, without
    /// reading the link itself.
    /// Answered from the kept addresses; without them, only `ip`'s family is dumped.
    pub async fn index_holding(&self, ip: IpAddr, scope: Option<u32>) -> Result<u32> {
        let holds = |a: &Address| a.addr == ip && scope.is_none_or(|s| s == a.link);
        let found = match self.kept_addresses() {
            Some(kept) => kept?.iter().find(|a| holds(a)).map(|a| a.link),
            None => {
                let family = match ip {
                    IpAddr::V4(_) => AddressFamily::Inet,
                    IpAddr::V6(_) => AddressFamily::Inet6,
                };
                self.dump_addresses(family)?
                    .into_iter()
                    .find(|a| holds(a))
                    .map(|a| a.link)
            }
        };
        found.ok_or(Error::AddressNotAvailable(ip))
    }
}
