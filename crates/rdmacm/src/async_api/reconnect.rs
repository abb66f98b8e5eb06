//! [`Connection::reconnect`]: after the align policy ended a connection, a new one to the
//! same peer on the path the IP stack uses now, on the same PD, MRs and CQ.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_soft::verbs::Completion;

use super::connection::{wait_established, Connection};
use super::setup::Parts;
use super::shared::Shared;
use super::sizes::MsgSizes;
use super::{event_error, MAX_REQ_PRIVATE_DATA};
use crate::cm::channel::EventChannel;
use crate::cm::cma::Cma;
use crate::cm::id::CmId;
use crate::error::{Error, Result};
use crate::params::{ConnParam, EventType};
use crate::ports::PortSpace;

/// What [`Connection::reconnect`] gives back: the new connection and what the old one did
/// not finish. Nothing is replayed: the application decides what to send again.
#[derive(Debug)]
#[non_exhaustive]
pub struct Reconnected {
    /// The new connection: the same PD, CQ, message buffers and every MR registered in the
    /// PD (same lkeys and rkeys), a new QP on the new path.
    pub connection: Connection,
    /// Messages [`Connection::send`] had posted whose SEND did not complete (flushed by
    /// the close), oldest first: the peer may not have them.
    pub unfinished: Vec<Vec<u8>>,
    /// Messages that had arrived and that the application had not taken (the rest of a
    /// message partly read through a byte stream included), oldest first.
    pub unread: Vec<Vec<u8>>,
}

impl Connection {
    /// Connects again to the same peer after the connection closed (typically
    /// [`crate::CloseReason::PathMoved`] under [`crate::cm::HaPolicy::Align`]), on the route
    /// the IP stack uses now, keeping the PD, the CQ and every memory region: no
    /// re-registration, a [`crate::RemoteBuf`] handed out before stays valid. A new id
    /// (with the old one's HA policy) and a new QP are made; `private_data` goes in the
    /// new REQ. The peer sees a normal incoming connection: let it match the new one to
    /// the old one by the private data (e.g. a session token both REQs carry).
    ///
    /// The new id stays on the old device (the PD's), whichever netdev the new route
    /// takes: this software device sends from the new path's source address and the IP
    /// stack carries the datagrams over the new netdev.
    ///
    /// Work requests that did not complete are handed back, never replayed:
    /// [`Reconnected::unfinished`] for messages, and every pending one-sided operation
    /// or owned send already failed its future with [`Error::Closed`].
    ///
    /// Errors: `EINVAL` on the passive side (the server accepts the new connection
    /// instead), while the connection is still open, or for more than
    /// [`MAX_REQ_PRIVATE_DATA`] bytes of private data; otherwise those of
    /// [`Connection::connect`]. On an error the connection's resources are gone.
    ///
    /// ```no_run
    /// # async fn f(c: rdmacm::Connection) -> rdmacm::Result<()> {
    /// use rdmacm::CloseReason;
    /// if let CloseReason::PathMoved { .. } = c.closed().await {
    ///     let r = c.reconnect(b"session 7").await?;
    ///     for m in &r.unfinished {
    ///         r.connection.send(m).await?; // the application's choice
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reconnect(mut self, private_data: &[u8]) -> Result<Reconnected> {
        let redial = self.redial.clone().ok_or_else(|| {
            Error::InvalidArgument(
                "only the active side reconnects (the passive side accepts)".into(),
            )
        })?;
        let peer = redial
            .peer
            .ok_or_else(|| Error::InvalidArgument("the connection has no peer address".into()))?;
        if private_data.len() > MAX_REQ_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data: at most {MAX_REQ_PRIVATE_DATA} in a REQ",
                private_data.len()
            )));
        }
        if self.sh.lock().closed.is_none() {
            return Err(Error::InvalidArgument(
                "the connection is open: reconnect after it closed".into(),
            ));
        }
        // The old connection's task, events and id go; its verbs objects stay.
        self.task.abort();
        let _ = (&mut self.task).await;
        let rx = self.events.get_mut();
        rx.close();
        while rx.try_recv().is_ok() {}
        let old = self.id.take();
        let (dev, ha) = match &old {
            Some(id) => (id.netdev().map(|n| n.1), id.ha_policy()),
            None => (None, Default::default()),
        };
        let dev = dev.ok_or_else(|| Error::InvalidArgument("the old id has no device".into()))?;
        if let Some(id) = old {
            self.sh.disconnect_id(&id);
            drop(id);
        }
        self.sh.drain(&mut Vec::with_capacity(64));
        let sh = self.sh.clone();
        drop(self);
        let sh = Arc::try_unwrap(sh)
            .map_err(|_| Error::InvalidArgument("the connection is still in use".into()))?;
        let (parts, unfinished, unread) = take_parts(sh)?;
        let (old_qp, bufs) = parts.split();
        let pd = old_qp.pd().clone();
        drop(old_qp);
        // Whatever the destroyed QP left in the shared CQ is stale.
        let mut stale: Vec<Completion> = Vec::new();
        while bufs.cq.poll(&mut stale, 64) > 0 {}

        let cma = redial.cma.clone();
        let timeout = redial.timeout;
        let ch = Arc::new(EventChannel::with_cma(&cma)?);
        let id = CmId::new(&ch, PortSpace::Tcp)?;
        id.set_ha_policy(ha)?;
        id.pin_device(dev);
        id.resolve_addr_async(None, peer, timeout).await?;
        expect(&ch, EventType::AddrResolved).await?;
        id.resolve_route_async(timeout).await?;
        expect(&ch, EventType::RouteResolved).await?;
        let mut param = redial.conn_param.clone();
        param.private_data = redial
            .own
            .attach(private_data.to_vec(), MAX_REQ_PRIVATE_DATA)?;
        // Inline, as `Resolved::connect` does: the new QP and the REQ are quick.
        let parts = Parts::with_new_qp(&id, &pd, redial.cap, bufs)?;
        id.connect(&param)?;
        let ev = wait_established(&ch).await?;
        let (peer, data) = MsgSizes::detach(ev.private_data());
        let peer_private_data = data.to_vec();
        drop(ev);
        let sizes = redial.own.agree(peer);
        let mut connection = Connection::start(ch, id, parts, peer_private_data, sizes)?;
        connection.redial = Some(redial);
        Ok(Reconnected {
            connection,
            unfinished,
            unread,
        })
    }
}

async fn expect(ch: &EventChannel, kind: EventType) -> Result<()> {
    let ev = ch.next_event().await?;
    if ev.kind() != kind {
        return Err(event_error(&ev));
    }
    Ok(())
}

/// What an active-side connection keeps to dial its peer again
/// ([`Connection::reconnect`]).
#[derive(Clone)]
pub(super) struct Redial {
    pub peer: Option<SocketAddr>,
    pub timeout: Duration,
    pub conn_param: ConnParam,
    pub cap: rdma_soft::verbs::QpCap,
    pub cma: Cma,
    /// This side's window and largest message (its buffers are made for them).
    pub own: MsgSizes,
}

type Taken = (Parts, Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The verbs objects of a closed connection's shared state, with the messages it did not
/// send and those it did not deliver copied out of its buffers.
fn take_parts(sh: Shared) -> Result<Taken> {
    let Shared { parts, afd, st, .. } = sh;
    // Leaves tokio's reactor: the new connection registers the same channel.
    drop(afd.into_inner());
    let st = st.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut unfinished = Vec::with_capacity(st.flushed.len());
    for &slot in &st.flushed {
        let len = st.send_len[slot as usize] as usize;
        let mut m = vec![0u8; len];
        parts
            .bufs
            .send_mr
            .read(slot as usize * parts.bufs.stride, &mut m)?;
        unfinished.push(m);
    }
    let mut unread = Vec::with_capacity(st.received.len());
    for (i, &(slot, len)) in st.received.iter().enumerate() {
        let off = if i == 0 { st.read_off } else { 0 };
        let mut m = vec![0u8; len as usize - off];
        parts
            .bufs
            .recv_mr
            .read(slot as usize * parts.bufs.stride + off, &mut m)?;
        unread.push(m);
    }
    Ok((parts, unfinished, unread))
}
