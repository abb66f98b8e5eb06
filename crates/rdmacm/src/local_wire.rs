//! Same-host connections skip the network: the host-local wire of the soft device
//! (`rdma_soft::io::local`), chosen per connection.
//!
//! Every device announces its host-local identity as the CA GUID of its CM messages
//! (`HostPeer::guid`; a Linux peer records it and nothing else). When a REQ or REP comes
//! with such a GUID, from the same network namespace, and the connection's route is
//! local (loopback, 127.0.0.0/8, ::1 or another local netdev's address), the QP is put on
//! the host-local wire before RTR. Each side chooses for what it sends; a Linux peer on
//! this host announces a GUID of its own and stays on RoCEv2. `RDMA_SOFT_LOCAL_WIRE=0`
//! keeps every connection on UDP.

use rdma_soft::io::HostPeer;
use rdma_soft::verbs::QueuePair;

use crate::slot::IdSlot;
use crate::state::State;

/// Puts `qp` on the host-local wire when the connection qualifies (see the module docs);
/// otherwise, or when the peer's wire cannot be reached, it stays on UDP.
pub(crate) fn choose(st: &State, s: &IdSlot, qp: &QueuePair) {
    let local_route = s.path.as_ref().is_some_and(|p| p.loopback);
    let Some(peer) = s.remote.and_then(|r| HostPeer::from_guid(r.ca_guid)) else {
        return;
    };
    if !local_route {
        return;
    }
    let Some(me) = s
        .dev
        .and_then(|k| st.devices.get(&k))
        .and_then(|d| d.dev.host_local())
    else {
        return;
    };
    if peer.ns != me.ns || qp.host_peer() == Some(peer) {
        return;
    }
    match qp.use_host_local(peer) {
        Ok(()) => tracing::debug!(qpn = qp.qpn(), ?peer, "QP on the host-local wire"),
        Err(e) => {
            tracing::debug!(qpn = qp.qpn(), ?peer, error = %e, "host-local peer unreachable: QP on UDP")
        }
    }
}
