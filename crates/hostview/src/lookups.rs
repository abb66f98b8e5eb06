//! Several independent queries in one exchange with the kernel.

use std::net::IpAddr;

use netlink_packet_core::{NetlinkDeserializable, NLM_F_DUMP};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::RouteNetlinkMessage;

use crate::addr_entry::family_of;
use crate::error::{Error, Result};
use crate::route::{lookup_message, RouteAnswer};
use crate::{Address, HostView, Link};

/// What to ask in one [`HostView::lookups`] call; every part is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookups {
    /// A link, as [`HostView::link`].
    pub link: Option<u32>,
    /// The holder of an address (and scope), as [`HostView::index_holding`].
    pub holder: Option<(IpAddr, Option<u32>)>,
    /// Unconstrained route lookups `(dst, src)`, as [`HostView::route_get`] without `oif`.
    pub routes: Vec<(IpAddr, Option<IpAddr>)>,
}

/// The answers of [`HostView::lookups`], each exactly what the single query would return.
#[derive(Debug)]
pub struct LookupAnswers {
    /// Answer to [`Lookups::link`].
    pub link: Option<Result<Link>>,
    /// Answer to [`Lookups::holder`].
    pub holder: Option<Result<u32>>,
    /// Answers to [`Lookups::routes`], in order.
    pub routes: Vec<Result<RouteAnswer>>,
}

enum Slot {
    Link(u32, Option<Link>),
    Holder(IpAddr, Option<u32>, Option<u32>),
    Route(usize, IpAddr, Option<RouteAnswer>),
}

impl HostView {
    /// Asks several independent questions at once: the requests go to the kernel in one
    /// datagram, which it answers message by message within the `send`, so the answers are
    /// those of the same moment and the exchange costs one `send` (and the `recv`s of the
    /// answers) instead of one round per question. A view that keeps answers (the default)
    /// gives the kept ones and asks the kernel only for the others, one at a time. Each
    /// answer is what [`HostView::link`], [`HostView::index_holding`] or
    /// [`HostView::route_get`] (no `oif`) would give.
    ///
    /// ```no_run
    /// # async fn f(hv: &rdma_hostview::HostView) -> rdma_hostview::Result<()> {
    /// let q = rdma_hostview::Lookups {
    ///     link: Some(1),
    ///     holder: Some(("127.0.0.1".parse().unwrap(), None)),
    ///     routes: vec![("127.0.0.1".parse().unwrap(), None)],
    /// };
    /// let a = hv.lookups(&q).await?;
    /// assert_eq!(a.holder.unwrap()?, 1);
    /// # Ok(()) }
    /// ```
    pub async fn lookups(&self, q: &Lookups) -> Result<LookupAnswers> {
        if self.cache.is_some() {
            // from what is kept: only what is not goes to the kernel, one question at a time
            let mut a = LookupAnswers {
                link: None,
                holder: None,
                routes: Vec::with_capacity(q.routes.len()),
            };
            for (dst, src) in &q.routes {
                a.routes.push(self.route_get(*dst, *src, None).await);
            }
            if let Some(i) = q.link {
                a.link = Some(self.link(i).await);
            }
            if let Some((ip, scope)) = q.holder {
                a.holder = Some(self.index_holding(ip, scope).await);
            }
            return Ok(a);
        }
        self.ask(q)
    }

    /// [`HostView::lookups`] with every question sent to the kernel.
    fn ask(&self, q: &Lookups) -> Result<LookupAnswers> {
        let mut msgs = Vec::new();
        let mut slots = Vec::new();
        let mut early: Vec<(usize, Error)> = Vec::new();
        if let Some(i) = q.link {
            let mut m = LinkMessage::default();
            m.header.index = i;
            msgs.push((RouteNetlinkMessage::GetLink(crate::links::skip_stats(m)), 0));
            slots.push(Slot::Link(i, None));
        }
        if let Some((ip, scope)) = q.holder {
            let mut m = AddressMessage::default();
            m.header.family = family_of(&ip);
            msgs.push((RouteNetlinkMessage::GetAddress(m), NLM_F_DUMP));
            slots.push(Slot::Holder(ip, scope, None));
        }
        for (k, (dst, src)) in q.routes.iter().enumerate() {
            if src.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
                early.push((
                    k,
                    Error::InvalidArgument(format!(
                        "source {src:?} and destination {dst} are of different families"
                    )),
                ));
                continue;
            }
            let m: RouteMessage = lookup_message(*dst, *src, None, false);
            msgs.push((RouteNetlinkMessage::GetRoute(m), 0));
            slots.push(Slot::Route(k, *dst, None));
        }
        let results = self.nl.exchange_many("lookups", msgs, |i, h, payload| {
            match slots.get_mut(i) {
                Some(Slot::Link(_, found)) if h.message_type == libc::RTM_NEWLINK => {
                    *found = Link::from_raw(payload);
                }
                Some(Slot::Holder(ip, scope, found))
                    if h.message_type == libc::RTM_NEWADDR && found.is_none() =>
                {
                    *found = Address::from_raw(payload)
                        .filter(|a| a.is(*ip, *scope))
                        .map(|a| a.link);
                }
                Some(Slot::Route(_, dst, found)) => {
                    if let RouteNetlinkMessage::NewRoute(r) =
                        RouteNetlinkMessage::deserialize(h, payload)
                            .map_err(|e| Error::Netlink(format!("RTM_GETROUTE: {e}")))?
                    {
                        *found = Some(RouteAnswer::from_message(&r, *dst));
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        let mut out = LookupAnswers {
            link: None,
            holder: None,
            routes: Vec::new(),
        };
        let mut routes: Vec<Option<Result<RouteAnswer>>> =
            (0..q.routes.len()).map(|_| None).collect();
        for (k, e) in early {
            if let Some(r) = routes.get_mut(k) {
                *r = Some(Err(e));
            }
        }
        for (slot, r) in slots.into_iter().zip(results) {
            match slot {
                Slot::Link(i, found) => {
                    out.link = Some(match r {
                        Err(e) if e.errno() == libc::ENODEV => {
                            Err(Error::NoDevice(format!("ifindex {i}")))
                        }
                        Err(e) => Err(e),
                        Ok(()) => found.ok_or_else(|| Error::NoDevice(format!("ifindex {i}"))),
                    })
                }
                Slot::Holder(ip, _, found) => {
                    out.holder = Some(r.and_then(|()| found.ok_or(Error::AddressNotAvailable(ip))))
                }
                Slot::Route(k, _, found) => {
                    if let Some(x) = routes.get_mut(k) {
                        *x = Some(r.and_then(|()| {
                            found.ok_or_else(|| Error::Netlink("RTM_GETROUTE: no answer".into()))
                        }));
                    }
                }
            }
        }
        out.routes = routes
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Netlink("lookups: no answer".into()))))
            .collect();
        Ok(out)
    }
}
