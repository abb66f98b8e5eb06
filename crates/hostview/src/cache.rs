//! Links and addresses answered from the last dump until the kernel says they changed.
//!
//! A [`Cache`] holds a NETLINK_ROUTE socket subscribed to link and IPv4/IPv6 address
//! notifications, opened *before* the first dump. The kernel queues a notification on it
//! inside the call that made the change (`rtnl_notify` runs under RTNL in the changer's
//! context), so when a query finds the socket empty, no change has completed since the
//! dump it keeps: the answer is as current as a fresh dump would be. Each query drains the
//! socket first (one non-blocking `recv` when nothing changed); any link notification drops
//! the kept links and addresses, any address notification drops the addresses, and an
//! overrun (`ENOBUFS`: notifications lost) drops both. The next query dumps again, so the
//! kept lists are always whole kernel dumps, in the kernel's order.
//!
//! Routes and neighbours are not kept: a route lookup depends on rules, tables and the
//! source, and is one kernel exchange anyway.

use std::sync::{Arc, Mutex};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::addrs::Address;
use crate::error::Result;
use crate::links::Link;

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
}

/// What a drain of the subscription found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Changed {
    links: bool,
    addrs: bool,
}

impl Cache {
    /// Subscribes in the calling thread's network namespace.
    pub(crate) fn new() -> Result<Cache> {
        let groups = [
            libc::RTNLGRP_LINK,
            libc::RTNLGRP_IPV4_IFADDR,
            libc::RTNLGRP_IPV6_IFADDR,
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
            }),
        })
    }

    /// The links, from the kept dump or from `dump` (kept until the next link change).
    pub(crate) fn links(&self, dump: impl FnOnce() -> Result<Vec<Link>>) -> Result<Arc<[Link]>> {
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        k.sync();
        if let Some(l) = &k.links {
            return Ok(l.clone());
        }
        let l: Arc<[Link]> = dump()?.into();
        k.links = Some(l.clone());
        Ok(l)
    }

    /// The addresses (both families), from the kept dump or from `dump`.
    pub(crate) fn addresses(
        &self,
        dump: impl FnOnce() -> Result<Vec<Address>>,
    ) -> Result<Arc<[Address]>> {
        let mut k = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        k.sync();
        if let Some(a) = &k.addrs {
            return Ok(a.clone());
        }
        let a: Arc<[Address]> = dump()?.into();
        k.addrs = Some(a.clone());
        Ok(a)
    }
}

impl Kept {
    /// Drops what the queued notifications make stale.
    fn sync(&mut self) {
        let c = drain(&self.sock);
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
                _ => {}
            },
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return c,
            Err(_) => {
                // ENOBUFS (notifications lost) or worse: trust nothing kept
                return Changed {
                    links: true,
                    addrs: true,
                };
            }
        }
    }
}
