//! The async layer (tokio), built on the event-channel API: [`Listener`] and
//! [`Connection`], with a message data path ([`Connection::send`], [`Connection::recv`])
//! and TCP-like teardown ([`Connection::closed`], [`Connection::disconnect`]).
//!
//! Each listener and connection has its own [`EventChannel`]; the process's progress engine
//! drives the CM and the devices (an async caller is never inside `get_event` and never
//! spins). Calls that wait for netlink (bind, address resolution) run on tokio's blocking
//! pool.
//!
//! # The message layer
//!
//! A [`Connection`] owns its QP's data path. Its CQ has a completion channel, registered
//! with tokio's reactor (`AsyncFd`); one task per connection sleeps on that fd and on the
//! connection's event channel, takes the completions the engine queued, and wakes the
//! futures waiting for them. Nothing polls in a loop: an idle connection costs no CPU.
//!
//! Messages travel in buffers the library registered when the connection was made:
//! [`WINDOW`] send buffers and [`WINDOW`] + [`CONTROL_WINDOW`] receive buffers of
//! [`MAX_MESSAGE`] bytes each, all receives posted before the REQ or REP leaves, so the
//! first message never meets an empty receive queue. [`Connection::send`] copies into a
//! free send buffer and posts a SEND with immediate data; [`Connection::recv`] copies a
//! received message out and reposts its buffer.
//!
//! ## Credits
//!
//! Both sides use the same fixed window (the constants of this module): a sender starts
//! with [`WINDOW`] data credits and [`CONTROL_WINDOW`] control credits, one per receive
//! the peer has posted, and spends one per message, so a SEND never finds the peer's
//! receive queue empty (no RNR NAK, no retry). The 32-bit immediate of every SEND returns
//! credits: bits 0-15 are data receives the sender reposted since its last SEND (its
//! application took those messages), bits 16-23 control receives it reposted, bit 31 marks
//! a control message (no payload, not delivered). Returns ride on data messages; a side
//! that only receives sends a control message when it holds [`WINDOW`] / 2 unreturned
//! credits, or as soon as the peer may have none left. Control messages spend control
//! credits, which come back on the peer's next data message, so credit traffic never
//! feeds on itself.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rdma_soft::verbs::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, Device, MemoryRegion,
    ProtectionDomain, QpInitAttr, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::channel::EventChannel;
use crate::cma::Cma;
use crate::error::{CloseReason, Error, Result};
use crate::event::Event;
use crate::id::CmId;
use crate::params::{ConnParam, EventType};
use crate::ports::PortSpace;

/// Largest message [`Connection::send`] takes and [`Connection::recv`] returns (64 KiB).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Messages a [`Connection`] may have in flight toward its peer: data receives each side
/// posts, and send buffers each side registers.
pub const WINDOW: u32 = 16;
/// Extra receives each side posts for credit-only control messages.
pub const CONTROL_WINDOW: u32 = 2;
/// One-sided operations ([`Connection::write`], [`Connection::read`]) a connection keeps
/// outstanding at most; more wait for one to complete.
pub const MAX_RDMA_OPS: usize = 64;
/// How long [`Connection::disconnect`] waits for the peer's answer at most, beyond the CM's
/// own bound (the DREQ's retries end in DISCONNECTED too).
pub const DISCONNECT_WAIT: Duration = Duration::from_secs(30);

const CQ_SIZE: usize = 256;
const TAG_SHIFT: u32 = 62;
/// One-sided operations (tag 0: the wr_id is the operation's number).
const TAG_RDMA: u64 = 0;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;
const TAG_CTRL: u64 = 3;
const IMM_CTRL: u32 = 1 << 31;

/// How [`Connection::connect`] connects.
///
/// ```
/// let o = rdmacm::ConnectOptions { private_data: b"hello".to_vec(), ..Default::default() };
/// assert_eq!(o.timeout, std::time::Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Private data for the REQ (at most 56 bytes).
    pub private_data: Vec<u8>,
    /// Address and route resolution timeout.
    pub timeout: Duration,
    /// Source address to bind first (`None`: chosen by the route).
    pub src: Option<SocketAddr>,
    /// Everything else of the REQ (its `private_data` is replaced by the field above).
    pub conn_param: ConnParam,
    /// The context (`None`: [`Cma::global`]).
    pub cma: Option<Cma>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            private_data: Vec::new(),
            timeout: Duration::from_secs(2),
            src: None,
            conn_param: ConnParam::default(),
            cma: None,
        }
    }
}

fn event_error(ev: &Event) -> Error {
    match ev.kind() {
        EventType::Rejected => Error::ConnectionRefused(ev.status().max(0) as u16),
        EventType::Unreachable => Error::TimedOut,
        _ if ev.status() < 0 => Error::Io(std::io::Error::from_raw_os_error(-ev.status())),
        _ => Error::InvalidArgument(format!("unexpected event {}", ev.kind())),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?
}

/// A listening id with its own channel.
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// let l = rdmacm::Listener::bind("127.0.0.1:7471".parse().unwrap()).await?;
/// let c = l.accept().await?;
/// println!("from {:?}, said {:?}", c.peer_addr(), c.peer_private_data());
/// # Ok(()) }
/// ```
pub struct Listener {
    ch: Arc<EventChannel>,
    id: Option<CmId>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("id", &self.id).finish()
    }
}

impl Listener {
    /// Binds and listens on `addr` (backlog 1024) on the global context.
    pub async fn bind(addr: SocketAddr) -> Result<Listener> {
        Listener::bind_with(addr, None).await
    }

    /// Binds and listens on `addr` on `cma` (`None`: the global context).
    pub async fn bind_with(addr: SocketAddr, cma: Option<Cma>) -> Result<Listener> {
        let (ch, id) = blocking(move || {
            let cma = match cma {
                Some(c) => c,
                None => Cma::global()?,
            };
            let ch = EventChannel::with_cma(&cma)?;
            let id = CmId::new(&ch, PortSpace::Tcp)?;
            id.bind_addr(addr)?;
            id.listen(0)?;
            Ok((ch, id))
        })
        .await?;
        Ok(Listener {
            ch: Arc::new(ch),
            id: Some(id),
        })
    }

    /// The bound address (with the chosen port).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|i| i.local_addr())
    }

    /// The next connection: takes a request, creates a PD, a CQ with a completion channel,
    /// the QP and the message buffers on the device it arrived on (receives posted),
    /// accepts with no private data, and waits for ESTABLISHED.
    pub async fn accept(&self) -> Result<Connection> {
        self.accept_with(ConnParam::default()).await
    }

    /// Like [`Listener::accept`] with the REP's parameters (private data, resources).
    pub async fn accept_with(&self, param: ConnParam) -> Result<Connection> {
        loop {
            let mut ev = self.ch.next_event().await?;
            if ev.kind() != EventType::ConnectRequest {
                continue;
            }
            let Some(id) = ev.take_id() else { continue };
            let peer_pd = ev.private_data().to_vec();
            drop(ev);
            let cma = self.ch.cma();
            let param = param.clone();
            let r = blocking(move || {
                let ch = EventChannel::with_cma(&cma)?;
                id.migrate(&ch)?;
                let parts = Parts::create(&id)?;
                id.accept(&param)?;
                Ok((ch, id, parts))
            })
            .await;
            let Ok((ch, id, parts)) = r else {
                // The request failed (e.g. the peer went away): take the next one.
                continue;
            };
            let ch = Arc::new(ch);
            match wait_established(&ch).await {
                Ok(_) => return Connection::start(ch, id, parts, peer_pd),
                Err(_) => continue,
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        drop(self.id.take());
    }
}

async fn wait_established(ch: &EventChannel) -> Result<Event> {
    loop {
        let ev = ch.next_event().await?;
        match ev.kind() {
            EventType::Established => return Ok(ev),
            EventType::AddrChange | EventType::TimewaitExit => continue,
            _ => return Err(event_error(&ev)),
        }
    }
}

/// The verbs objects of a connection, made before the REQ or REP leaves.
struct Parts {
    qp: Arc<QueuePair>,
    cq: CompletionQueue,
    cc: CompletionChannel,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
}

impl Parts {
    fn create(id: &CmId) -> Result<Parts> {
        let dev = id
            .device()
            .ok_or_else(|| Error::InvalidArgument("id has no device yet".into()))?;
        let pd = dev.alloc_pd()?;
        let cc = dev.create_comp_channel()?;
        let cq = dev.create_cq(CQ_SIZE, Some(&cc))?;
        let qp = id.create_qp(&pd, &QpInitAttr::rc(&cq, &cq))?;
        let parts = Parts::register(&pd, qp, cq, cc)?;
        for slot in 0..WINDOW + CONTROL_WINDOW {
            parts.post_recv(slot)?;
        }
        Ok(parts)
    }

    fn register(
        pd: &ProtectionDomain,
        qp: Arc<QueuePair>,
        cq: CompletionQueue,
        cc: CompletionChannel,
    ) -> Result<Parts> {
        let send_mr = pd.register(
            vec![0u8; WINDOW as usize * MAX_MESSAGE],
            AccessFlags::LOCAL_WRITE,
        )?;
        let recv_mr = pd.register(
            vec![0u8; (WINDOW + CONTROL_WINDOW) as usize * MAX_MESSAGE],
            AccessFlags::LOCAL_WRITE,
        )?;
        Ok(Parts {
            qp,
            cq,
            cc,
            send_mr,
            recv_mr,
        })
    }

    fn post_recv(&self, slot: u32) -> Result<()> {
        let sge = self
            .recv_mr
            .sge(slot as usize * MAX_MESSAGE, MAX_MESSAGE as u32)?;
        self.qp
            .post_recv(&RecvWr::new(tag(TAG_RECV, slot)).with_sge(sge))?;
        Ok(())
    }
}

fn tag(kind: u64, slot: u32) -> u64 {
    (kind << TAG_SHIFT) | slot as u64
}

/// The state the connection's task and its futures share, behind one mutex.
struct State {
    closed: Option<CloseReason>,
    /// The CM reported DISCONNECTED (the peer answered or sent its DREQ).
    disconnected: bool,
    /// `rdma_disconnect` was called (DREQ or DREP sent, QP in Err).
    dreq_sent: bool,
    data_credits: u32,
    ctrl_credits: u32,
    free_send: Vec<u32>,
    received: VecDeque<(u32, u32)>,
    /// Data receives reposted and not yet announced to the peer.
    ret_data: u32,
    /// Control receives reposted and not yet announced.
    ret_ctrl: u32,
    /// Data credits announced to the peer in total, and data messages received: the
    /// peer holds at most `WINDOW + returned - received_data` credits.
    returned: u64,
    received_data: u64,
    /// Outstanding one-sided operations: `None` until their completion's status arrives.
    ops: HashMap<u64, Option<WcStatus>>,
    next_op: u64,
}

impl State {
    fn peer_credits_at_most(&self) -> u64 {
        (WINDOW as u64 + self.returned).saturating_sub(self.received_data)
    }

    fn take_returns(&mut self) -> u32 {
        let imm = self.ret_data | (self.ret_ctrl << 16);
        self.returned += self.ret_data as u64;
        self.ret_data = 0;
        self.ret_ctrl = 0;
        imm
    }
}

struct Shared {
    parts: Parts,
    afd: AsyncFd<CompletionChannel>,
    st: Mutex<State>,
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the connection closed (the first reason wins) and wakes every future.
    fn close(&self, st: &mut State, why: CloseReason) {
        if st.closed.is_none() {
            st.closed = Some(why);
        }
        self.changed.notify_waiters();
    }

    /// Sends a control message when the peer may be short of credits we owe it.
    fn maybe_return_credits(&self, st: &mut State) {
        if st.closed.is_some() || st.ret_data == 0 || st.ctrl_credits == 0 {
            return;
        }
        if st.ret_data < WINDOW / 2 && st.peer_credits_at_most() > 0 {
            return;
        }
        let imm = IMM_CTRL | st.take_returns();
        let wr = SendWr::new(tag(TAG_CTRL, 0), SendOp::SendWithImm { imm }).signaled();
        match self.parts.qp.post_send(&wr) {
            Ok(()) => st.ctrl_credits -= 1,
            Err(e) => self.close(st, CloseReason::PostFailed(e.to_string())),
        }
    }

    fn on_completion(&self, st: &mut State, c: &Completion) -> Option<WcStatus> {
        let kind = c.wr_id >> TAG_SHIFT;
        let slot = (c.wr_id & ((1 << TAG_SHIFT) - 1)) as u32;
        if kind == TAG_RDMA {
            if let Some(op) = st.ops.get_mut(&c.wr_id) {
                *op = Some(c.status);
            }
        }
        if !c.status.is_success() {
            // Flushes after a close are expected; anything else closes the connection.
            if st.closed.is_none() {
                self.close(st, CloseReason::Failed(c.status));
                return Some(c.status);
            }
            if kind == TAG_SEND {
                st.free_send.push(slot);
            }
            return None;
        }
        match kind {
            TAG_SEND => st.free_send.push(slot),
            TAG_RECV => {
                let imm = c.imm().unwrap_or(0);
                st.data_credits += imm & 0xffff;
                st.ctrl_credits += (imm >> 16) & 0xff;
                if c.opcode == WcOpcode::Recv && imm & IMM_CTRL != 0 {
                    st.ret_ctrl += 1;
                    if let Err(e) = self.parts.post_recv(slot) {
                        self.close(st, CloseReason::PostFailed(e.to_string()));
                    }
                } else {
                    st.received.push_back((slot, c.byte_len));
                    st.received_data += 1;
                }
            }
            _ => {}
        }
        None
    }

    /// Takes every queued completion; returns the first failure status, if any. The CQ is
    /// popped under the state lock, so that completions are processed in their order
    /// whichever task drains.
    fn drain(&self, buf: &mut Vec<Completion>) -> Option<WcStatus> {
        let mut failed = None;
        loop {
            let mut st = self.lock();
            buf.clear();
            if self.parts.cq.poll(buf, 64) == 0 {
                // About to sleep: arm, then look once more (a completion may have come in
                // between).
                if self.parts.cq.req_notify(false).is_err()
                    || self.parts.cq.poll_queued(buf, 64) == 0
                {
                    return failed;
                }
            }
            for c in buf.iter() {
                failed = failed.or(self.on_completion(&mut st, c));
            }
            self.maybe_return_credits(&mut st);
            drop(st);
            self.changed.notify_waiters();
        }
    }

    /// `rdma_disconnect` once (DREQ, or DREP when the peer disconnected first; the QP goes
    /// to Err and every outstanding work request is flushed).
    fn disconnect_id(&self, id: &CmId) {
        let first = {
            let mut st = self.lock();
            !std::mem::replace(&mut st.dreq_sent, true)
        };
        if first {
            // Fails only when the CM already tore the connection down; then the QP is
            // already in Err.
            let _ = id.disconnect();
        }
    }
}

/// The connection's task: sleeps on the completion channel and the event channel.
async fn run(
    sh: Arc<Shared>,
    ch: Arc<EventChannel>,
    id: Weak<CmId>,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
) {
    let mut buf = Vec::with_capacity(64);
    loop {
        if sh.drain(&mut buf).is_some() {
            if let Some(id) = id.upgrade() {
                sh.disconnect_id(&id);
            }
        }
        tokio::select! {
            ev = ch.next_event() => {
                let Ok(ev) = ev else { return };
                let why = match ev.kind() {
                    EventType::TimewaitExit => continue,
                    EventType::Disconnected => Some(CloseReason::PeerDisconnected),
                    k @ (EventType::Unreachable
                    | EventType::ConnectError
                    | EventType::DeviceRemoval
                    | EventType::Rejected) => Some(CloseReason::Event(k)),
                    _ => None,
                };
                if let Some(why) = why {
                    {
                        let mut st = sh.lock();
                        if ev.kind() == EventType::Disconnected {
                            st.disconnected = true;
                        }
                        sh.close(&mut st, why);
                    }
                    if let Some(id) = id.upgrade() {
                        sh.disconnect_id(&id);
                    }
                    sh.changed.notify_waiters();
                }
                // Acknowledged when the application drops it (or at once if the
                // connection is gone).
                drop(events.send(ev));
            }
            g = sh.afd.readable() => {
                let Ok(mut g) = g else { return };
                while let Ok(Some(_)) = sh.parts.cc.get_event() {}
                g.clear_ready();
            }
        }
    }
}

/// A region of the peer's memory that [`Connection::write`] and [`Connection::read`]
/// reach: its address, rkey and length, as the peer's [`RemoteBuf::of`] gave them. It
/// travels as 16 bytes ([`RemoteBuf::to_bytes`], network byte order), in a message or in
/// the private data of a REQ or REP.
///
/// ```
/// use rdmacm::RemoteBuf;
/// let rb = RemoteBuf { addr: 0x1000, rkey: 0xabcd, len: 4096 };
/// let mut private_data = rb.to_bytes().to_vec();
/// private_data.resize(56, 0); // zero padded, as a REP's private data arrives
/// assert_eq!(RemoteBuf::from_bytes(&private_data), Some(rb));
/// assert_eq!(rb.slice(1024, 512), Some(RemoteBuf { addr: 0x1400, rkey: 0xabcd, len: 512 }));
/// assert_eq!(rb.slice(4000, 512), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// The region's address (in the peer's region address space).
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u32,
}

impl RemoteBuf {
    /// Bytes of [`RemoteBuf::to_bytes`].
    pub const ENCODED_LEN: usize = 16;

    /// The whole of `mr` (at most 4 GiB - 1 of it), for the peer.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let mr = c.register_remote(1 << 20)?;
    /// c.send(&rdmacm::RemoteBuf::of(&mr).to_bytes()).await?; // the peer may now write and read it
    /// # Ok(()) }
    /// ```
    pub fn of(mr: &MemoryRegion) -> RemoteBuf {
        RemoteBuf {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len().min(u32::MAX as usize) as u32,
        }
    }

    /// `addr`, `rkey`, `len`, big-endian.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// From the first 16 bytes of `b` (`None` if shorter); private data's zero padding
    /// after them is ignored.
    pub fn from_bytes(b: &[u8]) -> Option<RemoteBuf> {
        let b = b.get(..Self::ENCODED_LEN)?;
        Some(RemoteBuf {
            addr: u64::from_be_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_be_bytes(b[8..12].try_into().ok()?),
            len: u32::from_be_bytes(b[12..16].try_into().ok()?),
        })
    }

    /// `len` bytes from `offset`, if inside.
    pub fn slice(&self, offset: u32, len: u32) -> Option<RemoteBuf> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(RemoteBuf {
            addr: self.addr + offset as u64,
            rkey: self.rkey,
            len,
        })
    }
}

/// A connected RC id with its QP (on the id's device), a CQ with a completion channel,
/// message buffers, and a task that turns completions and CM events into woken futures.
///
/// Messages: [`Connection::send`] and [`Connection::recv`] (credit-aware, see the module
/// docs). Teardown: when the peer disconnects, the QP goes to Err at once, pending futures
/// fail with [`Error::Closed`], later sends with [`Error::NotConnected`];
/// [`Connection::closed`] waits for that; [`Connection::disconnect`] closes and waits for
/// the peer's answer. Dropping it disconnects (DREQ) and destroys the id.
///
/// The QP belongs to the message layer: posting receives on [`Connection::qp`] yourself
/// takes messages away from [`Connection::recv`].
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// let opts = rdmacm::ConnectOptions {
///     private_data: b"hi".to_vec(),
///     src: Some("127.0.0.2:0".parse().unwrap()), // one process per address: bind another
///     ..Default::default()
/// };
/// let c = rdmacm::Connection::connect("127.0.0.1:7471".parse().unwrap(), opts).await?;
/// c.send(b"ping").await?;
/// let reply = c.recv().await?;
/// println!("{:?} from {:?}", reply, c.peer_addr());
/// c.disconnect().await?;
/// # Ok(()) }
/// ```
pub struct Connection {
    // Outlives the id (dropped after it, in `Drop`).
    _ch: Arc<EventChannel>,
    id: Option<Arc<CmId>>,
    sh: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    events: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    peer_private_data: Vec<u8>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("qpn", &self.sh.parts.qp.qpn())
            .finish()
    }
}

impl Connection {
    /// Resolves `addr`, creates the QP and the message buffers, connects, and waits for
    /// ESTABLISHED. A rejection is `ECONNREFUSED` ([`Error::ConnectionRefused`] with the
    /// reason, named), no answer `ETIMEDOUT`.
    pub async fn connect(addr: SocketAddr, options: ConnectOptions) -> Result<Connection> {
        let ConnectOptions {
            private_data,
            timeout,
            src,
            mut conn_param,
            cma,
        } = options;
        conn_param.private_data = private_data;
        let (ch, id) = blocking(move || {
            let cma = match cma {
                Some(c) => c,
                None => Cma::global()?,
            };
            let ch = EventChannel::with_cma(&cma)?;
            let id = CmId::new(&ch, PortSpace::Tcp)?;
            if let Some(s) = src {
                id.bind_addr(s)?;
            }
            id.resolve_addr(None, addr, timeout)?;
            Ok((ch, id))
        })
        .await?;
        let ch = Arc::new(ch);
        let ev = ch.next_event().await?;
        if ev.kind() != EventType::AddrResolved {
            return Err(event_error(&ev));
        }
        drop(ev);
        let id = blocking(move || {
            id.resolve_route(timeout)?;
            Ok(id)
        })
        .await?;
        let ev = ch.next_event().await?;
        if ev.kind() != EventType::RouteResolved {
            return Err(event_error(&ev));
        }
        drop(ev);
        let (id, parts) = blocking(move || {
            let parts = Parts::create(&id)?;
            id.connect(&conn_param)?;
            Ok((id, parts))
        })
        .await?;
        let ev = wait_established(&ch).await?;
        let peer_private_data = ev.private_data().to_vec();
        drop(ev);
        Connection::start(ch, id, parts, peer_private_data)
    }

    fn start(
        ch: Arc<EventChannel>,
        id: CmId,
        parts: Parts,
        peer_private_data: Vec<u8>,
    ) -> Result<Connection> {
        // SAFETY: the AsyncFd owns a clone of the channel, which owns the eventfd, so the fd
        // stays open as long as it is registered.
        let afd = unsafe {
            AsyncFd::register_with_interest(parts.cc.clone(), tokio::io::Interest::READABLE)
        }
        .map_err(|e| Error::Io(std::io::Error::from(e)))?;
        let sh = Arc::new(Shared {
            parts,
            afd,
            st: Mutex::new(State {
                closed: None,
                disconnected: false,
                dreq_sent: false,
                data_credits: WINDOW,
                ctrl_credits: CONTROL_WINDOW,
                free_send: (0..WINDOW).rev().collect(),
                received: VecDeque::new(),
                ret_data: 0,
                ret_ctrl: 0,
                returned: 0,
                received_data: 0,
                ops: HashMap::new(),
                next_op: 0,
            }),
            changed: Notify::new(),
        });
        let id = Arc::new(id);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(run(sh.clone(), ch.clone(), Arc::downgrade(&id), tx));
        Ok(Connection {
            _ch: ch,
            id: Some(id),
            sh,
            task,
            events: tokio::sync::Mutex::new(rx),
            peer_private_data,
        })
    }

    /// The QP (in RTS). Its receive queue is the message layer's.
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.sh.parts.qp
    }

    /// The CQ of both send and receive completions (with a completion channel; the
    /// connection's task takes its completions).
    pub fn cq(&self) -> &CompletionQueue {
        &self.sh.parts.cq
    }

    /// The PD of the QP.
    pub fn pd(&self) -> &ProtectionDomain {
        self.sh.parts.qp.pd()
    }

    /// The device.
    pub fn device(&self) -> Option<Device> {
        self.id.as_ref().and_then(|i| i.device())
    }

    /// The underlying id.
    pub fn id(&self) -> Option<&CmId> {
        self.id.as_deref()
    }

    /// The private data the peer sent (REQ on the passive side, REP on the active side),
    /// zero padded as on the wire.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// Local address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|i| i.local_addr())
    }

    /// Peer address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|i| i.peer_addr())
    }

    /// The next event of this connection other than TIMEWAIT_EXIT (e.g. DISCONNECTED when
    /// the peer disconnects, ADDR_CHANGE). The connection acts on DISCONNECTED itself (see
    /// [`Connection::closed`]); the event is still reported here.
    pub async fn next_event(&self) -> Result<Event> {
        self.events.lock().await.recv().await.ok_or(Error::Shutdown)
    }

    /// Why the connection is closed, if it is.
    ///
    /// ```no_run
    /// # fn f(c: &rdmacm::Connection) {
    /// if let Some(why) = c.close_reason() {
    ///     eprintln!("closed: {why}");
    /// }
    /// # }
    /// ```
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.sh.lock().closed.clone()
    }

    /// Waits until the connection is closed (the peer disconnected, a local
    /// [`Connection::disconnect`], a failed completion, UNREACHABLE, DEVICE_REMOVAL) and
    /// says why. Cancel safe.
    ///
    /// ```no_run
    /// # async fn f(c: rdmacm::Connection) {
    /// let why = c.closed().await;
    /// println!("connection closed: {why}");
    /// # }
    /// ```
    pub async fn closed(&self) -> CloseReason {
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if let Some(why) = self.sh.lock().closed.clone() {
                return why;
            }
            n.await;
        }
    }

    /// Sends `msg` as one message (at most [`MAX_MESSAGE`] bytes): waits for a credit and
    /// a free send buffer, copies `msg` into it and posts the SEND. Returns once posted
    /// (like a TCP write returning once the bytes are in the socket buffer); a later
    /// failure closes the connection. Cancel safe (nothing is sent unless it returns `Ok`).
    ///
    /// Errors: [`Error::NotConnected`] if the connection was already closed,
    /// [`Error::Closed`] if it closed while waiting, `EMSGSIZE` ([`Error::InvalidArgument`])
    /// for a message over [`MAX_MESSAGE`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// c.send(b"hello").await?;
    /// # Ok(()) }
    /// ```
    pub async fn send(&self, msg: &[u8]) -> Result<()> {
        if msg.len() > MAX_MESSAGE {
            return Err(Error::InvalidArgument(format!(
                "message of {} bytes: at most {MAX_MESSAGE} per send",
                msg.len()
            )));
        }
        let mut first = true;
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if let Some(why) = &st.closed {
                    return Err(if first {
                        Error::NotConnected
                    } else {
                        Error::Closed(why.clone())
                    });
                }
                if st.data_credits > 0 && !st.free_send.is_empty() {
                    return self.post_message(&mut st, msg);
                }
            }
            first = false;
            self.wait(n).await;
        }
    }

    fn post_message(&self, st: &mut State, msg: &[u8]) -> Result<()> {
        let p = &self.sh.parts;
        let slot = st.free_send.pop().expect("checked by the caller");
        let off = slot as usize * MAX_MESSAGE;
        let r = p.send_mr.write(off, msg).and_then(|()| {
            let mut wr = SendWr::new(
                tag(TAG_SEND, slot),
                SendOp::SendWithImm {
                    imm: st.ret_data | (st.ret_ctrl << 16),
                },
            )
            .signaled();
            if !msg.is_empty() {
                wr = wr.with_sge(p.send_mr.sge(off, msg.len() as u32)?);
            }
            p.qp.post_send(&wr)
        });
        match r {
            Ok(()) => {
                st.take_returns();
                st.data_credits -= 1;
                Ok(())
            }
            Err(e) => {
                st.free_send.push(slot);
                Err(e.into())
            }
        }
    }

    /// The next message. Messages that arrived before the connection closed are still
    /// delivered; after them, [`Error::Closed`] with the reason. Cancel safe.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// while let Ok(msg) = c.recv().await {
    ///     c.send(&msg).await?; // echo
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv(&self) -> Result<Vec<u8>> {
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if let Some((slot, len)) = st.received.pop_front() {
                    let p = &self.sh.parts;
                    let mut out = vec![0u8; len as usize];
                    p.recv_mr.read(slot as usize * MAX_MESSAGE, &mut out)?;
                    if st.closed.is_none() {
                        match p.post_recv(slot) {
                            Ok(()) => {
                                st.ret_data += 1;
                                self.sh.maybe_return_credits(&mut st);
                            }
                            Err(e) => self
                                .sh
                                .close(&mut st, CloseReason::PostFailed(e.to_string())),
                        }
                    }
                    return Ok(out);
                }
                if let Some(why) = &st.closed {
                    return Err(Error::Closed(why.clone()));
                }
            }
            self.wait(n).await;
        }
    }

    /// Registers a zeroed region of `len` bytes in the connection's PD that the peer may
    /// write and read (give it [`RemoteBuf::of`]). The region is read and written locally
    /// by copy ([`MemoryRegion::read`], [`MemoryRegion::write`]), which stays sound while
    /// the peer writes into it.
    ///
    /// ```no_run
    /// # fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let mr = c.register_remote(4096)?;
    /// let rb = rdmacm::RemoteBuf::of(&mr);
    /// assert_eq!(rb.len, 4096);
    /// # Ok(()) }
    /// ```
    pub fn register_remote(&self, len: usize) -> Result<MemoryRegion> {
        Ok(self.pd().register(
            vec![0u8; len],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )?)
    }

    /// RDMA WRITE of `data` to the start of `remote`, completed when the peer's device
    /// acknowledged it (the bytes are in the peer's memory; the peer's application gets no
    /// completion). `data` is copied into a registered staging buffer first.
    ///
    /// Errors: `EINVAL` when `data` is longer than `remote`; [`Error::Closed`] with
    /// [`CloseReason::Failed`] (e.g. `RemAccessErr`: wrong rkey or bounds) when the WRITE
    /// fails, which also closes the connection (an RC QP goes to Err on a failed request);
    /// [`Error::NotConnected`] after the close.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// c.write(&remote, b"into the peer's memory").await?;
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, remote: &RemoteBuf, data: &[u8]) -> Result<()> {
        check_remote(remote, data.len())?;
        if data.is_empty() {
            return self.check_open();
        }
        let mr = self
            .pd()
            .register(data.to_vec(), AccessFlags::LOCAL_WRITE)?;
        let op = SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.rdma(op, &mr, data.len()).await
    }

    /// RDMA READ of `buf.len()` bytes from the start of `remote` into `buf`, through a
    /// registered staging buffer. Errors as [`Connection::write`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// let mut buf = vec![0u8; remote.len as usize];
    /// c.read(&remote, &mut buf).await?;
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, remote: &RemoteBuf, buf: &mut [u8]) -> Result<()> {
        check_remote(remote, buf.len())?;
        if buf.is_empty() {
            return self.check_open();
        }
        let mr = self
            .pd()
            .register(vec![0u8; buf.len()], AccessFlags::LOCAL_WRITE)?;
        let op = SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.rdma(op, &mr, buf.len()).await?;
        mr.read(0, buf)?;
        Ok(())
    }

    /// Waits for a change of the shared state, or for the completion channel itself: the
    /// waiting task then takes the completions (no hop through the connection's task).
    async fn wait(&self, n: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) {
        let sh = &self.sh;
        tokio::select! {
            _ = n => {}
            g = sh.afd.readable() => {
                if let Ok(mut g) = g {
                    while let Ok(Some(_)) = sh.parts.cc.get_event() {}
                    g.clear_ready();
                }
                if sh.drain(&mut Vec::with_capacity(64)).is_some() {
                    if let Some(id) = &self.id {
                        sh.disconnect_id(id);
                    }
                }
            }
        }
    }

    fn check_open(&self) -> Result<()> {
        match self.sh.lock().closed {
            Some(_) => Err(Error::NotConnected),
            None => Ok(()),
        }
    }

    async fn rdma(&self, op: SendOp, mr: &MemoryRegion, len: usize) -> Result<()> {
        let mut first = true;
        let id = loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if let Some(why) = &st.closed {
                    return Err(if first {
                        Error::NotConnected
                    } else {
                        Error::Closed(why.clone())
                    });
                }
                if st.ops.len() < MAX_RDMA_OPS {
                    let id = st.next_op;
                    st.next_op = (st.next_op + 1) & ((1 << TAG_SHIFT) - 1);
                    let wr = SendWr::new(tag(TAG_RDMA, 0) | id, op)
                        .with_sge(mr.sge(0, len as u32)?)
                        .signaled();
                    self.sh.parts.qp.post_send(&wr)?;
                    st.ops.insert(id, None);
                    break id;
                }
            }
            first = false;
            self.wait(n).await;
        };
        // Forgets the operation if this future is dropped before it completes.
        let _forget = OpGuard { sh: &self.sh, id };
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let st = self.sh.lock();
                match st.ops.get(&id) {
                    Some(Some(WcStatus::Success)) => return Ok(()),
                    Some(Some(status)) => {
                        return Err(Error::Closed(
                            st.closed.clone().unwrap_or(CloseReason::Failed(*status)),
                        ))
                    }
                    _ => {}
                }
                if let Some(why) = &st.closed {
                    return Err(Error::Closed(why.clone()));
                }
            }
            self.wait(n).await;
        }
    }

    /// Disconnects (`rdma_disconnect`: the QP goes to Err, pending futures fail, the DREQ
    /// leaves, or the DREP when the peer disconnected first) and waits for the CM to report
    /// DISCONNECTED (the peer's DREP, or the DREQ's retries running out), at most
    /// [`DISCONNECT_WAIT`] (then `ETIMEDOUT`). Calling it again returns at once.
    ///
    /// ```no_run
    /// # async fn f(c: rdmacm::Connection) -> rdmacm::Result<()> {
    /// c.send(b"bye").await?;
    /// c.disconnect().await?;
    /// assert!(c.close_reason().is_some());
    /// # Ok(()) }
    /// ```
    pub async fn disconnect(&self) -> Result<()> {
        {
            let mut st = self.sh.lock();
            self.sh.close(&mut st, CloseReason::LocalDisconnect);
        }
        let id = self.id.as_ref().ok_or(Error::NotConnected)?;
        self.sh.disconnect_id(id);
        let wait = async {
            loop {
                let n = self.sh.changed.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if self.sh.lock().disconnected {
                    return;
                }
                n.await;
            }
        };
        tokio::time::timeout(DISCONNECT_WAIT, wait)
            .await
            .map_err(|_| Error::TimedOut)
    }
}

fn check_remote(remote: &RemoteBuf, len: usize) -> Result<()> {
    if len > remote.len as usize {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes do not fit the remote buffer of {} bytes (rkey {:#x})",
            remote.len, remote.rkey
        )));
    }
    Ok(())
}

struct OpGuard<'a> {
    sh: &'a Shared,
    id: u64,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.sh.lock().ops.remove(&self.id);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
        {
            let mut st = self.sh.lock();
            self.sh.close(&mut st, CloseReason::Dropped);
        }
        // Events still queued for the application are acknowledged now, so that destroying
        // the id does not wait for them.
        let rx = self.events.get_mut();
        rx.close();
        while rx.try_recv().is_ok() {}
        if let Some(id) = self.id.take() {
            self.sh.disconnect_id(&id);
            drop(id);
        }
    }
}
