//! QP states, attributes and the legal `ibv_modify_qp` transitions.

use super::{flags_type, AccessFlags};
use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

/// QP transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// QP state (`ibv_qp_state` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum QpState {
    /// Reset: no processing, queues empty.
    #[default]
    Reset = 0,
    /// Initialized: receives may be posted, nothing processed.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error (UD/UC only).
    Sqe = 5,
    /// Error: every work request is flushed.
    Err = 6,
}

impl QpState {
    /// From the `ibv_qp_state` value.
    pub fn from_u32(v: u32) -> Option<Self> {
        use QpState::*;
        [Reset, Init, Rtr, Rts, Sqd, Sqe, Err]
            .get(v as usize)
            .copied()
    }
}

/// Path MTU (`ibv_mtu` values 1..=5).
///
/// ```
/// use rdma_proto::verbs::Mtu;
/// assert_eq!(Mtu::Mtu1024.bytes(), 1024);
/// assert_eq!(Mtu::from_bytes(4096), Some(Mtu::Mtu4096));
/// assert_eq!(Mtu::from_bytes(1500), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a byte count (one of 256, 512, 1024, 2048, 4096).
    pub fn from_bytes(b: u32) -> Option<Self> {
        Some(match b {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    /// The largest MTU whose packets fit `link_mtu` bytes of IP payload after `overhead`
    /// header bytes, as Linux picks `active_mtu` (e.g. 1500 minus RoCEv2 headers gives 1024).
    pub fn fitting(link_payload: u32) -> Option<Self> {
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= link_payload)
    }
}

/// Automatic path migration state of an RC QP (`ibv_mig_state`; IBA 17.2.8).
///
/// `Migrated` (the initial state) has no usable alternate path; `Rearm` has one loaded and
/// waits until the peer is armed too (a packet with the BTH MigReq bit clear arrives);
/// `Armed` may migrate to the alternate path, forced by the owner or when retries run out
/// on the current path.
///
/// ```
/// use rdma_proto::verbs::MigState;
/// assert_eq!(MigState::default(), MigState::Migrated);
/// assert_eq!(MigState::Armed as u32, 2); // IBV_MIG_ARMED
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MigState {
    /// `IBV_MIG_MIGRATED`: on the primary path, no alternate armed.
    #[default]
    Migrated = 0,
    /// `IBV_MIG_REARM`: an alternate path is loaded; arms when the peer is armed.
    Rearm = 1,
    /// `IBV_MIG_ARMED`: ready to migrate to the alternate path.
    Armed = 2,
}

/// The primary path of a connected QP (the part of `ibv_ah_attr` a RoCEv2 device uses), or
/// of a UD address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathAttr {
    /// Destination GID (IPv4 as IPv4-mapped IPv6).
    pub dgid: [u8; 16],
    /// Source GID table index.
    pub sgid_index: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
}

flags_type! {
    /// Which [`QpAttr`] fields a modify call sets (`ibv_qp_attr_mask` values).
    ///
    /// ```
    /// use rdma_proto::verbs::QpAttrMask as M;
    /// let m = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    /// assert_eq!(m.bits(), 1 | 16 | 32 | 8);
    /// ```
    QpAttrMask: u32 {
        /// `qp_state`.
        STATE = 1 << 0;
        /// `cur_qp_state`.
        CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        PKEY_INDEX = 1 << 4;
        /// `port_num`.
        PORT = 1 << 5;
        /// `qkey`.
        QKEY = 1 << 6;
        /// `ah_attr` (the path).
        AV = 1 << 7;
        /// `path_mtu`.
        PATH_MTU = 1 << 8;
        /// `timeout`.
        TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` etc.
        ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        CAP = 1 << 19;
        /// `dest_qp_num`.
        DEST_QPN = 1 << 20;
    }
}

/// QP attributes (`ibv_qp_attr`, the fields this transport uses).
///
/// ```
/// use rdma_proto::verbs::{QpAttr, QpState, Mtu};
/// let a = QpAttr { qp_state: QpState::Rtr, path_mtu: Mtu::Mtu1024, dest_qp_num: 0x12,
///                  rq_psn: 100, ..QpAttr::default() };
/// assert_eq!(a.dest_qp_num, 0x12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Current state as the caller believes it (checked with [`QpAttrMask::CUR_STATE`]).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the first incoming request (24 bits).
    pub rq_psn: u32,
    /// PSN of the first outgoing request (24 bits).
    pub sq_psn: u32,
    /// Remote QP number (24 bits).
    pub dest_qp_num: u32,
    /// Operations remote peers may perform through this QP.
    pub qp_access_flags: AccessFlags,
    /// Primary path.
    pub path: PathAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port number.
    pub port_num: u8,
    /// Local ACK timeout exponent: 4.096 µs · 2^timeout, 0 = infinite (0..=31).
    pub timeout: u8,
    /// Transport retry count (0..=7).
    pub retry_cnt: u8,
    /// RNR retry count (0..=6, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code this responder sends (0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding READs/atomics this requester may have (initiator depth).
    pub max_rd_atomic: u8,
    /// READs/atomics this responder keeps resources for (responder resources).
    pub max_dest_rd_atomic: u8,
    /// Alternate path (set with [`QpAttrMask::ALT_PATH`], RC only).
    pub alt_path: PathAttr,
    /// Port of the alternate path; must differ from `port_num` (ports tell the paths apart).
    pub alt_port_num: u8,
    /// P_Key index on the alternate path.
    pub alt_pkey_index: u16,
    /// Local ACK timeout exponent on the alternate path (0: keep `timeout`).
    pub alt_timeout: u8,
    /// Path migration state ([`QpAttrMask::PATH_MIG_STATE`]).
    pub path_mig_state: MigState,
}

/// Why an `ibv_modify_qp` call is refused (`EINVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModifyError {
    /// The transition is not in the table for this QP type.
    IllegalTransition {
        /// From.
        from: QpState,
        /// To.
        to: QpState,
    },
    /// Required attributes are missing from the mask.
    MissingAttributes(QpAttrMask),
    /// Attributes not allowed in this transition are in the mask.
    ExtraAttributes(QpAttrMask),
    /// `cur_qp_state` does not match the QP's state.
    WrongCurrentState,
    /// A value is out of range (e.g. retry_cnt > 7, PSN wider than 24 bits).
    BadValue(&'static str),
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyError::IllegalTransition { from, to } => {
                write!(f, "illegal QP transition {from:?} -> {to:?}")
            }
            ModifyError::MissingAttributes(m) => write!(f, "missing attributes {m:?}"),
            ModifyError::ExtraAttributes(m) => write!(f, "attributes not allowed here {m:?}"),
            ModifyError::WrongCurrentState => write!(f, "cur_qp_state does not match"),
            ModifyError::BadValue(w) => write!(f, "bad value: {w}"),
        }
    }
}
impl std::error::Error for ModifyError {}

/// Required and optional attributes of one transition, or `None` if it is illegal.
fn transition(ty: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    let ud = ty == QpType::Ud;
    // to Reset and to Err are allowed from every state, with nothing required
    if to == Reset || to == Err {
        return Some((none, none));
    }
    let init_attrs = if ud {
        M::PKEY_INDEX | M::PORT | M::QKEY
    } else {
        M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
    };
    let rts_opt = if ud {
        M::CUR_STATE | M::QKEY
    } else if ty == QpType::Uc {
        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE
    } else {
        M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER
    };
    Some(match (from, to) {
        (Reset, Init) => (init_attrs, none),
        (Init, Init) => (none, init_attrs),
        (Init, Rtr) => {
            if ud {
                (none, M::PKEY_INDEX | M::QKEY)
            } else if ty == QpType::Uc {
                (
                    M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                )
            } else {
                (
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                )
            }
        }
        (Rtr, Rts) => {
            if ud {
                (M::SQ_PSN, M::CUR_STATE | M::QKEY)
            } else if ty == QpType::Uc {
                (
                    M::SQ_PSN,
                    M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
                )
            } else {
                (
                    M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                    rts_opt,
                )
            }
        }
        (Rts, Rts) | (Sqd, Rts) => (none, rts_opt),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => {
            if ud {
                (none, M::PKEY_INDEX | M::QKEY)
            } else {
                (
                    none,
                    M::PORT
                        | M::AV
                        | M::TIMEOUT
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC
                        | M::CUR_STATE
                        | M::ALT_PATH
                        | M::ACCESS_FLAGS
                        | M::PKEY_INDEX
                        | M::MIN_RNR_TIMER
                        | M::PATH_MIG_STATE,
                )
            }
        }
        (Sqe, Rts) if ty != QpType::Rc => {
            if ud {
                (none, M::CUR_STATE | M::QKEY)
            } else {
                (none, M::CUR_STATE | M::ACCESS_FLAGS)
            }
        }
        _ => return None,
    })
}

/// Checks an `ibv_modify_qp` call against the transition table of the verbs specification
/// (the same table as the kernel's `ib_modify_qp_is_ok`).
///
/// `mask` must contain [`QpAttrMask::STATE`] to change state; without it, the call modifies
/// attributes in the current state (treated as the `cur -> cur` transition).
///
/// ```
/// use rdma_proto::verbs::{check_modify, QpAttr, QpAttrMask as M, QpState, QpType};
/// let attr = QpAttr { qp_state: QpState::Init, ..Default::default() };
/// let ok = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
/// assert!(check_modify(QpType::Rc, QpState::Reset, &attr, ok).is_ok());
/// assert!(check_modify(QpType::Rc, QpState::Reset, &attr, M::STATE).is_err());
/// let rts = QpAttr { qp_state: QpState::Rts, ..Default::default() };
/// assert!(check_modify(QpType::Rc, QpState::Init, &rts, M::STATE).is_err());
/// ```
pub fn check_modify(
    ty: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<(), ModifyError> {
    use QpAttrMask as M;
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyError::WrongCurrentState);
    }
    let to = if mask.contains(M::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let (req, opt) =
        transition(ty, cur, to).ok_or(ModifyError::IllegalTransition { from: cur, to })?;
    let given = mask.difference(M::STATE);
    let missing = req.difference(given);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes(missing));
    }
    let extra = given.difference(req | opt | M::CUR_STATE);
    if !extra.is_empty() && to != QpState::Reset && to != QpState::Err {
        return Err(ModifyError::ExtraAttributes(extra));
    }
    let bad = |c: bool, w| {
        if c {
            Err(ModifyError::BadValue(w))
        } else {
            Ok(())
        }
    };
    bad(
        mask.contains(M::RQ_PSN) && attr.rq_psn > 0xFF_FFFF,
        "rq_psn wider than 24 bits",
    )?;
    bad(
        mask.contains(M::SQ_PSN) && attr.sq_psn > 0xFF_FFFF,
        "sq_psn wider than 24 bits",
    )?;
    bad(
        mask.contains(M::DEST_QPN) && attr.dest_qp_num > 0xFF_FFFF,
        "dest_qp_num wider than 24 bits",
    )?;
    bad(
        mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7,
        "retry_cnt > 7",
    )?;
    bad(
        mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7,
        "rnr_retry > 7",
    )?;
    bad(
        mask.contains(M::TIMEOUT) && attr.timeout > 31,
        "timeout > 31",
    )?;
    bad(
        mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31,
        "min_rnr_timer > 31",
    )?;
    bad(
        mask.contains(M::AV) && attr.path.flow_label > 0xF_FFFF,
        "flow_label wider than 20 bits",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    fn to(s: QpState) -> QpAttr {
        QpAttr {
            qp_state: s,
            ..Default::default()
        }
    }

    #[test]
    fn rc_path() {
        let rc = QpType::Rc;
        check_modify(
            rc,
            QpState::Reset,
            &to(QpState::Init),
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        check_modify(rc, QpState::Init, &to(QpState::Rtr), rtr).unwrap();
        assert_eq!(
            check_modify(
                rc,
                QpState::Init,
                &to(QpState::Rtr),
                rtr.difference(M::RQ_PSN)
            ),
            Err(ModifyError::MissingAttributes(M::RQ_PSN))
        );
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        check_modify(rc, QpState::Rtr, &to(QpState::Rts), rts).unwrap();
        assert_eq!(
            check_modify(rc, QpState::Rtr, &to(QpState::Rts), rts | M::QKEY),
            Err(ModifyError::ExtraAttributes(M::QKEY))
        );
        // illegal jumps
        assert!(check_modify(rc, QpState::Reset, &to(QpState::Rts), M::STATE).is_err());
        assert!(check_modify(rc, QpState::Sqe, &to(QpState::Rts), M::STATE).is_err());
        assert!(check_modify(rc, QpState::Err, &to(QpState::Rts), M::STATE).is_err());
        // anything to error / reset
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ] {
            check_modify(rc, s, &to(QpState::Err), M::STATE).unwrap();
            check_modify(rc, s, &to(QpState::Reset), M::STATE).unwrap();
        }
        // bad values
        let mut a = to(QpState::Rts);
        a.retry_cnt = 8;
        assert_eq!(
            check_modify(rc, QpState::Rtr, &a, rts),
            Err(ModifyError::BadValue("retry_cnt > 7"))
        );
    }

    #[test]
    fn ud_path() {
        let ud = QpType::Ud;
        check_modify(
            ud,
            QpState::Reset,
            &to(QpState::Init),
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        )
        .unwrap();
        check_modify(ud, QpState::Init, &to(QpState::Rtr), M::STATE).unwrap();
        check_modify(ud, QpState::Rtr, &to(QpState::Rts), M::STATE | M::SQ_PSN).unwrap();
        check_modify(ud, QpState::Sqe, &to(QpState::Rts), M::STATE).unwrap();
        assert!(check_modify(ud, QpState::Init, &to(QpState::Rtr), M::STATE | M::AV).is_err());
    }

    #[test]
    fn mtu() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(
            Mtu::fitting(1500 - 20 - 8 - 12 - 16 - 4),
            Some(Mtu::Mtu1024)
        );
        assert_eq!(Mtu::fitting(100), None);
    }
}
