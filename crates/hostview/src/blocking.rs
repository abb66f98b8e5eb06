//! Blocking wrappers for rdma_cm-style callers.

use std::net::IpAddr;
use std::time::Duration;

use crate::{Address, Error, HostView, Link, MacAddr, Neighbour, Result, RouteAnswer, RouteEntry};

/// [`HostView`] for blocking code: owns a current-thread tokio runtime and runs each query to
/// completion on it. Use it from threads that are not inside a tokio runtime.
///
/// ```no_run
/// let hv = rdma_hostview::BlockingHostView::new().unwrap();
/// let r = hv.route_get("127.0.0.1".parse().unwrap(), None, None).unwrap();
/// assert_eq!(r.kind, rdma_hostview::RouteType::Local);
/// ```
#[derive(Debug)]
pub struct BlockingHostView {
    rt: tokio::runtime::Runtime,
    hv: HostView,
}

impl BlockingHostView {
    /// Creates the runtime and the netlink connection (in the calling thread's namespace).
    pub fn new() -> Result<BlockingHostView> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Io)?;
        let hv = rt.block_on(async { HostView::new() })?;
        Ok(BlockingHostView { rt, hv })
    }

    /// Wraps an existing view (e.g. [`HostView::uncached`]).
    ///
    /// ```no_run
    /// use rdma_hostview::{BlockingHostView, HostView};
    /// let hv = BlockingHostView::from_view(HostView::uncached().unwrap()).unwrap();
    /// assert!(!hv.links().unwrap().is_empty());
    /// ```
    pub fn from_view(hv: HostView) -> Result<BlockingHostView> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Io)?;
        Ok(BlockingHostView { rt, hv })
    }

    /// See [`HostView::links`].
    pub fn links(&self) -> Result<Vec<Link>> {
        self.rt.block_on(self.hv.links())
    }

    /// See [`HostView::link`].
    pub fn link(&self, index: u32) -> Result<Link> {
        self.rt.block_on(self.hv.link(index))
    }

    /// See [`HostView::link_by_name`].
    pub fn link_by_name(&self, name: &str) -> Result<Link> {
        self.rt.block_on(self.hv.link_by_name(name))
    }

    /// See [`HostView::addresses`].
    pub fn addresses(&self) -> Result<Vec<Address>> {
        self.rt.block_on(self.hv.addresses())
    }

    /// See [`HostView::link_holding`].
    pub fn link_holding(&self, ip: IpAddr, scope: Option<u32>) -> Result<Link> {
        self.rt.block_on(self.hv.link_holding(ip, scope))
    }

    /// See [`HostView::route_get`].
    pub fn route_get(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        oif: Option<u32>,
    ) -> Result<RouteAnswer> {
        self.rt.block_on(self.hv.route_get(dst, src, oif))
    }

    /// See [`HostView::route_get_bound`].
    pub fn route_get_bound(
        &self,
        dst: IpAddr,
        src: Option<IpAddr>,
        oif: u32,
    ) -> Result<RouteAnswer> {
        self.rt.block_on(self.hv.route_get_bound(dst, src, oif))
    }

    /// See [`HostView::routes`].
    pub fn routes(&self) -> Result<Vec<RouteEntry>> {
        self.rt.block_on(self.hv.routes())
    }

    /// See [`HostView::neighbour`].
    pub fn neighbour(&self, link: u32, ip: IpAddr) -> Result<Option<Neighbour>> {
        self.rt.block_on(self.hv.neighbour(link, ip))
    }

    /// See [`HostView::resolve_neighbour`]; blocks until resolved, failed or `timeout`.
    pub fn resolve_neighbour(
        &self,
        link: u32,
        next_hop: IpAddr,
        timeout: Duration,
    ) -> Result<MacAddr> {
        self.rt
            .block_on(self.hv.resolve_neighbour(link, next_hop, timeout))
    }

    /// Runs any future of the async API (e.g. waiting on a [`crate::Monitor`]) on this runtime.
    ///
    /// ```no_run
    /// let hv = rdma_hostview::BlockingHostView::new().unwrap();
    /// let mut mon = hv.block_on(rdma_hostview::Monitor::new()).unwrap();
    /// let ev = hv.block_on(mon.next());
    /// println!("{ev:?}");
    /// ```
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The async view, for use inside [`BlockingHostView::block_on`].
    pub fn view(&self) -> &HostView {
        &self.hv
    }
}
