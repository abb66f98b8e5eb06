//! `CmId`: the rdma_cm id and its state machine.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rdma_soft::verbs::{
    Device, ProtectionDomain, QpAttr, QpAttrMask, QpInitAttr, QpState, QueuePair,
};

use crate::addr::ScopedIp;
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::inner::{IdRef, Inner};
use crate::params::{ConnEventParam, ConnParam, EventType};
use crate::ports::{BindRequest, PortSpace};
use crate::resolve::Binding;
use crate::route::{RocePath, RouteParams};
use crate::slot::{IdNum, IdSlot, IdState, ListenState, QpKind};

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
/// use rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
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
/// use rdmacm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
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
    pub(crate) inner: Arc<Inner>,
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
    pub(crate) fn from_num(inner: Arc<Inner>, num: IdNum) -> CmId {
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
        st.ids.insert(num, IdSlot::new(channel.num, ps, kind));
        drop(st);
        Ok(CmId { inner, num })
    }

    /// The id's number (what [`crate::Event::id_num`] refers to).
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

    /// The user context reported with this id's events ([`crate::Event::context`]).
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
        }
        Ok(())
    }

    /// `rdma_bind_addr`: binds to a local address and port (0: an ephemeral port). A
    /// specific address binds the device of the netdev holding it; a wildcard binds none.
    /// Link-local IPv6 needs a scope id (`EINVAL`). Errors: `EADDRINUSE`, `EADDRNOTAVAIL`,
    /// `EACCES` (port below 1024 without the capability), `EINVAL` when not IDLE.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let st = self.with(|s| s.state)?;
        if st != IdState::Idle {
            return Err(bad_state("bind_addr", st));
        }
        self.do_bind(addr)
    }

    fn do_bind(&self, addr: SocketAddr) -> Result<()> {
        let sa = scoped(&addr);
        let binding: Binding = self
            .inner
            .block(move |r| async move { r.bind(&sa).await })?;
        if let Some(nd) = &binding.netdev {
            self.inner.ensure_device(nd.index)?;
        }
        let mut st = self.inner.lock();
        let st = &mut *st;
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        if s.state != IdState::Idle {
            return Err(bad_state("bind_addr", s.state));
        }
        let afonly = match s.opts.afonly {
            Some(v) => v,
            None => {
                addr.is_ipv4()
                    || std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only")
                        .map(|x| x.trim() == "1")
                        .unwrap_or(false)
            }
        };
        let req = BindRequest::new(addr.ip(), addr.port())
            .reuseaddr(s.opts.reuseaddr)
            .afonly(afonly);
        let (h, port) = st.ports.bind(s.ps, &req)?;
        s.opts.afonly = Some(afonly);
        s.bind = Some(h);
        let mut local = addr;
        local.set_port(port);
        s.local = Some(local);
        s.dev = binding.netdev.as_ref().map(|n| n.index);
        s.binding = Some(binding);
        s.state = IdState::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: resolves `dst` (and binds implicitly if IDLE: to `src` if
    /// given, else to the wildcard of `dst`'s family). The route lookup uses the full
    /// tuple (destination, bound source, bound netdev). Errors the kernel returns at once
    /// are returned here (`EHOSTUNREACH` for a bound netdev without a route, `EINVAL` for a
    /// link-local address without scope, `ENETUNREACH`, `ENODEV` ...); a neighbour that does
    /// not answer within `timeout` gives ADDR_ERROR (`-ETIMEDOUT`). Success: ADDR_RESOLVED.
    ///
    /// Difference: the neighbour resolution runs in this call (it returns when it is done,
    /// at most after `timeout`); the event is queued before it returns.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let state = self.with(|s| s.state)?;
        match state {
            IdState::Idle => {
                let src = src.unwrap_or_else(|| match dst {
                    SocketAddr::V4(_) => "0.0.0.0:0".parse().unwrap_or(dst),
                    SocketAddr::V6(_) => "[::]:0".parse().unwrap_or(dst),
                });
                if src.is_ipv4() != dst.is_ipv4() {
                    return Err(Error::InvalidArgument(
                        "source and destination families differ".into(),
                    ));
                }
                self.do_bind(src)?;
            }
            IdState::AddrBound | IdState::AddrResolved => {}
            s => return Err(bad_state("resolve_addr", s)),
        }
        let (src_ip, bound, prev) = {
            let mut st = self.inner.lock();
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            if !matches!(s.state, IdState::AddrBound | IdState::AddrResolved) {
                return Err(bad_state("resolve_addr", s.state));
            }
            if s.local.is_some_and(|l| l.is_ipv4() != dst.is_ipv4()) {
                return Err(Error::InvalidArgument(
                    "source and destination families differ".into(),
                ));
            }
            let prev = s.state;
            s.state = IdState::AddrQuery;
            let b = s.binding.as_ref();
            let src_ip = b.filter(|b| !b.is_wildcard()).map(|b| match b.scope {
                Some(sc) => ScopedIp::with_index(b.addr, sc),
                None => ScopedIp::new(b.addr),
            });
            (
                src_ip,
                b.and_then(|b| b.netdev.as_ref().map(|n| n.index)),
                prev,
            )
        };
        let prev = if prev == IdState::AddrResolved {
            IdState::AddrResolved
        } else {
            IdState::AddrBound
        };
        let dsts = scoped(&dst);
        let r = self.inner.block(move |r| async move {
            r.resolve_addr(src_ip.as_ref(), &dsts, bound, timeout).await
        });
        let r = match r {
            Ok(a) => self.inner.ensure_device(a.netdev.index).map(|_| a),
            Err(e) => Err(e),
        };
        let mut st = self.inner.lock();
        let st = &mut *st;
        let Some(s) = st.ids.get_mut(&self.num) else {
            return Err(Error::Shutdown);
        };
        if s.state != IdState::AddrQuery {
            return Err(bad_state("resolve_addr", s.state));
        }
        match r {
            Ok(a) => {
                let port = s.local.map(|l| l.port()).unwrap_or(0);
                s.local = Some(match a.src_scope {
                    Some(sc) => SocketAddr::V6(std::net::SocketAddrV6::new(
                        match a.src {
                            IpAddr::V6(v) => v,
                            IpAddr::V4(v) => v.to_ipv6_mapped(),
                        },
                        port,
                        0,
                        sc,
                    )),
                    None => SocketAddr::new(a.src, port),
                });
                s.peer = Some(dst);
                s.dev = Some(a.netdev.index);
                s.state = IdState::AddrResolved;
                let src = a.src;
                let dev = a.netdev.index;
                s.resolved = Some(a.clone());
                if let Err(e) = Inner::open_gsi(st, dev, src) {
                    if let Some(s) = st.ids.get_mut(&self.num) {
                        s.state = prev;
                    }
                    return Err(e);
                }
                self.inner.watch(st, self.num, &a);
                Inner::event(
                    st,
                    self.num,
                    EventType::AddrResolved,
                    0,
                    ConnEventParam::default(),
                );
                Ok(())
            }
            Err(Error::TimedOut) => {
                s.state = prev;
                Inner::event(
                    st,
                    self.num,
                    EventType::AddrError,
                    -libc::ETIMEDOUT,
                    ConnEventParam::default(),
                );
                Ok(())
            }
            Err(e) => {
                s.state = prev;
                Err(e)
            }
        }
    }

    /// `rdma_resolve_route`: the RoCE path, computed locally (ROUTE_RESOLVED is queued
    /// before it returns). `timeout` 0 is `EINVAL`, as in Linux; errors (`EINVAL` for an
    /// MTU too small, `ENODEV`) are returned at once and roll the state back.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument("route timeout 0".into()));
        }
        let (addr, params) = {
            let mut st = self.inner.lock();
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            if s.state != IdState::AddrResolved {
                return Err(bad_state("resolve_route", s.state));
            }
            let Some(a) = s.resolved.clone() else {
                return Err(bad_state("resolve_route", s.state));
            };
            s.state = IdState::RouteQuery;
            let params = RouteParams {
                src_port: s.local.map(|l| l.port()).unwrap_or(0),
                dst_port: s.peer.map(|p| p.port()).unwrap_or(0),
                tos: s.opts.tos.unwrap_or(0),
                ipv6_flow_label: match s.peer {
                    Some(SocketAddr::V6(v)) if v.flowinfo() != 0 => Some(v.flowinfo()),
                    _ => None,
                },
                ack_timeout: s.opts.ack_timeout,
            };
            (a, params)
        };
        let r: Result<RocePath> = self
            .inner
            .block(move |r| async move { r.resolve_route(&addr, &params).await });
        let mut st = self.inner.lock();
        let st = &mut *st;
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        if s.state != IdState::RouteQuery {
            return Err(bad_state("resolve_route", s.state));
        }
        match r {
            Ok(p) => {
                s.path = Some(p);
                s.state = IdState::RouteResolved;
                Inner::event(
                    st,
                    self.num,
                    EventType::RouteResolved,
                    0,
                    ConnEventParam::default(),
                );
                Ok(())
            }
            Err(e) => {
                s.state = IdState::AddrResolved;
                Err(e)
            }
        }
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

    /// The port number on the device (always 1), once a device is bound.
    pub fn port_num(&self) -> Option<u8> {
        self.with(|s| s.dev.map(|_| 1)).ok().flatten()
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
    /// `EINVAL` without a device or on a UD id (UD QPs: give `qp_num` in [`ConnParam`]).
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        init: &QpInitAttr<'_>,
    ) -> Result<Arc<QueuePair>> {
        {
            let st = self.inner.lock();
            let s = st.ids.get(&self.num).ok_or(Error::Shutdown)?;
            if s.dev.is_none() || s.qp.is_some() || s.qp_kind != QpKind::Rc {
                return Err(Error::InvalidArgument(
                    "create_qp needs an RC id with a device and no QP yet".into(),
                ));
            }
        }
        let qp = pd.create_qp(init)?;
        let (a, m) = QpAttr::init(QpAttr::RC_ACCESS);
        qp.modify(&a, m)?;
        let qp = Arc::new(qp);
        self.with(|s| s.qp = Some(qp.clone()))?;
        Ok(qp)
    }

    /// Creates a PD, one CQ of 256 entries for both directions and an RC QP with default
    /// capacities on the id's device ([`CmId::create_qp`]); returns the QP (its CQs and PD
    /// are reachable from it).
    pub fn create_qp_default(&self) -> Result<Arc<QueuePair>> {
        let dev = self
            .device()
            .ok_or_else(|| Error::InvalidArgument("id has no device yet".into()))?;
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(256, None)?;
        self.create_qp(&pd, &QpInitAttr::rc(&cq, &cq))
    }

    /// `rdma_listen`: listens for requests (binding to 0.0.0.0 first if IDLE). A specific
    /// address listens on its device and only gets requests for that address; a wildcard
    /// listens on every device. `backlog` bounds the CONNECT_REQUEST events queued and not
    /// yet taken (0: 1024); requests beyond it are dropped without an answer, as Linux does
    /// (no REJ: the requester's CM retries its REQ after its timeout, and the retry is a new
    /// request once the application has taken queued ones).
    pub fn listen(&self, backlog: usize) -> Result<()> {
        if self.state() == IdState::Idle {
            let any = self.with(|s| match s.local {
                Some(SocketAddr::V6(_)) => "[::]:0",
                _ => "0.0.0.0:0",
            })?;
            self.do_bind(
                any.parse()
                    .map_err(|_| Error::InvalidArgument("any".into()))?,
            )?;
        }
        let (binding, ps, port) = {
            let mut st = self.inner.lock();
            let st = &mut *st;
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            if s.state != IdState::AddrBound {
                return Err(bad_state("listen", s.state));
            }
            if let Some(h) = s.bind {
                st.ports.listen(h)?;
            }
            (
                s.binding.clone(),
                s.ps,
                s.local.map(|l| l.port()).unwrap_or(0),
            )
        };
        let binding = binding.ok_or_else(|| bad_state("listen", IdState::Idle))?;
        // Devices to listen on, with the local addresses to open on each.
        let mut targets: Vec<(u32, Vec<IpAddr>)> = Vec::new();
        match &binding.netdev {
            Some(nd) => targets.push((nd.index, vec![binding.addr])),
            // A wildcard opens every address of both families, as the kernel hears on all
            // of them: a request the listener does not take (the other family, AFONLY) is
            // then refused with REJ 28 as Linux does, not left unanswered.
            None => {
                let addrs = self
                    .inner
                    .block(|r| async move { r.view().addresses().await })
                    .map_err(Error::from)?;
                let mut by: std::collections::BTreeMap<u32, Vec<IpAddr>> = Default::default();
                for a in addrs {
                    by.entry(a.link).or_default().push(a.addr);
                }
                targets.extend(by);
            }
        }
        for (i, _) in &targets {
            self.inner.ensure_device(*i)?;
        }
        let sid = rdma_wire::ip_cm::ServiceId::new(ps, port).0;
        let mut st = self.inner.lock();
        let st = &mut *st;
        let mut regs = Vec::new();
        let specific = binding.netdev.is_some();
        for (i, addrs) in targets {
            for a in addrs {
                match Inner::open_gsi(st, i, a) {
                    Ok(()) => {}
                    // A specific listener has only this address: not being able to open it
                    // (e.g. another process holds UDP 4791 there) fails the listen.
                    Err(e) if specific => return Err(e),
                    // A wildcard listener skips such an address and works on the others.
                    Err(_) => {}
                }
            }
            let Some(d) = st.devices.get_mut(&i) else {
                continue;
            };
            let l = d.listeners.entry(sid).or_default();
            if l.is_empty() {
                d.agent.listen(sid)?;
            }
            l.push(self.num);
            regs.push((i, sid));
        }
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        s.listen = Some(ListenState {
            backlog: if backlog == 0 { 1024 } else { backlog },
            queued: 0,
            regs,
        });
        s.state = IdState::Listen;
        Ok(())
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
        let moved: Vec<_> = match st.channels.get_mut(&old) {
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

    /// `rdma_connect`: sends the REQ (RC) or SIDR_REQ (UD). Needs ROUTE_RESOLVED and a QP
    /// ([`CmId::create_qp`] or `param.qp_num`). Private data over 56 bytes (180 for UD) is
    /// `EINVAL`. Then: ESTABLISHED (or CONNECT_RESPONSE with a user QP), REJECTED,
    /// UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        crate::connect::connect(self.r(), param)
    }

    /// `rdma_accept` on a passive id: moves the QP to RTR and RTS and sends the REP (RC),
    /// or sends the SIDR_REP (UD, with `param.qp_num`). Private data over 196 bytes (136
    /// for UD) is `EINVAL`. ESTABLISHED follows when the RTU arrives.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        crate::listen::accept(self.r(), param)
    }

    /// `rdma_reject` on a passive id: REJ reason 28 (consumer defined) with up to 148
    /// bytes of private data (SIDR_REP "reject" for UD).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        crate::listen::reject(self.r(), private_data)
    }

    /// `rdma_establish`: completes an active connection after CONNECT_RESPONSE when the
    /// application manages its QP (sends the RTU). No ESTABLISHED event follows.
    pub fn establish(&self) -> Result<()> {
        crate::connect::establish(self.r())
    }

    /// `rdma_disconnect`: moves the QP to ERR and sends a DREQ (or the DREP when the peer's
    /// DREQ came first). DISCONNECTED follows (at once for the DREP case... when the DREP
    /// arrives otherwise), then TIMEWAIT_EXIT.
    pub fn disconnect(&self) -> Result<()> {
        crate::connect::disconnect(self.r())
    }

    /// The attributes to move a user-managed QP to `state` (`rdma_init_qp_attr`): INIT,
    /// RTR or RTS, from the id's path and the peer's REQ/REP.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let st = self.inner.lock();
        let s = st.ids.get(&self.num).ok_or(Error::Shutdown)?;
        crate::connect::qp_attr(&st, s, state)
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
        crate::cm_engine::destroy(&self.inner, self.num);
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
