//! The host-local wire: RC packets between two of our processes on one host (and one
//! network namespace) through shared memory instead of UDP.
//!
//! Each sharing wire that has it holds a **bell**, a Unix datagram socket
//! `bell-SLOT-NONCE` in the per-user [runtime directory](super::share::runtime_dir), and
//! announces `(slot, netns, nonce)` as [`HostPeer::guid`], which the CM sends as its CA GUID
//! (a Linux peer just records it). A QP whose CM found the peer's GUID to be ours, for a
//! connection whose route is local, is told to use it ([`crate::verbs::QueuePair::use_host_local`]);
//! the wire then makes one ring per peer wire (a memfd, `ring.rs`), hands it to the peer's
//! bell with `SCM_RIGHTS` and from then on writes that QP's packets into it. Everything
//! else (QP1, UD, other QPs) stays on UDP, and so do the RC rules: the packets are the
//! same RoCEv2 packets, without the ICRC (memory does not flip bits).
//!
//! A receiver busy-polling its CQ reads the rings without a system call; one about to sleep
//! sets each ring's `waiting` word, and a producer that finds it set wakes it once: a
//! `write` to the eventfd the receiver made for that ring (edge-triggered in its epoll
//! set, never read; handed over the producer's bell as `MSG_EFD`), or a datagram to its
//! bell before that and at least once per millisecond. A peer that died leaves a ring
//! nobody reads: its bell refuses, the ring is marked dead, and the QP's packets are lost
//! as on a dead link (RC retries, then the QP fails), never handed to another process (a
//! ring belongs to one incarnation of a wire: the nonce).

mod bell;
#[cfg(feature = "fuzzing")]
mod fuzz;
mod regions;
mod ring;

use std::os::fd::{AsFd, OwnedFd, RawFd};

use crate::fd::EventFd;
use std::path::PathBuf;

use bell::Bell;
#[cfg(feature = "fuzzing")]
pub(crate) use fuzz::drain_bell as fuzz_drain_bell;
#[cfg(feature = "fuzzing")]
pub(crate) use regions::fuzz_rewrite as fuzz_pull_rewrite;
use regions::Regions;
#[cfg(feature = "fuzzing")]
pub(crate) use ring::fuzz_consume as fuzz_ring_consume;
use ring::{Malformed, RecordMeta, Ring};

use super::{Arrival, TxMeta, TxPlacement, WireAddr};

/// Environment variable: `off` turns the host-local wire off (every QP on UDP); read by
/// [`crate::SoftConfig::from_env`].
pub const LOCAL_WIRE_ENV: &str = "RDMA_SOFT_LOCAL_WIRE";
/// Environment variable: each ring's size in bytes (a power of two, 64 KiB to 1 GiB;
/// default 1 MiB). A ring is per pair of wires and direction.
pub const LOCAL_RING_ENV: &str = "RDMA_SOFT_LOCAL_RING";
/// Default ring size.
pub const DEFAULT_RING: usize = 1 << 20;
/// "RL" in the top 16 bits of a host-local CA GUID.
const GUID_MAGIC: u64 = 0x524C;
/// Inbound rings at most (one per peer wire; 255 slots).
const MAX_INBOUND: usize = 256;
/// Packets taken from one ring per receive call at most.
const RING_BATCH: usize = 64;

/// Bell message: a new ring (with its memfd) from `[1]` slot, `[2]` netns, `[4..8]` nonce.
const MSG_RING: u8 = b'R';
/// Bell message: a memory region's file (`crate::pull`) from `[1]` slot, `[2]` netns,
/// `[4..8]` nonce, with its token in `[8..16]`.
const MSG_MR: u8 = b'M';
/// A pulled message's first record at most (headers and a path MTU of description).
const MAX_PULL_RECORD: usize = 4096 + 128;
/// Region tokens remembered as handed to one peer at most, oldest forgotten first: as many as
/// the peer maps from us, in the same order ([`regions::MAX_REGIONS`]), so a region it has
/// let go is handed over again.
const MAX_SHARED: usize = regions::MAX_REGIONS;
/// Bell message: records are waiting.
const MSG_WAKE: u8 = b'W';
/// Bell message, consumer to producer: the eventfd that wakes the consumer of the ring
/// from `[1]` slot, `[2]` netns, `[4..8]` nonce (the consumer's), passed with it.
const MSG_EFD: u8 = b'E';
/// The epoll token bit of a ring's wake-up eventfd in the wire's epoll set.
pub(crate) const EFD_TOKEN: u64 = 1 << 62;
/// Producers are looked at for being gone at most this often (when the bell is read).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// A producer with the consumer's eventfd still rings the bell when it last did longer
/// ago than this: a send to a dead process's bell fails, which marks the ring dead.
const BELL_PROBE: std::time::Duration = std::time::Duration::from_millis(1);

/// One wire of one process, as its host-local peers name it.
///
/// ```
/// use rdma_soft::io::HostPeer;
/// let p = HostPeer { slot: 7, ns: 0x3c, nonce: 0xdead_beef };
/// assert_eq!(p.guid(), 0x524c_073c_dead_beef);
/// assert_eq!(HostPeer::from_guid(p.guid()), Some(p));
/// assert_eq!(HostPeer::from_guid(0x5254_00ff_fe12_3456), None); // a MAC-derived GUID
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostPeer {
    /// Its sharing slot (the top byte of its QPNs).
    pub slot: u8,
    /// A hash of its network namespace.
    pub ns: u8,
    /// Random per wire incarnation: a slot reused after a crash names a new wire.
    pub nonce: u32,
}

impl HostPeer {
    /// A bell message of `kind` from this wire: `[1]` slot, `[2]` netns, `[4..8]` nonce.
    fn bell_msg(&self, kind: u8) -> [u8; 8] {
        let mut msg = [kind, self.slot, self.ns, 0, 0, 0, 0, 0];
        msg[4..8].copy_from_slice(&self.nonce.to_le_bytes());
        msg
    }

    /// The sender named in an 8-byte bell message ([`HostPeer::bell_msg`]).
    fn from_bell_msg(msg: &[u8]) -> HostPeer {
        HostPeer {
            slot: msg[1],
            ns: msg[2],
            nonce: u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]),
        }
    }

    /// The CA GUID that announces it: `0x524C` ("RL"), slot, netns hash, nonce.
    pub fn guid(&self) -> u64 {
        (GUID_MAGIC << 48)
            | (u64::from(self.slot) << 40)
            | (u64::from(self.ns) << 32)
            | u64::from(self.nonce)
    }

    /// The peer a CA GUID announces, if it is a host-local one (slot 0 is none).
    pub fn from_guid(guid: u64) -> Option<HostPeer> {
        let p = HostPeer {
            slot: (guid >> 40) as u8,
            ns: (guid >> 32) as u8,
            nonce: guid as u32,
        };
        (guid >> 48 == GUID_MAGIC && p.slot != 0).then_some(p)
    }

    fn bell_name(&self) -> String {
        format!("{}{:08x}", bell_prefix(self.slot), self.nonce)
    }
}

/// The start of the names of slot `slot`'s bells (`bell-SLOT-NONCE`).
fn bell_prefix(slot: u8) -> String {
    format!("bell-{slot}-")
}

/// Whether `n` is a ring size the host-local wire takes (a power of two, 64 KiB to 1 GiB).
pub(crate) fn valid_ring_size(n: usize) -> bool {
    ring::valid_capacity(n)
}

/// Counters of the host-local wire (part of [`super::WireStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalStats {
    /// Packets written into rings.
    pub sent: u64,
    /// Packets read from rings.
    pub received: u64,
    /// Packets not sent because the ring was full (the transport sees them as lost).
    pub ring_full: u64,
    /// Times a QP's transmission waited for room in its ring (no packet lost).
    pub blocked: u64,
    /// Bells rung for a producer that waited for room.
    pub unblocks: u64,
    /// Packets not sent because the peer wire is gone.
    pub dead: u64,
    /// Wake-ups of a sleeping receiver (eventfd writes and bells).
    pub bells: u64,
    /// Rings dropped because a record broke the layout.
    pub malformed: u64,
    /// Pulled message records dropped because their description broke the format.
    pub malformed_pulls: u64,
    /// Region files handed to peers (pulled messages).
    pub regions_shared: u64,
    /// Pulled WRITEs whose region file had not come yet when their record was read (the
    /// bell was read, then the record again).
    pub pull_deferred: u64,
    /// Rings this wire reads now.
    pub rings_in: u32,
    /// Rings this wire writes now.
    pub rings_out: u32,
}

struct Out {
    peer: HostPeer,
    ring: Ring,
    path: PathBuf,
    /// Connected to the peer's bell ([`Bell::connect`]) at the first wake-up.
    wake: Option<OwnedFd>,
    /// The consumer's eventfd (`MSG_EFD`): a wake-up is one `write`, which the consumer
    /// never has to read (edge-triggered).
    efd: Option<EventFd>,
    /// When the bell was last rung (liveness probe, [`BELL_PROBE`]).
    rung_at: Option<std::time::Instant>,
    /// Published since the last flush.
    dirty: bool,
    /// Its bell refused: the peer wire is gone.
    dead: bool,
    /// Tokens of the regions whose files its bell has (`MSG_MR`).
    shared: Vec<u64>,
}

impl Drop for Out {
    fn drop(&mut self) {
        self.ring.close_producer();
    }
}

struct In {
    from: HostPeer,
    ring: Ring,
    /// The eventfd the producer writes to wake us, in `epoll` (edge-triggered).
    efd: Option<(EventFd, RawFd)>,
    /// The producer's regions mapped here, to pull messages from.
    regions: Regions,
    /// A region token a pulled record named before its file came: the bell was read once
    /// for it.
    deferred: Option<u64>,
    /// Its producer's process is gone ([`HostLocal::sweep_gone`]).
    gone: bool,
}

impl Drop for In {
    fn drop(&mut self) {
        if let Some((fd, epoll)) = &self.efd {
            unregister(*epoll, fd);
        }
    }
}

/// Takes `fd` out of `epoll`: the producer holds the eventfd open too, so our close alone
/// would leave it registered.
fn unregister(epoll: RawFd, fd: &EventFd) {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: a live event struct; failure (epoll gone) is harmless.
    unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd.raw(), &mut ev) };
}

/// A non-blocking eventfd, registered edge-triggered in `epoll` with [`EFD_TOKEN`].
fn wake_efd(epoll: RawFd) -> std::io::Result<EventFd> {
    let fd = EventFd::new()?;
    let raw = fd.raw();
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLET) as u32,
        u64: EFD_TOKEN | raw as u64,
    };
    // SAFETY: both descriptors are open; a live event struct.
    if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, raw, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// The host-local part of a wire (see the module docs).
pub(crate) struct HostLocal {
    me: HostPeer,
    dir: PathBuf,
    bell: Bell,
    capacity: usize,
    inbound: Vec<In>,
    outbound: Vec<Out>,
    stats: LocalStats,
    /// The wire's epoll set, where inbound rings' eventfds go (none: bells only).
    epoll: Option<RawFd>,
    /// A pulled message's first packet, rewritten with its pieces resolved.
    scratch: Vec<u8>,
    /// When producers were last looked at for being gone ([`HostLocal::sweep_gone`]).
    swept_at: Option<std::time::Instant>,
    /// Our effective uid: rings and region files come only from processes of it.
    uid: libc::uid_t,
}

/// What became of a pulled message's record ([`pull_record`]).
enum Pulled {
    /// Rewritten into the scratch buffer: this many bytes.
    Ready(usize),
    /// It names a region whose file has not been read from the bell yet.
    Wait,
    /// Its description breaks the format: dropped (the sender resends it).
    Malformed,
}

/// Rewrites the pulled message `pkt` into `out`, each piece resolved to an address in our
/// mapping of its region in `regions` (`crate::pull`); a piece it cannot resolve becomes
/// address 0, which the responder answers by asking for the WRITE again. `deferred` is the
/// ring's [`In::deferred`].
fn pull_record(
    regions: &mut Regions,
    deferred: &mut Option<u64>,
    pkt: &[u8],
    out: &mut [u8],
) -> Pulled {
    let Ok(p) = rdma_proto::wire::parse(pkt, rdma_wire::packet::IcrcCheck::Skip) else {
        return Pulled::Malformed;
    };
    if crate::pull::pieces(p.payload).is_none() {
        return Pulled::Malformed;
    }
    match regions.missing(p.payload) {
        Some(t) if *deferred != Some(t) => {
            *deferred = Some(t);
            return Pulled::Wait;
        }
        _ => *deferred = None,
    }
    let start = p.header.header_len();
    if out.len() < start {
        return Pulled::Malformed;
    }
    out[..start].copy_from_slice(&pkt[..start]);
    let Some(n) = regions.rewrite(p.payload, &mut out[start..]) else {
        return Pulled::Malformed;
    };
    // no pad (both lengths are multiples of 4), then the 4 ICRC bytes the wire skips
    let end = start + n;
    match out.get_mut(end..end + 4) {
        Some(icrc) => icrc.fill(0),
        None => return Pulled::Malformed,
    }
    Pulled::Ready(end + 4)
}

fn nonce() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a live buffer; on failure the time and pid stand in.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, libc::GRND_NONBLOCK) };
    if n == 4 {
        return u32::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u32);
    t ^ std::process::id().rotate_left(16)
}

impl HostLocal {
    /// The host-local part of the wire holding `slot`, in network namespace `netns`.
    pub fn new(slot: u8, netns: u64, capacity: usize) -> crate::Result<HostLocal> {
        Self::in_dir(super::share::runtime_dir()?, slot, netns, capacity)
    }

    /// [`HostLocal::new`] with its bells in `dir` (the pinned runtime directory's path).
    fn in_dir(dir: PathBuf, slot: u8, netns: u64, capacity: usize) -> crate::Result<HostLocal> {
        let ns = (netns ^ (netns >> 8) ^ (netns >> 16) ^ (netns >> 24)) as u8;
        let me = HostPeer {
            slot,
            ns,
            nonce: nonce(),
        };
        // We hold the slot: any other bell of it is a dead process's.
        let stale = bell_prefix(slot);
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&stale) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let bell = Bell::bind(dir.join(me.bell_name())).map_err(|source| crate::Error::Os {
            op: "bind the host-local bell",
            addr: None,
            source,
        })?;
        Ok(HostLocal {
            me,
            dir,
            bell,
            capacity,
            inbound: Vec::new(),
            outbound: Vec::new(),
            stats: LocalStats::default(),
            epoll: None,
            scratch: vec![0; 2 * MAX_PULL_RECORD],
            swept_at: None,
            // SAFETY: no arguments, cannot fail.
            uid: unsafe { libc::geteuid() },
        })
    }

    /// The wire's epoll set: from now on each inbound ring gets an eventfd there, which
    /// its producer writes to wake us instead of sending the bell a datagram.
    pub fn set_epoll(&mut self, epoll: RawFd) {
        self.epoll = Some(epoll);
    }

    pub fn me(&self) -> HostPeer {
        self.me
    }

    pub fn bell_fd(&self) -> RawFd {
        self.bell.fd()
    }

    pub fn stats(&self) -> LocalStats {
        LocalStats {
            rings_in: self.inbound.len() as u32,
            rings_out: self.outbound.len() as u32,
            ..self.stats
        }
    }

    /// Makes sure a ring to `peer` exists and its bell took it: the error says why the QP
    /// must stay on UDP (the peer is gone, or is not on this host under this user).
    pub fn connect(&mut self, peer: HostPeer) -> std::io::Result<()> {
        if self.outbound.iter().any(|o| o.peer == peer && !o.dead) {
            return Ok(());
        }
        // An earlier incarnation of the slot (or this one, dead) is gone for good.
        self.outbound.retain(|o| o.peer.slot != peer.slot);
        let ring = Ring::create(self.capacity)?;
        let path = self.dir.join(peer.bell_name());
        self.bell
            .send(&path, &self.me.bell_msg(MSG_RING), Some(ring.fd()))?;
        self.outbound.push(Out {
            peer,
            ring,
            path,
            wake: None,
            efd: None,
            rung_at: None,
            dirty: false,
            dead: false,
            shared: Vec::new(),
        });
        Ok(())
    }

    /// Hands `packet` (a verified datagram that arrived as `arrival` says) that reached
    /// this wire but is the wire of `slot`'s (the group's steering program was stale: a
    /// member was killed and the kernel moved another into its place, or a listener is
    /// newer than the program) to that wire over a ring, with its arrival netdev. False
    /// when it could not: no live wire of that slot has a bell here, or the ring is full.
    pub fn forward(&mut self, slot: u8, arrival: &Arrival, packet: &[u8]) -> bool {
        let Some(peer) = self.peer_of_slot(slot) else {
            return false;
        };
        if self.connect(peer).is_err() {
            return false;
        }
        let meta = TxMeta {
            tclass: arrival.tclass,
            ifindex: arrival.ifindex,
            ..TxMeta::default()
        };
        let sent = self.send(peer, arrival.remote, arrival.local, meta, packet);
        if sent {
            self.flush();
        }
        sent
    }

    /// The live wire holding `slot`: the peer of a ring we have to it, else the one whose
    /// bell is in the runtime directory (a slot's owner removes its dead bells).
    fn peer_of_slot(&self, slot: u8) -> Option<HostPeer> {
        if let Some(o) = self
            .outbound
            .iter()
            .find(|o| o.peer.slot == slot && !o.dead)
        {
            return Some(o.peer);
        }
        if slot == self.me.slot {
            return None;
        }
        let prefix = bell_prefix(slot);
        let nonce = std::fs::read_dir(&self.dir).ok()?.find_map(|e| {
            let name = e.ok()?.file_name();
            let hex = name.to_str()?.strip_prefix(&prefix)?.to_owned();
            u32::from_str_radix(&hex, 16).ok()
        })?;
        Some(HostPeer {
            slot,
            ns: self.me.ns,
            nonce,
        })
    }

    /// Hands the file `fd` of region `token` to `peer`'s bell unless it has it: before a
    /// pulled message that names the region goes into the ring. False when it could not.
    pub fn share(&mut self, peer: HostPeer, token: u64, fd: std::os::fd::BorrowedFd<'_>) -> bool {
        let Some(o) = self.outbound.iter_mut().find(|o| o.peer == peer && !o.dead) else {
            return false;
        };
        if o.shared.contains(&token) {
            return true;
        }
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&self.me.bell_msg(MSG_MR));
        msg[8..].copy_from_slice(&token.to_le_bytes());
        if self.bell.send(&o.path, &msg, Some(fd)).is_err() {
            return false;
        }
        if o.shared.len() >= MAX_SHARED {
            o.shared.remove(0);
        }
        o.shared.push(token);
        self.stats.regions_shared += 1;
        true
    }

    /// Writes `packet` (from `from` to `to`) into the ring to `peer`. False when it could
    /// not (no ring, the peer is gone, the ring is full), counted.
    pub fn send(
        &mut self,
        peer: HostPeer,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        packet: &[u8],
    ) -> bool {
        self.emit(peer, from, to, meta, packet.len(), &mut |room| {
            room[..packet.len()].copy_from_slice(packet);
            packet.len()
        })
    }

    /// Lets `write` put a packet of up to `max` bytes straight into the ring to `peer`; it
    /// returns the packet's length (0: none). False when nothing was sent (counted).
    pub fn emit(
        &mut self,
        peer: HostPeer,
        from: WireAddr,
        to: WireAddr,
        meta: TxMeta,
        max: usize,
        write: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> bool {
        let Some(o) = self.outbound.iter_mut().find(|o| o.peer == peer) else {
            self.stats.dead += 1;
            return false;
        };
        if o.dead {
            self.stats.dead += 1;
            return false;
        }
        let Some(room) = o.ring.reserve(max) else {
            self.stats.ring_full += 1;
            return false;
        };
        let n = write(room);
        if n == 0 || n > max {
            return false;
        }
        let rec = RecordMeta {
            from,
            to,
            tclass: meta.tclass,
            placement: meta.placement,
            ifindex: meta.ifindex,
        };
        o.ring.commit(&rec, n);
        o.dirty = true;
        self.stats.sent += 1;
        true
    }

    /// Whether the ring to `peer` has room for a packet of `max` bytes; when not, the
    /// peer rings this wire's bell once it has freed some. True for a peer without a
    /// usable ring (sending then fails, counted, instead of waiting for ever).
    pub fn ready(&mut self, peer: HostPeer, max: usize) -> bool {
        let Some(o) = self.outbound.iter_mut().find(|o| o.peer == peer && !o.dead) else {
            return true;
        };
        if o.ring.has_room(max) || o.ring.block(max) {
            return true;
        }
        self.stats.blocked += 1;
        false
    }

    /// Rings the bell of every peer that published since the last flush and is asleep.
    pub fn flush(&mut self) {
        for o in self.outbound.iter_mut().filter(|o| o.dirty) {
            o.dirty = false;
            if !o.ring.take_waiting() {
                continue;
            }
            self.stats.bells += 1;
            if let Some(efd) = &o.efd {
                let now = std::time::Instant::now();
                if o.rung_at
                    .is_some_and(|t| now.duration_since(t) < BELL_PROBE)
                {
                    efd.signal();
                    continue;
                }
                o.rung_at = Some(now);
            }
            let sent = match &o.wake {
                Some(fd) => Bell::ring(fd.as_fd(), MSG_WAKE),
                None => Bell::connect(&o.path).and_then(|fd| {
                    Bell::ring(fd.as_fd(), MSG_WAKE)?;
                    o.wake = Some(fd);
                    Ok(())
                }),
            };
            match sent {
                Ok(()) => {}
                // its queue is full of wake-ups: it will wake
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(e) => {
                    tracing::debug!(peer = ?o.peer, error = %e, "host-local peer gone");
                    o.dead = true;
                }
            }
        }
    }

    /// Delivers what the rings hold (at most a batch per ring); returns how many, and
    /// whether a ring gave a full batch (more may be waiting).
    pub fn recv(&mut self, deliver: &mut dyn FnMut(&Arrival, &[u8])) -> (usize, bool) {
        let mut n = 0;
        let mut full = false;
        let mut bad = None;
        let mut read_bell = false;
        let scratch = &mut self.scratch;
        for (k, i) in self.inbound.iter_mut().enumerate() {
            let mut taken = 0;
            for _ in 0..RING_BATCH {
                match i.ring.peek() {
                    Ok(Some((m, pkt))) => {
                        let arr = Arrival {
                            local: m.to,
                            remote: m.from,
                            ifindex: m.ifindex,
                            tclass: m.tclass,
                            hop_limit: 64,
                            placement: m.placement,
                        };
                        if m.placement != TxPlacement::Pull {
                            deliver(&arr, pkt);
                        } else {
                            match pull_record(&mut i.regions, &mut i.deferred, pkt, scratch) {
                                Pulled::Ready(len) => deliver(&arr, &scratch[..len]),
                                // read the bell for the region's file, then this again
                                Pulled::Wait => {
                                    self.stats.pull_deferred += 1;
                                    read_bell = true;
                                    break;
                                }
                                Pulled::Malformed => self.stats.malformed_pulls += 1,
                            }
                        }
                        i.ring.advance();
                        taken += 1;
                    }
                    Ok(None) => break,
                    Err(Malformed(why)) => {
                        tracing::warn!(from = ?i.from, why, "malformed host-local ring dropped");
                        bad = Some(k);
                        break;
                    }
                }
            }
            n += taken;
            full |= taken == RING_BATCH;
            if taken > 0 && i.ring.take_blocked() {
                self.stats.unblocks += 1;
                let path = self.dir.join(i.from.bell_name());
                // a producer gone meanwhile has nobody to wake
                let _ = self.bell.send(&path, &[MSG_WAKE], None);
            }
        }
        if let Some(k) = bad {
            self.inbound.swap_remove(k);
            self.stats.malformed += 1;
        }
        self.inbound
            .retain(|i| !(i.ring.producer_closed() || i.gone) || i.ring.pending());
        self.stats.received += n as u64;
        if read_bell {
            self.drain_bell();
            full = true;
        }
        (n, full)
    }

    /// Reads the bell: new rings from peers, wake-ups.
    pub fn drain_bell(&mut self) {
        let mut new = Vec::new();
        let mut efds = Vec::new();
        let uid = self.uid;
        let mut regions = Vec::new();
        self.bell.drain(64, |msg, fd, sender| {
            let (Some(fd), kind) = (fd, msg.first().copied()) else {
                return;
            };
            if kind == Some(MSG_MR) && msg.len() == 16 {
                // a region file, from a process of our own user only
                let token = u64::from_le_bytes(msg[8..16].try_into().unwrap_or_default());
                if sender.is_some_and(|s| s.uid == uid) {
                    regions.push((HostPeer::from_bell_msg(msg), token, fd));
                }
                return;
            }
            if msg.len() != 8 {
                return;
            }
            let from = HostPeer::from_bell_msg(msg);
            match kind.unwrap_or(0) {
                // a ring only from a process of our own user (the bell's directory is
                // private, so this is a second check)
                MSG_RING => match sender {
                    Some(s) if s.uid == uid => new.push((from, fd)),
                    _ => tracing::warn!(?from, ?sender, "host-local ring of another user refused"),
                },
                // a wake-up eventfd: from our own user, and an eventfd (a pipe or a
                // socket could block our writes under the device lock)
                MSG_EFD => match (sender, bell::eventfd(fd)) {
                    (Some(s), Some(efd)) if s.uid == uid => efds.push((from, efd)),
                    _ => tracing::warn!(?from, ?sender, "host-local wake-up fd refused"),
                },
                _ => {}
            }
        });
        for (from, efd) in efds {
            if let Some(o) = self.outbound.iter_mut().find(|o| o.peer == from) {
                o.efd = Some(efd);
            }
        }
        for (from, fd) in new {
            match Ring::attach(fd) {
                Ok(ring) => {
                    // the slot's earlier incarnation (dead) or an older ring of this one
                    self.inbound.retain(|i| i.from.slot != from.slot);
                    if self.inbound.len() < MAX_INBOUND {
                        let efd = self.offer_efd(from);
                        self.inbound.push(In {
                            from,
                            ring,
                            efd,
                            regions: Regions::default(),
                            deferred: None,
                            gone: false,
                        });
                    }
                }
                Err(e) => {
                    self.stats.malformed += 1;
                    tracing::warn!(?from, error = %e, "host-local ring refused");
                }
            }
        }
        // after the rings: a sender shares a region only over a ring it made
        for (from, token, fd) in regions {
            if let Some(i) = self.inbound.iter_mut().find(|i| i.from == from) {
                if !i.regions.insert(token, fd) {
                    self.stats.malformed_pulls += 1;
                }
            }
        }
        self.sweep_gone();
    }

    /// Forgets producers whose process is gone (killed: it closed nothing): their bell
    /// refuses or is removed. Their region files are unmapped at once, their ring once
    /// read. At most once per [`SWEEP_EVERY`].
    fn sweep_gone(&mut self) {
        let now = std::time::Instant::now();
        if self
            .swept_at
            .is_some_and(|t| now.duration_since(t) < SWEEP_EVERY)
        {
            return;
        }
        self.swept_at = Some(now);
        for i in self.inbound.iter_mut().filter(|i| !i.gone) {
            let path = self.dir.join(i.from.bell_name());
            if let Err(e) = Bell::connect(&path) {
                if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) {
                    tracing::debug!(from = ?i.from, "host-local producer gone");
                    i.gone = true;
                    i.regions = Regions::default();
                }
            }
        }
        self.inbound.retain(|i| !i.gone || i.ring.pending());
    }

    /// An eventfd for the ring from `from`, registered in the wire's epoll set and handed
    /// to `from`'s bell (`MSG_EFD`); none without an epoll set or when either step fails
    /// (the producer then keeps ringing the bell).
    fn offer_efd(&self, from: HostPeer) -> Option<(EventFd, RawFd)> {
        let epoll = self.epoll?;
        let fd = wake_efd(epoll).ok()?;
        let msg = self.me.bell_msg(MSG_EFD);
        let path = self.dir.join(from.bell_name());
        match self.bell.send(&path, &msg, Some(fd.as_fd())) {
            Ok(()) => Some((fd, epoll)),
            Err(_) => {
                unregister(epoll, &fd);
                None
            }
        }
    }

    /// Whether a ring holds a record now.
    pub fn pending(&self) -> bool {
        self.inbound.iter().any(|i| i.ring.pending())
    }

    /// About to sleep: asks every producer to ring; true when something is waiting.
    pub fn arm(&mut self) -> bool {
        let mut pending = false;
        for i in &self.inbound {
            pending |= i.ring.arm();
        }
        pending
    }

    /// Whether a ring to `peer` is open and its peer not known to be gone.
    #[cfg(test)]
    pub fn reaches(&self, peer: HostPeer) -> bool {
        self.outbound.iter().any(|o| o.peer == peer && !o.dead)
    }
}

#[cfg(test)]
mod tests;
