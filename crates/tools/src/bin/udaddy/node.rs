//! One udaddy "connection": a UDP-port-space id, its UD QP (Q_Key `RDMA_UDP_QKEY`), the
//! message buffer (GRH room in front), and the address handle towards the peer.

use std::net::IpAddr;

use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{
    AccessFlags, AddressHandle, MemoryRegion, PathAttr, QpCap, QpType, RecvWr, SendOp, SendWr,
    WcOpcode, WcStatus,
};
use rdma_tools::endpoint::{Endpoint, Step};
use rdma_tools::events::EventLog;
use rdmacm::cm::{CmId, EventChannel, RDMA_UDP_QKEY};

/// Bytes of the GRH a UD receive gets in front of the data.
pub const GRH_LEN: usize = 40;

/// Message count and size of the run.
#[derive(Debug, Clone, Copy)]
pub struct Msgs {
    /// Datagrams each way per connection (`-C`).
    pub count: usize,
    /// Bytes per datagram (`-S`).
    pub size: usize,
}

/// A connection and its resources.
pub struct Node {
    /// The CM id.
    pub id: CmId,
    /// PD/CQ/UD QP.
    pub ep: Option<Endpoint>,
    mr: Option<MemoryRegion>,
    ah: Option<AddressHandle>,
    remote_qpn: u32,
    remote_qkey: u32,
    /// SIDR done (client: ESTABLISHED; server: accepted).
    pub connected: bool,
}

impl Node {
    /// A node for `id`, without resources yet.
    pub fn new(id: CmId) -> Node {
        Node {
            id,
            ep: None,
            mr: None,
            ah: None,
            remote_qpn: 0,
            remote_qkey: 0,
            connected: false,
        }
    }

    /// udaddy's verify_test_params: the message must fit the port's active MTU.
    pub fn verify(&self, m: Msgs) -> Result<(), String> {
        let dev = self.id.device().ok_or("the id has no device")?;
        let port = dev
            .query_port(1)
            .map_err(|e| format!("ibv_query_port: {e}"))?;
        let mtu = 1usize << (port.active_mtu as u32 + 7);
        if m.count > 0 && m.size > mtu {
            return Err(format!(
                "message_size {} is larger than active mtu {mtu}",
                m.size
            ));
        }
        Ok(())
    }

    /// PD, CQ of 2·count, UD QP of count sends and receives made ready with
    /// `RDMA_UDP_QKEY`, the buffer, and `count` receives posted.
    pub fn init(&mut self, m: Msgs) -> Result<(), String> {
        let depth = m.count.max(1);
        let cap = QpCap {
            max_send_wr: depth as u32,
            max_recv_wr: depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpCap::default()
        };
        let ep = Endpoint::new(&self.id, QpType::Ud, depth * 2, cap)?;
        // Receive only on the id's own address: the device's other addresses (e.g. on `lo`)
        // are not this id's (other processes share them; their datagrams are steered away).
        let dev = self.id.device().ok_or("the id has no device")?;
        let local = self.id.local_addr().ok_or("the id has no local address")?;
        let sgid = dev
            .gid_index(local.ip())
            .ok_or_else(|| format!("{} is not in the GID table of {}", local.ip(), dev.name()))?;
        ep.qp
            .ud_ready_on(RDMA_UDP_QKEY, sgid)
            .map_err(|e| format!("unable to create QP: {e}"))?;
        if m.count > 0 {
            let mr = ep.register(m.size + GRH_LEN, AccessFlags::LOCAL_WRITE)?;
            let sge = mr
                .sge(0, (m.size + GRH_LEN) as u32)
                .map_err(|e| e.to_string())?;
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

    /// The QP number (for the SIDR REQ/REP).
    pub fn qpn(&self) -> Option<u32> {
        self.ep.as_ref().map(|e| e.qp.qpn())
    }

    /// An address handle towards `peer` from the id's own address.
    pub fn set_peer(&mut self, peer: IpAddr, qpn: u32, qkey: u32) -> Result<(), String> {
        let ep = self.ep.as_ref().ok_or("no QP")?;
        let dev = self.id.device().ok_or("the id has no device")?;
        let local = self.id.local_addr().map(|a| a.ip());
        let sgid_index = dev
            .gids()
            .iter()
            .position(|g| Some(g.ip()) == local)
            .unwrap_or(0) as u8;
        let scope = match self.id.peer_addr() {
            Some(std::net::SocketAddr::V6(v6)) => v6.scope_id(),
            _ => 0,
        };
        // As rdma_init_ah_attr: the route's hop limit and traffic class (the id's TOS).
        let path = self.id.path();
        let attr = PathAttr {
            dgid: WireAddr::new(peer, scope).gid(),
            sgid_index,
            hop_limit: path.as_ref().map_or(64, |p| p.hop_limit.max(1)),
            traffic_class: path.as_ref().map_or(0, |p| p.traffic_class),
            ..PathAttr::default()
        };
        let ah = ep
            .pd
            .create_ah(&attr)
            .map_err(|e| format!("failure creating address handle: {e}"))?;
        self.ah = Some(ah);
        self.remote_qpn = qpn;
        self.remote_qkey = qkey;
        Ok(())
    }

    /// Posts `count` SENDs with immediate (our QPN, as udaddy) to the peer.
    pub fn post_sends(&self, m: Msgs, signaled: bool) -> Result<(), String> {
        let (Some(ep), Some(mr), Some(ah)) = (&self.ep, &self.mr, &self.ah) else {
            return Ok(());
        };
        if !self.connected {
            return Ok(());
        }
        let sge = mr.sge(0, m.size as u32).map_err(|e| e.to_string())?;
        let op = SendOp::SendWithImm { imm: ep.qp.qpn() };
        for _ in 0..m.count {
            let mut wr = SendWr::new(1, op)
                .with_sge(sge)
                .with_ud(ah.dest(self.remote_qpn, self.remote_qkey));
            if signaled {
                wr = wr.signaled();
            }
            ep.qp
                .post_send(&wr)
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }

    /// Waits for `count` completions; the first receive gives the reply address (the
    /// sender's QPN from the immediate data, its address from the id) when there is none.
    pub fn poll(&mut self, m: Msgs, cm: &EventChannel, log: &EventLog) -> Result<(), String> {
        if !self.connected || self.mr.is_none() {
            return Ok(());
        }
        let mut done = 0;
        while done < m.count {
            let step = match &self.ep {
                Some(ep) => ep.next(cm, log, None)?,
                None => return Ok(()),
            };
            match step {
                Some(Step::Wc(c)) => {
                    if c.status != WcStatus::Success {
                        return Err(format!(
                            "failed polling CQ: status {} ({:?})",
                            c.status as u32, c.status
                        ));
                    }
                    done += 1;
                    if c.opcode == WcOpcode::Recv && self.ah.is_none() {
                        let peer = self
                            .id
                            .peer_addr()
                            .ok_or("no peer address for the reply")?
                            .ip();
                        let qpn = c.imm().unwrap_or(c.src_qp);
                        self.set_peer(peer, qpn, RDMA_UDP_QKEY)?;
                    }
                }
                Some(Step::Cm(_)) | None => {}
            }
        }
        Ok(())
    }
}
