//! [`Listener`]: bind, take requests ([`Incoming`]), accept with setup hooks.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use rdma_soft::verbs::Device;

use super::connection::{wait_established, Connection};
use super::setup::{Parts, Setup};
use super::sizes::MsgSizes;
use super::{blocking, MAX_REP_PRIVATE_DATA};
use crate::cm::channel::EventChannel;
use crate::cm::cma::Cma;
use crate::cm::event::Event;
use crate::cm::id::CmId;
use crate::error::{Error, Result};
use crate::params::{ConnParam, EventType};
use crate::ports::PortSpace;

/// How [`Incoming::accept`] and [`Listener::accept_with`] accept.
///
/// ```
/// let o = rdmacm::AcceptOptions { private_data: vec![1; 196], ..Default::default() };
/// assert_eq!(o.private_data.len(), rdmacm::MAX_REP_PRIVATE_DATA);
/// ```
#[derive(Debug, Clone, Default)]
pub struct AcceptOptions {
    /// Private data of the REP (at most [`MAX_REP_PRIVATE_DATA`], 196 bytes; more is
    /// `EINVAL`, and the request is rejected so the peer does not wait).
    pub private_data: Vec<u8>,
    /// Everything else of the REP (its `private_data` is replaced by the field above).
    pub conn_param: ConnParam,
    /// PD, CQ and QP sizes.
    pub setup: Setup,
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
    /// Addresses a wildcard listener cannot listen on ([`Listener::unusable_addrs`]).
    unusable: Mutex<Vec<IpAddr>>,
    /// Events taken at bind (to see the addresses reported then) that `incoming` hands on.
    taken: Mutex<VecDeque<Event>>,
    /// This side's window and largest message.
    own: MsgSizes,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("id", &self.id).finish()
    }
}

/// A connection request not yet answered ([`Listener::incoming`]): nothing is created for
/// it until [`Incoming::accept`]. Dropping it rejects it.
///
/// ```no_run
/// # async fn f(l: &rdmacm::Listener) -> rdmacm::Result<()> {
/// use rdmacm::{AcceptOptions, RemoteBuf, Setup};
/// use rdmacm::verbs::AccessFlags;
/// let req = l.incoming().await?;
/// let pd = req.device().alloc_pd()?;
/// let mr = pd.register(vec![0u8; 1 << 20], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// let opts = AcceptOptions {
///     private_data: RemoteBuf::of(&mr).to_bytes().to_vec(),
///     setup: Setup { pd: Some(pd), ..Default::default() },
///     ..Default::default()
/// };
/// let c = req.accept(opts).await?; // the client may WRITE into `mr` now
/// # Ok(()) }
/// ```
pub struct Incoming {
    id: Option<CmId>,
    dev: Device,
    cma: Cma,
    private_data: Vec<u8>,
    /// The listener's window and largest message, and the requester's.
    own: MsgSizes,
    peer: MsgSizes,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming").field("id", &self.id).finish()
    }
}

impl Incoming {
    /// The device the request arrived on (allocate a [`Setup::pd`] on it).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The REQ's private data (after the IP CM header, 56 bytes zero padded).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The requester's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|i| i.peer_addr())
    }

    /// Creates the QP (in `opts.setup`'s PD, if given) and the message buffers, sends the
    /// REP and waits for ESTABLISHED. A local failure (private data over 196 bytes:
    /// `EINVAL`, a PD of another device, resources) rejects the request and is returned;
    /// so is the peer's failure before ESTABLISHED (its REJ, no RTU).
    pub async fn accept(mut self, opts: AcceptOptions) -> Result<Connection> {
        let id = self.id.take().ok_or(Error::NotConnected)?;
        let peer_pd = std::mem::take(&mut self.private_data);
        let cma = self.cma.clone();
        let AcceptOptions {
            private_data,
            mut conn_param,
            setup,
        } = opts;
        if private_data.len() > MAX_REP_PRIVATE_DATA {
            // Refuse before anything is made; the peer gets a REJ, not a silence.
            let _ = id.reject(&[]);
            return Err(Error::InvalidArgument(format!(
                "private data of {} bytes: a REP carries at most {MAX_REP_PRIVATE_DATA}",
                private_data.len()
            )));
        }
        let own = self.own;
        conn_param.private_data = match own.attach(private_data, MAX_REP_PRIVATE_DATA) {
            Ok(d) => d,
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        };
        let sizes = own.agree(self.peer);
        // Inline, not on the blocking pool: the QP, its CQ and buffers and the REP take
        // about 0.3 ms (docs/ASYNC.md), less than a hop there and back costs.
        let ch = EventChannel::with_cma(&cma)?;
        id.migrate(&ch)?;
        let made = Parts::create(&id, &setup, own).and_then(|p| {
            id.accept(&conn_param)?;
            Ok(p)
        });
        let parts = match made {
            Ok(parts) => parts,
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        };
        let ch = Arc::new(ch);
        wait_established(&ch).await?;
        Connection::start(ch, id, parts, peer_pd, sizes)
    }

    /// Rejects the request (REJ reason 28, consumer defined, with up to 148 bytes of
    /// private data); the peer's connect fails with `ECONNREFUSED`.
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        match self.id.take() {
            Some(id) => id.reject(private_data),
            None => Ok(()),
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = id.reject(&[]);
        }
    }
}

/// How [`Listener`]s are made: the context and the backlog ([`Listener::builder`]).
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// let cma = rdmacm::cm::Cma::new()?;
/// let l = rdmacm::Listener::builder()
///     .cma(cma)
///     .backlog(64)
///     .bind("127.0.0.1:7471".parse().unwrap())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ListenerBuilder {
    cma: Option<Cma>,
    backlog: usize,
    window: Option<u32>,
    max_message: Option<usize>,
}

impl ListenerBuilder {
    /// The context to listen in (default: [`Cma::global`]).
    pub fn cma(mut self, cma: Cma) -> Self {
        self.cma = Some(cma);
        self
    }

    /// Requests waiting to be taken at most (`rdma_listen`'s backlog; 0, the default: 1024).
    pub fn backlog(mut self, backlog: usize) -> Self {
        self.backlog = backlog;
        self
    }

    /// This side's window for the connections it accepts (default
    /// [`WINDOW`](super::WINDOW)); each uses the smaller of its two ends' (see
    /// [`ConnectOptions::window`](super::ConnectOptions::window)).
    pub fn window(mut self, window: u32) -> Self {
        self.window = Some(window);
        self
    }

    /// This side's largest message for the connections it accepts (default
    /// [`MAX_MESSAGE`](super::MAX_MESSAGE)); each uses the smaller of its two ends'.
    ///
    /// ```no_run
    /// # async fn f() -> rdmacm::Result<()> {
    /// let l = rdmacm::Listener::builder()
    ///     .window(64)
    ///     .max_message(4096)
    ///     .bind("127.0.0.1:7471".parse().unwrap())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = Some(bytes);
        self
    }

    /// Binds and listens on `addr`. `EADDRINUSE` when another listener holds it; `EINVAL`
    /// for a window or message size out of range.
    pub async fn bind(self, addr: SocketAddr) -> Result<Listener> {
        let ListenerBuilder {
            cma,
            backlog,
            window,
            max_message,
        } = self;
        let d = MsgSizes::default();
        let own = MsgSizes {
            window: window.unwrap_or(d.window),
            max_message: max_message.unwrap_or(d.max_message),
        }
        .check()?;
        let (ch, id) = blocking(move || {
            let cma = match cma {
                Some(c) => c,
                None => Cma::global()?,
            };
            let ch = EventChannel::with_cma(&cma)?;
            let id = CmId::new(&ch, PortSpace::Tcp)?;
            id.bind_addr(addr)?;
            id.listen(backlog)?;
            Ok((ch, id))
        })
        .await?;
        let l = Listener {
            ch: Arc::new(ch),
            id: Some(id),
            unusable: Mutex::new(Vec::new()),
            taken: Mutex::new(VecDeque::new()),
            own,
        };
        // The addresses a wildcard listen skipped are reported before `listen` returns.
        while let Ok(ev) = l.ch.try_get_event() {
            if let Some(ev) = l.absorb(ev) {
                l.taken
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_back(ev);
            }
        }
        Ok(l)
    }
}

impl Listener {
    /// Binds and listens on `addr` (backlog 1024) on the global context. `EADDRINUSE`
    /// when another listener holds it.
    pub async fn bind(addr: SocketAddr) -> Result<Listener> {
        Listener::builder().bind(addr).await
    }

    /// A builder for a listener in another context or with another backlog.
    pub fn builder() -> ListenerBuilder {
        ListenerBuilder::default()
    }

    /// The bound address (with the chosen port).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(|i| i.local_addr())
    }

    /// The device of a listener on a specific address (`None` for a wildcard one: use
    /// [`Incoming::device`]).
    pub fn device(&self) -> Option<Device> {
        self.id.as_ref().and_then(|i| i.device())
    }

    /// The local addresses this wildcard listener does not listen on because another
    /// user's program holds UDP 4791 there (the rdma_cm model's ADDR_CHANGE with status
    /// `-EADDRINUSE` naming the address, also logged as a warning): requests to them never
    /// reach this listener. Those skipped at bind are here when [`Listener::bind`] returns;
    /// an address that appears later, squatted, is added while [`Listener::incoming`] (or
    /// `accept`) waits. Empty for a listener on a specific address (its bind fails with
    /// `EADDRINUSE` instead).
    ///
    /// ```no_run
    /// # async fn f() -> rdmacm::Result<()> {
    /// let l = rdmacm::Listener::bind("0.0.0.0:7471".parse().unwrap()).await?;
    /// for a in l.unusable_addrs() {
    ///     eprintln!("not listening on {a}: another user holds UDP 4791 there");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn unusable_addrs(&self) -> Vec<IpAddr> {
        self.unusable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps a squatted-address report (returns `None`); any other event is handed back.
    fn absorb(&self, ev: Event) -> Option<Event> {
        match ev.addr() {
            Some(a) if ev.kind() == EventType::AddrChange && ev.status() == -libc::EADDRINUSE => {
                let mut u = self.unusable.lock().unwrap_or_else(|e| e.into_inner());
                if !u.contains(&a) {
                    u.push(a);
                }
                None
            }
            _ => Some(ev),
        }
    }

    /// The next connection request, before anything is created for it.
    pub async fn incoming(&self) -> Result<Incoming> {
        loop {
            let taken = self
                .taken
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let ev = match taken {
                Some(ev) => ev,
                None => self.ch.next_event().await?,
            };
            let Some(mut ev) = self.absorb(ev) else {
                continue;
            };
            if ev.kind() != EventType::ConnectRequest {
                continue;
            }
            let Some(id) = ev.take_id() else { continue };
            let (peer, data) = MsgSizes::detach(ev.private_data());
            let private_data = data.to_vec();
            drop(ev);
            let Some(dev) = id.device() else {
                let _ = id.reject(&[]);
                continue;
            };
            return Ok(Incoming {
                id: Some(id),
                dev,
                cma: self.ch.cma(),
                private_data,
                own: self.own,
                peer,
            });
        }
    }

    /// The next connection: takes a request, creates a PD, a CQ with a completion channel,
    /// the QP and the message buffers on the device it arrived on (receives posted),
    /// accepts with no private data, and waits for ESTABLISHED. Errors as
    /// [`Incoming::accept`]: a server loop logs them and accepts again, as with TCP.
    pub async fn accept(&self) -> Result<Connection> {
        self.accept_with(AcceptOptions::default()).await
    }

    /// Like [`Listener::accept`] with the REP's private data, parameters and setup.
    pub async fn accept_with(&self, opts: AcceptOptions) -> Result<Connection> {
        self.incoming().await?.accept(opts).await
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Acknowledged first: destroying the id waits for its events to be.
        self.taken
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        drop(self.id.take());
    }
}
