//! The CM agent's connection events and the host's notifications turned into id events,
//! for both sides (requests go to `listen`, the active side's REP and SIDR_REP to
//! `connect`).

use std::sync::Arc;

use rdma_proto::cm::CmEvent;

use crate::context::id_entry::{IdNum, IdState, QpKind};
use crate::context::state::State;
use crate::context::Inner;
use crate::engine::connect::{on_rep, on_sidr_rep, qp_to_err};
use crate::host::watch::{ChangeReason, Notification};
use crate::params::{ConnEventParam, EventType};
use rdma_proto::cm::CmState;

/// DISCONNECTED is reported to connected ids, also after DEVICE_REMOVAL (we never tear a
/// connection down ourselves, so its end is news).
fn disconnectable(s: IdState) -> bool {
    matches!(s, IdState::Connect | IdState::DeviceRemoval)
}

/// The end of a connection, from the peer's DREQ or DREP or our DREQ's timeout (`status`):
/// DISCONNECTED once, while the id is connected.
fn disconnected(st: &mut State, id: IdNum, status: i32, private_data: Vec<u8>) {
    let Some(s) = st.ids.get_mut(&id).filter(|s| disconnectable(s.state)) else {
        return;
    };
    if s.state == IdState::Connect {
        s.state = IdState::Disconnect;
    }
    let param = ConnEventParam {
        private_data,
        ..ConnEventParam::default()
    };
    Inner::event(st, id, EventType::Disconnected, status, param);
}

/// An event that ends a connection attempt with `kind` and `status` (the peer's REJ, a
/// REQ / REP / SIDR_REQ timeout); `qp_err`: the id's QP goes to ERR first.
fn failed(
    st: &mut State,
    id: IdNum,
    kind: EventType,
    status: i32,
    private_data: Vec<u8>,
    qp_err: bool,
) {
    if qp_err {
        if let Some(s) = st.ids.get(&id) {
            qp_to_err(s);
        }
    }
    let param = ConnEventParam {
        private_data,
        ..ConnEventParam::default()
    };
    Inner::event(st, id, kind, status, param);
}

impl Inner {
    /// One CM agent event of device `dev` for an existing connection (requests go to
    /// the passive side, `listen`).
    pub(crate) fn on_cm_event(self: &Arc<Self>, st: &mut State, dev: u32, ev: CmEvent) {
        let conn = ev.conn();
        let Some(&id) = st.devices.get(&dev).and_then(|d| d.conns.get(&conn)) else {
            return;
        };
        let Some(s) = st.ids.get_mut(&id) else {
            return;
        };
        if s.state == IdState::Destroying {
            return;
        }
        let timed_out = -libc::ETIMEDOUT;
        match ev {
            CmEvent::RepReceived(r) => on_rep(self, st, dev, id, conn, r),
            CmEvent::SidrRepReceived(r) => on_sidr_rep(st, id, r),
            CmEvent::Established { .. } => {
                if s.suppress_est {
                    return;
                }
                let param = std::mem::take(&mut s.est_param);
                Inner::event(st, id, EventType::Established, 0, param);
            }
            CmEvent::RejReceived(r) => {
                let status = i32::from(u16::from(r.reason));
                s.counters.rejs_received += 1;
                s.counters.rej_reason = Some(u16::from(r.reason));
                failed(st, id, EventType::Rejected, status, r.private_data, true);
            }
            CmEvent::ReqTimeout { .. } | CmEvent::RepTimeout { .. } => {
                failed(st, id, EventType::Unreachable, timed_out, Vec::new(), true);
            }
            CmEvent::SidrReqTimeout { .. } => {
                failed(st, id, EventType::Unreachable, timed_out, Vec::new(), false);
            }
            CmEvent::DreqReceived { private_data, .. } => {
                s.counters.dreqs_received += 1;
                disconnected(st, id, 0, private_data);
            }
            CmEvent::DrepReceived { private_data, .. } => {
                s.counters.dreps_received += 1;
                disconnected(st, id, 0, private_data);
            }
            CmEvent::DreqTimeout { .. } => disconnected(st, id, timed_out, Vec::new()),
            CmEvent::TimewaitExit { .. } => {
                Inner::event(
                    st,
                    id,
                    EventType::TimewaitExit,
                    0,
                    ConnEventParam::default(),
                );
            }
            CmEvent::MraReceived { .. } | CmEvent::ReqReceived(_) | CmEvent::SidrReqReceived(_) => {
            }
        }
    }

    /// Under [`crate::cm::HaPolicy::Align`], ends a connected id's connection when `reason`
    /// moved its path off its netdev: QP to ERR, DREQ (it leaves if any route still
    /// carries it; its retries end in nothing more for the id), DISCONNECTED with the
    /// policy's status. False (nothing done) otherwise.
    fn align_close(self: &Arc<Self>, st: &mut State, id: IdNum, reason: &ChangeReason) -> bool {
        let Some(s) = st.ids.get(&id) else {
            return false;
        };
        let Some(dev) = s.dev else {
            return false;
        };
        // `migrate` without path migration (the peer refused the alternate, or there was
        // none to offer) falls back to `align`: the application
        // reconnects on the new path, on the same device (a group's PD and MRs).
        // (with path migration: when there is no armed alternate left to move to)
        let policy = match s.opts.ha {
            crate::ha_policy::HaPolicy::Migrate => crate::ha_policy::HaPolicy::Align,
            p => p,
        };
        let Some(status) = policy.ends(reason, s.path_netdev.unwrap_or(dev)) else {
            return false;
        };
        tracing::info!(id, ?reason, status, "align: the path moved");
        self.end_moved(st, id, status)
    }

    /// Ends a connected RC id's connection because its path is gone (the align policy, or
    /// migrate whose migration failed): QP to ERR, DREQ (it leaves if any route still
    /// carries it), DISCONNECTED with `status`. False (nothing done) when not connected.
    pub(crate) fn end_moved(self: &Arc<Self>, st: &mut State, id: IdNum, status: i32) -> bool {
        let Some(s) = st.ids.get(&id) else {
            return false;
        };
        let (Some(dev), Some(conn)) = (s.dev, s.conn) else {
            return false;
        };
        if s.state != IdState::Connect || s.qp_kind != QpKind::Rc {
            return false;
        }
        let now = self.now();
        let Some(d) = st.devices.get_mut(&dev) else {
            return false;
        };
        if d.agent.state(conn) != Some(CmState::Established) {
            return false;
        }
        tracing::info!(id, status, "ending the connection: its path is gone");
        if let Some(s) = st.ids.get_mut(&id) {
            s.align_status = Some(status);
            qp_to_err(s);
        }
        let sent = d.agent.disconnect(now, conn).is_ok();
        if let Some(s) = st.ids.get_mut(&id) {
            s.counters.dreqs_sent += u64::from(sent);
            s.state = IdState::Disconnect;
        }
        self.drain_agent(st, dev);
        Inner::event(
            st,
            id,
            EventType::Disconnected,
            status,
            ConnEventParam::default(),
        );
        true
    }

    /// A host change for an id: ADDR_CHANGE or DEVICE_REMOVAL, or under the align policy
    /// the end of its connection ([`Inner::align_close`]).
    pub(crate) fn on_notification(self: &Arc<Self>, st: &mut State, n: Notification) {
        let (id, gen) = crate::context::watch_id(n.id());
        if st.ids.get(&id).is_some_and(|s| s.watch_gen != gen) {
            return; // about a path the id has left (migrated)
        }
        if let Notification::AddrChange { reason, .. } = &n {
            if crate::ha::migrate::on_path_change(st, id, reason)
                || self.align_close(st, id, reason)
            {
                return;
            }
        }
        let Some(s) = st.ids.get_mut(&id) else { return };
        if matches!(s.state, IdState::Destroying | IdState::DeviceRemoval) {
            return;
        }
        if !s.mc.is_empty() {
            crate::engine::mcast_events::on_notification(st, id, &n);
        }
        let Some(s) = st.ids.get_mut(&id) else { return };
        match n {
            Notification::DeviceRemoval { .. } => {
                s.state = IdState::DeviceRemoval;
                Inner::event(
                    st,
                    id,
                    EventType::DeviceRemoval,
                    0,
                    ConnEventParam::default(),
                );
            }
            _ => {
                // One host change often yields several notifications (an address removal
                // also removes its prefix route): one ADDR_CHANGE while one is queued.
                let ch = s.channel;
                let queued = st.channels.get(&ch).is_some_and(|c| {
                    c.queue
                        .iter()
                        .any(|e| e.id == id && e.kind == EventType::AddrChange)
                });
                if !queued {
                    Inner::event(st, id, EventType::AddrChange, 0, ConnEventParam::default());
                }
            }
        }
    }
}
