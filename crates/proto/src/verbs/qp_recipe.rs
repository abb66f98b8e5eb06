//! The one recipe for taking an RC QP through INIT, RTR and RTS: which attributes each step
//! sets and with which mask, for the hand-connected QPs of the software device and for the
//! connection manager alike.

use super::{AccessFlags, Mtu, PathAttr, QpAttr, QpAttrMask, QpState};

/// What RTR needs: the path to the peer and the peer's side of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrParams {
    /// Address vector of the peer.
    pub path: PathAttr,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The PSN expected first from the peer (its send PSN).
    pub rq_psn: u32,
    /// READs/atomics this responder keeps resources for.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder sends.
    pub min_rnr_timer: u8,
}

/// What RTS needs: the requester's timers and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsParams {
    /// Local ACK timeout exponent (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// PSN of the first request sent.
    pub sq_psn: u32,
    /// Outstanding READs/atomics this requester may have.
    pub max_rd_atomic: u8,
}

impl QpAttr {
    /// The access an RC QP of the tools and the CM gets: local write, remote read, write
    /// and atomics.
    pub const RC_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// RESET → INIT on port 1, P_Key index 0, with `access`.
    ///
    /// ```
    /// use rdma_proto::verbs::{QpAttr, QpAttrMask as M, QpState, RtrParams, RtsParams};
    /// let (a, m) = QpAttr::init(QpAttr::RC_ACCESS);
    /// assert_eq!((a.qp_state, a.port_num), (QpState::Init, 1));
    /// assert_eq!(m, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
    /// let rtr = RtrParams { path: Default::default(), path_mtu: Default::default(),
    ///     dest_qp_num: 0x12, rq_psn: 7, max_dest_rd_atomic: 1, min_rnr_timer: 12 };
    /// let (a, m) = a.rtr(&rtr);
    /// assert!(m.contains(M::DEST_QPN) && a.dest_qp_num == 0x12);
    /// let rts = RtsParams { timeout: 14, retry_cnt: 7, rnr_retry: 7, sq_psn: 9, max_rd_atomic: 1 };
    /// let (a, m) = a.rts(&rts);
    /// assert_eq!((a.qp_state, a.sq_psn, a.dest_qp_num), (QpState::Rts, 9, 0x12));
    /// assert!(!m.contains(M::DEST_QPN));
    /// ```
    pub fn init(access: AccessFlags) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        let a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access,
            port_num: 1,
            ..QpAttr::default()
        };
        (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
    }

    /// INIT → RTR: these attributes plus `p`, and the RTR mask.
    pub fn rtr(mut self, p: &RtrParams) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        self.qp_state = QpState::Rtr;
        self.path = p.path;
        self.path_mtu = p.path_mtu;
        self.dest_qp_num = p.dest_qp_num;
        self.rq_psn = p.rq_psn;
        self.max_dest_rd_atomic = p.max_dest_rd_atomic;
        self.min_rnr_timer = p.min_rnr_timer;
        (
            self,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS: these attributes plus `p`, and the RTS mask.
    pub fn rts(mut self, p: &RtsParams) -> (QpAttr, QpAttrMask) {
        use QpAttrMask as M;
        self.qp_state = QpState::Rts;
        self.timeout = p.timeout;
        self.retry_cnt = p.retry_cnt;
        self.rnr_retry = p.rnr_retry;
        self.sq_psn = p.sq_psn;
        self.max_rd_atomic = p.max_rd_atomic;
        (
            self,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )
    }
}
