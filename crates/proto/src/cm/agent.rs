//! The agent: API calls, queues, timers.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use rdma_wire::cm::{
    CmMessage, CmPathRepr, MessageRef, RejectReason, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr,
    SidrStatus, REJ_ARI_LEN, REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN,
    SIDR_REP_ADDITIONAL_INFORMATION_LEN, SIDR_REP_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN,
};

use super::conn::{emit, pad_checked, Conn, MadBuf};
use super::pace::ReqSlot;
use super::rng::IdRng;
use super::timers::{cm_ns, request_timeout, Retx};
use super::{
    AgentConfig, CmError, CmEvent, CmPath, CmState, CmTransmit, ConnHandle, Nanos, RepParams,
    ReqParams, SidrRepParams, SidrReqParams,
};

/// Counters of what the agent dropped or repeated (for tests and monitoring).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs that did not parse (length, class, attribute, field values).
    pub malformed: u64,
    /// Well-formed MADs that matched no connection in a state that accepts them.
    pub unmatched: u64,
    /// Duplicates recognised (answered again or dropped).
    pub duplicates: u64,
    /// REQs dropped or rejected by the resource limits.
    pub overload: u64,
    /// Retransmissions of REQ, REP, DREQ and SIDR_REQ.
    pub retransmits: u64,
    /// Of those, REQs and DREQs resent early ([`AgentConfig::early_resends`]).
    pub early_retransmits: u64,
    /// REQs resent after a REJ "invalid service id" and SIDR_REQs after a SIDR_REP "service
    /// id not supported" ([`AgentConfig::no_listener_retry`]).
    pub refused_resends: u64,
    /// REQs that waited for a slot of their peer's window before being sent
    /// ([`AgentConfig::req_window`]).
    pub paced: u64,
    /// Destroyed connections dropped before their timewait ended, to make room for a new
    /// connection at [`AgentConfig::max_conns`].
    pub timewait_evicted: u64,
}

/// The IB CM of one port: every listener and connection, sans IO.
///
/// See the [module documentation](super) for a complete handshake. In short:
/// inputs are [`CmAgent::handle_mad`], [`CmAgent::handle_timeout`] and the API calls;
/// outputs are [`CmAgent::poll_transmit`], [`CmAgent::poll_event`] and
/// [`CmAgent::poll_timeout`]. Call the three `poll_*` after every input.
///
/// ```
/// use rdma_proto::cm::{AgentConfig, CmAgent, CmEvent, CmPath, ReqParams};
/// let peer = CmPath::new("::ffff:192.0.2.1".parse().unwrap(), "::ffff:192.0.2.3".parse().unwrap(), 1);
/// // Without the retry jitter and the early resends, Linux's timings exactly.
/// let linux = AgentConfig { seed: 42, retry_jitter: false, early_resends: 0, ..AgentConfig::default() };
/// let mut a = CmAgent::new(linux);
/// let conn = a.send_req(0, ReqParams::new(0x1061b58, peer, 0x11, 0x1234)).unwrap();
/// assert!(a.poll_transmit().is_some());
/// // Nobody answers: the REQ is resent every 4.608 s, 15 times, then ReqTimeout.
/// let mut now = 0;
/// let mut sent = 1;
/// while let Some(t) = a.poll_timeout() {
///     now = t;
///     a.handle_timeout(now);
///     while a.poll_transmit().is_some() { sent += 1; }
/// }
/// assert_eq!(sent, 16);
/// assert_eq!(a.poll_event(), Some(CmEvent::ReqTimeout { conn }));
/// assert_eq!(now, 16 * 4_608_000_000);
/// ```
#[derive(Debug)]
pub struct CmAgent {
    pub(crate) config: AgentConfig,
    pub(crate) rng: IdRng,
    pub(crate) conns: BTreeMap<ConnHandle, Conn>,
    pub(crate) by_local_id: HashMap<u32, ConnHandle>,
    /// Peer's comm id → connections holding it (any state; callers check the rest).
    /// The key comes from the network (attacker-chosen): SipHash, std's default.
    pub(crate) by_remote_id: HashMap<u32, Vec<ConnHandle>>,
    /// Peer's QPN → connections holding it (any state). Network-chosen key: SipHash.
    pub(crate) by_remote_qpn: HashMap<u32, Vec<ConnHandle>>,
    /// Every connection's next deadline ([`Conn::deadline`]), earliest first.
    pub(crate) timers: BTreeSet<(Nanos, ConnHandle)>,
    /// Connections changed since their deadline was last put in `timers`
    /// (see [`CmAgent::sync_timers`]).
    pub(crate) touched: Vec<ConnHandle>,
    pub(crate) listeners: BTreeMap<u64, ()>,
    pub(crate) transmit: VecDeque<(CmPath, MadBuf)>,
    pub(crate) events: VecDeque<CmEvent>,
    /// Alternate path events ([`CmAgent::poll_ap_event`]).
    pub(crate) ap_events: VecDeque<super::ApEvent>,
    pub(crate) next_handle: u64,
    pub(crate) tid_high: u32,
    pub(crate) tid_counter: u32,
    pub(crate) stats: CmStats,
    /// Top byte of every local comm id minted, when set ([`CmAgent::set_comm_id_slot`]).
    pub(crate) id_slot: Option<u8>,
    /// REQ windows and half-open counts ([`super::pace`]).
    pub(crate) pacing: super::pace::Pacing,
    /// When peers were last heard from (the early resends).
    pub(crate) heard: super::heard::Heard,
}

impl CmAgent {
    /// A new agent with no listener and no connection.
    pub fn new(config: AgentConfig) -> Self {
        let mut rng = IdRng::new(config.seed);
        let tid_high = rng.next_u32();
        CmAgent {
            config,
            rng,
            conns: BTreeMap::new(),
            by_local_id: HashMap::new(),
            by_remote_id: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            timers: BTreeSet::new(),
            touched: Vec::new(),
            listeners: BTreeMap::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            ap_events: VecDeque::new(),
            next_handle: 1,
            tid_high,
            tid_counter: 0,
            stats: CmStats::default(),
            id_slot: None,
            pacing: Default::default(),
            heard: Default::default(),
        }
    }

    /// Mints every later local comm id with `slot` in its top byte: the soft device's slot
    /// among the processes sharing an address, by which their steering finds the owner of
    /// a CM message (it carries our comm id).
    pub fn set_comm_id_slot(&mut self, slot: u8) {
        self.id_slot = Some(slot);
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Counters of dropped and repeated MADs.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// A random 24-bit starting PSN from the agent's PRNG (as `rdma_cm`'s random `seq_num`).
    pub fn random_psn(&mut self) -> u32 {
        self.rng.next_u32() & 0x00ff_ffff
    }

    /// The state of a connection (`None` if unknown or destroyed).
    pub fn state(&self, conn: ConnHandle) -> Option<CmState> {
        self.conns
            .get(&conn)
            .filter(|c| !c.destroyed)
            .map(|c| c.state)
    }

    /// Our communication id for a connection (the request id for SIDR).
    pub fn local_comm_id(&self, conn: ConnHandle) -> Option<u32> {
        self.live(conn).map(|c| c.local_id)
    }

    /// The live connection whose communication id (SIDR: request id) is `id`, if any.
    /// A map lookup, unlike scanning every connection with [`CmAgent::local_comm_id`].
    pub fn conn_by_local_comm_id(&self, id: u32) -> Option<ConnHandle> {
        let h = *self.by_local_id.get(&id)?;
        self.live(h).map(|c| c.handle)
    }

    /// The path a connection's MADs take.
    pub fn path(&self, conn: ConnHandle) -> Option<CmPath> {
        self.live(conn).map(|c| c.path)
    }

    /// Sets the traffic class of a connection's later MADs (e.g. a passive SIDR id that
    /// takes its listener's TOS). `EINVAL` for an unknown connection.
    pub fn set_traffic_class(
        &mut self,
        conn: ConnHandle,
        traffic_class: u8,
    ) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        c.path.traffic_class = traffic_class;
        Ok(())
    }

    /// The peer's communication id for a connection (0 until known).
    pub fn remote_comm_id(&self, conn: ConnHandle) -> Option<u32> {
        self.live(conn).map(|c| c.remote_id)
    }

    /// How many connections the agent holds (destroyed ones still in timewait included).
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Starts accepting REQs and SIDR_REQs for `service_id`.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        self.listeners.insert(service_id, ());
        Ok(())
    }

    /// Stops listening. Connections that came through the listener are not affected.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listeners
            .remove(&service_id)
            .map(|_| ())
            .ok_or(CmError::NotListening(service_id))
    }

    /// The next MAD to send and where to send it (to QP1 of the peer).
    pub fn poll_transmit(&mut self) -> Option<CmTransmit> {
        self.transmit
            .pop_front()
            .map(|(path, mad)| CmTransmit { path, mad })
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`CmAgent::handle_timeout`] must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        if self.touched.is_empty() {
            // The earliest entry of the deadline index: O(log n), not a scan.
            self.timers.first().map(|&(d, _)| d)
        } else {
            // Not synced (every public `&mut self` method syncs before it returns, so this is
            // only a safety net): the scan is always right.
            self.conns.values().filter_map(Conn::deadline).min()
        }
    }

    /// Runs every timer due at `now`: retransmissions, CM timeouts, timewait ends.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.pacing.saw(now);
        self.sync_timers();
        let mut due: Vec<ConnHandle> = self
            .timers
            .iter()
            .take_while(|&&(d, _)| d <= now)
            .map(|&(_, h)| h)
            .collect();
        // In handle order, as the scan of `conns` did.
        due.sort_unstable();
        for h in due {
            self.conn_timeout(now, h);
        }
        self.sync_timers();
    }

    fn conn_timeout(&mut self, now: Nanos, h: ConnHandle) {
        let mut lap_timeout = false;
        // An early resend only to a peer silent since the send: one that answered other
        // messages meanwhile is busy, not losing them (a storm), and gets the regular wait.
        let busy = self
            .conns
            .get(&h)
            .and_then(|c| c.retx.as_ref())
            .is_some_and(|r| {
                r.early > 0 && self.heard.last(r.to.remote_gid).is_some_and(|t| t > r.sent)
            });
        let Some(c) = self.conn_mut(h) else {
            return;
        };
        if let Some(r) = c.retx.as_mut().filter(|r| r.deadline <= now) {
            if r.restart {
                // refused for want of a listener: the same (SIDR_)REQ again, its waits afresh
                r.restart = false;
                r.start(now);
                let item = (r.to, *r.mad);
                self.transmit.push_back(item);
                self.stats.refused_resends += 1;
            } else if busy {
                r.skip_early();
            } else if let Some(early) = r.take_resend(now) {
                let item = (r.to, *r.mad);
                self.transmit.push_back(item);
                self.stats.retransmits += 1;
                self.stats.early_retransmits += u64::from(early);
            } else {
                let event = match c.state {
                    CmState::ReqSent | CmState::MraReqRcvd => {
                        c.reset_to_idle();
                        Some(CmEvent::ReqTimeout { conn: h })
                    }
                    CmState::RepSent | CmState::MraRepRcvd => {
                        c.reset_to_idle();
                        Some(CmEvent::RepTimeout { conn: h })
                    }
                    CmState::DreqSent => {
                        c.enter_timewait(now);
                        Some(CmEvent::DreqTimeout { conn: h })
                    }
                    CmState::SidrReqSent => {
                        c.reset_to_idle();
                        Some(CmEvent::SidrReqTimeout { conn: h })
                    }
                    CmState::Established => {
                        c.retx = None;
                        lap_timeout = true;
                        None
                    }
                    _ => {
                        c.retx = None;
                        None
                    }
                };
                if let Some(e) = event {
                    self.emit_event(e);
                }
            }
        }
        if lap_timeout {
            self.lap_timed_out(h);
        }
        let Some(c) = self.conn_mut(h) else {
            return;
        };
        if c.timewait_deadline.is_some_and(|d| d <= now) {
            c.timewait_deadline = None;
            if c.state == CmState::Timewait {
                c.state = CmState::Idle;
                if c.destroyed {
                    self.remove(h);
                } else {
                    self.emit_event(CmEvent::TimewaitExit { conn: h });
                }
            }
        }
    }

    /// Sends a REQ: a new active connection in REQ_SENT, resent every
    /// `2·PLT + remote CM response timeout` up to `max_cm_retries` times (after the early
    /// resends of [`AgentConfig::early_resends`]).
    ///
    /// Errors: private data over 92 bytes, fields wider than the wire allows, too many
    /// connections.
    pub fn send_req(&mut self, now: Nanos, p: ReqParams) -> Result<ConnHandle, CmError> {
        let jitter = self.config.retry_jitter;
        let early = self.config.early_resends;
        if self.full() {
            return Err(CmError::TooManyConnections);
        }
        let private_data = pad_checked::<REQ_PRIVATE_DATA_LEN>(&p.private_data)?;
        if p.max_cm_retries > 15 {
            return Err(CmError::InvalidParam("max_cm_retries"));
        }
        let alt = p.alternate_path.as_ref().map(super::lap::path_repr);
        let local_id = self.alloc_local_id();
        let tid = self.new_tid();
        let path = CmPathRepr {
            local_port_lid: p.path.local_lid,
            remote_port_lid: p.path.remote_lid,
            local_port_gid: p.path.local_gid,
            remote_port_gid: p.path.remote_gid,
            flow_label: p.path.flow_label,
            packet_rate: p.path.packet_rate,
            traffic_class: p.path.traffic_class,
            hop_limit: p.path.hop_limit,
            sl: p.path.sl,
            subnet_local: false,
            local_ack_timeout: p.path.local_ack_timeout,
        };
        let req = ReqRepr {
            local_comm_id: local_id,
            service_id: p.service_id,
            local_ca_guid: self.config.ca_guid,
            local_q_key: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport_service_type: p.transport_service_type,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            partition_key: p.partition_key,
            path_packet_payload_mtu: p.path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: alt.unwrap_or_default(),
            sap_supported: false,
            private_data,
        };
        let mad = emit(tid, CmMessage::Req(req)).ok_or(CmError::InvalidParam("req field"))?;
        if early > 0 {
            self.heard.watch(p.cm_path.remote_gid, now);
        }
        let timeout = request_timeout(p.path.packet_life_time, p.remote_cm_response_timeout);
        let ap = super::lap::Ap {
            alt,
            ..Default::default()
        };
        let h = self.alloc_handle();
        let conn = Conn {
            handle: h,
            state: CmState::ReqSent,
            local_id,
            remote_id: 0,
            remote_ca_guid: 0,
            path: p.cm_path,
            service_id: p.service_id,
            listener: None,
            local_qpn: p.local_qpn,
            remote_qpn: 0,
            tid,
            retx: Some(
                Retx::new(mad, p.cm_path, now, timeout, p.max_cm_retries, jitter)
                    .with_early(now, early),
            ),
            response_timeout: timeout,
            max_cm_retries: p.max_cm_retries,
            plt: p.path.packet_life_time,
            timewait: cm_ns(p.path.local_ack_timeout),
            timewait_deadline: None,
            last_response: None,
            destroyed: false,
            scheduled: None,
            slot: Default::default(),
            half_open: false,
            ap,
        };
        self.pacing.saw(now);
        let slot = self
            .pacing
            .admit(p.cm_path.remote_gid, self.config.req_window, h);
        self.insert(Conn { slot, ..conn });
        if slot == ReqSlot::Flying {
            self.transmit.push_back((p.cm_path, mad));
        } else {
            self.stats.paced += 1;
        }
        Ok(h)
    }

    /// Accepts a passive connection: sends the REP (REQ_RCVD / MRA_REQ_SENT → REP_SENT), resent
    /// every `cm_convert_to_ms(REQ's local CM response timeout)` (as Linux) until the RTU.
    pub fn send_rep(&mut self, now: Nanos, conn: ConnHandle, p: RepParams) -> Result<(), CmError> {
        let jitter = self.config.retry_jitter;
        let ca_guid = self.config.ca_guid;
        let c = self.live_mut(conn)?;
        if !matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent) {
            return Err(CmError::InvalidState {
                op: "send_rep",
                state: c.state,
            });
        }
        let rep = RepRepr {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            local_q_key: 0,
            local_qpn: p.local_qpn,
            local_ee_context_number: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data: pad_checked::<REP_PRIVATE_DATA_LEN>(&p.private_data)?,
        };
        let mad = emit(c.tid, CmMessage::Rep(rep)).ok_or(CmError::InvalidParam("rep field"))?;
        c.local_qpn = p.local_qpn;
        if p.failover_accepted != 0 {
            c.ap.alt = None;
        }
        c.state = CmState::RepSent;
        c.last_response = None;
        c.retx = Some(Retx::new(
            mad,
            c.path,
            now,
            c.response_timeout,
            c.max_cm_retries,
            jitter,
        ));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    /// Completes an active connection after its QP is in RTS: sends the RTU
    /// (REP_RCVD / MRA_REP_SENT → ESTABLISHED) and reports [`CmEvent::Established`].
    /// A duplicate REP is answered with this RTU again.
    pub fn send_rtu(&mut self, _now: Nanos, conn: ConnHandle) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        if !matches!(c.state, CmState::RepRcvd | CmState::MraRepSent) {
            return Err(CmError::InvalidState {
                op: "send_rtu",
                state: c.state,
            });
        }
        let mad = c.format_rtu(&[])?;
        c.state = CmState::Established;
        c.last_response = Some(Box::new(mad));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.emit_event(CmEvent::Established { conn });
        self.sync_timers();
        Ok(())
    }

    /// Passive side: the QP saw traffic before the RTU (Linux `ib_cm_notify(COMM_EST)`):
    /// REP_SENT / MRA_REP_RCVD → ESTABLISHED, reported as [`CmEvent::Established`].
    pub fn establish(&mut self, conn: ConnHandle) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        if !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) {
            return Err(CmError::InvalidState {
                op: "establish",
                state: c.state,
            });
        }
        c.retx = None;
        c.state = CmState::Established;
        self.emit_event(CmEvent::Established { conn });
        self.sync_timers();
        Ok(())
    }

    /// Rejects: sends a REJ with `reason`, ARI (≤ 72 bytes) and private data (≤ 148 bytes).
    /// Before the REP exchange the connection goes to IDLE, after it (REP_SENT, MRA_REP_RCVD)
    /// to TIMEWAIT, as Linux's `ib_send_cm_rej`. `rdma_reject` uses reason 28.
    pub fn send_rej(
        &mut self,
        now: Nanos,
        conn: ConnHandle,
        reason: RejectReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if ari.len() > REJ_ARI_LEN {
            return Err(CmError::InvalidParam("ari longer than 72 bytes"));
        }
        if private_data.len() > REJ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                max: REJ_PRIVATE_DATA_LEN,
                len: private_data.len(),
            });
        }
        let c = self.live_mut(conn)?;
        let mad = c.format_rej(reason, ari, private_data);
        match c.state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepRcvd
            | CmState::MraRepSent => c.reset_to_idle(),
            CmState::RepSent | CmState::MraRepRcvd => c.enter_timewait(now),
            state => {
                return Err(CmError::InvalidState {
                    op: "send_rej",
                    state,
                })
            }
        }
        let to = c.path;
        if let Some(mad) = mad {
            self.transmit.push_back((to, mad));
        }
        self.sync_timers();
        Ok(())
    }

    /// Sends an MRA now for the REQ (REQ_RCVD → MRA_REQ_SENT) or REP (REP_RCVD →
    /// MRA_REP_SENT) we received, with [`AgentConfig::mra_service_timeout`]; duplicates of
    /// that message are answered with it again. In MRA_REQ_SENT / MRA_REP_SENT (a prepared,
    /// delayed MRA) it sends the MRA now.
    pub fn send_mra(&mut self, conn: ConnHandle) -> Result<(), CmError> {
        let st = self.config.mra_service_timeout;
        let c = self.live_mut(conn)?;
        let what = match c.state {
            CmState::ReqRcvd | CmState::MraReqSent => {
                c.state = CmState::MraReqSent;
                MessageRef::Req
            }
            CmState::RepRcvd | CmState::MraRepSent => {
                c.state = CmState::MraRepSent;
                MessageRef::Rep
            }
            state => {
                return Err(CmError::InvalidState {
                    op: "send_mra",
                    state,
                })
            }
        };
        let to = c.path;
        if let Some(mad) = c.format_mra(what, st) {
            self.transmit.push_back((to, mad));
        }
        self.sync_timers();
        Ok(())
    }

    /// Disconnects: sends a DREQ (ESTABLISHED → DREQ_SENT) with a new transaction id, resent
    /// until the DREP; after the last retry, [`CmEvent::DreqTimeout`] and TIMEWAIT.
    pub fn send_dreq(
        &mut self,
        now: Nanos,
        conn: ConnHandle,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let jitter = self.config.retry_jitter;
        let early = self.config.early_resends;
        let tid = self.new_tid();
        let c = self.live_mut(conn)?;
        if c.state != CmState::Established {
            return Err(CmError::InvalidState {
                op: "send_dreq",
                state: c.state,
            });
        }
        let old_tid = c.tid;
        c.tid = tid;
        // a LAP in progress is abandoned: the DREQ takes its retransmission slot
        c.ap.state = super::LapState::Idle;
        c.ap.pending = None;
        let mad = match c.format_dreq(private_data) {
            Ok(m) => m,
            Err(e) => {
                c.tid = old_tid;
                return Err(e);
            }
        };
        c.state = CmState::DreqSent;
        let peer = c.path.remote_gid;
        c.retx = Some(
            Retx::new(
                mad,
                c.path,
                now,
                c.response_timeout,
                c.max_cm_retries,
                jitter,
            )
            .with_early(now, early),
        );
        let to = c.path;
        if early > 0 {
            self.heard.watch(peer, now);
        }
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    /// Answers a DREQ: sends the DREP (DREQ_RCVD → TIMEWAIT). A duplicate DREQ during the
    /// timewait gets this DREP again.
    pub fn send_drep(
        &mut self,
        now: Nanos,
        conn: ConnHandle,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        if c.state != CmState::DreqRcvd {
            return Err(CmError::InvalidState {
                op: "send_drep",
                state: c.state,
            });
        }
        let mad = c.format_drep(private_data)?;
        c.enter_timewait(now);
        c.last_response = Some(Box::new(mad));
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    /// `rdma_disconnect`: a DREQ if established, else the DREP if a DREQ was received.
    pub fn disconnect(&mut self, now: Nanos, conn: ConnHandle) -> Result<(), CmError> {
        match self.live(conn).map(|c| c.state) {
            Some(CmState::DreqRcvd) => self.send_drep(now, conn, &[]),
            // The passive side before the RTU (late or lost): its QP has been in RTS since
            // the REP and the application ran the connection, which is what Linux notes as
            // communication established (`ib_cm_notify(COMM_EST)`); then the DREQ, which the
            // active side (established since it sent the RTU) answers. Linux's
            // `rdma_disconnect` does not fail here either.
            Some(CmState::RepSent | CmState::MraRepRcvd) => {
                self.establish(conn)?;
                self.send_dreq(now, conn, &[])
            }
            _ => self.send_dreq(now, conn, &[]),
        }
    }

    /// Destroys a connection, with Linux's `cm_destroy_id` side effects:
    /// REQ_SENT / MRA_REQ_RCVD → REJ 4 (timeout) with ARI = our CA GUID;
    /// REQ_RCVD, MRA_REQ_SENT, REP_RCVD, MRA_REP_SENT → REJ 28;
    /// REP_SENT / MRA_REP_RCVD → REJ 28 and a silent timewait;
    /// ESTABLISHED → one DREQ (not retried) and a silent timewait;
    /// DREQ_SENT → silent timewait; DREQ_RCVD → DREP and silent timewait;
    /// TIMEWAIT → silent until it ends; SIDR_REQ_RCVD → SIDR_REP "reject".
    /// The handle is invalid afterwards; no event is reported for it.
    pub fn destroy(&mut self, now: Nanos, conn: ConnHandle) -> Result<(), CmError> {
        let guid = self.config.ca_guid;
        self.live_mut(conn)?;
        let dreq_tid = self.new_tid();
        let c = self.live_mut(conn)?;
        let mut out = None;
        let mut linger = false;
        match c.state {
            // A parked REQ was never sent: nobody to tell.
            CmState::ReqSent if c.slot == ReqSlot::Parked => {}
            CmState::ReqSent | CmState::MraReqRcvd => {
                out = c.format_rej(RejectReason::Timeout, &guid.to_be_bytes(), &[]);
            }
            CmState::ReqRcvd | CmState::MraReqSent | CmState::RepRcvd | CmState::MraRepSent => {
                out = c.format_rej(RejectReason::ConsumerDefined, &[], &[]);
            }
            CmState::RepSent | CmState::MraRepRcvd => {
                out = c.format_rej(RejectReason::ConsumerDefined, &[], &[]);
                c.enter_timewait(now);
                linger = true;
            }
            CmState::Established => {
                c.tid = dreq_tid;
                out = c.format_dreq(&[]).ok();
                c.enter_timewait(now);
                linger = true;
            }
            CmState::DreqSent => {
                c.enter_timewait(now);
                linger = true;
            }
            CmState::DreqRcvd => {
                out = c.format_drep(&[]).ok();
                c.enter_timewait(now);
                linger = true;
            }
            CmState::Timewait => linger = true,
            CmState::SidrReqRcvd => {
                let rep = SidrRepRepr {
                    request_id: c.remote_id,
                    status: SidrStatus::Reject,
                    additional_information_length: 0,
                    qpn: 0,
                    service_id: c.service_id,
                    q_key: 0,
                    additional_information: [0; SIDR_REP_ADDITIONAL_INFORMATION_LEN],
                    private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
                };
                out = emit(c.tid, CmMessage::SidrRep(rep));
            }
            CmState::Idle | CmState::Listen | CmState::SidrReqSent => {}
        }
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(CmError::UnknownConn(conn))?;
        let to = c.path;
        if linger {
            c.destroyed = true;
            c.last_response = None;
        }
        if let Some(m) = out {
            self.transmit.push_back((to, m));
        }
        if !linger {
            self.remove(conn);
        }
        self.sync_timers();
        Ok(())
    }

    /// Destroys a passive connection that received a REQ and has not answered it (REQ_RCVD,
    /// or MRA_REQ_SENT with the delayed MRA), sending nothing: the requester retries its REQ
    /// after its timeout, and the retry is a new request here. Linux's `cm_destroy_id`
    /// with `-ENOMEM` (a full listen backlog): "do not reject to allow future retries".
    /// Other states: [`CmError::InvalidState`], the connection is unchanged. The handle is
    /// invalid afterwards; no event is reported for it.
    pub fn destroy_silently(&mut self, conn: ConnHandle) -> Result<(), CmError> {
        let c = self.live_mut(conn)?;
        match c.state {
            CmState::ReqRcvd | CmState::MraReqSent => {}
            state => {
                return Err(CmError::InvalidState {
                    op: "destroy_silently",
                    state,
                })
            }
        }
        self.remove(conn);
        self.events.retain(|e| e.conn() != conn);
        self.sync_timers();
        Ok(())
    }

    /// Sends a SIDR_REQ: a new exchange in SIDR_SENT, resent every `timeout` up to
    /// `max_retries` times; answered by [`CmEvent::SidrRepReceived`] or
    /// [`CmEvent::SidrReqTimeout`].
    pub fn send_sidr_req(&mut self, now: Nanos, p: SidrReqParams) -> Result<ConnHandle, CmError> {
        let jitter = self.config.retry_jitter;
        if self.full() {
            return Err(CmError::TooManyConnections);
        }
        let private_data = pad_checked::<SIDR_REQ_PRIVATE_DATA_LEN>(&p.private_data)?;
        let local_id = self.alloc_local_id();
        let tid = self.new_tid();
        let req = SidrReqRepr {
            request_id: local_id,
            partition_key: p.partition_key,
            service_id: p.service_id,
            private_data,
        };
        let mad = emit(tid, CmMessage::SidrReq(req)).ok_or(CmError::InvalidParam("sidr_req"))?;
        let timeout = cm_ns(p.timeout);
        let h = self.alloc_handle();
        let conn = Conn {
            handle: h,
            state: CmState::SidrReqSent,
            local_id,
            remote_id: 0,
            remote_ca_guid: 0,
            path: p.cm_path,
            service_id: p.service_id,
            listener: None,
            local_qpn: 0,
            remote_qpn: 0,
            tid,
            retx: Some(Retx::new(
                mad,
                p.cm_path,
                now,
                timeout,
                p.max_retries,
                jitter,
            )),
            response_timeout: timeout,
            max_cm_retries: p.max_retries,
            plt: self.config.packet_life_time,
            timewait: 0,
            timewait_deadline: None,
            last_response: None,
            destroyed: false,
            scheduled: None,
            slot: Default::default(),
            half_open: false,
            ap: Default::default(),
        };
        self.insert(conn);
        self.transmit.push_back((p.cm_path, mad));
        Ok(h)
    }

    /// Answers a SIDR_REQ (SIDR_REQ_RCVD → IDLE).
    pub fn send_sidr_rep(&mut self, conn: ConnHandle, p: SidrRepParams) -> Result<(), CmError> {
        if p.additional_information.len() > SIDR_REP_ADDITIONAL_INFORMATION_LEN {
            return Err(CmError::InvalidParam(
                "additional information longer than 72 bytes",
            ));
        }
        let c = self.live_mut(conn)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::InvalidState {
                op: "send_sidr_rep",
                state: c.state,
            });
        }
        let rep = SidrRepRepr {
            request_id: c.remote_id,
            status: p.status,
            additional_information_length: p.additional_information.len() as u8,
            qpn: p.qpn,
            service_id: c.service_id,
            q_key: p.q_key,
            additional_information: pad_checked(&p.additional_information)?,
            private_data: pad_checked::<SIDR_REP_PRIVATE_DATA_LEN>(&p.private_data)?,
        };
        let mad = emit(c.tid, CmMessage::SidrRep(rep)).ok_or(CmError::InvalidParam("sidr_rep"))?;
        c.reset_to_idle();
        let to = c.path;
        self.transmit.push_back((to, mad));
        self.sync_timers();
        Ok(())
    }

    // ---- internals ----------------------------------------------------------------------

    pub(crate) fn live(&self, conn: ConnHandle) -> Option<&Conn> {
        self.conns.get(&conn).filter(|c| !c.destroyed)
    }

    pub(crate) fn live_mut(&mut self, conn: ConnHandle) -> Result<&mut Conn, CmError> {
        self.touched.push(conn);
        self.conns
            .get_mut(&conn)
            .filter(|c| !c.destroyed)
            .ok_or(CmError::UnknownConn(conn))
    }

    pub(crate) fn alloc_handle(&mut self) -> ConnHandle {
        let h = ConnHandle(self.next_handle);
        self.next_handle += 1;
        h
    }

    /// A random, non-zero communication id not in use.
    pub(crate) fn alloc_local_id(&mut self) -> u32 {
        loop {
            let mut id = self.rng.next_u32();
            if let Some(s) = self.id_slot {
                id = (u32::from(s) << 24) | (id & 0x00ff_ffff);
            }
            if id != 0 && !self.by_local_id.contains_key(&id) {
                return id;
            }
        }
    }

    /// A new transaction id: random high half per agent, counter in the low half.
    pub(crate) fn new_tid(&mut self) -> u64 {
        self.tid_counter = self.tid_counter.wrapping_add(1);
        (u64::from(self.tid_high) << 32) | u64::from(self.tid_counter)
    }

    /// A connection for changing: marked for [`CmAgent::sync_timers`].
    pub(crate) fn conn_mut(&mut self, h: ConnHandle) -> Option<&mut Conn> {
        self.touched.push(h);
        self.conns.get_mut(&h)
    }

    /// Puts the deadlines of the connections changed since the last call in `timers`.
    /// Every public `&mut self` method calls it before returning.
    /// It also settles the pacing: a connection that left REQ_SENT gives back its window
    /// slot (and the next parked REQ to that peer is sent), one that left REQ_RCVD /
    /// MRA_REQ_SENT stops counting as half open.
    pub(crate) fn sync_timers(&mut self) {
        loop {
            self.sync_touched();
            if !self.send_released() {
                return;
            }
        }
    }

    fn sync_touched(&mut self) {
        for h in std::mem::take(&mut self.touched) {
            let Some(c) = self.conns.get_mut(&h) else {
                continue;
            };
            if c.half_open && !c.state.is_passive_half_open() {
                c.half_open = false;
                self.pacing.close(c.listener, c.path.remote_gid);
            }
            if c.slot != ReqSlot::None && c.state != CmState::ReqSent {
                // A parked one can only leave REQ_SENT by a forged answer: it held no slot.
                if c.slot == ReqSlot::Flying {
                    self.pacing.release(c.path.remote_gid);
                }
                c.slot = ReqSlot::None;
            }
            let d = c.deadline();
            if d != c.scheduled {
                if let Some(old) = c.scheduled {
                    self.timers.remove(&(old, h));
                }
                if let Some(new) = d {
                    self.timers.insert((new, h));
                }
                c.scheduled = d;
            }
        }
    }

    /// Sends the parked REQs that released slots make room for. True if it sent any.
    fn send_released(&mut self) -> bool {
        let window = self.config.req_window;
        let now = self.pacing.now;
        let mut sent = false;
        for peer in std::mem::take(&mut self.pacing.released) {
            loop {
                let conns = &self.conns;
                let next = self.pacing.next_parked(peer, window, |h| {
                    conns.get(&h).is_some_and(|c| {
                        c.slot == ReqSlot::Parked && c.state == CmState::ReqSent && !c.destroyed
                    })
                });
                let Some(c) = next.and_then(|h| self.conns.get_mut(&h)) else {
                    break;
                };
                let h = c.handle;
                c.slot = ReqSlot::Flying;
                if let Some(r) = c.retx.as_mut() {
                    r.start(now);
                    self.transmit.push_back((r.to, *r.mad));
                }
                self.touched.push(h);
                sent = true;
            }
        }
        sent
    }

    pub(crate) fn insert(&mut self, mut conn: Conn) {
        let h = conn.handle;
        self.by_local_id.insert(conn.local_id, h);
        // Only connections that know their peer's ids are indexed by them: an active one
        // joins at its REP (`set_remote`), so thousands of REQs in flight do not share key 0.
        if conn.state.holds_remote() {
            self.by_remote_id.entry(conn.remote_id).or_default().push(h);
            self.by_remote_qpn
                .entry(conn.remote_qpn)
                .or_default()
                .push(h);
        }
        if conn.state.is_passive_half_open() {
            conn.half_open = true;
            self.pacing.open(conn.listener, conn.path.remote_gid);
        }
        conn.scheduled = conn.deadline();
        if let Some(d) = conn.scheduled {
            self.timers.insert((d, h));
        }
        self.conns.insert(h, conn);
    }

    /// Sets a connection's remote comm id and QPN, keeping the indexes.
    pub(crate) fn set_remote(&mut self, h: ConnHandle, remote_id: u32, remote_qpn: u32) {
        let Some(c) = self.conns.get_mut(&h) else {
            return;
        };
        let (old_id, old_qpn) = (c.remote_id, c.remote_qpn);
        c.remote_id = remote_id;
        c.remote_qpn = remote_qpn;
        unindex(&mut self.by_remote_id, old_id, h);
        unindex(&mut self.by_remote_qpn, old_qpn, h);
        self.by_remote_id.entry(remote_id).or_default().push(h);
        self.by_remote_qpn.entry(remote_qpn).or_default().push(h);
    }

    /// Whether the table is at [`AgentConfig::max_conns`] once a destroyed connection's
    /// timewait has made room: timewait only guards against stale packets, so the one
    /// ending first (among the earliest timers) is dropped rather than refusing a new
    /// connection.
    pub(crate) fn full(&mut self) -> bool {
        if self.conns.len() < self.config.max_conns {
            return false;
        }
        self.sync_timers();
        let victim = self.timers.iter().take(64).map(|&(_, h)| h).find(|h| {
            self.conns
                .get(h)
                .is_some_and(|c| c.destroyed && c.state == CmState::Timewait)
        });
        match victim {
            Some(h) => {
                self.stats.timewait_evicted += 1;
                self.remove(h);
                false
            }
            None => true,
        }
    }

    pub(crate) fn remove(&mut self, h: ConnHandle) {
        if let Some(c) = self.conns.remove(&h) {
            if c.half_open {
                self.pacing.close(c.listener, c.path.remote_gid);
            }
            if c.slot == ReqSlot::Flying {
                self.pacing.release(c.path.remote_gid);
            }
            if self.by_local_id.get(&c.local_id) == Some(&h) {
                self.by_local_id.remove(&c.local_id);
            }
            unindex(&mut self.by_remote_id, c.remote_id, h);
            unindex(&mut self.by_remote_qpn, c.remote_qpn, h);
            if let Some(d) = c.scheduled {
                self.timers.remove(&(d, h));
            }
        }
    }

    /// Queues an event unless its connection was destroyed.
    pub(crate) fn emit_event(&mut self, e: CmEvent) {
        if self.live(e.conn()).is_some() {
            self.events.push_back(e);
        }
    }
}

/// Removes `h` from the list under `key`, and the list if it becomes empty.
fn unindex(map: &mut HashMap<u32, Vec<ConnHandle>>, key: u32, h: ConnHandle) {
    if let Some(v) = map.get_mut(&key) {
        v.retain(|x| *x != h);
        if v.is_empty() {
            map.remove(&key);
        }
    }
}
