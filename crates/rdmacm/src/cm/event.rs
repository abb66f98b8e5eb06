//! Events as `get_event` hands them out (`struct rdma_cm_event`); acknowledged on drop.

use std::fmt;
use std::sync::Arc;

use crate::context::id_entry::IdNum;
use crate::context::Ctx;
use crate::params::{ConnEventParam, EventType, PendingEvent, UdParam};

/// An event (`struct rdma_cm_event`). Dropping it acknowledges it (`rdma_ack_cm_event`):
/// destroying its id waits until then.
///
/// ```no_run
/// # fn f(ch: &rdmacm::cm::EventChannel) -> rdmacm::Result<()> {
/// let ev = ch.get_event()?;
/// println!("{} status {} on id {}", ev.kind(), ev.status(), ev.id_num());
/// drop(ev); // ack
/// # Ok(()) }
/// ```
pub struct Event {
    pub(crate) inner: Arc<Ctx>,
    pub(crate) ev: PendingEvent,
    pub(crate) context: u64,
    /// A CONNECT_REQUEST's new id until taken (destroyed with the event otherwise).
    pub(crate) new_id: Option<IdNum>,
    pub(crate) acked: bool,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("kind", &self.ev.kind)
            .field("status", &self.ev.status)
            .field("id", &self.ev.id)
            .field("listen_id", &self.ev.listen_id)
            .field("addr", &self.ev.addr)
            .finish()
    }
}

impl Event {
    /// The event's type.
    pub fn kind(&self) -> EventType {
        self.ev.kind
    }

    /// Its status: 0, a negative errno, or for REJECTED the reject reason (positive).
    pub fn status(&self) -> i32 {
        self.ev.status
    }

    /// The number of the id the event is about ([`CmId::num`](crate::cm::CmId::num)); for CONNECT_REQUEST the
    /// new id's.
    pub fn id_num(&self) -> u64 {
        self.ev.id
    }

    /// The context set with [`CmId::set_context`](crate::cm::CmId::set_context) on the id (for CONNECT_REQUEST: the
    /// listener's).
    pub fn context(&self) -> u64 {
        self.context
    }

    /// The listener of a CONNECT_REQUEST (its [`CmId::num`](crate::cm::CmId::num)).
    pub fn listen_id(&self) -> Option<u64> {
        self.ev.listen_id
    }

    /// The connection parameters (private data, the peer's QPN, resources).
    pub fn param(&self) -> &ConnEventParam {
        &self.ev.param
    }

    /// Shorthand for `param().private_data`.
    pub fn private_data(&self) -> &[u8] {
        &self.ev.param.private_data
    }

    /// The UD parameters of an ESTABLISHED event of a UDP-port-space id, or of a
    /// MULTICAST_JOIN / MULTICAST_ERROR (`qp_num` 0xFFFFFF, the group's Q_Key, the group).
    pub fn ud(&self) -> Option<&UdParam> {
        self.ev.ud.as_ref()
    }

    /// The join a MULTICAST_JOIN or MULTICAST_ERROR is about: group, context, address
    /// handle attributes ([`crate::cm::CmId::join_multicast`]).
    pub fn mcast(&self) -> Option<&crate::cm::McastJoined> {
        self.ev.mc.as_deref()
    }

    /// The local address an ADDR_CHANGE with an error status names: on a wildcard
    /// listener, an address it cannot hear on (status `-EADDRINUSE`: another process holds
    /// UDP 4791 there). `None` for every other event.
    ///
    /// ```no_run
    /// # fn f(ch: &rdmacm::cm::EventChannel) -> rdmacm::Result<()> {
    /// let ev = ch.get_event()?;
    /// if let (rdmacm::cm::EventType::AddrChange, Some(a)) = (ev.kind(), ev.addr()) {
    ///     eprintln!("not listening on {a}: errno {}", -ev.status());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn addr(&self) -> Option<std::net::IpAddr> {
        self.ev.addr
    }
}

impl Event {
    /// The event as `get_event` hands it out (a CONNECT_REQUEST carries its new id).
    pub(crate) fn new(inner: Arc<Ctx>, ev: PendingEvent, context: u64) -> Event {
        let new_id = (ev.kind == EventType::ConnectRequest).then_some(ev.id);
        Event {
            inner,
            ev,
            context,
            new_id,
            acked: false,
        }
    }

    pub(crate) fn ack_once(&mut self) {
        if !self.acked {
            self.acked = true;
            self.inner.ack(self.ev.id);
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // A CONNECT_REQUEST's new id (if not taken) is destroyed after the ack, so that
        // its destroy does not wait for this very event.
        self.ack_once();
        if let Some(n) = self.new_id.take() {
            crate::engine::run::destroy(&self.inner, n);
        }
    }
}
