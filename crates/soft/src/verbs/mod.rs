//! Verbs objects with Rust ownership: the [`Device`] and its attributes, protection domains,
//! memory regions (keys, bounds, access, and a buffer the region owns while registered),
//! completion queues with a completion channel, shared receive queues.
//!
//! The vocabulary (access flags, work requests, completions, MTUs) is `rdma-proto`'s,
//! re-exported here.

mod cq;
mod device;
mod mr;
mod pd;
mod ring;
mod shared_mem;
mod srq;

pub use cq::{CompletionChannel, CompletionQueue};
pub use device::{
    active_mtu, Device, DeviceAttr, DeviceConfig, PortAttr, PortState, ROCE_MAX_HEADERS,
};
pub use mr::{DeregisterError, MemoryRegion, MrTableView};
pub use pd::ProtectionDomain;
pub use rdma_proto::verbs::{AccessFlags, Completion, Mtu, PdId, RecvWr, Sge, WcOpcode, WcStatus};
pub use srq::{SharedReceiveQueue, SrqAttr};
