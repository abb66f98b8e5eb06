//! Links (netdevs): index, name, flags, MAC, MTU.

use std::fmt;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkFlags as NlFlags, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::error::{Error, Result};
use crate::{nl, HostView};

/// An Ethernet (or other 6-byte) hardware address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Takes the first 6 bytes of a netlink hardware address, if there are 6.
    pub fn from_slice(b: &[u8]) -> Option<MacAddr> {
        b.try_into().ok().map(MacAddr)
    }

    /// True for 00:00:00:00:00:00 (e.g. `lo`).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// The link flags the connection manager looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkFlags {
    /// IFF_UP: administratively up.
    pub up: bool,
    /// IFF_RUNNING: operationally up (carrier).
    pub running: bool,
    /// IFF_LOOPBACK.
    pub loopback: bool,
    /// IFF_NOARP: no neighbour resolution on this link.
    pub noarp: bool,
}

impl From<NlFlags> for LinkFlags {
    fn from(f: NlFlags) -> Self {
        LinkFlags {
            up: f.contains(NlFlags::Up),
            running: f.contains(NlFlags::Running),
            loopback: f.contains(NlFlags::Loopback),
            noarp: f.contains(NlFlags::Noarp),
        }
    }
}

/// A netdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// ifindex.
    pub index: u32,
    /// Name, e.g. `eth0`.
    pub name: String,
    /// Flags.
    pub flags: LinkFlags,
    /// Hardware address, if the link has a 6-byte one.
    pub mac: Option<MacAddr>,
    /// MTU in bytes.
    pub mtu: u32,
}

impl Link {
    /// Up and running: usable for traffic.
    pub fn is_usable(&self) -> bool {
        self.flags.up && self.flags.running
    }

    /// Whether reaching a neighbour on this link needs ARP/ND (not loopback, not NOARP).
    pub fn needs_neighbour(&self) -> bool {
        !self.flags.loopback && !self.flags.noarp
    }

    pub(crate) fn from_message(m: &LinkMessage) -> Link {
        let mut link = Link {
            index: m.header.index,
            name: String::new(),
            flags: m.header.flags.into(),
            mac: None,
            mtu: 0,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => link.name.clone_from(n),
                LinkAttribute::Address(b) => link.mac = MacAddr::from_slice(b),
                LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
                _ => {}
            }
        }
        link
    }
}

impl Link {
    /// Reads a link from a raw RTM_NEWLINK payload: the `ifinfomsg` header and only the name,
    /// hardware address and MTU attributes (what [`Link::from_message`] keeps), without
    /// parsing the rest of the kernel's answer. `None` if the payload is cut short.
    pub(crate) fn from_raw(payload: &[u8]) -> Option<Link> {
        let u32_at = |i: usize| {
            payload
                .get(i..i + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
        };
        let index = u32_at(4)?;
        let flags = u32_at(8)?;
        let bit = |f: libc::c_int| flags & (f as u32) != 0;
        let mut link = Link {
            index,
            name: String::new(),
            flags: LinkFlags {
                up: bit(libc::IFF_UP),
                running: bit(libc::IFF_RUNNING),
                loopback: bit(libc::IFF_LOOPBACK),
                noarp: bit(libc::IFF_NOARP),
            },
            mac: None,
            mtu: 0,
        };
        for (kind, value) in nl::attrs(payload, IFINFOMSG_LEN) {
            match kind {
                libc::IFLA_IFNAME => {
                    let name = value.split(|b| *b == 0).next().unwrap_or_default();
                    link.name = String::from_utf8_lossy(name).into_owned();
                }
                libc::IFLA_ADDRESS => link.mac = MacAddr::from_slice(value),
                libc::IFLA_MTU => {
                    if let Some(m) = value.get(..4).and_then(|b| b.try_into().ok()) {
                        link.mtu = u32::from_ne_bytes(m);
                    }
                }
                _ => {}
            }
        }
        Some(link)
    }
}

/// `sizeof(struct ifinfomsg)`.
const IFINFOMSG_LEN: usize = 16;

/// The links in an RTM_GETLINK answer, read with [`Link::from_raw`].
fn collect_links(
    hv: &HostView,
    op: &'static str,
    req: LinkMessage,
    flags: u16,
) -> Result<Vec<Link>> {
    let mut out = Vec::new();
    hv.nl.exchange(
        op,
        RouteNetlinkMessage::GetLink(skip_stats(req)),
        flags,
        |h, payload| {
            if h.message_type == libc::RTM_NEWLINK {
                out.push(
                    Link::from_raw(payload)
                        .ok_or_else(|| Error::Netlink(format!("{op}: short RTM_NEWLINK")))?,
                );
            }
            Ok(())
        },
    )?;
    Ok(out)
}

impl HostView {
    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<Link>> {
        match self.kept_links() {
            Some(kept) => Ok(kept?.to_vec()),
            None => self.dump_links(),
        }
    }

    /// The kept links (dumped if stale); `None` for an uncached view.
    fn kept_links(&self) -> Option<Result<std::sync::Arc<[Link]>>> {
        let c = self.cache.as_ref()?;
        Some(c.links(self.sync_first(), || self.dump_links()))
    }

    fn dump_links(&self) -> Result<Vec<Link>> {
        collect_links(self, "RTM_GETLINK", LinkMessage::default(), NLM_F_DUMP)
    }

    /// The link with ifindex `index` (`ENODEV` if none).
    pub async fn link(&self, index: u32) -> Result<Link> {
        let gone = || Error::NoDevice(format!("ifindex {index}"));
        if let Some(kept) = self.kept_links() {
            return kept?
                .iter()
                .find(|l| l.index == index)
                .cloned()
                .ok_or_else(gone);
        }
        let mut req = LinkMessage::default();
        req.header.index = index;
        collect_links(self, "RTM_GETLINK", req, 0)
            .map_err(|e| match e.errno() {
                libc::ENODEV => gone(),
                _ => e,
            })?
            .into_iter()
            .next()
            .ok_or_else(gone)
    }

    /// The link named `name` (`ENODEV` if none).
    pub async fn link_by_name(&self, name: &str) -> Result<Link> {
        self.links()
            .await?
            .into_iter()
            .find(|l| l.name == name)
            .ok_or_else(|| Error::NoDevice(name.to_string()))
    }
}

/// Asks the kernel to leave the counters out of link answers (`RTEXT_FILTER_SKIP_STATS`):
/// nothing here reads them, and filling and parsing them is most of a link query's cost.
pub(crate) fn skip_stats(mut m: LinkMessage) -> LinkMessage {
    m.attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    m
}
