//! Links, addresses and route answers kept until the kernel says they changed.
//!
//! A [`Cache`] holds a NETLINK_ROUTE socket subscribed to link, IPv4/IPv6 address, route,
//! rule and nexthop notifications, opened *before* the first dump. The kernel queues a
//! notification on it inside the call that made the change (`rtnl_notify` runs under RTNL
//! in the changer's context), so when a query finds the socket empty, no change has
//! completed since the dump it keeps: the answer is as current as a fresh dump would be.
//! One exception: the kernel announces a new IPv6 address from its duplicate address
//! detection work, a moment after the call that added it (with `nodad` too), while a dump
//! lists it at once; until the announcement a kept view does not list it, except that a
//! question for that one address (`HostView::index_holding`, a bind's) asks the kernel when
//! the kept addresses lack it.
//! Each query drains the socket first (one non-blocking `recv` when nothing changed); any link notification drops
//! the kept links and addresses, any address notification drops the addresses, and an
//! overrun (`ENOBUFS`: notifications lost) drops both. The next query dumps again, so the
//! kept lists are always whole kernel dumps, in the kernel's order.
//!
//! Route lookups (`route_get` answers, by destination, source and output netdev) are kept
//! too, and all dropped by any notification at all: a route, rule or nexthop change, and
//! any link or address change (routes that go with a link or an address are removed
//! without a notification of their own). A kept answer also expires after [`ROUTE_TTL`],
//! which bounds how long a lookup-changing sysctl without a notification (the multipath
//! hash policy, say) goes unseen. At most [`ROUTES`] answers are kept. Neighbours are
//! never kept.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::addr_entry::Address;
use crate::error::Result;
use crate::links::Link;
use crate::route::RouteAnswer;

/// How long a kept route answer is used.
pub(crate) const ROUTE_TTL: Duration = Duration::from_secs(1);
/// Most route answers kept (all are dropped when a new one finds the table full).
pub(crate) const ROUTES: usize = 4096;

/// A route lookup: destination, source, output netdev.
pub(crate) type RouteKey = (IpAddr, Option<IpAddr>, Option<u32>);

/// What is kept, and the subscription that says when it goes stale.
#[derive(Debug)]
pub(crate) struct Cache {
    inner: Mutex<Kept>,
}

#[derive(Debug)]
struct Kept {
    sock: Socket,
    links: Option<Arc<[Link]>>,
    addrs: Option<Arc<[Address]>>,
    routes: HashMap<RouteKey, (RouteAnswer, Instant)>,
}

/// What a drain of the subscription found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Changed {
    links: bool,
    addrs: bool,
    routes: bool,
}

impl Cache {
    /// Subscribes in the calling thread's network namespace.
    pub(crate) fn new() -> Result<Cache> {
        let groups = [
            libc::RTNLGRP_LINK,
            libc::RTNLGRP_IPV4_IFADDR,
            libc::RTNLGRP_IPV6_IFADDR,
            libc::RTNLGRP_IPV4_ROUTE,
            libc::RTNLGRP_IPV6_ROUTE,
            libc::RTNLGRP_IPV4_RULE,
            libc::RTNLGRP_IPV6_RULE,
            libc::RTNLGRP_NEXTHOP,
        ];
        let mask = groups.iter().fold(0u32, |m, g| m | (1 << (g - 1)));
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, mask))?;
        sock.set_non_blocking(true)?;
        Ok(Cache {
            inner: Mutex::new(Kept {
                sock,
                links: None,
                addrs: None,
                routes: HashMap::new(),
            }),
        })
    }

    /// The links, from the kept dump or from `dump` (kept until the next link change).
    /// `sync`: drain the subscription first (see `HostView::at_once` for when not).
    pub(crate) fn links(
        &self,
        sync: bool,
        dump: impl FnOnce() -> Result<Vec<Link>>,
    ) -> Result<Arc<[Link]>> {
        self.kept(sync, |k| &mut k.links, dump)
    }

    /// The addresses (both families), from the kept dump or from `dump`.
    pub(crate) fn addresses(
        &self,
        sync: bool,
        dump: impl FnOnce() -> Result<Vec<Address>>,
    ) -> Result<Arc<[Address]>> {
        self.kept(sync, |k| &mut k.addrs, dump)
    }

    /// Drops the kept addresses (a dump found one they lack): the next question dumps.
    pub(crate) fn forget_addresses(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).addrs = None;
    }

    /// The dump `slot` keeps, or `dump`'s answer, then kept there.
    fn kept<T>(
        &self,
        sync: bool,
        slot: impl Fn(&mut Kept) -> &mut Option<Arc<[T]>>,
        dump: impl FnOnce() -> Result<Vec<T>>,
    ) -> Result<Arc<[T]>> {
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if sync {
            k.sync();
        }
        if let Some(v) = slot(&mut k) {
            return Ok(v.clone());
        }
        let v: Arc<[T]> = dump()?.into();
        *slot(&mut k) = Some(v.clone());
        Ok(v)
    }

    /// The answer to a route lookup, kept or from `ask` (kept if it succeeds). `ask` runs
    /// under the cache's lock, so no change drained meanwhile by another query can leave an
    /// answer older than it kept.
    pub(crate) fn route(
        &self,
        sync: bool,
        key: RouteKey,
        ask: impl FnOnce() -> Result<RouteAnswer>,
    ) -> Result<RouteAnswer> {
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if sync {
            k.sync();
        }
        let now = Instant::now();
        if let Some((a, at)) = k.routes.get(&key) {
            if now.duration_since(*at) < ROUTE_TTL {
                return Ok(a.clone());
            }
        }
        let a = ask()?;
        if k.routes.len() >= ROUTES {
            k.routes.clear();
        }
        k.routes.insert(key, (a.clone(), now));
        Ok(a)
    }
}

impl Kept {
    /// Drops what the queued notifications make stale.
    fn sync(&mut self) {
        let c = drain(&self.sock);
        if c.links || c.addrs || c.routes {
            self.routes.clear();
        }
        if c.links {
            self.links = None;
            // a removed link takes its addresses with it
            self.addrs = None;
        }
        if c.addrs {
            self.addrs = None;
        }
    }
}

/// Reads every queued notification (only the type of each is needed); an overrun or an
/// unexpected error counts as a change of everything.
fn drain(sock: &Socket) -> Changed {
    let mut c = Changed::default();
    // The header is all we read; MSG_TRUNC consumes the rest of the datagram.
    let mut head = [0u8; 16];
    loop {
        let mut b: &mut [u8] = &mut head[..];
        match sock.recv(&mut b, libc::MSG_TRUNC | libc::MSG_DONTWAIT) {
            Ok(n) if n >= 6 => match u16::from_ne_bytes([head[4], head[5]]) {
                libc::RTM_NEWLINK | libc::RTM_DELLINK => c.links = true,
                libc::RTM_NEWADDR | libc::RTM_DELADDR => c.addrs = true,
                _ => c.routes = true,
            },
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return c,
            Err(_) => {
                // ENOBUFS (notifications lost) or worse: trust nothing kept
                return Changed {
                    links: true,
                    addrs: true,
                    routes: true,
                };
            }
        }
    }
}
