//! [`UdpWire`]: RoCEv2 over UDP port 4791, one socket per local address in use.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use super::batch::{RecvBatch, SendBatch, SendOutcome};
use super::fault::{FaultInjector, FaultSpec, Verdict};
use super::icrc::{self, IcrcChecker, IcrcOk};
use super::share::{self, GroupKey, Member, Slot};
use super::steer::{self, Dest};
use super::{sys, Arrival, DatagramWire, TxMeta, WireAddr, WireStats};
use crate::{Error, Result};

/// The IANA port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// A BTH (12 bytes) and an ICRC (4 bytes).
const MIN_PACKET: usize = 16;

/// Settings of a [`UdpWire`].
///
/// ```
/// let cfg = rdma_soft::io::UdpConfig::default();
/// assert_eq!(cfg.port, 4791);
/// assert!(cfg.faults.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct UdpConfig {
    /// UDP port to bind and to send to (4791; tests may pick another to run beside a real
    /// RoCEv2 stack).
    pub port: u16,
    /// Datagrams per `sendmmsg`/`recvmmsg`.
    pub batch: usize,
    /// Largest datagram: a 4096-byte payload with every transport header and the ICRC fits.
    pub max_packet: usize,
    /// Requested `SO_RCVBUF`/`SO_SNDBUF` (the kernel caps it at `rmem_max`/`wmem_max`).
    pub socket_buffer: usize,
    /// Fault injection, off when `None`.
    pub faults: Option<FaultSpec>,
    /// UDP GSO on send (`UDP_SEGMENT`): consecutive packets to one peer that have the same
    /// size (the last may be shorter) go as one message the kernel segments, each segment
    /// sealed with the ICRC of the IPv4 Identification it gets. Used where the kernel has it
    /// and no send faults are injected; off after the kernel refuses a GSO message.
    pub gso: bool,
    /// Share each address with the other processes of this user (`SO_REUSEPORT` group,
    /// steered by QPN and CM fields: [`super::share`]). Off: the wire holds UDP `port`
    /// on its addresses alone, and a second wire gets [`Error::AddrInUse`].
    pub share: bool,
}

impl Default for UdpConfig {
    fn default() -> UdpConfig {
        UdpConfig {
            port: ROCE_PORT,
            batch: 32,
            max_packet: 4096 + 128,
            socket_buffer: 4 << 20,
            faults: None,
            gso: true,
            share: true,
        }
    }
}

impl UdpConfig {
    /// The defaults, with fault injection from `RDMA_SOFT_FAULTS` (an error names the variable
    /// when its value does not parse).
    pub fn from_env() -> Result<UdpConfig> {
        Ok(UdpConfig {
            faults: FaultSpec::from_env()?,
            ..UdpConfig::default()
        })
    }
}

struct Local {
    addr: WireAddr,
    fd: OwnedFd,
    out: SendBatch,
    /// Membership of the address's group, when sharing.
    member: Option<Arc<Member>>,
}

/// Where a held sent datagram goes (from, to) and its traffic class.
type SendMeta = (WireAddr, WireAddr, u8);

/// RoCEv2 over UDP: a [`DatagramWire`] that opens UDP port 4791 on each local address in use.
///
/// Every socket is non-blocking, never fragments (DF, `IP_PMTUDISC_DO` /
/// `IPV6_PMTUDISC_DO`), and reports each datagram's destination address and arrival interface
/// (`IP_PKTINFO` / `IPV6_RECVPKTINFO`), TOS / traffic class and TTL / hop limit. Sending from an
/// unconnected socket with DF makes Linux write IPv4 Identification 0, which the ICRC on send
/// relies on (see the `kernel_sends_identification_zero` test). Datagrams are sent from port
/// 4791 (RoCEv2 allows any source port; peers do not check it).
///
/// Receiving round-robins over the open addresses, one `recvmmsg` each per call; the
/// [`DatagramWire::wait_fd`] is an epoll set over all of them.
///
/// ```
/// use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};
/// let mut w = UdpWire::new(UdpConfig { port: 47912, ..UdpConfig::default() }).unwrap();
/// let a: WireAddr = "127.0.0.53".parse().unwrap();
/// w.open(a).unwrap();
/// // a second process (here: a second wire) shares the address...
/// let mut other = UdpWire::new(UdpConfig { port: 47912, ..UdpConfig::default() }).unwrap();
/// other.open(a).unwrap();
/// // ...unless one of them does not share
/// let alone = UdpConfig { port: 47912, share: false, ..UdpConfig::default() };
/// let err = UdpWire::new(alone).unwrap().open(a).unwrap_err();
/// assert_eq!(err.to_string(), "UDP 47912 on 127.0.0.53 is held by another process");
/// assert_eq!(err.errno(), libc::EADDRINUSE);
/// ```
pub struct UdpWire {
    cfg: UdpConfig,
    locals: Vec<Local>,
    inbox: RecvBatch,
    epoll: OwnedFd,
    stats: WireStats,
    next_recv: usize,
    send_faults: Option<Box<FaultInjector<SendMeta>>>,
    recv_faults: Option<Box<FaultInjector<(Arrival, u16)>>>,
    order: Vec<u16>,
    checker: IcrcChecker,
    /// Every `recvmmsg` of the last `recv` returned less than a full batch.
    drained: bool,
    /// The slot, when sharing (claimed on first use).
    slot: Option<Slot>,
    /// When a misdelivered datagram last repaired a group's table (at most one per
    /// [`share::SETTLE`]).
    last_evidence: Option<Instant>,
}

impl std::fmt::Debug for UdpWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpWire")
            .field("port", &self.cfg.port)
            .field(
                "locals",
                &self.locals.iter().map(|l| l.addr).collect::<Vec<_>>(),
            )
            .field("faults", &self.cfg.faults)
            .finish()
    }
}

impl UdpWire {
    /// A wire with no address open yet.
    pub fn new(cfg: UdpConfig) -> Result<UdpWire> {
        if cfg.batch == 0 || cfg.batch > u16::MAX as usize / 2 || cfg.max_packet < 64 {
            return Err(Error::InvalidArgument("UdpConfig batch or max_packet"));
        }
        // SAFETY: plain epoll_create1; checked below.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(Error::last_os("epoll_create1", None));
        }
        // SAFETY: fresh descriptor owned here.
        let epoll = unsafe { OwnedFd::from_raw_fd(raw) };
        let slot = cfg.max_packet;
        let (send_faults, recv_faults) = match &cfg.faults {
            Some(spec) => (
                spec.on_send()
                    .then(|| Box::new(FaultInjector::new(spec, 1, slot))),
                spec.on_recv()
                    .then(|| Box::new(FaultInjector::new(spec, 2, slot))),
            ),
            None => (None, None),
        };
        Ok(UdpWire {
            inbox: RecvBatch::new(cfg.batch, slot),
            order: Vec::with_capacity(cfg.batch * 2),
            cfg,
            locals: Vec::new(),
            epoll,
            stats: WireStats::default(),
            next_recv: 0,
            send_faults,
            recv_faults,
            checker: IcrcChecker::new(),
            drained: false,
            slot: None,
            last_evidence: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &UdpConfig {
        &self.cfg
    }

    /// The open local addresses.
    pub fn locals(&self) -> impl Iterator<Item = WireAddr> + '_ {
        self.locals.iter().map(|l| l.addr)
    }

    /// The slot, claimed now if sharing and not yet claimed.
    fn claim_slot(&mut self) -> Result<Option<u8>> {
        if !self.cfg.share {
            return Ok(None);
        }
        if self.slot.is_none() {
            self.slot = Some(Slot::claim()?);
        }
        Ok(self.slot.as_ref().map(Slot::get))
    }

    /// A datagram for slot `seen` reached local `i`: let its group repair its table (off
    /// the fast path: only after a misdelivery, at most once per [`share::SETTLE`]).
    fn evidence(&mut self, i: usize, seen: u8) {
        let now = Instant::now();
        if self
            .last_evidence
            .is_some_and(|t| now.duration_since(t) < share::SETTLE)
        {
            return;
        }
        self.last_evidence = Some(now);
        if let Some(m) = &self.locals[i].member {
            // A failure leaves the table as it was: the next misdelivery tries again.
            let _ = m.evidence(seen);
        }
    }

    fn local_index(&self, addr: WireAddr) -> Option<usize> {
        self.locals.iter().position(|l| l.addr == addr)
    }

    fn flush_local(&mut self, i: usize, now: Option<Instant>) {
        let local = &mut self.locals[i];
        if local.out.len() == 0 {
            return;
        }
        let fd = local.fd.as_raw_fd();
        let outcome = match self.send_faults.as_deref_mut() {
            None => local.out.send(fd, None),
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
                            let held = match to {
                                Some(to) => inj.hold(
                                    now,
                                    local.out.data_mut(k),
                                    (local.addr, to, tclass),
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
                local.out.send(fd, Some(&self.order))
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
        self.stats.send_errors += o.failed as u64;
        self.stats.send_calls += 1;
        if o.last_error.is_some() {
            self.stats.last_send_errno = o.last_error;
        }
    }

    /// Sends the held (delayed or reordered) datagrams that are due, one `sendmsg` each (with
    /// their traffic class): only with fault injection, so not on the fast path.
    fn release_sends(&mut self, now: Instant) {
        let Some(inj) = self.send_faults.as_deref_mut() else {
            return;
        };
        let locals = &self.locals;
        let port = self.cfg.port;
        let stats = &mut self.stats;
        inj.release(now, &mut |(from, to, tclass), data| {
            let Some(local) = locals.iter().find(|l| l.addr == from) else {
                return;
            };
            match sys::send_one(local.fd.as_raw_fd(), to, port, tclass, data) {
                Err(e) => {
                    stats.send_errors += 1;
                    stats.last_send_errno = e.raw_os_error();
                }
                Ok(()) => stats.sent += 1,
            }
        });
    }
}

/// Checks the ICRC of a received datagram, counting what it finds.
fn accept(
    checker: &mut IcrcChecker,
    stats: &mut WireStats,
    port: u16,
    arrival: &Arrival,
    src_port: u16,
    data: &[u8],
) -> bool {
    let verdict = icrc::encap(arrival.remote, arrival.local, src_port, port)
        .and_then(|encap| checker.check(&encap, data));
    match verdict {
        Some(IcrcOk::Exact) => true,
        Some(IcrcOk::RecoveredId(_)) => {
            stats.icrc_recovered_id += 1;
            true
        }
        None => {
            stats.icrc_errors += 1;
            crate::ratelimit::warn_limited!(from = %arrival.remote, "datagram with a bad ICRC dropped");
            false
        }
    }
}

/// The scope a link-local destination is reached through: its own, else the source's.
fn with_scope(to: WireAddr, from: WireAddr) -> WireAddr {
    if to.is_link_local() && to.scope_id() == 0 {
        WireAddr::new(to.ip(), from.scope_id())
    } else {
        to
    }
}

impl Drop for UdpWire {
    fn drop(&mut self) {
        // Each socket leaves its group under the group's lock (the others' order stays
        // known), after its queue is sent.
        while let Some(a) = self.locals.last().map(|l| l.addr) {
            self.close(a);
        }
    }
}

impl DatagramWire for UdpWire {
    fn max_packet(&self) -> usize {
        self.cfg.max_packet
    }

    fn open(&mut self, local: WireAddr) -> Result<()> {
        if self.is_open(local) {
            return Ok(());
        }
        let buf = i32::try_from(self.cfg.socket_buffer).unwrap_or(i32::MAX);
        let port = self.cfg.port;
        let (fd, member) = match self.claim_slot()? {
            None => (sys::open_udp(local, port, buf, false)?, None),
            Some(slot) => {
                let key = GroupKey {
                    ns: share::current_netns(),
                    addr: local,
                    port,
                };
                let (fd, m) = share::join(key, slot, || sys::open_udp(local, port, buf, true))?;
                (fd, Some(m))
            }
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd.as_raw_fd() as u64,
        };
        // SAFETY: both descriptors are open; `ev` is a valid event.
        let rc = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if rc != 0 {
            return Err(Error::last_os("epoll_ctl", Some(local)));
        }
        let mut out = SendBatch::new(self.cfg.batch, self.cfg.max_packet);
        out.set_gso(self.cfg.gso && self.send_faults.is_none() && sys::has_udp_gso(fd.as_fd()));
        self.locals.push(Local {
            addr: local,
            fd,
            out,
            member,
        });
        Ok(())
    }

    fn close(&mut self, local: WireAddr) -> bool {
        let Some(i) = self.local_index(local) else {
            return false;
        };
        self.flush_local(i, None);
        // Closing the socket removes it from the epoll set.
        let l = self.locals.swap_remove(i);
        if let Some(m) = l.member {
            m.leave(l.fd);
        }
        true
    }

    fn is_open(&self, local: WireAddr) -> bool {
        self.local_index(local).is_some()
    }

    fn send_with(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        packet: &[u8],
    ) -> Result<()> {
        if packet.len() > self.cfg.max_packet {
            return Err(Error::TooLong {
                len: packet.len(),
                max: self.cfg.max_packet,
            });
        }
        if packet.len() < MIN_PACKET {
            return Err(Error::InvalidArgument(
                "packet shorter than a BTH and its ICRC",
            ));
        }
        let i = self
            .local_index(from)
            .ok_or(Error::NotOpen { addr: from })?;
        let port = self.cfg.port;
        let encap = icrc::encap(from, to, port, port).ok_or(Error::InvalidArgument(
            "source and destination of different IP families",
        ))?;
        if self.locals[i].out.is_full() {
            self.flush_local(i, None);
        }
        let to = with_scope(to, from);
        let out = &mut self.locals[i].out;
        let k = out.push(to, port, meta.tclass, packet);
        let encap = icrc::with_identification(encap, out.segment(k));
        // Cannot fail: the length is within bounds and the families match.
        icrc::seal(&encap, out.data_mut(k));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let now = self.send_faults.as_ref().map(|_| Instant::now());
        for i in 0..self.locals.len() {
            self.flush_local(i, now);
        }
        if let Some(now) = now {
            self.release_sends(now);
        }
        Ok(())
    }

    fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> Result<usize> {
        let mut delivered = 0;
        let count = self.locals.len();
        let now = self.recv_faults.as_ref().map(|_| Instant::now());
        let port = self.cfg.port;
        let mut drained = true;
        for step in 0..count {
            let i = (self.next_recv + step) % count;
            let local = &self.locals[i];
            let n = self
                .inbox
                .recv(local.fd.as_raw_fd(), self.cfg.batch)
                .map_err(|source| Error::Os {
                    op: "recvmmsg",
                    addr: Some(local.addr),
                    source,
                })?;
            if n == 0 {
                continue;
            }
            if n >= self.cfg.batch.min(self.inbox.capacity()) {
                drained = false;
            }
            self.stats.recv_calls += 1;
            let bound = local.addr;
            let mine = self.slot.as_ref().map(Slot::get);
            let mut evidence = None;
            for k in 0..n {
                let Some(d) = self.inbox.get(k) else { break };
                let Some((remote, src_port)) = d.src.filter(|_| !d.truncated) else {
                    self.stats.malformed += 1;
                    crate::ratelimit::warn_limited!(
                        truncated = d.truncated,
                        "malformed datagram dropped"
                    );
                    continue;
                };
                let other = match (mine, steer::dest(d.data)) {
                    (Some(mine), Dest::Slot(s)) if s != mine => Some(s),
                    (Some(mine), Dest::Comm(s)) if s != mine => self.locals[i]
                        .member
                        .as_ref()
                        .map_or(true, |m| m.has_member(s))
                        .then_some(s),
                    _ => None,
                };
                if let Some(s) = other {
                    self.stats.misdelivered += 1;
                    evidence = Some(s);
                    continue;
                }
                let local_addr = match d.anc.dst {
                    Some(ip) => WireAddr::new(ip, d.anc.ifindex),
                    None => bound,
                };
                let arrival = Arrival {
                    local: local_addr,
                    remote,
                    ifindex: d.anc.ifindex,
                    tclass: d.anc.tclass,
                    hop_limit: d.anc.hop_limit,
                };
                let data = d.data;
                let times = match (self.recv_faults.as_deref_mut(), now) {
                    (Some(inj), Some(now)) => {
                        let verdict = inj.judge(data);
                        match verdict {
                            Verdict::Pass => 1,
                            Verdict::Duplicate => 2,
                            Verdict::Drop => 0,
                            Verdict::Hold { .. } => {
                                if inj.hold(now, data, (arrival, src_port), verdict) {
                                    0
                                } else {
                                    1
                                }
                            }
                        }
                    }
                    _ => 1,
                };
                if times > 0 {
                    if let Some(inj) = self.recv_faults.as_deref_mut() {
                        inj.passed();
                    }
                    if !accept(
                        &mut self.checker,
                        &mut self.stats,
                        port,
                        &arrival,
                        src_port,
                        data,
                    ) {
                        continue;
                    }
                }
                for _ in 0..times {
                    deliver(&arrival, data);
                    delivered += 1;
                }
            }
            if let Some(seen) = evidence {
                self.evidence(i, seen);
            }
        }
        if let (Some(inj), Some(now)) = (self.recv_faults.as_deref_mut(), now) {
            let (checker, stats) = (&mut self.checker, &mut self.stats);
            inj.release(now, &mut |(arrival, src_port), data| {
                if accept(checker, stats, port, &arrival, src_port, data) {
                    deliver(&arrival, data);
                    delivered += 1;
                }
            });
        }
        if count > 0 {
            self.next_recv = (self.next_recv + 1) % count;
        }
        self.stats.received += delivered as u64;
        self.drained = drained;
        Ok(delivered)
    }

    fn recv_drained(&self) -> bool {
        self.drained
    }

    fn share_slot(&mut self) -> Result<Option<u8>> {
        self.claim_slot()
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn next_deadline(&self) -> Option<Instant> {
        let a = self.send_faults.as_ref().and_then(|f| f.next_due());
        let b = self.recv_faults.as_ref().and_then(|f| f.next_due());
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn stats(&self) -> WireStats {
        let mut s = self.stats;
        if let Some(f) = &self.send_faults {
            s.faults_send = f.stats();
        }
        if let Some(f) = &self.recv_faults {
            s.faults_recv = f.stats();
        }
        s
    }
}
