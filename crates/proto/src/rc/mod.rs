//! Reliable connected (RC) transport: one [`RcQp`] holds a requester (send queue, PSNs,
//! retransmission), a completer (ACKs, NAKs, READ responses, atomic ACKs) and a responder
//! (receive queue, execution of incoming requests, replay of duplicate READs and atomics).
//!
//! ```
//! use rdma_proto::memory::InMemoryTable;
//! use rdma_proto::rc::{RcConfig, RcQp};
//! use rdma_proto::verbs::{PdId, QpState};
//! let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
//! assert_eq!(qp.state(), QpState::Reset);
//! let mut mem = InMemoryTable::new(0, 4096);
//! let mut buf = [0u8; 4096];
//! assert!(qp.poll_transmit(0, &mut mem, &mut buf).is_none());
//! assert!(qp.poll_timeout().is_none());
//! ```
//!
//! See `tests/` and [`crate::sim`] for full exchanges between two QPs. A QP may have an
//! alternate path and migrate to it (IBA automatic path migration): see [`QpEvent`],
//! [`RcQp::migrate`] and [`RcQp::handle_packet_on`].

mod ack_req;
mod apm;
mod completer;
mod credit;
mod probe;
mod requester;
mod responder;

pub use apm::{MigrationCause, QpEvent};
pub use probe::PROBE_FLOOR_NS;

use crate::memory::MemoryTable;
use crate::packet::{Packet, Placement, Transmit};
use crate::verbs::{
    check_modify, Completion, ModifyError, PdId, PostError, QpAttr, QpAttrMask, QpState, QpType,
    RecvWr, SendWr, WcOpcode, WcStatus,
};
use std::collections::VecDeque;

pub(crate) use requester::SendWqe;
use responder::Responder;

/// Creation-time parameters of an RC QP (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConfig {
    /// This QP's number (24 bits).
    pub qpn: u32,
    /// Protection domain.
    pub pd: PdId,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Send window: a request packet is sent only while fewer than this many request PSNs
    /// before it are unacknowledged (PSNs from [`RcQp::oldest_unacked_psn`] up to the
    /// packet's). A READ request counts with the response PSNs it asks for once sent, but
    /// is never split: it goes out when the PSNs before it fit, however long it is. Responses
    /// (ACKs, READ responses, atomic ACKs) are never held back by the window. 0: no limit.
    pub max_outstanding_psns: u32,
}

impl RcConfig {
    /// Defaults: 128 send and receive WRs, 64 bytes inline, selective signaling, no send
    /// window limit.
    pub fn new(qpn: u32, pd: PdId) -> Self {
        RcConfig {
            qpn,
            pd,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_inline_data: 64,
            sq_sig_all: false,
            max_outstanding_psns: 0,
        }
    }
}

/// Counters for tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RcStats {
    /// Request packets sent (including retransmissions).
    pub req_packets_sent: u64,
    /// Request packets resent by go-back-N, timeouts or the probe timer.
    pub retransmitted: u64,
    /// Local ACK timer expiries.
    pub timeouts: u64,
    /// Probe timer expiries that resent something before the local ACK timeout (see
    /// [`PROBE_FLOOR_NS`]; they charge no retry).
    pub tail_probes: u64,
    /// Of [`retransmitted`](Self::retransmitted), request packets resent by the probe timer.
    pub early_retransmits: u64,
    /// Of [`tail_probes`](Self::tail_probes), those found spurious: the peer acknowledged
    /// the original too, it was late, not lost (each raises the QP's probe floor; see
    /// [`RcQp::probe_floor_ns`]).
    pub spurious_probes: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_received: u64,
    /// Responses (ACK, READ response, atomic ACK) sent.
    pub responses_sent: u64,
    /// Duplicate requests seen by the responder.
    pub duplicates: u64,
    /// Packets dropped (out of sequence after a NAK, stale, malformed, wrong state).
    pub dropped: u64,
    /// NAKs sent (any kind).
    pub naks_sent: u64,
    /// Last packets resent to ask for an ACK that unsignaled messages did not ask for.
    pub ack_probes: u64,
    /// RDMA WRITEs and SENDs sent for the responder to copy from this process's memory
    /// ([`RcQp::set_pull_min`]).
    pub pulls_sent: u64,
    /// RDMA WRITEs and SENDs this responder copied from the sender's memory.
    pub pulls_done: u64,
    /// Pulled WRITEs and SENDs whose source this responder could not read: it asked for them again
    /// (PSN sequence NAK) and they came inline.
    pub pull_failures: u64,
    /// Times a SEND (or RDMA WRITE with immediate) waited for the peer's credits (see
    /// [`RcQp::set_credits`]).
    pub credit_waits: u64,
    /// Credit updates this responder sent: an ACK, unsolicited, when a receive was posted
    /// after it refused a message with an RNR NAK (`credit.rs`).
    pub credit_updates_sent: u64,
    /// RNR waits this requester ended early: the peer's credit update said a receive is
    /// posted (`credit.rs`).
    pub rnr_waits_cut: u64,
}

/// Local ACK timeout in nanoseconds for the 5-bit exponent (`None`: infinite).
///
/// ```
/// assert_eq!(rdma_proto::rc::ack_timeout_ns(0), None);
/// assert_eq!(rdma_proto::rc::ack_timeout_ns(14), Some(67_108_864));
/// ```
pub fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << (timeout.min(31) as u32))
    }
}

/// RNR NAK timer in nanoseconds for the 5-bit code (IBA table 45; code 0 is 655.36 ms).
///
/// ```
/// assert_eq!(rdma_proto::rc::rnr_timer_ns(0), 655_360_000);
/// assert_eq!(rdma_proto::rc::rnr_timer_ns(1), 10_000);
/// assert_eq!(rdma_proto::rc::rnr_timer_ns(31), 491_520_000);
/// ```
pub fn rnr_timer_ns(code: u8) -> u64 {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    US[(code & 0x1F) as usize] as u64 * 1000
}

/// A reliable connected queue pair: sans-IO state machine.
///
/// Drive it with [`post_send`](Self::post_send), [`post_recv`](Self::post_recv),
/// [`handle_packet`](Self::handle_packet), [`poll_transmit`](Self::poll_transmit),
/// [`poll_timeout`](Self::poll_timeout) / [`handle_timeout`](Self::handle_timeout), and collect
/// completions with [`poll_send_completion`](Self::poll_send_completion) and
/// [`poll_recv_completion`](Self::poll_recv_completion). Time is a monotonic `u64` in
/// nanoseconds chosen by the caller.
#[derive(Debug)]
pub struct RcQp {
    cfg: RcConfig,
    state: QpState,
    attr: QpAttr,
    // requester / completer
    sq: VecDeque<SendWqe>,
    inline_buf: Vec<u8>,
    next_seq: u64,
    req_idx: usize,
    req_off: u32,
    next_psn: u32,
    comp_psn: u32,
    rd_atomic_inflight: u32,
    retry_left: u8,
    rnr_left: u8,
    retrans_deadline: Option<u64>,
    rnr_until: Option<u64>,
    gbn_guard: Option<(u32, u32)>,
    ask: ack_req::AckAsk,
    probe: probe::Probe,
    credit: credit::Credits,
    send_cq: VecDeque<Completion>,
    // responder
    resp: Responder,
    recv_cq: VecDeque<Completion>,
    turn: bool,
    stats: RcStats,
    apm: apm::Apm,
    /// WRITEs this long or longer go as pulls ([`RcQp::set_pull_min`]).
    pull_min: Option<u32>,
    /// Rewinds that resent pulled WRITEs with their data.
    pull_reverts: u32,
}

impl RcQp {
    /// A QP in the Reset state.
    pub fn new(cfg: RcConfig) -> Self {
        let sq_cap = cfg.max_send_wr.max(1) as usize;
        let rq_cap = cfg.max_recv_wr.max(1) as usize;
        RcQp {
            cfg,
            state: QpState::Reset,
            attr: QpAttr::default(),
            sq: VecDeque::with_capacity(sq_cap),
            inline_buf: vec![0; sq_cap * cfg.max_inline_data as usize],
            next_seq: 0,
            req_idx: 0,
            req_off: 0,
            next_psn: 0,
            comp_psn: 0,
            rd_atomic_inflight: 0,
            retry_left: 0,
            rnr_left: 0,
            retrans_deadline: None,
            rnr_until: None,
            gbn_guard: None,
            ask: ack_req::AckAsk::default(),
            probe: probe::Probe::default(),
            credit: credit::Credits::default(),
            send_cq: VecDeque::with_capacity(sq_cap),
            resp: Responder::new(rq_cap),
            recv_cq: VecDeque::with_capacity(rq_cap),
            turn: false,
            stats: RcStats::default(),
            apm: apm::Apm::default(),
            pull_min: None,
            pull_reverts: 0,
        }
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// This QP's number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }
    /// The local ACK timeout exponent (`ibv_qp_attr::timeout`; 0 is infinite), without
    /// the copy [`RcQp::attr`] makes.
    pub fn ack_timeout(&self) -> u8 {
        self.attr.timeout
    }

    /// The port the next [`Transmit`] leaves from ([`Transmit::port`]: the current primary,
    /// which path migration changes), without the copy [`RcQp::attr`] makes.
    pub fn port(&self) -> u8 {
        self.attr.port_num
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.sq_psn = self.next_psn;
        a.rq_psn = self.resp.epsn;
        a.path_mig_state = self.apm.state;
        a
    }
    /// Counters.
    pub fn stats(&self) -> RcStats {
        self.stats
    }
    /// Work requests in the send queue (posted, not yet completed).
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }
    /// Receive completions waiting for [`poll_recv_completion`](Self::poll_recv_completion).
    pub fn pending_recv_completions(&self) -> usize {
        self.recv_cq.len()
    }

    /// The oldest request PSN not yet acknowledged (equal to the next new PSN when nothing
    /// is outstanding). ACKs, NAKs (implicitly, up to the NAKed PSN), READ responses and
    /// atomic ACKs advance it.
    pub fn oldest_unacked_psn(&self) -> u32 {
        self.comp_psn
    }

    /// Request PSNs handed out and not yet acknowledged: from
    /// [`oldest_unacked_psn`](Self::oldest_unacked_psn) to the last PSN of the messages
    /// started (a multi-packet message counts whole once its first packet was sent; a READ
    /// with the response PSNs it asks for).
    pub fn outstanding_psns(&self) -> u32 {
        crate::psn::psn_diff(self.next_psn, self.comp_psn).max(0) as u32
    }

    /// The configured send window ([`RcConfig::max_outstanding_psns`], 0: none).
    pub fn max_outstanding_psns(&self) -> u32 {
        self.cfg.max_outstanding_psns
    }

    /// Whether the next request packet is held back only by the send window (the caller may
    /// count this as a stall; the window opens when responses arrive).
    pub fn send_window_full(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.rnr_until.is_none()
            && self.sq.get(self.req_idx).is_some()
            && !self.window_allows(self.current_req_psn())
    }

    /// `ibv_modify_qp`: checks the transition table, then applies the attributes.
    ///
    /// Entering Err flushes every outstanding work request; entering Reset empties the queues
    /// without completions.
    pub fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyError> {
        use QpAttrMask as M;
        check_modify(QpType::Rc, self.state, attr, mask)?;
        let to = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            self.state
        };
        self.check_apm(attr, mask, to)?;
        let a = &mut self.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::AV) {
            a.path = attr.path;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(M::RQ_PSN) {
            self.resp.epsn = attr.rq_psn;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            self.resp.set_max_dest_rd_atomic(attr.max_dest_rd_atomic);
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.retry_left = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.rnr_left = attr.rnr_retry;
        }
        if mask.contains(M::SQ_PSN) {
            self.next_psn = attr.sq_psn;
            self.comp_psn = attr.sq_psn;
            self.probe.start(attr.sq_psn);
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.intersects(M::ALT_PATH | M::PATH_MIG_STATE) {
            self.apply_apm(attr, mask);
        }
        match to {
            QpState::Err => self.enter_error(None),
            QpState::Reset => self.reset(),
            s => self.state = s,
        }
        Ok(())
    }

    fn reset(&mut self) {
        let (cfg, early, credits) = (self.cfg, self.early_retransmit(), self.credits());
        *self = RcQp::new(cfg);
        self.set_early_retransmit(early);
        self.set_credits(credits);
    }

    /// Moves the QP to Err: the send queue and receive queue are flushed (after `first`, an
    /// error completion for the oldest send WR, if given).
    pub(crate) fn enter_error(&mut self, first: Option<WcStatus>) {
        if self.state != QpState::Err {
            tracing::debug!(
                qpn = self.cfg.qpn,
                from = ?self.state,
                status = ?first.or_else(|| self.sq.front().and_then(|w| w.error)),
                "QP to error"
            );
        }
        self.state = QpState::Err;
        self.retrans_deadline = None;
        self.rnr_until = None;
        self.ask.probe_at = None;
        self.probe.at = None;
        let qpn = self.cfg.qpn;
        let mut status = first;
        while let Some(w) = self.sq.pop_front() {
            let st = w
                .error
                .or_else(|| status.take())
                .unwrap_or(WcStatus::WrFlushErr);
            let mut c = Completion::new(w.wr.wr_id, st, w.wr.op.wc_opcode(), qpn);
            c.byte_len = 0;
            self.send_cq.push_back(c);
        }
        self.req_idx = 0;
        self.req_off = 0;
        self.rd_atomic_inflight = 0;
        self.credit.flushed();
        self.resp.flush(qpn, &mut self.recv_cq);
    }

    /// `ibv_post_send`. In Err the WR is accepted and completes at once with
    /// [`WcStatus::WrFlushErr`]. Inline data is copied now through
    /// [`MemoryTable::read_inline`].
    pub fn post_send<M: MemoryTable + ?Sized>(
        &mut self,
        mem: &M,
        wr: &SendWr,
    ) -> Result<(), PostError> {
        self.post_send_impl(mem, wr)
    }

    /// `ibv_post_recv`. Allowed from Init on; in Err the WR completes at once flushed.
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        match self.state {
            QpState::Reset => return Err(PostError::InvalidState(self.state)),
            QpState::Err => {
                self.recv_cq.push_back(Completion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Recv,
                    self.cfg.qpn,
                ));
                return Ok(());
            }
            _ => {}
        }
        if wr.sg.total_len() > u32::MAX as u64 {
            return Err(PostError::InvalidWr("receive longer than 2^32-1 bytes"));
        }
        self.resp.post(wr, self.cfg.max_recv_wr.max(1) as usize)?;
        self.credit_update_after_rnr();
        Ok(())
    }

    /// Whether the last [`RcQp::post_recv`] queued a credit update (an ACK that ends the
    /// peer's RNR wait: `credit` module) that should leave now; clears it.
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp};
    /// use rdma_proto::verbs::PdId;
    /// let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    /// assert!(!qp.take_credit_update(), "no RNR NAK was sent");
    /// ```
    pub fn take_credit_update(&mut self) -> bool {
        std::mem::take(&mut self.resp.update_queued)
    }

    /// From now on, RDMA WRITEs and SENDs (with immediate or not) of at least `min` bytes
    /// (none: `None`, the default) ask the responder to copy the whole message from this
    /// process's memory (a SEND into its receive's scatter list)
    /// ([`crate::memory::MemoryTable::locate`]) instead of carrying it: only for a
    /// peer process on the same host, over a wire that carries [`crate::packet::TxPlacement`].
    /// A WRITE or SEND that is resent, or whose responder cannot read the memory (it answers
    /// with a PSN sequence NAK), goes again with its data; one answered with an RNR NAK is
    /// pulled again.
    ///
    /// ```
    /// use rdma_proto::rc::{RcConfig, RcQp};
    /// use rdma_proto::verbs::PdId;
    /// let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    /// qp.set_pull_min(Some(16 << 10));
    /// assert_eq!(qp.pull_min(), Some(16 << 10));
    /// ```
    pub fn set_pull_min(&mut self, min: Option<u32>) {
        self.pull_min = min;
        self.pull_reverts = 0;
    }

    /// The message length from which WRITEs and SENDs are pulled ([`RcQp::set_pull_min`]).
    pub fn pull_min(&self) -> Option<u32> {
        self.pull_min
    }

    /// Processes one received packet addressed to this QP, as arrived on its current
    /// primary port. Never panics; malformed or unexpected packets are dropped or answered
    /// as the IBA requires.
    pub fn handle_packet<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        pkt: &Packet<'_>,
    ) {
        let port = self.attr.port_num;
        self.handle_packet_on(now, mem, pkt, port);
    }

    /// [`handle_packet`](Self::handle_packet) for a packet that arrived on `port`: with an
    /// alternate path, the path migration rules decide whether it is accepted and whether
    /// it arms or migrates the QP (see [`QpEvent`]).
    pub fn handle_packet_on<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        pkt: &Packet<'_>,
        port: u8,
    ) {
        self.handle_placed(now, mem, pkt, port, Placement::Inline);
    }

    /// [`RcQp::handle_packet_on`] for a packet whose data is not in its payload, from a peer
    /// process on the same host ([`RcQp::set_pull_min`] on its side): an RDMA WRITE or a
    /// SEND (only or only with immediate) whose message this responder copies from the
    /// peer's memory, or a READ response whose data
    /// this requester copies. A request of any other kind with such a placement is invalid;
    /// a response of any other kind is dropped.
    pub fn handle_placed<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        pkt: &Packet<'_>,
        port: u8,
        placement: Placement<'_>,
    ) {
        let h = &pkt.header;
        if h.check_headers().is_err()
            || h.bth.opcode.transport() != rdma_wire::opcode::Transport::Rc
            || h.bth.dest_qp != self.cfg.qpn
            || h.bth.psn > crate::psn::PSN_MASK
        {
            self.stats.dropped += 1;
            return;
        }
        if self.apm.used && !self.apm_admit(port, h.bth.mig_req) {
            self.stats.dropped += 1;
            return;
        }
        if h.bth.opcode.is_response() {
            if matches!(self.state, QpState::Rts | QpState::Sqd) {
                self.handle_response(now, mem, pkt, placement);
            } else {
                self.stats.dropped += 1;
            }
        } else if matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.handle_request(mem, pkt, placement);
        } else {
            self.stats.dropped += 1;
        }
    }

    /// The next packet to send, its payload written to the start of `buf` (which must hold a
    /// path MTU of bytes; with less, nothing is sent). Responses (ACKs, READ responses) and
    /// requests take turns.
    pub fn poll_transmit<M: MemoryTable + ?Sized>(
        &mut self,
        now: u64,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if buf.len() < self.attr.path_mtu.bytes() as usize {
            return None;
        }
        self.turn = !self.turn;
        let mut t = if self.turn {
            match self.next_response(mem, buf) {
                Some(t) => Some(t),
                None => self.next_request(now, mem, buf),
            }
        } else {
            match self.next_request(now, mem, buf) {
                Some(t) => Some(t),
                None => self.next_response(mem, buf),
            }
        }?;
        t.header.bth.mig_req = self.apm.mig_req();
        t.port = self.attr.port_num;
        Some(t)
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may have a packet now: false means it
    /// has none for sure (no response waits and every posted request has left), so a
    /// caller can skip asking, and what it checks before asking.
    pub fn may_transmit(&self) -> bool {
        self.resp.has_output() || self.req_idx < self.sq.len()
    }

    /// The next instant at which [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<u64> {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        min(
            min(self.retrans_deadline, self.rnr_until),
            min(self.ask.probe_at, self.probe.at),
        )
    }

    /// Runs expired timers: the local ACK timer (retransmit or [`WcStatus::RetryExcErr`]),
    /// the end of an RNR wait, the ACK probe and the early-retransmission probe.
    pub fn handle_timeout(&mut self, now: u64) {
        if let Some(t) = self.rnr_until {
            if now >= t {
                self.rnr_until = None;
                self.arm_retrans(now);
            }
        }
        if let Some(t) = self.retrans_deadline {
            if now >= t {
                // it resends everything: a probe due as well has nothing to add
                self.probe.at = None;
                self.on_retrans_timeout(now);
            }
        }
        if self.probe.at.is_some_and(|t| now >= t) {
            self.on_probe(now);
        }
        if self.ask.probe_at.is_some_and(|t| now >= t) {
            self.on_ack_probe();
        }
    }

    /// The next send queue completion.
    pub fn poll_send_completion(&mut self) -> Option<Completion> {
        self.send_cq.pop_front()
    }
    /// The next receive queue completion.
    pub fn poll_recv_completion(&mut self) -> Option<Completion> {
        self.recv_cq.pop_front()
    }
    /// The next completion of either queue (send queue first); receive completions have an
    /// opcode of [`WcOpcode::Recv`] or [`WcOpcode::RecvRdmaWithImm`].
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.send_cq
            .pop_front()
            .or_else(|| self.recv_cq.pop_front())
    }

    /// The next completion of either queue, and whether it is the send queue's, the
    /// successes of both queues before any error or flush: a receive that completed before
    /// the QP failed (in the same batch of packets as the NAK that failed it, say) is
    /// reported before the failure. Each queue keeps its order (a QP completes nothing
    /// successfully once it has failed); among equals the send queue goes first.
    pub fn poll_completion_in_order(&mut self) -> Option<(Completion, bool)> {
        let ok =
            |q: &VecDeque<Completion>| q.front().is_some_and(|c| c.status == WcStatus::Success);
        let send = ok(&self.send_cq) || !(ok(&self.recv_cq) || self.send_cq.is_empty());
        let c = if send {
            self.send_cq.pop_front()
        } else {
            self.recv_cq.pop_front()
        };
        c.map(|c| (c, send))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::InMemoryTable;
    use crate::packet::header;
    use crate::sim::{connect, ConnParams};
    use crate::verbs::{AccessFlags, SendFlags, SendOp, Sge};
    use rdma_wire::opcode::Opcode;
    use rdma_wire::packet::PacketRepr;
    use rdma_wire::reth::RethRepr;

    fn ack(psn: u32, msn: u32) -> PacketRepr {
        let mut h = header(Opcode::RcAcknowledge, 0x11, psn);
        h.aeth = Some(crate::packet::ack(msn));
        h
    }

    fn setup(cap: u32) -> (RcQp, InMemoryTable, u32) {
        let pd = PdId(1);
        let mut mem = InMemoryTable::new(0x10000, 1 << 16);
        let k = mem
            .register(pd, 0x10000, 1 << 16, AccessFlags::all())
            .unwrap();
        let mut cfg = RcConfig::new(0x11, pd);
        cfg.max_outstanding_psns = cap;
        let mut qp = RcQp::new(cfg);
        connect(&mut qp, 0x22, 1000, 0, &ConnParams::default());
        (qp, mem, k.lkey)
    }

    fn drain(qp: &mut RcQp, mem: &mut InMemoryTable) -> Vec<(Opcode, u32)> {
        let mut buf = [0u8; 4096];
        let mut v = Vec::new();
        while let Some(t) = qp.poll_transmit(0, mem, &mut buf) {
            v.push((t.header.bth.opcode, t.header.bth.psn));
        }
        v
    }

    #[test]
    fn send_window_caps_outstanding_request_psns() {
        let (mut qp, mut mem, lkey) = setup(4);
        assert_eq!(qp.max_outstanding_psns(), 4);
        let wr = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 7,
            },
        )
        .with_sge(Sge {
            addr: 0x10000,
            length: 10 * 1024,
            lkey,
        })
        .with_flags(SendFlags::SIGNALED);
        qp.post_send(&mem, &wr).unwrap();
        let psns: Vec<u32> = drain(&mut qp, &mut mem).iter().map(|x| x.1).collect();
        assert_eq!(psns, vec![1000, 1001, 1002, 1003]);
        assert!(qp.send_window_full());
        assert_eq!(qp.oldest_unacked_psn(), 1000);
        assert_eq!(qp.outstanding_psns(), 10);
        // an ACK through 1001 opens two slots
        let h = ack(1001, 0);
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h,
                payload: &[],
            },
        );
        assert_eq!(qp.oldest_unacked_psn(), 1002);
        let psns: Vec<u32> = drain(&mut qp, &mut mem).iter().map(|x| x.1).collect();
        assert_eq!(psns, vec![1004, 1005]);
        // a stale or duplicate ACK changes nothing
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h,
                payload: &[],
            },
        );
        assert!(drain(&mut qp, &mut mem).is_empty());
        // the rest, as ACKs come
        let h = ack(1005, 0);
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h,
                payload: &[],
            },
        );
        let psns: Vec<u32> = drain(&mut qp, &mut mem).iter().map(|x| x.1).collect();
        assert_eq!(psns, vec![1006, 1007, 1008, 1009]);
        assert!(!qp.send_window_full());
        let h = ack(1009, 1);
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h,
                payload: &[],
            },
        );
        assert_eq!(qp.outstanding_psns(), 0);
        assert_eq!(
            qp.poll_send_completion().map(|c| c.status),
            Some(WcStatus::Success)
        );
    }

    /// Without ACK requests inside a message a small window would only open by timeouts
    /// (found by the simulator with window 1 and 2): the packet that fills the window and
    /// every half window ask for an ACK.
    #[test]
    fn send_window_asks_for_acks_inside_messages() {
        for (cap, want) in [
            (1u32, vec![true; 3]),
            (4, vec![false, true, false, true]),
            (5, vec![false, true, false, true, true]),
        ] {
            let (mut qp, mut mem, lkey) = setup(cap);
            let wr = SendWr::new(1, SendOp::Send).with_sge(Sge {
                addr: 0x10000,
                length: 10 * 1024,
                lkey,
            });
            qp.post_send(&mem, &wr).unwrap();
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while let Some(t) = qp.poll_transmit(0, &mut mem, &mut buf) {
                got.push(t.header.bth.ack_req);
            }
            assert_eq!(got, want[..got.len()], "window {cap}");
            assert_eq!(got.len(), want.len().min(cap as usize).max(1));
        }
    }

    #[test]
    fn send_window_lets_a_long_read_go_when_the_psns_before_it_fit() {
        let (mut qp, mut mem, lkey) = setup(4);
        let read = SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: 0x1000,
                rkey: 7,
            },
        )
        .with_sge(Sge {
            addr: 0x10000,
            length: 8 * 1024,
            lkey,
        });
        let send = SendWr::new(2, SendOp::Send).with_sge(Sge {
            addr: 0x10000,
            length: 8,
            lkey,
        });
        qp.post_send(&mem, &read).unwrap();
        qp.post_send(&mem, &send).unwrap();
        // the READ (8 response PSNs) goes, the SEND after it waits for its responses
        assert_eq!(
            drain(&mut qp, &mut mem),
            vec![(Opcode::RcRdmaReadRequest, 1000)]
        );
        assert_eq!(qp.outstanding_psns(), 8);
        assert!(qp.send_window_full());
        for k in 0..5u32 {
            let op = if k == 0 {
                Opcode::RcRdmaReadResponseFirst
            } else {
                Opcode::RcRdmaReadResponseMiddle
            };
            let mut h = header(op, 0x11, 1000 + k);
            if k == 0 {
                h.aeth = Some(crate::packet::ack(1));
            }
            let payload = [0u8; 1024];
            qp.handle_packet(
                0,
                &mut mem,
                &Packet {
                    header: h,
                    payload: &payload,
                },
            );
        }
        assert_eq!(qp.oldest_unacked_psn(), 1005);
        // 1008 - 1005 = 3 < 4: the SEND may go now
        assert_eq!(drain(&mut qp, &mut mem), vec![(Opcode::RcSendOnly, 1008)]);
        assert!(!qp.send_window_full());
    }

    /// A receive that completed before the QP failed is reported before the failure's
    /// completions, although the send queue's come first otherwise.
    #[test]
    fn completions_in_order_report_successes_before_the_failure() {
        let (mut qp, mut mem, lkey) = setup(0);
        let sge = Sge {
            addr: 0x10000,
            length: 64,
            lkey,
        };
        qp.post_recv(&RecvWr::new(7).with_sge(sge)).unwrap();
        let payload = [5u8; 64];
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: header(Opcode::RcSendOnly, 0x11, 0),
                payload: &payload,
            },
        );
        qp.post_send(&mem, &SendWr::new(1, SendOp::Send).with_sge(sge))
            .unwrap();
        let err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        qp.modify(&err, crate::verbs::QpAttrMask::STATE).unwrap();
        let mut got = Vec::new();
        while let Some((c, send)) = qp.poll_completion_in_order() {
            got.push((c.wr_id, c.status, send));
        }
        assert_eq!(
            got,
            vec![
                (7, WcStatus::Success, false),
                (1, WcStatus::WrFlushErr, true)
            ]
        );
    }

    #[test]
    fn no_window_by_default_and_responses_are_never_held() {
        let (mut qp, mut mem, lkey) = setup(0);
        let wr = SendWr::new(1, SendOp::Send).with_sge(Sge {
            addr: 0x10000,
            length: 60 * 1024,
            lkey,
        });
        qp.post_send(&mem, &wr).unwrap();
        assert_eq!(drain(&mut qp, &mut mem).len(), 60);
        assert!(!qp.send_window_full());
        // window 1: a request incoming while our own request is outstanding is still ACKed
        let (mut qp, mut mem, _) = setup(1);
        qp.post_send(
            &mem,
            &SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
            ),
        )
        .unwrap();
        qp.post_send(
            &mem,
            &SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
            ),
        )
        .unwrap();
        assert_eq!(
            drain(&mut qp, &mut mem),
            vec![(Opcode::RcRdmaWriteOnly, 1000)]
        );
        let mut h = header(Opcode::RcRdmaWriteOnly, 0x11, 0);
        h.bth.ack_req = true;
        h.reth = Some(RethRepr {
            va: 0,
            r_key: 0,
            dma_len: 0,
        });
        qp.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h,
                payload: &[],
            },
        );
        assert_eq!(drain(&mut qp, &mut mem), vec![(Opcode::RcAcknowledge, 0)]);
        assert!(qp.send_window_full());
    }
}
