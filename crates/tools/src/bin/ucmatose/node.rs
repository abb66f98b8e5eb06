//! One cmatose connection ("node"): its id, verbs resources, message buffer, and the
//! send/receive bursts of the data phase.

use std::collections::VecDeque;

use rdma_soft::verbs::{
    AccessFlags, MemoryRegion, QpCap, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use rdma_tools::endpoint::{Endpoint, Step};
use rdma_tools::events::EventLog;
use rdmacm::cm::{CmId, Event, EventChannel};

/// A connection and its resources.
pub struct Node {
    /// The CM id (client: created up front; server: from CONNECT_REQUEST).
    pub id: CmId,
    /// PD/CQ/QP, once the route is resolved (client) or the request arrived (server).
    pub ep: Option<Endpoint>,
    mr: Option<MemoryRegion>,
    /// ESTABLISHED seen and not yet disconnected.
    pub connected: bool,
}

/// Message count and size of the run.
#[derive(Debug, Clone, Copy)]
pub struct Msgs {
    /// Messages each way per connection (`-C`).
    pub count: usize,
    /// Bytes per message (`-S`).
    pub size: usize,
}

impl Node {
    /// A node for `id`, without resources yet.
    pub fn new(id: CmId) -> Node {
        Node {
            id,
            ep: None,
            mr: None,
            connected: false,
        }
    }

    /// cmatose's init_node + post_recvs: PD, one CQ, an RC QP of `count` sends and
    /// receives, the message buffer, and `count` receives posted.
    pub fn init(&mut self, m: Msgs) -> Result<(), String> {
        let depth = m.count.max(1);
        let cap = QpCap {
            max_send_wr: depth as u32,
            max_recv_wr: depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpCap::default()
        };
        let ep = Endpoint::new(&self.id, QpType::Rc, depth * 2, cap)?;
        if m.count > 0 && m.size > 0 {
            let mr = ep.register(m.size, AccessFlags::LOCAL_WRITE)?;
            mr.fill(0, m.size, b'c').map_err(|e| e.to_string())?;
            let sge = mr.sge(0, m.size as u32).map_err(|e| e.to_string())?;
            for _ in 0..m.count {
                ep.qp
                    .post_recv(&RecvWr::new(0).with_sge(sge))
                    .map_err(|e| format!("failed to post receives: {e}"))?;
            }
            self.mr = Some(mr);
        }
        self.ep = Some(ep);
        Ok(())
    }

    /// Posts `count` signaled SENDs of the message buffer.
    pub fn post_sends(&self, m: Msgs) -> Result<(), String> {
        let (Some(ep), Some(mr)) = (&self.ep, &self.mr) else {
            return Ok(());
        };
        if !self.connected {
            return Ok(());
        }
        let sge = mr.sge(0, m.size as u32).map_err(|e| e.to_string())?;
        for _ in 0..m.count {
            ep.qp
                .post_send(&SendWr::new(1, SendOp::Send).with_sge(sge).signaled())
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }

    /// Waits for `count` completions of kind `want` (send or receive) on this node; CM
    /// events meanwhile are kept in `later` for the disconnect phase.
    pub fn complete(
        &self,
        m: Msgs,
        want: WcOpcode,
        cm: &EventChannel,
        log: &EventLog,
        later: &mut VecDeque<Event>,
    ) -> Result<(), String> {
        let Some(ep) = &self.ep else { return Ok(()) };
        if !self.connected || self.mr.is_none() {
            return Ok(());
        }
        let mut done = 0;
        while done < m.count {
            match ep.next(cm, log, None)? {
                Some(Step::Wc(c)) => {
                    if c.status != WcStatus::Success {
                        return Err(format!(
                            "failed polling CQ: status {} ({:?})",
                            c.status as u32, c.status
                        ));
                    }
                    if c.opcode == want {
                        done += 1;
                    }
                }
                Some(Step::Cm(ev)) => later.push_back(ev),
                None => {}
            }
        }
        Ok(())
    }
}
