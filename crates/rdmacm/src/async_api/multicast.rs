//! [`Multicast`]: a joined multicast group in the async layer: send datagrams to the group,
//! receive the group's datagrams.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdma_soft::verbs::{
    AccessFlags, AddressHandle, Completion, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

use super::blocking;
use super::completions::CompletionStream;
use crate::cm::channel::EventChannel;
use crate::cm::cma::Cma;
use crate::cm::id::CmId;
use crate::cm::mcast::McJoinFlags;
use crate::error::{Error, Result};
use crate::params::EventType;
use crate::ports::PortSpace;

/// Receives posted (and datagrams a [`Multicast`] can hold unread).
const RECVS: usize = 64;
/// Bytes of the GRH in front of a UD receive.
const GRH: usize = 40;

/// One datagram received from the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Its bytes.
    pub data: Vec<u8>,
    /// The sender's address (the GRH's source).
    pub src: IpAddr,
    /// The sender's QPN.
    pub src_qp: u32,
    /// Its immediate data, if it had some.
    pub imm: Option<u32>,
}

/// A multicast group joined by a UD id of its own: [`Multicast::send`] sends a datagram to
/// the group (from the joined QP; with no immediate, so that a receiver sees the QPN in
/// `src_qp` only), [`Multicast::recv`] yields the next datagram the group delivered, our
/// own included unless [`Multicast::join_with`] blocked them. Datagrams are at most one
/// path MTU (`max_datagram`); the 64 posted receives hold what the application has not
/// read yet, later ones are dropped as on any UD QP. Dropping it leaves the group.
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// use rdmacm::cm::McJoinFlags;
/// use rdmacm::Multicast;
/// let bind = "192.0.2.1:0".parse().unwrap();
/// let mut m = Multicast::join(bind, "239.1.2.3:0".parse().unwrap()).await?;
/// m.send(b"hello, group").await?;
/// let d = m.recv().await?; // our own, looped back
/// assert_eq!(d.data, b"hello, group");
/// # Ok(()) }
/// ```
pub struct Multicast {
    ch: EventChannel,
    id: Option<CmId>,
    pd: ProtectionDomain,
    qp: Arc<QueuePair>,
    completions: CompletionStream,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    ah: AddressHandle,
    group: SocketAddr,
    max: usize,
    received: VecDeque<Completion>,
    buf: Vec<Completion>,
}

impl std::fmt::Debug for Multicast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Multicast")
            .field("group", &self.group)
            .field("qpn", &self.qp.qpn())
            .finish()
    }
}

impl Multicast {
    /// Joins `group` as a full member from the local address `bind` (whose netdev carries
    /// the group), on the global context.
    pub async fn join(bind: SocketAddr, group: SocketAddr) -> Result<Multicast> {
        Multicast::join_with(bind, group, McJoinFlags::FullMember, false, None).await
    }

    /// [`Multicast::join`] with the join flags (send-only: nothing is received), whether
    /// the QP skips its own datagrams (`block_loopback`), and the context (`None`: global).
    pub async fn join_with(
        bind: SocketAddr,
        group: SocketAddr,
        flags: McJoinFlags,
        block_loopback: bool,
        cma: Option<Cma>,
    ) -> Result<Multicast> {
        let parts = blocking(move || {
            let cma = match cma {
                Some(c) => c,
                None => Cma::global()?,
            };
            let ch = EventChannel::with_cma(&cma)?;
            let id = CmId::new(&ch, PortSpace::Udp)?;
            id.resolve_addr(Some(bind), group, std::time::Duration::from_secs(2))?;
            let ev = ch.get_event()?;
            if ev.kind() != EventType::AddrResolved {
                return Err(event_error(&ev));
            }
            drop(ev);
            let dev = id
                .device()
                .ok_or_else(|| Error::InvalidArgument("no device for the group".into()))?;
            let port = id.port_num().unwrap_or(1);
            let mtu = 1usize << (dev.query_port(port)?.active_mtu as u32 + 7);
            let pd = dev.alloc_pd()?;
            let cc = dev.create_comp_channel()?;
            let cq = dev.create_cq(2 * RECVS + 16, Some(&cc))?;
            let mut init = QpInitAttr::ud(&cq, &cq);
            init.cap = QpCap {
                max_send_wr: 16,
                max_recv_wr: RECVS as u32,
                ..QpCap::default()
            };
            let qp = id.create_qp(&pd, &init)?;
            qp.set_block_self_mcast_loopback(block_loopback)?;
            let recv_mr = pd.alloc((GRH + mtu) * RECVS, AccessFlags::LOCAL_WRITE)?;
            for i in 0..RECVS {
                let sge = recv_mr.sge(i * (GRH + mtu), (GRH + mtu) as u32)?;
                qp.post_recv(&RecvWr::new(i as u64).with_sge(sge))?;
            }
            let send_mr = pd.alloc(mtu, AccessFlags::LOCAL_WRITE)?;
            id.join_multicast(group, flags, 0)?;
            let ev = ch.get_event()?;
            if ev.kind() != EventType::MulticastJoin {
                return Err(event_error(&ev));
            }
            let m = ev
                .mcast()
                .cloned()
                .ok_or_else(|| Error::InvalidArgument("MULTICAST_JOIN without its join".into()))?;
            drop(ev);
            let ah = pd.create_ah_on(m.port_num, &m.ah_attr)?;
            Ok((ch, id, pd, qp, cq, cc, recv_mr, send_mr, ah, mtu))
        })
        .await?;
        let (ch, id, pd, qp, cq, cc, recv_mr, send_mr, ah, max) = parts;
        Ok(Multicast {
            ch,
            id: Some(id),
            pd,
            qp,
            completions: CompletionStream::new(cq, cc)?,
            recv_mr,
            send_mr,
            ah,
            group,
            max,
            received: VecDeque::new(),
            buf: Vec::with_capacity(16),
        })
    }

    /// The group.
    pub fn group(&self) -> SocketAddr {
        self.group
    }

    /// The QP number our datagrams carry.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The largest datagram (the path MTU).
    pub fn max_datagram(&self) -> usize {
        self.max
    }

    /// The protection domain of the QP.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The id's CM events (MULTICAST_ERROR when the group is lost, ADDR_CHANGE ...).
    pub async fn next_event(&self) -> Result<crate::cm::Event> {
        self.ch.next_event().await
    }

    /// Sends `data` to the group and waits for its send completion. `EMSGSIZE`-like
    /// [`Error::InvalidArgument`] above [`Multicast::max_datagram`].
    pub async fn send(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.max {
            return Err(Error::InvalidArgument(format!(
                "a datagram of {} bytes is larger than the path MTU {}",
                data.len(),
                self.max
            )));
        }
        self.send_mr.write(0, data)?;
        let wr = SendWr::new(u64::MAX, SendOp::Send)
            .with_sge(self.send_mr.sge(0, data.len() as u32)?)
            .with_ud(
                self.ah
                    .dest(crate::params::MULTICAST_QPN, crate::cm::RDMA_UDP_QKEY),
            )
            .signaled();
        self.qp.post_send(&wr)?;
        let c = self.take(WcOpcode::Send).await?;
        match c.status {
            WcStatus::Success => Ok(()),
            s => Err(wc_error(s)),
        }
    }

    /// The next datagram from the group.
    pub async fn recv(&mut self) -> Result<Datagram> {
        let c = self.take(WcOpcode::Recv).await?;
        let slot = GRH + self.max;
        let at = c.wr_id as usize * slot;
        let d = if c.status == WcStatus::Success {
            let len = (c.byte_len as usize).saturating_sub(GRH).min(self.max);
            let mut raw = vec![0u8; GRH + len];
            self.recv_mr.read(at, &mut raw)?;
            let src = if raw[20] >> 4 == 4 {
                IpAddr::from(<[u8; 4]>::try_from(&raw[32..36]).unwrap_or_default())
            } else {
                IpAddr::from(<[u8; 16]>::try_from(&raw[8..24]).unwrap_or_default())
            };
            Some(Datagram {
                data: raw.split_off(GRH),
                src,
                src_qp: c.src_qp,
                imm: c.imm(),
            })
        } else {
            None
        };
        let sge = self.recv_mr.sge(at, slot as u32)?;
        self.qp.post_recv(&RecvWr::new(c.wr_id).with_sge(sge))?;
        match d {
            Some(d) => Ok(d),
            None => Err(wc_error(c.status)),
        }
    }

    /// The oldest completion of kind `op` (others stay queued for their taker).
    async fn take(&mut self, op: WcOpcode) -> Result<Completion> {
        loop {
            if let Some(i) = self.received.iter().position(|c| c.opcode == op) {
                if let Some(c) = self.received.remove(i) {
                    return Ok(c);
                }
            }
            self.buf.clear();
            if self.completions.next_batch(&mut self.buf, 16).await == 0 {
                return Err(Error::Shutdown);
            }
            self.received.extend(self.buf.drain(..));
        }
    }
}

/// An event where another was expected: its errno when it has one.
fn event_error(ev: &crate::cm::Event) -> Error {
    if ev.status() < 0 {
        return Error::Io(std::io::Error::from_raw_os_error(-ev.status()));
    }
    Error::InvalidArgument(format!("unexpected {}", ev.kind()))
}

/// A datagram's completion with an error status.
fn wc_error(s: WcStatus) -> Error {
    Error::Io(std::io::Error::other(format!("completion status {s:?}")))
}

impl Drop for Multicast {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = id.leave_multicast(self.group);
        }
    }
}
