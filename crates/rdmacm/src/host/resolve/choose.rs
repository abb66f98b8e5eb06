//! The route choice behind both sides (netdev, source, gateway, loopback-ness) and the
//! finished [`ResolvedAddr`] with its hop limit.

use std::net::IpAddr;

use rdma_hostview::{Link, MacAddr, RouteAnswer, RouteType};

use super::{Choice, HvResult, Netdev, ResolvedAddr, Resolver, RouteQuery};
use crate::error::{Error, Result};
use crate::host::addr::{classify, AddrClass, Gid};

impl Resolver {
    /// Picks netdev, source, gateway and loopback-ness for a query, without neighbours.
    pub(crate) async fn choose(&self, q: &RouteQuery) -> Result<Choice> {
        self.choose_with(q, None, None).await
    }

    /// [`Resolver::choose`] with the link of `q.oif` already read in this resolution (used
    /// instead of reading it again when the choice is that netdev).
    /// `unconstrained`, if given, is the answer to `route_get(q.dst, q.src, None)` asked in the
    /// same exchange as the caller's other questions.
    pub(super) async fn choose_with(
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
        // a group's route (multicast join): the kernel picks the netdev of the source
        let group = dst.is_multicast() && answer.kind == RouteType::Multicast;
        if answer.kind != RouteType::Unicast && !group {
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

    pub(super) async fn finish(
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

    /// The kernel's default hop limit for packets to `dst` out of netdev `name` (IPv4: the
    /// resolver's namespace's `ip_default_ttl`, read at most once a second; IPv6: the
    /// netdev's `hop_limit`, read now in the calling thread's namespace); 64 if unreadable.
    fn default_hop_limit(&self, dst: &IpAddr, name: &str) -> u8 {
        let v = match dst {
            IpAddr::V4(_) => self.ttl.get(std::time::Instant::now()),
            IpAddr::V6(_) => {
                std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{name}/hop_limit"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            }
        };
        v.unwrap_or(64)
    }
}
