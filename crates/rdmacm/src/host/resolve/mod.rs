//! Binding and address resolution on the host's real network state: which netdev (and so
//! which software device, named after it) and which path an id uses.
//!
//! The records (`types`), binding and the holder of an address (here), address
//! resolution (`active`), the passive side's path (`accept`), and the route choice and the
//! finished record both share (`choose`).

use std::net::IpAddr;
use std::sync::Arc;

use rdma_hostview::{HostView, Link, Lookups, RouteAnswer, RouteType};

use crate::error::{Error, Result};
use crate::host::addr::{AddrClass, Gid, ScopeId, ScopedIp};

mod accept;
mod active;
mod choose;
mod hop;
mod types;

pub(crate) use types::Choice;
pub use types::{Binding, GidEntry, Netdev, ResolvedAddr, RouteQuery};

/// Binds and resolves addresses on the host's network state (through [`HostView`]).
///
/// Create it inside a tokio runtime, in the network namespace it should see. Cloning is
/// cheap (it shares the netlink connection).
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// use std::time::Duration;
/// use rdmacm::host::{Resolver, ScopedIp};
/// let r = Resolver::new()?;
/// let b = r.bind(&"127.0.0.1".parse()?).await?;
/// assert_eq!(b.netdev.as_ref().map(|n| n.name.as_str()), Some("lo"));
/// let dst: ScopedIp = "127.0.0.1".parse()?;
/// let a = r.resolve_addr(None, &dst, None, Duration::from_secs(2)).await?;
/// assert!(a.loopback);
/// let path = r.resolve_route(&a, &rdmacm::host::RouteParams::default()).await?;
/// println!("{} -> {} mtu {:?}", path.sgid, path.dgid, path.mtu);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Resolver {
    hv: HostView,
    /// `net.ipv4.ip_default_ttl` of the resolver's namespace, opened once, read at most
    /// once a second (`hop.rs`).
    ttl: Arc<hop::DefaultTtl>,
}

impl Resolver {
    /// Opens a netlink connection in the calling thread's namespace (inside a tokio runtime).
    pub fn new() -> Result<Resolver> {
        Ok(Resolver::from_view(HostView::new()?))
    }

    /// A resolver over an existing host view.
    pub fn from_view(hv: HostView) -> Resolver {
        let ttl = Arc::new(hop::DefaultTtl::open());
        Resolver { hv, ttl }
    }

    /// A resolver for one operation: its questions are answered as of its first one (see
    /// [`HostView::at_once`]).
    ///
    /// ```no_run
    /// # async fn f(r: &rdmacm::host::Resolver) -> rdmacm::Result<()> {
    /// let b = r.at_once().bind(&"127.0.0.1".parse()?).await?;
    /// # let _ = b;
    /// # Ok(()) }
    /// ```
    pub fn at_once(&self) -> Resolver {
        Resolver {
            hv: self.hv.at_once(),
            ttl: self.ttl.clone(),
        }
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
}

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
