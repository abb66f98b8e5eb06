//! Alternate paths (IBA vol1 12.8): the REQ's alternate path, LAP (load alternate path),
//! APR (its answer) and MRA for a LAP, with the sub-state Linux's `ib_cm` keeps beside the
//! connection state (`lap_state`).
//!
//! - [`CmAgent::send_lap`] (ESTABLISHED, no LAP outstanding): LAP sent, resent like a REQ
//!   (`2·PLT + remote CM response timeout`, `max_cm_retries`), [`ApEvent::LapTimeout`] after
//!   the last retry; an MRA for it extends the wait ([`ApEvent::MraLapReceived`]).
//! - A LAP for an established connection: [`ApEvent::LapReceived`]; answer with
//!   [`CmAgent::send_apr`] (or first [`CmAgent::send_mra_lap`]). A duplicate LAP before the
//!   answer is dropped (after an MRA: the MRA again); one after the answer gets the same APR
//!   again. A LAP that names no connection is answered with APR status 1 (invalid
//!   communication id); one for a connection in another state is dropped.
//! - The APR: [`ApEvent::AprReceived`]. With status 0 both sides record the path as the
//!   connection's alternate ([`CmAgent::alternate_path`]); loading it into the QP
//!   (`ALT_PATH` + `path_mig_state = Rearm`) is the owner's part.
//!
//! Events go to their own queue ([`CmAgent::poll_ap_event`]) so that owners which know only
//! [`super::CmEvent`] keep working.

use rdma_wire::cm::{
    ApStatus, AprRepr, CmMessage, CmPathRepr, LapRepr, MessageRef, APR_PRIVATE_DATA_LEN,
    LAP_PRIVATE_DATA_LEN,
};
use rdma_wire::time::IbaTime;

use super::conn::{emit, pad_checked, MadBuf};
use super::timers::Retx;
use super::{CmAgent, CmError, CmPath, CmState, ConnHandle, Nanos, PathParams};

/// The LAP sub-state of an established connection (Linux `enum ib_cm_lap_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LapState {
    /// No exchange in progress.
    #[default]
    Idle,
    /// We sent a LAP and wait for the APR.
    LapSent,
    /// We sent a LAP and the peer sent an MRA for it.
    MraLapRcvd,
    /// We received a LAP and have not answered.
    LapRcvd,
    /// We received a LAP and sent an MRA for it.
    MraLapSent,
}

/// Alternate path state of one connection.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ap {
    pub(crate) state: LapState,
    /// The connection's accepted alternate path.
    pub(crate) alt: Option<CmPathRepr>,
    /// The path of the LAP in progress (sent or received).
    pub(crate) pending: Option<CmPathRepr>,
    /// Transaction id of the LAP in progress or last answered.
    pub(crate) tid: u64,
    /// The APR we sent for the LAP with transaction id `tid` (resent to duplicates).
    pub(crate) last_apr: Option<Box<MadBuf>>,
    /// The MRA we sent for the LAP in progress.
    pub(crate) mra: Option<Box<MadBuf>>,
}

/// An alternate path event of a [`CmAgent`], drained with [`CmAgent::poll_ap_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApEvent {
    /// The peer asks to load an alternate path: answer with [`CmAgent::send_apr`].
    LapReceived {
        /// The connection.
        conn: ConnHandle,
        /// The path, as the peer sees it (its "local" is our remote).
        alternate_path: CmPathRepr,
        /// Private data (168 bytes).
        private_data: Vec<u8>,
    },
    /// The peer answered our LAP.
    AprReceived {
        /// The connection.
        conn: ConnHandle,
        /// Success (the path is now the connection's alternate) or why not.
        status: ApStatus,
        /// Additional information (its meaningful bytes).
        additional_information: Vec<u8>,
        /// Private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// The peer needs more time for our LAP; the wait was extended.
    MraLapReceived {
        /// The connection.
        conn: ConnHandle,
        /// The peer's service timeout.
        service_timeout: IbaTime,
    },
    /// Our LAP went unanswered after every retry (the connection stays established).
    LapTimeout {
        /// The connection.
        conn: ConnHandle,
    },
}

impl ApEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnHandle {
        match self {
            ApEvent::LapReceived { conn, .. }
            | ApEvent::AprReceived { conn, .. }
            | ApEvent::MraLapReceived { conn, .. }
            | ApEvent::LapTimeout { conn } => *conn,
        }
    }
}

/// A REQ or LAP path from the API's parameters.
pub(crate) fn path_repr(p: &PathParams) -> CmPathRepr {
    CmPathRepr {
        local_port_lid: p.local_lid,
        remote_port_lid: p.remote_lid,
        local_port_gid: p.local_gid,
        remote_port_gid: p.remote_gid,
        flow_label: p.flow_label,
        packet_rate: p.packet_rate,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        subnet_local: false,
        local_ack_timeout: p.local_ack_timeout,
    }
}

/// Whether a REQ's alternate path fields hold a path (an unspecified remote GID: none).
pub(crate) fn has_path(p: &CmPathRepr) -> bool {
    !p.remote_port_gid.is_unspecified()
}

impl CmAgent {
    /// The next alternate path event.
    pub fn poll_ap_event(&mut self) -> Option<ApEvent> {
        self.ap_events.pop_front()
    }

    /// The connection's accepted alternate path (from the REQ/REP or the last successful
    /// LAP/APR), as this side sent or received it.
    pub fn alternate_path(&self, conn: ConnHandle) -> Option<CmPathRepr> {
        self.live(conn).and_then(|c| c.ap.alt)
    }

    /// The QP moved to the alternate path (`ib_cm_notify(IB_EVENT_PATH_MIG)`, Linux's
    /// `cm_migrate`): the connection's later MADs, and the retransmissions of one in
    /// flight, take `path` (the alternate's GIDs and netdev tag, as the owner names them),
    /// and the alternate is used up (a LAP may load a new one). `EINVAL` for an unknown
    /// connection.
    ///
    /// ```
    /// use rdma_proto::cm::{AgentConfig, CmAgent, CmPath, ReqParams};
    /// let mut a = CmAgent::new(AgentConfig::default());
    /// let p1 = CmPath::new("::ffff:192.0.2.1".parse().unwrap(), "::ffff:192.0.2.2".parse().unwrap(), 1);
    /// let p2 = CmPath::new("::ffff:198.51.100.1".parse().unwrap(), "::ffff:198.51.100.2".parse().unwrap(), 2);
    /// let c = a.send_req(0, ReqParams::new(0x0106_0000_0000_1234, p1, 0x11, 0)).unwrap();
    /// a.migrated(c, p2).unwrap();
    /// assert_eq!(a.path(c), Some(p2));
    /// while a.poll_transmit().is_some() {} // the REQ, first sent on p1
    /// a.handle_timeout(u64::MAX / 2); // its retransmission
    /// assert_eq!(a.poll_transmit().map(|t| t.path), Some(p2));
    /// ```
    pub fn migrated(&mut self, conn: ConnHandle, path: CmPath) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        c.path = path;
        c.ap.alt = None;
        if let Some(r) = c.retx.as_mut() {
            r.to = path;
        }
        Ok(())
    }

    /// The connection's LAP sub-state.
    pub fn lap_state(&self, conn: ConnHandle) -> Option<LapState> {
        self.live(conn).map(|c| c.ap.state)
    }

    /// Sends a LAP proposing `path` as the new alternate (ESTABLISHED, no LAP exchange in
    /// progress, else `EINVAL`). Resent until the APR; [`ApEvent::LapTimeout`] after the
    /// last retry.
    pub fn send_lap(
        &mut self,
        now: Nanos,
        conn: ConnHandle,
        path: &PathParams,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let jitter = self.config.retry_jitter;
        let pd = pad_checked::<LAP_PRIVATE_DATA_LEN>(private_data)?;
        let tid = self.new_tid();
        let c = self.live_mut(conn)?;
        if c.state != CmState::Established || c.ap.state != LapState::Idle {
            return Err(CmError::InvalidState {
                op: "send_lap",
                state: c.state,
            });
        }
        let alt = path_repr(path);
        let lap = LapRepr {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            remote_cm_response_timeout: IbaTime::from_bits_truncate(20),
            alternate_path: alt,
            private_data: pd,
        };
        let mad = emit(tid, CmMessage::Lap(lap)).ok_or(CmError::InvalidParam("lap field"))?;
        let timeout = c.response_timeout;
        c.ap.state = LapState::LapSent;
        c.ap.pending = Some(alt);
        c.ap.tid = tid;
        c.retx = Some(Retx::new(
            mad,
            c.path,
            now,
            timeout,
            c.max_cm_retries,
            jitter,
        ));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    /// Answers the LAP received (LAP_RCVD / MRA_LAP_SENT → idle). With
    /// [`ApStatus::Success`] its path becomes the connection's alternate. A duplicate of that
    /// LAP gets this APR again.
    pub fn send_apr(
        &mut self,
        conn: ConnHandle,
        status: ApStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_checked::<APR_PRIVATE_DATA_LEN>(private_data)?;
        let ai = pad_checked(info)?;
        let c = self.live_mut(conn)?;
        if !matches!(c.ap.state, LapState::LapRcvd | LapState::MraLapSent) {
            return Err(CmError::InvalidState {
                op: "send_apr",
                state: c.state,
            });
        }
        let apr = AprRepr {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            additional_information_length: info.len() as u8,
            ap_status: status,
            additional_information: ai,
            private_data: pd,
        };
        let mad = emit(c.ap.tid, CmMessage::Apr(apr)).ok_or(CmError::InvalidParam("apr"))?;
        c.ap.state = LapState::Idle;
        if status == ApStatus::Success {
            c.ap.alt = c.ap.pending;
        }
        c.ap.pending = None;
        c.ap.mra = None;
        c.ap.last_apr = Some(Box::new(mad));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    /// Sends an MRA for the LAP received (LAP_RCVD → MRA_LAP_SENT), with
    /// [`super::AgentConfig::mra_service_timeout`]; duplicates of the LAP get it again.
    pub fn send_mra_lap(&mut self, conn: ConnHandle) -> Result<(), CmError> {
        let st = self.config.mra_service_timeout;
        let c = self.live_mut(conn)?;
        if c.ap.state != LapState::LapRcvd {
            return Err(CmError::InvalidState {
                op: "send_mra_lap",
                state: c.state,
            });
        }
        let (tid, saved) = (c.tid, c.ap.tid);
        c.tid = saved;
        let mad = c.format_mra(MessageRef::Other, st);
        c.tid = tid;
        let mad = mad.ok_or(CmError::InvalidParam("mra"))?;
        c.ap.state = LapState::MraLapSent;
        c.ap.mra = Some(Box::new(mad));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    pub(crate) fn on_lap(&mut self, src: CmPath, tid: u64, x: LapRepr) {
        let Some(h) = self.find(x.remote_comm_id, Some(x.local_comm_id), &src) else {
            // Nothing by that id: tell the sender (APR 1), as a REJ answers an unknown REP.
            self.stats.unmatched += 1;
            let apr = AprRepr {
                local_comm_id: x.remote_comm_id,
                remote_comm_id: x.local_comm_id,
                additional_information_length: 0,
                ap_status: ApStatus::InvalidCommId,
                additional_information: [0; 72],
                private_data: [0; APR_PRIVATE_DATA_LEN],
            };
            if let Some(m) = emit(tid, CmMessage::Apr(apr)) {
                self.transmit.push_back((src, m));
            }
            return;
        };
        let Some(c) = self.conn_mut(h) else { return };
        if c.state != CmState::Established {
            self.stats.unmatched += 1;
            return;
        }
        let to = c.path;
        let again = match c.ap.state {
            LapState::Idle if c.ap.tid == tid && c.ap.last_apr.is_some() => {
                c.ap.last_apr.as_deref().copied()
            }
            LapState::Idle => {
                c.ap.state = LapState::LapRcvd;
                c.ap.tid = tid;
                c.ap.pending = Some(x.alternate_path);
                c.ap.last_apr = None;
                self.ap_events.push_back(ApEvent::LapReceived {
                    conn: h,
                    alternate_path: x.alternate_path,
                    private_data: x.private_data.to_vec(),
                });
                return;
            }
            LapState::LapRcvd if c.ap.tid == tid => None,
            LapState::MraLapSent if c.ap.tid == tid => c.ap.mra.as_deref().copied(),
            // crossing LAPs or a new LAP while one is open: dropped, as Linux does
            _ => {
                self.stats.unmatched += 1;
                return;
            }
        };
        self.stats.duplicates += 1;
        if let Some(m) = again {
            self.transmit.push_back((to, m));
        }
    }

    pub(crate) fn on_apr(&mut self, src: CmPath, x: AprRepr) {
        let Some(h) = self.find(x.remote_comm_id, Some(x.local_comm_id), &src) else {
            self.stats.unmatched += 1;
            return;
        };
        let Some(c) = self.conn_mut(h) else { return };
        if c.state != CmState::Established
            || !matches!(c.ap.state, LapState::LapSent | LapState::MraLapRcvd)
        {
            // a duplicate APR, or one for no LAP of ours
            self.stats.duplicates += 1;
            return;
        }
        c.ap.state = LapState::Idle;
        c.retx = None;
        if x.ap_status == ApStatus::Success {
            c.ap.alt = c.ap.pending;
        }
        c.ap.pending = None;
        let len = (x.additional_information_length as usize).min(72);
        self.ap_events.push_back(ApEvent::AprReceived {
            conn: h,
            status: x.ap_status,
            additional_information: x.additional_information[..len].to_vec(),
            private_data: x.private_data.to_vec(),
        });
    }

    /// An MRA for our LAP (`message_mraed` = other). Returns false if it is not one.
    pub(crate) fn on_mra_lap(
        &mut self,
        now: Nanos,
        src: CmPath,
        remote: u32,
        local: u32,
        st: IbaTime,
    ) -> bool {
        let Some(h) = self.find(remote, Some(local), &src) else {
            return false;
        };
        let Some(c) = self.conn_mut(h) else {
            return false;
        };
        match (c.state, c.ap.state) {
            (CmState::Established, LapState::LapSent) => {
                let wait = super::timers::peer_mra_ns(st, c.plt);
                if let Some(r) = c.retx.as_mut() {
                    r.extend(now, wait);
                }
                c.ap.state = LapState::MraLapRcvd;
                self.ap_events.push_back(ApEvent::MraLapReceived {
                    conn: h,
                    service_timeout: st,
                });
                true
            }
            (CmState::Established, LapState::MraLapRcvd) => {
                self.stats.duplicates += 1;
                true
            }
            _ => false,
        }
    }

    /// The LAP's last retry expired (called by the timer code for an ESTABLISHED
    /// connection whose retransmission ran out).
    pub(crate) fn lap_timed_out(&mut self, h: ConnHandle) {
        let Some(c) = self.conn_mut(h) else { return };
        if matches!(c.ap.state, LapState::LapSent | LapState::MraLapRcvd) {
            c.ap.state = LapState::Idle;
            c.ap.pending = None;
            if !c.destroyed {
                self.ap_events.push_back(ApEvent::LapTimeout { conn: h });
            }
        }
    }
}
