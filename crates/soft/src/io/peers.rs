//! Connected send sockets: one per source port and peer of an RC path over IPv6, so that
//! its datagrams leave without a route lookup (the kernel looks the route up for every
//! datagram of an unconnected `sendmmsg`: 0.4-0.6 µs of a 64 B send here; a connected
//! socket keeps it).
//!
//! IPv6 only: a connected IPv4 socket numbers its datagrams' Identification from a random
//! per-socket counter, where an unconnected one with DF sends 0; the ICRC covers the
//! Identification and the sender seals it before the kernel writes the header, so an IPv4
//! path must stay unconnected (IPv6 has no Identification; its flow label, traffic class
//! and hop limit are masked).
//!
//! A socket is bound to `ADDR:sport` (`SO_REUSEPORT`, beside the port's unconnected socket of
//! [`super::ports`]) and connected to the peer's `ADDR:4791`. It is opened when a QP's path
//! is set (`DatagramWire::prepare_path`, in the wire's namespace), never on the send path.
//! At most [`PEER_CAP`] per local address: the least recently used one idle for
//! [`super::ports::IDLE`] makes room; a path without one sends from its port's unconnected
//! socket, as before. Peers answer to 4791, so nothing arrives on these sockets but ICMP
//! errors, which a send then reports once (the datagram counts as refused; RC resends it).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use super::{sys, WireAddr};
use crate::Result;

/// Most connected sockets per local address.
pub const PEER_CAP: usize = 63;
/// The batch's number of the first connected socket (0 is the address's own socket,
/// 1..=64 its source-port sockets, [`super::ports::SPORT_CAP`]).
pub const FIRST_ID: u8 = 65;

struct Entry {
    sport: u16,
    to: WireAddr,
    port: u16,
    fd: OwnedFd,
    /// The wire's clock when it was last used.
    used: Instant,
}

/// The connected send sockets of one local address.
#[derive(Default)]
pub(crate) struct PeerSockets {
    entries: Vec<Entry>,
    /// Index of the last hit (a QP's datagrams come in runs).
    last: usize,
}

impl PeerSockets {
    /// The socket from `sport` to `to:port`, marking it used at `now`: its batch number.
    /// No allocation, no system call.
    #[inline]
    pub fn lookup(&mut self, sport: u16, to: WireAddr, port: u16, now: Instant) -> Option<u8> {
        let hit = |e: &Entry| e.sport == sport && e.port == port && e.to == to;
        let i = match self.entries.get(self.last) {
            Some(e) if hit(e) => self.last,
            _ => self.entries.iter().position(hit)?,
        };
        self.last = i;
        self.entries[i].used = now;
        Some(FIRST_ID + i as u8)
    }

    /// Whether a socket from `sport` to `to:port` is open.
    pub fn has(&self, sport: u16, to: WireAddr, port: u16) -> bool {
        self.entries
            .iter()
            .any(|e| e.sport == sport && e.port == port && e.to == to)
    }

    /// Whether opening one more needs [`PeerSockets::evict`] first.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= PEER_CAP
    }

    /// The least recently used socket, if it is idle for [`super::ports::IDLE`] at `now`.
    fn lru_idle(&self, now: Instant) -> Option<usize> {
        super::ports::lru_idle(self.entries.iter().map(|e| e.used), now)
    }

    /// Whether [`PeerSockets::evict`] would make room.
    pub fn can_evict(&self, now: Instant) -> bool {
        self.lru_idle(now).is_some()
    }

    /// Removes the least recently used socket if it is idle for [`super::ports::IDLE`] at `now` (the
    /// numbers of others may change: the caller sends everything queued first). Returns
    /// whether it made room.
    pub fn evict(&mut self, now: Instant) -> bool {
        match self.lru_idle(now) {
            Some(i) => {
                self.entries.swap_remove(i);
                self.last = 0;
                true
            }
            None => false,
        }
    }

    /// Opens the socket from `local:sport` to `to:port` (the table has room); with
    /// `netns`, one created in another network namespace is refused unbound.
    pub fn open(
        &mut self,
        local: WireAddr,
        sport: u16,
        (to, port): (WireAddr, u16),
        netns: Option<u64>,
        now: Instant,
    ) -> Result<u8> {
        debug_assert!(!self.is_full());
        let fd = super::ports::open_send_only(local, sport, netns)?;
        sys::connect_udp(&fd, to, port)?;
        self.entries.push(Entry {
            sport,
            to,
            port,
            fd,
            used: now,
        });
        self.last = self.entries.len() - 1;
        Ok(FIRST_ID + self.last as u8)
    }

    /// The descriptor of socket `id` (a batch number from [`FIRST_ID`] on), if open.
    #[inline]
    pub fn fd(&self, id: u8) -> Option<BorrowedFd<'_>> {
        let e = self.entries.get(usize::from(id.checked_sub(FIRST_ID)?))?;
        Some(e.fd.as_fd())
    }

    /// The source port of socket `id`.
    pub fn sport(&self, id: u8) -> Option<u16> {
        let e = self.entries.get(usize::from(id.checked_sub(FIRST_ID)?))?;
        Some(e.sport)
    }

    /// Open sockets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::ports::IDLE;
    use std::time::Duration;

    #[test]
    #[allow(unsafe_code)]
    fn a_connected_socket_sends_from_its_port_to_its_peer_only() {
        let rx = std::net::UdpSocket::bind("[::1]:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to: WireAddr = "::1".parse().unwrap();
        let port = rx.local_addr().unwrap().port();
        let local: WireAddr = "::1".parse().unwrap();
        let t0 = Instant::now();
        let mut s = PeerSockets::default();
        let id = s.open(local, 50_123, (to, port), None, t0).unwrap();
        assert_eq!(id, FIRST_ID);
        assert_eq!(s.lookup(50_123, to, port, t0), Some(id));
        assert_eq!(s.lookup(50_124, to, port, t0), None, "another port");
        assert_eq!(s.lookup(50_123, to, port + 1, t0), None, "another peer");
        // no destination given: the connected one
        let fd = s.fd(id).unwrap();
        // SAFETY: a live socket and buffer.
        let n = unsafe {
            libc::send(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                b"ping".as_ptr().cast(),
                4,
                0,
            )
        };
        assert_eq!(n, 4);
        let mut b = [0u8; 16];
        let (n, from) = rx.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], b"ping");
        assert_eq!(from.to_string(), "[::1]:50123");
        assert!(s.fd(FIRST_ID + 1).is_none());
        assert!(
            s.fd(3).is_none(),
            "a source-port socket's number is not ours"
        );
    }

    #[test]
    fn the_table_is_bounded_and_only_idle_sockets_make_room() {
        let to: WireAddr = "::1".parse().unwrap();
        let local: WireAddr = "::1".parse().unwrap();
        let t0 = Instant::now();
        let mut s = PeerSockets::default();
        for k in 0..PEER_CAP as u16 {
            s.open(local, 51_000 + k, (to, 4791), None, t0).unwrap();
        }
        assert!(s.is_full());
        assert!(!s.evict(t0), "none idle yet");
        // all but one used since
        let later = t0 + IDLE;
        for k in 1..PEER_CAP as u16 {
            assert!(s.lookup(51_000 + k, to, 4791, later).is_some());
        }
        assert!(s.evict(later), "the idle one goes");
        assert!(!s.has(51_000, to, 4791));
        assert_eq!(s.len(), PEER_CAP - 1);
        assert!(s.has(51_001, to, 4791));
    }
}
