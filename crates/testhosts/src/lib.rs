//! Network-namespace test hosts joined by veth pairs.
//!
//! A [`Topology`] is a set of named hosts, each a fresh Linux network namespace with `lo` up,
//! joined by veth pairs that carry addresses from the documentation ranges only
//! (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) and fe80::/64 link-local
//! addresses. Everything is removed when the topology is dropped, also while unwinding
//! from a panic. Namespace names are unique per process and per topology
//! (`rth<pid>x<counter><host>`), so tests running in parallel threads never collide, and
//! [`sweep_stale`] removes namespaces left behind by processes that no longer exist.
//!
//! Code runs inside a host either as a closure ([`Host::run`]: a new thread that `setns()`s
//! into the namespace; create any tokio runtime inside the closure) or as a process
//! ([`Host::command`]: `ip netns exec`).
//!
//! Building namespaces needs root: tests call [`require_root`] first and return early, printing
//! `SKIPPED`, when not root; with `RDMA_REQUIRE_ROOT=1` (CI) a skip fails instead
//! ([`skip`]).
//!
//! ```no_run
//! use rdma_testhosts::{require_root, topologies};
//!
//! if !require_root("example") {
//!     return;
//! }
//! let topo = topologies::two_hosts_one_link().unwrap();
//! let a = topo.host("a");
//! let out = a.command("ip").args(["-j", "addr", "show", "eth0"]).output().unwrap();
//! assert!(String::from_utf8_lossy(&out.stdout).contains("192.0.2.1"));
//! let links = a.run(|| std::fs::read_to_string("/proc/net/dev").unwrap());
//! assert!(links.contains("eth0"));
//! ```

#![warn(missing_docs)]

pub mod capture;
mod host;
mod nl;
mod ns;
pub mod topologies;
mod topology;

pub use host::Host;
pub use ns::{is_root, require_root, skip, skips_fail, sweep_stale, NAME_PREFIX, REQUIRE_ROOT_ENV};
pub use topology::{Error, Topology, TopologyBuilder};
