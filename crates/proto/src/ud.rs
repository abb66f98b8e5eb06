//! Unreliable datagram (UD) transport: one SEND per packet, DETH with Q_Key and source QP,
//! Q_Key checks on receive, and the 40-byte GRH in front of received data as verbs delivers
//! it.
//!
//! ```
//! use rdma_proto::memory::InMemoryTable;
//! use rdma_proto::ud::{GrhInfo, UdConfig, UdQp};
//! use rdma_proto::verbs::*;
//! let mut mem = InMemoryTable::new(0, 8192);
//! let pd = PdId(1);
//! let k = mem.register(pd, 0, 8192, AccessFlags::LOCAL_WRITE).unwrap();
//! let mut a = UdQp::new(UdConfig::new(0x12, pd));
//! let mut b = UdQp::new(UdConfig::new(0x13, pd));
//! for qp in [&mut a, &mut b] {
//!     qp.modify(&QpAttr { qp_state: QpState::Init, qkey: 0x1234_5678, ..Default::default() },
//!               QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
//!     qp.modify(&QpAttr { qp_state: QpState::Rtr, ..Default::default() }, QpAttrMask::STATE).unwrap();
//!     qp.modify(&QpAttr { qp_state: QpState::Rts, ..Default::default() },
//!               QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
//! }
//! mem.bytes_mut(0, 4).unwrap().copy_from_slice(b"ping");
//! b.post_recv(&RecvWr::new(1).with_sge(Sge { addr: 4096, length: 1024, lkey: k.lkey })).unwrap();
//! let wr = SendWr::new(2, SendOp::Send).with_sge(Sge { addr: 0, length: 4, lkey: k.lkey })
//!     .with_ud(UdDest { ah: 0, remote_qpn: 0x13, remote_qkey: 0x1234_5678 }).signaled();
//! a.post_send(&mem, &wr).unwrap();
//! let mut buf = [0u8; 4096];
//! let t = a.poll_transmit(0, &mut mem, &mut buf).unwrap();
//! let pkt = rdma_proto::packet::Packet { header: t.header, payload: &buf[..t.payload_len].to_vec() };
//! let grh = GrhInfo::V4 { src: [192, 0, 2, 2], dst: [192, 0, 2, 3], tos: 0, ttl: 64 };
//! b.handle_packet(0, &mut mem, &pkt, &grh);
//! let c = b.poll_recv_completion().unwrap();
//! assert_eq!((c.byte_len, c.src_qp), (40 + 4, 0x12));
//! assert!(c.wc_flags.contains(WcFlags::GRH));
//! assert_eq!(mem.bytes(4096 + 40, 4).unwrap(), b"ping");
//! assert_eq!(mem.bytes(4096 + 20, 1).unwrap(), &[0x45]); // IPv4 header in the last 20 bytes
//! ```

use crate::memory::{scatter, MemKey, MemoryTable, ScatterError};
use crate::packet::{header, Packet};
use crate::psn::psn_add;
use crate::verbs::{
    check_modify, Completion, ModifyError, Mtu, PdId, PostError, QpAttr, QpAttrMask, QpState,
    QpType, RecvWr, SendFlags, SendOp, SendWr, WcFlags, WcOpcode, WcStatus,
};
use rdma_wire::deth::DethRepr;
use rdma_wire::opcode::{Opcode, Transport};
use rdma_wire::packet::PacketRepr;
use std::collections::VecDeque;

/// Bytes of GRH in front of every UD receive.
pub const GRH_LEN: usize = 40;
/// The multicast destination QP.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Creation-time parameters of a UD QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdConfig {
    /// QP number.
    pub qpn: u32,
    /// Protection domain.
    pub pd: PdId,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Every send generates a completion.
    pub sq_sig_all: bool,
    /// Path MTU of the port (largest datagram).
    pub mtu: Mtu,
}

impl UdConfig {
    /// Defaults: 128 WRs each way, MTU 1024.
    pub fn new(qpn: u32, pd: PdId) -> Self {
        UdConfig {
            qpn,
            pd,
            max_send_wr: 128,
            max_recv_wr: 128,
            sq_sig_all: false,
            mtu: Mtu::Mtu1024,
        }
    }
}

/// Where a received datagram came from, to build the GRH the receive buffer starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrhInfo {
    /// IPv4: 20 zero bytes then an IPv4 header (as Linux rxe delivers it).
    V4 {
        /// Source address.
        src: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
        /// TOS byte.
        tos: u8,
        /// TTL.
        ttl: u8,
    },
    /// IPv6: the IPv6 header.
    V6 {
        /// Source address.
        src: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
        /// Traffic class.
        traffic_class: u8,
        /// Flow label (20 bits).
        flow_label: u32,
        /// Hop limit.
        hop_limit: u8,
    },
}

impl GrhInfo {
    /// The 40 bytes for a datagram whose RoCEv2 payload (BTH..ICRC) is `roce_len` bytes.
    pub fn bytes(&self, roce_len: usize) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        match *self {
            GrhInfo::V4 { src, dst, tos, ttl } => {
                let h = &mut g[20..];
                let total = (20 + 8 + roce_len).min(u16::MAX as usize) as u16;
                h[0] = 0x45;
                h[1] = tos;
                h[2..4].copy_from_slice(&total.to_be_bytes());
                h[6] = 0x40; // DF
                h[8] = ttl;
                h[9] = 17;
                h[12..16].copy_from_slice(&src);
                h[16..20].copy_from_slice(&dst);
                let mut sum = 0u32;
                for c in h.chunks(2) {
                    sum += u16::from_be_bytes([c[0], c[1]]) as u32;
                }
                while sum > 0xFFFF {
                    sum = (sum & 0xFFFF) + (sum >> 16);
                }
                h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            }
            GrhInfo::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
            } => {
                let vtf = (6u32 << 28) | ((traffic_class as u32) << 20) | (flow_label & 0xF_FFFF);
                g[0..4].copy_from_slice(&vtf.to_be_bytes());
                let plen = (8 + roce_len).min(u16::MAX as usize) as u16;
                g[4..6].copy_from_slice(&plen.to_be_bytes());
                g[6] = 17;
                g[7] = hop_limit;
                g[8..24].copy_from_slice(&src);
                g[24..40].copy_from_slice(&dst);
            }
        }
        g
    }
}

/// A datagram the UD QP wants sent: headers, payload length (written to the caller's
/// buffer) and the address handle of the work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTransmit {
    /// Headers.
    pub header: PacketRepr,
    /// Payload bytes at the start of the caller's buffer.
    pub payload_len: usize,
    /// The WR's address handle.
    pub ah: u32,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdStats {
    /// Dropped for a Q_Key mismatch.
    pub qkey_mismatch: u64,
    /// Dropped for lack of a posted receive.
    pub no_receive: u64,
    /// Dropped for other reasons (opcode, state, length, destination).
    pub dropped: u64,
}

/// An unreliable datagram QP.
#[derive(Debug)]
pub struct UdQp {
    cfg: UdConfig,
    state: QpState,
    qkey: u32,
    pkey_index: u16,
    sq_psn: u32,
    sq: VecDeque<SendWr>,
    rq: VecDeque<RecvWr>,
    send_cq: VecDeque<Completion>,
    recv_cq: VecDeque<Completion>,
    stats: UdStats,
}

impl UdQp {
    /// A QP in Reset.
    pub fn new(cfg: UdConfig) -> Self {
        UdQp {
            cfg,
            state: QpState::Reset,
            qkey: 0,
            pkey_index: 0,
            sq_psn: 0,
            sq: VecDeque::with_capacity(cfg.max_send_wr.max(1) as usize),
            rq: VecDeque::with_capacity(cfg.max_recv_wr.max(1) as usize),
            send_cq: VecDeque::with_capacity(cfg.max_send_wr.max(1) as usize),
            recv_cq: VecDeque::with_capacity(cfg.max_recv_wr.max(1) as usize),
            stats: UdStats::default(),
        }
    }
    /// State.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Counters.
    pub fn stats(&self) -> UdStats {
        self.stats
    }
    /// This QP's Q_Key.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// `ibv_modify_qp` for a UD QP.
    pub fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyError> {
        check_modify(QpType::Ud, self.state, attr, mask)?;
        if mask.contains(QpAttrMask::QKEY) {
            self.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) {
            self.pkey_index = attr.pkey_index;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            self.sq_psn = attr.sq_psn;
        }
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            self.state
        };
        match to {
            QpState::Reset => *self = UdQp::new(self.cfg),
            QpState::Err => {
                self.state = QpState::Err;
                self.flush();
            }
            s => self.state = s,
        }
        Ok(())
    }

    fn flush(&mut self) {
        let qpn = self.cfg.qpn;
        while let Some(w) = self.sq.pop_front() {
            self.send_cq.push_back(Completion::new(
                w.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Send,
                qpn,
            ));
        }
        while let Some(r) = self.rq.pop_front() {
            self.recv_cq.push_back(Completion::new(
                r.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                qpn,
            ));
        }
    }

    /// `ibv_post_send`: SEND or SEND with immediate, with a [`crate::verbs::UdDest`], at most
    /// one MTU. Inline sends are gathered at transmit time like others (the WR is copied).
    pub fn post_send<M: MemoryTable + ?Sized>(
        &mut self,
        _mem: &M,
        wr: &SendWr,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            QpState::Err => {
                self.send_cq.push_back(Completion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Send,
                    self.cfg.qpn,
                ));
                return Ok(());
            }
            s => return Err(PostError::InvalidState(s)),
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
            return Err(PostError::InvalidWr(
                "UD supports only SEND and SEND with immediate",
            ));
        }
        if wr.ud.is_none() {
            return Err(PostError::InvalidWr("UD send without a destination"));
        }
        if wr.total_len() > self.cfg.mtu.bytes() as u64 {
            return Err(PostError::InvalidWr("UD message longer than the MTU"));
        }
        if self.sq.len() >= self.cfg.max_send_wr.max(1) as usize {
            return Err(PostError::QueueFull);
        }
        self.sq.push_back(*wr);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        match self.state {
            QpState::Reset => Err(PostError::InvalidState(self.state)),
            QpState::Err => {
                self.recv_cq.push_back(Completion::new(
                    wr.wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Recv,
                    self.cfg.qpn,
                ));
                Ok(())
            }
            _ if self.rq.len() >= self.cfg.max_recv_wr.max(1) as usize => Err(PostError::QueueFull),
            _ => {
                self.rq.push_back(*wr);
                Ok(())
            }
        }
    }

    /// The next datagram to send; its payload is written to the start of `buf` (at least one
    /// MTU long). Successful sends complete as soon as they are handed out.
    pub fn poll_transmit<M: MemoryTable + ?Sized>(
        &mut self,
        _now: u64,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<UdTransmit> {
        if self.state != QpState::Rts || buf.len() < self.cfg.mtu.bytes() as usize {
            return None;
        }
        let wr = self.sq.pop_front()?;
        let dest = wr.ud?;
        let len = wr.total_len() as usize;
        let mut off = 0;
        let inline = wr.flags.contains(SendFlags::INLINE);
        for s in wr.sg.as_slice() {
            let dst = &mut buf[off..off + s.length as usize];
            let r = if inline {
                mem.read_inline(self.cfg.pd, s.addr, dst)
            } else {
                mem.read(self.cfg.pd, MemKey::Local(s.lkey), s.addr, dst)
            };
            if r.is_err() {
                self.send_cq.push_back(Completion::new(
                    wr.wr_id,
                    WcStatus::LocProtErr,
                    WcOpcode::Send,
                    self.cfg.qpn,
                ));
                self.state = QpState::Sqe;
                return None;
            }
            off += s.length as usize;
        }
        let (opcode, imm) = match wr.op {
            SendOp::SendWithImm { imm } => (Opcode::UdSendOnlyImm, Some(imm)),
            _ => (Opcode::UdSendOnly, None),
        };
        let mut h = header(opcode, dest.remote_qpn, self.sq_psn);
        self.sq_psn = psn_add(self.sq_psn, 1);
        // IBA 10.2.5: a WR Q_Key with the high bit set means "use the QP's Q_Key"
        let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
            self.qkey
        } else {
            dest.remote_qkey
        };
        h.deth = Some(DethRepr {
            q_key: qkey,
            resv8: 0,
            src_qp: self.cfg.qpn,
        });
        h.imm_dt = imm;
        h.bth.se = wr.flags.contains(SendFlags::SOLICITED);
        if self.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED) {
            let mut c = Completion::new(wr.wr_id, WcStatus::Success, WcOpcode::Send, self.cfg.qpn);
            c.byte_len = len as u32;
            self.send_cq.push_back(c);
        }
        Some(UdTransmit {
            header: h,
            payload_len: len,
            ah: dest.ah,
        })
    }

    /// Processes a received datagram. Wrong Q_Key, destination, opcode or state, or no posted
    /// receive: silently dropped (counted). `grh` describes the IP header it arrived with.
    pub fn handle_packet<M: MemoryTable + ?Sized>(
        &mut self,
        _now: u64,
        mem: &mut M,
        pkt: &Packet<'_>,
        grh: &GrhInfo,
    ) {
        let h = &pkt.header;
        let ok_state = matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        let Some(deth) = h.deth else {
            self.stats.dropped += 1;
            return;
        };
        if !ok_state
            || h.bth.opcode.transport() != Transport::Ud
            || h.check_headers().is_err()
            || (h.bth.dest_qp != self.cfg.qpn && h.bth.dest_qp != MULTICAST_QPN)
            || pkt.payload.len() > self.cfg.mtu.bytes() as usize
        {
            self.stats.dropped += 1;
            return;
        }
        if deth.q_key != self.qkey {
            self.stats.qkey_mismatch += 1;
            tracing::debug!(
                qpn = self.cfg.qpn,
                src_qpn = deth.src_qp,
                "UD datagram with a wrong Q_Key dropped"
            );
            return;
        }
        let Some(r) = self.rq.pop_front() else {
            self.stats.no_receive += 1;
            return;
        };
        let qpn = self.cfg.qpn;
        let pad = (4 - pkt.payload.len() % 4) % 4;
        let roce_len = h.header_len() + pkt.payload.len() + pad + 4;
        let g = grh.bytes(roce_len);
        let res = scatter(mem, self.cfg.pd, r.sg.as_slice(), 0, &g).and_then(|_| {
            scatter(
                mem,
                self.cfg.pd,
                r.sg.as_slice(),
                GRH_LEN as u64,
                pkt.payload,
            )
        });
        let status = match res {
            Ok(()) => WcStatus::Success,
            Err(ScatterError::TooLong) => WcStatus::LocLenErr,
            Err(ScatterError::Mem(_)) => WcStatus::LocProtErr,
        };
        let mut c = Completion::new(r.wr_id, status, WcOpcode::Recv, qpn);
        if status == WcStatus::Success {
            c.byte_len = (GRH_LEN + pkt.payload.len()) as u32;
            c.src_qp = deth.src_qp;
            c.wc_flags |= WcFlags::GRH;
            c.pkey_index = self.pkey_index;
            c.solicited = h.bth.se;
            if let Some(imm) = h.imm_dt {
                c = c.with_imm(imm);
            }
        }
        self.recv_cq.push_back(c);
    }

    /// The next send completion.
    pub fn poll_send_completion(&mut self) -> Option<Completion> {
        self.send_cq.pop_front()
    }
    /// The next receive completion.
    pub fn poll_recv_completion(&mut self) -> Option<Completion> {
        self.recv_cq.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::InMemoryTable;
    use crate::verbs::{AccessFlags, Sge, UdDest};

    fn up(qpn: u32, qkey: u32) -> UdQp {
        let mut q = UdQp::new(UdConfig::new(qpn, PdId(1)));
        let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        q.modify(
            &QpAttr {
                qp_state: QpState::Init,
                qkey,
                ..Default::default()
            },
            m,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        )
        .unwrap();
        q
    }

    #[test]
    fn qkey_rules_and_grh() {
        let mut mem = InMemoryTable::new(0, 1 << 16);
        let k = mem
            .register(PdId(1), 0, 1 << 16, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mut a = up(1, 0x8000_0001);
        let mut b = up(2, 0x8000_0001);
        let mut c = up(3, 0x1111);
        let mut buf = vec![0; 4096];
        let grh6 = GrhInfo::V6 {
            src: [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            dst: [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3],
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        };
        for q in [&mut b, &mut c] {
            q.post_recv(&RecvWr::new(1).with_sge(Sge {
                addr: 1024,
                length: 100,
                lkey: k.lkey,
            }))
            .unwrap();
        }
        // high bit set in the WR: the QP's own Q_Key goes out
        let wr = SendWr::new(1, SendOp::Send)
            .with_sge(Sge {
                addr: 0,
                length: 10,
                lkey: k.lkey,
            })
            .with_ud(UdDest {
                ah: 5,
                remote_qpn: 2,
                remote_qkey: 0xFFFF_FFFF,
            });
        a.post_send(&mem, &wr).unwrap();
        let t = a.poll_transmit(0, &mut mem, &mut buf).unwrap();
        assert_eq!((t.ah, t.header.deth.unwrap().q_key), (5, 0x8000_0001));
        let payload = buf[..t.payload_len].to_vec();
        let pkt = Packet {
            header: t.header,
            payload: &payload,
        };
        b.handle_packet(0, &mut mem, &pkt, &grh6);
        let r = b.poll_recv_completion().unwrap();
        assert_eq!((r.status, r.byte_len, r.src_qp), (WcStatus::Success, 50, 1));
        assert_eq!(mem.bytes(1024, 1).unwrap()[0] >> 4, 6);
        // wrong Q_Key: dropped silently, receive still posted
        let mut h2 = t.header;
        h2.bth.dest_qp = 3;
        c.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h2,
                payload: &payload,
            },
            &grh6,
        );
        assert_eq!(c.stats().qkey_mismatch, 1);
        assert!(c.poll_recv_completion().is_none());
        // too long for the receive buffer: local length error
        let big = vec![7u8; 80];
        c.qkey = 0x8000_0001;
        c.handle_packet(
            0,
            &mut mem,
            &Packet {
                header: h2,
                payload: &big,
            },
            &grh6,
        );
        assert_eq!(
            c.poll_recv_completion().unwrap().status,
            WcStatus::LocLenErr
        );
        // no receive posted: dropped
        b.handle_packet(0, &mut mem, &pkt, &grh6);
        assert_eq!(b.stats().no_receive, 1);
        // longer than the MTU: refused at post
        let wr = SendWr::new(1, SendOp::Send)
            .with_sge(Sge {
                addr: 0,
                length: 2000,
                lkey: k.lkey,
            })
            .with_ud(UdDest {
                ah: 5,
                remote_qpn: 2,
                remote_qkey: 1,
            });
        assert!(a.post_send(&mem, &wr).is_err());
    }

    #[test]
    fn ipv4_grh_checksum() {
        let g = GrhInfo::V4 {
            src: [192, 0, 2, 2],
            dst: [192, 0, 2, 3],
            tos: 0,
            ttl: 64,
        }
        .bytes(12 + 8 + 256 + 4);
        assert!(g[..20].iter().all(|&b| b == 0));
        let mut sum = 0u32;
        for c in g[20..].chunks(2) {
            sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        assert_eq!(sum, 0xFFFF);
        assert_eq!(u16::from_be_bytes([g[22], g[23]]), 20 + 8 + 280);
    }
}
