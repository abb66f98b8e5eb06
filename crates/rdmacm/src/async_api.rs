//! The async layer (tokio), built on the event-channel API: [`Listener`] and
//! [`Connection`].
//!
//! Each listener and connection has its own [`EventChannel`]; the context's progress
//! thread drives the CM (an async caller is never inside `get_event`). Calls that wait for
//! netlink (bind, address resolution) run on tokio's blocking pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_soft::verbs::{CompletionQueue, Device, QueuePair};

use crate::channel::EventChannel;
use crate::cma::Cma;
use crate::error::{Error, Result};
use crate::event::{ConnParam, Event, EventType};
use crate::id::CmId;
use crate::ports::PortSpace;

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

    /// The next connection: takes a request, creates a PD, CQ and QP on the device it
    /// arrived on, accepts with no private data, and waits for ESTABLISHED.
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
                let qp = id.create_qp_default()?;
                id.accept(&param)?;
                Ok((ch, id, qp))
            })
            .await;
            let Ok((ch, id, qp)) = r else {
                // The request failed (e.g. the peer went away): take the next one.
                continue;
            };
            let ch = Arc::new(ch);
            match wait_established(&ch).await {
                Ok(_) => {
                    return Ok(Connection {
                        ch,
                        id: Some(id),
                        qp,
                        peer_private_data: peer_pd,
                        connected: true,
                    })
                }
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

/// A connected RC id with its QP (on the id's device), CQ and PD ready.
///
/// Dropping it disconnects (DREQ) and destroys the id.
///
/// ```no_run
/// # async fn f() -> rdmacm::Result<()> {
/// let opts = rdmacm::ConnectOptions { private_data: b"hi".to_vec(), ..Default::default() };
/// let mut c = rdmacm::Connection::connect("127.0.0.1:7471".parse().unwrap(), opts).await?;
/// let qp = c.qp();
/// println!("QPN {} -> {:?}", qp.qpn(), c.peer_addr());
/// c.disconnect().await?;
/// # Ok(()) }
/// ```
pub struct Connection {
    ch: Arc<EventChannel>,
    id: Option<CmId>,
    qp: Arc<QueuePair>,
    peer_private_data: Vec<u8>,
    connected: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("qpn", &self.qp.qpn())
            .finish()
    }
}

impl Connection {
    /// Resolves `addr`, creates the QP, connects, and waits for ESTABLISHED. A rejection
    /// is `ECONNREFUSED` ([`Error::ConnectionRefused`] with the reason), no answer
    /// `ETIMEDOUT`.
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
        let (id, qp) = blocking(move || {
            let qp = id.create_qp_default()?;
            id.connect(&conn_param)?;
            Ok((id, qp))
        })
        .await?;
        let ev = wait_established(&ch).await?;
        let peer_private_data = ev.private_data().to_vec();
        drop(ev);
        Ok(Connection {
            ch,
            id: Some(id),
            qp,
            peer_private_data,
            connected: true,
        })
    }

    /// The QP (in RTS).
    pub fn qp(&self) -> &Arc<QueuePair> {
        &self.qp
    }

    /// The CQ of both send and receive completions.
    pub fn cq(&self) -> &CompletionQueue {
        self.qp.send_cq()
    }

    /// The PD of the QP.
    pub fn pd(&self) -> &rdma_soft::verbs::ProtectionDomain {
        self.qp.pd()
    }

    /// The device.
    pub fn device(&self) -> Option<Device> {
        self.id.as_ref().and_then(|i| i.device())
    }

    /// The underlying id.
    pub fn id(&self) -> Option<&CmId> {
        self.id.as_ref()
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
    /// the peer disconnects, ADDR_CHANGE).
    pub async fn next_event(&self) -> Result<Event> {
        loop {
            let ev = self.ch.next_event().await?;
            if ev.kind() != EventType::TimewaitExit {
                return Ok(ev);
            }
        }
    }

    /// Disconnects (`rdma_disconnect`): moves the QP to ERR and sends the DREQ, or the DREP
    /// when the peer disconnected first. Does not wait for the peer: DISCONNECTED comes
    /// through [`Connection::next_event`] when it answers.
    pub async fn disconnect(&mut self) -> Result<()> {
        self.connected = false;
        match &self.id {
            Some(id) => id.disconnect(),
            None => Err(Error::NotConnected),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if self.connected {
                let _ = id.disconnect();
            }
            drop(id);
        }
    }
}
