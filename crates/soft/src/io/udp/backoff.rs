//! A busy poller's socket reads back off while the sockets stay empty.
//!
//! A `recvmmsg` that finds nothing costs a system call (~0.5 µs here: the message header's
//! import, the socket lookup) where a poll of the rings and the CQ costs tens of ns. A
//! busy poller that reads every socket on every poll spends most of its time there
//! (perftest's `ib_write_bw` server over the host-local wire: 37 empty reads per 64 KiB
//! message on sockets that carry nothing). So after [`QUIET_READS`] busy reads in a row
//! found nothing, the sockets are read on every [`SHORT_GAP`]th poll only, after
//! [`LONG_QUIET`] on every [`LONG_GAP`]th; any datagram ends the back-off. A datagram is
//! thus taken within [`LONG_GAP`] polls of its arrival (within one while the sockets carry
//! traffic), and the polls between cost no system call. A poller whose reads come more
//! than [`SLOW_READS`] apart (its polls are slow: it does other work between them) does
//! not back off, so a datagram waits at most about that long. The host-local rings are
//! looked at on every poll whatever this says (`udp/local.rs`).

use std::time::{Duration, Instant};

use super::UdpWire;
#[cfg(doc)]
use crate::io::DatagramWire;

/// Empty busy reads in a row before the reads back off (a read costs ~10 polls without one:
/// a gap of a few polls adds little to the wait for a datagram).
pub(super) const QUIET_READS: u32 = 2;
/// Polls per socket read after [`QUIET_READS`] empty ones.
pub(super) const SHORT_GAP: u32 = 4;
/// Empty busy reads in a row after which the sockets count as idle.
pub(super) const LONG_QUIET: u32 = 64;
/// Polls per socket read once idle.
pub(super) const LONG_GAP: u32 = 8;
/// Empty reads further apart than this: the poller is slow, its reads do not back off
/// (one clock reading per empty read, none per skipped poll).
pub(super) const SLOW_READS: Duration = Duration::from_micros(20);

/// The back-off state of a [`UdpWire`]'s socket reads.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    /// Busy reads in a row that found nothing on any socket.
    streak: u32,
    /// Polls left before the next read.
    skip: u32,
    /// When the last empty read was.
    last: Option<Instant>,
}

impl Backoff {
    /// Whether this poll skips the socket read (and counts it).
    fn skips(&mut self) -> bool {
        if self.skip == 0 {
            return false;
        }
        self.skip -= 1;
        true
    }

    /// A busy read of the sockets found datagrams (`got`) or none, at `now`.
    fn read(&mut self, got: bool, now: Instant) {
        let slow = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) > SLOW_READS);
        if got || slow {
            *self = Backoff::default();
            self.last = (!got).then_some(now);
            return;
        }
        self.last = Some(now);
        self.streak = self.streak.saturating_add(1);
        self.skip = match self.streak {
            s if s >= LONG_QUIET => LONG_GAP - 1,
            s if s >= QUIET_READS => SHORT_GAP - 1,
            _ => 0,
        };
    }
}

impl UdpWire {
    /// A busy poll that would read the sockets: true when they are not due (the poll is
    /// counted in `WireStats::busy_reads_skipped`).
    pub(super) fn socket_read_skipped(&mut self) -> bool {
        if self.recv_faults.is_some() || !self.backoff.skips() {
            return false;
        }
        self.stats.busy_reads_skipped += 1;
        true
    }

    /// After a read of the sockets: `busy` a busy poller's, `got` whether any datagram came.
    /// Only a busy poller's reads back off; any other read starts over.
    pub(super) fn socket_read_done(&mut self, busy: bool, got: bool) {
        if busy {
            // a clock reading per read that found nothing: far less than the read
            let now = if got { self.clock } else { Instant::now() };
            self.backoff.read(got, now);
        } else {
            self.backoff = Backoff::default();
        }
    }

    /// [`DatagramWire::idle_poll`] for the sockets: nothing on the rings (or none), and the
    /// sockets not due.
    pub(super) fn sockets_idle_poll(&mut self) -> bool {
        if self.local_ring_due() || !self.socket_read_skipped() {
            return false;
        }
        self.local_count_poll();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{DatagramWire, UdpConfig, WireAddr};
    use std::os::fd::AsRawFd;

    fn wire(port: u16) -> UdpWire {
        UdpWire::new(UdpConfig {
            port,
            share: false,
            ..UdpConfig::default()
        })
        .unwrap()
    }

    /// One busy poll as the runtime does it (`Runtime::busy_idle`, then the round's
    /// receive unless the wire said idle); returns the datagrams delivered.
    fn busy_poll(w: &mut UdpWire, got: &mut Vec<Vec<u8>>) -> usize {
        if w.idle_poll() {
            return 0;
        }
        w.busy_poll(true);
        let n = w.recv(&mut |_, p| got.push(p[..56].to_vec())).unwrap();
        w.busy_poll(false);
        n
    }

    /// The state machine alone: reads back off after QUIET_READS empty ones, further after
    /// LONG_QUIET, and a datagram ends it.
    #[test]
    fn empty_reads_back_off_in_two_steps_and_a_datagram_ends_it() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let mut reads = 0;
        let mut polls_between = Vec::new();
        let mut since = 0;
        for _ in 0..2000 {
            if b.skips() {
                since += 1;
                continue;
            }
            polls_between.push(since + 1);
            since = 0;
            reads += 1;
            b.read(false, t0);
        }
        // the first QUIET_READS reads are back to back
        assert!(polls_between[..QUIET_READS as usize]
            .iter()
            .all(|&g| g == 1));
        assert_eq!(polls_between[QUIET_READS as usize + 1], SHORT_GAP);
        assert_eq!(*polls_between.last().unwrap(), LONG_GAP);
        assert!(polls_between.iter().all(|&g| g <= LONG_GAP));
        assert!(reads < 2000 / LONG_GAP as usize + LONG_QUIET as usize);
        b.read(true, t0);
        assert!(!b.skips(), "a datagram: the next poll reads");
    }

    /// A poller whose empty reads come more than SLOW_READS apart reads on every poll.
    #[test]
    fn a_slow_poller_does_not_back_off() {
        let mut b = Backoff::default();
        let mut t = Instant::now();
        for _ in 0..100 {
            assert!(!b.skips(), "a slow poller's every poll reads");
            t += SLOW_READS * 2;
            b.read(false, t);
        }
        // fast again: it backs off after QUIET_READS reads
        for _ in 0..QUIET_READS + 1 {
            t += Duration::from_micros(1);
            b.read(false, t);
        }
        assert!(b.skips());
    }

    /// On a real socket: a busy poller whose socket stayed empty makes far fewer reads than
    /// polls, and a datagram sent at any poll is delivered within LONG_GAP polls.
    #[test]
    fn an_idle_socket_costs_few_reads_and_a_datagram_is_taken_within_a_few_polls() {
        let (la, lb): (WireAddr, WireAddr) =
            ("127.0.9.11".parse().unwrap(), "127.0.9.12".parse().unwrap());
        let (mut a, mut b) = (wire(47933), wire(47933));
        a.open(la).unwrap();
        b.open(lb).unwrap();
        let mut got = Vec::new();
        let polls = 1000u64;
        for _ in 0..polls {
            assert_eq!(busy_poll(&mut b, &mut got), 0);
        }
        let skipped = b.stats().busy_reads_skipped;
        assert!(
            skipped > polls * 3 / 4,
            "an idle socket is read on few polls: {skipped} of {polls} skipped"
        );
        // a datagram sent at each phase of the gap is taken within LONG_GAP polls
        for k in 0..LONG_GAP as u8 * 2 {
            for _ in 0..LONG_QUIET + u32::from(k) {
                busy_poll(&mut b, &mut got);
            }
            a.send(la, lb, &[k; 60]).unwrap();
            a.flush().unwrap();
            // counted from when it is in the socket
            let fd = b.locals[0].fd.as_raw_fd();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            assert!(crate::fd::wait_readable(&[fd], Some(until)).unwrap());
            let mut n = 0;
            while got.is_empty() {
                n += 1;
                assert!(
                    n <= LONG_GAP,
                    "datagram {k} not taken within {LONG_GAP} polls"
                );
                busy_poll(&mut b, &mut got);
            }
            assert_eq!(got, vec![vec![k; 56]]);
            got.clear();
        }
    }
}
