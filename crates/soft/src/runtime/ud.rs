//! The runtime's UD queue pairs and address handles.
//!
//! UD QPs share the QP number space (and slot allocation) with RC QPs but live in their own
//! slot table. A UD QP in RTR or later receives on every local address of the device's GID
//! table (it holds them open); an address handle holds its source address open. Sending runs
//! in the posting thread: `post_send` hands every queued datagram to the wire and flushes.

use std::net::IpAddr;

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::Packet;
use rdma_proto::ud::{GrhInfo, UdQp};

use super::{Runtime, RuntimeStats};
use crate::io::{Arrival, TxMeta, WireAddr};
use crate::queues::CompletionQueue;
use crate::{Error, Result};

/// The runtime's state of one UD QP.
pub(crate) struct UdCtx {
    pub qpn: u32,
    pub ud: UdQp,
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    /// The addresses it listens on (set when it enters RTR).
    pub listening: Vec<WireAddr>,
    /// The GID index it receives on from RTR (`QueuePair::set_ud_source`); `None`: every
    /// usable address of the GID table.
    pub source: Option<u8>,
    /// The UDP source port of its datagrams (rxe's per-QPN port; UD QPs keep it).
    pub sport: u16,
    /// The device port it is on (set at Reset -> Init; its GID table is the one it
    /// receives on).
    pub port: u8,
}

/// An address handle: source and destination of datagrams, and their traffic class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AhEntry {
    pub local: WireAddr,
    pub remote: WireAddr,
    /// `grh.traffic_class` of the handle: the IPv4 TOS / IPv6 traffic class sent.
    pub tclass: u8,
}

/// UD QPs, address handles and the address users other than RC paths and the GSI.
#[derive(Default)]
pub(crate) struct UdState {
    slots: Vec<Option<Box<UdCtx>>>,
    live: Vec<u16>,
    ahs: Vec<Option<AhEntry>>,
    ah_gen: Vec<u16>,
    ah_free: Vec<u32>,
    /// Reference counts of local addresses held by UD QPs and address handles.
    users: Vec<(WireAddr, u32)>,
    /// Multicast groups and their QPs (`runtime/mcast.rs`).
    pub(super) mcast: super::mcast::McastTable,
}

impl UdState {
    pub fn uses(&self, local: WireAddr) -> bool {
        self.users.iter().any(|&(a, _)| a == local)
    }

    fn add_user(&mut self, local: WireAddr) {
        match self.users.iter_mut().find(|(a, _)| *a == local) {
            Some((_, n)) => *n += 1,
            None => self.users.push((local, 1)),
        }
    }

    /// One user less; returns whether the address has none left.
    fn remove_user(&mut self, local: WireAddr) -> bool {
        let Some(i) = self.users.iter().position(|&(a, _)| a == local) else {
            return false;
        };
        self.users[i].1 -= 1;
        if self.users[i].1 == 0 {
            self.users.swap_remove(i);
            return true;
        }
        false
    }

    pub(super) fn get(&mut self, qpn: u32) -> Option<&mut UdCtx> {
        self.slots
            .get_mut((qpn & 0xFFFF) as usize)?
            .as_deref_mut()
            .filter(|c| c.qpn == qpn)
    }

    /// Looks up an address handle by id (index in the low 16 bits, generation above).
    pub fn ah(&self, id: u32) -> Option<AhEntry> {
        let idx = (id & 0xFFFF) as usize;
        let gen = (id >> 16) as u16;
        if self.ah_gen.get(idx) != Some(&gen) {
            return None;
        }
        *self.ahs.get(idx)?
    }

    /// Hands a UD packet to its QP (if `qpn` is one): returns whether it was.
    pub fn deliver<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        arr: &Arrival,
        pkt: &Packet<'_>,
        stats: &mut RuntimeStats,
    ) -> bool {
        let qpn = pkt.header.bth.dest_qp;
        if qpn == rdma_proto::ud::MULTICAST_QPN && arr.local.ip().is_multicast() {
            return self.deliver_mcast(now, mem, arr, pkt, stats);
        }
        let Some(ctx) = self.get(qpn) else {
            return false;
        };
        if !ctx.listening.contains(&arr.local) {
            stats.wrong_path += 1;
            return true;
        }
        ctx.ud.handle_packet(now, mem, pkt, &grh_of(arr));
        stats.delivered += 1;
        drain(ctx, stats);
        true
    }
}

/// The GRH a receive starts with, from how the datagram arrived (flow label 0: the socket
/// does not report it).
pub(crate) fn grh_of(arr: &Arrival) -> GrhInfo {
    match (arr.remote.ip(), arr.local.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => GrhInfo::V4 {
            src: s.octets(),
            dst: d.octets(),
            tos: arr.tclass,
            ttl: arr.hop_limit,
        },
        _ => GrhInfo::V6 {
            src: arr.remote.gid(),
            dst: arr.local.gid(),
            traffic_class: arr.tclass,
            flow_label: 0,
            hop_limit: arr.hop_limit,
        },
    }
}

pub(super) fn drain(ctx: &mut UdCtx, stats: &mut RuntimeStats) {
    while let Some(c) = ctx.ud.poll_send_completion() {
        if ctx.send_cq.push(c).is_err() {
            stats.cq_overflows += 1;
        }
    }
    while let Some(c) = ctx.ud.poll_recv_completion() {
        if ctx.recv_cq.push(c).is_err() {
            stats.cq_overflows += 1;
        }
    }
}

impl Runtime {
    /// The live UD QPs, for inspection.
    pub(super) fn ud_qps(&self) -> impl Iterator<Item = &UdCtx> + '_ {
        let live = self.ud.live.iter();
        live.filter_map(|&i| self.ud.slots.get(i as usize)?.as_deref())
    }

    /// Inserts a UD QP (its QPN from [`Runtime::alloc_qpn`]).
    pub(super) fn ud_insert(&mut self, ctx: UdCtx) {
        let idx = (ctx.qpn & 0xFFFF) as usize;
        let s = &mut self.ud.slots;
        if s.len() <= idx {
            s.resize_with(idx + 1, || None);
        }
        s[idx] = Some(Box::new(ctx));
        self.ud.live.push(idx as u16);
        // a UD receive's GRH carries the traffic class and hop limit
        self.wire.set_ip_meta(true);
    }

    /// Removes a UD QP: releases its slot and the addresses it listened on.
    pub fn ud_remove(&mut self, qpn: u32) {
        let idx = (qpn & 0xFFFF) as usize;
        let Some(ctx) = self
            .ud
            .slots
            .get_mut(idx)
            .and_then(|s| s.take_if(|c| c.qpn == qpn))
        else {
            return;
        };
        self.ud.live.retain(|&i| i as usize != idx);
        self.mcast_forget(qpn);
        if self.ud.live.is_empty() {
            self.wire.set_ip_meta(false);
        }
        self.free.push(idx as u16);
        self.ud_unlisten_addrs(ctx.listening);
    }

    fn ud_unlisten_addrs(&mut self, addrs: Vec<WireAddr>) {
        for a in addrs {
            if self.ud.remove_user(a) {
                self.close_if_unused(a);
            }
        }
    }

    pub(super) fn ud_get(&mut self, qpn: u32) -> Option<&mut UdCtx> {
        self.ud.get(qpn)
    }

    /// Makes a UD QP receive on `addrs` (opening them), or stop (`addrs` empty).
    pub fn ud_listen(&mut self, qpn: u32, addrs: &[WireAddr]) -> Result<()> {
        let had = match self.ud.get(qpn) {
            Some(c) => !c.listening.is_empty(),
            None => return Err(Error::InvalidArgument("QP destroyed")),
        };
        if addrs.is_empty() {
            let old = self
                .ud
                .get(qpn)
                .map(|c| std::mem::take(&mut c.listening))
                .unwrap_or_default();
            self.ud_unlisten_addrs(old);
            return Ok(());
        }
        if had {
            return Ok(());
        }
        // With one address (its source), that one must open. With the whole GID table (no
        // source chosen), addresses that cannot be opened are skipped: a tentative IPv6
        // address (EADDRNOTAVAIL) or one another process holds (EADDRINUSE); it fails only
        // if none opens.
        let strict = addrs.len() == 1;
        let mut opened = Vec::with_capacity(addrs.len());
        let mut first_err = None;
        for &a in addrs {
            match self.wire.open(a) {
                Ok(()) => {
                    self.ud.add_user(a);
                    opened.push(a);
                }
                Err(e @ (Error::AddrNotAvailable { .. } | Error::AddrInUse { .. })) if !strict => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        let failed = matches!(first_err, Some(ref e) if !matches!(e, Error::AddrNotAvailable { .. } | Error::AddrInUse { .. }) || strict);
        if opened.is_empty() || failed {
            // undo what this call opened
            for b in opened {
                if self.ud.remove_user(b) {
                    self.close_if_unused(b);
                }
            }
            return Err(first_err.unwrap_or(Error::InvalidArgument("no address to receive on")));
        }
        if let Some(c) = self.ud.get(qpn) {
            let sport = c.sport;
            for &a in &opened {
                self.wire.prepare_port(a, sport);
            }
        }
        if let Some(c) = self.ud.get(qpn) {
            c.listening = opened;
        }
        Ok(())
    }

    /// Creates an address handle from `local` to `remote` sending with traffic class
    /// `tclass`, opening `local`; returns its id.
    pub fn ah_create(&mut self, local: WireAddr, remote: WireAddr, tclass: u8) -> Result<u32> {
        if self.ud.ahs.len() >= 1 << 16 && self.ud.ah_free.is_empty() {
            return Err(Error::Exhausted {
                what: "address handles",
                max: 1 << 16,
            });
        }
        self.wire.open(local)?;
        self.ud.add_user(local);
        let u = &mut self.ud;
        let idx = match u.ah_free.pop() {
            Some(i) => i as usize,
            None => {
                u.ahs.push(None);
                u.ah_gen.push(0);
                u.ahs.len() - 1
            }
        };
        u.ah_gen[idx] = u.ah_gen[idx].wrapping_add(1);
        u.ahs[idx] = Some(AhEntry {
            local,
            remote,
            tclass,
        });
        Ok((u32::from(u.ah_gen[idx]) << 16) | idx as u32)
    }

    /// Whether `id` names a live address handle.
    pub fn ah_exists(&self, id: u32) -> bool {
        self.ud.ah(id).is_some()
    }

    /// Destroys an address handle, closing its source address when unused.
    pub fn ah_destroy(&mut self, id: u32) {
        let Some(e) = self.ud.ah(id) else { return };
        let idx = (id & 0xFFFF) as usize;
        self.ud.ahs[idx] = None;
        self.ud.ah_free.push(idx as u32);
        if self.ud.remove_user(e.local) {
            self.close_if_unused(e.local);
        }
    }

    /// Transmits every datagram a UD QP has queued and moves its completions; flushes.
    pub fn ud_service<M: MemoryTable + ?Sized>(&mut self, qpn: u32, mem: &mut M) -> Result<()> {
        let now = self.now();
        let Runtime {
            wire,
            ud,
            tx,
            stats,
            ..
        } = self;
        let idx = (qpn & 0xFFFF) as usize;
        let Some(ctx) = ud
            .slots
            .get_mut(idx)
            .and_then(|s| s.as_deref_mut())
            .filter(|c| c.qpn == qpn)
        else {
            return Ok(());
        };
        let ahs = (&ud.ahs, &ud.ah_gen);
        while let Some(t) = ctx.ud.poll_transmit(now, mem, &mut tx.payload) {
            let ah_idx = (t.ah & 0xFFFF) as usize;
            let entry = ahs
                .1
                .get(ah_idx)
                .filter(|&&g| u32::from(g) == t.ah >> 16)
                .and_then(|_| ahs.0.get(ah_idx).copied().flatten());
            let Some(AhEntry {
                local,
                remote,
                tclass,
            }) = entry
            else {
                stats.send_errors += 1;
                continue;
            };
            let payload = tx.payload.get(..t.payload_len).unwrap_or(&[]);
            match rdma_proto::wire::emit(&t.header, payload, &mut tx.packet, None) {
                Ok(n) => match wire.send_from_port(
                    local,
                    remote,
                    ctx.sport,
                    TxMeta {
                        tclass,
                        ..Default::default()
                    },
                    &tx.packet[..n],
                ) {
                    Ok(()) => stats.transmitted += 1,
                    Err(_) => stats.send_errors += 1,
                },
                Err(_) => stats.send_errors += 1,
            }
        }
        drain(ctx, stats);
        wire.flush()
    }
}
