//! Verbs objects with Rust ownership: the [`Device`] and its attributes, protection domains,
//! memory regions (keys, bounds, access, and a buffer the region owns while registered),
//! completion queues with a completion channel, shared receive queues, and queue pairs
//! ([`QueuePair`]) whose transport the device's runtime drives.
//!
//! The vocabulary (access flags, work requests, completions, MTUs) is `rdma-proto`'s,
//! re-exported here.

#[allow(unsafe_code)] // the CPU's copy instructions (asm!) on registered memory
mod bulk_copy;
mod device;
mod host_local;
mod in_place;
mod mcast;
mod mr;
mod pd;
mod port;
mod qp;
mod rc_modify;
#[allow(unsafe_code)] // registered memory shared with peers: atomic byte copies, mmap
pub(crate) mod shared_mem;
mod srq;
mod ud;
mod watch;

pub use crate::queues::SrqAttr;
pub use crate::queues::{
    AsyncEvent, AsyncTap, CompletionChannel, CompletionQueue, ASYNC_QUEUE_LEN,
};
pub(crate) use device::DeviceShared;
pub use device::{active_mtu, Device, DeviceAttr, DeviceConfig, MAX_GIDS, ROCE_MAX_HEADERS};
pub use mcast::mcast_group;
pub use mr::{DeregisterError, MemoryRegion, MrTableView};
pub use pd::ProtectionDomain;
pub use port::{PortAttr, PortConfig, PortState, MAX_PORTS};
pub use qp::{QpCap, QpInitAttr, QueuePair};
pub use rdma_proto::rc::MigrationCause;
pub use rdma_proto::verbs::{
    AccessFlags, Completion, MigState, Mtu, PathAttr, PdId, QpAttr, QpAttrMask, QpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
};
pub use srq::SharedReceiveQueue;
pub use ud::AddressHandle;
pub use watch::{WatchStats, WireWatch, GRACE};
