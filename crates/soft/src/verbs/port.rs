//! Ports of a device: one per netdev, each with its own MTU, state and GID table, as the
//! ports of a multi-port HCA. A device with several ports is a *device group*: one PD, MR
//! and key space spanning several netdevs (docs/HA.md, "Device groups").

use std::net::IpAddr;

use rdma_proto::verbs::Mtu;

use super::device::{active_mtu, Device, DeviceConfig, DeviceShared, MAX_GIDS};
use crate::io::WireAddr;
use crate::queues::async_event::AsyncEvent;
use crate::{Error, Result};

pub use crate::runtime::MAX_PORTS;

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// The netdev is down.
    Down = 1,
    /// The netdev is up.
    Active = 4,
}

/// Port attributes (`ibv_port_attr`, the fields a RoCEv2 port fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// State.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use, from the netdev MTU ([`active_mtu`]).
    pub active_mtu: Mtu,
    /// The netdev's MTU it was derived from.
    pub netdev_mtu: u32,
    /// GID table entries.
    pub gid_tbl_len: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// P_Key table entries.
    pub pkey_tbl_len: u16,
    /// Link layer: always Ethernet for RoCE.
    pub link_layer_ethernet: bool,
}

/// A port beyond port 1 ([`DeviceConfig::more_ports`]); port 1 is `DeviceConfig`'s own
/// `netdev`, `netdev_mtu`, `up` and `gids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// The netdev the port is attached to.
    pub netdev: String,
    /// That netdev's MTU.
    pub netdev_mtu: u32,
    /// Whether the netdev is up.
    pub up: bool,
    /// The port's GID table: the netdev's addresses.
    pub gids: Vec<WireAddr>,
}

impl PortConfig {
    /// A port on `netdev`, its MTU read from the kernel, up, no GIDs yet.
    pub fn for_netdev(netdev: &str) -> Result<PortConfig> {
        Ok(PortConfig {
            netdev: netdev.to_owned(),
            netdev_mtu: crate::io::netdev_mtu(netdev)?,
            up: true,
            gids: Vec::new(),
        })
    }
}

impl DeviceConfig {
    /// A device group: one device `name` with a port per netdev, in order (port 1 on the
    /// first), each MTU read from the kernel, up, no GIDs yet. EINVAL for no netdev, a
    /// netdev named twice or more than [`MAX_PORTS`]; ENODEV for a netdev that does not exist.
    ///
    /// ```
    /// use rdma_soft::verbs::DeviceConfig;
    /// let cfg = DeviceConfig::group("ha0", &["lo", "lo"]);
    /// assert!(cfg.is_err()); // a netdev twice
    /// let cfg = DeviceConfig::group("ha0", &["lo"]).unwrap();
    /// assert_eq!((cfg.name.as_str(), cfg.netdev.as_str(), cfg.port_count()), ("ha0", "lo", 1));
    /// ```
    pub fn group(name: &str, netdevs: &[&str]) -> Result<DeviceConfig> {
        let (first, rest) = netdevs
            .split_first()
            .ok_or(Error::InvalidArgument("a device group needs a netdev"))?;
        if netdevs.len() > MAX_PORTS {
            return Err(Error::InvalidArgument(
                "more netdevs than a device has ports",
            ));
        }
        if netdevs
            .iter()
            .enumerate()
            .any(|(i, n)| netdevs[..i].contains(n))
        {
            return Err(Error::InvalidArgument("a netdev twice in one device group"));
        }
        let mut cfg = DeviceConfig::for_netdev(first)?;
        cfg.name = name.to_owned();
        cfg.more_ports = rest
            .iter()
            .map(|n| PortConfig::for_netdev(n))
            .collect::<Result<_>>()?;
        Ok(cfg)
    }

    /// Ports of the device this configures (1 + `more_ports`).
    pub fn port_count(&self) -> u8 {
        (1 + self.more_ports.len()).min(u8::MAX as usize) as u8
    }

    /// Port `n`'s netdev, MTU, state and GID table (EINVAL for a port the config lacks).
    pub(crate) fn port_parts(&self, n: u8) -> Result<(&str, u32, bool, &Vec<WireAddr>)> {
        match n {
            1 => Ok((&self.netdev, self.netdev_mtu, self.up, &self.gids)),
            _ => self
                .more_ports
                .get((n as usize).wrapping_sub(2))
                .map(|p| (p.netdev.as_str(), p.netdev_mtu, p.up, &p.gids))
                .ok_or(NO_PORT),
        }
    }

    fn port_mut(&mut self, n: u8) -> Result<(&mut bool, &mut Vec<WireAddr>)> {
        match n {
            1 => Ok((&mut self.up, &mut self.gids)),
            _ => self
                .more_ports
                .get_mut((n as usize).wrapping_sub(2))
                .map(|p| (&mut p.up, &mut p.gids))
                .ok_or(NO_PORT),
        }
    }

    /// Checks the ports: count, GID table sizes, MTUs. Returns each port's active MTU.
    pub(crate) fn check_ports(&self) -> Result<Vec<Mtu>> {
        if self.more_ports.len() >= MAX_PORTS {
            return Err(Error::InvalidArgument("more ports than a device may have"));
        }
        (1..=self.port_count())
            .map(|n| {
                let (_, mtu, _, gids) = self.port_parts(n)?;
                if gids.len() > MAX_GIDS {
                    return Err(Error::Exhausted {
                        what: "GID table entries",
                        max: MAX_GIDS,
                    });
                }
                active_mtu(mtu).ok_or(Error::InvalidArgument(
                    "netdev MTU too small for RoCEv2 (needs 256 bytes of payload plus headers)",
                ))
            })
            .collect()
    }

    /// Every GID of every port, sorted, with its port (the runtime's arrival table).
    pub(crate) fn port_map(&self) -> Vec<(WireAddr, u8)> {
        let mut m: Vec<(WireAddr, u8)> = (1..=self.port_count())
            .filter_map(|n| self.port_parts(n).ok().map(|p| (n, p.3)))
            .flat_map(|(n, gids)| gids.iter().map(move |g| (*g, n)))
            .collect();
        m.sort();
        // an address on two ports arrives on the first
        m.dedup_by_key(|e| e.0);
        m
    }
}

const NO_PORT: Error = Error::InvalidArgument("port number beyond the device's ports");

impl DeviceShared {
    /// The GID at `index` of port `port`'s table (EINVAL beyond the ports or the table).
    pub(crate) fn gid_on(&self, port: u8, index: u8) -> Result<WireAddr> {
        let cfg = self.cfg();
        let (_, _, _, gids) = cfg.port_parts(port)?;
        gids.get(index as usize)
            .copied()
            .ok_or(Error::InvalidArgument("sgid_index beyond the GID table"))
    }

    /// Port `port`'s GID table (EINVAL beyond the ports).
    pub(crate) fn gids_of(&self, port: u8) -> Result<Vec<WireAddr>> {
        Ok(self.cfg().port_parts(port)?.3.clone())
    }

    /// Port `port`'s active MTU (EINVAL beyond the ports).
    pub(crate) fn active_mtu_on(&self, port: u8) -> Result<Mtu> {
        self.port_attr(port).map(|p| p.active_mtu)
    }

    /// The smallest active MTU of the ports.
    pub(crate) fn min_active_mtu(&self) -> Mtu {
        let mut m = self.port().active_mtu;
        for n in 2..=self.attr().phys_port_cnt {
            if let Ok(p) = self.port_attr(n) {
                if p.active_mtu.bytes() < m.bytes() {
                    m = p.active_mtu;
                }
            }
        }
        m
    }

    /// Rebuilds the runtime's arrival table from the GID tables: call with no lock held.
    pub(crate) fn update_port_map(&self) {
        let mut rt = self.runtime();
        let map = self.cfg().port_map();
        rt.set_port_map(map);
    }
}

impl Device {
    /// Ports of the device (`phys_port_cnt`).
    pub fn port_count(&self) -> u8 {
        self.shared().attr().phys_port_cnt
    }

    /// `ibv_query_port`: port `port` (1 to [`Device::port_count`]; EINVAL otherwise), its
    /// state and GID table length as they are now.
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig, PortState};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// assert_eq!(dev.query_port(1).unwrap().state, PortState::Active);
    /// dev.set_port_state(1, false).unwrap();
    /// assert_eq!(dev.query_port(1).unwrap().state, PortState::Down);
    /// assert_eq!(dev.query_port(0).unwrap_err().errno(), libc::EINVAL);
    /// ```
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut p = self.shared().port_attr(port)?.clone();
        let cfg = self.shared().cfg();
        let (_, _, up, gids) = cfg.port_parts(port)?;
        p.gid_tbl_len = gids.len() as u32;
        p.state = if up {
            PortState::Active
        } else {
            PortState::Down
        };
        Ok(p)
    }

    /// The netdev of port `port` (EINVAL beyond the ports).
    pub fn port_netdev(&self, port: u8) -> Result<String> {
        Ok(self.shared().cfg().port_parts(port)?.0.to_owned())
    }

    /// Marks port `port` up or down (its netdev's link changed), as `query_port` then
    /// reports it, and queues [`AsyncEvent::PortActive`] / [`AsyncEvent::PortError`] when
    /// the state changed. Nothing is torn down. A port going down is the spec's "local port
    /// down" trigger of path migration: every RC QP in RTS whose path in force is on that
    /// port and whose migration state is Armed migrates to its alternate path at once (and
    /// queues [`AsyncEvent::PathMigrated`]); other QPs are untouched (an Armed QP whose
    /// path fails without this call migrates when its retries run out).
    pub fn set_port_state(&self, port: u8, up: bool) -> Result<()> {
        let changed = {
            let mut cfg = self.shared().cfg_mut();
            let state = cfg.port_mut(port)?.0;
            std::mem::replace(state, up) != up
        };
        tracing::debug!(device = %self.name(), port, up, "port state");
        let dev = self.shared();
        let mut rt = dev.runtime();
        if changed {
            let e = if up {
                AsyncEvent::PortActive { port }
            } else {
                AsyncEvent::PortError { port }
            };
            rt.async_events().push(e);
        }
        if !up {
            let mut mem = dev.mrs.view();
            let n = rt.port_down(port, &mut mem);
            drop(mem);
            if n > 0 {
                tracing::info!(device = %self.name(), port, qps = n, "port down: QPs migrated");
                if let Some(d) = rt.next_deadline() {
                    dev.wake_by(d);
                }
            }
        }
        Ok(())
    }

    /// Port `port`'s GID table as it is now (EINVAL beyond the ports).
    pub fn gids_on(&self, port: u8) -> Result<Vec<WireAddr>> {
        self.shared().gids_of(port)
    }

    /// The index of `ip` in port `port`'s GID table, if it holds it.
    pub fn gid_index_on(&self, port: u8, ip: IpAddr) -> Option<u8> {
        let cfg = self.shared().cfg();
        let gids = cfg.port_parts(port).ok()?.3;
        gids.iter()
            .position(|g| g.ip() == ip)
            .and_then(|i| u8::try_from(i).ok())
    }

    /// The port whose GID table holds `ip`, and its index there (the lowest port when two
    /// hold it).
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let a = "127.0.7.9".parse().unwrap();
    /// dev.add_gid_on(1, a).unwrap();
    /// assert_eq!(dev.port_of(a.ip()), Some((1, 0)));
    /// assert_eq!(dev.port_of("127.0.7.8".parse().unwrap()), None);
    /// ```
    pub fn port_of(&self, ip: IpAddr) -> Option<(u8, u8)> {
        (1..=self.port_count()).find_map(|n| self.gid_index_on(n, ip).map(|i| (n, i)))
    }

    /// Adds `gid` to port `port`'s GID table and returns its index; a GID already there
    /// keeps its index. EINVAL beyond the ports, ENOMEM when the table is full
    /// ([`MAX_GIDS`]). See [`Device::add_gid`].
    pub fn add_gid_on(&self, port: u8, gid: WireAddr) -> Result<u8> {
        let i = {
            let mut cfg = self.shared().cfg_mut();
            let (_, gids) = cfg.port_mut(port)?;
            match gids.iter().position(|g| *g == gid) {
                Some(i) => i,
                None => {
                    if gids.len() >= MAX_GIDS {
                        return Err(Error::Exhausted {
                            what: "GID table entries",
                            max: MAX_GIDS,
                        });
                    }
                    gids.push(gid);
                    tracing::debug!(device = %self.name(), port, %gid, index = gids.len() - 1, "GID added");
                    gids.len() - 1
                }
            }
        };
        self.shared().update_port_map();
        u8::try_from(i).map_err(|_| Error::InvalidArgument("GID index beyond 255"))
    }

    /// Removes the GID of `ip` from port `port`'s table; false if absent or no such port.
    /// See [`Device::remove_gid`].
    pub fn remove_gid_on(&self, port: u8, ip: IpAddr) -> bool {
        let removed = {
            let mut cfg = self.shared().cfg_mut();
            let Ok((_, gids)) = cfg.port_mut(port) else {
                return false;
            };
            let before = gids.len();
            gids.retain(|g| g.ip() != ip);
            gids.len() != before
        };
        if removed {
            tracing::debug!(device = %self.name(), port, %ip, "GID removed");
            self.shared().update_port_map();
        }
        removed
    }

    /// Datagrams received per port since the device opened: index `n` counts those that
    /// arrived on an address of port `n`'s GID table, index 0 those on no port's address.
    pub fn rx_by_port(&self) -> [u64; MAX_PORTS + 1] {
        self.shared().runtime().stats().rx_by_port
    }
}
