//! The active side of an id: bind, address and route resolution, connect, establish,
//! disconnect, and the QP attributes for a user-managed QP.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdma_soft::verbs::{QpAttr, QpAttrMask, QpState};

use super::{bad_state, scoped, CmId};
use crate::context::id_entry::IdState;
use crate::context::run_on::block_here;
use crate::context::Inner;
use crate::error::{Error, Result};
use crate::host::addr::ScopedIp;
use crate::host::resolve::Binding;
use crate::host::route::{RocePath, RouteParams};
use crate::params::{ConnEventParam, ConnParam, EventType};
use crate::ports::BindRequest;

impl CmId {
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

    /// [`CmId::bind_addr`] for async callers (the async layer): netlink is awaited.
    pub(crate) async fn bind_addr_async(&self, addr: SocketAddr) -> Result<()> {
        let st = self.with(|s| s.state)?;
        if st != IdState::Idle {
            return Err(bad_state("bind_addr", st));
        }
        self.do_bind_async(addr).await
    }

    pub(super) fn do_bind(&self, addr: SocketAddr) -> Result<()> {
        block_here(self.do_bind_async(addr))
    }

    pub(crate) async fn do_bind_async(&self, addr: SocketAddr) -> Result<()> {
        let sa = scoped(&addr);
        let binding: Binding = self
            .inner
            .resolve(move |r| async move { r.bind(&sa).await })
            .await?;
        let key = match &binding.netdev {
            Some(nd) => Some(self.inner.ensure_device_async(nd.index).await?),
            None => None,
        };
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
        s.dev = key;
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
        block_here(self.resolve_addr_async(src, dst, timeout))
    }

    /// [`CmId::resolve_addr`] for async callers (the async layer): the neighbour
    /// resolution is awaited, no thread waits for it.
    pub(crate) async fn resolve_addr_async(
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
                self.do_bind_async(src).await?;
            }
            IdState::AddrBound | IdState::AddrResolved => {}
            s => return Err(bad_state("resolve_addr", s)),
        }
        let (src_ip, bound, prev, pin) = {
            let mut st = self.inner.lock();
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            let pin = s.pin_dev;
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
                pin,
            )
        };
        let prev = if prev == IdState::AddrResolved {
            IdState::AddrResolved
        } else {
            IdState::AddrBound
        };
        let dsts = scoped(&dst);
        let r = self
            .inner
            .resolve(move |r| async move {
                r.resolve_addr(src_ip.as_ref(), &dsts, bound, timeout).await
            })
            .await;
        let r = match r {
            // A pinned id (async reconnect) stays on its PD's device: the path's netdev
            // needs no device of its own.
            Ok(a) => self
                .inner
                .ensure_device_async(pin.unwrap_or(a.netdev.index))
                .await
                .map(|key| (a, key)),
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
            Ok((a, dev)) => {
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
                s.dev = Some(dev);
                s.state = IdState::AddrResolved;
                let src = a.src;
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
        block_here(self.resolve_route_async(timeout))
    }

    /// [`CmId::resolve_route`] for async callers (the async layer).
    pub(crate) async fn resolve_route_async(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument("route timeout 0".into()));
        }
        let (addr, params, cands) = {
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
            let cands = crate::ha::migrate::candidates(&st, &st.ids[&self.num]);
            (a, params, cands)
        };
        let peer = addr.dst;
        type Alt = (
            Option<crate::ha::migrate::AltPath>,
            Option<crate::ha::rails::RailOffer>,
        );
        let r: Result<(RocePath, Alt)> = self
            .inner
            .resolve(move |r| async move {
                let p = r.resolve_route(&addr, &params).await?;
                let alt = r.alternate(peer, &cands).await;
                // No route through another port: offer our address there (crate::ha::rails).
                let offer = match alt {
                    None => r.rail_offer(peer, &cands).await,
                    Some(_) => None,
                };
                Ok((p, (alt, offer)))
            })
            .await;
        let mut st = self.inner.lock();
        let st = &mut *st;
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        if s.state != IdState::RouteQuery {
            return Err(bad_state("resolve_route", s.state));
        }
        match r {
            Ok((p, (alt, offer))) => {
                s.path = Some(p);
                let key = s.dev;
                let dev = key.and_then(|k| st.devices.get(&k));
                s.alt = dev.and_then(|d| crate::ha::migrate::checked(d, alt));
                s.rail_offer = offer
                    .filter(|o| dev.is_some_and(|d| d.dev.gid_index_on(o.port, o.local).is_some()));
                s.state = IdState::RouteResolved;
                let local = s.alt.map(|a| a.local).or(s.rail_offer.map(|o| o.local));
                if let (Some(k), Some(a)) = (key, local) {
                    // MADs may come and go on the alternate's address after a migration.
                    if Inner::open_gsi(st, k, a).is_err() {
                        if let Some(s) = st.ids.get_mut(&self.num) {
                            s.alt = None;
                            s.rail_offer = None;
                        }
                    }
                }
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

    /// `rdma_connect`: sends the REQ (RC) or SIDR_REQ (UD). Needs ROUTE_RESOLVED and a QP
    /// ([`CmId::create_qp`] or `param.qp_num`). Private data over 56 bytes (180 for UD) is
    /// `EINVAL`. Then: ESTABLISHED (or CONNECT_RESPONSE with a user QP), REJECTED,
    /// UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        crate::engine::connect::connect(self.r(), param)
    }

    /// `rdma_establish`: completes an active connection after CONNECT_RESPONSE when the
    /// application manages its QP (sends the RTU). No ESTABLISHED event follows.
    pub fn establish(&self) -> Result<()> {
        crate::engine::connect::establish(self.r())
    }

    /// `rdma_disconnect`: moves the QP to ERR and sends a DREQ (or the DREP when the peer's
    /// DREQ came first). DISCONNECTED follows (at once for the DREP case... when the DREP
    /// arrives otherwise), then TIMEWAIT_EXIT.
    pub fn disconnect(&self) -> Result<()> {
        crate::engine::connect::disconnect(self.r())
    }

    /// The attributes to move a user-managed QP to `state` (`rdma_init_qp_attr`): INIT,
    /// RTR or RTS, from the id's path and the peer's REQ/REP.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let st = self.inner.lock();
        let s = st.ids.get(&self.num).ok_or(Error::Shutdown)?;
        crate::engine::connect::qp_attr(&st, s, state)
    }
}
