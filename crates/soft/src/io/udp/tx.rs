//! The send path of [`UdpWire`]: flushing each address's batch over its sockets, the fault
//! injector's held datagrams, and the choice of a datagram's socket by source port.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use super::UdpWire;
use crate::io::fault::Verdict;
use crate::io::ports::Lookup;
use crate::io::send_batch::SendOutcome;
use crate::io::sys;
use crate::io::WireAddr;

impl UdpWire {
    /// The socket (0: the address's own; see [`crate::io::ports`] and [`crate::io::peers`]) that
    /// datagrams of local `i` from `sport` (0: the wire's port) to `to` leave from, and the
    /// source port they then carry: the one connected to `to` if the path opened it, else
    /// the port's. No system call unless the port's socket is opened now.
    #[inline]
    pub(super) fn socket_for(&mut self, i: usize, sport: u16, to: WireAddr) -> (u8, u16) {
        let port = self.cfg.port;
        if sport == 0 || sport == port {
            return (0, port);
        }
        if self.locals[i].out.len() == 0 {
            // the batch's first datagram: the use time of what it picks (flushes that find
            // nothing queued do not read the clock)
            self.clock = std::time::Instant::now();
        }
        if let Some(n) = self.locals[i].peers.lookup(sport, to, port, self.clock) {
            return (n, sport);
        }
        match self.locals[i].ports.lookup(sport, self.clock) {
            Lookup::Open(n) => (n, sport),
            Lookup::Failed => self.fallback(i, sport),
            Lookup::Absent => match self.open_sport(i, sport) {
                Some(n) => (n, sport),
                None => self.fallback(i, sport),
            },
        }
    }

    /// Opens the socket of `sport` on local `i`, first making room by closing the least
    /// recently used idle one (after sending what is queued: socket numbers change); `None`
    /// when it cannot be had now (remembered for [`crate::io::ports::RETRY`]). Only from a thread
    /// in the namespace the address was opened in: elsewhere the same address may name
    /// another host's.
    #[cold]
    pub(super) fn open_sport(&mut self, i: usize, sport: u16) -> Option<u8> {
        let now = self.clock;
        let addr = self.locals[i].addr;
        // Sockets must be made in the wire's namespace: the table checks each new one's
        // cookie (one getsockopt); without it, the calling thread's namespace is read here.
        if !self.locals[i].may_open_here() {
            tracing::debug!(local = %addr, sport, "source-port socket not opened: another network namespace");
            self.locals[i].ports.mark_failed(sport, now);
            return None;
        }
        let ports = &self.locals[i].ports;
        if ports.is_full(sport) {
            if !ports.can_evict(now) {
                self.locals[i].ports.refuse(now);
                return None;
            }
            self.flush_local(i, None);
            self.locals[i].ports.evict(now);
        }
        match self.locals[i].ports.open(addr, sport, now) {
            Ok(n) => {
                tracing::debug!(local = %addr, sport, "source-port socket opened");
                if sport == crate::io::flow::GSI_UDP_SPORT {
                    // the table keeps the socket open while it is watched (it leaves the
                    // epoll set when closed)
                    if let Some(fd) = self.locals[i].ports.fd(n) {
                        self.unreachable.watch(self.epoll.as_fd(), fd, addr);
                    }
                }
                Some(n)
            }
            Err(e) => {
                tracing::debug!(local = %addr, sport, error = %e, "source-port socket refused");
                None
            }
        }
    }

    /// Sends from the wire's own socket instead, counting it.
    fn fallback(&mut self, i: usize, sport: u16) -> (u8, u16) {
        self.stats.sport_fallback += 1;
        crate::ratelimit::debug_limited!(
            local = %self.locals[i].addr,
            sport,
            "datagram sent from the wire's port: its source port's socket cannot be had"
        );
        (0, self.cfg.port)
    }

    pub(super) fn flush_local(&mut self, i: usize, now: Option<Instant>) {
        let local = &mut self.locals[i];
        if local.out.len() == 0 {
            return;
        }
        let fd = local.fd.as_fd();
        let ports = &local.ports;
        let peers = &local.peers;
        let fd_of = |n: u8| match n {
            0 => Some(fd),
            n if n >= crate::io::peers::FIRST_ID => peers.fd(n),
            n => ports.fd(n),
        };
        let faulty = (self.send_faults.as_deref_mut()).filter(|f| f.applies_to(local.addr.ip()));
        let outcome = match faulty {
            None => local.out.send(fd_of, None),
            Some(inj) => {
                let now = now.unwrap_or_else(Instant::now);
                self.order.clear();
                for k in 0..local.out.len() {
                    let verdict = inj.judge(local.out.data_mut(k));
                    match verdict {
                        Verdict::Pass => self.order.push(k as u16),
                        Verdict::Duplicate => self.order.extend([k as u16, k as u16]),
                        Verdict::Drop => continue,
                        Verdict::Hold { .. } => {
                            let to = local.out.dst(k).map(|(a, _)| a);
                            let tclass = local.out.tclass(k);
                            let sport = match local.out.sock(k) {
                                0 => self.cfg.port,
                                n if n >= crate::io::peers::FIRST_ID => {
                                    peers.sport(n).unwrap_or(self.cfg.port)
                                }
                                n => ports.sport(n).unwrap_or(self.cfg.port),
                            };
                            let held = match to {
                                Some(to) => inj.hold(
                                    now,
                                    local.out.data_mut(k),
                                    (local.addr, to, tclass, sport),
                                    verdict,
                                ),
                                None => false,
                            };
                            if held {
                                continue;
                            }
                            self.order.push(k as u16);
                        }
                    }
                    inj.passed();
                }
                local.out.send(fd_of, Some(&self.order))
            }
        };
        self.account(i, outcome);
    }

    fn account(&mut self, i: usize, o: SendOutcome) {
        if o.gso_refused {
            // the path cannot segment: the refused packets are lost (the transport resends
            // them, sealed for Identification 0), and the socket sends one by one from now on
            self.locals[i].out.set_gso(false);
            self.stats.gso_refused += 1;
        }
        self.stats.sent += o.sent as u64;
        self.stats.sent_connected += o.connected as u64;
        self.stats.send_errors += o.failed as u64;
        self.stats.send_calls += o.runs as u64;
        if o.last_error.is_some() {
            self.stats.last_send_errno = o.last_error;
        }
    }

    /// Sends the held (delayed or reordered) datagrams that are due, one `sendmsg` each (with
    /// their traffic class, from the port they were sealed for; lost if that socket has been
    /// closed since): only with fault injection, so not on the fast path.
    pub(super) fn release_sends(&mut self, now: Instant) {
        let Some(inj) = self.send_faults.as_deref_mut() else {
            return;
        };
        let locals = &self.locals;
        let port = self.cfg.port;
        let stats = &mut self.stats;
        inj.release(now, &mut |(from, to, tclass, sport), data| {
            let Some(local) = locals.iter().find(|l| l.addr == from) else {
                return;
            };
            let fd = if sport == port {
                Some(local.fd.as_raw_fd())
            } else {
                local.ports.fd_of(sport)
            };
            let Some(fd) = fd else {
                stats.send_errors += 1;
                stats.last_send_errno = Some(libc::EBADF);
                return;
            };
            match sys::send_one(fd, to, port, tclass, data) {
                Err(e) => {
                    stats.send_errors += 1;
                    stats.last_send_errno = e.raw_os_error();
                }
                Ok(()) => stats.sent += 1,
            }
        });
    }
}
