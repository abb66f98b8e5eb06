//! Opening devices (one per netdev, on first use, with its CM agent) and their GSI
//! addresses.

use crate::config::DEVICES_ENV;
use crate::devices::{gid_of, DevEntry};
use crate::error::{Error, Result};
use crate::inner::Inner;
use crate::state::State;
use rdma_proto::cm::{AgentConfig, CmAgent, OverloadPolicy};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{Device, DeviceConfig};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

impl Inner {
    /// Opens (once) the software device of netdev `index`, with its CM agent. Its GID
    /// table starts with the netdev's addresses and then follows the host's changes
    /// (`apply_host_events`); `ENODEV` when the configuration gives the netdev no device.
    pub(crate) fn ensure_device(&self, index: u32) -> Result<()> {
        if self.lock().devices.contains_key(&index) {
            return Ok(());
        }
        let (netdev, gids) = self.block(move |r| async move {
            let nd = r.netdev(index).await?;
            let gids = r.gid_table(index).await?;
            Ok::<_, Error>((nd, gids))
        })?;
        let name = self.config.device_name(&netdev.name).ok_or_else(|| {
            Error::NoDevice(format!(
                "netdev {} has no device ({DEVICES_ENV} does not list it)",
                netdev.name
            ))
        })?;
        let mut gids: Vec<WireAddr> = gids.iter().map(|g| gid_of(g.ip, index)).collect();
        gids.truncate(256); // rdma_soft::verbs::device::MAX_GIDS
        let mut cfg = DeviceConfig::for_netdev(&netdev.name)?;
        cfg.name = name;
        cfg.gids = gids;
        cfg.up = netdev.up;
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
        let dev = Device::open(cfg)?;
        // Room for a burst of requests from one peer (a client opening hundreds of
        // connections at once); the per-peer share still bounds a flooding peer.
        dev.gsi_set_limits(rdma_soft::gsi::GsiLimits {
            queue_len: 8192,
            per_peer: 2048,
        })?;
        let mut st = self.lock();
        if st.devices.contains_key(&index) {
            return Ok(());
        }
        st.seed = st
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let agent = CmAgent::new(AgentConfig {
            ca_guid: guid,
            seed: st.seed ^ u64::from(index),
            overload: OverloadPolicy::Drop,
            ..AgentConfig::default()
        });
        st.devices.insert(
            index,
            DevEntry {
                netdev,
                dev,
                agent,
                open: HashSet::new(),
                conns: HashMap::new(),
                listeners: HashMap::new(),
            },
        );
        let gsi_fd = st.devices.get(&index).map(|d| d.dev.gsi_wait_fds().event);
        drop(st);
        if let (Some(fd), Some((_, reg))) = (gsi_fd, self.engine.get()) {
            // MADs queued on this device's GSI make the engine run the CM
            reg.add_fd(fd)?;
        }
        self.wake.signal();
        Ok(())
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
