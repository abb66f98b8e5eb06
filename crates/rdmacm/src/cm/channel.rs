//! `EventChannel`: where an id's events are queued; blocking, fd and async use.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cm::cma::Cma;
use crate::cm::event::Event;
use crate::context::state::ChanState;
use crate::context::Ctx;
use crate::error::{Error, Result};
use crate::params::EventType;
use rdma_soft::fd::EventFd;

/// `struct rdma_event_channel`: the queue of events of the ids created on it.
///
/// The process's progress engine drives the connection manager (MADs, timers, host
/// changes) and queues the events, whatever the application is doing:
/// * [`EventChannel::get_event`] blocks until an event is ready (it waits on the fd).
/// * [`EventChannel::try_get_event`] does one round without blocking (`EAGAIN`).
/// * [`EventChannel::fd`] is readable while an event is queued (for `epoll` or tokio).
/// * [`EventChannel::next_event`] is the async form.
///
/// ```no_run
/// let ch = rdmacm::cm::EventChannel::new()?;
/// if let Some(ev) = ch.get_event_timeout(std::time::Duration::from_millis(10))? {
///     println!("{}", ev.kind());
/// }
/// # Ok::<(), rdmacm::Error>(())
/// ```
pub struct EventChannel {
    pub(crate) inner: Arc<Ctx>,
    pub(crate) num: u64,
    efd: Arc<EventFd>,
    async_fd: OnceLock<tokio::io::unix::AsyncFd<RawFdRef>>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("num", &self.num)
            .finish()
    }
}

struct RawFdRef(RawFd);
impl AsRawFd for RawFdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl EventChannel {
    /// `rdma_create_event_channel` on the process-wide context ([`Cma::global`]).
    pub fn new() -> Result<EventChannel> {
        EventChannel::with_cma(&Cma::global()?)
    }

    /// A channel on context `cma`.
    pub fn with_cma(cma: &Cma) -> Result<EventChannel> {
        let efd = Arc::new(EventFd::new()?);
        let inner = cma.inner.clone();
        let mut st = inner.lock();
        let num = st.next_channel;
        st.next_channel += 1;
        st.channels.insert(
            num,
            ChanState {
                queue: VecDeque::new(),
                efd: efd.clone(),
            },
        );
        drop(st);
        Ok(EventChannel {
            inner,
            num,
            efd,
            async_fd: OnceLock::new(),
        })
    }

    /// The context this channel belongs to.
    pub fn cma(&self) -> Cma {
        Cma {
            inner: self.inner.clone(),
        }
    }

    /// `rdma_get_cm_event`: the next event, blocking until there is one.
    pub fn get_event(&self) -> Result<Event> {
        loop {
            if let Some(e) = self.get_event_until(None)? {
                return Ok(e);
            }
        }
    }

    /// The next event, or `None` after `timeout`.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<Event>> {
        self.get_event_until(Some(Instant::now() + timeout))
    }

    fn get_event_until(&self, deadline: Option<Instant>) -> Result<Option<Event>> {
        loop {
            if let Some(e) = take_event(&self.inner, self.num) {
                return Ok(Some(e));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            let _ = rdma_soft::fd::wait_readable(&[self.efd.raw()], deadline);
        }
    }

    /// One round of progress, then the next event if there is one (`EAGAIN` otherwise).
    pub fn try_get_event(&self) -> Result<Event> {
        if let Some(e) = take_event(&self.inner, self.num) {
            return Ok(e);
        }
        self.inner.progress();
        take_event(&self.inner, self.num).ok_or(Error::WouldBlock)
    }

    /// The async form of [`EventChannel::get_event`]: waits on the channel's fd through
    /// tokio (the progress engine queues the events).
    pub async fn next_event(&self) -> Result<Event> {
        loop {
            if let Some(e) = take_event(&self.inner, self.num) {
                return Ok(e);
            }
            let mut g = self.async_fd()?.readable().await.map_err(Error::Io)?;
            g.clear_ready();
        }
    }

    /// The channel's events as a [`futures_core::Stream`] (for `StreamExt::next`,
    /// `select!` over several channels, stream combinators). It needs a tokio runtime (the
    /// channel's fd is registered with its reactor). It never ends: it yields `Ok(event)` as
    /// events come, or an `Err` if the fd registration fails.
    ///
    /// ```no_run
    /// # async fn f(ch: rdmacm::cm::EventChannel) -> rdmacm::Result<()> {
    /// use futures_core::Stream;
    /// let mut events = std::pin::pin!(ch.events());
    /// let ev = std::future::poll_fn(|cx| events.as_mut().poll_next(cx)).await;
    /// println!("{:?}", ev.map(|e| e.map(|e| e.kind())));
    /// # Ok(()) }
    /// ```
    pub fn events(&self) -> EventStream<'_> {
        EventStream { ch: self }
    }

    fn async_fd(&self) -> Result<&tokio::io::unix::AsyncFd<RawFdRef>> {
        if let Some(a) = self.async_fd.get() {
            return Ok(a);
        }
        #[allow(deprecated)] // the fd outlives the AsyncFd (dropped first)
        let a = tokio::io::unix::AsyncFd::with_interest(
            RawFdRef(self.efd.raw()),
            tokio::io::Interest::READABLE,
        )
        .map_err(Error::Io)?;
        // Another task may have set it meanwhile: theirs is used, ours dropped.
        let _ = self.async_fd.set(a);
        self.async_fd
            .get()
            .ok_or_else(|| Error::Io(std::io::Error::other("channel fd registration")))
    }

    /// The fd: readable while an event is queued.
    pub fn fd(&self) -> RawFd {
        self.efd.raw()
    }
}

/// The events of an [`EventChannel`] as a [`futures_core::Stream`]
/// ([`EventChannel::events`]).
#[derive(Debug)]
pub struct EventStream<'a> {
    ch: &'a EventChannel,
}

impl futures_core::Stream for EventStream<'_> {
    type Item = Result<Event>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Event>>> {
        use std::task::Poll;
        let ch = self.ch;
        loop {
            if let Some(e) = take_event(&ch.inner, ch.num) {
                return Poll::Ready(Some(Ok(e)));
            }
            let afd = match ch.async_fd() {
                Ok(a) => a,
                Err(e) => return Poll::Ready(Some(Err(e))),
            };
            match afd.poll_read_ready(cx) {
                // Readable: clear tokio's readiness and look again (the queue decides).
                Poll::Ready(Ok(mut g)) => g.clear_ready(),
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(Error::Io(e)))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.efd.raw()
    }
}

/// The channel's fd, borrowed for as long as the channel lives: readable while an event is
/// queued (register it with `epoll`, `poll` or tokio's `AsyncFd`).
///
/// ```
/// use std::os::fd::{AsFd, AsRawFd};
/// use rdmacm::cm::{CmId, EventChannel, EventType, PortSpace};
/// let ch = EventChannel::new()?;
/// let id = CmId::new(&ch, PortSpace::Tcp)?;
/// id.resolve_addr(None, "127.0.0.1:7471".parse().unwrap(), std::time::Duration::from_secs(2))?;
/// let mut p = libc::pollfd { fd: ch.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
/// // SAFETY: one valid pollfd.
/// assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "readable: an event is queued");
/// assert_eq!(ch.get_event()?.kind(), EventType::AddrResolved);
/// # Ok::<(), rdmacm::Error>(())
/// ```
impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // Drop the AsyncFd (deregisters) before the eventfd goes.
        let _ = self.async_fd.take();
        let pending = {
            let mut st = self.inner.lock();
            match st.channels.remove(&self.num) {
                Some(c) => c.queue,
                None => VecDeque::new(),
            }
        };
        // Requests nobody will see: destroy their ids (which rejects them).
        for e in pending {
            if e.kind == EventType::ConnectRequest {
                crate::engine::run::destroy(&self.inner, e.id);
            }
        }
    }
}

/// The next event of channel `ch`, as handed out.
fn take_event(inner: &Arc<Ctx>, ch: u64) -> Option<Event> {
    let (ev, context) = inner.take_pending(ch)?;
    Some(Event::new(inner.clone(), ev, context))
}

impl Cma {
    /// Creates an event channel on this context.
    pub fn create_channel(&self) -> Result<EventChannel> {
        EventChannel::with_cma(self)
    }
}
