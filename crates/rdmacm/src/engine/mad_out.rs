//! The CM's MADs out: an agent's transmits queued in its device's GSI send batch along each
//! connection's `CmPath`, the batch flushed, and retransmissions counted per id.

use rdma_proto::cm::CmTransmit;

use crate::context::device_entry::{gid_of, DevEntry};
use crate::context::state::State;
use crate::host::addr::Gid;

/// Sends the MADs queued on device `i` (a failure is lost MADs, as in [`send`]).
pub(crate) fn flush_gsi(st: &State, i: u32) {
    if let Some(d) = st.devices.get(&i) {
        if let Err(e) = d.dev.gsi_flush() {
            tracing::debug!(target: "rdmacm::mad", error = %e, "MADs not sent");
        }
    }
}

/// Queues one MAD of an agent in its device's send batch ([`flush_gsi`] sends it). The
/// path names both ends; the tag is the netdev (the scope of link-local addresses). A send
/// error (e.g. the address went away) is a lost MAD: the CM's retries and timeouts handle
/// it.
pub(crate) fn send(d: &DevEntry, t: &CmTransmit) {
    let local = gid_of(Gid(t.path.local_gid.octets()).to_ip(), t.path.tag);
    let remote = gid_of(Gid(t.path.remote_gid.octets()).to_ip(), t.path.tag);
    let meta = rdma_soft::io::TxMeta {
        tclass: t.path.traffic_class,
        ..Default::default()
    };
    tracing::trace!(target: "rdmacm::mad", %local, %remote, attr = mad_attr(&t.mad), "MAD sent");
    if let Err(e) = d.dev.gsi_queue_with(&local, &remote, meta, &t.mad) {
        // a lost MAD: the CM's retransmissions (or the peer's) cover it
        tracing::debug!(target: "rdmacm::mad", %local, %remote, attr = mad_attr(&t.mad), error = %e, "MAD not sent");
    }
}

/// The attribute id of a MAD (REQ 0x10, REP 0x13, DREQ 0x15, DREP 0x16, ...), for logs.
pub(crate) fn mad_attr(mad: &[u8]) -> u16 {
    mad.get(16..18)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// Sends what the agent of device `i` queued in its timers: retransmissions only (MADs and
/// API calls are drained at once, so nothing else waits), each counted for the id whose
/// REQ, REP or DREQ it is.
pub(crate) fn count_retransmits(st: &mut State, i: u32) {
    let Some(d) = st.devices.get_mut(&i) else {
        return;
    };
    let mut ids = Vec::new();
    while let Some(t) = d.agent.poll_transmit() {
        send(d, &t);
        let conn = sender_comm_id(&t.mad).and_then(|c| d.agent.conn_by_local_comm_id(c));
        ids.extend(conn.and_then(|c| d.conns.get(&c).copied()));
    }
    flush_gsi(st, i);
    for id in ids {
        if let Some(s) = st.ids.get_mut(&id) {
            s.counters.retransmits += 1;
        }
    }
}

/// Our communication id in a REQ, REP or DREQ we send (through rdma-wire's CM views).
fn sender_comm_id(mad: &[u8]) -> Option<u32> {
    use rdma_wire::cm::{CmAttributeId as A, Dreq, Rep, Req};
    let m = rdma_wire::mad::Mad::new_cm_checked(mad).ok()?;
    let data = m.data();
    match A(m.attribute_id()) {
        A::REQ => Req::new_checked(data).ok().map(|v| v.local_comm_id()),
        A::REP => Rep::new_checked(data).ok().map(|v| v.local_comm_id()),
        A::DREQ => Dreq::new_checked(data).ok().map(|v| v.local_comm_id()),
        _ => None,
    }
}
