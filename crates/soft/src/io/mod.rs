//! The datagram I/O layer under the transport.
//!
//! The RC and UD transports see a [`DatagramWire`]: it carries RoCEv2 packets (BTH through
//! ICRC) between local and remote [`WireAddr`]s, in batches, and tells when it has something to
//! receive (an fd to wait on) or to do (a deadline). Nothing above this trait knows it is UDP:
//! [`UdpWire`] implements it today (UDP port 4791, one socket per local address in use); a
//! host-local wire for connections whose route is local implements it next.
//!
//! The fault injector ([`fault`]) sits inside the wire, between the transport and the sockets:
//! see [`FaultSpec`] for `RDMA_SOFT_FAULTS`.
//!
//! ## Measured choices
//! - Batches: `sendmmsg`/`recvmmsg` of up to [`UdpConfig::batch`] datagrams (default 32) into
//!   preallocated buffers; no allocation or lock per packet.
//! - UDP GSO/GRO (`UDP_SEGMENT`/`UDP_GRO`) is not used: see `docs` in the crate README for the
//!   measurement (`examples/udp_batch.rs`).

mod addr;
mod batch;
pub mod fault;
mod sys;
mod udp;

use std::os::fd::BorrowedFd;
use std::time::Instant;

pub use addr::{ParseWireAddrError, WireAddr};
pub use fault::{FaultDir, FaultSpec, FaultStats, FAULTS_ENV};
pub use udp::{UdpConfig, UdpWire, ROCE_PORT};

use crate::Result;

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
    /// System calls that sent datagrams.
    pub send_calls: u64,
    /// System calls that returned received datagrams.
    pub recv_calls: u64,
    /// Fault injection on sent datagrams.
    pub faults_send: FaultStats,
    /// Fault injection on received datagrams.
    pub faults_recv: FaultStats,
}

/// A datagram network for RoCEv2 packets, as the transport sees it.
///
/// Sending queues a packet; [`DatagramWire::flush`] hands the queue to the network in one batch
/// (the runtime flushes after each burst of transmissions). Receiving drains what has arrived
/// without blocking; a runtime that wants to block waits for [`DatagramWire::wait_fd`] to become
/// readable or for [`DatagramWire::next_deadline`].
///
/// ```
/// use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};
/// let cfg = UdpConfig { port: 47911, faults: None, ..UdpConfig::default() };
/// let mut a = UdpWire::new(cfg.clone()).unwrap();
/// let mut b = UdpWire::new(cfg).unwrap();
/// let (la, lb): (WireAddr, WireAddr) = ("127.0.0.51".parse().unwrap(), "127.0.0.52".parse().unwrap());
/// a.open(la).unwrap();
/// b.open(lb).unwrap();
/// a.send(la, lb, b"a RoCEv2 packet").unwrap();
/// a.flush().unwrap();
/// let mut got = Vec::new();
/// while got.is_empty() {
///     b.recv(&mut |arr, pkt| got.push((arr.remote, pkt.to_vec()))).unwrap();
/// }
/// assert_eq!(got, vec![(la, b"a RoCEv2 packet".to_vec())]);
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

    /// Queues `packet` from `from` (an open address) to `to`. It is sent at the latest by the
    /// next [`DatagramWire::flush`] (earlier when the batch is full).
    fn send(&mut self, from: WireAddr, to: WireAddr, packet: &[u8]) -> Result<()>;

    /// Sends everything queued.
    fn flush(&mut self) -> Result<()>;

    /// Delivers the packets that have arrived (at most one batch per open address) to
    /// `deliver` without blocking; returns how many were delivered.
    fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> Result<usize>;

    /// An fd that polls readable when [`DatagramWire::recv`] may deliver something.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>>;

    /// When the wire next needs a call to `flush` or `recv` even if nothing arrives (held
    /// packets of the fault injector).
    fn next_deadline(&self) -> Option<Instant>;

    /// The wire's counters.
    fn stats(&self) -> WireStats;
}
