//! Port spaces: which (address, port) each id holds, per port space, with rdma_cm's conflict
//! rules (`cma_get_port`, `cma_check_port`, `cma_alloc_any_port`, `cma_port_is_unique`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};

use crate::error::{Error, Result};

/// An rdma_cm port space (`enum rdma_ucm_port_space`); each has its own bind table. The
/// one type of the workspace, defined next to the service ids that encode it.
pub use rdma_wire::ip_cm::PortSpace;

/// Where ports come from and who may take low ones.
///
/// ```
/// let c = rdmacm::PortConfig { ephemeral: (32768, 60999), privileged_below: 1024, may_bind_privileged: false };
/// assert_eq!(c.ephemeral.1, 60999);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortConfig {
    /// Inclusive range ephemeral ports are taken from (`net.ipv4.ip_local_port_range`).
    pub ephemeral: (u16, u16),
    /// Explicit ports below this need `CAP_NET_BIND_SERVICE` (`PROT_SOCK`, 1024).
    pub privileged_below: u16,
    /// Whether the process has `CAP_NET_BIND_SERVICE`.
    pub may_bind_privileged: bool,
}

impl Default for PortConfig {
    /// Linux's defaults: 32768..=60999, below 1024 privileged, no capability.
    fn default() -> Self {
        PortConfig {
            ephemeral: (32768, 60999),
            privileged_below: 1024,
            may_bind_privileged: false,
        }
    }
}

impl PortConfig {
    /// Reads the calling thread's namespace and process: `ip_local_port_range` from
    /// `/proc/sys` (default range if unreadable) and `CAP_NET_BIND_SERVICE` from the
    /// effective capabilities in `/proc/self/status`.
    pub fn from_host() -> PortConfig {
        let d = PortConfig::default();
        PortConfig {
            ephemeral: read_local_port_range().unwrap_or(d.ephemeral),
            privileged_below: d.privileged_below,
            may_bind_privileged: has_net_bind_service(),
        }
    }
}

/// `net.ipv4.ip_local_port_range` of the calling thread's namespace.
pub fn read_local_port_range() -> Result<(u16, u16)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    parse_port_range(&s)
}

fn parse_port_range(s: &str) -> Result<(u16, u16)> {
    let bad = || Error::InvalidArgument(format!("bad ip_local_port_range {s:?}"));
    let mut it = s.split_whitespace().map(|x| x.parse::<u16>());
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi && lo > 0 => Ok((lo, hi)),
        _ => Err(bad()),
    }
}

/// Whether the process holds `CAP_NET_BIND_SERVICE` (bit 10 of `CapEff`).
fn has_net_bind_service() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 10) != 0)
}

/// What an id asks to bind.
///
/// ```
/// use rdmacm::BindRequest;
/// let r = BindRequest::new("0.0.0.0".parse().unwrap(), 0).reuseaddr(true);
/// assert!(r.afonly); // IPv4 ids are AF-only
/// assert!(!BindRequest::new("::".parse().unwrap(), 0).afonly);
/// ```
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
/// Explicit ports below 1024 need `CAP_NET_BIND_SERVICE` (`EACCES`).
///
/// ```
/// use rdmacm::{BindRequest, PortConfig, PortSpace, PortTables};
/// let mut t = PortTables::new(PortConfig::default());
/// let (h, port) = t.bind(PortSpace::Tcp, &BindRequest::new("192.0.2.1".parse().unwrap(), 7471)).unwrap();
/// assert_eq!(port, 7471);
/// let again = t.bind(PortSpace::Tcp, &BindRequest::new("192.0.2.1".parse().unwrap(), 7471));
/// assert_eq!(again.unwrap_err().errno(), libc::EADDRINUSE);
/// // Another port space is another table.
/// assert!(t.bind(PortSpace::Udp, &BindRequest::new("192.0.2.1".parse().unwrap(), 7471)).is_ok());
/// t.release(h);
/// ```
#[derive(Debug)]
pub struct PortTables {
    config: PortConfig,
    ports: HashMap<(PortSpace, u16), Vec<Owner>>,
    handles: HashMap<u64, (PortSpace, u16)>,
    next_handle: u64,
    last_used: u16,
    rng: u64,
    /// Listeners' claims across processes (`rdma_soft::io::PortClaim`), by handle.
    claims: HashMap<u64, rdma_soft::io::PortClaim>,
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
        }
    }

    /// Empty tables with [`PortConfig::from_host`].
    pub fn from_host() -> PortTables {
        PortTables::new(PortConfig::from_host())
    }

    /// The configuration in use.
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
        let claim = rdma_soft::io::PortClaim::acquire(key.0.value(), me.addr, key.1, me.afonly)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> PortTables {
        PortTables::new(PortConfig {
            ephemeral: (40000, 40009),
            privileged_below: 1024,
            may_bind_privileged: false,
        })
    }

    fn req(addr: &str, port: u16) -> BindRequest {
        BindRequest::new(addr.parse().unwrap(), port)
    }

    fn errno(r: Result<(BindHandle, u16)>) -> i32 {
        r.map(|_| 0).unwrap_or_else(|e| e.errno())
    }

    #[test]
    fn ephemeral_ports_come_from_the_range_and_run_out() {
        let mut t = tables();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..10 {
            let (_, p) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
            assert!((40000..=40009).contains(&p));
            assert!(seen.insert(p), "port {p} handed out twice");
        }
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0))),
            libc::EADDRNOTAVAIL
        );
        // Other spaces have their own tables.
        assert!(t.bind(PortSpace::Udp, &req("192.0.2.1", 0)).is_ok());
        assert!(t.bind(PortSpace::Ib, &req("192.0.2.1", 0)).is_ok());
        assert!(t.bind(PortSpace::IpoIb, &req("192.0.2.1", 0)).is_ok());
    }

    #[test]
    fn ephemeral_skips_last_used_port_after_release() {
        let mut t = tables();
        let (mut h, mut last) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
        for _ in 0..50 {
            // Released, the port is free again, but the next pick never is the last one.
            t.release(h);
            let (h2, q) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 0)).unwrap();
            assert_ne!(q, last);
            (h, last) = (h2, q);
        }
    }

    #[test]
    fn ephemeral_range_is_read_from_proc() {
        let (lo, hi) = read_local_port_range().unwrap();
        assert!(lo <= hi);
        assert_eq!(parse_port_range("32768\t60999\n").unwrap(), (32768, 60999));
        assert!(parse_port_range("5 3").is_err());
        assert!(parse_port_range("").is_err());
        let t = PortTables::from_host();
        assert_eq!(t.config().ephemeral, (lo, hi));
    }

    #[test]
    fn explicit_port_identical_specific_is_eaddrinuse() {
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
            libc::EADDRINUSE
        );
    }

    #[test]
    fn explicit_port_different_specific_coexist() {
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
        t.bind(PortSpace::Tcp, &req("192.0.2.2", 7000)).unwrap();
        t.bind(PortSpace::Tcp, &req("127.0.0.1", 7000)).unwrap();
        t.bind(PortSpace::Tcp, &req("127.0.0.2", 7000)).unwrap();
    }

    #[test]
    fn explicit_port_any_address_conflict_is_eaddrnotavail() {
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000))),
            libc::EADDRNOTAVAIL
        );
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000)).unwrap();
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
            libc::EADDRNOTAVAIL
        );
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000))),
            libc::EADDRNOTAVAIL
        );
    }

    #[test]
    fn reuseaddr_on_both_skips_the_conflict() {
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000).reuseaddr(true))
            .unwrap();
        // Only one side reusing: conflict.
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000))),
            libc::EADDRINUSE
        );
        let (h, _) = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 7000).reuseaddr(true))
            .unwrap();
        // A listener does not share: listening re-checks without REUSEADDR.
        assert_eq!(t.listen(h).unwrap_err().errno(), libc::EADDRINUSE);
    }

    #[test]
    fn listening_id_is_not_shared_by_later_reuseaddr_binds() {
        let mut t = tables();
        let (h, _) = t
            .bind(PortSpace::Tcp, &req("0.0.0.0", 7000).reuseaddr(true))
            .unwrap();
        t.listen(h).unwrap();
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000).reuseaddr(true))),
            libc::EADDRNOTAVAIL
        );
    }

    #[test]
    fn afonly_different_families_coexist() {
        let mut t = tables();
        t.bind(PortSpace::Tcp, &req("0.0.0.0", 7000)).unwrap();
        // IPv6 wildcard not AF-only: conflicts with the IPv4 wildcard.
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("::", 7000))),
            libc::EADDRNOTAVAIL
        );
        // AF-only IPv6 wildcard: coexists.
        t.bind(PortSpace::Tcp, &req("::", 7000).afonly(true))
            .unwrap();
    }

    #[test]
    fn ports_below_1024_need_root() {
        let mut t = tables();
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 80))),
            libc::EACCES
        );
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("0.0.0.0", 1023))),
            libc::EACCES
        );
        t.bind(PortSpace::Tcp, &req("0.0.0.0", 1024)).unwrap();
        let mut t = PortTables::new(PortConfig {
            may_bind_privileged: true,
            ..PortConfig::default()
        });
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 80)).unwrap();
    }

    #[test]
    fn release_frees_the_port() {
        let mut t = tables();
        let (h, _) = t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
        assert_eq!(t.port_of(h), Some((PortSpace::Tcp, 7000)));
        assert!(t.release(h));
        assert!(!t.release(h));
        t.bind(PortSpace::Tcp, &req("192.0.2.1", 7000)).unwrap();
    }

    #[test]
    fn connect_time_ephemeral_port_shared_when_tuple_unique() {
        let mut t = PortTables::new(PortConfig {
            ephemeral: (40000, 40000),
            ..PortConfig::default()
        });
        let peer1: SocketAddr = "192.0.2.2:7471".parse().unwrap();
        let peer2: SocketAddr = "192.0.2.3:7471".parse().unwrap();
        let (_, p) = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
            .unwrap();
        assert_eq!(p, 40000);
        // The single-port range: the port is also the last used one, so nothing is left.
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))),
            libc::EADDRNOTAVAIL
        );
        let mut t = PortTables::new(PortConfig {
            ephemeral: (40000, 40001),
            ..PortConfig::default()
        });
        let a = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
            .unwrap();
        let b = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer1))
            .unwrap();
        assert_ne!(a.1, b.1);
        // Both ports used; a third connect to another peer shares one (not the last used).
        let c = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))
            .unwrap();
        assert_eq!(c.1, a.1);
        // Same tuple again: not unique on a's port, unique on b's (other peer).
        let d = t
            .bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))
            .unwrap();
        assert_eq!(d.1, b.1);
        // And once more: unique nowhere.
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0).connecting_to(peer2))),
            libc::EADDRNOTAVAIL
        );
        // Without a peer a used port is never shared.
        assert_eq!(
            errno(t.bind(PortSpace::Tcp, &req("192.0.2.1", 0))),
            libc::EADDRNOTAVAIL
        );
    }
}
