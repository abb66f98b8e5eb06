//! Sockets out of the wire's epoll set while a busy poller reads them.
//!
//! A socket in an epoll set costs every datagram sent to it a wake-up callback in the
//! sender's system call (two here: the wire's set sits in the engine's). A busy poller
//! reads the sockets anyway, so after [`PARK_AFTER`] busy receives in a row the sockets
//! leave the set, and they come back before anyone sleeps on it
//! ([`DatagramWire::arm_wait`]) or drives the wire otherwise. A socket added back that
//! holds datagrams makes the set readable at once: nothing is missed.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use super::UdpWire;
#[cfg(doc)]
use crate::io::DatagramWire;

/// Busy receives in a row (none from a sleeper's `arm_wait` between them) after which the
/// sockets leave the epoll set: about 100 µs of polling.
pub(super) const PARK_AFTER: u32 = 256;

/// Adds socket `fd` to (or, `op` DEL, removes it from) epoll set `epoll`, readable events
/// with the fd as token: the wire's way of watching a socket. Returns `epoll_ctl`'s result.
pub(super) fn socket_ctl(epoll: BorrowedFd<'_>, op: i32, fd: RawFd) -> i32 {
    match crate::fd::epoll_ctl(epoll, op, fd, libc::EPOLLIN as u32, fd as u64) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

/// The parking state of a [`UdpWire`].
#[derive(Debug, Default)]
pub(super) struct Parking {
    /// Busy receives since the last `arm_wait` or other receive.
    streak: u32,
    /// The sockets are out of the epoll set.
    parked: bool,
}

impl UdpWire {
    /// Counts a receive; `busy`: a busy poller's. Parks or unparks the sockets.
    pub(super) fn park_on_recv(&mut self, busy: bool) {
        // with host-local rings, the busy poller learns of socket datagrams from the set
        let may_park = busy && self.local.wire.is_none();
        if !may_park {
            self.unpark();
            return;
        }
        self.park.streak = self.park.streak.saturating_add(1);
        if self.park.streak >= PARK_AFTER && !self.park.parked {
            for l in &self.locals {
                socket_ctl(self.epoll.as_fd(), libc::EPOLL_CTL_DEL, l.fd.as_raw_fd());
            }
            self.park.parked = true;
            self.stats.sockets_parked += 1;
        }
    }

    /// Someone may sleep on the epoll set next: the sockets are back in it.
    pub(super) fn unpark(&mut self) {
        self.park.streak = 0;
        if !std::mem::take(&mut self.park.parked) {
            return;
        }
        for l in &self.locals {
            // EEXIST (a socket opened while parked is in the set already) is what we want
            socket_ctl(self.epoll.as_fd(), libc::EPOLL_CTL_ADD, l.fd.as_raw_fd());
        }
    }

    /// Whether the sockets are out of the epoll set now.
    #[cfg(test)]
    pub(super) fn parked(&self) -> bool {
        self.park.parked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{DatagramWire, UdpConfig, WireAddr};
    use std::os::fd::AsFd;

    fn wire() -> UdpWire {
        UdpWire::new(UdpConfig {
            port: 47931,
            share: false,
            ..UdpConfig::default()
        })
        .unwrap()
    }

    /// Whether the wire's epoll set (what the engine and event loops sleep on) is readable.
    fn readable(w: &UdpWire, ms: i32) -> bool {
        let fd = w.wait_fd().unwrap().as_fd().as_raw_fd();
        let until = std::time::Instant::now() + std::time::Duration::from_millis(ms as u64);
        crate::fd::wait_readable(&[fd], Some(until)).unwrap()
    }

    fn busy_recv(w: &mut UdpWire, got: &mut Vec<Vec<u8>>) -> usize {
        w.busy_poll(true);
        // the payload without its ICRC (the wire seals the last 4 bytes)
        let n = w.recv(&mut |_, p| got.push(p[..56].to_vec())).unwrap();
        w.busy_poll(false);
        n
    }

    /// A busy poller parks the sockets after PARK_AFTER receives; a datagram that comes
    /// meanwhile wakes no sleeper, and is there, and makes the set readable, once a sleeper
    /// arms (arm_wait); the busy poller itself reads it while parked.
    #[test]
    fn busy_polling_parks_the_sockets_and_a_sleeper_gets_them_back_with_what_came() {
        let (la, lb) = ("127.0.9.1".parse().unwrap(), "127.0.9.2".parse().unwrap());
        let (mut a, mut b) = (wire(), wire());
        a.open(la).unwrap();
        b.open(lb).unwrap();
        let mut got = Vec::new();
        for _ in 0..PARK_AFTER - 1 {
            assert_eq!(busy_recv(&mut b, &mut got), 0);
        }
        assert!(!b.parked(), "not before PARK_AFTER busy receives");
        busy_recv(&mut b, &mut got);
        assert!(b.parked());
        assert_eq!(b.stats().sockets_parked, 1);

        // the busy poller still receives
        a.send(la, lb, &[1u8; 60]).unwrap();
        a.flush().unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.is_empty() && std::time::Instant::now() < end {
            busy_recv(&mut b, &mut got);
        }
        assert_eq!(got, vec![vec![1u8; 56]]);
        assert!(b.parked(), "receiving keeps them parked");

        // a datagram for a parked socket wakes nobody...
        a.send(la, lb, &[2u8; 60]).unwrap();
        a.flush().unwrap();
        assert!(!readable(&b, 50), "parked: the set does not see the socket");
        // ...until a sleeper arms: then the set is readable at once, and it is delivered
        b.arm_wait();
        assert!(!b.parked());
        assert!(
            readable(&b, 1000),
            "the held datagram makes the set readable"
        );
        got.clear();
        assert_eq!(b.recv(&mut |_, p| got.push(p[..56].to_vec())).unwrap(), 1);
        assert_eq!(got, vec![vec![2u8; 56]]);
    }

    /// A receive that is not a busy poll (the engine's, an event loop's) brings the sockets
    /// back; a poller that arms between its polls (the engine sleeps meanwhile) never parks.
    #[test]
    fn other_receives_and_armed_polls_keep_the_sockets_in_the_set() {
        let lb: WireAddr = "127.0.9.3".parse().unwrap();
        let mut b = wire();
        b.open(lb).unwrap();
        let mut got = Vec::new();
        for _ in 0..PARK_AFTER {
            busy_recv(&mut b, &mut got);
        }
        assert!(b.parked());
        b.recv(&mut |_, p| got.push(p.to_vec())).unwrap();
        assert!(!b.parked(), "a plain receive unparks");
        for _ in 0..PARK_AFTER * 2 {
            busy_recv(&mut b, &mut got);
            b.arm_wait();
        }
        assert!(!b.parked(), "armed between polls: never parked");
        assert_eq!(b.stats().sockets_parked, 1);
    }
}
