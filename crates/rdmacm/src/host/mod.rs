//! The layer under the CM: how an address picks a netdev and a path from the host's real
//! network state (the [`Resolver`] and its blocking twin, the change
//! [`Watcher`]), and the
//! values it answers with. The CM uses it; tools and tests that look at resolution itself
//! may too.
//!
//! ```no_run
//! use rdmacm::host::BlockingResolver;
//! let r = BlockingResolver::new()?;
//! let bound = r.bind(&"127.0.0.1".parse().unwrap())?;
//! assert_eq!(bound.netdev.unwrap().name, "lo");
//! # Ok::<(), rdmacm::Error>(())
//! ```

pub(crate) mod addr;
pub(crate) mod blocking;
pub(crate) mod resolve;
pub(crate) mod route;
pub(crate) mod watch;

pub use crate::host::addr::{any_of, classify, loopback_of, AddrClass, Gid, ScopeId, ScopedIp};
pub use crate::host::blocking::BlockingResolver;
pub use crate::host::resolve::{Binding, GidEntry, Netdev, ResolvedAddr, Resolver, RouteQuery};
pub use crate::host::route::{
    flow_label, IbMtu, RocePath, RouteParams, DEFAULT_PACKET_LIFETIME, ROCE_HEADROOM,
    ROCE_UDP_SPORT_MIN,
};
pub use crate::host::watch::{ChangeReason, Notification, WatchId, WatchKey, Watcher};
pub use rdma_hostview::MacAddr;
