//! Service ID resolution (SIDR, IBA vol1 12.11): the UD handshake `rdma_cm` uses for the UDP
//! and IB port spaces.

use rdma_wire::cm::{
    CmMessage, SidrRepRepr, SidrReqRepr, SidrStatus, SIDR_REP_ADDITIONAL_INFORMATION_LEN,
    SIDR_REP_PRIVATE_DATA_LEN,
};

use super::conn::{emit, Conn};
use super::event::{SidrRepReceived, SidrReqReceived};
use super::{CmAgent, CmEvent, CmPath, CmState, Nanos, OverloadPolicy};

impl CmAgent {
    pub(crate) fn on_sidr_req(&mut self, src: CmPath, tid: u64, x: SidrReqRepr) {
        // A retransmission while the application has not answered: drop it.
        if self.conns.values().any(|c| {
            c.state == CmState::SidrReqRcvd && c.remote_id == x.request_id && c.path.same_node(&src)
        }) {
            self.stats.duplicates += 1;
            return;
        }
        let refuse = if !self.listeners.contains_key(&x.service_id) {
            Some(SidrStatus::Unsupported)
        } else if self.full() {
            self.stats.overload += 1;
            match self.config.overload {
                OverloadPolicy::Drop => return,
                OverloadPolicy::Reject => Some(SidrStatus::Reject),
            }
        } else {
            None
        };
        if let Some(status) = refuse {
            let rep = SidrRepRepr {
                request_id: x.request_id,
                status,
                additional_information_length: 0,
                qpn: 0,
                service_id: x.service_id,
                q_key: 0,
                additional_information: [0; SIDR_REP_ADDITIONAL_INFORMATION_LEN],
                private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
            };
            if let Some(m) = emit(tid, CmMessage::SidrRep(rep)) {
                self.transmit.push_back((src, m));
            }
            return;
        }
        let local_id = self.alloc_local_id();
        let h = self.alloc_handle();
        self.insert(Conn {
            handle: h,
            state: CmState::SidrReqRcvd,
            local_id,
            remote_id: x.request_id,
            remote_ca_guid: 0,
            path: src,
            service_id: x.service_id,
            listener: Some(x.service_id),
            local_qpn: 0,
            remote_qpn: 0,
            tid,
            retx: None,
            response_timeout: 0,
            max_cm_retries: 0,
            plt: self.config.packet_life_time,
            timewait: 0,
            timewait_deadline: None,
            last_response: None,
            destroyed: false,
            scheduled: None,
            slot: Default::default(),
            half_open: false,
            ap: Default::default(),
        });
        self.emit_event(CmEvent::SidrReqReceived(SidrReqReceived {
            conn: h,
            listener: x.service_id,
            path: src,
            request_id: x.request_id,
            partition_key: x.partition_key,
            private_data: x.private_data.to_vec(),
        }));
    }

    pub(crate) fn on_sidr_rep(&mut self, now: Nanos, src: CmPath, x: SidrRepRepr) {
        let Some(c) = self
            .find(x.request_id, None, &src)
            .and_then(|h| {
                self.touched.push(h);
                self.conns.get_mut(&h)
            })
            .filter(|c| c.state == CmState::SidrReqSent)
        else {
            self.stats.unmatched += 1;
            return;
        };
        // "Service id not supported": no listener yet, resent as a refused REQ is.
        let grace = self.config.no_listener_retry;
        if x.status == SidrStatus::Unsupported
            && c.retx.as_mut().is_some_and(|r| r.refused(now, grace))
        {
            tracing::debug!(conn = ?c.handle, service_id = c.service_id, "SIDR_REQ refused for want of a listener: resent shortly");
            return;
        }
        c.reset_to_idle();
        let conn = c.handle;
        let n =
            usize::from(x.additional_information_length).min(SIDR_REP_ADDITIONAL_INFORMATION_LEN);
        self.emit_event(CmEvent::SidrRepReceived(SidrRepReceived {
            conn,
            status: x.status,
            qpn: x.qpn,
            q_key: x.q_key,
            additional_information: x.additional_information[..n].to_vec(),
            private_data: x.private_data.to_vec(),
        }));
    }
}
