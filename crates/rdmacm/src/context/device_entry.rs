//! The device registry: one software device per netdev, opened on first use, with its CM
//! agent, GSI addresses and connection bookkeeping.

use std::collections::HashSet;
use std::net::IpAddr;

use rdma_proto::cm::{CmAgent, ConnHandle};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::Device;
use rustc_hash::FxHashMap as HashMap;

use crate::context::id_entry::IdNum;
use crate::error::Result;
use crate::host::addr::{classify, AddrClass};
use crate::host::resolve::Netdev;

/// A software device with its CM agent and GSI bookkeeping.
pub(crate) struct DevEntry {
    /// The netdev of port 1 (a device group's first member).
    pub netdev: Netdev,
    /// The ifindex of each port's netdev, port 1 first (one entry but for a device group).
    pub links: Vec<u32>,
    pub dev: Device,
    /// A copy of the device's asynchronous events (path migrations), for the CM.
    pub tap: Option<rdma_soft::verbs::AsyncTap>,
    pub agent: CmAgent,
    /// Local addresses opened for MADs.
    pub open: HashSet<WireAddr>,
    /// Connection → id.
    pub conns: HashMap<ConnHandle, IdNum>,
    /// Service id → listeners registered on this device.
    pub listeners: HashMap<u64, Vec<IdNum>>,
}

impl DevEntry {
    /// The port and GID-table index of `ip` (the QP's `port_num` and `sgid_index`).
    pub(crate) fn sgid(&self, ip: IpAddr) -> Option<(u8, u8)> {
        self.dev.port_of(ip)
    }

    /// The port whose netdev is `link`.
    pub(crate) fn port_of_link(&self, link: u32) -> Option<u8> {
        let i = self.links.iter().position(|&l| l == link)?;
        u8::try_from(i + 1).ok()
    }

    /// `ip` as a wire address of this device: its GID table entry (link-local: scoped to
    /// the netdev of its port), else scoped to port 1's netdev.
    pub(crate) fn wire_addr(&self, ip: IpAddr) -> WireAddr {
        if let Some((port, _)) = self.dev.port_of(ip) {
            if let Some(link) = self.links.get(usize::from(port) - 1) {
                return gid_of(ip, *link);
            }
        }
        gid_of(ip, self.netdev.index)
    }

    /// Puts `ip` in the device's GID tables if it is in none (port 1: an address of its
    /// netdev, or any 127.0.0.0/8 address on the device of `lo`).
    pub(crate) fn ensure_gid(&self, ip: IpAddr) -> Result<()> {
        if self.dev.port_of(ip).is_none() {
            self.dev.add_gid(self.wire_addr(ip))?;
        }
        Ok(())
    }

    /// Puts `ip`, an address of netdev `link`, in the GID table of that netdev's port.
    pub(crate) fn ensure_gid_on(&self, link: u32, ip: IpAddr) -> Result<()> {
        let port = self.port_of_link(link).unwrap_or(1);
        if self.dev.gid_index_on(port, ip).is_none() {
            self.dev.add_gid_on(port, gid_of(ip, link))?;
        }
        Ok(())
    }

    /// Removes `ip` from the GID table of netdev `link`'s port.
    pub(crate) fn remove_gid_on(&self, link: u32, ip: IpAddr) {
        let port = self.port_of_link(link).unwrap_or(1);
        self.dev.remove_gid_on(port, ip);
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
