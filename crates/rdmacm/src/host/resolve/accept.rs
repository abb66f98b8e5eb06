//! The passive side's path: from where a request arrived, or the cause of its refusal.

use std::net::IpAddr;

use rdma_hostview::Lookups;

use super::{take_answer, Netdev, ResolvedAddr, Resolver, RouteQuery};
use crate::error::{Error, RejectCause, Result};
use crate::host::addr::{classify, same_family, AddrClass};

impl Resolver {
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
}
