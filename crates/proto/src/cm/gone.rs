//! A peer whose CM is gone: the runtime learnt that no one listens at the peer's address
//! any more (ICMP port unreachable for a MAD sent there). Linux's CM lives in the kernel
//! and answers a DREQ whether or not its application is still there (`cm_issue_drep`); a
//! peer of ours had its CM in its process, so a DREQ whose DREP was lost before that
//! process ended would be resent to nobody until every retry ran out.

use super::{CmAgent, CmEvent, CmState, Nanos};
use std::net::Ipv6Addr;

impl CmAgent {
    /// No CM listens at `remote_gid` any more: each connection to it waiting for the DREP
    /// of its DREQ (DREQ_SENT) ends now as after its last retry ([`CmEvent::DreqTimeout`],
    /// TIMEWAIT). Other states keep their own timers (a REQ may find a listener that
    /// starts later). Returns how many connections ended.
    ///
    /// ```
    /// use rdma_proto::cm::{AgentConfig, CmAgent};
    /// let mut agent = CmAgent::new(AgentConfig::default());
    /// assert_eq!(agent.peer_unreachable(0, "::ffff:192.0.2.2".parse().unwrap()), 0);
    /// ```
    pub fn peer_unreachable(&mut self, now: Nanos, remote_gid: Ipv6Addr) -> usize {
        let ended: Vec<_> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == CmState::DreqSent && c.path.remote_gid == remote_gid)
            .map(|(&h, _)| h)
            .collect();
        for &h in &ended {
            if let Some(c) = self.conn_mut(h) {
                c.enter_timewait(now);
            }
            tracing::debug!(conn = ?h, %remote_gid, "DREQ to a peer no one listens at: ended");
            self.emit_event(CmEvent::DreqTimeout { conn: h });
        }
        self.sync_timers();
        ended.len()
    }
}
