//! Multicast joins (`rdma_join_multicast`, `rdma_join_multicast_ex`, `rdma_leave_multicast`)
//! over RoCEv2, as Linux's `cma_iboe_join_multicast` does them.
//!
//! A join needs a UD id (port space UDP) bound to a device (bound to a local address, or
//! after `resolve_addr` to the group). The group's MGID is its address as a GID (IPv4
//! `a.b.c.d`: `::ffff:a.b.c.d`); the id's UD QP (made with [`CmId::create_qp`]) is attached
//! to it ([`rdma_soft::verbs::QueuePair::attach_mcast`]: the device's socket joins the
//! group, so the kernel sends the IGMP / MLD report) unless the join is send-only. The
//! MULTICAST_JOIN event carries `ud.qp_num` 0xFFFFFF, `ud.qkey` `RDMA_UDP_QKEY` and the
//! address handle attributes to send to the group ([`crate::cm::McastJoined::ah_attr`]); a join the
//! device refuses, or a group lost later (the netdev went down, the source address went
//! away), is MULTICAST_ERROR. IPv6 groups work too (Linux refuses them on RoCEv2 with
//! `ENOTSUPP`). See `docs/CM.md`, "Multicast".

use std::net::{IpAddr, SocketAddr};

use rdma_hostview::MacAddr;

use crate::cm::id::CmId;
use crate::context::id_entry::{IdState, McJoin, QpKind};
use crate::engine::mcast_events::{mc_event, mgid};
use crate::error::{Error, Result};
use crate::params::EventType;

/// How to join (`rdma_join_multicast_ex`'s `join_flags`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum McJoinFlags {
    /// `RDMA_MC_JOIN_FLAG_FULLMEMBER` (0): send and receive.
    #[default]
    FullMember,
    /// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` (1): send only; the QP is not attached and
    /// the host does not join the group (no IGMP report), so nothing is received.
    SendOnlyFullMember,
}

impl McJoinFlags {
    /// From the C value; `EINVAL` for others.
    ///
    /// ```
    /// use rdmacm::cm::McJoinFlags;
    /// assert_eq!(McJoinFlags::from_raw(1).unwrap(), McJoinFlags::SendOnlyFullMember);
    /// assert!(McJoinFlags::from_raw(2).is_err());
    /// ```
    pub fn from_raw(v: u32) -> Result<McJoinFlags> {
        match v {
            0 => Ok(McJoinFlags::FullMember),
            1 => Ok(McJoinFlags::SendOnlyFullMember),
            _ => Err(Error::InvalidArgument(format!("multicast join flags {v}"))),
        }
    }
}

/// The group of a join's address (an IPv4-mapped IPv6 address as IPv4).
fn group_of(addr: &SocketAddr) -> IpAddr {
    match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl CmId {
    /// The Ethernet address of multicast group `ip` (`01:00:5e` + low 23 bits for IPv4,
    /// `33:33` + low 32 bits for IPv6), as `ip_eth_mc_map` / `ipv6_eth_mc_map` give it.
    pub fn group_mac(ip: IpAddr) -> MacAddr {
        crate::host::addr::group_mac(ip)
    }

    /// `rdma_join_multicast_ex`: joins group `addr` (an IPv4 or IPv6 multicast address; the
    /// port is ignored) with `flags`; `context` comes back with the event
    /// ([`crate::cm::McastJoined::context`]). The id must be a UD id (port space UDP) bound to a device
    /// (bound to a local address, or resolved: `resolve_addr` to the group) and of the
    /// group's family, else `EINVAL`. Its QP, when it has one, is attached to the group
    /// (full member); MULTICAST_JOIN follows on the id's channel (queued before this
    /// returns), or MULTICAST_ERROR when the device cannot join (its status the errno).
    /// Joining a group the id joined already is another join, as on Linux: it gets its
    /// own event, the QP still receives one copy of each datagram, and it stays attached
    /// until the last of the joins leaves.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rdmacm::cm::{CmId, EventChannel, EventType, McJoinFlags, PortSpace};
    /// # fn f() -> rdmacm::Result<()> {
    /// let ch = EventChannel::new()?;
    /// let id = CmId::new(&ch, PortSpace::Udp)?;
    /// let group = "239.1.2.3:0".parse().unwrap();
    /// id.resolve_addr(Some("192.0.2.1:0".parse().unwrap()), group, Duration::from_secs(2))?;
    /// assert_eq!(ch.get_event()?.kind(), EventType::AddrResolved);
    /// let dev = id.device().unwrap();
    /// let (pd, cq) = (dev.alloc_pd()?, dev.create_cq(64, None)?);
    /// let qp = id.create_qp(&pd, &rdmacm::verbs::QpInitAttr::ud(&cq, &cq))?;
    /// id.join_multicast(group, McJoinFlags::FullMember, 7)?;
    /// let ev = ch.get_event()?;
    /// assert_eq!(ev.kind(), EventType::MulticastJoin);
    /// let m = ev.mcast().unwrap();
    /// let ah = pd.create_ah_on(m.port_num, &m.ah_attr)?;
    /// let ud = ev.ud().unwrap(); // qp_num 0xFFFFFF, qkey 0x01234567
    /// let _dest = ah.dest(ud.qp_num, ud.qkey); // the `wr.ud` of a send to the group
    /// # let _ = qp; Ok(()) }
    /// ```
    pub fn join_multicast(&self, addr: SocketAddr, flags: McJoinFlags, context: u64) -> Result<()> {
        let group = group_of(&addr);
        if !group.is_multicast() {
            return Err(Error::InvalidArgument(format!(
                "join_multicast: {group} is not a multicast address"
            )));
        }
        let join = McJoin {
            group,
            send_only: flags == McJoinFlags::SendOnlyFullMember,
            context,
        };
        let qp = {
            let mut st = self.inner.lock();
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            if s.qp_kind != QpKind::Ud {
                return Err(Error::InvalidArgument(
                    "join_multicast needs a UD id (port space UDP)".into(),
                ));
            }
            let bound = matches!(s.state, IdState::AddrBound | IdState::AddrResolved);
            if !bound || s.dev.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "join_multicast on an id in state {} without a device: bind it to a \
                     local address or resolve the group first",
                    s.state.name()
                )));
            }
            if s.local.is_some_and(|l| l.is_ipv4() != group.is_ipv4()) {
                return Err(Error::InvalidArgument(format!(
                    "join_multicast: group {group} is not of the id's address family"
                )));
            }
            s.mc.push(join);
            s.qp.clone()
        };
        let attached = match (&qp, join.send_only) {
            (Some(qp), false) => qp.attach_mcast(mgid(group), 0).map_err(Error::from),
            _ => Ok(()),
        };
        let mut st = self.inner.lock();
        match attached {
            Ok(()) => {
                tracing::debug!(id = self.num, %group, send_only = join.send_only, "multicast joined");
                mc_event(&mut st, self.num, EventType::MulticastJoin, 0, &join);
            }
            Err(e) => {
                tracing::info!(id = self.num, %group, error = %e, "multicast join failed");
                mc_event(
                    &mut st,
                    self.num,
                    EventType::MulticastError,
                    -e.errno(),
                    &join,
                );
                if let Some(s) = st.ids.get_mut(&self.num) {
                    if let Some(i) = s.mc.iter().rposition(|m| m.group == group) {
                        s.mc.remove(i);
                    }
                }
            }
        }
        Ok(())
    }

    /// `rdma_leave_multicast`: ends the id's (latest) join of group `addr`; the QP is
    /// detached with the group's last full-member join. `EADDRNOTAVAIL` when the id has
    /// not joined it, as librdmacm.
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let group = group_of(&addr);
        let (qp, detach) = {
            let mut st = self.inner.lock();
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            let i = s.mc.iter().rposition(|m| m.group == group).ok_or_else(|| {
                Error::AddressNotAvailable(format!("leave_multicast: {group} was not joined"))
            })?;
            let j = s.mc.remove(i);
            let others = s.mc.iter().any(|m| m.group == group && !m.send_only);
            (s.qp.clone(), !j.send_only && !others)
        };
        if let (Some(qp), true) = (qp, detach) {
            // EINVAL: a QP made after the join was never attached
            match qp.detach_mcast(mgid(group), 0) {
                Ok(()) | Err(rdma_soft::Error::InvalidArgument(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        tracing::debug!(id = self.num, %group, "multicast left");
        Ok(())
    }

    /// Ends every join of the id (its destruction, as Linux's `cma_leave_mc_groups`): the
    /// QP, which the application may still hold, is detached from each group.
    pub(crate) fn leave_all_multicast(&self) {
        let (qp, joins) = {
            let mut st = self.inner.lock();
            match st.ids.get_mut(&self.num) {
                Some(s) if !s.mc.is_empty() => (s.qp.clone(), std::mem::take(&mut s.mc)),
                _ => return,
            }
        };
        let Some(qp) = qp else { return };
        let mut done: Vec<IpAddr> = Vec::new();
        for j in joins.iter().filter(|j| !j.send_only) {
            if !done.contains(&j.group) {
                done.push(j.group);
                // EINVAL: never attached (a QP made after the join)
                let _ = qp.detach_mcast(mgid(j.group), 0);
            }
        }
    }
}
