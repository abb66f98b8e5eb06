//! Opening devices (one per netdev, on first use, with its CM agent) and their GSI
//! addresses.

use crate::config::DEVICES_ENV;
use crate::context::device_entry::{gid_of, DevEntry};
use crate::context::run_on::block_here;
use crate::context::state::State;
use crate::context::Inner;
use crate::error::{Error, Result};
use rdma_proto::cm::{AgentConfig, CmAgent, OverloadPolicy};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{Device, DeviceConfig};
use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

impl Inner {
    /// Opens (once) the software device of netdev `index`, with its CM agent, and returns
    /// its key ([`State::key_of`]): a device group is opened whole, for any of its members,
    /// with a port per member netdev. Its GID tables start with the netdevs' addresses and
    /// then follow the host's changes (`apply_host_events`); `ENODEV` when the
    /// configuration gives the netdev no device or a group member does not exist.
    pub(crate) fn ensure_device(&self, index: u32) -> Result<u32> {
        block_here(self.ensure_device_async(index))
    }

    /// [`Inner::ensure_device`] for async callers: the netlink questions are awaited.
    pub(crate) async fn ensure_device_async(&self, index: u32) -> Result<u32> {
        {
            let st = self.lock();
            let key = st.key_of(index);
            if st.devices.contains_key(&key) {
                return Ok(key);
            }
        }
        let netdev = self
            .resolve(move |r| async move { r.netdev(index).await })
            .await?;
        let (name, members) = self.config.device_of(&netdev.name).ok_or_else(|| {
            Error::NoDevice(format!(
                "netdev {} has no device ({DEVICES_ENV} does not list it)",
                netdev.name
            ))
        })?;
        // Every member, port 1 first, with its GID table.
        let ports = self
            .resolve(move |r| async move {
                let mut out = Vec::new();
                for m in members {
                    let nd = r
                        .scope_netdev(&crate::host::addr::ScopeId::Name(m.clone()))
                        .await
                        .map_err(|e| Error::NoDevice(format!("device group member {m}: {e}")))?;
                    let gids = r.gid_table(nd.index).await?;
                    out.push((nd, gids));
                }
                Ok::<_, Error>(out)
            })
            .await?;
        let Some((netdev, _)) = ports.first().cloned() else {
            return Err(Error::NoDevice(format!("device {name} has no netdev")));
        };
        let table = |link: u32, g: &[crate::host::resolve::GidEntry]| -> Vec<WireAddr> {
            let mut v: Vec<WireAddr> = g.iter().map(|g| gid_of(g.ip, link)).collect();
            v.truncate(256); // rdma_soft::verbs::device::MAX_GIDS
            v
        };
        let names: Vec<&str> = ports.iter().map(|(nd, _)| nd.name.as_str()).collect();
        let mut cfg = if ports.len() == 1 {
            DeviceConfig::for_netdev(&netdev.name)?
        } else {
            DeviceConfig::group(&name, &names)?
        };
        cfg.name = name;
        cfg.gids = table(netdev.index, &ports[0].1);
        cfg.up = netdev.up;
        for (p, (nd, g)) in cfg.more_ports.iter_mut().zip(ports.iter().skip(1)) {
            p.gids = table(nd.index, g);
            p.up = nd.up;
        }
        let links: Vec<u32> = ports.iter().map(|(nd, _)| nd.index).collect();
        let index = netdev.index;
        let mac = netdev.mac.0;
        // The EUI-64 of the MAC, except that its 0xfffe middle is replaced by 16 bits of
        // this context's seed: every context (process) is a CA of its own, and several of
        // them share lo's MAC and GIDs. Their QPNs start over at the same values in every
        // process, so a client run right after another one reuses the QPNs a server still
        // holds in timewait; the CM's remote-QPN (stale connection) check is keyed by peer
        // GID, CA GUID and QPN, so a distinct CA GUID keeps the new process's REQs from
        // being rejected as stale (REJ 10). See docs/CM.md.
        let ca_tag = u64::from((self.lock().seed >> 48) as u16 ^ 0xfffe) << 24;
        let guid = ca_tag
            ^ u64::from_be_bytes([
                mac[0] ^ 2,
                mac[1],
                mac[2],
                0xff,
                0xfe,
                mac[3],
                mac[4],
                mac[5],
            ])
            ^ u64::from(index);
        cfg.node_guid = guid;
        let dev = Device::open_with_config(cfg, &self.config.soft)?;
        // Room for a burst of requests from one peer (a client opening hundreds of
        // connections at once); the per-peer share still bounds a flooding peer.
        dev.gsi_set_limits(rdma_soft::gsi::GsiLimits {
            queue_len: 8192,
            per_peer: 2048,
        })?;
        // The CM follows the device's path migrations (a group's connections move ports).
        let tap = if links.len() > 1 {
            Some(dev.async_tap()?)
        } else {
            None
        };
        let host = dev.host_local();
        // Comm ids, TIDs and PSNs go on the wire: each agent draws them from its own seed.
        let agent_seed = os_seed()?;
        let mut st = self.lock();
        if st.devices.contains_key(&index) {
            return Ok(index);
        }
        // The CA GUID announces the device's host-local wire, when it has one (`local_wire`).
        let agent = CmAgent::new(AgentConfig {
            ca_guid: host.map_or(guid, |h| h.guid()),
            seed: agent_seed,
            overload: OverloadPolicy::Drop,
            no_listener_retry: self.config.no_listener_retry.as_nanos() as u64,
            ..AgentConfig::default()
        });
        st.devices.insert(
            index,
            DevEntry {
                netdev,
                links: links.clone(),
                dev,
                tap,
                agent,
                open: HashSet::new(),
                conns: Default::default(),
                listeners: Default::default(),
            },
        );
        for &l in &links[1..] {
            st.members.insert(l, index);
        }
        let gsi_fd = st.devices.get(&index).map(|d| d.dev.gsi_wait_fds().event);
        let tap_fd = st
            .devices
            .get(&index)
            .and_then(|d| d.tap.as_ref().map(|t| t.fd().as_raw_fd()));
        drop(st);
        if let Some((_, reg)) = self.engine.get() {
            // MADs queued on this device's GSI, or a migration, make the engine run the CM
            for fd in gsi_fd.into_iter().chain(tap_fd) {
                reg.add_fd(fd)?;
            }
        }
        self.wake.signal();
        Ok(index)
    }

    /// Opens UDP 4791 / QP1 of device `index` on local address `ip`.
    pub(crate) fn open_gsi(st: &mut State, index: u32, ip: IpAddr) -> Result<()> {
        let d = st
            .devices
            .get_mut(&index)
            .ok_or_else(|| Error::NoDevice(format!("device {index}")))?;
        let w = d.wire_addr(ip);
        if d.open.contains(&w) {
            return Ok(());
        }
        // Every address an id uses is in the GID table (127.0.0.0/8 beyond lo's own
        // addresses included: they are local through lo's /8).
        d.ensure_gid(ip)?;
        d.dev.gsi_open(w)?;
        if let Some(slot) = d.dev.share_slot()? {
            // steering across processes (rdma_soft::io::steer)
            d.agent.set_comm_id_slot(slot);
        }
        d.open.insert(w);
        Ok(())
    }
}

/// 64 bits from the OS's random source: the seeds of the context and of each CM agent (comm
/// ids, transaction ids, PSNs), which a peer must not be able to predict.
pub(crate) fn os_seed() -> Result<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b)
        .map_err(|e| Error::Io(std::io::Error::other(format!("getrandom: {e}"))))?;
    Ok(u64::from_le_bytes(b))
}
