//! Port spaces: which (address, port) each id holds, per port space, with rdma_cm's conflict
//! rules (`cma_get_port`, `cma_check_port`, `cma_alloc_any_port`, `cma_port_is_unique`).
//! Where ports come from (the ephemeral range, the privileged limit) is in `config`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};

use crate::error::{Error, Result};

mod config;
#[cfg(test)]
mod tests;

#[cfg(test)]
use config::read_local_port_range;
pub use config::PortConfig;

/// An rdma_cm port space (`enum rdma_ucm_port_space`); each has its own bind table. The
/// one type of the workspace, defined next to the service ids that encode it.
pub use rdma_wire::ip_cm::PortSpace;

/// What an id asks to bind (IPv4 ids are AF-only: `tests.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRequest {
    /// Local address: wildcard or specific. Loopback addresses are specific here (Linux
    /// counts them as "any"): consistent with binding them to the device on `lo`.
    pub addr: IpAddr,
    /// Port; 0 takes an ephemeral one.
    pub port: u16,
    /// `RDMA_OPTION_ID_REUSEADDR`.
    pub reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY` (IPv4 ids always; IPv6 per `net.ipv6.bindv6only`, 0 by default).
    pub afonly: bool,
    /// For an ephemeral port picked at connect time: the peer. A port already in use may
    /// then be shared if (source, destination, destination port) stays unique.
    pub peer: Option<SocketAddr>,
}

impl BindRequest {
    /// A request with the defaults: no REUSEADDR, AF-only for IPv4, no peer.
    pub fn new(addr: IpAddr, port: u16) -> BindRequest {
        BindRequest {
            addr,
            port,
            reuseaddr: false,
            afonly: addr.is_ipv4(),
            peer: None,
        }
    }

    /// Sets REUSEADDR.
    pub fn reuseaddr(mut self, on: bool) -> Self {
        self.reuseaddr = on;
        self
    }

    /// Sets AF-only.
    pub fn afonly(mut self, on: bool) -> Self {
        self.afonly = on;
        self
    }

    /// Sets the peer (connect-time ephemeral allocation).
    #[cfg(test)]
    pub fn connecting_to(mut self, peer: SocketAddr) -> Self {
        self.peer = Some(peer);
        self
    }
}

/// A binding held in a [`PortTables`]; give it back with [`PortTables::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BindHandle(u64);

#[derive(Debug, Clone)]
struct Owner {
    handle: u64,
    addr: IpAddr,
    reuseaddr: bool,
    afonly: bool,
    listening: bool,
    peer: Option<SocketAddr>,
}

/// The bind tables of every port space (one per network namespace in Linux; one per
/// process here, plus a listener's claim across processes: `rdma_soft::io::PortClaim`).
///
/// Conflict rules for an explicit port, against each id already on the port (section
/// (a).6): skipped if both set REUSEADDR (a listening id counts as not reusing), or both
/// are AF-only of different families; otherwise either address a wildcard ⇒
/// `EADDRNOTAVAIL`, identical addresses ⇒ `EADDRINUSE`, different addresses coexist.
/// Explicit ports below 1024 need `CAP_NET_BIND_SERVICE` (`EACCES`). Examples: `tests.rs`.
#[derive(Debug)]
pub(crate) struct PortTables {
    config: PortConfig,
    ports: HashMap<(PortSpace, u16), Vec<Owner>>,
    handles: HashMap<u64, (PortSpace, u16)>,
    next_handle: u64,
    last_used: u16,
    rng: u64,
    /// Listeners' claims across processes (`rdma_soft::io::PortClaim`), by handle.
    claims: HashMap<u64, rdma_soft::io::PortClaim>,
    /// Where the claims' runtime directory is chosen from (`rdma_soft::config::process_runtime_dir`).
    runtime_dir: rdma_soft::io::RuntimeDirChoice,
}

impl PortTables {
    /// Empty tables with `config`.
    pub fn new(config: PortConfig) -> PortTables {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        PortTables {
            config,
            ports: HashMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
            last_used: 0,
            rng: h.finish() | 1,
            claims: HashMap::new(),
            runtime_dir: Default::default(),
        }
    }

    /// These tables with the runtime directory chosen from `dirs` (the process's, as its
    /// first configuration applied says) when a listener's claim is the first need of it.
    pub fn with_runtime_dir(mut self, dirs: rdma_soft::io::RuntimeDirChoice) -> PortTables {
        self.runtime_dir = dirs;
        self
    }

    /// Empty tables with [`PortConfig::from_host`].
    pub fn from_host() -> PortTables {
        PortTables::new(PortConfig::from_host())
    }

    /// The configuration in use.
    #[cfg(test)]
    pub fn config(&self) -> &PortConfig {
        &self.config
    }

    /// Binds `req` in `space`; returns the handle and the port (the chosen one for port 0).
    ///
    /// Port 0: a random start in the ephemeral range, then a linear probe, skipping the port
    /// handed out last; a free port is taken, or with [`BindRequest::peer`] a used one whose
    /// ids all differ in source, destination or destination port. None ⇒ `EADDRNOTAVAIL`.
    pub fn bind(&mut self, space: PortSpace, req: &BindRequest) -> Result<(BindHandle, u16)> {
        let port = if req.port == 0 {
            self.pick_ephemeral(space, req)?
        } else {
            if req.port < self.config.privileged_below && !self.config.may_bind_privileged {
                return Err(Error::PermissionDenied(format!(
                    "port {} needs CAP_NET_BIND_SERVICE",
                    req.port
                )));
            }
            if let Some(owners) = self.ports.get(&(space, req.port)) {
                check_port(owners, req, req.reuseaddr, None)?;
            }
            req.port
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        self.ports.entry((space, port)).or_default().push(Owner {
            handle,
            addr: req.addr,
            reuseaddr: req.reuseaddr,
            afonly: req.afonly,
            listening: false,
            peer: req.peer,
        });
        self.handles.insert(handle, (space, port));
        Ok((BindHandle(handle), port))
    }

    /// Marks a binding as listening (`rdma_listen`): its port is checked again as if
    /// REUSEADDR were off, so a listener never shares its port with a conflicting id.
    pub fn listen(&mut self, h: BindHandle) -> Result<()> {
        let key = *self
            .handles
            .get(&h.0)
            .ok_or_else(|| Error::InvalidArgument("unknown bind handle".into()))?;
        let owners = self
            .ports
            .get_mut(&key)
            .ok_or_else(|| Error::InvalidArgument("bind handle without port".into()))?;
        let me = owners
            .iter()
            .find(|o| o.handle == h.0)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument("bind handle without owner".into()))?;
        let req = BindRequest {
            addr: me.addr,
            port: key.1,
            reuseaddr: false,
            afonly: me.afonly,
            peer: None,
        };
        check_port(owners, &req, false, Some(h.0))?;
        // Other processes' listeners: the same rules, across the host (EADDRINUSE ...).
        let claim = rdma_soft::io::PortClaim::acquire(
            &self.runtime_dir,
            key.0.value(),
            me.addr,
            key.1,
            me.afonly,
        )?;
        self.claims.insert(h.0, claim);
        if let Some(o) = owners.iter_mut().find(|o| o.handle == h.0) {
            o.listening = true;
        }
        Ok(())
    }

    /// Gives a binding back; false if the handle is unknown.
    pub fn release(&mut self, h: BindHandle) -> bool {
        let Some(key) = self.handles.remove(&h.0) else {
            return false;
        };
        self.claims.remove(&h.0);
        if let Some(owners) = self.ports.get_mut(&key) {
            owners.retain(|o| o.handle != h.0);
            if owners.is_empty() {
                self.ports.remove(&key);
            }
        }
        true
    }

    /// The port space and port of a binding.
    #[cfg(test)]
    pub fn port_of(&self, h: BindHandle) -> Option<(PortSpace, u16)> {
        self.handles.get(&h.0).copied()
    }

    fn random(&mut self) -> u64 {
        // xorshift64: enough to spread ephemeral starts.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn pick_ephemeral(&mut self, space: PortSpace, req: &BindRequest) -> Result<u16> {
        let (low, high) = self.config.ephemeral;
        if low == 0 || low > high {
            return Err(Error::InvalidArgument(format!(
                "ephemeral range {low}..={high}"
            )));
        }
        let count = u32::from(high) - u32::from(low) + 1;
        // The remainder is below `count` ≤ 65535: the casts cannot truncate.
        let mut rover = u32::from(low) + (self.random() % u64::from(count)) as u32;
        for _ in 0..count {
            let port = rover as u16;
            if port != self.last_used {
                let ok = match self.ports.get(&(space, port)) {
                    None => true,
                    Some(owners) => req.peer.is_some() && port_is_unique(owners, req),
                };
                if ok {
                    self.last_used = port;
                    return Ok(port);
                }
            }
            rover = if rover >= u32::from(high) {
                u32::from(low)
            } else {
                rover + 1
            };
        }
        Err(Error::AddressNotAvailable(format!(
            "no free port in {low}..={high}"
        )))
    }
}

/// `cma_check_port`.
fn check_port(owners: &[Owner], req: &BindRequest, reuseaddr: bool, me: Option<u64>) -> Result<()> {
    for cur in owners {
        if Some(cur.handle) == me {
            continue;
        }
        if reuseaddr && cur.reuseaddr && !cur.listening {
            continue;
        }
        if req.afonly && cur.afonly && req.addr.is_ipv4() != cur.addr.is_ipv4() {
            continue;
        }
        if req.addr.is_unspecified() || cur.addr.is_unspecified() {
            return Err(Error::AddressNotAvailable(format!(
                "port {} is bound with a wildcard address",
                req.port
            )));
        }
        if req.addr == cur.addr {
            return Err(Error::AddressInUse);
        }
    }
    Ok(())
}

/// `cma_port_is_unique`: every id on the port differs in destination port, source address
/// or destination address (wildcards and unknown values do not differ).
fn port_is_unique(owners: &[Owner], req: &BindRequest) -> bool {
    let Some(peer) = req.peer else {
        return false;
    };
    owners.iter().all(|cur| {
        let Some(cur_peer) = cur.peer else {
            return false;
        };
        let differ = |a: IpAddr, b: IpAddr| !a.is_unspecified() && !b.is_unspecified() && a != b;
        (peer.port() != 0 && cur_peer.port() != 0 && peer.port() != cur_peer.port())
            || differ(req.addr, cur.addr)
            || differ(peer.ip(), cur_peer.ip())
    })
}
