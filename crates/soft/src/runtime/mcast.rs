//! UD QPs attached to multicast groups (`ibv_attach_mcast`), and the delivery of a group's
//! datagrams to each of them.
//!
//! The wire joins a group when its first QP attaches and leaves it when the last detaches
//! (or is destroyed). A datagram to a group (BTH DQPN 0xFFFFFF) is handed to every QP
//! attached to the group it was sent to, one copy each; the QP checks it as any UD receive
//! (state, opcode, P_Key, DETH Q_Key against its own). A QP that blocks its own loopback
//! (`IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`) skips datagrams whose source QPN is its own and
//! whose source address is one it receives on.

use std::net::IpAddr;

use rdma_proto::memory::MemoryTable;
use rdma_proto::packet::Packet;

use super::ud::{drain, grh_of, UdState};
use super::{Runtime, RuntimeStats};
use crate::io::{Arrival, WireAddr};
use crate::{Error, Result};

/// One joined group: its address and the QPs attached to it.
struct Group {
    addr: IpAddr,
    qpns: Vec<u32>,
}

/// The device's multicast groups and the QPs that block their own loopback.
#[derive(Default)]
pub(crate) struct McastTable {
    groups: Vec<Group>,
    blocked: Vec<u32>,
}

impl UdState {
    /// Hands a datagram to a multicast group's QPs (`arr.local` is the group): returns
    /// whether the group is one of ours.
    pub fn deliver_mcast<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        arr: &Arrival,
        pkt: &Packet<'_>,
        stats: &mut RuntimeStats,
    ) -> bool {
        let Some(g) = self
            .mcast
            .groups
            .iter()
            .position(|g| g.addr == arr.local.ip())
        else {
            return false;
        };
        let src_qp = pkt.header.deth.map(|d| d.src_qp);
        let grh = grh_of(arr);
        for k in 0..self.mcast.groups[g].qpns.len() {
            let qpn = self.mcast.groups[g].qpns[k];
            let blocked = src_qp == Some(qpn) && self.mcast.blocked.contains(&qpn);
            let Some(ctx) = self.get(qpn) else { continue };
            if blocked && ctx.listening.iter().any(|a| a.ip() == arr.remote.ip()) {
                stats.mcast_loopback_blocked += 1;
                continue;
            }
            ctx.ud.handle_packet(now, mem, pkt, &grh);
            stats.delivered += 1;
            drain(ctx, stats);
        }
        true
    }
}

impl Runtime {
    /// Attaches UD QP `qpn` to `group`, joining it on interface `ifindex` if no QP of the
    /// device has. Attaching twice does nothing (as rxe).
    pub fn mcast_attach(&mut self, qpn: u32, group: WireAddr, ifindex: u32) -> Result<()> {
        if !group.ip().is_multicast() {
            return Err(Error::InvalidArgument("not a multicast GID"));
        }
        if self.ud_get(qpn).is_none() {
            return Err(Error::InvalidArgument("QP destroyed or not UD"));
        }
        let t = &mut self.ud.mcast;
        if let Some(g) = t.groups.iter_mut().find(|g| g.addr == group.ip()) {
            if !g.qpns.contains(&qpn) {
                g.qpns.push(qpn);
            }
            return Ok(());
        }
        self.wire.join_group(group, ifindex)?;
        // a UD receive's GRH carries the traffic class and hop limit
        self.wire.set_ip_meta(true);
        self.ud.mcast.groups.push(Group {
            addr: group.ip(),
            qpns: vec![qpn],
        });
        Ok(())
    }

    /// Detaches `qpn` from `group`, leaving the group when it was the last QP. `EINVAL` when
    /// it is not attached (as rxe).
    pub fn mcast_detach(&mut self, qpn: u32, group: WireAddr) -> Result<()> {
        let t = &mut self.ud.mcast;
        let Some(i) = t.groups.iter().position(|g| g.addr == group.ip()) else {
            return Err(Error::InvalidArgument("QP not attached to this group"));
        };
        let Some(k) = t.groups[i].qpns.iter().position(|&q| q == qpn) else {
            return Err(Error::InvalidArgument("QP not attached to this group"));
        };
        t.groups[i].qpns.swap_remove(k);
        if t.groups[i].qpns.is_empty() {
            t.groups.swap_remove(i);
            self.wire.close(group);
        }
        Ok(())
    }

    /// Detaches a destroyed QP from every group.
    pub fn mcast_forget(&mut self, qpn: u32) {
        self.ud.mcast.blocked.retain(|&q| q != qpn);
        let groups: Vec<IpAddr> = self
            .ud
            .mcast
            .groups
            .iter()
            .filter(|g| g.qpns.contains(&qpn))
            .map(|g| g.addr)
            .collect();
        for g in groups {
            let _ = self.mcast_detach(qpn, WireAddr::new(g, 0));
        }
    }

    /// Whether `qpn` skips its own multicast datagrams looped back to it.
    pub fn mcast_block_loopback(&mut self, qpn: u32, on: bool) {
        let b = &mut self.ud.mcast.blocked;
        b.retain(|&q| q != qpn);
        if on {
            b.push(qpn);
        }
    }

    /// The groups `qpn` is attached to.
    pub fn mcast_groups_of(&self, qpn: u32) -> Vec<IpAddr> {
        self.ud
            .mcast
            .groups
            .iter()
            .filter(|g| g.qpns.contains(&qpn))
            .map(|g| g.addr)
            .collect()
    }
}
