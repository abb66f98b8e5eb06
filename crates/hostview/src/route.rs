//! Route lookups (`ip route get`) and FIB entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteType as NlType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::error::{Error, Result};
use crate::HostView;

/// The type of a route (`RTN_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteType {
    /// A gateway or direct route.
    Unicast,
    /// The destination is one of our addresses (through `lo`).
    Local,
    /// Broadcast.
    Broadcast,
    /// Anycast.
    Anycast,
    /// Multicast.
    Multicast,
    /// Silently dropped.
    Blackhole,
    /// `EHOSTUNREACH`.
    Unreachable,
    /// `EACCES`.
    Prohibit,
    /// Continue in the next table.
    Throw,
    /// Anything else (`RTN_UNSPEC`, `RTN_NAT`, ...), with its number.
    Other(u8),
}

impl From<NlType> for RouteType {
    fn from(t: NlType) -> Self {
        match t {
            NlType::Unicast => RouteType::Unicast,
            NlType::Local => RouteType::Local,
            NlType::Broadcast => RouteType::Broadcast,
            NlType::Anycast => RouteType::Anycast,
            NlType::Multicast => RouteType::Multicast,
            NlType::BlackHole => RouteType::Blackhole,
            NlType::Unreachable => RouteType::Unreachable,
            NlType::Prohibit => RouteType::Prohibit,
            NlType::Throw => RouteType::Throw,
            other => RouteType::Other(u8::from(other)),
        }
    }
}

/// Where a route-lookup answer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOrigin {
    /// A route in the FIB matched.
    Fib,
    /// The lookup was constrained to an output netdev (`oif`) through which no FIB route covers
    /// the destination; the kernel made up an on-link route out of that netdev (IPv4's
    /// "assume the destination is on link"). Traffic would go out as an ARP that may never be
    /// answered.
    OnLinkGuess,
}

/// The kernel's answer to a route lookup: what `ip route get DST [from SRC] [oif DEV]` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAnswer {
    /// Route type: unicast or local (failing types come back as errors, see [`HostView::route_get`]).
    pub kind: RouteType,
    /// The destination looked up.
    pub dst: IpAddr,
    /// The source given to the lookup (`from`), echoed.
    pub src: Option<IpAddr>,
    /// Output netdev (ifindex); `lo` for local routes.
    pub oif: Option<u32>,
    /// Preferred source address the kernel would use.
    pub prefsrc: Option<IpAddr>,
    /// Gateway (next hop), when the route has one.
    pub gateway: Option<IpAddr>,
    /// Routing table of the matched route, when the kernel says.
    pub table: Option<u32>,
    /// FIB route or on-link guess.
    pub origin: RouteOrigin,
}

impl RouteAnswer {
    /// The neighbour to resolve: the gateway, or the destination itself for a direct route.
    pub fn next_hop(&self) -> IpAddr {
        self.gateway.unwrap_or(self.dst)
    }

    pub(crate) fn from_message(m: &RouteMessage, dst: IpAddr) -> RouteAnswer {
        let mut a = RouteAnswer {
            kind: m.header.kind.into(),
            dst,
            src: None,
            oif: None,
            prefsrc: None,
            gateway: None,
            table: (m.header.table != 0).then_some(u32::from(m.header.table)),
            origin: RouteOrigin::Fib,
        };
        for attr in &m.attributes {
            match attr {
                RouteAttribute::Source(s) => a.src = ip_of(s),
                RouteAttribute::Oif(i) => a.oif = Some(*i),
                RouteAttribute::PrefSource(s) => a.prefsrc = ip_of(s),
                RouteAttribute::Gateway(g) => a.gateway = ip_of(g),
                RouteAttribute::Table(t) => a.table = Some(*t),
                _ => {}
            }
        }
        a
    }
}

/// A route in the FIB (from a dump or a change notification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// Route type.
    pub kind: RouteType,
    /// Destination prefix (0.0.0.0 / :: with length 0 for a default route).
    pub dst: IpAddr,
    /// Destination prefix length.
    pub dst_len: u8,
    /// Routing table.
    pub table: u32,
    /// Output netdev of a single-path route.
    pub oif: Option<u32>,
    /// Gateway of a single-path route.
    pub gateway: Option<IpAddr>,
    /// Preferred source.
    pub prefsrc: Option<IpAddr>,
    /// Metric.
    pub priority: Option<u32>,
    /// (ifindex, gateway) of each next hop of a multipath route.
    pub nexthops: Vec<(u32, Option<IpAddr>)>,
}

impl RouteEntry {
    /// True if a next hop of this route goes out through `oif`.
    pub fn goes_through(&self, oif: u32) -> bool {
        self.oif == Some(oif) || self.nexthops.iter().any(|(i, _)| *i == oif)
    }

    pub(crate) fn from_message(m: &RouteMessage) -> Option<RouteEntry> {
        let unspecified = match m.header.address_family {
            AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        let mut e = RouteEntry {
            kind: m.header.kind.into(),
            dst: unspecified,
            dst_len: m.header.destination_prefix_length,
            table: u32::from(m.header.table),
            oif: None,
            gateway: None,
            prefsrc: None,
            priority: None,
            nexthops: Vec::new(),
        };
        for attr in &m.attributes {
            match attr {
                RouteAttribute::Destination(d) => e.dst = ip_of(d).unwrap_or(unspecified),
                RouteAttribute::Oif(i) => e.oif = Some(*i),
                RouteAttribute::Gateway(g) => e.gateway = ip_of(g),
                RouteAttribute::PrefSource(s) => e.prefsrc = ip_of(s),
                RouteAttribute::Table(t) => e.table = *t,
                RouteAttribute::Priority(p) => e.priority = Some(*p),
                RouteAttribute::MultiPath(hops) => {
                    for h in hops {
                        let gw = h.attributes.iter().find_map(|a| match a {
                            RouteAttribute::Gateway(g) => ip_of(g),
                            _ => None,
                        });
                        e.nexthops.push((h.interface_index, gw));
                    }
                }
                _ => {}
            }
        }
        Some(e)
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

pub(crate) fn lookup_message(
    dst: IpAddr,
    src: Option<IpAddr>,
    oif: Option<u32>,
    fib_match: bool,
) -> RouteMessage {
    let mut m = RouteMessage::default();
    let (family, bits) = match dst {
        IpAddr::V4(_) => (AddressFamily::Inet, 32),
        IpAddr::V6(_) => (AddressFamily::Inet6, 128),
    };
    m.header.address_family = family;
    m.header.destination_prefix_length = bits;
    m.attributes.push(RouteAttribute::Destination(dst.into()));
    if let Some(s) = src {
        m.header.source_prefix_length = bits;
        m.attributes.push(RouteAttribute::Source(s.into()));
    }
    if let Some(i) = oif {
        m.attributes.push(RouteAttribute::Oif(i));
    }
    if fib_match {
        m.header.flags = RouteFlags::FibMatch;
    }
    m
}

impl HostView {
    /// Asks the kernel which route it would use for `dst`, as
    /// `ip route get DST [from SRC] [oif DEV]` does (RTM_GETROUTE).
    ///
    /// Failing lookups are errors carrying the kernel's errno, as `ip` prints them: no route
    /// ⇒ [`Error::NetworkUnreachable`], an `unreachable` route ⇒ [`Error::HostUnreachable`],
    /// `prohibit` ⇒ [`Error::Prohibited`], `blackhole` or a non-local `src` ⇒
    /// [`Error::Kernel`] with `EINVAL`/`ENETUNREACH` as the kernel says.
    ///
    /// With `oif`, a unicast answer is checked for being an on-link guess (see
    /// [`RouteOrigin`] and the crate docs for the method). For an IPv6 link-local `dst`, `oif`
    /// is its scope.
    pub async fn route_get(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        oif: Option<u32>,
    ) -> Result<RouteAnswer> {
        if src.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(Error::InvalidArgument(format!(
                "source {src:?} and destination {dst} are of different families"
            )));
        }
        match &self.cache {
            Some(c) => c.route(self.sync_first(), (dst, src, oif), || {
                self.ask_route(dst, src, oif)
            }),
            None => self.ask_route(dst, src, oif),
        }
    }

    /// [`HostView::route_get`] asked of the kernel.
    fn ask_route(&self, dst: IpAddr, src: Option<IpAddr>, oif: Option<u32>) -> Result<RouteAnswer> {
        let msgs = self.nl.request(
            "RTM_GETROUTE",
            RouteNetlinkMessage::GetRoute(lookup_message(dst, src, oif, false)),
            0,
        )?;
        let mut answer = msgs
            .iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(RouteAnswer::from_message(r, dst)),
                _ => None,
            })
            .ok_or_else(|| Error::Netlink("RTM_GETROUTE: no answer".into()))?;
        if let (Some(oif), RouteType::Unicast) = (oif, answer.kind) {
            answer.origin = self.fib_origin(dst, src, oif)?;
        }
        Ok(answer)
    }

    /// The same lookup with RTM_F_FIB_MATCH: the kernel answers with the FIB entry behind the
    /// answer, or with an error when there is none (its on-link guess has no FIB entry).
    fn fib_origin(&self, dst: IpAddr, src: Option<IpAddr>, oif: u32) -> Result<RouteOrigin> {
        let r = self.nl.request(
            "RTM_GETROUTE(fibmatch)",
            RouteNetlinkMessage::GetRoute(lookup_message(dst, src, Some(oif), true)),
            0,
        );
        match r {
            Ok(msgs) => {
                let through = msgs.iter().any(|m| match m {
                    RouteNetlinkMessage::NewRoute(r) => RouteEntry::from_message(r)
                        .is_some_and(|e| e.goes_through(oif) || e.oif.is_none()),
                    _ => false,
                });
                Ok(if through {
                    RouteOrigin::Fib
                } else {
                    RouteOrigin::OnLinkGuess
                })
            }
            Err(Error::NetworkUnreachable | Error::HostUnreachable) => Ok(RouteOrigin::OnLinkGuess),
            Err(e) => Err(e),
        }
    }

    /// [`HostView::route_get`] for an id bound to netdev `oif`, failing fast as DESIGN.md
    /// decides: if `oif` has no FIB route to `dst` (the answer is an on-link guess, or the
    /// kernel picked another netdev), the result is [`Error::HostUnreachable`] at once.
    /// A local answer (`dst` is ours) is returned as is.
    pub async fn route_get_bound(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        oif: u32,
    ) -> Result<RouteAnswer> {
        let a = self.route_get(dst, src, Some(oif)).await?;
        match a.kind {
            RouteType::Local => Ok(a),
            _ if a.origin == RouteOrigin::OnLinkGuess || a.oif != Some(oif) => {
                Err(Error::HostUnreachable)
            }
            _ => Ok(a),
        }
    }

    /// Every route of every table (IPv4 and IPv6), as `ip route show table all` lists them.
    pub async fn routes(&self) -> Result<Vec<RouteEntry>> {
        let msgs = self.nl.request(
            "RTM_GETROUTE(dump)",
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => RouteEntry::from_message(r),
                _ => None,
            })
            .collect())
    }
}
