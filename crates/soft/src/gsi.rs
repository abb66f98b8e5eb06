//! The general services interface (GSI, QP1) of a device: the MAD path the connection
//! manager uses.
//!
//! On RoCEv2 a CM MAD travels as a UD SEND_ONLY packet (BTH opcode 0x64, P_Key 0xFFFF,
//! destination QP 1, AckReq set as Linux sets it) with a DETH (Q_Key [`GSI_QKEY`], source
//! QP 1) and a 256-byte MAD, to UDP port 4791 of the peer (Linux answers to 4791 too, whatever
//! the source port was).
//!
//! ## Use
//! 1. [`crate::verbs::Device::gsi_open`] on each local address the connection manager listens or connects
//!    on: it opens UDP 4791 there (shared with the QPs using the same address: the address is
//!    closed when the last GSI user and the last QP let go of it) and starts delivering MADs
//!    addressed to QP1 on it.
//! 2. [`crate::verbs::Device::gsi_send`] sends a MAD and flushes it at once.
//! 3. [`crate::verbs::Device::gsi_recv`] takes the next received MAD. MADs are queued by whoever drives the
//!    device (the process's progress engine, a thread polling CQs, or `gsi_recv` itself,
//!    which drives the device once when its queue is empty), so the connection manager never
//!    misses MADs that another thread received.
//! 4. To block without busy polling: wait until the GSI eventfd ([`crate::verbs::Device::gsi_wait_fds`]
//!    `.event`) is readable, then call `gsi_recv` until it returns `None`. The progress engine
//!    receives MADs on its own, so no other fd or deadline is needed. The fd is
//!    level-triggered and stays readable while MADs are queued, so it suits `poll`, `epoll`
//!    and tokio's `AsyncFd`. [`crate::verbs::Device::gsi_wait`] does this with `poll(2)`.
//!
//! ## What is dropped
//! Packets to QP1 are checked before they are queued; each rejected packet is counted in
//! [`GsiStats`]: not UD SEND_ONLY, a payload other than 256 bytes, a Q_Key other than
//! [`GSI_QKEY`], a P_Key other than the default one (full or limited membership of 0x7FFF),
//! arrival on an address no one opened with `gsi_open`. The receive queue is bounded in total
//! and per remote address ([`GsiLimits`]): a peer flooding MADs fills its share and no more;
//! the excess is dropped and counted ([`GsiStats::queue_full`], [`GsiStats::peer_full`]).
//!
//! ```
//! use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
//! use rdma_soft::verbs::{Device, DeviceConfig};
//! let open = |port| {
//!     let wire = UdpWire::new(UdpConfig { port, ..UdpConfig::default() }).unwrap();
//!     Device::open_with_wire(DeviceConfig::for_netdev("lo").unwrap(), Box::new(wire)).unwrap()
//! };
//! let (a, b) = (open(47931), open(47931));
//! let (la, lb): (WireAddr, WireAddr) = ("127.0.0.61".parse().unwrap(), "127.0.0.62".parse().unwrap());
//! a.gsi_open(la).unwrap();
//! b.gsi_open(lb).unwrap();
//! let mut mad = [0u8; 256];
//! mad[..4].copy_from_slice(&[1, 7, 2, 3]); // base version, CM class, class version, Send
//! a.gsi_send(&la, &lb, &mad).unwrap();
//! let got = loop {
//!     if let Some(m) = b.gsi_recv().unwrap() {
//!         break m;
//!     }
//!     b.gsi_wait(Some(std::time::Duration::from_millis(100))).unwrap();
//! };
//! assert_eq!((got.local, got.remote, got.src_qp, got.pkey), (lb, la, 1, 0xFFFF));
//! assert_eq!(got.mad, mad);
//! ```

use std::collections::VecDeque;
use std::os::fd::RawFd;

use rdma_proto::packet::{header, Packet};
use rdma_proto::psn::{psn_add, PSN_MASK};
use rdma_wire::deth::DethRepr;
use rdma_wire::opcode::Opcode;
use rdma_wire::packet::PacketRepr;

use crate::io::{Arrival, WireAddr};
use crate::{Error, Result};

/// The GSI's queue pair number.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of the GSI (IBA 13.4.7.1): every MAD to QP1 carries it in its DETH.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Bytes of a MAD.
pub const MAD_LEN: usize = 256;
/// The default P_Key (full membership of the default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// A MAD received on QP1.
#[derive(Clone, PartialEq, Eq)]
pub struct GsiMad {
    /// The local address it arrived on (its destination IP).
    pub local: WireAddr,
    /// The address it came from (its source IP): where the answer goes (to UDP 4791).
    pub remote: WireAddr,
    /// The interface it arrived on (0 when unknown).
    pub ifindex: u32,
    /// The source QP of its DETH (1 for Linux's CM).
    pub src_qp: u32,
    /// The P_Key of its BTH.
    pub pkey: u16,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

impl std::fmt::Debug for GsiMad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsiMad")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("ifindex", &self.ifindex)
            .field("src_qp", &self.src_qp)
            .field("pkey", &format_args!("{:#06x}", self.pkey))
            .field("mad_header", &&self.mad[..24])
            .finish()
    }
}

/// Bounds of a device's GSI receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsiLimits {
    /// MADs queued at most (default 256).
    pub queue_len: usize,
    /// MADs from one remote address queued at most (default 64).
    pub per_peer: usize,
}

impl Default for GsiLimits {
    fn default() -> Self {
        GsiLimits {
            queue_len: 256,
            per_peer: 64,
        }
    }
}

/// Counters of a device's GSI.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// MADs sent.
    pub sent: u64,
    /// MADs queued for [`crate::verbs::Device::gsi_recv`].
    pub received: u64,
    /// Packets to QP1 dropped: not UD SEND_ONLY (or inconsistent headers).
    pub bad_opcode: u64,
    /// Packets to QP1 dropped: payload not [`MAD_LEN`] bytes.
    pub bad_length: u64,
    /// Packets to QP1 dropped: Q_Key not [`GSI_QKEY`].
    pub bad_qkey: u64,
    /// Packets to QP1 dropped: P_Key not the default partition.
    pub bad_pkey: u64,
    /// Packets to QP1 dropped: arrived on an address without [`crate::verbs::Device::gsi_open`].
    pub not_open: u64,
    /// MADs dropped because the queue held [`GsiLimits::queue_len`] MADs.
    pub queue_full: u64,
    /// MADs dropped because the queue held [`GsiLimits::per_peer`] MADs from that remote.
    pub peer_full: u64,
}

/// The fds to wait on for GSI traffic (see the [module docs](crate::gsi)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsiWaitFds {
    /// Readable when datagrams arrived that no one has processed yet (`None` for a wire
    /// without fd: then drive the device periodically).
    pub wire: Option<RawFd>,
    /// The GSI eventfd: readable while MADs are queued.
    pub event: RawFd,
}

/// The GSI's state, inside the runtime (under the device's lock).
pub(crate) struct Gsi {
    opens: Vec<(WireAddr, u32)>,
    queue: VecDeque<GsiMad>,
    limits: GsiLimits,
    psn: u32,
    event: crate::fd::EventFd,
    signaled: bool,
    stats: GsiStats,
    /// Peers no one listens at any more ([`Device::gsi_unreachable`]), at most
    /// [`UNREACHABLE_KEPT`].
    unreachable: VecDeque<(WireAddr, WireAddr)>,
}

/// Unreachable notices kept for the GSI's user, at most (older ones are dropped).
const UNREACHABLE_KEPT: usize = 64;

impl Gsi {
    pub fn new() -> Result<Gsi> {
        let event = crate::fd::EventFd::new().map_err(|source| Error::Os {
            op: "eventfd",
            addr: None,
            source,
        })?;
        let limits = GsiLimits::default();
        Ok(Gsi {
            opens: Vec::new(),
            queue: VecDeque::with_capacity(limits.queue_len),
            limits,
            psn: 0,
            event,
            signaled: false,
            stats: GsiStats::default(),
            unreachable: VecDeque::new(),
        })
    }

    pub fn event_fd(&self) -> RawFd {
        self.event.raw()
    }

    pub fn stats(&self) -> GsiStats {
        self.stats
    }

    pub fn set_limits(&mut self, limits: GsiLimits) {
        self.limits = limits;
        self.queue
            .reserve(limits.queue_len.saturating_sub(self.queue.len()));
    }

    pub fn is_open(&self, local: WireAddr) -> bool {
        self.opens.iter().any(|&(a, _)| a == local)
    }

    /// Counts one more user of `local`.
    pub fn add_open(&mut self, local: WireAddr) {
        match self.opens.iter_mut().find(|(a, _)| *a == local) {
            Some((_, n)) => *n += 1,
            None => self.opens.push((local, 1)),
        }
    }

    /// Counts one user of `local` less; returns whether it was open.
    pub fn remove_open(&mut self, local: WireAddr) -> bool {
        let Some(i) = self.opens.iter().position(|&(a, _)| a == local) else {
            return false;
        };
        self.opens[i].1 -= 1;
        if self.opens[i].1 == 0 {
            self.opens.swap_remove(i);
        }
        true
    }

    /// The header of the next MAD sent.
    pub fn next_header(&mut self) -> PacketRepr {
        let mut h = header(Opcode::UdSendOnly, GSI_QPN, self.psn);
        self.psn = psn_add(self.psn, 1) & PSN_MASK;
        // Linux (rxe) sets AckReq on every MAD (captures: cm-consumer-reject, cm-req-dup)
        h.bth.ack_req = true;
        h.bth.p_key = DEFAULT_PKEY;
        h.deth = Some(DethRepr {
            q_key: GSI_QKEY,
            resv8: 0,
            src_qp: GSI_QPN,
        });
        h
    }

    pub fn on_sent(&mut self) {
        self.stats.sent += 1;
    }

    /// Checks a packet addressed to QP1 and queues its MAD.
    pub fn deliver(&mut self, arr: &Arrival, pkt: &Packet<'_>) {
        let h = &pkt.header;
        let s = &mut self.stats;
        let Some(deth) = h.deth.filter(|_| h.bth.opcode == Opcode::UdSendOnly) else {
            s.bad_opcode += 1;
            return;
        };
        if h.check_headers().is_err() {
            s.bad_opcode += 1;
            return;
        }
        let Ok(mad) = <[u8; MAD_LEN]>::try_from(pkt.payload) else {
            s.bad_length += 1;
            return;
        };
        if deth.q_key != GSI_QKEY {
            s.bad_qkey += 1;
            return;
        }
        if h.bth.p_key & 0x7FFF != DEFAULT_PKEY & 0x7FFF {
            s.bad_pkey += 1;
            return;
        }
        if !self.opens.iter().any(|&(a, _)| a == arr.local) {
            s.not_open += 1;
            return;
        }
        if self.queue.len() >= self.limits.queue_len {
            s.queue_full += 1;
            return;
        }
        let from_peer = self.queue.iter().filter(|m| m.remote == arr.remote).count();
        if from_peer >= self.limits.per_peer {
            s.peer_full += 1;
            return;
        }
        self.queue.push_back(GsiMad {
            local: arr.local,
            remote: arr.remote,
            ifindex: arr.ifindex,
            src_qp: deth.src_qp,
            pkey: h.bth.p_key,
            mad,
        });
        s.received += 1;
        if !self.signaled {
            self.signaled = true;
            self.event.signal();
        }
    }

    /// Notes that no one listens at `remote` any more (we sent there from `local`).
    pub fn unreachable(&mut self, local: WireAddr, remote: WireAddr) {
        if !self.is_open(local) || self.unreachable.contains(&(local, remote)) {
            return;
        }
        if self.unreachable.len() >= UNREACHABLE_KEPT {
            self.unreachable.pop_front();
        }
        self.unreachable.push_back((local, remote));
        if !self.signaled {
            self.signaled = true;
            self.event.signal();
        }
    }

    /// Takes the next unreachable notice (see [`Gsi::pop`] for the eventfd).
    pub fn pop_unreachable(&mut self) -> Option<(WireAddr, WireAddr)> {
        let n = self.unreachable.pop_front();
        self.clear_if_empty();
        n
    }

    fn clear_if_empty(&mut self) {
        if self.is_empty() && self.signaled {
            self.signaled = false;
            self.event.clear();
        }
    }

    /// Takes the next MAD; resets the eventfd when the queue becomes empty.
    pub fn pop(&mut self) -> Option<GsiMad> {
        let m = self.queue.pop_front();
        if self.is_empty() && self.signaled {
            self.signaled = false;
            self.event.clear();
        }
        m
    }

    /// No MAD and no unreachable notice queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.unreachable.is_empty()
    }
}
