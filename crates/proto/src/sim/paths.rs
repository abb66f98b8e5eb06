//! A second path between the simulated hosts: port 2, with its own addresses (198.51.100.x)
//! and its own fault mix ([`RcPair::alt_faults`]), for path migration tests.

use super::{ConnParams, Faults, RcPair};
use crate::rc::RcQp;
use crate::verbs::{MigState, ModifyError, PathAttr, QpAttr, QpAttrMask as M};

/// The port of the alternate path in the simulator (the primary is port 1).
pub const ALT_PORT: u8 = 2;

/// Loads the simulator's other port as `qp`'s alternate path (RTS → RTS with
/// `ALT_PATH | PATH_MIG_STATE`), with migration state `state` (`Rearm` as Linux's CM sets
/// it). The alternate is port 2 when the QP is on port 1, else port 1.
pub fn load_alt_path(qp: &mut RcQp, state: MigState, timeout: u8) -> Result<(), ModifyError> {
    let port = if qp.attr().port_num == ALT_PORT {
        1
    } else {
        ALT_PORT
    };
    let a = QpAttr {
        alt_path: PathAttr {
            hop_limit: 64,
            ..PathAttr::default()
        },
        alt_port_num: port,
        alt_timeout: timeout,
        path_mig_state: state,
        ..QpAttr::default()
    };
    qp.modify(&a, M::ALT_PATH | M::PATH_MIG_STATE)
}

impl RcPair {
    /// [`RcPair::with_attrs`], then both QPs get port 2 as alternate path in the Rearm state:
    /// they arm on the first packets they exchange.
    ///
    /// ```
    /// use rdma_proto::sim::{ConnParams, Faults, RcPair};
    /// use rdma_proto::verbs::MigState;
    /// let s = RcPair::with_alt_path(1, Faults::clean(), &ConnParams::default());
    /// assert_eq!(s.a.qp.path_mig_state(), MigState::Rearm);
    /// assert_eq!(s.b.qp.attr().alt_port_num, 2);
    /// ```
    pub fn with_alt_path(seed: u64, faults: Faults, p: &ConnParams) -> Self {
        let mut s = Self::with_attrs(seed, faults, p);
        for qp in [&mut s.a.qp, &mut s.b.qp] {
            let r = load_alt_path(qp, MigState::Rearm, p.timeout);
            debug_assert!(r.is_ok(), "{r:?}");
        }
        s
    }
}
