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

use crate::context::id_entry::IdSlot;
use crate::context::state::State;

/// Puts `qp` on the host-local wire when the connection qualifies (see the module docs);
/// otherwise, or when the peer's wire cannot be reached, it stays on UDP.
pub(crate) fn choose(st: &State, s: &IdSlot, qp: &QueuePair) {
    let local_route = s.path.as_ref().is_some_and(|p| p.loopback);
    let Some(guid) = s.remote.map(|r| r.ca_guid) else {
        return;
    };
    if !local_route || HostPeer::from_guid(guid).is_none() {
        return;
    }
    let me = s
        .dev
        .and_then(|k| st.devices.get(&k))
        .and_then(|d| d.dev.host_local());
    let Some(peer) = qualifies(local_route, guid, me) else {
        return;
    };
    if qp.host_peer() == Some(peer) {
        return;
    }
    match qp.use_host_local(peer) {
        Ok(()) => {
            tracing::debug!(target: "rdmacm::local_wire", qpn = qp.qpn(), ?peer, "QP on the host-local wire")
        }
        Err(e) => {
            tracing::debug!(target: "rdmacm::local_wire", qpn = qp.qpn(), ?peer, error = %e, "host-local peer unreachable: QP on UDP")
        }
    }
}

/// The peer to send to through shared memory, if any: the route is local, the peer's CA
/// GUID announces a host-local wire, and it is in our network namespace (`me`: this
/// device's own identity, `None` when it has no host-local wire).
fn qualifies(local_route: bool, peer_guid: u64, me: Option<HostPeer>) -> Option<HostPeer> {
    let peer = HostPeer::from_guid(peer_guid)?;
    (local_route && me?.ns == peer.ns).then_some(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_processes_on_a_local_route_in_our_namespace_qualify() {
        let me = HostPeer {
            slot: 3,
            ns: 0x16,
            nonce: 1,
        };
        let peer = HostPeer {
            slot: 9,
            ns: 0x16,
            nonce: 77,
        };
        assert_eq!(qualifies(true, peer.guid(), Some(me)), Some(peer));
        // ourselves (both ends in one device) too
        assert_eq!(qualifies(true, me.guid(), Some(me)), Some(me));
        // a Linux peer on this host: its GUID is its node GUID (from a MAC)
        assert_eq!(qualifies(true, 0x5254_00ff_fe12_3456, Some(me)), None);
        // not a local route: between namespace hosts, another machine
        assert_eq!(qualifies(false, peer.guid(), Some(me)), None);
        // another network namespace's process
        let other_ns = HostPeer { ns: 0x17, ..peer };
        assert_eq!(qualifies(true, other_ns.guid(), Some(me)), None);
        // this device has no host-local wire (turned off, faults injected)
        assert_eq!(qualifies(true, peer.guid(), None), None);
    }
}
