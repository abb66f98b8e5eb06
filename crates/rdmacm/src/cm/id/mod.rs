//! `CmId`: the rdma_cm id and its state machine: creation, options, getters and the QP
//! here; binding, resolution and the connect side in `active`; listen, accept and reject
//! in `passive`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdma_soft::verbs::{Device, ProtectionDomain, QpAttr, QpInitAttr, QueuePair};

use crate::cm::channel::EventChannel;
use crate::cm::event::Event;
use crate::context::id_entry::{IdNum, IdSlot, IdState, QpKind};
use crate::context::{Ctx, IdRef};
use crate::error::{Error, Result};
use crate::ha_policy::HaPolicy;
use crate::host::addr::ScopedIp;
use crate::host::route::RocePath;
use crate::ports::PortSpace;

mod active;
mod passive;

/// Options of [`CmId::set_option`] (`rdma_set_option`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmOption {
    /// `RDMA_OPTION_ID_TOS`: IP type of service / traffic class of the path.
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: share the port with other REUSEADDR ids (before bind).
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 id gets IPv6 requests only (before bind).
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout (IBA time code, 0-31).
    AckTimeout(u8),
    /// The id's HA policy (no Linux equivalent; see [`CmId::set_ha_policy`]).
    HaPolicy(HaPolicy),
}

/// Converts an rdma_cm socket address into the resolver's scoped address.
pub(crate) fn scoped(sa: &SocketAddr) -> ScopedIp {
    match sa {
        SocketAddr::V6(v6) if v6.scope_id() != 0 => {
            ScopedIp::with_index(IpAddr::V6(*v6.ip()), v6.scope_id())
        }
        _ => ScopedIp::new(sa.ip()),
    }
}

/// An rdma_cm id (`struct rdma_cm_id`): bound to an address, a device once known, a port
/// space; connects, listens, accepts. Dropping it destroys it (`rdma_destroy_id`), which
/// waits until every event handed out for it has been dropped.
///
/// Active side:
/// ```no_run
/// use std::time::Duration;
/// use rdmacm::cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
/// # fn f() -> rdmacm::Result<()> {
/// let ch = EventChannel::new()?;
/// let id = CmId::new(&ch, PortSpace::Tcp)?;
/// id.resolve_addr(None, "127.0.0.1:7471".parse().unwrap(), Duration::from_secs(2))?;
/// assert_eq!(ch.get_event()?.kind(), EventType::AddrResolved);
/// id.resolve_route(Duration::from_secs(2))?;
/// assert_eq!(ch.get_event()?.kind(), EventType::RouteResolved);
/// id.create_qp_default()?;
/// id.connect(&ConnParam { private_data: b"hi".to_vec(), ..Default::default() })?;
/// let ev = ch.get_event()?;
/// assert_eq!(ev.kind(), EventType::Established);
/// # Ok(()) }
/// ```
///
/// Passive side:
/// ```no_run
/// use rdmacm::cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
/// # fn f() -> rdmacm::Result<()> {
/// let ch = EventChannel::new()?;
/// let listener = CmId::new(&ch, PortSpace::Tcp)?;
/// listener.bind_addr("127.0.0.1:7471".parse().unwrap())?;
/// listener.listen(16)?;
/// let mut ev = ch.get_event()?;
/// assert_eq!(ev.kind(), EventType::ConnectRequest);
/// let id = ev.take_id().unwrap();
/// println!("request from {:?}: {:?}", id.peer_addr(), ev.private_data());
/// drop(ev);
/// id.create_qp_default()?;
/// id.accept(&ConnParam::default())?;
/// # Ok(()) }
/// ```
pub struct CmId {
    pub(crate) inner: Arc<Ctx>,
    pub(crate) num: IdNum,
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId").field("num", &self.num).finish()
    }
}

fn bad_state(op: &'static str, s: IdState) -> Error {
    Error::InvalidState {
        op,
        state: s.name(),
    }
}

impl CmId {
    pub(crate) fn from_num(inner: Arc<Ctx>, num: IdNum) -> CmId {
        CmId { inner, num }
    }

    /// `rdma_create_id`: a new id on `channel` in port space `ps`. TCP and IB port spaces
    /// give RC ids, UDP gives UD ids (SIDR); IPoIB is refused (`EINVAL`).
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let kind = match ps {
            PortSpace::Tcp | PortSpace::Ib => QpKind::Rc,
            PortSpace::Udp => QpKind::Ud,
            PortSpace::IpoIb => {
                return Err(Error::InvalidArgument(
                    "the IPoIB port space is not supported".into(),
                ))
            }
        };
        let inner = channel.inner.clone();
        let mut st = inner.lock();
        let num = st.next_id;
        st.next_id += 1;
        let mut slot = Box::new(IdSlot::new(channel.num, ps, kind));
        slot.opts.ha = inner.config.ha;
        slot.opts.ha_stay = inner.config.ha_stay;
        st.ids.insert(num, slot);
        drop(st);
        Ok(CmId { inner, num })
    }

    /// The id's number (what [`crate::cm::Event::id_num`] refers to).
    pub fn num(&self) -> u64 {
        self.num
    }

    fn with<T>(&self, f: impl FnOnce(&mut IdSlot) -> T) -> Result<T> {
        let mut st = self.inner.lock();
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        Ok(f(s))
    }

    /// The current state.
    pub fn state(&self) -> IdState {
        self.with(|s| s.state).unwrap_or(IdState::Destroying)
    }

    /// The user context reported with this id's events ([`crate::cm::Event::context`]).
    pub fn set_context(&self, ctx: u64) {
        let _ = self.with(|s| s.context = ctx);
    }

    /// The user context.
    pub fn context(&self) -> u64 {
        self.with(|s| s.context).unwrap_or(0)
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.with(|s| s.ps).unwrap_or(PortSpace::Tcp)
    }

    /// `rdma_set_option`. REUSEADDR and AFONLY only before the id is bound (`EINVAL`
    /// after); ACK timeout above 31 is `EINVAL`.
    pub fn set_option(&self, opt: CmOption) -> Result<()> {
        let mut st = self.inner.lock();
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        match opt {
            CmOption::Tos(t) => s.opts.tos = Some(t),
            CmOption::ReuseAddr(v) | CmOption::AfOnly(v) if s.state != IdState::Idle => {
                let _ = v;
                return Err(bad_state("set_option", s.state));
            }
            CmOption::ReuseAddr(v) => s.opts.reuseaddr = v,
            CmOption::AfOnly(v) => s.opts.afonly = Some(v),
            CmOption::AckTimeout(t) if t > 31 => {
                return Err(Error::InvalidArgument("ACK timeout above 31".into()))
            }
            CmOption::AckTimeout(t) => s.opts.ack_timeout = Some(t),
            CmOption::HaPolicy(p) => s.opts.ha = p,
        }
        Ok(())
    }

    /// The id's HA policy: what the CM does when the path of its connection changes
    /// ([`HaPolicy`]; default the context's, `RDMACM_HA`). May be set in any state and
    /// applies to the next change; a listener's policy is inherited by the ids of its
    /// requests. Same as `set_option(CmOption::HaPolicy(p))`.
    ///
    /// ```no_run
    /// # fn f(ch: &rdmacm::cm::EventChannel) -> rdmacm::Result<()> {
    /// use rdmacm::cm::{CmId, HaPolicy, PortSpace};
    /// let id = CmId::new(ch, PortSpace::Tcp)?;
    /// id.set_ha_policy(HaPolicy::Align)?;
    /// assert_eq!(id.ha_policy(), HaPolicy::Align);
    /// # Ok(()) }
    /// ```
    pub fn set_ha_policy(&self, p: HaPolicy) -> Result<()> {
        self.set_option(CmOption::HaPolicy(p))
    }

    /// Resolves the id onto device `index` (the netdev's ifindex) whatever netdev its
    /// route takes: an async reconnect keeping its PD, MRs and CQ.
    pub(crate) fn pin_device(&self, index: u32) {
        let _ = self.with(|s| s.pin_dev = Some(index));
    }

    /// The status the align policy ended the id's connection with, if it did.
    pub(crate) fn align_status(&self) -> Option<i32> {
        self.with(|s| s.align_status).ok().flatten()
    }

    /// Whether a retry exhaustion of this id's QP means its paths are gone: under
    /// `migrate` with path migration, the transport moved to the alternate on the first
    /// exhaustion, so a QP that still fails has no path left (the CM ends the connection
    /// as `align` does when the device reports the failed migration).
    pub(crate) fn paths_exhausted(&self) -> bool {
        self.with(|s| s.opts.ha == HaPolicy::Migrate && s.apm)
            .unwrap_or(false)
    }

    /// The id's HA policy.
    pub fn ha_policy(&self) -> HaPolicy {
        self.with(|s| s.opts.ha).unwrap_or_default()
    }

    /// The device the id is bound to (after a specific bind, address resolution, or on a
    /// passive id): make PDs, CQs and MRs on it.
    pub fn device(&self) -> Option<Device> {
        let st = self.inner.lock();
        let i = st.ids.get(&self.num)?.dev?;
        st.devices.get(&i).map(|d| d.dev.clone())
    }

    /// The netdev (name, ifindex) of the id's device.
    pub fn netdev(&self) -> Option<(String, u32)> {
        let st = self.inner.lock();
        let i = st.ids.get(&self.num)?.dev?;
        st.devices
            .get(&i)
            .map(|d| (d.netdev.name.clone(), d.netdev.index))
    }

    /// The port number on the device, once a device is bound: 1, but on a device group
    /// the port of the netdev the id's local address is on.
    pub fn port_num(&self) -> Option<u8> {
        let st = self.inner.lock();
        let s = st.ids.get(&self.num)?;
        s.dev.map(|_| crate::engine::connect::id_port(&st, s))
    }

    /// The local address and port (`rdma_get_local_addr`, `rdma_get_src_port`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.with(|s| s.local).ok().flatten()
    }

    /// The peer's address and port (`rdma_get_peer_addr`, `rdma_get_dst_port`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.with(|s| s.peer).ok().flatten()
    }

    /// The resolved RoCE path (after ROUTE_RESOLVED, or on a passive id).
    pub fn path(&self) -> Option<RocePath> {
        self.with(|s| s.path.clone()).ok().flatten()
    }

    /// The QP made by [`CmId::create_qp`].
    pub fn qp(&self) -> Option<Arc<QueuePair>> {
        self.with(|s| s.qp.clone()).ok().flatten()
    }

    /// `rdma_create_qp`: creates an RC QP on the id's device with `pd` and `init` (both of
    /// that device) and moves it to INIT; connect/accept then take it to RTR and RTS.
    /// On a UD id (`init` of type UD), as librdmacm: the UD QP goes to RTS at once, with
    /// Q_Key `RDMA_UDP_QKEY`, receiving on the id's source address (for multicast:
    /// [`CmId::join_multicast`]; `accept` and `connect` name it in SIDR).
    /// `EINVAL` without a device, with a QP already, or for a QP type not the id's.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        init: &QpInitAttr<'_>,
    ) -> Result<Arc<QueuePair>> {
        let (port, kind, sgid) = {
            let st = self.inner.lock();
            let s = st.ids.get(&self.num).ok_or(Error::Shutdown)?;
            let want = match init.qp_type {
                rdma_soft::verbs::QpType::Ud => QpKind::Ud,
                _ => QpKind::Rc,
            };
            if s.dev.is_none() || s.qp.is_some() || s.qp_kind != want {
                return Err(Error::InvalidArgument(
                    "create_qp needs an id with a device, no QP yet and a QP type of its \
                     port space"
                        .into(),
                ));
            }
            let sgid = s
                .dev
                .and_then(|k| st.devices.get(&k))
                .zip(s.local)
                .and_then(|(d, l)| d.sgid(l.ip()));
            (crate::engine::connect::id_port(&st, s), want, sgid)
        };
        let qp = pd.create_qp(init)?;
        if kind == QpKind::Ud {
            if let Some((_, index)) = sgid {
                qp.set_ud_source(index)?;
            }
            qp.ud_ready_port(port, crate::engine::connect::RDMA_UDP_QKEY)?;
            let qp = Arc::new(qp);
            self.with(|s| s.qp = Some(qp.clone()))?;
            return Ok(qp);
        }
        let (mut a, m) = QpAttr::init(QpAttr::RC_ACCESS);
        a.port_num = port;
        qp.modify(&a, m)?;
        let qp = Arc::new(qp);
        self.with(|s| s.qp = Some(qp.clone()))?;
        Ok(qp)
    }

    /// Creates a PD, one CQ of 256 entries for both directions and a QP of the id's port
    /// space (UD for UDP, RC otherwise) with default capacities on the id's device
    /// ([`CmId::create_qp`]); returns the QP (its CQs and PD are reachable from it).
    pub fn create_qp_default(&self) -> Result<Arc<QueuePair>> {
        let dev = self
            .device()
            .ok_or_else(|| Error::InvalidArgument("id has no device yet".into()))?;
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(256, None)?;
        let init = match self.port_space() {
            PortSpace::Udp => QpInitAttr::ud(&cq, &cq),
            _ => QpInitAttr::rc(&cq, &cq),
        };
        self.create_qp(&pd, &init)
    }

    /// `rdma_migrate_id`: moves the id, and its queued events, to another channel of the
    /// same context (`EINVAL` otherwise).
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        if !Arc::ptr_eq(&self.inner, &channel.inner) {
            return Err(Error::InvalidArgument("channel of another context".into()));
        }
        let mut st = self.inner.lock();
        let st = &mut *st;
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        let old = s.channel;
        s.channel = channel.num;
        if old == channel.num {
            return Ok(());
        }
        let queued = s.queued_events;
        let moved: Vec<_> = match st.channels.get_mut(&old).filter(|_| queued > 0) {
            Some(c) => {
                let (m, keep): (Vec<_>, Vec<_>) = c.queue.drain(..).partition(|e| e.id == self.num);
                c.queue = keep.into();
                if c.queue.is_empty() {
                    c.efd.clear();
                }
                m
            }
            None => Vec::new(),
        };
        if let Some(c) = st.channels.get_mut(&channel.num) {
            if !moved.is_empty() && c.queue.is_empty() {
                c.efd.signal();
            }
            c.queue.extend(moved);
        }
        Ok(())
    }
}

impl CmId {
    fn r(&self) -> IdRef<'_> {
        IdRef {
            inner: &self.inner,
            num: self.num,
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        self.leave_all_multicast();
        crate::engine::run::destroy(&self.inner, self.num);
    }
}

impl Event {
    /// Takes the new id of a CONNECT_REQUEST (`event->id`, the id to accept or reject on);
    /// `None` for other events or when already taken. Taking it acknowledges the event, so
    /// that dropping the new id while the event is still alive does not wait forever — a
    /// difference from `rdma_destroy_id`, whose wait for the CONNECT_REQUEST's ack would
    /// otherwise be a trap of Rust's drop order.
    pub fn take_id(&mut self) -> Option<CmId> {
        let num = self.new_id.take()?;
        self.ack_once();
        Some(CmId::from_num(self.inner.clone(), num))
    }
}
