//! Received MADs: parsing, matching to a connection, and the transitions they cause.
//!
//! A message changes a connection only if its communication ids name it exactly, it comes
//! from the connection's peer GID, and the connection is in a state that expects it.
//! Anything else is dropped (counted in [`super::CmStats`]), except the answers Linux gives
//! to messages that match nothing: REJ 8 to a REQ for a service nobody listens on, REJ 10 to
//! a REQ or REP from a stale QP, DREP to a DREQ.

use rdma_wire::cm::{
    CmMadRepr, CmMessage, DrepRepr, DreqRepr, MessageRef, MraRepr, RejRepr, RejectReason, RepRepr,
    ReqRepr, RtuRepr, DREP_PRIVATE_DATA_LEN,
};
use rdma_wire::mad::method;

use super::conn::{emit, issue_rej, Conn};
use super::event::{RejReceived, RepReceived, ReqReceived};
use super::timers::{peer_mra_ns, peer_response_ns, peer_timewait_ns};
use super::{CmAgent, CmEvent, CmPath, CmState, ConnHandle, Nanos, OverloadPolicy};

impl CmAgent {
    /// Processes one received CM MAD (the 256 bytes after the DETH of a UD SEND to QP1).
    ///
    /// Never panics: malformed MADs (wrong length, class, version, method, unknown attribute)
    /// and messages that match nothing are dropped and counted in [`CmAgent::stats`].
    pub fn handle_mad(&mut self, now: Nanos, source: CmPath, mad: &[u8]) {
        self.pacing.saw(now);
        let Ok(m) = CmMadRepr::parse(mad) else {
            self.stats.malformed += 1;
            tracing::debug!(from = ?source, len = mad.len(), "malformed CM MAD dropped");
            return;
        };
        if m.method != method::SEND || m.r_bit {
            self.stats.malformed += 1;
            tracing::debug!(from = ?source, method = m.method, "CM MAD with a wrong method dropped");
            return;
        }
        let tid = m.transaction_id;
        self.heard.saw(source.remote_gid, now);
        match m.message {
            CmMessage::Req(x) => self.on_req(now, source, tid, x),
            CmMessage::Mra(x) => self.on_mra(now, source, x),
            CmMessage::Rej(x) => self.on_rej(now, source, x),
            CmMessage::Rep(x) => self.on_rep(now, source, tid, x),
            CmMessage::Rtu(x) => self.on_rtu(source, x),
            CmMessage::Dreq(x) => self.on_dreq(now, source, tid, x),
            CmMessage::Drep(x) => self.on_drep(now, source, x),
            CmMessage::SidrReq(x) => self.on_sidr_req(source, tid, x),
            CmMessage::SidrRep(x) => self.on_sidr_rep(now, source, x),
            CmMessage::Lap(x) => self.on_lap(source, tid, x),
            CmMessage::Apr(x) => self.on_apr(source, x),
            // rdma_cm does not use ClassPortInfo
            CmMessage::ClassPortInfo(_) => self.stats.unmatched += 1,
        }
        self.sync_timers();
    }

    /// The live connection whose local id is `local`, whose remote id is `remote` (if given)
    /// and whose peer is `src`.
    pub(crate) fn find(&self, local: u32, remote: Option<u32>, src: &CmPath) -> Option<ConnHandle> {
        let h = *self.by_local_id.get(&local)?;
        let c = self.live(h)?;
        if !c.path.same_node(src) || remote.is_some_and(|r| r != c.remote_id) {
            return None;
        }
        Some(h)
    }

    /// A connection (live or lingering) that holds this remote (node, CA GUID, comm id).
    /// The first in handle order, as a scan of `conns` finds it; only the connections indexed
    /// under `remote_id` are looked at.
    fn find_remote_id(&self, src: &CmPath, ca_guid: u64, remote_id: u32) -> Option<ConnHandle> {
        self.by_remote_id
            .get(&remote_id)?
            .iter()
            .filter_map(|h| self.conns.get(h))
            .filter(|c| {
                c.state.holds_remote()
                    && c.remote_id == remote_id
                    && c.remote_ca_guid == ca_guid
                    && c.path.same_node(src)
            })
            .map(|c| c.handle)
            .min()
    }

    /// A connection (live or lingering) that holds this remote QP.
    /// The first in handle order, among the connections indexed under `qpn`.
    fn find_remote_qpn(&self, src: &CmPath, ca_guid: u64, qpn: u32) -> Option<&Conn> {
        self.by_remote_qpn
            .get(&qpn)?
            .iter()
            .filter_map(|h| self.conns.get(h))
            .filter(|c| {
                c.state.holds_remote()
                    && c.remote_qpn == qpn
                    && c.remote_ca_guid == ca_guid
                    && c.path.same_node(src)
            })
            .min_by_key(|c| c.handle)
    }

    fn on_req(&mut self, now: Nanos, src: CmPath, tid: u64, r: ReqRepr) {
        // A duplicate of a REQ we already hold.
        if let Some(h) = self.find_remote_id(&src, r.local_ca_guid, r.local_comm_id) {
            self.stats.duplicates += 1;
            let Some(c) = self.conns.get(&h) else {
                return;
            };
            if c.destroyed {
                return;
            }
            let answer = match c.state {
                // "Send only on duplicate": the prepared (or already sent) MRA.
                CmState::MraReqSent => match &c.last_response {
                    Some(m) => Some(**m),
                    None => c.format_mra(MessageRef::Req, self.config.mra_service_timeout),
                },
                // Our REP was lost or is late: send it again (Linux waits for its REP timer).
                CmState::RepSent | CmState::MraRepRcvd => c.retx.as_ref().map(|r| *r.mad),
                CmState::Timewait => c.format_rej(RejectReason::StaleConn, &[], &[]),
                _ => None,
            };
            let to = c.path;
            if let Some(m) = answer {
                self.transmit.push_back((to, m));
            }
            return;
        }
        // A new REQ from a QP that still has a connection here: stale.
        let rej = (0, r.local_comm_id, MessageRef::Req);
        if self.reject_if_stale(now, src, tid, r.local_ca_guid, r.local_qpn, rej) {
            tracing::debug!(from = ?src, qpn = r.local_qpn, "REQ from a QP with a connection here: REJ stale connection");
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            tracing::debug!(from = ?src, service_id = r.service_id, "REQ for no listener: REJ invalid service id");
            self.reject_unmatched(
                src,
                tid,
                0,
                r.local_comm_id,
                MessageRef::Req,
                RejectReason::InvalidServiceId,
            );
            return;
        }
        if self.over_limits(&src, r.service_id) {
            self.stats.overload += 1;
            tracing::debug!(from = ?src, policy = ?self.config.overload, "REQ over the limits");
            if self.config.overload == OverloadPolicy::Reject {
                self.reject_unmatched(
                    src,
                    tid,
                    0,
                    r.local_comm_id,
                    MessageRef::Req,
                    RejectReason::NoResources,
                );
            }
            return;
        }
        let local_id = self.alloc_local_id();
        let h = self.alloc_handle();
        let state = if self.config.delayed_mra {
            CmState::MraReqSent
        } else {
            CmState::ReqRcvd
        };
        let conn = Conn {
            handle: h,
            state,
            local_id,
            remote_id: r.local_comm_id,
            remote_ca_guid: r.local_ca_guid,
            // Answers leave on the arrival path with the traffic class the REQ's path names
            // (as Linux's CM takes its av from the REQ).
            path: src.with_traffic_class(r.primary_path.traffic_class),
            service_id: r.service_id,
            listener: Some(r.service_id),
            local_qpn: 0,
            remote_qpn: r.local_qpn,
            tid,
            retx: None,
            response_timeout: peer_response_ns(r.local_cm_response_timeout),
            max_cm_retries: r.max_cm_retries,
            plt: self.config.packet_life_time,
            timewait: peer_timewait_ns(r.primary_path.local_ack_timeout),
            timewait_deadline: None,
            last_response: None,
            destroyed: false,
            scheduled: None,
            slot: Default::default(),
            half_open: false,
            ap: super::lap::Ap {
                alt: super::lap::has_path(&r.alternate_path).then_some(r.alternate_path),
                ..Default::default()
            },
        };
        self.insert(conn);
        self.emit_event(CmEvent::ReqReceived(ReqReceived {
            conn: h,
            listener: r.service_id,
            path: src,
            req: Box::new(r),
        }));
    }

    /// True if one more passive connection from `src` on `service_id` exceeds a limit.
    /// O(1): the counts are kept as connections enter and leave those states.
    fn over_limits(&mut self, src: &CmPath, service_id: u64) -> bool {
        if self.full() {
            return true;
        }
        let (per_listener, per_peer) = self.pacing.half_open(service_id, &src.remote_gid);
        per_listener >= self.config.listen_backlog || per_peer >= self.config.max_half_open_per_peer
    }

    /// Linux's `cm_issue_rej`: a REJ to a message that made no connection.
    pub(crate) fn reject_unmatched(
        &mut self,
        to: CmPath,
        tid: u64,
        local: u32,
        remote: u32,
        msg: MessageRef,
        reason: RejectReason,
    ) {
        if let Some(m) = issue_rej(tid, local, remote, msg, reason) {
            self.transmit.push_back((to, m));
        }
    }

    /// A REQ or REP from remote QP `qpn` of `ca_guid` that still has a connection here is
    /// stale: answers it with a REJ (StaleConn; `rej` is the REJ's local and remote comm ids
    /// and the message rejected) and sends a DREQ on the old connection when it is
    /// established. Returns whether it was stale (and so answered).
    fn reject_if_stale(
        &mut self,
        now: Nanos,
        src: CmPath,
        tid: u64,
        ca_guid: u64,
        qpn: u32,
        rej: (u32, u32, MessageRef),
    ) -> bool {
        let Some(old) = self.find_remote_qpn(&src, ca_guid, qpn) else {
            return false;
        };
        let old = (old.handle, old.state, old.destroyed);
        let (local, remote, msg) = rej;
        self.reject_unmatched(src, tid, local, remote, msg, RejectReason::StaleConn);
        if old.1 == CmState::Established && !old.2 {
            let _ = self.send_dreq(now, old.0, &[]);
        }
        true
    }

    fn on_mra(&mut self, now: Nanos, src: CmPath, x: MraRepr) {
        let (h, from, to) = match x.message_mraed {
            MessageRef::Req => (
                self.find(x.remote_comm_id, Some(0), &src),
                CmState::ReqSent,
                CmState::MraReqRcvd,
            ),
            MessageRef::Rep => (
                self.find(x.remote_comm_id, Some(x.local_comm_id), &src),
                CmState::RepSent,
                CmState::MraRepRcvd,
            ),
            _ => {
                if !self.on_mra_lap(
                    now,
                    src,
                    x.remote_comm_id,
                    x.local_comm_id,
                    x.service_timeout,
                ) {
                    self.stats.unmatched += 1;
                }
                return;
            }
        };
        let Some(c) = h.and_then(|h| {
            self.touched.push(h);
            self.conns.get_mut(&h)
        }) else {
            self.stats.unmatched += 1;
            return;
        };
        if c.state == to {
            self.stats.duplicates += 1;
            return;
        }
        if c.state != from {
            self.stats.unmatched += 1;
            return;
        }
        let wait = peer_mra_ns(x.service_timeout, c.plt);
        if let Some(r) = c.retx.as_mut() {
            r.extend(now, wait);
        }
        c.state = to;
        let conn = c.handle;
        self.emit_event(CmEvent::MraReceived {
            conn,
            service_timeout: x.service_timeout,
        });
    }

    fn on_rej(&mut self, now: Nanos, src: CmPath, x: RejRepr) {
        let h = if x.reason == RejectReason::Timeout && x.remote_comm_id == 0 {
            // The requester gave up (destroyed in REQ_SENT): it names us by its own comm id and
            // its CA GUID in the ARI, as it never learned our comm id.
            let ari = x.ari();
            let guid = (ari.len() >= 8).then(|| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&ari[..8]);
                u64::from_be_bytes(b)
            });
            guid.and_then(|g| self.find_remote_id(&src, g, x.local_comm_id))
                .filter(|h| self.live(*h).is_some())
        } else if x.message_rejected == MessageRef::Req {
            self.find(x.remote_comm_id, Some(0), &src)
        } else {
            // A REJ naming both ids; or, while we do not know the peer's id yet (its REP was
            // lost), one naming ours (Linux requires the exact pair and ignores this REJ).
            self.find(x.remote_comm_id, Some(x.local_comm_id), &src)
                .or_else(|| {
                    self.find(x.remote_comm_id, Some(0), &src).filter(|h| {
                        self.conns.get(h).is_some_and(|c| {
                            matches!(c.state, CmState::ReqSent | CmState::MraReqRcvd)
                        })
                    })
                })
        };
        let Some(c) = h.and_then(|h| {
            self.touched.push(h);
            self.conns.get_mut(&h)
        }) else {
            self.stats.unmatched += 1;
            return;
        };
        let grace = self.config.no_listener_retry;
        if c.state == CmState::ReqSent
            && x.reason == RejectReason::InvalidServiceId
            && x.message_rejected == MessageRef::Req
            && c.retx.as_mut().is_some_and(|r| r.refused(now, grace))
        {
            tracing::debug!(conn = ?c.handle, service_id = c.service_id, "REQ refused for want of a listener: resent shortly");
            return;
        }
        match c.state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent => {
                if x.reason == RejectReason::StaleConn {
                    c.enter_timewait(now);
                } else {
                    c.reset_to_idle();
                }
            }
            CmState::DreqSent | CmState::RepRcvd | CmState::MraRepSent | CmState::Established => {
                c.enter_timewait(now)
            }
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        }
        let conn = c.handle;
        self.emit_event(CmEvent::RejReceived(RejReceived {
            conn,
            reason: x.reason,
            message_rejected: x.message_rejected,
            ari: x.ari().to_vec(),
            private_data: x.private_data.to_vec(),
        }));
    }

    fn on_rep(&mut self, now: Nanos, src: CmPath, tid: u64, x: RepRepr) {
        let Some(h) = self.find(x.remote_comm_id, Some(0), &src).filter(|h| {
            self.conns
                .get(h)
                .is_some_and(|c| matches!(c.state, CmState::ReqSent | CmState::MraReqRcvd))
        }) else {
            self.dup_rep(src, x);
            return;
        };
        // The same remote connection already held by another of ours: a duplicate.
        if self
            .find_remote_id(&src, x.local_ca_guid, x.local_comm_id)
            .is_some()
        {
            self.stats.duplicates += 1;
            return;
        }
        let rej = (x.remote_comm_id, x.local_comm_id, MessageRef::Rep);
        if self.reject_if_stale(now, src, tid, x.local_ca_guid, x.local_qpn, rej) {
            return;
        }
        let delayed = self.config.delayed_mra;
        self.set_remote(h, x.local_comm_id, x.local_qpn);
        let Some(c) = self.conn_mut(h) else {
            return;
        };
        c.remote_ca_guid = x.local_ca_guid;
        c.retx = None;
        if x.failover_accepted != 0 {
            c.ap.alt = None;
        }
        c.state = if delayed {
            CmState::MraRepSent
        } else {
            CmState::RepRcvd
        };
        self.emit_event(CmEvent::RepReceived(RepReceived {
            conn: h,
            rep: Box::new(x),
        }));
    }

    /// A REP for a connection past REQ_SENT: answer again (RTU, or the prepared MRA).
    fn dup_rep(&mut self, src: CmPath, x: RepRepr) {
        let Some(c) = self
            .find(x.remote_comm_id, Some(x.local_comm_id), &src)
            .and_then(|h| self.conns.get(&h))
        else {
            self.stats.unmatched += 1;
            return;
        };
        self.stats.duplicates += 1;
        let answer = match c.state {
            CmState::Established => c.last_response.as_deref().copied(),
            CmState::MraRepSent => match &c.last_response {
                Some(m) => Some(**m),
                None => c.format_mra(MessageRef::Rep, self.config.mra_service_timeout),
            },
            _ => None,
        };
        let to = c.path;
        if let Some(m) = answer {
            self.transmit.push_back((to, m));
        }
    }

    fn on_rtu(&mut self, src: CmPath, x: RtuRepr) {
        let Some(c) = self
            .find(x.remote_comm_id, Some(x.local_comm_id), &src)
            .and_then(|h| {
                self.touched.push(h);
                self.conns.get_mut(&h)
            })
        else {
            self.stats.unmatched += 1;
            return;
        };
        if !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) {
            self.stats.duplicates += 1;
            return;
        }
        c.retx = None;
        c.state = CmState::Established;
        let conn = c.handle;
        self.emit_event(CmEvent::Established { conn });
    }

    fn on_dreq(&mut self, now: Nanos, src: CmPath, tid: u64, x: DreqRepr) {
        let found = self
            .find(x.remote_comm_id, Some(x.local_comm_id), &src)
            .and_then(|h| {
                self.touched.push(h);
                self.conns.get_mut(&h)
            });
        let Some(c) = found else {
            // Linux's cm_issue_drep: a DREQ for no connection still gets its DREP.
            self.stats.unmatched += 1;
            let drep = DrepRepr {
                local_comm_id: x.remote_comm_id,
                remote_comm_id: x.local_comm_id,
                private_data: [0; DREP_PRIVATE_DATA_LEN],
            };
            if let Some(m) = emit(tid, CmMessage::Drep(drep)) {
                self.transmit.push_back((src, m));
            }
            return;
        };
        if x.remote_qpn_eecn != c.local_qpn {
            self.stats.unmatched += 1;
            tracing::debug!(from = ?src, qpn = x.remote_qpn_eecn, "DREQ for another QP dropped");
            return;
        }
        let conn = c.handle;
        let mut implied_establish = false;
        match c.state {
            CmState::RepSent | CmState::MraRepRcvd => implied_establish = true,
            CmState::DreqSent | CmState::Established => {}
            // After the timewait too (512 ms, while the peer resends its DREQ every few
            // seconds): a DREP that was lost is answered again for as long as the id
            // exists, else the peer's disconnect waits out all its retries.
            CmState::Timewait | CmState::Idle => {
                self.stats.duplicates += 1;
                let answer = match &c.last_response {
                    Some(m) => Some(**m),
                    None => {
                        let drep = DrepRepr {
                            local_comm_id: c.local_id,
                            remote_comm_id: c.remote_id,
                            private_data: [0; DREP_PRIVATE_DATA_LEN],
                        };
                        emit(tid, CmMessage::Drep(drep))
                    }
                };
                let to = c.path;
                if let Some(m) = answer {
                    self.transmit.push_back((to, m));
                }
                return;
            }
            CmState::DreqRcvd => {
                // not answered yet (the owner's disconnect sends the DREP)
                self.stats.duplicates += 1;
                tracing::debug!(from = ?src, "duplicate DREQ before the DREP dropped");
                return;
            }
            state => {
                self.stats.unmatched += 1;
                tracing::debug!(from = ?src, ?state, "DREQ dropped");
                return;
            }
        }
        c.retx = None;
        c.tid = tid;
        c.state = CmState::DreqRcvd;
        let _ = now;
        if implied_establish {
            self.emit_event(CmEvent::Established { conn });
        }
        self.emit_event(CmEvent::DreqReceived {
            conn,
            private_data: x.private_data.to_vec(),
        });
    }

    fn on_drep(&mut self, now: Nanos, src: CmPath, x: DrepRepr) {
        let Some(c) = self
            .find(x.remote_comm_id, Some(x.local_comm_id), &src)
            .and_then(|h| {
                self.touched.push(h);
                self.conns.get_mut(&h)
            })
        else {
            self.stats.unmatched += 1;
            return;
        };
        if !matches!(c.state, CmState::DreqSent | CmState::DreqRcvd) {
            self.stats.duplicates += 1;
            return;
        }
        c.enter_timewait(now);
        let conn = c.handle;
        self.emit_event(CmEvent::DrepReceived {
            conn,
            private_data: x.private_data.to_vec(),
        });
    }
}
