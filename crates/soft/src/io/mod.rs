//! The datagram I/O layer under the transport.
//!
//! The RC and UD transports see a [`DatagramWire`]: it carries RoCEv2 packets (BTH through
//! ICRC) between local and remote [`WireAddr`]s, in batches, and tells when it has something to
//! receive (an fd to wait on) or to do (a deadline). Nothing above this trait knows it is UDP:
//! [`UdpWire`] implements it today (UDP port 4791, one socket per local address in use, and
//! send-only sockets on the source ports of the QPs' flows, [`ports`]); a
//! host-local wire ([`local`]) carries the QPs whose CM found the peer to be one of our
//! processes on this host (shared-memory rings instead of sockets, chosen per QP:
//! [`DatagramWire::emit_host`]).
//!
//! The fault injector ([`fault`]) sits inside the wire, between the transport and the sockets:
//! see [`FaultSpec`] for `RDMA_SOFT_FAULTS`.
//!
//! ## Batches, GSO, GRO
//! - Batches: `sendmmsg`/`recvmmsg` of up to [`UdpConfig::batch`] datagrams (default 32) into
//!   preallocated buffers; no allocation or lock per packet.
//! - UDP GSO on send (`UDP_SEGMENT`, [`UdpConfig::gso`]): a run of equal-size packets to one
//!   peer goes as one message; segment k is sealed for IPv4 Identification k, which the
//!   kernel gives it (checked on captured datagrams by `tests/kernel_identification.rs`).
//! - UDP GRO on receive (`UDP_GRO`, [`UdpConfig::gro`]): one receive holds up to 64 KiB of a
//!   flow's datagrams, split by segment size in `udp/rx.rs`; segment k's ICRC is checked
//!   for Identification k.
//!
//! What each saves is measured in docs/BENCHMARKS.md ("Batches, GSO and GRO").

mod batch;
pub mod fault;
pub mod flow;
mod icrc;
#[allow(unsafe_code)] // the host-local wire: shared-memory rings, fd passing, peer mappings
pub mod local;
mod peers;
pub mod ports;
mod send_batch;
pub mod share;
pub mod steer;
#[allow(unsafe_code)] // sockets, recvmmsg / sendmmsg and their headers: the safe wrappers
mod sys;
mod udp;

use std::os::fd::BorrowedFd;
use std::time::Instant;

pub use crate::addr::{ParseWireAddrError, WireAddr};
pub use fault::{FaultDir, FaultSpec, FaultStats, FAULTS_ENV};
pub(crate) use local::valid_ring_size;
pub use local::{HostPeer, LocalStats, LOCAL_RING_ENV, LOCAL_WIRE_ENV};
pub use share::claim::{claim_scans, PortClaim, CLAIMS_FRESH};
pub use share::{RuntimeDirChoice, RUNDIR_ENV};
pub(crate) use sys::netdev_mtu;
#[cfg(feature = "fuzzing")]
pub(crate) use udp::gro_receive as fuzz_gro_receive;
pub use udp::UdpWire;
pub use udp::{UdpConfig, ROCE_PORT};

use crate::Result;
pub use rdma_proto::packet::TxPlacement;

/// How a packet arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The local address it was sent to (the destination in its IP header).
    pub local: WireAddr,
    /// The address it came from.
    pub remote: WireAddr,
    /// Index of the interface it arrived on (0 when the wire has no interfaces).
    pub ifindex: u32,
    /// IPv4 TOS or IPv6 traffic class: DSCP and ECN bits.
    pub tclass: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// How the packet carries its data: only the host-local wire delivers packets whose
    /// data stays in the sender's memory ([`TxPlacement::Pull`]).
    pub placement: TxPlacement,
}

/// What a sent datagram carries besides its addresses and bytes.
///
/// ```
/// let m = rdma_soft::io::TxMeta { tclass: 0x48, ..Default::default() };
/// assert_eq!(rdma_soft::io::TxMeta::default().tclass, 0);
/// assert_eq!(m.tclass >> 2, 18); // DSCP AF21
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxMeta {
    /// IPv4 TOS or IPv6 traffic class byte (DSCP and ECN), as Linux rxe sends the address
    /// vector's `grh.traffic_class`. The ICRC masks this byte, so it does not change the seal.
    pub tclass: u8,
    /// How the packet carries its data. Anything but [`TxPlacement::Inline`] goes only
    /// over the host-local wire (a UDP send refuses it).
    pub placement: TxPlacement,
    /// For a datagram handed on over the host-local wire (one the kernel steered to the
    /// wrong process): the netdev it arrived on, which the receiver's CM reads; 0 for
    /// anything sent. The UDP wire ignores it.
    pub ifindex: u32,
}

/// Counters of a wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Datagrams delivered to the transport.
    pub received: u64,
    /// Datagrams the network refused (unreachable, too big); the transport sees them as lost.
    pub send_errors: u64,
    /// The errno of the last refused datagram.
    pub last_send_errno: Option<i32>,
    /// Datagrams dropped on receipt: larger than the receive buffers or from an unusable
    /// address.
    pub malformed: u64,
    /// Datagrams dropped on receipt because they belong to another process sharing the
    /// address (their QPN or comm id names another slot): the kernel's hash fallback or a
    /// group being changed sent them here.
    pub misdelivered: u64,
    /// Of those, the ones handed on to the process whose they are, over the host-local ring
    /// to its wire (a group whose program was stale after a member was killed would
    /// otherwise lose them: a UD datagram for good).
    pub forwarded: u64,
    /// Datagrams dropped on receipt because no IP header makes their ICRC valid, or only one
    /// with an IPv4 Identification their source does not send (`icrc_implausible_id`).
    pub icrc_errors: u64,
    /// Datagrams accepted after recovering their IPv4 Identification (senders that do not
    /// use 0, such as Linux rxe, or GSO segments received apart): their ICRC guards 16 bits
    /// fewer.
    pub icrc_recovered_id: u64,
    /// Of `icrc_errors`: datagrams whose ICRC held only for a recovered IPv4 Identification of
    /// 128 or more, from a source known to send Identification 0 (a corrupted datagram, most
    /// likely; a peer that really changed to non-zero Identifications is trusted again after
    /// at most three of these).
    pub icrc_implausible_id: u64,
    /// Datagrams that arrived coalesced by UDP GRO after the first of their receive, whose
    /// ICRC held for the IPv4 Identification of their place (segment k: k, as a GSO sender
    /// seals it; IPv6: for their headers); the others count in `icrc_recovered_id` or
    /// `icrc_errors`.
    pub gro_coalesced: u64,
    /// System calls that sent datagrams.
    pub send_calls: u64,
    /// Of `sent`: datagrams sent on a socket connected to their peer (`io/peers.rs`: no
    /// route lookup each).
    pub sent_connected: u64,
    /// Sockets connected to a peer open now (one per RC path over UDP, at most
    /// 63 per address).
    pub peer_sockets: u64,
    /// Datagrams sent from the wire's own port instead of their QP's source port: the
    /// port's socket could not be bound (another program holds it) or the address already
    /// has [`ports::SPORT_CAP`] busy source-port sockets.
    pub sport_fallback: u64,
    /// Times the kernel refused a UDP GSO message, after which the socket sent without GSO.
    pub gso_refused: u64,
    /// System calls that returned received datagrams.
    pub recv_calls: u64,
    /// Times a busy poller took the sockets out of the wire's epoll set (`io/udp/park.rs`:
    /// a datagram to a socket in a set costs its sender a wake-up callback).
    pub sockets_parked: u64,
    /// Busy polls that skipped the socket reads: the sockets had been empty for a while
    /// (`io/udp/backoff.rs`; a datagram is still taken within a few polls).
    pub busy_reads_skipped: u64,
    /// Fault injection on sent datagrams.
    pub faults_send: FaultStats,
    /// Fault injection on received datagrams.
    pub faults_recv: FaultStats,
    /// The host-local wire ([`local`]).
    pub local: LocalStats,
}

/// A datagram network for RoCEv2 packets, as the transport sees it.
///
/// A packet is a RoCEv2 packet from its BTH to its ICRC: the last 4 bytes are the ICRC's
/// room, which the wire fills in on send (only it knows the outer headers) and checks on
/// receive (packets with a bad ICRC are counted in [`WireStats::icrc_errors`] and dropped).
///
/// Sending queues a packet; [`DatagramWire::flush`] hands the queue to the network in one batch
/// (the runtime flushes after each burst of transmissions). Receiving drains what has arrived
/// without blocking; a runtime that wants to block waits for [`DatagramWire::wait_fd`] to become
/// readable or for [`DatagramWire::next_deadline`].
///
/// ```
/// use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};
/// let cfg = UdpConfig { port: 47911, faults: None, share: false, ..UdpConfig::default() }; // made-up QPN below: no sharing
/// let mut a = UdpWire::new(cfg.clone()).unwrap();
/// let mut b = UdpWire::new(cfg).unwrap();
/// let (la, lb): (WireAddr, WireAddr) = ("127.0.0.51".parse().unwrap(), "127.0.0.52".parse().unwrap());
/// a.open(la).unwrap();
/// b.open(lb).unwrap();
/// // a packet: BTH (here RC SEND_ONLY to QP 0x11), payload, 4 bytes of room for the ICRC
/// let mut pkt = [0u8; 12 + 8 + 4];
/// pkt[0] = 0x04;
/// pkt[7] = 0x11;
/// pkt[12..20].copy_from_slice(b"payload!");
/// a.send(la, lb, &pkt).unwrap();
/// a.flush().unwrap();
/// let mut got = Vec::new();
/// while got.is_empty() {
///     b.recv(&mut |arr, pkt| got.push((arr.remote, pkt.to_vec()))).unwrap();
/// }
/// assert_eq!(got.len(), 1);
/// assert_eq!(got[0].0, la);
/// assert_eq!(&got[0].1[..20], &pkt[..20]);
/// assert_eq!(b.stats().icrc_errors, 0);
/// ```
pub trait DatagramWire: Send {
    /// Largest packet the wire carries, in bytes.
    fn max_packet(&self) -> usize;

    /// Starts using `local` as a source and destination (for UDP: binds port 4791 on it).
    /// Opening an address that is already open does nothing.
    fn open(&mut self, local: WireAddr) -> Result<()>;

    /// Stops using `local`; returns whether it was open. Queued packets from it are sent first.
    fn close(&mut self, local: WireAddr) -> bool;

    /// Whether `local` is open.
    fn is_open(&self, local: WireAddr) -> bool;

    /// Queues `packet` from `from` (an open address) to `to` with traffic class 0: see
    /// [`DatagramWire::send_with`].
    fn send(&mut self, from: WireAddr, to: WireAddr, packet: &[u8]) -> Result<()> {
        self.send_with(from, to, TxMeta::default(), packet)
    }

    /// Queues `packet` from `from` (an open address) to `to`, to go with `meta` (its IPv4
    /// TOS / IPv6 traffic class). It is sent at the latest by the next
    /// [`DatagramWire::flush`] (earlier when the batch is full). Datagrams of different
    /// traffic classes may share a batch; each keeps its own.
    fn send_with(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        packet: &[u8],
    ) -> Result<()>;

    /// [`DatagramWire::send_with`] from UDP source port `sport` (a QP's flow port, see
    /// [`flow`]; 0: the wire's own port). The default ignores `sport`: wires without ports,
    /// or that send from one, need nothing else. [`UdpWire`] sends from a socket bound to
    /// that port ([`ports`]), falling back to its own port when it cannot have one.
    fn send_from_port(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        _sport: u16,
        meta: TxMeta,
        packet: &[u8],
    ) -> Result<()> {
        self.send_with(from, to, meta, packet)
    }

    /// [`DatagramWire::send_from_port`] of the packet `write` puts straight into the wire's
    /// send batch: it gets room for up to `max` bytes and returns where in it the packet
    /// lies (empty: none, nothing is sent; it may start after room the writer left, as a
    /// transport that gathers the payload first and puts the headers before it does).
    /// [`UdpWire`] writes it in the datagram's slot, one copy less than a packet built
    /// elsewhere; the default builds it in a buffer of its own and sends that.
    fn emit_from_port(
        &mut self,
        from: WireAddr,
        to: WireAddr,
        sport: u16,
        meta: TxMeta,
        max: usize,
        write: &mut dyn FnMut(&mut [u8]) -> std::ops::Range<usize>,
    ) -> Result<()> {
        let mut buf = vec![0u8; max];
        let at = write(&mut buf);
        match buf.get(at) {
            Some(p) if !p.is_empty() => self.send_from_port(from, to, sport, meta, p),
            _ => Err(crate::Error::InvalidArgument("packet does not encode")),
        }
    }

    /// Opens now, in the calling thread's network namespace (as [`DatagramWire::open`]
    /// does), what datagrams from open address `local` with source port `sport` leave from,
    /// so that sending opens nothing. The runtime calls it when a QP's port becomes known
    /// (RTR, QP1 and UD addresses opened). What cannot be opened falls back when sent. The
    /// default does nothing.
    fn prepare_port(&mut self, _local: WireAddr, _sport: u16) {}

    /// [`DatagramWire::prepare_port`] for an RC path to `remote`: may also open a socket
    /// connected to the peer, which its datagrams then leave from. The default prepares
    /// the port only.
    fn prepare_path(&mut self, local: WireAddr, sport: u16, remote: WireAddr) {
        let _ = remote;
        self.prepare_port(local, sport);
    }

    /// Joins multicast group `group` on interface `ifindex` (`IP_ADD_MEMBERSHIP` /
    /// `IPV6_ADD_MEMBERSHIP`: the kernel reports the membership with IGMP / MLD): datagrams
    /// to the group then arrive with [`Arrival::local`] the group. Joining a group twice
    /// does nothing; [`DatagramWire::close`] of the group leaves it. The default refuses.
    fn join_group(&mut self, _group: WireAddr, _ifindex: u32) -> Result<()> {
        Err(crate::Error::InvalidArgument("this wire has no multicast"))
    }

    /// Sends everything queued.
    fn flush(&mut self) -> Result<()>;

    /// Delivers the packets that have arrived (at most one batch per open address) to
    /// `deliver` without blocking; returns how many were delivered.
    fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> Result<usize>;

    /// Whether the last [`DatagramWire::recv`] emptied every receive queue it read (each gave
    /// less than a full batch), so that calling it again at once would most likely find
    /// nothing. The default, `false`, makes callers that stop on it call `recv` again.
    fn recv_drained(&self) -> bool {
        false
    }

    /// The wire's slot among the processes sharing its addresses (claimed on first use), or
    /// `None` when it does not share: every QPN and CM comm id of its device must then
    /// carry it in the top byte (see [`steer`]).
    fn share_slot(&mut self) -> Result<Option<u8>> {
        Ok(None)
    }

    /// The shortest WRITE a QP on this wire's host-local channel pulls ([`UdpConfig::pull_min`]),
    /// `None` when it pulls none (the default).
    fn pull_min(&self) -> Option<u32> {
        None
    }

    /// The shortest buffer registered in place that is moved onto a region file
    /// ([`UdpConfig::in_place_min`]), `None` when none is (the default).
    fn in_place_min(&self) -> Option<u32> {
        None
    }

    /// This wire's host-local identity ([`local`]; set up on first call), or `None` when it
    /// has no host-local wire (turned off, fault injection on, not sharing).
    fn host_local(&mut self) -> Option<HostPeer> {
        None
    }

    /// Opens the host-local channel to `peer` (see [`local`]); an error means the QP must
    /// stay on the network.
    fn host_connect(&mut self, _peer: HostPeer) -> Result<()> {
        Err(crate::Error::InvalidArgument(
            "this wire has no host-local channel",
        ))
    }

    /// Like [`DatagramWire::send_with`], through the host-local channel to `peer` (opened
    /// with [`DatagramWire::host_connect`]), without a packet buffer: `write` is given room
    /// for up to `max` bytes in the channel and returns the length of the packet it wrote
    /// there (0: none, nothing is sent). A full ring or a peer that is gone loses the
    /// packet, as the network would (counted in [`LocalStats`]).
    fn emit_host(
        &mut self,
        _peer: HostPeer,
        _from: WireAddr,
        _to: WireAddr,
        _meta: TxMeta,
        _max: usize,
        _write: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<()> {
        Err(crate::Error::InvalidArgument(
            "this wire has no host-local channel",
        ))
    }

    /// Hands the file of a memory region (`token`, `fd`) to the host-local `peer` unless it
    /// has it, before a pulled WRITE that names the region goes to it. False when it could
    /// not (the WRITE then fails at the peer and comes again with its data).
    fn host_share(
        &mut self,
        _peer: HostPeer,
        _token: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> bool {
        false
    }

    /// Whether the host-local channel to `peer` takes a packet of up to
    /// [`DatagramWire::max_packet`] bytes now. When it does not, the wire makes the
    /// caller's runtime run again once the peer has made room (its fd becomes readable),
    /// and the caller holds its packets back meanwhile instead of losing them.
    fn host_ready(&mut self, _peer: HostPeer) -> bool {
        true
    }

    /// Whether the caller busy-polls (calls [`DatagramWire::recv`] back to back and will
    /// not sleep): a wire may then look at its slower sources less often.
    fn busy_poll(&mut self, _on: bool) {}

    /// Whether received datagrams must carry their IPv4 TOS / IPv6 traffic class and TTL /
    /// hop limit ([`Arrival::tclass`], [`Arrival::hop_limit`]: a UD receive puts them in
    /// its GRH). On by default; off, [`UdpWire`] no longer asks the kernel for them (two
    /// control messages per datagram) and its arrivals say 0 for both. The runtime keeps
    /// it on while a UD QP exists.
    fn set_ip_meta(&mut self, _on: bool) {}

    /// For a busy poller: true when this call would most likely deliver nothing and the
    /// caller may skip its round (the wire knows its sources are quiet: e.g. its
    /// host-local rings are empty, and its sockets are not due for a look). Counts as a
    /// [`DatagramWire::recv`] call. The default, `false`, never skips.
    fn idle_poll(&mut self) -> bool {
        false
    }

    /// The caller is about to sleep on [`DatagramWire::wait_fd`]: a wire whose peers only
    /// signal sleepers asks them to now. True when something is already waiting (call
    /// `recv` instead of sleeping).
    fn arm_wait(&mut self) -> bool {
        false
    }

    /// The next "nobody listens there" notice a receive found (ICMP port unreachable for
    /// a datagram we sent to the wire's port): (our address, the peer's). The default has
    /// none.
    fn take_unreachable(&mut self) -> Option<(WireAddr, WireAddr)> {
        None
    }

    /// An fd that polls readable when [`DatagramWire::recv`] may deliver something.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>>;

    /// When the wire next needs a call to `flush` or `recv` even if nothing arrives (held
    /// packets of the fault injector).
    fn next_deadline(&self) -> Option<Instant>;

    /// The wire's counters.
    fn stats(&self) -> WireStats;
}
