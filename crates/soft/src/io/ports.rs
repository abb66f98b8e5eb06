//! Send-only sockets on `ADDR:sport`: the sockets a local address's datagrams leave from
//! when their QP's source port (see [`super::flow`]) is not the wire's port.
//!
//! Each is opened on first use, bound with `SO_REUSEPORT` (other processes of the user share
//! it, as they share 4791) and with the smallest receive buffer the kernel allows: peers
//! answer to 4791, so only a stray datagram can arrive, and at most one queues per socket
//! (a drop-all classic-BPF filter did this before, but attaching one costs 10 µs per socket:
//! the kernel converts and JITs it, and frees it through RCU at close). At most
//! [`SPORT_CAP`] per address: when the table is full, the least recently used socket idle for
//! [`IDLE`] makes room; when none is, or the bind fails (the port is another program's), the
//! datagrams leave from the wire's socket instead and count in
//! [`super::WireStats::sport_fallback`]. A failed port is tried again after [`RETRY`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::{sys, WireAddr};
use crate::{Error, Result};

/// Most source-port sockets per local address.
pub const SPORT_CAP: usize = 64;
/// How long a socket must have been unused before another port may take its place.
pub const IDLE: Duration = Duration::from_secs(1);
/// How long a port whose socket could not be had is not tried again.
pub const RETRY: Duration = Duration::from_secs(1);
/// Send buffer of a source-port socket (the kernel caps it at `wmem_max`).
const SNDBUF: i32 = 4 << 20;

struct Entry {
    sport: u16,
    /// `None`: the bind failed at `used`; datagrams of this port fall back until [`RETRY`].
    fd: Option<OwnedFd>,
    /// The wire's clock when it was last used (or failed).
    used: Instant,
}

/// What [`SportSockets::lookup`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Open: the socket's number (1-based; 0 is the wire's own socket).
    Open(u8),
    /// Failed recently: send from the wire's socket.
    Failed,
    /// Not in the table (or failed long enough ago): call [`SportSockets::open`].
    Absent,
}

/// The source-port sockets of one local address.
pub(crate) struct SportSockets {
    entries: Vec<Entry>,
    /// Index of the last hit (flows come in runs).
    last: usize,
    /// The table was full of busy sockets then: new ports fall back until [`RETRY`] later
    /// without looking again.
    refused: Option<Instant>,
    /// The cookie of the namespace the sockets belong in (the wire's socket's), if the
    /// kernel tells it: a socket created in another one is closed before its bind.
    netns: Option<u64>,
}

impl SportSockets {
    pub fn new() -> SportSockets {
        SportSockets {
            entries: Vec::with_capacity(SPORT_CAP),
            last: 0,
            refused: None,
            netns: None,
        }
    }

    /// The table of a wire whose own socket is `wire`: sockets opened later must be in its
    /// network namespace (checked by cookie, see [`SportSockets::checks_netns`]).
    pub fn of_socket(wire: std::os::fd::BorrowedFd<'_>) -> SportSockets {
        SportSockets {
            netns: sys::netns_cookie(wire),
            ..SportSockets::new()
        }
    }

    /// Whether [`SportSockets::open`] refuses a socket made in another network namespace
    /// (false where the kernel has no `SO_NETNS_COOKIE`: the caller checks instead).
    pub fn checks_netns(&self) -> bool {
        self.netns.is_some()
    }

    /// The wire's network namespace cookie, if the kernel tells it.
    pub fn netns(&self) -> Option<u64> {
        self.netns
    }

    /// The socket for `sport`, marking it used at `now`. No allocation, no system call.
    #[inline]
    pub fn lookup(&mut self, sport: u16, now: Instant) -> Lookup {
        let i = match self.entries.get(self.last) {
            Some(e) if e.sport == sport => self.last,
            _ => match self.entries.iter().position(|e| e.sport == sport) {
                Some(i) => i,
                None if self
                    .refused
                    .is_some_and(|t| now.saturating_duration_since(t) < RETRY) =>
                {
                    return Lookup::Failed
                }
                None => return Lookup::Absent,
            },
        };
        self.last = i;
        let e = &mut self.entries[i];
        match e.fd {
            Some(_) => {
                e.used = now;
                Lookup::Open(i as u8 + 1)
            }
            None if now.saturating_duration_since(e.used) < RETRY => Lookup::Failed,
            None => Lookup::Absent,
        }
    }

    /// Whether the table has no room for a port it does not hold and must
    /// [`SportSockets::evict`] first.
    pub fn is_full(&self, sport: u16) -> bool {
        self.entries.len() >= SPORT_CAP && !self.entries.iter().any(|e| e.sport == sport)
    }

    /// The least recently used entry, if it is idle for [`IDLE`] at `now`.
    fn lru_idle(&self, now: Instant) -> Option<usize> {
        lru_idle(self.entries.iter().map(|e| e.used), now)
    }

    /// Whether [`SportSockets::evict`] would make room.
    pub fn can_evict(&self, now: Instant) -> bool {
        self.lru_idle(now).is_some()
    }

    /// Removes the least recently used entry if it is idle for [`IDLE`] at `now` (numbers of
    /// other sockets may change: the caller sends everything queued first). Returns whether
    /// it made room.
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

    /// Notes that the table was full of busy sockets at `now`: ports it does not hold fall
    /// back for [`RETRY`] without a look.
    pub fn refuse(&mut self, now: Instant) {
        self.refused = Some(now);
    }

    /// Remembers `sport` as failed at `now` (when there is room), so that its datagrams fall
    /// back for [`RETRY`] without another attempt.
    pub fn mark_failed(&mut self, sport: u16, now: Instant) {
        let room = self.entries.len() < SPORT_CAP;
        match self.entries.iter_mut().find(|e| e.sport == sport) {
            Some(e) if e.fd.is_none() => e.used = now,
            Some(_) => {}
            None if room => self.entries.push(Entry {
                sport,
                fd: None,
                used: now,
            }),
            None => self.refused = Some(now),
        }
    }

    /// Opens the socket of `sport` on `local` (the table has room: see
    /// [`SportSockets::is_full`]); a port that fails is remembered as failed. Existing
    /// sockets keep their numbers.
    pub fn open(&mut self, local: WireAddr, sport: u16, now: Instant) -> Result<u8> {
        let opened = open_send_only(local, sport, self.netns);
        let i = match self.entries.iter().position(|e| e.sport == sport) {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    sport,
                    fd: None,
                    used: now,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.used = now;
        self.last = i;
        match opened {
            Ok(fd) => {
                e.fd = Some(fd);
                Ok(i as u8 + 1)
            }
            Err(err) => {
                e.fd = None;
                Err(err)
            }
        }
    }

    /// The descriptor of socket `n` (1-based), if open.
    #[inline]
    pub fn fd(&self, n: u8) -> Option<BorrowedFd<'_>> {
        let e = self.entries.get(usize::from(n).checked_sub(1)?)?;
        e.fd.as_ref().map(|f| f.as_fd())
    }

    /// The source port of socket `n` (1-based).
    pub fn sport(&self, n: u8) -> Option<u16> {
        let e = self.entries.get(usize::from(n).checked_sub(1)?)?;
        Some(e.sport)
    }

    /// The open socket of `sport`, if any (for held datagrams: no marking).
    pub fn fd_of(&self, sport: u16) -> Option<RawFd> {
        let e = self.entries.iter().find(|e| e.sport == sport)?;
        e.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Open sockets.
    #[cfg(test)]
    pub fn open_count(&self) -> usize {
        self.entries.iter().filter(|e| e.fd.is_some()).count()
    }
}

/// Of sockets last used at `used`, the least recently used one, if it is idle for [`IDLE`]
/// at `now` (this table's and [`super::peers`]'s eviction).
pub(super) fn lru_idle(used: impl Iterator<Item = Instant>, now: Instant) -> Option<usize> {
    let (i, t) = used.enumerate().min_by_key(|&(_, t)| t)?;
    (now.saturating_duration_since(t) >= IDLE).then_some(i)
}

/// A UDP socket bound to `local:sport` for sending: `SO_REUSEPORT`, the smallest receive
/// buffer. With `netns`, a socket created in another network namespace (the calling
/// thread's is not the wire's) is refused unbound.
pub(super) fn open_send_only(local: WireAddr, sport: u16, netns: Option<u64>) -> Result<OwnedFd> {
    let fd = sys::new_udp_sender(local, SNDBUF)?;
    if netns.is_some() && sys::netns_cookie(fd.as_fd()) != netns {
        return Err(Error::Os {
            op: "SO_NETNS_COOKIE",
            addr: Some(local),
            source: std::io::Error::other("the calling thread is in another network namespace"),
        });
    }
    sys::bind_udp(&fd, local, sport)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table made for another namespace's wire refuses a socket opened from this one,
    /// before binding it; one made for this namespace opens it.
    #[test]
    fn a_socket_from_another_namespace_is_refused_unbound() {
        let here = std::net::UdpSocket::bind("127.0.88.3:0").unwrap();
        let Some(ours) = sys::netns_cookie(here.as_fd()) else {
            // a failure under RDMA_REQUIRE_ROOT=1 (CI): its kernel must have it
            rdma_testhosts::skip(
                "a_socket_from_another_namespace_is_refused_unbound",
                "this kernel has no SO_NETNS_COOKIE",
            );
            return;
        };
        let t0 = Instant::now();
        let a: WireAddr = "127.0.88.3".parse().unwrap();
        let mut s = SportSockets::of_socket(here.as_fd());
        assert!(s.checks_netns());
        assert!(s.open(a, 0xC301, t0).is_ok());
        // the wire of another namespace (a different cookie; made without entering one)
        let mut other = SportSockets {
            netns: Some(ours.wrapping_add(1)),
            ..SportSockets::new()
        };
        let e = other.open(a, 49413, t0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Os {
                    op: "SO_NETNS_COOKIE",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(other.lookup(49413, t0), Lookup::Failed);
        // never bound: a socket without SO_REUSEPORT takes the port
        std::net::UdpSocket::bind("127.0.88.3:49413").unwrap();
    }

    #[test]
    #[allow(unsafe_code)]
    fn opens_reuses_evicts_and_remembers_failures() {
        let a: WireAddr = "127.0.88.1".parse().unwrap();
        let t0 = Instant::now();
        let mut s = SportSockets::new();
        assert_eq!(s.lookup(0xC101, t0), Lookup::Absent);
        let n = s.open(a, 0xC101, t0).unwrap();
        assert_eq!(s.lookup(0xC101, t0), Lookup::Open(n));
        assert!(s.fd(n).is_some());
        // a second table (another process) shares the port
        let mut other = SportSockets::new();
        other.open(a, 0xC101, t0).unwrap();
        // a port held without SO_REUSEPORT fails and is remembered
        let plain = std::net::UdpSocket::bind("127.0.88.1:49411").unwrap();
        assert!(matches!(
            s.open(a, 49411, t0),
            Err(Error::AddrInUse { port: 49411, .. })
        ));
        assert_eq!(s.lookup(49411, t0), Lookup::Failed);
        assert_eq!(s.lookup(49411, t0 + RETRY), Lookup::Absent);
        drop(plain);
        assert!(matches!(s.open(a, 49411, t0 + RETRY), Ok(2)));
        // stray datagrams sent to it: at most one queues (the smallest receive buffer)
        let tx = std::net::UdpSocket::bind("127.0.88.2:0").unwrap();
        for _ in 0..16 {
            tx.send_to(&[7u8; 1200], "127.0.88.1:49411").unwrap();
        }
        let queued = (0..16)
            .take_while(|_| {
                let mut b = [0u8; 2048];
                // SAFETY: `b` is writable for its length.
                let got = unsafe {
                    libc::recv(
                        s.fd(2).unwrap().as_raw_fd(),
                        b.as_mut_ptr().cast(),
                        b.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                got > 0
            })
            .count();
        assert!(queued <= 2, "{queued} stray datagrams queued");
        // full: only an idle socket makes room
        for k in 2..SPORT_CAP as u16 {
            s.open(a, 0xC200 + k, t0).unwrap();
        }
        assert!(s.is_full(0xC400));
        assert!(!s.is_full(0xC101));
        assert!(!s.evict(t0));
        s.lookup(0xC101, t0 + IDLE);
        assert!(s.evict(t0 + IDLE));
        assert_eq!(s.open_count(), SPORT_CAP - 1);
        assert!(matches!(s.lookup(0xC101, t0 + IDLE), Lookup::Open(_)));
    }
}
