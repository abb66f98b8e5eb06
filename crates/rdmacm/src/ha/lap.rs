//! After a migration (the `migrate` policy): a new alternate through LAP / APR and the
//! return to the restored primary. When the port a connection left comes back up, its
//! active side proposes the path through it as the new alternate (LAP); the passive side
//! loads it (`Rearm`) and answers (APR); the active side loads it too, and unless the id
//! stays (`RDMACM_HA_RETURN=stay`) migrates back once both QPs are armed (armed by the
//! traffic of the restored path). See docs/HA.md.

use std::sync::Arc;
use std::time::Duration;

use rdma_proto::cm::{ApEvent, CmState, PathParams};
use rdma_proto::verbs::MigState;
use rdma_soft::verbs::{QpAttr, QpAttrMask, QueuePair};
use rdma_wire::cm::ApStatus;
use rdma_wire::time::IbaTime;

use crate::context::device_entry::DevEntry;
use crate::context::id_entry::{IdNum, IdSlot};
use crate::context::state::State;
use crate::context::Inner;
use crate::ha::migrate::{self, AltPath};
use crate::ha_policy::HaPolicy;
use crate::host::route::RocePath;

/// How often the engine looks whether a returning connection's QP is armed.
pub(crate) const RETURN_POLL: Duration = Duration::from_millis(10);

/// The ACK timeout of an id's QP (the one its RTS used).
fn ack_timeout(s: &IdSlot, path: &RocePath) -> u8 {
    s.opts
        .ack_timeout
        .unwrap_or(path.packet_lifetime.saturating_add(1).min(31))
}

/// Loads `alt` into an RTS QP as its alternate, in `Rearm` (armed when the peer is).
fn load_rearm(d: &DevEntry, qp: &QueuePair, s: &IdSlot, alt: &AltPath) -> bool {
    let Some(path) = &s.path else { return false };
    let mut attr = QpAttr::default();
    let mut mask = QpAttrMask::empty();
    migrate::load(d, alt, path, ack_timeout(s, path), &mut attr, &mut mask);
    if !mask.contains(QpAttrMask::ALT_PATH) {
        return false;
    }
    attr.path_mig_state = MigState::Rearm;
    mask |= QpAttrMask::PATH_MIG_STATE;
    match qp.modify(&attr, mask) {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(target: "rdmacm", qpn = qp.qpn(), error = %e, "alternate path not loaded");
            false
        }
    }
}

/// The LAP's path for `alt`, with the connection's other path parameters.
fn lap_path(s: &IdSlot, path: &RocePath, alt: &AltPath) -> PathParams {
    let primary = PathParams {
        flow_label: path.flow_label,
        traffic_class: path.traffic_class,
        hop_limit: path.hop_limit,
        sl: path.sl,
        mtu: path.mtu.code(),
        packet_life_time: IbaTime::from_bits_truncate(path.packet_lifetime),
        local_ack_timeout: IbaTime::from_bits_truncate(ack_timeout(s, path)),
        ..PathParams::default()
    };
    migrate::req_path(alt, &primary)
}

/// An alternate path event of device `dev`'s agent.
pub(crate) fn on_ap_event(st: &mut State, dev: u32, ev: ApEvent) {
    let conn = ev.conn();
    let Some(&id) = st.devices.get(&dev).and_then(|d| d.conns.get(&conn)) else {
        return;
    };
    match ev {
        ApEvent::LapReceived { alternate_path, .. } => {
            let status = take_lap(st, dev, id, &alternate_path);
            if let Some(d) = st.devices.get_mut(&dev) {
                // A failure to answer is a lost MAD: the peer's LAP is resent or times out.
                let _ = d.agent.send_apr(conn, status, &[], &[]);
            }
        }
        ApEvent::AprReceived { status, .. } => {
            let Some(s) = st.ids.get(&id) else { return };
            let (Some(alt), Some(qp)) = (s.lap_alt, s.qp.clone()) else {
                return;
            };
            let loaded = status == ApStatus::Success
                && st
                    .devices
                    .get(&dev)
                    .is_some_and(|d| load_rearm(d, &qp, &st.ids[&id], &alt));
            tracing::info!(target: "rdmacm", id, ?status, loaded, port = alt.port, "APR for our LAP");
            if let Some(s) = st.ids.get_mut(&id) {
                s.lap_alt = None;
                if loaded {
                    s.alt = Some(alt);
                    if !s.opts.ha_stay {
                        st.returning.push(id);
                    }
                }
            }
        }
        ApEvent::LapTimeout { .. } => {
            if let Some(s) = st.ids.get_mut(&id) {
                s.lap_alt = None;
            }
        }
        ApEvent::MraLapReceived { .. } => {}
    }
}

/// The passive side of a LAP: loaded (`Success`), refused (`Reject`: not an address of
/// ours on another port, or one loaded already) or not ours to take (`Unsupported`: not
/// the migrate policy, or no QP).
fn take_lap(st: &mut State, dev: u32, id: IdNum, lap: &rdma_wire::cm::CmPathRepr) -> ApStatus {
    let Some(s) = st.ids.get(&id) else {
        return ApStatus::InvalidCommId;
    };
    let Some(qp) = s.qp.clone() else {
        return ApStatus::Unsupported;
    };
    if s.opts.ha != HaPolicy::Migrate {
        return ApStatus::Unsupported;
    }
    let Some(d) = st.devices.get(&dev) else {
        return ApStatus::Reject;
    };
    let current = qp.query().map_or(1, |a| a.port_num);
    let alt = match migrate::from_req(d, current, lap) {
        Some(a) if s.alt.is_none() && load_rearm(d, &qp, s, &a) => a,
        _ => return ApStatus::Reject,
    };
    // Its MADs may use the new alternate's address after a migration.
    let _ = Inner::open_gsi(st, dev, alt.local);
    if let Some(s) = st.ids.get_mut(&id) {
        s.alt = Some(alt);
    }
    ApStatus::Success
}

/// The connected active ids of device `dev` under migrate with path migration that have no
/// alternate and are not on `port` (0: on any): (id, peer address, the port its QP uses)
/// for a LAP through `port` now that it is up.
pub(crate) fn want_lap(st: &State, dev: u32, port: u8) -> Vec<(IdNum, std::net::IpAddr, u8)> {
    let Some(d) = st.devices.get(&dev) else {
        return Vec::new();
    };
    st.ids
        .iter()
        .filter(|(_, s)| {
            s.dev == Some(dev)
                && s.parent.is_none()
                && s.opts.ha == HaPolicy::Migrate
                && s.apm
                && s.alt.is_none()
                && s.lap_alt.is_none()
                && s.conn.and_then(|c| d.agent.state(c)) == Some(CmState::Established)
        })
        .filter_map(|(&id, s)| {
            let current = s.qp.as_ref()?.query().ok()?.port_num;
            (current != port).then_some((id, s.peer?.ip(), current))
        })
        .collect()
}

/// The ids [`want_lap`] would take on any port, for a route change: (device, id, peer
/// address, the port its QP uses, the device's up ports with their netdevs).
#[allow(clippy::type_complexity)]
pub(crate) fn want_route_lap(
    st: &State,
) -> Vec<(u32, IdNum, std::net::IpAddr, u8, Vec<(u8, u32)>)> {
    let mut out = Vec::new();
    for (&dev, d) in st.devices.iter().filter(|(_, d)| d.links.len() > 1) {
        let ports = migrate::up_ports(d);
        for (id, peer, current) in want_lap(st, dev, 0) {
            out.push((dev, id, peer, current, ports.clone()));
        }
    }
    out
}

/// Sends the LAP for `alt` on id `id` (an alternate found for it by `want_lap`'s caller).
pub(crate) fn send_lap(inner: &Arc<Inner>, st: &mut State, dev: u32, id: IdNum, alt: AltPath) {
    let now = inner.now();
    let Some(s) = st.ids.get(&id) else { return };
    let (Some(conn), Some(path)) = (s.conn, s.path.as_ref()) else {
        return;
    };
    if s.alt.is_some() || s.lap_alt.is_some() {
        return;
    }
    let p = lap_path(s, path, &alt);
    let Some(d) = st.devices.get_mut(&dev) else {
        return;
    };
    if migrate::checked(d, Some(alt)).is_none() {
        return;
    }
    if let Err(e) = d.agent.send_lap(now, conn, &p, &[]) {
        tracing::info!(target: "rdmacm", id, error = %e, "LAP not sent");
        return;
    }
    let _ = Inner::open_gsi(st, dev, alt.local);
    if let Some(s) = st.ids.get_mut(&id) {
        s.lap_alt = Some(alt);
    }
    tracing::info!(target: "rdmacm", id, port = alt.port, local = %alt.local, remote = %alt.remote, "LAP: the restored path as the new alternate");
}

/// Migrates the returning ids ([`State::returning`]) whose QP is armed; those still in
/// `Rearm` stay listed (the engine looks again after [`RETURN_POLL`]), the others (gone,
/// migrated, no QP) are dropped from the list.
pub(crate) fn poll_returns(st: &mut State) {
    let ids = std::mem::take(&mut st.returning);
    for id in ids {
        let Some(qp) = st.ids.get(&id).and_then(|s| s.qp.clone()) else {
            continue;
        };
        match qp.query().map(|a| a.path_mig_state) {
            Ok(MigState::Armed) => {
                if let Err(e) = qp.migrate() {
                    tracing::info!(target: "rdmacm", qpn = qp.qpn(), error = %e, "return to the restored path failed");
                }
            }
            Ok(MigState::Rearm) => st.returning.push(id),
            _ => {}
        }
    }
}
