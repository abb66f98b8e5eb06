//! The rdma_cm model, as librdmacm users know it: the context ([`Cma`], configured by
//! [`CmaConfig`]), event channels and events, ids and their states, connection parameters,
//! port spaces, HA policies and the CM's counters.
//!
//! ```no_run
//! use rdmacm::cm::{CmId, EventChannel, EventType, PortSpace};
//! let ch = EventChannel::new()?;
//! let id = CmId::new(&ch, PortSpace::Tcp)?;
//! id.resolve_addr(None, "127.0.0.1:7471".parse().unwrap(), std::time::Duration::from_secs(2))?;
//! assert_eq!(ch.get_event()?.kind(), EventType::AddrResolved);
//! # Ok::<(), rdmacm::Error>(())
//! ```

pub(crate) mod channel;
pub(crate) mod cma;
pub(crate) mod event;
pub(crate) mod id;
pub(crate) mod mcast;

pub use crate::cm::channel::{EventChannel, EventStream};
pub use crate::cm::cma::Cma;
#[doc(hidden)]
pub use crate::cm::cma::PauseGuard;
pub use crate::cm::event::Event;
pub use crate::cm::id::{CmId, CmOption};
pub use crate::cm::mcast::McJoinFlags;
pub use crate::config::{
    CmaConfig, CmaConfigBuilder, DeviceSpec, DEVICES_ENV, DRIVER_ENV, HA_RETURN_ENV,
    NO_LISTENER_RETRY_DEFAULT, NO_LISTENER_RETRY_ENV,
};
pub use crate::context::counters::CmStatistics;
#[doc(hidden)]
pub use crate::context::held_request::LookupHold;
pub use crate::context::id_entry::{IdState, QpKind};
pub use crate::engine::connect::RDMA_UDP_QKEY;
pub use crate::error::{reject_reason_text, RejectCause};
pub use crate::ha_policy::{HaPolicy, ALIGN_ADDR_GONE, ALIGN_PATH_MOVED, HA_ENV};
pub use crate::params::{
    ConnEventParam, ConnParam, EventType, McastJoined, UdParam, MULTICAST_QPN,
};
pub use crate::ports::PortSpace;
