//! The host's network, read over rtnetlink: links, addresses, route lookups, neighbours, and a
//! monitor of their changes. Built on the rust-netlink crates (`rtnetlink`,
//! `netlink-packet-route`, `netlink-sys`); it sees the network namespace of the thread that
//! creates the [`HostView`] / [`Monitor`].
//!
//! * [`HostView`]: async (tokio) queries — [`HostView::links`], [`HostView::addresses`],
//!   [`HostView::link_holding`], [`HostView::route_get`], [`HostView::route_get_bound`],
//!   [`HostView::routes`], [`HostView::neighbour`], [`HostView::resolve_neighbour`].
//! * [`Monitor`]: one multicast netlink socket (links, IPv4/IPv6 addresses and routes,
//!   neighbours) yielding typed [`Event`]s.
//! * [`BlockingHostView`]: the same queries for blocking callers; it owns a small
//!   current-thread tokio runtime.
//! * [`Error`]: typed errors, [`Error::errno`] gives the errno rdma_cm would report.
//!
//! ```no_run
//! # async fn f() -> rdma_hostview::Result<()> {
//! use std::time::Duration;
//! let hv = rdma_hostview::HostView::new()?;
//! let route = hv.route_get("192.0.2.2".parse().unwrap(), None, None).await?;
//! let mac = hv
//!     .resolve_neighbour(route.oif.unwrap(), route.next_hop(), Duration::from_secs(1))
//!     .await?;
//! println!("via {:?} from {:?}, MAC {mac}", route.oif, route.prefsrc);
//! # Ok(()) }
//! ```
//!
//! # How `route_get` detects the kernel's on-link guess
//!
//! A lookup with an output netdev (`oif`) is what `ip route get DST oif DEV` does. When no
//! route through DEV covers DST, IPv4 does not fail: it synthesises a unicast route "on link"
//! out of DEV (`ip_route_output_key_hash_rcu`, "assume the destination is on link"), which has
//! no FIB entry behind it. So for every constrained lookup answered with a unicast route,
//! `route_get` asks the kernel the same question again with `RTM_F_FIB_MATCH` (`ip route get
//! fibmatch ...`, Linux ≥ 4.13): the kernel then answers with the FIB entry that matched, or
//! with `EHOSTUNREACH`/`ENETUNREACH` when there is none. No entry, or an entry that does not
//! go out through `oif`, marks the answer [`RouteOrigin::OnLinkGuess`];
//! [`HostView::route_get_bound`] turns that (and an answer through another netdev, which IPv6
//! may give) into an immediate `EHOSTUNREACH`. The check uses the kernel's own lookup (rules,
//! tables, metrics), so it never disagrees with the route the kernel would use.
//!
//! # How neighbour resolution is kicked
//!
//! [`HostView::resolve_neighbour`] first subscribes to neighbour notifications, then reads the
//! entry (RTM_GETNEIGH); a valid one answers at once. Otherwise it sends RTM_NEWNEIGH with the
//! `NTF_USE` flag (and `NLM_F_CREATE`): the kernel creates the entry if needed and runs
//! `neigh_event_send` on it — the same call a queued packet makes — so ARP / neighbour
//! solicitation starts with the kernel's own probe counts and timers, and no datagram is sent
//! to the peer. Should a kernel refuse that, an empty UDP datagram to the discard port 9 of the
//! next hop, bound to the netdev, triggers the same resolution. The result is awaited on the
//! subscription until the entry becomes valid (MAC), FAILED (`EHOSTUNREACH`) or the deadline
//! passes (`ETIMEDOUT`).

#![warn(missing_docs)]

mod addr_entry;
mod addrs;
mod blocking;
mod cache;
mod error;
mod links;
mod lookups;
mod monitor;
mod neigh;
mod neigh_entry;
mod nl;
mod route;

pub use addr_entry::{is_link_local, Address, Scope};
pub use blocking::BlockingHostView;
pub use error::{Error, Result};
pub use links::{Link, LinkFlags, MacAddr};
pub use lookups::{LookupAnswers, Lookups};
pub use monitor::{Event, Monitor};
pub use neigh_entry::{NeighState, Neighbour};
pub use route::{RouteAnswer, RouteEntry, RouteOrigin, RouteType};

/// Async view of the host's network state in the current network namespace.
///
/// Queries are plain `send`/`recv` exchanges on one netlink socket (the kernel answers within
/// the `send`), so they complete when first polled; neighbour resolution and [`Monitor`]s
/// need a tokio runtime. Links, addresses and route lookups are answered from what was
/// kept while a subscription to their changes stays silent (see the `cache` module: as
/// current as a kernel query, without one per question).
///
/// ```no_run
/// # async fn f() -> rdma_hostview::Result<()> {
/// let hv = rdma_hostview::HostView::new()?;
/// for link in hv.links().await? {
///     println!("{} {} up={}", link.index, link.name, link.is_usable());
/// }
/// let lo = hv.link_holding("127.0.0.1".parse().unwrap(), None).await?;
/// assert!(lo.flags.loopback);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HostView {
    nl: std::sync::Arc<nl::Requester>,
    /// `None` if the subscription could not be opened: every query asks the kernel.
    cache: Option<std::sync::Arc<cache::Cache>>,
    /// [`HostView::at_once`]: set once the kept answers were brought up to date.
    once: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl HostView {
    /// Opens a netlink route socket in the calling thread's network namespace, and a
    /// subscription to its link, address, route and rule changes; clones share them (one
    /// exchange at a time, answers matched by sequence number).
    pub fn new() -> Result<HostView> {
        Ok(HostView {
            cache: cache::Cache::new().ok().map(std::sync::Arc::new),
            ..HostView::uncached()?
        })
    }

    /// A view for one resolution: its first question brings what is kept up to date (one
    /// `recv` on the change subscription); the later ones use what is kept without that
    /// `recv`, so they are never older than the first question (a change after it may go
    /// unseen, as if all were asked at once). After a wait (neighbour resolution) the next
    /// question brings it up to date again. Use one per operation and drop it.
    ///
    /// ```no_run
    /// # async fn f(hv: &rdma_hostview::HostView) -> rdma_hostview::Result<()> {
    /// let now = hv.at_once();
    /// let lo = now.link_holding("127.0.0.1".parse().unwrap(), None).await?;
    /// let route = now.route_get("127.0.0.1".parse().unwrap(), None, Some(lo.index)).await?;
    /// # let _ = route;
    /// # Ok(()) }
    /// ```
    pub fn at_once(&self) -> HostView {
        HostView {
            once: Some(Default::default()),
            ..self.clone()
        }
    }

    /// After a wait: the next question of an [`HostView::at_once`] view syncs again.
    fn sync_again(&self) {
        if let Some(done) = &self.once {
            done.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether a question of this view must first bring the kept answers up to date.
    fn sync_first(&self) -> bool {
        self.once
            .as_ref()
            .is_none_or(|done| !done.swap(true, std::sync::atomic::Ordering::Relaxed))
    }

    /// A view that asks the kernel at every query (nothing kept): for comparisons and
    /// measurements.
    ///
    /// ```no_run
    /// let hv = rdma_hostview::HostView::uncached().unwrap();
    /// # let _ = hv;
    /// ```
    pub fn uncached() -> Result<HostView> {
        Ok(HostView {
            nl: std::sync::Arc::new(nl::Requester::new()?),
            cache: None,
            once: None,
        })
    }

    /// How many dumps (whole link, address, route or neighbour lists) this view and its
    /// clones asked the kernel for: what keeping answers saves. A view that keeps them asks
    /// again only after a change; [`HostView::uncached`] asks at every question.
    ///
    /// ```no_run
    /// # async fn f() -> rdma_hostview::Result<()> {
    /// let hv = rdma_hostview::HostView::new()?;
    /// hv.links().await?;
    /// let dumps = hv.kernel_dumps();
    /// hv.links().await?; // nothing changed: kept
    /// assert_eq!(hv.kernel_dumps(), dumps);
    /// # Ok(()) }
    /// ```
    pub fn kernel_dumps(&self) -> u64 {
        self.nl.dumps()
    }

    /// A change monitor in the same namespace (see [`Monitor::new`]).
    pub async fn monitor(&self) -> Result<Monitor> {
        Monitor::new().await
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLM_F_DUMP;
    use netlink_packet_route::address::AddressMessage;
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::RouteNetlinkMessage;

    use super::*;

    /// The raw readers of link and address answers agree with the full parser.
    #[test]
    fn raw_readers_match_the_full_parser() {
        let hv = HostView::new().unwrap();
        let full_links: Vec<Link> = hv
            .nl
            .request(
                "RTM_GETLINK",
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                NLM_F_DUMP,
            )
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let links = rt.block_on(hv.links()).unwrap();
        assert!(!links.is_empty());
        assert_eq!(links, full_links);
        for l in &links {
            assert_eq!(&rt.block_on(hv.link(l.index)).unwrap(), l);
        }
        let full_addrs: Vec<Address> = hv
            .nl
            .request(
                "RTM_GETADDR",
                RouteNetlinkMessage::GetAddress(AddressMessage::default()),
                NLM_F_DUMP,
            )
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => Address::from_message(a),
                _ => None,
            })
            .collect();
        let addrs = rt.block_on(hv.addresses()).unwrap();
        assert!(!addrs.is_empty());
        assert_eq!(addrs, full_addrs);
        for a in &addrs {
            assert_eq!(
                rt.block_on(hv.index_holding(a.addr, Some(a.link))).unwrap(),
                a.link
            );
        }
        assert_eq!(
            rt.block_on(hv.link(0x7fff_fff0)).unwrap_err().errno(),
            libc::ENODEV
        );
    }

    /// Several lookups in one datagram answer exactly as the single queries do.
    #[test]
    fn lookups_agree_with_single_queries() {
        let hv = HostView::new().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let same = |a: &Result<RouteAnswer>, b: &Result<RouteAnswer>| match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (Err(x), Err(y)) => x.errno() == y.errno(),
            _ => false,
        };
        let cases = [
            (
                Some(1),
                Some((ip("127.0.0.1"), None)),
                vec![(ip("127.0.0.1"), Some(ip("127.0.0.2")))],
            ),
            (
                Some(0x7fff_fff0),
                Some((ip("127.0.0.2"), None)),
                vec![(ip("127.0.0.2"), None)],
            ),
            (
                None,
                Some((ip("::1"), Some(1))),
                vec![(ip("::1"), None), (ip("::1"), Some(ip("127.0.0.1")))],
            ),
            (
                None,
                None,
                vec![
                    (ip("192.0.2.77"), None),
                    (ip("203.0.113.9"), None),
                    (ip("fe80::1"), None),
                ],
            ),
            (Some(1), None, vec![]),
            (None, None, vec![]),
        ];
        for (link, holder, routes) in cases {
            let q = Lookups {
                link,
                holder,
                routes: routes.clone(),
            };
            let a = rt.block_on(hv.lookups(&q)).unwrap();
            match (link, &a.link) {
                (None, None) => {}
                (Some(i), Some(r)) => match (rt.block_on(hv.link(i)), r) {
                    (Ok(x), Ok(y)) => assert_eq!(&x, y),
                    (Err(x), Err(y)) => assert_eq!(x.errno(), y.errno()),
                    (x, y) => panic!("link {i}: {x:?} vs {y:?}"),
                },
                (l, r) => panic!("link {l:?}: {r:?}"),
            }
            match (holder, &a.holder) {
                (None, None) => {}
                (Some((h, sc)), Some(r)) => match (rt.block_on(hv.index_holding(h, sc)), r) {
                    (Ok(x), Ok(y)) => assert_eq!(x, *y),
                    (Err(x), Err(y)) => assert_eq!(x.errno(), y.errno()),
                    (x, y) => panic!("holder {h}: {x:?} vs {y:?}"),
                },
                (h, r) => panic!("holder {h:?}: {r:?}"),
            }
            assert_eq!(a.routes.len(), routes.len());
            for ((dst, src), r) in routes.iter().zip(&a.routes) {
                let single = rt.block_on(hv.route_get(*dst, *src, None));
                assert!(same(&single, r), "{dst} from {src:?}: {single:?} vs {r:?}");
            }
        }
    }
}
