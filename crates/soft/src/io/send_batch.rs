//! Preallocated batches for `sendmmsg`, over the sockets of one local address.
//!
//! All buffers, socket addresses, control-message space and `mmsghdr`s are allocated once; the
//! raw pointers the kernel needs are written into the headers right before each system call.
//! Each queued datagram names the socket it leaves from (0: the address's 4791 socket; others:
//! its source-port sockets); a flush makes one `sendmmsg` run per socket present.

use std::os::fd::BorrowedFd;

use super::sys::mmsg::{self, Loaded, SendHeaders};
use super::sys::{self, SOL_UDP, UDP_SEGMENT};
use super::WireAddr;

/// Outgoing datagrams queued for the sockets of one address, sent with one `sendmmsg` per
/// socket.
pub(crate) struct SendBatch {
    slot: usize,
    bufs: Box<[u8]>,
    /// Where each queued datagram starts in its slot (the transport may leave room before
    /// it: the payload is gathered first, the headers written before it).
    starts: Box<[usize]>,
    lens: Box<[usize]>,
    names: Box<[(libc::sockaddr_storage, libc::socklen_t)]>,
    /// The `sendmmsg` headers (`sys::mmsg`), loaded per run with the datagrams above.
    out: SendHeaders,
    queued: usize,
    /// UDP GSO: consecutive datagrams to the same destination, all of one size but the last
    /// (which may be shorter), go as one message with `UDP_SEGMENT`.
    gso: bool,
    /// Destination of each queued datagram (to group them).
    dsts: Box<[Option<WireAddr>]>,
    /// IPv4 TOS / IPv6 traffic class of each queued datagram (a GSO message has one).
    tclasses: Box<[u8]>,
    /// BTH destination QPN of each queued datagram (a GSO message has one: on loopback and
    /// veth the receiver picks one socket for the whole message, so a message to two QPs
    /// of an address shared by processes would reach only one of them).
    qpns: Box<[u32]>,
    /// Segment index of each queued datagram in its GSO group (0: starts a message).
    segs: Box<[u16]>,
    /// The socket each queued datagram leaves from (a GSO message has one).
    socks: Box<[u8]>,
    /// Bit `s` set: some queued datagram leaves from socket `s`.
    present: u128,
    /// The open group: its segment size and bytes, or `None` when the next datagram starts
    /// a new one.
    group: Option<(usize, usize)>,
    /// Datagrams of each message built by `send`.
    per_msg: Box<[u16]>,
    /// The first queued datagram of each message built by `send`.
    msg_first: Box<[u16]>,
}
/// Most segments in one GSO message (the kernel's `UDP_MAX_SEGMENTS` is 64 or more).
pub(crate) const GSO_MAX_SEGS: usize = 64;
/// Most bytes in one GSO message (a UDP datagram's length field; the kernel refuses more).
const GSO_MAX_BYTES: usize = 65_000;

/// Outcome of [`SendBatch::send`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendOutcome {
    /// Datagrams the kernel accepted.
    pub sent: usize,
    /// Datagrams the kernel refused (their errno is in `last_error`).
    pub failed: usize,
    /// The last errno of a refused datagram.
    pub last_error: Option<i32>,
    /// Sockets sent on (one `sendmmsg` run each).
    pub runs: usize,
    /// Of `sent`: datagrams sent on connected sockets (`super::peers`).
    pub connected: usize,
    /// A GSO message was refused with an errno that says the path cannot segment (EIO:
    /// no checksum offload on the device; EINVAL, ENOPROTOOPT): send without GSO from now on.
    pub gso_refused: bool,
}

impl SendBatch {
    /// Room for `count` datagrams of up to `slot` bytes.
    pub fn new(count: usize, slot: usize) -> SendBatch {
        let count = count.max(1);
        SendBatch {
            slot,
            bufs: vec![0u8; count * slot].into_boxed_slice(),
            starts: vec![0; count].into_boxed_slice(),
            lens: vec![0; count].into_boxed_slice(),
            names: (0..count)
                .map(|_| sys::to_sockaddr(unspecified(), 0))
                .collect(),
            out: SendHeaders::new(count * 2, count * 2),
            queued: 0,
            gso: false,
            dsts: vec![None; count].into_boxed_slice(),
            tclasses: vec![0; count].into_boxed_slice(),
            qpns: vec![0; count].into_boxed_slice(),
            segs: vec![0; count].into_boxed_slice(),
            socks: vec![0; count].into_boxed_slice(),
            present: 0,
            group: None,
            per_msg: vec![0; count * 2].into_boxed_slice(),
            msg_first: vec![0; count * 2].into_boxed_slice(),
        }
    }

    /// The segment index of queued datagram `i` (see [`SendBatch::next_segment`]).
    pub fn segment(&self, i: usize) -> u16 {
        self.segs.get(i).copied().unwrap_or(0)
    }

    /// Turns grouping into GSO messages on or off (takes effect from the next datagram).
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on;
        self.group = None;
    }

    /// The segment index the next datagram of `len` bytes to `dst` with traffic class
    /// `tclass` and BTH destination QPN `qpn`, from socket `sock`, gets: its position in the
    /// GSO message it joins, 0 when it starts one (a message has one destination, traffic
    /// class, QPN and socket). With IPv4 the kernel gives the
    /// segments of a message Identifications counting up from the first's (0 from an
    /// unconnected socket with DF), and the ICRC covers the Identification: the caller seals
    /// with this index.
    pub fn next_segment(&self, dst: WireAddr, len: usize, tclass: u8, qpn: u32, sock: u8) -> u16 {
        let i = self.queued;
        match self.group {
            Some((size, bytes))
                if self.gso
                    && i > 0
                    && self.dsts[i - 1] == Some(dst)
                    && self.tclasses[i - 1] == tclass
                    && self.qpns[i - 1] == qpn
                    && self.socks[i - 1] == sock
                    && qpn != 1 // MADs: each its own (the steering reads each one's CM fields)
                    && len <= size
                    && (self.segs[i - 1] as usize) + 1 < GSO_MAX_SEGS
                    && bytes + len <= GSO_MAX_BYTES =>
            {
                self.segs[i - 1] + 1
            }
            _ => 0,
        }
    }

    /// Datagrams queued.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Whether another datagram fits.
    pub fn is_full(&self) -> bool {
        self.queued == self.lens.len()
    }

    /// Queues a copy of `data` (the tests' reference for [`SendBatch::commit`]).
    #[cfg(test)]
    pub fn push(&mut self, dst: WireAddr, port: u16, tclass: u8, sock: u8, data: &[u8]) -> usize {
        debug_assert!(data.len() <= self.slot);
        self.slot_mut()[..data.len()].copy_from_slice(data);
        self.commit(dst, port, tclass, sock, data.len())
    }

    /// The buffer of the next datagram (`slot` bytes), to write it in place; then
    /// [`SendBatch::commit`] queues it. The caller checks [`SendBatch::is_full`] first.
    pub fn slot_mut(&mut self) -> &mut [u8] {
        let i = self.queued;
        &mut self.bufs[i * self.slot..(i + 1) * self.slot]
    }

    /// Queues the `len` bytes written into [`SendBatch::slot_mut`] to `dst:port` from socket
    /// `sock` (below 128), to go with IPv4 TOS / IPv6 traffic class `tclass`.
    #[cfg(test)]
    pub fn commit(&mut self, dst: WireAddr, port: u16, tclass: u8, sock: u8, len: usize) -> usize {
        self.commit_at(dst, port, tclass, sock, 0..len)
    }

    /// [`SendBatch::commit`] of the datagram written at `at` in [`SendBatch::slot_mut`].
    pub fn commit_at(
        &mut self,
        dst: WireAddr,
        port: u16,
        tclass: u8,
        sock: u8,
        at: std::ops::Range<usize>,
    ) -> usize {
        let i = self.queued;
        let len = at.len();
        debug_assert!(i < self.lens.len() && at.end <= self.slot);
        let base = i * self.slot + at.start;
        let data = &self.bufs[base..base + len];
        let qpn = data
            .get(5..8)
            .map_or(0, |q| u32::from_be_bytes([0, q[0], q[1], q[2]]));
        self.starts[i] = at.start;
        self.lens[i] = len;
        self.names[i] = sys::to_sockaddr(dst, port);
        let seg = self.next_segment(dst, len, tclass, qpn, sock);
        self.segs[i] = seg;
        self.socks[i] = sock;
        self.present |= 1u128 << (sock & 127);
        self.dsts[i] = Some(dst);
        self.tclasses[i] = tclass;
        self.qpns[i] = qpn;
        self.group = match (seg, self.group) {
            // a shorter datagram ends its group
            (0, _) => Some((len, len)),
            (_, Some((size, bytes))) if len == size => Some((size, bytes + len)),
            _ => None,
        };
        self.queued += 1;
        i
    }

    /// The bytes of queued datagram `i`, for in-place changes (ICRC, fault injection).
    pub fn data_mut(&mut self, i: usize) -> &mut [u8] {
        let base = i * self.slot + self.starts[i];
        &mut self.bufs[base..base + self.lens[i]]
    }

    /// Destination of queued datagram `i`.
    pub fn dst(&self, i: usize) -> Option<(WireAddr, u16)> {
        sys::from_sockaddr(&self.names[i].0)
    }

    /// Traffic class of queued datagram `i`.
    pub fn tclass(&self, i: usize) -> u8 {
        self.tclasses[i]
    }

    /// The socket queued datagram `i` leaves from.
    pub fn sock(&self, i: usize) -> u8 {
        self.socks[i]
    }

    /// Sends queued datagrams in the order `order` gives (indices may repeat or be left out:
    /// that is how the fault injector duplicates and drops), or all in queue order when `order`
    /// is `None`, then empties the queue: one `sendmmsg` run per socket present, on the
    /// descriptor `fd_of` gives for it (`None`: the socket is gone, its datagrams are counted
    /// as refused). Datagrams the kernel refuses are counted, not retried; a full socket buffer
    /// is waited out briefly.
    pub fn send<'f>(
        &mut self,
        fd_of: impl Fn(u8) -> Option<BorrowedFd<'f>>,
        order: Option<&[u16]>,
    ) -> SendOutcome {
        let mut out = SendOutcome::default();
        let mut present = self.present;
        while present != 0 {
            let sock = present.trailing_zeros() as u8;
            present &= present - 1;
            let (mut run, plan) = self.build(sock, order);
            let n = run.len();
            if n == 0 {
                continue;
            }
            let per_msg = &plan.per_msg[..n];
            let o = match fd_of(sock) {
                Some(fd) => send_all(fd, &mut run, per_msg),
                None => SendOutcome {
                    failed: per_msg.iter().map(|&d| usize::from(d)).sum(),
                    last_error: Some(libc::EBADF),
                    ..SendOutcome::default()
                },
            };
            out.runs += 1;
            out.sent += o.sent;
            if sock >= super::peers::FIRST_ID {
                out.connected += o.sent;
            }
            out.failed += o.failed;
            out.gso_refused |= o.gso_refused;
            if o.last_error.is_some() {
                out.last_error = o.last_error;
            }
        }
        self.queued = 0;
        self.group = None;
        self.present = 0;
        out
    }

    /// Loads the messages of the datagrams from socket `sock` (in `order`, or queue order
    /// grouped by segment) into the headers, with their control messages.
    fn build<'s>(&'s mut self, sock: u8, order: Option<&[u16]>) -> (Loaded<'s>, Plan<'s>) {
        let SendBatch {
            slot,
            bufs,
            starts,
            lens,
            names,
            out,
            queued,
            tclasses,
            segs,
            socks,
            per_msg,
            msg_first,
            ..
        } = self;
        let mut run = out.load();
        let (bufs, names, slot) = (&**bufs, &**names, *slot);
        // a connected socket's datagrams name no destination (one would cost the route
        // lookup the connection saves)
        let named = sock < super::peers::FIRST_ID;
        let mut add = |run: &mut Loaded<'s>, i: usize, new_msg: bool| {
            let base = i * slot + starts[i];
            let data = &bufs[base..base + lens[i]];
            if new_msg {
                let m = run.len();
                if run.message(named.then_some(&names[i]), data) {
                    per_msg[m] = 1;
                    msg_first[m] = i as u16;
                }
            } else if run.append(data) {
                per_msg[run.len() - 1] += 1;
            }
        };
        match order {
            Some(order) => {
                for &i in order {
                    if (i as usize) < *queued && socks[i as usize] == sock {
                        add(&mut run, i as usize, true);
                    }
                }
            }
            None => {
                for i in 0..*queued {
                    if socks[i] == sock {
                        add(&mut run, i, segs[i] == 0);
                    }
                }
            }
        }
        // Control messages: UDP_SEGMENT with the first datagram's size for a message of more
        // than one; IP_TOS / IPV6_TCLASS for a non-zero traffic class (0 is the socket's
        // default, which the sockets never change, so it needs none).
        for m in 0..run.len() {
            let first = msg_first[m] as usize;
            let tclass = tclasses[first];
            let gso = per_msg[m] >= 2;
            if !gso && tclass == 0 {
                continue;
            }
            let v6 = i32::from(names[first].0.ss_family) == libc::AF_INET6;
            let size = (lens[first] as u16).to_ne_bytes();
            let tc = i32::from(tclass).to_ne_bytes();
            let (level, kind) = sys::tclass_cmsg(v6);
            let seg = (SOL_UDP, UDP_SEGMENT, &size[..]);
            let tos = (level, kind, &tc[..]);
            match (gso, tclass != 0) {
                (true, true) => run.control(m, &[seg, tos]),
                (true, false) => run.control(m, &[seg]),
                _ => run.control(m, &[tos]),
            }
        }
        (run, Plan { per_msg })
    }
}

/// The datagrams per message of a loaded run.
struct Plan<'a> {
    per_msg: &'a [u16],
}

/// What an unused destination slot holds.
fn unspecified() -> WireAddr {
    WireAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0)
}

/// Hands every message of `run` to the kernel, skipping (and counting) the ones it refuses;
/// `per_msg` says how many datagrams each holds.
pub(super) fn send_all(fd: BorrowedFd<'_>, run: &mut Loaded<'_>, per_msg: &[u16]) -> SendOutcome {
    let mut out = SendOutcome::default();
    let mut at = 0;
    let mut waits = 0;
    let mut refused_again = false;
    while at < run.len() {
        let errno = match run.send(fd, at) {
            Ok(done) if done > 0 => {
                out.sent += per_msg[at..at + done]
                    .iter()
                    .map(|&d| d as usize)
                    .sum::<usize>();
                at += done;
                continue;
            }
            // nothing taken and no error: counted as refused below
            Ok(_) => libc::EIO,
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        };
        match errno {
            libc::EINTR => {}
            // an ICMP answer to an earlier datagram, reported (and cleared) by this send,
            // which sent nothing (a connected socket; the GSI's, see `udp/err.rs`): again
            libc::ECONNREFUSED if !refused_again => refused_again = true,
            libc::EAGAIN | libc::ENOBUFS if waits < 100 => {
                waits += 1;
                mmsg::wait_writable(fd, 10);
            }
            _ => {
                // This message is refused (unreachable, too big, ...): lost packets.
                let dgrams = per_msg[at] as usize;
                if dgrams > 1 && matches!(errno, libc::EIO | libc::EINVAL | libc::ENOPROTOOPT) {
                    out.gso_refused = true;
                }
                out.failed += dgrams;
                out.last_error = Some(errno);
                at += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(qpn: u32, len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    /// A datagram written in place and committed is queued exactly as a pushed copy:
    /// the same bytes, length, destination and GSO grouping (segment indexes).
    #[test]
    fn a_datagram_written_in_place_queues_as_a_pushed_copy() {
        let dst: WireAddr = "192.0.2.9".parse().unwrap();
        let (mut a, mut b) = (SendBatch::new(8, 256), SendBatch::new(8, 256));
        a.set_gso(true);
        b.set_gso(true);
        for (k, len) in [100usize, 100, 100, 60, 100].into_iter().enumerate() {
            let mut p = bth(0x12, len);
            p[20..].fill(k as u8);
            let i = a.push(dst, 4791, 0, 0, &p);
            b.slot_mut()[..len].copy_from_slice(&p);
            let j = b.commit(dst, 4791, 0, 0, len);
            assert_eq!(i, j);
            assert_eq!(a.data_mut(i), b.data_mut(j), "datagram {k}: bytes");
            assert_eq!(a.segment(i), b.segment(j), "datagram {k}: segment");
            assert_eq!(a.dst(i), b.dst(j));
        }
        // 3 of 100 bytes in one GSO message, the shorter one closes it, then a new one
        assert_eq!(
            (0..5).map(|i| b.segment(i)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0]
        );
        assert_eq!(a.len(), 5);
        assert_eq!(b.len(), 5);
    }
}
