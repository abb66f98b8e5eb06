//! Automatic path migration (IBA vol1 17.2.8): a primary and an alternate path, the
//! Migrated / Rearm / Armed states, the BTH MigReq bit, and the rules for which packets each
//! side accepts.
//!
//! Paths are told apart by port: a device group gives each member netdev its own port, as a
//! multi-port HCA does, and the runtime says on which port a packet arrived
//! ([`RcQp::handle_packet_on`]). Every packet a QP sends leaves from its current primary port
//! ([`crate::packet::Transmit::port`]).
//!
//! - Migrated: MigReq set in every packet (once the QP has used APM at all; a QP that never
//!   had an alternate path sends it clear, as rxe does). Packets are accepted on the primary
//!   port, and on the port just migrated from until the peer is heard on the new one (the
//!   peer migrates only when our first packet reaches it there).
//! - Rearm: MigReq clear; a packet with MigReq clear on the primary port means the peer is
//!   armed too: Armed. A packet on the alternate port is treated as in Armed (the peer may
//!   have armed on our packets and migrated before its own MigReq-clear packet reached us).
//! - Armed: MigReq clear. A packet on the alternate port with MigReq set is the peer's
//!   migration: we migrate too, then process it; one with MigReq clear there is dropped.
//!   The owner may force the migration ([`RcQp::migrate`]); when the local ACK timer runs out
//!   of retries the QP migrates by itself instead of failing with `RetryExcErr`.
//!
//! On every migration the alternate path becomes the primary (port, path, P_Key index, ACK
//! timeout), the retry counter is refilled and the requester goes back to its oldest
//! unacknowledged PSN (go-back-N on the new path; the responder's duplicate detection makes
//! this exactly-once). The owner gets [`QpEvent::PathMigrated`], and
//! [`QpEvent::PathMigrationFailed`] if the new path then exhausts its retries before any
//! progress.

use super::RcQp;
use crate::verbs::{MigState, ModifyError, QpAttr, QpAttrMask, QpState};
use std::collections::VecDeque;

/// Why a QP migrated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationCause {
    /// The owner asked ([`RcQp::migrate`] or `path_mig_state = Migrated`), e.g. link down.
    Forced,
    /// The local ACK timer ran out of retries on the old path.
    RetryExhausted,
    /// The peer migrated: a packet with MigReq set arrived on the alternate path.
    Peer,
}

/// An asynchronous event of an RC QP (the verbs async events it maps to in the variant
/// docs), drained with [`RcQp::poll_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpEvent {
    /// `IBV_EVENT_PATH_MIG`: the QP now uses its former alternate path as primary.
    PathMigrated {
        /// Why.
        cause: MigrationCause,
        /// The port it left.
        from_port: u8,
        /// The port it uses now.
        to_port: u8,
    },
    /// `IBV_EVENT_PATH_MIG_ERR`: the path migrated to exhausted its retries before anything
    /// was acknowledged on it (the QP then fails with `RetryExcErr`).
    PathMigrationFailed {
        /// The port that failed.
        port: u8,
    },
}

/// Path migration state of one RC QP.
#[derive(Debug, Default)]
pub(crate) struct Apm {
    pub(crate) state: MigState,
    /// An alternate path is loaded (cleared by migrating onto it).
    pub(crate) alt_loaded: bool,
    /// The QP has had an alternate path: MigReq follows the state from now on.
    pub(crate) used: bool,
    /// The port migrated from, accepted until the peer is heard on the new primary.
    pub(crate) prev_port: Option<u8>,
    /// Oldest unacknowledged PSN at the last migration with requests outstanding.
    pub(crate) mig_psn: Option<u32>,
    pub(crate) events: VecDeque<QpEvent>,
    pub(crate) migrations: u64,
}

impl Apm {
    /// The MigReq bit of the packets we send.
    pub(crate) fn mig_req(&self) -> bool {
        self.used && self.state == MigState::Migrated
    }
}

impl RcQp {
    /// The path migration state.
    pub fn path_mig_state(&self) -> MigState {
        self.apm.state
    }

    /// Migrations this QP made (any cause).
    pub fn migrations(&self) -> u64 {
        self.apm.migrations
    }

    /// Forces migration to the alternate path (`ibv_modify_qp` with `path_mig_state =
    /// IBV_MIG_MIGRATED`): only from Armed and in RTS, else [`ModifyError::BadValue`]
    /// (`EINVAL`), the QP unchanged.
    ///
    /// ```
    /// use rdma_proto::rc::{QpEvent, RcConfig, RcQp};
    /// use rdma_proto::verbs::{MigState, PdId};
    /// let mut qp = RcQp::new(RcConfig::new(0x11, PdId(1)));
    /// assert!(qp.migrate().is_err()); // Reset, no alternate path
    /// assert_eq!(qp.path_mig_state(), MigState::Migrated);
    /// assert!(qp.poll_event().is_none());
    /// ```
    pub fn migrate(&mut self) -> Result<(), ModifyError> {
        let a = QpAttr {
            path_mig_state: MigState::Migrated,
            ..QpAttr::default()
        };
        self.modify(&a, QpAttrMask::PATH_MIG_STATE)
    }

    /// The next asynchronous event (path migration), if any.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.apm.events.pop_front()
    }

    /// Checks the alternate path and migration state of a modify call before anything is
    /// applied. `to` is the state the QP will be in.
    pub(super) fn check_apm(
        &self,
        attr: &QpAttr,
        mask: QpAttrMask,
        to: QpState,
    ) -> Result<(), ModifyError> {
        use QpAttrMask as M;
        let port = if mask.contains(M::PORT) {
            attr.port_num
        } else {
            self.attr.port_num
        };
        if mask.contains(M::ALT_PATH) {
            if attr.alt_port_num == port {
                return Err(ModifyError::BadValue(
                    "alternate path on the primary path's port",
                ));
            }
            if attr.alt_path.flow_label > 0xF_FFFF {
                return Err(ModifyError::BadValue("alt flow_label wider than 20 bits"));
            }
            if attr.alt_timeout > 31 {
                return Err(ModifyError::BadValue("alt_timeout > 31"));
            }
        }
        if !mask.contains(M::PATH_MIG_STATE) {
            return Ok(());
        }
        let loaded = self.apm.alt_loaded || mask.contains(M::ALT_PATH);
        let setup = matches!(self.state, QpState::Init | QpState::Rtr);
        let rts = self.state == QpState::Rts && to == QpState::Rts;
        match (self.apm.state, attr.path_mig_state) {
            (MigState::Armed, MigState::Migrated) if rts => Ok(()),
            (MigState::Migrated, MigState::Migrated) if setup => Ok(()),
            (MigState::Armed, MigState::Armed) => Ok(()),
            (_, MigState::Rearm) if loaded => Ok(()),
            // at connection setup both sides loaded the path through the CM
            (_, MigState::Armed) if setup && loaded => Ok(()),
            _ => Err(ModifyError::BadValue("path_mig_state transition")),
        }
    }

    /// Applies the alternate path and migration state of a checked modify call.
    pub(super) fn apply_apm(&mut self, attr: &QpAttr, mask: QpAttrMask) {
        use QpAttrMask as M;
        if mask.contains(M::ALT_PATH) {
            let a = &mut self.attr;
            a.alt_path = attr.alt_path;
            a.alt_port_num = attr.alt_port_num;
            a.alt_pkey_index = attr.alt_pkey_index;
            a.alt_timeout = attr.alt_timeout;
            self.apm.alt_loaded = true;
            self.apm.used = true;
        }
        if mask.contains(M::PATH_MIG_STATE) {
            self.apm.used = true;
            match (self.apm.state, attr.path_mig_state) {
                (MigState::Armed, MigState::Migrated) => self.migrate_now(MigrationCause::Forced),
                (_, s) => {
                    self.apm.state = s;
                    if s == MigState::Rearm {
                        self.apm.mig_psn = None;
                    }
                }
            }
        }
    }

    /// Switches to the alternate path (see the module docs).
    pub(super) fn migrate_now(&mut self, cause: MigrationCause) {
        let from_port = self.attr.port_num;
        let a = &mut self.attr;
        a.path = a.alt_path;
        a.port_num = a.alt_port_num;
        a.pkey_index = a.alt_pkey_index;
        if a.alt_timeout != 0 {
            a.timeout = a.alt_timeout;
        }
        let to_port = a.port_num;
        self.apm.state = MigState::Migrated;
        self.apm.alt_loaded = false;
        self.apm.prev_port = Some(from_port);
        self.apm.migrations += 1;
        self.probe.new_path();
        self.retry_left = self.attr.retry_cnt;
        let outstanding =
            self.sq.front().is_some_and(|w| w.started) && self.comp_psn != self.next_psn;
        self.apm.mig_psn = outstanding.then_some(self.comp_psn);
        if outstanding && self.rnr_until.is_none() {
            // whatever was in flight on the old path is presumed lost: resend it on the new
            // one now; the timer restarts with the first packet sent
            self.gbn_guard = None;
            let p = self.comp_psn;
            self.go_back(p);
            self.retrans_deadline = None;
        } else if cause == MigrationCause::Forced && self.resp.idle() {
            // nothing of ours to send: announce the move with an ACK of what we last
            // received (MigReq set, on the new path), else a peer whose requests are
            // outstanding keeps sending them the old way until its own retries run out
            let last = self.resp.epsn.wrapping_sub(1) & crate::psn::PSN_MASK;
            self.resp.push_ack(last, false);
        }
        tracing::info!(
            qpn = self.cfg.qpn,
            ?cause,
            from_port,
            to_port,
            psn = self.comp_psn,
            "path migrated"
        );
        self.apm.events.push_back(QpEvent::PathMigrated {
            cause,
            from_port,
            to_port,
        });
    }

    /// Whether a packet that arrived on `port` with MigReq `mig_req` is accepted; may arm or
    /// migrate the QP (see the module docs). Only called once the QP has used APM.
    pub(super) fn apm_admit(&mut self, port: u8, mig_req: bool) -> bool {
        let primary = self.attr.port_num;
        if port == primary {
            self.apm.prev_port = None;
            if self.apm.state == MigState::Rearm && !mig_req {
                self.apm.state = MigState::Armed;
                tracing::debug!(qpn = self.cfg.qpn, "path migration armed");
            }
            return true;
        }
        // Rearm follows too: MigReq set on our alternate port can only come from a peer that
        // migrated onto it (QPs send it clear until they first migrate), and a peer that
        // armed on our packets may migrate before ours arrived to arm us.
        if self.apm.state != MigState::Migrated && port == self.attr.alt_port_num {
            if !mig_req {
                return false;
            }
            if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
                return false;
            }
            self.migrate_now(MigrationCause::Peer);
            self.apm.prev_port = None;
            return true;
        }
        self.apm.prev_port == Some(port)
    }

    /// On retry exhaustion by ACK timeouts: migrates if armed (true), or records
    /// [`QpEvent::PathMigrationFailed`] if the last migration brought no progress.
    pub(super) fn retries_exhausted(&mut self) -> bool {
        if self.apm.state == MigState::Armed && self.state == QpState::Rts {
            self.migrate_now(MigrationCause::RetryExhausted);
            return true;
        }
        if self.apm.mig_psn == Some(self.comp_psn) {
            self.apm.mig_psn = None;
            let port = self.attr.port_num;
            tracing::info!(qpn = self.cfg.qpn, port, "path migration failed");
            self.apm
                .events
                .push_back(QpEvent::PathMigrationFailed { port });
        }
        false
    }
}
