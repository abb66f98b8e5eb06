//! Binding and address resolution on the host's real network state: which netdev (and so
//! which software device, named after it) and which path an id uses.

use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use rdma_hostview::{HostView, Link, Lookups, MacAddr, RouteAnswer, RouteType};

use crate::addr::{classify, loopback_of, same_family, AddrClass, Gid, ScopeId, ScopedIp};
use crate::error::{Error, RejectCause, Result};

/// A netdev, as the connection manager records it for an id: the software device of an id is
/// the one attached to this netdev and named after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    /// ifindex.
    pub index: u32,
    /// Name, e.g. `eth0` (also the device's name).
    pub name: String,
    /// Hardware address (all zero for `lo` and links without one).
    pub mac: MacAddr,
    /// MTU in bytes.
    pub mtu: u32,
    /// IFF_LOOPBACK.
    pub loopback: bool,
    /// IFF_NOARP: no neighbour resolution.
    pub noarp: bool,
    /// IFF_UP when it was read.
    pub up: bool,
    /// IFF_RUNNING (carrier) when it was read.
    pub running: bool,
}

impl Netdev {
    /// The record of a hostview link.
    pub fn from_link(l: &Link) -> Netdev {
        Netdev {
            index: l.index,
            name: l.name.clone(),
            mac: l.mac.unwrap_or_default(),
            mtu: l.mtu,
            loopback: l.flags.loopback,
            noarp: l.flags.noarp,
            up: l.flags.up,
            running: l.flags.running,
        }
    }

    /// Whether reaching a peer through it needs a neighbour (ARP/ND) entry.
    pub fn needs_neighbour(&self) -> bool {
        !self.loopback && !self.noarp
    }
}

/// The result of [`Resolver::bind`]: the local address and, for a specific address, the
/// netdev (device) the id is bound to.
///
/// ```
/// use rdmacm::Binding;
/// let wild = Binding { addr: "0.0.0.0".parse().unwrap(), scope: None, netdev: None };
/// assert!(wild.is_wildcard());
/// assert!(wild.accepts(7, "192.0.2.1".parse().unwrap(), true));
/// assert!(!wild.accepts(7, "2001:db8::1".parse().unwrap(), true));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The bound address (wildcard, loopback or a specific address).
    pub addr: IpAddr,
    /// Its scope (ifindex) for a link-local address.
    pub scope: Option<u32>,
    /// The netdev holding it; `None` for a wildcard bind (no device).
    pub netdev: Option<Netdev>,
}

impl Binding {
    /// True for 0.0.0.0 / `::` (no device bound).
    pub fn is_wildcard(&self) -> bool {
        self.addr.is_unspecified()
    }

    /// Whether a listener bound like this gets a request that arrived on netdev `arrival`
    /// for local address `local`: a wildcard listener gets requests from every device (an
    /// IPv6 wildcard also IPv4 ones unless `afonly`); a specific listener only those for its
    /// address (for a link-local address also only on its scope's netdev).
    pub fn accepts(&self, arrival: u32, local: IpAddr, afonly: bool) -> bool {
        if self.is_wildcard() {
            return self.addr.is_ipv4() == local.is_ipv4() || (self.addr.is_ipv6() && !afonly);
        }
        self.addr == local && self.scope.is_none_or(|s| s == arrival)
    }
}

/// One entry of a device's GID table: an address of its netdev as a GID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID (IPv4-mapped for IPv4).
    pub gid: Gid,
    /// The address.
    pub ip: IpAddr,
}

/// The route lookup behind a resolution: `ip route get DST [from SRC] [oif OIF]`. Kept so
/// that the [`crate::Watcher`] can ask the same question again when routes change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteQuery {
    /// Destination (the peer).
    pub dst: IpAddr,
    /// Scope (ifindex) of a link-local destination.
    pub dst_scope: Option<u32>,
    /// Source, if the caller gave one.
    pub src: Option<IpAddr>,
    /// Output netdev: the bound netdev, or the scope of a link-local source/destination.
    pub oif: Option<u32>,
}

/// The outcome of address resolution (active side) or of [`Resolver::accept_path`]
/// (passive side): the netdev and everything the route and the CM need.
///
/// ```no_run
/// # fn f() -> rdmacm::Result<()> {
/// use std::time::Duration;
/// let r = rdmacm::BlockingResolver::new()?;
/// let a = r.resolve_addr(None, &"192.0.2.2".parse()?, None, Duration::from_secs(2))?;
/// println!(
///     "device {} ({}), {} -> {} via {:?}, dmac {:?}, loopback {}",
///     a.netdev.name, a.netdev.index, a.sgid, a.dgid, a.gateway, a.dmac, a.loopback
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedAddr {
    /// The netdev, i.e. the device, the id uses.
    pub netdev: Netdev,
    /// Local address.
    pub src: IpAddr,
    /// Scope (ifindex) of a link-local local address.
    pub src_scope: Option<u32>,
    /// ifindex of the netdev that holds `src` (differs from `netdev` only for a loopback
    /// connection from an address of another netdev, seed 001).
    pub src_netdev: u32,
    /// Peer address.
    pub dst: IpAddr,
    /// Scope (ifindex) of a link-local peer address.
    pub dst_scope: Option<u32>,
    /// Source GID (`src` as a GID).
    pub sgid: Gid,
    /// Destination GID (`dst` as a GID).
    pub dgid: Gid,
    /// Gateway, when the route has one (then the path is routed: RoCE v2 only).
    pub gateway: Option<IpAddr>,
    /// The neighbour whose MAC is `dmac`: the gateway, or the peer itself.
    pub next_hop: IpAddr,
    /// Our MAC on `netdev`.
    pub smac: MacAddr,
    /// The next hop's MAC. Always known on the active side (own MAC for loopback, zero on
    /// NOARP links); on the passive side only if the neighbour table has a valid entry.
    pub dmac: Option<MacAddr>,
    /// MTU of `netdev` in bytes.
    pub mtu: u32,
    /// Hop limit / TTL for the path (see [`Resolver::resolve_addr`]).
    pub hop_limit: u8,
    /// The peer is one of this host's addresses: the connection stays on the host.
    pub loopback: bool,
    /// The lookup that produced this.
    pub query: RouteQuery,
}

/// What [`Resolver::choose`] picked for a query.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub(crate) netdev: Link,
    pub(crate) src: IpAddr,
    pub(crate) gateway: Option<IpAddr>,
    pub(crate) loopback: bool,
}

/// Binds and resolves addresses on the host's network state (through [`HostView`]).
///
/// Create it inside a tokio runtime, in the network namespace it should see. Cloning is
/// cheap (it shares the netlink connection).
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// use std::time::Duration;
/// use rdmacm::{Resolver, ScopedIp};
/// let r = Resolver::new()?;
/// let b = r.bind(&"127.0.0.1".parse()?).await?;
/// assert_eq!(b.netdev.as_ref().map(|n| n.name.as_str()), Some("lo"));
/// let dst: ScopedIp = "127.0.0.1".parse()?;
/// let a = r.resolve_addr(None, &dst, None, Duration::from_secs(2)).await?;
/// assert!(a.loopback);
/// let path = r.resolve_route(&a, &rdmacm::RouteParams::default()).await?;
/// println!("{} -> {} mtu {:?}", path.sgid, path.dgid, path.mtu);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Resolver {
    hv: HostView,
    /// `/proc/sys/net/ipv4/ip_default_ttl` of the resolver's namespace, opened once and
    /// re-read (`pread` at 0: the kernel formats the current value) at every resolution.
    ttl: Option<Arc<File>>,
}

impl Resolver {
    /// Opens a netlink connection in the calling thread's namespace (inside a tokio runtime).
    pub fn new() -> Result<Resolver> {
        Ok(Resolver::from_view(HostView::new()?))
    }

    /// A resolver over an existing host view.
    pub fn from_view(hv: HostView) -> Resolver {
        let ttl = File::open(IPV4_TTL).ok().map(Arc::new);
        Resolver { hv, ttl }
    }

    /// The host view it reads.
    pub fn view(&self) -> &HostView {
        &self.hv
    }

    /// The netdev with ifindex `index` (`ENODEV` if none).
    pub async fn netdev(&self, index: u32) -> Result<Netdev> {
        Ok(Netdev::from_link(&self.hv.link(index).await?))
    }

    /// The netdev a scope id names (`ENODEV` if none).
    pub async fn scope_netdev(&self, scope: &ScopeId) -> Result<Netdev> {
        let l = match scope {
            ScopeId::Index(i) => self.hv.link(*i).await?,
            ScopeId::Name(n) => self.hv.link_by_name(n).await?,
        };
        Ok(Netdev::from_link(&l))
    }

    /// The GID table of the device on netdev `index`: every address of the netdev, IPv4 as
    /// IPv4-mapped GIDs, IPv6 including link-local (DESIGN.md: addresses belong to the host;
    /// a device's GID table holds its netdev's addresses).
    pub async fn gid_table(&self, index: u32) -> Result<Vec<GidEntry>> {
        self.hv.link(index).await?;
        Ok(self
            .hv
            .addresses()
            .await?
            .into_iter()
            .filter(|a| a.link == index)
            .map(|a| GidEntry {
                gid: Gid::from_ip(a.addr),
                ip: a.addr,
            })
            .collect())
    }

    /// Binds to a local address (`rdma_bind_addr`).
    ///
    /// * Wildcard (0.0.0.0, `::`): no device ([`Binding::netdev`] is `None`).
    /// * Link-local IPv6: needs a scope id (`EINVAL` without); the scope selects the netdev
    ///   (`ENODEV` if it does not exist), which must hold the address (`EADDRNOTAVAIL`).
    /// * Any other address, 127.0.0.0/8 and `::1` included: the netdev holding it
    ///   (`EADDRNOTAVAIL` if none). Loopback addresses bind the device on `lo` — a deviation
    ///   from Linux, which treats them as wildcards (`cma_any_addr`) and binds no device.
    ///   A scope id on a non-link-local address is ignored, as in Linux.
    /// * Multicast: `EINVAL`.
    pub async fn bind(&self, addr: &ScopedIp) -> Result<Binding> {
        match addr.class() {
            AddrClass::Any => Ok(Binding {
                addr: addr.ip,
                scope: None,
                netdev: None,
            }),
            AddrClass::Multicast => Err(Error::InvalidArgument(format!(
                "cannot bind to multicast address {}",
                addr.ip
            ))),
            AddrClass::LinkLocal => {
                let scope = addr.scope.as_ref().ok_or_else(|| {
                    Error::InvalidArgument(format!("link-local {} needs a scope id", addr.ip))
                })?;
                let nd = self.scope_netdev(scope).await?;
                self.hv.link_holding(addr.ip, Some(nd.index)).await?;
                Ok(Binding {
                    addr: addr.ip,
                    scope: Some(nd.index),
                    netdev: Some(nd),
                })
            }
            AddrClass::Loopback | AddrClass::Unicast => {
                // The address lookup and, for 127/8 (local through lo's /8 route, rarely an
                // address of a link), the route lookup behind it, in one exchange.
                let ip = addr.ip;
                let mut a = self
                    .hv
                    .lookups(&Lookups {
                        holder: Some((ip, None)),
                        routes: speculative_route(ip, None).into_iter().collect(),
                        ..Lookups::default()
                    })
                    .await?;
                let dump = take_answer(a.holder.take());
                let index = self.holder_from(ip, None, dump, a.routes.pop()).await?;
                let l = self.hv.link(index).await?;
                Ok(Binding {
                    addr: addr.ip,
                    scope: None,
                    netdev: Some(Netdev::from_link(&l)),
                })
            }
        }
    }

    /// The netdev holding `ip`: the link that has it, or for an address that is local only
    /// through a local route (127.0.0.2 through 127.0.0.0/8 on `lo`) the netdev of that
    /// route, as Linux's `__ip_dev_find` does. `EADDRNOTAVAIL` if neither.
    pub(crate) async fn holder(&self, ip: IpAddr, scope: Option<u32>) -> Result<Link> {
        let index = self.holder_index(ip, scope).await?;
        Ok(self.hv.link(index).await?)
    }

    /// The ifindex of [`Resolver::holder`], without reading the link.
    async fn holder_index(&self, ip: IpAddr, scope: Option<u32>) -> Result<u32> {
        let dump = self.hv.index_holding(ip, scope).await;
        self.holder_from(ip, scope, dump, None).await
    }

    /// [`Resolver::holder_index`] from the address lookup's answer `dump` and, if it was
    /// asked in the same exchange, the route lookup of `ip` (else asked here when needed).
    async fn holder_from(
        &self,
        ip: IpAddr,
        scope: Option<u32>,
        dump: HvResult<u32>,
        route: Option<HvResult<RouteAnswer>>,
    ) -> Result<u32> {
        match dump {
            Ok(i) => Ok(i),
            Err(rdma_hostview::Error::AddressNotAvailable(_)) if scope.is_none() => {
                let route = match route {
                    Some(r) => r,
                    None => self.hv.route_get(ip, None, None).await,
                };
                match route {
                    Ok(RouteAnswer {
                        kind: RouteType::Local,
                        oif: Some(oif),
                        ..
                    }) => Ok(oif),
                    _ => Err(Error::not_held(ip)),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Resolves a destination (`rdma_resolve_addr`): picks the netdev, the source address,
    /// the next hop and its MAC.
    ///
    /// * Route lookup by the full tuple, as `ip route get DST [from SRC] [oif BOUND]`.
    /// * A local route (the destination is one of our addresses, through `lo`) is a loopback
    ///   connection and is honoured: the device is the bound one if `bound`, else `lo` for
    ///   127.0.0.0/8 and `::1`, else the netdev holding the destination (seed 001). No
    ///   neighbour is needed (dmac = own MAC). A wildcard destination means loopback.
    /// * Bound to a netdev that has no route to the destination: `EHOSTUNREACH` at once.
    ///   (Linux instead ARPs out of the bound netdev and reports `ETIMEDOUT` after the
    ///   timeout.)
    /// * A link-local destination or source without a scope id: `EINVAL` at once (Linux only
    ///   checks the source). Scopes that disagree with each other or with `bound`: `EINVAL`.
    /// * Otherwise: netdev, source (the given one, else the route's preferred source) and
    ///   gateway from the route, then the next hop's MAC through neighbour resolution within
    ///   `timeout` (`ETIMEDOUT`, or `EHOSTUNREACH` when the entry fails); loopback and NOARP
    ///   netdevs need none.
    /// * A given source must be one of our addresses (`EADDRNOTAVAIL`); families must match
    ///   (`EINVAL`). A given source does not bind the id: the CM binds before resolving if
    ///   rdma_cm semantics want it.
    ///
    /// The hop limit is the kernel's default for the netdev (`net.ipv4.ip_default_ttl`,
    /// `net.ipv6.conf.<dev>.hop_limit`); per-route hop-limit metrics are not yet read.
    pub async fn resolve_addr(
        &self,
        src: Option<&ScopedIp>,
        dst: &ScopedIp,
        bound: Option<u32>,
        timeout: Duration,
    ) -> Result<ResolvedAddr> {
        let dst_ip = match dst.class() {
            AddrClass::Any => loopback_of(&dst.ip),
            AddrClass::Multicast => {
                return Err(Error::InvalidArgument(format!(
                    "multicast destination {}: join instead",
                    dst.ip
                )))
            }
            _ => dst.ip,
        };
        let src = src.filter(|s| !s.ip.is_unspecified());
        if let Some(s) = src {
            same_family(&s.ip, &dst_ip)?;
            if s.class() == AddrClass::Multicast {
                return Err(Error::InvalidArgument(format!("multicast source {}", s.ip)));
            }
        }
        let dst_scope = self.required_scope(dst, dst_ip).await?;
        let src_scope = match src {
            Some(s) => self.required_scope(s, s.ip).await?,
            None => None,
        };
        // Read once per resolution and passed on: each query below asks the kernel once.
        let src_ip = src.map(|s| s.ip);
        // One exchange for the independent questions: the bound link, the holder of the
        // source (with the route lookup behind it for 127/8), the unconstrained route.
        let src_route = src_ip.and_then(|s| speculative_route(s, src_scope));
        let dst_route = (classify(&dst_ip) != AddrClass::LinkLocal).then_some((dst_ip, src_ip));
        let mut a = self
            .hv
            .lookups(&Lookups {
                link: bound,
                holder: src_ip.map(|s| (s, src_scope)),
                routes: src_route.into_iter().chain(dst_route).collect(),
            })
            .await?;
        let mut routes = a.routes.into_iter();
        let src_route = src_route.and_then(|_| routes.next());
        let dst_route = dst_route.and_then(|_| routes.next());
        let bound_link = match a.link.take() {
            Some(l) => Some(l?),
            None => None,
        };
        let mut oif = bound;
        for sc in [src_scope, dst_scope].into_iter().flatten() {
            match oif {
                None => oif = Some(sc),
                Some(o) if o != sc => {
                    return Err(Error::InvalidArgument(format!(
                        "scope {sc} disagrees with netdev {o}"
                    )))
                }
                Some(_) => {}
            }
        }
        let src_holder = match src_ip {
            Some(s) => {
                let dump = take_answer(a.holder.take());
                Some((s, self.holder_from(s, src_scope, dump, src_route).await?))
            }
            None => None,
        };
        let query = RouteQuery {
            dst: dst_ip,
            dst_scope,
            src: src_ip,
            oif,
        };
        let c = self.choose_with(&query, bound_link, dst_route).await?;
        let netdev = Netdev::from_link(&c.netdev);
        let next_hop = c.gateway.unwrap_or(dst_ip);
        let dmac = if c.loopback || netdev.loopback {
            netdev.mac
        } else if netdev.noarp {
            MacAddr::default()
        } else {
            self.hv
                .resolve_neighbour(netdev.index, next_hop, timeout)
                .await?
        };
        self.finish(c, netdev, query, Some(dmac), src_holder).await
    }

    /// The scope (ifindex) of a link-local address; `EINVAL` if it has none, `ENODEV` if its
    /// netdev does not exist. `None` for other addresses.
    async fn required_scope(&self, a: &ScopedIp, ip: IpAddr) -> Result<Option<u32>> {
        if classify(&ip) != AddrClass::LinkLocal {
            return Ok(None);
        }
        let scope = a.scope.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("link-local {ip} needs a scope id (%ifname)"))
        })?;
        Ok(Some(self.scope_netdev(scope).await?.index))
    }

    /// The path of a request that arrived on netdev `arrival` for `local` from `peer` (the
    /// passive side): the device is the arrival netdev's and no neighbour entry is needed
    /// (dmac is filled from the neighbour table only if it happens to hold a valid entry).
    ///
    /// Refused with [`Error::Rejected`] (the CM sends REJ reason 28), as Linux's
    /// `cma_ib_id_from_event` / `validate_net_dev` do, when the arrival netdev is down or
    /// gone, when `local` is not ours, or when the arrival netdev is not on the reverse route
    /// (`local` → `peer` with output constrained to it, on-link guesses not counting). A
    /// `peer` that is one of our own addresses is a loopback connection and is accepted
    /// (Linux rejects loopback addresses here; we make loopback work).
    pub async fn accept_path(
        &self,
        arrival: u32,
        local: IpAddr,
        peer: IpAddr,
    ) -> Result<ResolvedAddr> {
        same_family(&local, &peer)?;
        let ll = |ip: &IpAddr| (classify(ip) == AddrClass::LinkLocal).then_some(arrival);
        // Arrival link, holder of `local` and the unconstrained reverse route in one exchange,
        // checked in this order. (No speculative route for `local`: a listener's address is
        // usually held by a link, and the extra lookup costs more than it saves.)
        let rev_route = (classify(&peer) != AddrClass::LinkLocal).then_some((peer, Some(local)));
        let mut a = self
            .hv
            .lookups(&Lookups {
                link: Some(arrival),
                holder: Some((local, ll(&local))),
                routes: rev_route.into_iter().collect(),
            })
            .await?;
        let rev_route = rev_route.and_then(|_| a.routes.pop());
        let link = match take_answer(a.link.take()) {
            Ok(l) => l,
            Err(rdma_hostview::Error::NoDevice(_)) => {
                return Err(Error::Rejected(RejectCause::ArrivalNetdevGone))
            }
            Err(e) => return Err(e.into()),
        };
        if !link.flags.up {
            return Err(Error::Rejected(RejectCause::ArrivalNetdevDown));
        }
        let dump = take_answer(a.holder.take());
        let Ok(local_holder) = self.holder_from(local, ll(&local), dump, None).await else {
            return Err(Error::Rejected(RejectCause::NotOurAddress));
        };
        if matches!(classify(&peer), AddrClass::Any | AddrClass::Multicast) {
            return Err(Error::Rejected(RejectCause::NotOnReverseRoute));
        }
        let query = RouteQuery {
            dst: peer,
            dst_scope: ll(&peer),
            src: Some(local),
            oif: Some(arrival),
        };
        let c = match self.choose_with(&query, Some(link), rev_route).await {
            Ok(c) => c,
            Err(_) => return Err(Error::Rejected(RejectCause::NotOnReverseRoute)),
        };
        let netdev = Netdev::from_link(&c.netdev);
        let dmac = if c.loopback || !netdev.needs_neighbour() {
            Some(netdev.mac)
        } else {
            let hop = c.gateway.unwrap_or(peer);
            match self.hv.neighbour(arrival, hop).await {
                Ok(Some(n)) if n.state.is_valid() => n.mac,
                _ => None,
            }
        };
        self.finish(c, netdev, query, dmac, Some((local, local_holder)))
            .await
    }

    /// Picks netdev, source, gateway and loopback-ness for a query, without neighbours.
    pub(crate) async fn choose(&self, q: &RouteQuery) -> Result<Choice> {
        self.choose_with(q, None, None).await
    }

    /// [`Resolver::choose`] with the link of `q.oif` already read in this resolution (used
    /// instead of reading it again when the choice is that netdev).
    /// `unconstrained`, if given, is the answer to `route_get(q.dst, q.src, None)` asked in the
    /// same exchange as the caller's other questions.
    async fn choose_with(
        &self,
        q: &RouteQuery,
        oif_link: Option<Link>,
        unconstrained: Option<HvResult<RouteAnswer>>,
    ) -> Result<Choice> {
        let oif_link = oif_link.filter(|l| Some(l.index) == q.oif);
        let link = |index: u32| {
            let known = oif_link.as_ref().filter(|l| l.index == index).cloned();
            async move {
                match known {
                    Some(l) => Ok::<Link, Error>(l),
                    None => Ok(self.hv.link(index).await?),
                }
            }
        };
        let dst = q.dst;
        // Local first, unconstrained: with an oif, IPv4 would answer a lookup to an address
        // of another netdev with an on-link guess.
        let (local, unconstrained) = if classify(&dst) == AddrClass::LinkLocal {
            (self.hv.link_holding(dst, q.dst_scope).await.is_ok(), None)
        } else {
            let r = match unconstrained {
                Some(r) => r,
                None => self.hv.route_get(dst, q.src, None).await,
            };
            match r {
                Ok(a) => (a.kind == RouteType::Local, Some(a)),
                Err(e) if q.oif.is_none() => return Err(e.into()),
                Err(_) => (false, None),
            }
        };
        if local {
            let netdev = match q.oif {
                Some(o) => link(o).await?,
                None if dst.is_loopback() => match unconstrained.as_ref().and_then(|a| a.oif) {
                    Some(o) => self.hv.link(o).await?,
                    None => self.holder(dst, None).await?,
                },
                None => self.holder(dst, q.dst_scope).await?,
            };
            let src = match q.src {
                Some(s) => s,
                None => self.local_source(&netdev, dst).await?,
            };
            return Ok(Choice {
                netdev,
                src,
                gateway: None,
                loopback: true,
            });
        }
        let answer = match (q.oif, unconstrained) {
            // IPv6 honours the oif strictly and answers ENETUNREACH where IPv4 guesses
            // on-link (which route_get_bound turns into EHOSTUNREACH): either way the bound
            // netdev has no route, which is EHOSTUNREACH.
            (Some(o), _) => match self.hv.route_get_bound(dst, q.src, o).await {
                Err(rdma_hostview::Error::NetworkUnreachable) => {
                    return Err(Error::HostUnreachable)
                }
                r => r?,
            },
            (None, Some(a)) => a,
            (None, None) => self.hv.route_get(dst, q.src, None).await?,
        };
        if answer.kind != RouteType::Unicast {
            return Err(Error::InvalidArgument(format!(
                "route to {dst} is of type {:?}",
                answer.kind
            )));
        }
        let oif = answer
            .oif
            .ok_or_else(|| Error::NoDevice(format!("route to {dst} has no netdev")))?;
        let netdev = link(oif).await?;
        let src = q
            .src
            .or(answer.prefsrc)
            .ok_or_else(|| Error::AddressNotAvailable(format!("no source address for {dst}")))?;
        Ok(Choice {
            netdev,
            src,
            gateway: answer.gateway,
            loopback: false,
        })
    }

    /// The source for a loopback connection on `netdev` without a given source: the
    /// destination itself if the netdev holds it, else the netdev's first address of the
    /// family (link-local only for a link-local destination), else the destination.
    async fn local_source(&self, netdev: &Link, dst: IpAddr) -> Result<IpAddr> {
        let addrs: Vec<IpAddr> = self
            .hv
            .addresses()
            .await?
            .into_iter()
            .filter(|a| a.link == netdev.index && a.addr.is_ipv4() == dst.is_ipv4())
            .map(|a| a.addr)
            .collect();
        if addrs.contains(&dst) || dst.is_loopback() {
            return Ok(dst);
        }
        let want_ll = classify(&dst) == AddrClass::LinkLocal;
        Ok(addrs
            .iter()
            .copied()
            .find(|a| (classify(a) == AddrClass::LinkLocal) == want_ll)
            .unwrap_or(dst))
    }

    async fn finish(
        &self,
        c: Choice,
        netdev: Netdev,
        query: RouteQuery,
        dmac: Option<MacAddr>,
        src_holder: Option<(IpAddr, u32)>,
    ) -> Result<ResolvedAddr> {
        let src_scope = (classify(&c.src) == AddrClass::LinkLocal).then_some(netdev.index);
        // The holder of a given source was looked up at the start of this resolution; a
        // link-local one is looked up again under the chosen netdev's scope.
        let known = src_holder.filter(|(ip, _)| *ip == c.src && src_scope.is_none());
        let src_netdev = match known {
            Some((_, index)) => index,
            None => match self.holder_index(c.src, src_scope).await {
                Ok(index) => index,
                Err(_) => netdev.index,
            },
        };
        let dst = query.dst;
        Ok(ResolvedAddr {
            src: c.src,
            src_scope,
            src_netdev,
            dst,
            dst_scope: query
                .dst_scope
                .or((classify(&dst) == AddrClass::LinkLocal).then_some(netdev.index)),
            sgid: Gid::from_ip(c.src),
            dgid: Gid::from_ip(dst),
            gateway: c.gateway,
            next_hop: c.gateway.unwrap_or(dst),
            smac: netdev.mac,
            dmac,
            mtu: netdev.mtu,
            hop_limit: self.default_hop_limit(&dst, &netdev.name),
            loopback: c.loopback,
            netdev,
            query,
        })
    }
}

const IPV4_TTL: &str = "/proc/sys/net/ipv4/ip_default_ttl";

type HvResult<T> = std::result::Result<T, rdma_hostview::Error>;

/// The route lookup [`Resolver::holder_from`] falls back to, worth asking up front: for an
/// IPv4 loopback address without scope (any 127/8 address is local through `lo`'s /8
/// route, few are addresses of a link).
fn speculative_route(ip: IpAddr, scope: Option<u32>) -> Option<(IpAddr, Option<IpAddr>)> {
    (scope.is_none() && ip.is_ipv4() && ip.is_loopback()).then_some((ip, None))
}

/// An answer that [`HostView::lookups`] was asked for (always present then).
fn take_answer<T>(a: Option<HvResult<T>>) -> HvResult<T> {
    a.unwrap_or_else(|| Err(rdma_hostview::Error::Netlink("lookups: no answer".into())))
}

impl Resolver {
    /// The kernel's default hop limit for packets to `dst` out of netdev `name`, read now
    /// from `/proc/sys` (IPv4: the file opened with the resolver, in its namespace; IPv6:
    /// the netdev's `hop_limit` in the calling thread's namespace); 64 if unreadable.
    fn default_hop_limit(&self, dst: &IpAddr, name: &str) -> u8 {
        let parse = |t: &str| t.trim().parse().ok();
        let v = match (dst, &self.ttl) {
            (IpAddr::V4(_), Some(f)) => {
                let mut buf = [0u8; 16];
                f.read_at(&mut buf, 0)
                    .ok()
                    .and_then(|n| std::str::from_utf8(buf.get(..n)?).ok().and_then(parse))
            }
            (IpAddr::V4(_), None) => std::fs::read_to_string(IPV4_TTL)
                .ok()
                .and_then(|t| parse(&t)),
            (IpAddr::V6(_), _) => {
                std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{name}/hop_limit"))
                    .ok()
                    .and_then(|t| parse(&t))
            }
        };
        v.unwrap_or(64)
    }
}
