//! Address resolution (`rdma_resolve_addr`): the full-tuple route lookup, the neighbour.

use std::net::IpAddr;
use std::time::Duration;

use rdma_hostview::{Lookups, MacAddr};

use super::{speculative_route, take_answer, Netdev, ResolvedAddr, Resolver, RouteQuery};
use crate::error::{Error, Result};
use crate::host::addr::{classify, loopback_of, same_family, AddrClass, ScopedIp};

impl Resolver {
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
    /// The hop limit is the kernel's default for the netdev (`net.ipv4.ip_default_ttl`, read
    /// at most once a second; `net.ipv6.conf.<dev>.hop_limit`); per-route hop-limit metrics
    /// are not yet read.
    pub async fn resolve_addr(
        &self,
        src: Option<&ScopedIp>,
        dst: &ScopedIp,
        bound: Option<u32>,
        timeout: Duration,
    ) -> Result<ResolvedAddr> {
        let dst_ip = match dst.class() {
            AddrClass::Any => loopback_of(&dst.ip),
            // a group, to join (`crate::cm::mcast`): routed as the kernel routes it (by the bound
            // source's netdev), no neighbour to ask
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
        let dmac = if dst_ip.is_multicast() {
            crate::host::addr::group_mac(dst_ip)
        } else if c.loopback || netdev.loopback {
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
}
