//! The `migrate` policy's alternate path: chosen at route resolution (active side) or taken
//! from the REQ (passive side) on a device group, carried in the REQ, accepted or refused in
//! the REP, and loaded into the QP at RTR (Armed), so that the transport's automatic path
//! migration can move the connection to another port without the CM. See docs/HA.md.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use rdma_proto::cm::{CmPath, PathParams};
use rdma_proto::verbs::MigState;
use rdma_soft::verbs::{AsyncEvent, PathAttr, PortState, QpAttr, QpAttrMask};
use rdma_wire::cm::CmPathRepr;

use crate::context::device_entry::DevEntry;
use crate::context::id_entry::IdSlot;
use crate::context::state::State;
use crate::context::Inner;
use crate::ha_policy::HaPolicy;
use crate::host::addr::Gid;
use crate::host::resolve::Resolver;
use crate::host::route::RocePath;
use crate::host::watch::ChangeReason;

/// How long [`Resolver::alternate`] waits for the alternate's next hop to answer.
const NEIGHBOUR_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) use crate::host::route::AltPath;

/// The other ports of the id's device that are up, with their netdevs: where an
/// alternate path may go (none unless the policy is migrate and the device a group).
pub(crate) fn candidates(st: &State, s: &IdSlot) -> Vec<(u8, u32)> {
    if s.opts.ha != HaPolicy::Migrate {
        return Vec::new();
    }
    let Some(d) = s.dev.and_then(|k| st.devices.get(&k)) else {
        return Vec::new();
    };
    let primary = crate::context::state::id_port(st, s);
    let mut ports = up_ports(d);
    ports.retain(|&(p, _)| p != primary);
    ports
}

/// The ports of device `d` that are up, with their netdevs.
pub(crate) fn up_ports(d: &DevEntry) -> Vec<(u8, u32)> {
    d.links
        .iter()
        .enumerate()
        .filter_map(|(i, &link)| Some((u8::try_from(i + 1).ok()?, link)))
        .filter(|&(p, _)| {
            d.dev
                .query_port(p)
                .is_ok_and(|a| a.state == PortState::Active)
        })
        .collect()
}

impl Resolver {
    /// The first candidate port with a route to `peer` through its netdev whose next hop
    /// answers: our address is the route's preferred source, the peer's the route's gateway
    /// (on a second link between two hosts: the peer's own address on it; the peer checks it
    /// is its own), or `peer` itself when it is on that link. The next hop's neighbour entry
    /// is resolved now, as the alternate address vector's MAC is on RoCE hardware: a path
    /// that is used only after a failure must not start with an ARP round (a lost first
    /// probe costs the kernel's 1 s retransmission).
    pub(crate) async fn alternate(&self, peer: IpAddr, cands: &[(u8, u32)]) -> Option<AltPath> {
        for &(port, link) in cands {
            let Ok(r) = self.view().route_get_bound(peer, None, link).await else {
                continue;
            };
            let Some(local) = r.prefsrc else { continue };
            let hop = r.next_hop();
            if let Err(e) = self
                .view()
                .resolve_neighbour(link, hop, NEIGHBOUR_WAIT)
                .await
            {
                tracing::debug!(target: "rdmacm", port, %hop, error = %e, "alternate path's next hop does not answer");
                continue;
            }
            return Some(AltPath {
                port,
                local,
                remote: r.gateway.unwrap_or(peer),
            });
        }
        None
    }
}

/// Keeps an alternate only if our address is in its port's GID table.
pub(crate) fn checked(d: &DevEntry, alt: Option<AltPath>) -> Option<AltPath> {
    alt.filter(|a| d.dev.gid_index_on(a.port, a.local).is_some())
}

fn gid(ip: IpAddr) -> Ipv6Addr {
    Ipv6Addr::from(Gid::from_ip(ip).0)
}

/// The REQ's alternate path fields for `alt`, with the primary path's other parameters.
pub(crate) fn req_path(alt: &AltPath, primary: &PathParams) -> PathParams {
    PathParams {
        local_gid: gid(alt.local),
        remote_gid: gid(alt.remote),
        ..*primary
    }
}

/// The passive side's alternate from the REQ's alternate path: its "remote port GID" must
/// be an address of this device on a port other than the primary's (`primary_port`).
pub(crate) fn from_req(d: &DevEntry, primary_port: u8, alt: &CmPathRepr) -> Option<AltPath> {
    if alt.local_port_gid.is_unspecified() || alt.remote_port_gid.is_unspecified() {
        return None;
    }
    let local = Gid(alt.remote_port_gid.octets()).to_ip();
    let remote = Gid(alt.local_port_gid.octets()).to_ip();
    let (port, _) = d.sgid(local)?;
    (port != primary_port).then_some(AltPath {
        port,
        local,
        remote,
    })
}

/// Adds the alternate path to an INIT → RTR transition (`attr` already holds the primary,
/// `timeout` the ACK timeout it will have at RTS); [`arm`] arms it at RTR → RTS (both sides
/// loaded it through the REQ / REP exchange).
pub(crate) fn load(
    d: &DevEntry,
    alt: &AltPath,
    primary: &RocePath,
    timeout: u8,
    attr: &mut QpAttr,
    mask: &mut QpAttrMask,
) {
    let Some(sgid_index) = d.dev.gid_index_on(alt.port, alt.local) else {
        return;
    };
    attr.alt_path = PathAttr {
        dgid: Gid::from_ip(alt.remote).0,
        sgid_index,
        hop_limit: primary.hop_limit,
        traffic_class: primary.traffic_class,
        flow_label: primary.flow_label,
    };
    attr.alt_port_num = alt.port;
    attr.alt_pkey_index = 0;
    attr.alt_timeout = timeout;
    *mask |= QpAttrMask::ALT_PATH;
}

/// Arms the loaded alternate at RTR → RTS (`IBV_MIG_ARMED`).
pub(crate) fn arm(attr: &mut QpAttr, mask: &mut QpAttrMask) {
    attr.path_mig_state = MigState::Armed;
    *mask |= QpAttrMask::PATH_MIG_STATE;
}

/// The REP's `failover_accepted`: 0 when we load the REQ's alternate, 1 (rejected) when
/// it had one we do not take; 0 without one, as Linux sends.
pub(crate) fn failover_accepted(req_had_alt: bool, alt: Option<&AltPath>) -> u8 {
    u8::from(req_had_alt && alt.is_none())
}

/// The CM's side of a migration reported by the device (its [`AsyncTap`]): the
/// connection's MADs follow the QP onto the alternate path (`CmAgent::migrated`, Linux's
/// `cm_migrate`), the alternate is used up, and the id gets ADDR_CHANGE.
///
/// [`AsyncTap`]: rdma_soft::verbs::AsyncTap
///
/// A migration that failed (`PathMigrationFailed`: the alternate exhausted its retries too,
/// e.g. a Linux peer that accepted the alternate but never moves to it) ends the
/// connection as `align` does (DISCONNECTED, [`crate::cm::ALIGN_PATH_MOVED`]), so that the
/// application reconnects on the path that works.
pub(crate) fn on_device_events(inner: &Arc<Inner>, st: &mut State, dev: u32) {
    let Some(d) = st.devices.get(&dev) else {
        return;
    };
    let mut moved = Vec::new();
    let mut failed = Vec::new();
    while let Some(e) = d.tap.as_ref().and_then(|t| t.poll()) {
        match e {
            AsyncEvent::PathMigrated { qpn, to_port, .. } => moved.push((qpn, to_port)),
            AsyncEvent::PathMigrationFailed { qpn, .. } => failed.push(qpn),
            _ => {}
        }
    }
    for qpn in failed {
        let id = st.ids.iter().find_map(|(&id, s)| {
            (s.dev == Some(dev)
                && s.opts.ha == HaPolicy::Migrate
                && s.qp.as_ref().map(|q| q.qpn()) == Some(qpn))
            .then_some(id)
        });
        if let Some(id) = id {
            tracing::info!(target: "rdmacm", id, qpn, "path migration failed: ending the connection as align does");
            inner.end_moved(st, id, crate::ha_policy::ALIGN_PATH_MOVED);
        }
    }
    for (qpn, to_port) in moved {
        let Some((&id, s)) = st.ids.iter().find(|(_, s)| {
            s.dev == Some(dev) && s.qp.as_ref().map(|q| q.qpn()).or(s.user_qpn) == Some(qpn)
        }) else {
            continue;
        };
        let (Some(conn), Some(alt)) = (s.conn, s.alt) else {
            continue;
        };
        if alt.port != to_port {
            continue;
        }
        let tc = s.path.as_ref().map_or(0, |p| p.traffic_class);
        let Some(d) = st.devices.get_mut(&dev) else {
            return;
        };
        let link = d
            .links
            .get(usize::from(alt.port) - 1)
            .copied()
            .unwrap_or(dev);
        let path = CmPath::new(gid(alt.local), gid(alt.remote), link).with_traffic_class(tc);
        if d.agent.migrated(conn, path).is_err() {
            continue;
        }
        tracing::info!(target: "rdmacm", id, qpn, port = to_port, local = %alt.local, remote = %alt.remote, "connection migrated to its alternate path");
        if let Some(s) = st.ids.get_mut(&id) {
            s.alt = None;
        }
        inner.rewatch(st, id, alt.local, alt.remote, link);
        Inner::event(
            st,
            id,
            crate::params::EventType::AddrChange,
            0,
            crate::params::ConnEventParam::default(),
        );
    }
}

/// Under `migrate` with path migration, a change that takes the connection's path away
/// (its route now leaves through another netdev or none, its netdev down, our address
/// gone: the changes that end it under `align`) forces the QP onto its armed alternate
/// (`IBV_MIG_MIGRATED`), and the id's ADDR_CHANGE comes with the migration
/// ([`on_device_events`]). True when the notification is taken care of: migrated now, or
/// already (a port going down migrates the QPs before its notice reaches the id). False
/// otherwise, so that `align` ends a connection with no alternate left to move to.
pub(crate) fn on_path_change(
    st: &State,
    id: crate::context::id_entry::IdNum,
    reason: &ChangeReason,
) -> bool {
    let Some(s) = st.ids.get(&id) else {
        return false;
    };
    if s.opts.ha != HaPolicy::Migrate || !s.apm || s.conn.is_none() {
        return false;
    }
    let Some(dev) = s.dev else {
        return false;
    };
    let netdev = s.path_netdev.unwrap_or(dev);
    if HaPolicy::Align.ends(reason, netdev).is_none() {
        return false;
    }
    let (Some(qp), Some(alt)) = (s.qp.as_ref(), s.alt) else {
        return false;
    };
    let Ok(attr) = qp.query() else {
        return false;
    };
    if attr.port_num == alt.port {
        return true;
    }
    match qp.migrate() {
        Ok(()) => {
            tracing::info!(target: "rdmacm", id, ?reason, port = alt.port, "path gone: migrating to the alternate");
            true
        }
        Err(e) => {
            tracing::info!(target: "rdmacm", id, ?reason, error = %e, "path gone and the alternate not armed");
            false
        }
    }
}
