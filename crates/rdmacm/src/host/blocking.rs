//! Blocking wrappers for the rdma_cm-style synchronous API.

use std::net::IpAddr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::host::addr::ScopedIp;
use crate::host::resolve::{Binding, GidEntry, ResolvedAddr, Resolver};
use crate::host::route::{RocePath, RouteParams};
use crate::host::watch::Watcher;

/// [`Resolver`] for blocking callers: owns a current-thread tokio runtime and runs each call
/// to completion on it. Create it (and use it) outside any tokio runtime, in the network
/// namespace it should see.
///
/// ```no_run
/// use std::time::Duration;
/// let r = rdmacm::host::BlockingResolver::new().unwrap();
/// let a = r
///     .resolve_addr(None, &"::1".parse().unwrap(), None, Duration::from_secs(2))
///     .unwrap();
/// assert_eq!(a.netdev.name, "lo");
/// ```
#[derive(Debug)]
pub struct BlockingResolver {
    rt: tokio::runtime::Runtime,
    resolver: Resolver,
}

impl BlockingResolver {
    /// Creates the runtime and the netlink connection.
    pub fn new() -> Result<BlockingResolver> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Io)?;
        let resolver = rt.block_on(async { Resolver::new() })?;
        Ok(BlockingResolver { rt, resolver })
    }

    /// See [`Resolver::bind`].
    pub fn bind(&self, addr: &ScopedIp) -> Result<Binding> {
        self.rt.block_on(self.resolver.bind(addr))
    }

    /// See [`Resolver::gid_table`].
    pub fn gid_table(&self, netdev: u32) -> Result<Vec<GidEntry>> {
        self.rt.block_on(self.resolver.gid_table(netdev))
    }

    /// See [`Resolver::resolve_addr`]; blocks up to about `timeout` for the neighbour.
    pub fn resolve_addr(
        &self,
        src: Option<&ScopedIp>,
        dst: &ScopedIp,
        bound: Option<u32>,
        timeout: Duration,
    ) -> Result<ResolvedAddr> {
        self.rt
            .block_on(self.resolver.resolve_addr(src, dst, bound, timeout))
    }

    /// See [`Resolver::resolve_route`].
    pub fn resolve_route(&self, addr: &ResolvedAddr, params: &RouteParams) -> Result<RocePath> {
        self.rt.block_on(self.resolver.resolve_route(addr, params))
    }

    /// See [`Resolver::accept_path`].
    pub fn accept_path(&self, arrival: u32, local: IpAddr, peer: IpAddr) -> Result<ResolvedAddr> {
        self.rt
            .block_on(self.resolver.accept_path(arrival, local, peer))
    }

    /// A [`Watcher`] bound to this runtime; drive it with [`BlockingResolver::block_on`].
    ///
    /// ```no_run
    /// let r = rdmacm::host::BlockingResolver::new().unwrap();
    /// let mut w = r.watcher().unwrap();
    /// let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    /// let n = r.block_on(w.next_before(deadline));
    /// println!("{n:?}");
    /// ```
    pub fn watcher(&self) -> Result<Watcher> {
        self.rt.block_on(Watcher::new(&self.resolver))
    }

    /// Runs any future of the async API on this runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The async resolver, for use inside [`BlockingResolver::block_on`].
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }
}
