//! [`UdpWire`]: RoCEv2 over UDP port 4791, one socket per local address in use (and
//! send-only ones per source port: [`super::ports`]). The receive path is in `udp/rx.rs`,
//! flushing in `udp/tx.rs`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

mod backoff;
mod config;
#[allow(unsafe_code)] // IP_RECVERR and the error queue: setsockopt, epoll_ctl, recvmsg
mod err;
mod local;
mod mcast;
mod park;
mod rx;
mod tx;

pub use config::{UdpConfig, ROCE_PORT};
#[cfg(feature = "fuzzing")]
pub(crate) use rx::fuzz::gro_receive;

use super::batch::RecvBatch;
use super::fault::FaultInjector;
use super::icrc::{self, IcrcChecker};
use super::peers::PeerSockets;
use super::ports::SportSockets;
use super::send_batch::SendBatch;
use super::share::{self, GroupKey, Member, Slot};
use super::{sys, Arrival, DatagramWire, TxMeta, WireAddr, WireStats};
use crate::{Error, Result};

/// A BTH (12 bytes) and an ICRC (4 bytes).
const MIN_PACKET: usize = 16;

pub(super) struct Local {
    pub addr: WireAddr,
    /// The socket on `addr:port` (socket 0 of `out`).
    pub fd: OwnedFd,
    pub out: SendBatch,
    /// Membership of the address's group, when sharing.
    pub member: Option<Arc<Member>>,
    /// Send-only sockets on `addr:sport` (sockets 1..=64 of `out`).
    pub ports: SportSockets,
    /// Send-only sockets on `addr:sport` connected to a peer (sockets 65.. of `out`).
    pub peers: PeerSockets,
    /// The network namespace `fd` was opened in (its inode): source-port sockets are only
    /// opened from a thread in the same one.
    pub netns: u64,
    /// The last receive on `fd` found nothing: the next asks for one datagram (a batch
    /// `recvmmsg` that gets one tries again inside the call, on the datagram's critical path).
    pub quiet: bool,
}

impl Local {
    /// Whether a socket of this address may be opened from the calling thread: the source-port
    /// table checks each new socket's namespace cookie, or the thread is in the address's
    /// namespace (elsewhere the same address may name another host's).
    pub fn may_open_here(&self) -> bool {
        self.ports.checks_netns() || share::current_netns() == self.netns
    }
}

/// Where a held sent datagram goes (from, to), its traffic class and the source port it was
/// sealed for.
pub(super) type SendMeta = (WireAddr, WireAddr, u8, u16);

/// RoCEv2 over UDP: a [`DatagramWire`] that opens UDP port 4791 on each local address in use.
///
/// Every socket is non-blocking, never fragments (DF, `IP_PMTUDISC_DO` /
/// `IPV6_PMTUDISC_DO`), and reports each datagram's destination address and arrival interface
/// (`IP_PKTINFO` / `IPV6_RECVPKTINFO`), TOS / traffic class and TTL / hop limit. Sending from an
/// unconnected socket with DF makes Linux write IPv4 Identification 0, which the ICRC on send
/// relies on (see the `kernel_sends_identification_zero` test). Datagrams are sent from port
/// 4791, or from the source port [`DatagramWire::send_from_port`] names (a QP's flow port, as
/// Linux sends: see [`super::flow`]) through a send-only socket on that port
/// ([`super::ports`]); peers do not check the source port, and neither does this wire.
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
    pub(super) cfg: UdpConfig,
    pub(super) locals: Vec<Local>,
    pub(super) inbox: RecvBatch,
    pub(super) epoll: OwnedFd,
    pub(super) stats: WireStats,
    pub(super) next_recv: usize,
    pub(super) send_faults: Option<Box<FaultInjector<SendMeta>>>,
    pub(super) recv_faults: Option<Box<FaultInjector<(Arrival, u16)>>>,
    pub(super) order: Vec<u16>,
    pub(super) checker: IcrcChecker,
    /// Every `recvmmsg` of the last `recv` returned less than a full batch.
    pub(super) drained: bool,
    /// A socket of this wire took `UDP_GRO`.
    gro: bool,
    /// The slot, when sharing (claimed on first use).
    pub(super) slot: Option<Slot>,
    /// When a misdelivered datagram last repaired a group's table (at most one per
    /// [`share::SETTLE`]).
    last_evidence: Option<Instant>,
    /// A coarse clock for the source-port sockets' use times: read at each flush, not per
    /// datagram.
    pub(super) clock: Instant,
    /// The host-local wire, once asked for (`udp/local.rs`).
    local: local::LocalPart,
    /// The sockets out of the epoll set while busy-polled (`udp/park.rs`).
    park: park::Parking,
    /// A busy poller's reads of empty sockets (`udp/backoff.rs`).
    backoff: backoff::Backoff,
    /// Received datagrams carry their TOS / traffic class and TTL / hop limit
    /// ([`DatagramWire::set_ip_meta`]).
    pub(super) ip_meta: bool,
    /// ICMP port unreachables the receives found (`udp/err.rs`).
    pub(super) unreachable: err::Unreachable,
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

/// Receive buffer per datagram under UDP GRO: the largest coalesced receive (an IP datagram
/// of at most 65,535 bytes).
const GRO_BUF: usize = 65_536;

impl UdpWire {
    /// A wire with no address open yet.
    pub fn new(cfg: UdpConfig) -> Result<UdpWire> {
        if cfg.batch == 0 || cfg.batch > u16::MAX as usize / 2 || cfg.max_packet < 64 {
            return Err(Error::InvalidArgument("UdpConfig batch or max_packet"));
        }
        let epoll = crate::fd::epoll_create().map_err(|source| Error::Os {
            op: "epoll_create1",
            addr: None,
            source,
        })?;
        let slot = cfg.max_packet;
        let inbox_slot = if cfg.gro { GRO_BUF.max(slot) } else { slot };
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
            inbox: RecvBatch::new(cfg.batch, inbox_slot),
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
            gro: false,
            slot: None,
            last_evidence: None,
            clock: Instant::now(),
            local: Default::default(),
            park: Default::default(),
            backoff: Default::default(),
            ip_meta: true,
            unreachable: Default::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &UdpConfig {
        &self.cfg
    }

    /// Whether the kernel coalesces received datagrams for this wire (UDP GRO, asked for by
    /// [`UdpConfig::gro`] and granted by a socket).
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// The open local addresses.
    pub fn locals(&self) -> impl Iterator<Item = WireAddr> + '_ {
        self.locals.iter().map(|l| l.addr)
    }

    /// The slot, claimed now if sharing and not yet claimed.
    pub(super) fn claim_slot(&mut self) -> Result<Option<u8>> {
        if !self.cfg.share {
            return Ok(None);
        }
        if self.slot.is_none() {
            self.slot = Some(Slot::claim(&self.cfg.runtime_dir)?);
        }
        Ok(self.slot.as_ref().map(Slot::get))
    }

    /// A datagram for slot `seen` reached local `i`: let its group repair its table (off
    /// the fast path: only after a misdelivery, at most once per [`share::SETTLE`]).
    pub(super) fn evidence(&mut self, i: usize, seen: u8) {
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

    /// A REQ for another process's listener (service `sid`) reached local `i`: let its
    /// group repair its table from it ([`share::Member::service_evidence`]; at most once
    /// per [`share::SETTLE`], with [`evidence`](Self::evidence)).
    pub(super) fn service_evidence(&mut self, i: usize, sid: u64) {
        let now = Instant::now();
        if self
            .last_evidence
            .is_some_and(|t| now.duration_since(t) < share::SETTLE)
        {
            return;
        }
        self.last_evidence = Some(now);
        if let Some(m) = &self.locals[i].member {
            // A failure leaves the table as it was: the REQ's retransmission tries again.
            let _ = m.service_evidence(sid);
        }
    }

    pub(super) fn local_index(&self, addr: WireAddr) -> Option<usize> {
        self.locals.iter().position(|l| l.addr == addr)
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
            None => (sys::open_udp(local, port, buf, false, self.ip_meta)?, None),
            Some(slot) => {
                let key = GroupKey {
                    ns: share::current_netns(),
                    addr: local,
                    port,
                };
                let ip_meta = self.ip_meta;
                let (fd, m) =
                    share::join(key, slot, || sys::open_udp(local, port, buf, true, ip_meta))?;
                (fd, Some(m))
            }
        };
        let rc = park::socket_ctl(self.epoll.as_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd());
        if rc != 0 {
            return Err(Error::last_os("epoll_ctl", Some(local)));
        }
        if self.cfg.gro && sys::enable_udp_gro(fd.as_fd()) {
            self.gro = true;
        }
        let shared = member.is_some();
        let ports = SportSockets::of_socket(fd.as_fd());
        let mut out = SendBatch::new(self.cfg.batch, self.cfg.max_packet);
        out.set_gso(self.cfg.gso && self.send_faults.is_none() && sys::has_udp_gso(fd.as_fd()));
        self.locals.push(Local {
            addr: local,
            fd,
            out,
            member,
            ports,
            peers: PeerSockets::default(),
            netns: share::current_netns(),
            quiet: true,
        });
        if shared {
            // a member of a shared group has a bell from the start: what a stale program
            // sends another member is forwarded to it (`udp/rx.rs`)
            let _ = self.local_id();
        }
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
        self.send_from_port(from, to, 0, meta, packet)
    }

    fn send_from_port(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        sport: u16,
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
        self.emit_from_port(from, to, sport, meta, packet.len(), &mut |slot| {
            slot[..packet.len()].copy_from_slice(packet);
            0..packet.len()
        })
    }

    fn emit_from_port(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        sport: u16,
        meta: TxMeta,
        max: usize,
        write: &mut dyn FnMut(&mut [u8]) -> std::ops::Range<usize>,
    ) -> Result<()> {
        if meta.placement != super::TxPlacement::Inline {
            return Err(Error::InvalidArgument(
                "a pulled WRITE goes over the host-local wire only",
            ));
        }
        let i = self
            .local_index(from)
            .ok_or(Error::NotOpen { addr: from })?;
        let port = self.cfg.port;
        if from.ip().is_ipv4() != to.ip().is_ipv4() {
            return Err(Error::InvalidArgument(
                "source and destination of different IP families",
            ));
        }
        let scoped = with_scope(to, from);
        let (sock, sport) = self.socket_for(i, sport, scoped);
        if self.locals[i].out.is_full() {
            self.flush_local(i, None);
        }
        let encap = icrc::encap(from, to, sport, port).ok_or(Error::InvalidArgument(
            "source and destination of different IP families",
        ))?;
        let to = scoped;
        let max = max.min(self.cfg.max_packet);
        let out = &mut self.locals[i].out;
        let at = write(&mut out.slot_mut()[..max]);
        if at.is_empty() || at.end > max {
            return Err(Error::InvalidArgument(
                "packet does not encode in a datagram of the wire's largest size",
            ));
        }
        if at.len() < MIN_PACKET {
            return Err(Error::InvalidArgument(
                "packet shorter than a BTH and its ICRC",
            ));
        }
        let k = out.commit_at(to, port, meta.tclass, sock, at);
        let encap = icrc::with_identification(encap, out.segment(k));
        // Cannot fail: the length is within bounds and the families match.
        icrc::seal(&encap, out.data_mut(k));
        Ok(())
    }

    fn prepare_port(&mut self, local: WireAddr, sport: u16) {
        let Some(i) = self.local_index(local) else {
            return;
        };
        if sport == 0 || sport == self.cfg.port {
            return;
        }
        self.clock = Instant::now();
        if !matches!(
            self.locals[i].ports.lookup(sport, self.clock),
            super::ports::Lookup::Open(_)
        ) {
            self.open_sport(i, sport);
        }
    }

    fn prepare_path(&mut self, local: WireAddr, sport: u16, remote: WireAddr) {
        self.prepare_port(local, sport);
        let Some(i) = self.local_index(local) else {
            return;
        };
        let port = self.cfg.port;
        // IPv6 only: a connected IPv4 socket sends a per-socket Identification counter
        // (random start) where an unconnected one with DF sends 0, and the ICRC covers the
        // Identification; we seal for 0 (docs/ARCHITECTURE.md, "Source ports")
        if sport == 0 || sport == port || !local.ip().is_ipv6() || !remote.ip().is_ipv6() {
            return;
        }
        let to = with_scope(remote, local);
        if self.locals[i].peers.has(sport, to, port) {
            return;
        }
        // only from a thread in the wire's namespace (as the port's socket)
        if !self.locals[i].may_open_here() {
            return;
        }
        self.clock = Instant::now();
        if self.locals[i].peers.is_full() {
            if !self.locals[i].peers.can_evict(self.clock) {
                return;
            }
            // socket numbers change: what is queued leaves first
            self.flush_local(i, None);
            self.locals[i].peers.evict(self.clock);
        }
        let netns = self.locals[i].ports.netns();
        match self.locals[i]
            .peers
            .open(local, sport, (to, port), netns, self.clock)
        {
            Ok(_) => tracing::debug!(%local, sport, peer = %to, "connected send socket opened"),
            Err(e) => {
                tracing::debug!(%local, sport, peer = %to, error = %e, "no connected send socket")
            }
        }
    }

    fn join_group(&mut self, group: WireAddr, ifindex: u32) -> Result<()> {
        self.join(group, ifindex)
    }

    fn flush(&mut self) -> Result<()> {
        self.local_flush();
        if self.send_faults.is_none() && self.locals.iter().all(|l| l.out.len() == 0) {
            // nothing queued: no clock read (a busy poller flushes every round)
            return Ok(());
        }
        self.clock = Instant::now();
        let now = self.send_faults.as_ref().map(|_| self.clock);
        for i in 0..self.locals.len() {
            self.flush_local(i, now);
        }
        if let Some(now) = now {
            self.release_sends(now);
        }
        Ok(())
    }

    fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> Result<usize> {
        self.park_on_recv(self.local.busy);
        self.recv_with_local(deliver)
    }

    fn pull_min(&self) -> Option<u32> {
        self.cfg.pull_min()
    }

    fn in_place_min(&self) -> Option<u32> {
        self.cfg.in_place_min()
    }

    fn host_local(&mut self) -> Option<super::HostPeer> {
        self.local_id()
    }

    fn host_connect(&mut self, peer: super::HostPeer) -> Result<()> {
        self.local_connect(peer)
    }

    fn emit_host(
        &mut self,
        peer: super::HostPeer,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        max: usize,
        write: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<()> {
        self.local_emit(peer, from, to, meta, max, write)
    }

    fn host_share(
        &mut self,
        peer: super::HostPeer,
        token: u64,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> bool {
        self.local
            .wire
            .as_mut()
            .is_some_and(|l| l.share(peer, token, fd))
    }

    fn host_ready(&mut self, peer: super::HostPeer) -> bool {
        let max = self.cfg.max_packet;
        self.local
            .wire
            .as_mut()
            .map_or(true, |l| l.ready(peer, max))
    }

    fn busy_poll(&mut self, on: bool) {
        self.local.busy = on;
    }

    fn set_ip_meta(&mut self, on: bool) {
        if self.ip_meta == on {
            return;
        }
        self.ip_meta = on;
        for l in &self.locals {
            if let Err(e) = sys::set_ip_meta(l.fd.as_fd(), l.addr.ip().is_ipv6(), on) {
                tracing::debug!(local = %l.addr, on, error = %e, "TOS/TTL control messages not changed");
            }
        }
    }

    fn idle_poll(&mut self) -> bool {
        self.local_idle_poll() || self.sockets_idle_poll()
    }

    fn arm_wait(&mut self) -> bool {
        self.unpark();
        self.local_arm()
    }

    fn recv_drained(&self) -> bool {
        self.drained
    }

    fn take_unreachable(&mut self) -> Option<(WireAddr, WireAddr)> {
        self.unreachable.pop()
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
        if let Some(l) = &self.local.wire {
            s.local = l.stats();
        }
        s.peer_sockets = self.locals.iter().map(|l| l.peers.len() as u64).sum();
        s
    }
}
