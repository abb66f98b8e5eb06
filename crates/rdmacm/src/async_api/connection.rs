//! [`Connection`]: connect (in one step or two, [`Resolved`]), accessors, teardown.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rdma_soft::verbs::{CompletionQueue, Device, ProtectionDomain, QueuePair};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::options::ConnectOptions;
use super::reconnect::Redial;
use super::setup::Parts;
use super::shared::{run, Shared, State};
use super::sizes::MsgSizes;
use super::{blocking, event_error, DISCONNECT_WAIT, MAX_REQ_PRIVATE_DATA};
use crate::cm::channel::EventChannel;
use crate::cm::cma::Cma;
use crate::cm::event::Event;
use crate::cm::id::CmId;
use crate::error::{CloseReason, Error, Result};
use crate::params::EventType;
use crate::ports::PortSpace;

async fn until<T>(
    deadline: Option<Instant>,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, f)
            .await
            .map_err(|_| Error::TimedOut)?,
        None => f.await,
    }
}

/// An active-side id with its address and route resolved and nothing created yet
/// ([`Connection::resolve`]): create a PD on [`Resolved::device`], register memory, then
/// [`Resolved::connect`].
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// use rdmacm::verbs::AccessFlags;
/// use rdmacm::{ConnectOptions, Connection, RemoteBuf, Setup};
/// let opts = ConnectOptions::new().src("127.0.0.2:0".parse().unwrap());
/// let mut r = Connection::resolve("127.0.0.1:7471".parse().unwrap(), opts).await?;
/// let pd = r.device().alloc_pd()?;
/// let mr = pd.register(vec![0u8; 1 << 20], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// r.options_mut().setup.pd = Some(pd);
/// r.options_mut().private_data = RemoteBuf::of(&mr).to_bytes().to_vec();
/// let c = r.connect().await?; // the server may WRITE into `mr` at once
/// # Ok(()) }
/// ```
pub struct Resolved {
    ch: Arc<EventChannel>,
    id: CmId,
    dev: Device,
    opts: ConnectOptions,
    deadline: Option<Instant>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved").field("id", &self.id).finish()
    }
}

impl Resolved {
    /// The device the connection will use (allocate a [`Setup::pd`](super::Setup::pd) on it).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The options [`Resolved::connect`] uses (private data, setup, REQ parameters);
    /// `src`, `timeout` and `cma` were used already.
    pub fn options_mut(&mut self) -> &mut ConnectOptions {
        &mut self.opts
    }

    /// The local address chosen.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Creates the QP and the message buffers, sends the REQ and waits for ESTABLISHED
    /// (within what is left of [`ConnectOptions::connect_timeout`]).
    pub async fn connect(self) -> Result<Connection> {
        let Resolved {
            ch,
            id,
            opts,
            deadline,
            ..
        } = self;
        let redial = Redial {
            peer: id.peer_addr(),
            timeout: opts.timeout,
            conn_param: opts.conn_param.clone(),
            cap: opts.setup.cap(opts.window),
            own: opts.sizes()?,
            cma: Cma {
                inner: id.inner.clone(),
            },
        };
        let own = opts.sizes()?;
        let mut param = opts.conn_param;
        param.private_data = own.attach(opts.private_data, MAX_REQ_PRIVATE_DATA)?;
        let setup = opts.setup;
        until(deadline, async move {
            // Inline, not on the blocking pool: the QP, its CQ and buffers and the REQ take
            // about 0.2 ms (docs/ASYNC.md), less than a hop there and back costs.
            let parts = Parts::create(&id, &setup, own)?;
            id.connect(&param)?;
            let ev = wait_established(&ch).await?;
            let (peer, data) = MsgSizes::detach(ev.private_data());
            let peer_private_data = data.to_vec();
            drop(ev);
            let mut c = Connection::start(ch, id, parts, peer_private_data, own.agree(peer))?;
            c.redial = Some(redial);
            Ok(c)
        })
        .await
    }
}

pub(super) async fn wait_established(ch: &EventChannel) -> Result<Event> {
    loop {
        let ev = ch.next_event().await?;
        match ev.kind() {
            EventType::Established => return Ok(ev),
            EventType::AddrChange | EventType::TimewaitExit => continue,
            _ => return Err(event_error(&ev)),
        }
    }
}

/// A connected RC id with its QP (on the id's device), a CQ with a completion channel,
/// message buffers, and a task that turns completions and CM events into woken futures.
///
/// Messages: [`Connection::send`] and [`Connection::recv`] (credit-aware, see the module
/// docs), [`Connection::send_buf`] (zero copy), a byte stream ([`Connection::into_stream`]).
/// One-sided: [`Connection::write`], [`Connection::read`] and their owned-buffer forms.
/// Teardown: when the peer disconnects, the QP goes to Err at once, pending futures fail
/// with [`Error::Closed`], later sends with [`Error::NotConnected`];
/// [`Connection::closed`] waits for that; [`Connection::disconnect`] lets the sends in
/// flight land, closes and waits for the peer's answer. Dropping it disconnects (DREQ) and
/// destroys the id.
///
/// The QP belongs to the message layer: posting receives on [`Connection::qp`] yourself
/// takes messages away from [`Connection::recv`].
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// let opts = rdmacm::ConnectOptions::new()
///     .private_data(b"hi".to_vec())
///     .src("127.0.0.2:0".parse().unwrap()); // any local address: processes share them
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
    pub(super) id: Option<Arc<CmId>>,
    pub(super) sh: Arc<Shared>,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) events: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    peer_private_data: Vec<u8>,
    /// Active side: how to dial the peer again.
    pub(super) redial: Option<Redial>,
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
    /// reason, named), no answer (UNREACHABLE) or [`ConnectOptions::connect_timeout`]
    /// passed `ETIMEDOUT`.
    pub async fn connect(addr: SocketAddr, options: ConnectOptions) -> Result<Connection> {
        Connection::resolve(addr, options).await?.connect().await
    }

    /// The first half of [`Connection::connect`]: binds (if [`ConnectOptions::src`]),
    /// resolves the address and the route, and stops before anything is created on the
    /// device ([`Resolved`]).
    pub async fn resolve(addr: SocketAddr, options: ConnectOptions) -> Result<Resolved> {
        let deadline = options.connect_timeout.map(|t| Instant::now() + t);
        let (src, timeout, cma) = (options.src, options.timeout, options.cma.clone());
        let ha = options.ha;
        let (ch, id) = until(deadline, async move {
            let cma = match cma.or_else(Cma::global_made) {
                Some(c) => c,
                // made once per process: runtime, netlink sockets
                None => blocking(Cma::global).await?,
            };
            let ch = EventChannel::with_cma(&cma)?;
            let id = CmId::new(&ch, PortSpace::Tcp)?;
            if let Some(p) = ha {
                id.set_ha_policy(p)?;
            }
            // netlink and the neighbour resolution awaited here, on the caller's runtime
            if let Some(s) = src {
                id.bind_addr_async(s).await?;
            }
            id.resolve_addr_async(None, addr, timeout).await?;
            let ch = Arc::new(ch);
            let ev = ch.next_event().await?;
            if ev.kind() != EventType::AddrResolved {
                return Err(event_error(&ev));
            }
            drop(ev);
            id.resolve_route_async(timeout).await?;
            let ev = ch.next_event().await?;
            if ev.kind() != EventType::RouteResolved {
                return Err(event_error(&ev));
            }
            drop(ev);
            Ok((ch, id))
        })
        .await?;
        let dev = id
            .device()
            .ok_or_else(|| Error::InvalidArgument("resolved id has no device".into()))?;
        Ok(Resolved {
            ch,
            id,
            dev,
            opts: options,
            deadline,
        })
    }

    pub(super) fn start(
        ch: Arc<EventChannel>,
        id: CmId,
        parts: Parts,
        peer_private_data: Vec<u8>,
        sizes: MsgSizes,
    ) -> Result<Connection> {
        // SAFETY: the AsyncFd owns a clone of the channel, which owns the eventfd, so the fd
        // stays open as long as it is registered.
        let afd = unsafe {
            AsyncFd::register_with_interest(parts.bufs.cc.clone(), tokio::io::Interest::READABLE)
        }
        .map_err(|e| Error::Io(std::io::Error::from(e)))?;
        let driver = id
            .device()
            .filter(|_| id.inner.config.async_driver)
            .and_then(|d| super::driver::for_device(&d));
        let id = Arc::new(id);
        let sh = Arc::new(Shared {
            parts,
            _driver: driver,
            afd,
            st: Mutex::new(State::new(sizes.window)),
            max_message: sizes.max_message,
            changed: Notify::new(),
            id: Arc::downgrade(&id),
        });
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(run(sh.clone(), ch.clone(), Arc::downgrade(&id), tx));
        Ok(Connection {
            _ch: ch,
            id: Some(id),
            sh,
            task,
            events: tokio::sync::Mutex::new(rx),
            peer_private_data,
            redial: None,
        })
    }

    /// The connection's window: messages in flight toward the peer, the smaller of both
    /// ends' settings ([`ConnectOptions::window`], [`WINDOW`](super::WINDOW) by default).
    pub fn window(&self) -> u32 {
        self.sh.lock().window
    }

    /// The connection's largest message, the smaller of both ends' settings
    /// ([`ConnectOptions::max_message`], [`MAX_MESSAGE`](super::MAX_MESSAGE) by default).
    pub fn max_message(&self) -> usize {
        self.sh.max_message
    }

    /// The QP (in RTS). Its receive queue is the message layer's.
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.sh.parts.qp
    }

    /// The CQ of both send and receive completions (with a completion channel; the
    /// connection's task takes its completions).
    pub fn cq(&self) -> &CompletionQueue {
        &self.sh.parts.bufs.cq
    }

    /// The PD of the QP (the one given in [`Setup::pd`](super::Setup::pd), if any).
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

    /// Waits for a change of the shared state, or for the completion channel itself: the
    /// waiting task then takes the completions (no hop through the connection's task).
    pub(super) async fn wait(&self, n: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) {
        self.wait_for(n, false).await
    }

    /// [`Connection::wait`] for a task that waits for a message: the completion of one of
    /// our own SENDs does not wake it (nothing it waits for; the next receive or a sender
    /// that waits takes it).
    pub(super) async fn wait_recv(
        &self,
        n: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) {
        self.wait_for(n, true).await
    }

    async fn wait_for(
        &self,
        n: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        recv_only: bool,
    ) {
        let sh = &self.sh;
        tokio::select! {
            _ = n => {}
            () = super::shared::CqWait::new(&sh.parts.bufs.cq, recv_only) => sh.on_queued(self.id.as_deref()),
        }
    }

    pub(super) fn check_open(&self) -> Result<()> {
        match self.sh.lock().closed {
            Some(_) => Err(Error::NotConnected),
            None => Ok(()),
        }
    }

    /// Disconnects gracefully: waits until the SENDs and operations in flight completed
    /// (the peer's device has the bytes), then `rdma_disconnect` (the QP goes to Err,
    /// pending futures fail, the DREQ leaves, or the DREP when the peer disconnected
    /// first), and waits for the CM to report DISCONNECTED (the peer's DREP, or the DREQ's
    /// retries running out), at most [`DISCONNECT_WAIT`] in all (then `ETIMEDOUT`, the
    /// connection closed anyway). Calling it again returns at once.
    ///
    /// ```no_run
    /// # async fn f(c: rdmacm::Connection) -> rdmacm::Result<()> {
    /// c.send(b"bye").await?;
    /// c.disconnect().await?; // "bye" has landed in the peer's receive buffer
    /// assert!(c.close_reason().is_some());
    /// # Ok(()) }
    /// ```
    pub async fn disconnect(&self) -> Result<()> {
        let deadline = Instant::now() + DISCONNECT_WAIT;
        let _ = tokio::time::timeout_at(deadline, self.flush()).await;
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
        tokio::time::timeout_at(deadline, wait)
            .await
            .map_err(|_| Error::TimedOut)
    }

    /// Waits until every SEND and operation posted so far completed (or the connection
    /// closed).
    pub async fn flush(&self) {
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if st.closed.is_some() || st.sends_idle() {
                    return;
                }
                self.sh.fence(&mut st);
            }
            self.wait(n).await;
        }
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
