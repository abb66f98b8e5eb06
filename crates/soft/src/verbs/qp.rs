//! Queue pairs: verbs objects over rdma-proto's RC transport, driven by the device runtime.

use std::sync::Arc;

use rdma_proto::memory::{AtomicOp, MemError, MemKey, MemoryTable};
use rdma_proto::rc::{RcConfig, RcQp};
use rdma_proto::ud::{UdConfig, UdQp};
use rdma_proto::verbs::{
    AccessFlags, PathAttr, PdId, QpAttr, QpAttrMask, QpState, QpType, RecvWr, RtrParams, RtsParams,
    SendFlags, SendWr, SgList, Sge, MAX_SGE,
};

use super::device::DeviceArc;
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use crate::queues::cq::CompletionQueue;
use crate::{Error, Result};

/// Queue sizes of a QP (`ibv_qp_cap`).
///
/// ```
/// let cap = rdma_soft::verbs::QpCap::default();
/// assert_eq!(cap.max_send_wr, 128);
/// assert_eq!(cap.max_inline_data, 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send work requests outstanding at most.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at most (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather elements per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive work request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send ([`QueuePair::post_send_inline`]).
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: MAX_SGE as u32,
            max_recv_sge: MAX_SGE as u32,
            max_inline_data: 64,
        }
    }
}

/// How to create a QP (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Transport: [`QpType::Rc`] or [`QpType::Ud`] (EINVAL otherwise).
    pub qp_type: QpType,
    /// CQ of send completions (of this device).
    pub send_cq: &'a CompletionQueue,
    /// CQ of receive completions (of this device).
    pub recv_cq: &'a CompletionQueue,
    /// Shared receive queue (of the QP's PD), instead of the QP's own receive queue.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WR completes with a completion, signaled or not.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// An RC QP with default sizes, selective signaling, no SRQ.
    pub fn rc(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> QpInitAttr<'a> {
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }

    /// A UD QP with default sizes, selective signaling, no SRQ (address datagrams with an [`super::AddressHandle`]).
    pub fn ud(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> QpInitAttr<'a> {
        QpInitAttr {
            qp_type: QpType::Ud,
            ..QpInitAttr::rc(send_cq, recv_cq)
        }
    }
}

/// A queue pair of a software device.
///
/// Posting a send transmits at once in the caller's thread (up to the send window); receive
/// processing, ACKs, READ responses, retransmissions and timeouts run in the process's
/// progress engine ([`crate::engine`]) whatever the application does, or inline when a CQ
/// is polled empty.
///
/// Connecting by hand, as `ibv_rc_pingpong` does (each side's `rq_psn` is the PSN it expects,
/// so the peer's `sq_psn`):
///
/// ```
/// use rdma_soft::verbs::*;
/// # fn dev(ip: &str) -> Device {
/// #     let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
/// #     cfg.gids = vec![ip.parse().unwrap()];
/// #     let wire = rdma_soft::io::UdpWire::new(rdma_soft::io::UdpConfig { port: 47914, ..Default::default() }).unwrap();
/// #     Device::open_with_wire(cfg, Box::new(wire)).unwrap()
/// # }
/// let (da, db) = (dev("127.0.0.61"), dev("127.0.0.62"));
/// let setup = |d: &Device| {
///     let pd = d.alloc_pd().unwrap();
///     let cq = d.create_cq(64, None).unwrap();
///     let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
///     let mr = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
///     (pd, cq, qp, mr)
/// };
/// let (_pa, cqa, qpa, mra) = setup(&da);
/// let (_pb, cqb, qpb, mrb) = setup(&db);
/// let gid = |s: &str| s.parse::<rdma_soft::io::WireAddr>().unwrap().gid();
/// qpa.connect(qpb.qpn(), 200, 100, gid("127.0.0.62")).unwrap(); // sends from 100, expects 200
/// qpb.connect(qpa.qpn(), 100, 200, gid("127.0.0.61")).unwrap();
/// mra.write(0, b"hello over RoCEv2").unwrap();
/// qpb.post_recv(&RecvWr::new(7).with_sge(mrb.sge(0, 4096).unwrap())).unwrap();
/// qpa.post_send(&SendWr::new(1, SendOp::Send).with_sge(mra.sge(0, 17).unwrap()).signaled()).unwrap();
/// let mut wc = Vec::new();
/// while cqb.poll(&mut wc, 1) == 0 {}
/// assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].status), (7, 17, WcStatus::Success));
/// while cqa.poll(&mut wc, 1) == 0 {}
/// assert_eq!(wc[1].wr_id, 1);
/// let mut got = [0u8; 17];
/// mrb.read(0, &mut got).unwrap();
/// assert_eq!(&got, b"hello over RoCEv2");
/// ```
pub struct QueuePair {
    dev: DeviceArc,
    qpn: u32,
    pd: ProtectionDomain,
    cap: QpCap,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    ud: bool,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &format_args!("{:#x}", self.qpn))
            .field("pd", &self.pd.id().0)
            .finish()
    }
}

/// The memory a post sees: the device's table, plus the inline bytes given at post time
/// (`read_inline` reads them, by offset; nothing else is readable inline).
struct PostMem<'a, M> {
    table: &'a M,
    inline: &'a [u8],
}

impl<M: MemoryTable> MemoryTable for PostMem<'_, M> {
    fn check(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        self.table.check(pd, key, addr, len, need)
    }
    fn read(&self, pd: PdId, key: MemKey, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.table.read(pd, key, addr, dst)
    }
    fn write(&mut self, _: PdId, _: MemKey, _: u64, _: &[u8]) -> Result<(), MemError> {
        Err(MemError::InvalidKey)
    }
    fn atomic_remote(&mut self, _: PdId, _: u32, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Err(MemError::InvalidKey)
    }
    fn invalidate_remote(&mut self, _: PdId, _: u32) -> Result<(), MemError> {
        Err(MemError::InvalidKey)
    }
    fn read_inline(&self, _: PdId, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let start = usize::try_from(addr).map_err(|_| MemError::OutOfBounds)?;
        let end = start.checked_add(dst.len()).ok_or(MemError::OutOfBounds)?;
        let src = self.inline.get(start..end).ok_or(MemError::OutOfBounds)?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

impl QueuePair {
    pub(crate) fn create(pd: &ProtectionDomain, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        let dev = pd.device().clone();
        if !matches!(init.qp_type, QpType::Rc | QpType::Ud) {
            return Err(Error::InvalidArgument("only RC and UD QPs are implemented"));
        }
        if init.qp_type == QpType::Ud && init.srq.is_some() {
            return Err(Error::InvalidArgument(
                "UD QPs with an SRQ are not implemented",
            ));
        }
        if !init.send_cq.same_device(dev.source()) || !init.recv_cq.same_device(dev.source()) {
            return Err(Error::InvalidArgument("CQ of another device"));
        }
        if let Some(srq) = init.srq {
            if srq.pd().id() != pd.id() || !Arc::ptr_eq(srq.pd().device(), &dev) {
                return Err(Error::InvalidArgument("SRQ of another protection domain"));
            }
        }
        let a = dev.attr();
        let c = init.cap;
        if c.max_send_wr == 0
            || c.max_send_wr > a.max_qp_wr
            || c.max_recv_wr > a.max_qp_wr
            || c.max_send_sge > a.max_sge
            || c.max_recv_sge > a.max_sge
            || c.max_inline_data > a.max_inline_data
        {
            return Err(Error::InvalidArgument(
                "QP capabilities beyond the device's",
            ));
        }
        let mut rt = dev.runtime();
        let qpn = rt.alloc_qpn(a.max_qp as usize)?;
        let ud = init.qp_type == QpType::Ud;
        if ud {
            let mut cfg = UdConfig::new(qpn, pd.id());
            cfg.max_send_wr = c.max_send_wr;
            cfg.max_recv_wr = c.max_recv_wr.max(1);
            cfg.sq_sig_all = init.sq_sig_all;
            // the smallest of the ports' MTUs: a UD QP may move to any port at Init
            cfg.mtu = dev.min_active_mtu();
            rt.create_ud(
                qpn,
                UdQp::new(cfg),
                init.send_cq.clone(),
                init.recv_cq.clone(),
            );
        } else {
            Self::insert_rc(&mut rt, qpn, pd, init);
        }
        drop(rt);
        Ok(QueuePair {
            dev,
            qpn,
            pd: pd.clone(),
            cap: c,
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.cloned(),
            ud,
        })
    }

    fn insert_rc(
        rt: &mut crate::runtime::Runtime,
        qpn: u32,
        pd: &ProtectionDomain,
        init: &QpInitAttr<'_>,
    ) {
        let c = init.cap;
        let mut cfg = RcConfig::new(qpn, pd.id());
        cfg.max_send_wr = c.max_send_wr;
        cfg.max_recv_wr = if init.srq.is_some() {
            // receives come from the SRQ one at a time
            4
        } else {
            c.max_recv_wr.max(1)
        };
        cfg.max_inline_data = c.max_inline_data;
        cfg.sq_sig_all = init.sq_sig_all;
        cfg.max_outstanding_psns = crate::SEND_WINDOW;
        rt.create_rc(
            RcQp::new(cfg),
            init.send_cq.clone(),
            init.recv_cq.clone(),
            init.srq.map(|s| s.ring().clone()),
            &pd.device().name,
        );
    }

    pub(crate) fn device(&self) -> &DeviceArc {
        &self.dev
    }

    /// Whether this is a UD QP.
    pub fn is_ud(&self) -> bool {
        self.ud
    }

    /// The QP number (24 bits; never 0 or 1, which are reserved for QP0 and QP1).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Its protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Its queue sizes.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// Its send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }

    /// Its receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }

    /// The device port the last packet for this RC QP arrived on (the port whose GID table
    /// holds the address it arrived at); `None` before any, for a UD QP or a destroyed one.
    pub fn last_rx_port(&self) -> Option<u8> {
        if self.ud {
            return None;
        }
        let mut rt = self.dev.runtime();
        rt.rx_port(self.qpn)
    }

    /// Its SRQ, if any.
    pub fn srq(&self) -> Option<&SharedReceiveQueue> {
        self.srq.as_ref()
    }

    /// `ibv_modify_qp`: the verbs state machine (rdma-proto's transition table: required and
    /// allowed attributes per transition, value ranges; EINVAL otherwise). With
    /// [`QpAttrMask::AV`] (Init → RTR) the source GID (`path.sgid_index` into the GID table
    /// of the QP's port, `port_num` as set at Reset → Init, port 1 by default; EINVAL for a
    /// port the device lacks) is opened on the wire: UDP 4791 is bound on that address, and only on it
    /// (EADDRINUSE when another process holds it); the QP's datagrams leave from the UDP
    /// source port of `path.flow_label`, or of a label from both QPNs when it is 0, as
    /// Linux rxe's ([`crate::io::flow::connected_udp_sport`]), whose send-only socket is
    /// opened here (from 4791 when it cannot be). The path MTU may not exceed the port's
    /// active MTU. Entering Err completes every outstanding WR flushed.
    ///
    /// The alternate path ([`QpAttrMask::ALT_PATH`]: `alt_path`, `alt_port_num`,
    /// `alt_pkey_index`, `alt_timeout`) is an address vector on another port of the device
    /// (`alt_path.sgid_index` into that port's GID table, its source address opened as the
    /// primary's; the path MTU must fit that port too); `path_mig_state`
    /// ([`QpAttrMask::PATH_MIG_STATE`]) follows rdma-proto's rules (`Armed` at setup,
    /// `Rearm` once an alternate is loaded, `Migrated` from Armed in RTS:
    /// [`QueuePair::migrate`]). EINVAL for an alternate on the QP's own port, on a port the
    /// device lacks, or a migration state transition the rules refuse; nothing is changed
    /// when the call fails. [`QueuePair::query`] returns them all.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        if self.ud {
            return super::ud::modify(&self.dev, self.qpn, attr, mask);
        }
        super::rc_modify::modify(&self.dev, self.qpn, attr, mask)
    }

    /// Moves a fresh QP through Init and RTR to RTS with common settings, as
    /// `ibv_rc_pingpong` does: `dest_qpn` and `dgid` of the peer, `rq_psn` this side expects
    /// (the peer's `sq_psn`), `sq_psn` it sends from; source GID index 0, the port's active
    /// MTU, all remote access rights, 16 READs/atomics each way, local ACK timeout 14
    /// (67 ms, as `ibv_rc_pingpong`: with 7 retries a peer may make no progress for about
    /// 0.5 s before `RetryExcErr`; 12 (17 ms, 134 ms in all) recovered faster from injected
    /// loss but failed transfers on a loaded 2-core machine), 7 retries, infinite RNR
    /// retries, RNR timer 12 (0.64 ms).
    pub fn connect(&self, dest_qpn: u32, rq_psn: u32, sq_psn: u32, dgid: [u8; 16]) -> Result<()> {
        self.connect_on(1, dest_qpn, rq_psn, sq_psn, dgid)
    }

    /// [`QueuePair::connect`] on port `port` of the device: source GID index 0 of that
    /// port's table, its active MTU (EINVAL for a port the device lacks).
    pub fn connect_on(
        &self,
        port: u8,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        dgid: [u8; 16],
    ) -> Result<()> {
        let path_mtu = self.dev.active_mtu_on(port)?;
        let (mut a, m) = QpAttr::init(QpAttr::RC_ACCESS);
        a.port_num = port;
        self.modify(&a, m)?;
        let (a, m) = a.rtr(&RtrParams {
            path: PathAttr {
                dgid,
                hop_limit: 64,
                ..PathAttr::default()
            },
            path_mtu,
            dest_qp_num: dest_qpn,
            rq_psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        });
        self.modify(&a, m)?;
        let (a, m) = a.rts(&RtsParams {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn,
            max_rd_atomic: 16,
        });
        self.modify(&a, m)
    }

    /// `ibv_query_qp`: the current attributes (state, PSNs, path, limits).
    pub fn query(&self) -> Result<QpAttr> {
        if self.ud {
            return super::ud::query(&self.dev, self.qpn);
        }
        Ok(self.dev.runtime().rc_qp(self.qpn)?.attr())
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        if self.ud {
            return super::ud::query(&self.dev, self.qpn).map_or(QpState::Err, |a| a.qp_state);
        }
        self.dev.runtime().state(self.qpn).unwrap_or(QpState::Err)
    }

    /// `ibv_post_send`: queues `wr` (its SG list references registered memory by lkey; keys
    /// are checked when the data is gathered, failures complete the WR with an error) and
    /// transmits at once in the caller's thread, up to the send window. EINVAL in Reset, Init
    /// or RTR, for more SG elements than `max_send_sge` and for [`SendFlags::INLINE`] (use
    /// [`Self::post_send_inline`]); ENOMEM when the send queue is full.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        if wr.sg.len() > self.cap.max_send_sge as usize {
            return Err(Error::InvalidArgument(
                "more scatter/gather elements than max_send_sge",
            ));
        }
        if wr.flags.contains(SendFlags::INLINE) {
            return Err(Error::InvalidArgument(
                "inline data is passed as bytes: use post_send_inline",
            ));
        }
        self.post(wr, &[])
    }

    /// `ibv_post_send` with `IBV_SEND_INLINE`: the data is `data`, copied now (at most
    /// `max_inline_data` bytes, EINVAL otherwise); `wr`'s own SG list is ignored. Not for
    /// READs or atomics (EINVAL).
    pub fn post_send_inline(&self, wr: &SendWr, data: &[u8]) -> Result<()> {
        if data.len() > self.cap.max_inline_data as usize {
            return Err(Error::InvalidArgument(
                "inline data longer than max_inline_data",
            ));
        }
        let mut w = *wr;
        w.flags |= SendFlags::INLINE;
        w.sg = SgList::new();
        if !data.is_empty() {
            let _ = w.sg.push(Sge {
                addr: 0,
                length: data.len() as u32,
                lkey: 0,
            });
        }
        self.post(&w, data)
    }

    fn post(&self, wr: &SendWr, inline: &[u8]) -> Result<()> {
        let mut rt = self.dev.runtime();
        let mut mem = self.dev.mrs.view();
        if self.ud {
            let ok_ah = wr.ud.is_some_and(|d| rt.ah_exists(d.ah));
            if !ok_ah {
                return Err(Error::InvalidArgument(
                    "UD send needs wr.ud with an address handle of this device",
                ));
            }
            let mut pm = PostMem {
                table: &mem,
                inline,
            };
            rt.ud_qp(self.qpn)?.post_send(&pm, wr)?;
            // gathered now, while the inline bytes are at hand
            let r = rt.ud_service(self.qpn, &mut pm);
            self.dev.posted(&rt, self.qpn);
            return r;
        }
        let pm = PostMem {
            table: &mem,
            inline,
        };
        rt.rc_qp(self.qpn)?.post_send(&pm, wr)?;
        // While the engine has left the device to a busy poller, the poller reads the
        // clock and runs the timers, and the engine looks back within its hand-off time
        // anyway: a post reads no clock and leaves the engine's wake time alone.
        if self.dev.engine_deferred() {
            return rt.after_post_busy(self.qpn, &mut mem);
        }
        let r = rt.after_post(self.qpn, &mut mem);
        self.dev.posted(&rt, self.qpn);
        r
    }

    /// `ibv_post_recv`: queues a receive (allowed from Init on). EINVAL with an SRQ (post to
    /// the SRQ) or more SG elements than `max_recv_sge`; ENOMEM when full.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::InvalidArgument(
                "QP uses an SRQ: post receives to the SRQ",
            ));
        }
        if wr.sg.len() > self.cap.max_recv_sge as usize {
            return Err(Error::InvalidArgument(
                "more scatter/gather elements than max_recv_sge",
            ));
        }
        let mut rt = self.dev.runtime();
        if self.ud {
            rt.ud_qp(self.qpn)?.post_recv(wr)?;
            let mut mem = self.dev.mrs.view();
            return rt.ud_service(self.qpn, &mut mem);
        }
        let rc = rt.rc_qp(self.qpn)?;
        rc.post_recv(wr)?;
        // the credit update that ends the peer's RNR wait leaves now (rdma-proto
        // `rc/credit.rs`)
        if rc.state() == QpState::Err || rc.take_credit_update() {
            let mut mem = self.dev.mrs.view();
            rt.after_post(self.qpn, &mut mem)?;
            self.dev.posted(&rt, self.qpn);
        }
        Ok(())
    }

    /// Transport counters of this QP (packets, retransmissions, NAKs, duplicates).
    pub fn transport_stats(&self) -> Option<rdma_proto::rc::RcStats> {
        self.dev.runtime().rc_qp(self.qpn).ok().map(|rc| rc.stats())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if self.ud {
            self.dev.runtime().ud_remove(self.qpn);
            return;
        }
        let ctx = self.dev.runtime().remove(self.qpn);
        drop(ctx);
    }
}
