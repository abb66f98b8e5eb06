//! The device registry: one software device per netdev, opened on first use, with its CM
//! agent, GSI addresses and connection bookkeeping.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use rdma_proto::cm::{CmAgent, ConnHandle};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::Device;

use crate::addr::{classify, AddrClass};
use crate::error::Result;
use crate::resolve::Netdev;
use crate::slot::IdNum;

/// A software device with its CM agent and GSI bookkeeping.
pub(crate) struct DevEntry {
    pub netdev: Netdev,
    pub dev: Device,
    pub agent: CmAgent,
    /// Local addresses opened for MADs.
    pub open: HashSet<WireAddr>,
    /// Connection → id.
    pub conns: HashMap<ConnHandle, IdNum>,
    /// Service id → listeners registered on this device.
    pub listeners: HashMap<u64, Vec<IdNum>>,
}

impl DevEntry {
    /// The GID-table index of `ip` (the QP's `sgid_index`).
    pub(crate) fn sgid_index(&self, ip: IpAddr) -> Option<u8> {
        self.dev.gid_index(ip)
    }

    /// `ip` as a wire address of this device (link-local: scoped to its netdev).
    pub(crate) fn wire_addr(&self, ip: IpAddr) -> WireAddr {
        gid_of(ip, self.netdev.index)
    }

    /// Puts `ip` in the device's GID table (an address of its netdev, or any 127.0.0.0/8
    /// address on the device of `lo`).
    pub(crate) fn ensure_gid(&self, ip: IpAddr) -> Result<()> {
        if self.dev.gid_index(ip).is_none() {
            self.dev.add_gid(self.wire_addr(ip))?;
        }
        Ok(())
    }
}

/// The GID (wire address) of `ip` on netdev `index`.
pub(crate) fn gid_of(ip: IpAddr, index: u32) -> WireAddr {
    let scope = if classify(&ip) == AddrClass::LinkLocal {
        index
    } else {
        0
    };
    WireAddr::new(ip, scope)
}
