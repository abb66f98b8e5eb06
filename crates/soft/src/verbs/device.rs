//! The device: its attributes (`ibv_query_device`, `ibv_query_port`) and the factory of PDs,
//! CQs, completion channels and SRQs.

use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, TryLockError, Weak};
use std::time::Instant;

use rdma_proto::verbs::{Mtu, PdId, MAX_SGE};

use super::mr::{MrTable, MrTableView};
use super::pd::ProtectionDomain;
use super::port::{PortAttr, PortState};
use super::srq::SharedReceiveQueue;
use super::watch::WatchState;
use crate::engine::{self, Registered};
use crate::io::{DatagramWire, UdpWire, WireAddr, WireStats};
use crate::queues::cq::{CompletionChannel, CompletionQueue};
use crate::queues::cq_wake;
use crate::quota::Quota;
use crate::runtime::{Runtime, RuntimeStats};
use crate::{Error, Result, SoftConfig};

mod async_events;
mod config;
mod drive;
mod gsi;
mod inspect;
pub use config::{active_mtu, DeviceAttr, DeviceConfig, ROCE_MAX_HEADERS};

/// Largest GID table (a GID index is a `u8`).
pub const MAX_GIDS: usize = 256;

/// What the verbs objects hold of their device: the state with its place in the progress
/// engine. The last one dropped leaves the engine (waiting for a run in progress), then tears
/// the state down in the dropping thread.
pub(crate) type DeviceArc = Arc<Registered<DeviceShared>>;

pub(crate) struct DeviceShared {
    /// The configuration; its `gids` is the live GID table ([`Device::add_gid`],
    /// [`Device::remove_gid`]): read when a QP gets its address vector or an AH is made,
    /// never per packet.
    cfg: RwLock<DeviceConfig>,
    pub(crate) name: String,
    pub(crate) netdev: String,
    /// The device's inspection provider (dropped first: see `inspect::register_borrowed`).
    inspect: OnceLock<crate::inspect::Provider>,
    attr: DeviceAttr,
    /// Port n at `ports[n - 1]`; its state and GID table live in `cfg`.
    ports: Vec<PortAttr>,
    pub(crate) mrs: Arc<MrTable>,
    /// Live PDs and CQs, bounded by `max_pd` / `max_cq`.
    pds: Arc<Quota>,
    cqs: Arc<Quota>,
    /// The device's wake-time controls in the progress engine (its registration is the
    /// [`DeviceArc`]'s, which leaves the engine before this is dropped).
    waker: OnceLock<engine::Waker>,
    /// When a thread last drove the device inline (polling an empty CQ), in nanoseconds
    /// since `created` (0: never): the engine leaves the device to it meanwhile.
    inline_at: AtomicU64,
    /// Inline polls so far (`try_progress`).
    inline_polls: AtomicU32,
    /// Event loops that drive the device themselves (`verbs/watch.rs`).
    watch: WatchState,
    created: Instant,
    rt: Mutex<Runtime>,
    /// The wire's wait fd (lives as long as the wire, which lives as long as this).
    wait_fd: Option<RawFd>,
    /// The GSI eventfd (lives as long as the runtime).
    gsi_event: RawFd,
    /// The async event queue's eventfd (lives as long as the runtime).
    async_fd: RawFd,
    /// The wire's pull minimum ([`crate::io::DatagramWire::pull_min`]): regions at least
    /// this long that a PD allocates are shared.
    pub(crate) pull_min: Option<u32>,
    /// The wire's in-place minimum ([`crate::io::DatagramWire::in_place_min`]): buffers at
    /// least this long that a PD registers in place may be moved onto a region file.
    pub(crate) in_place_min: Option<u32>,
}

impl DeviceShared {
    /// The runtime, locked; the CQ wake-ups of what is done under it fire after the lock
    /// is released ([`crate::queues::cq_wake`]).
    pub(crate) fn runtime(&self) -> RtGuard<'_> {
        let wakes = cq_wake::hold();
        RtGuard {
            rt: self.rt.lock().unwrap_or_else(|e| e.into_inner()),
            _wakes: wakes,
        }
    }

    pub(crate) fn cfg(&self) -> RwLockReadGuard<'_, DeviceConfig> {
        self.cfg.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn watch(&self) -> &WatchState {
        &self.watch
    }

    /// The runtime if no other thread holds it (a poisoned lock is taken as it is).
    fn try_runtime(&self) -> Option<RtGuard<'_>> {
        let wakes = cq_wake::hold();
        let rt = match self.rt.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(RtGuard { rt, _wakes: wakes })
    }

    pub(crate) fn rt_try_lock(&self) -> std::sync::TryLockResult<MutexGuard<'_, Runtime>> {
        self.rt.try_lock()
    }

    /// Nanoseconds since the device was created.
    pub(crate) fn now_ns(&self) -> u64 {
        self.created.elapsed().as_nanos() as u64
    }

    /// Port 1's attributes (state and GID table length as at open).
    pub(crate) fn port(&self) -> &PortAttr {
        &self.ports[0]
    }

    /// Port `n`'s attributes (state and GID table length as at open; EINVAL beyond).
    pub(crate) fn port_attr(&self, n: u8) -> Result<&PortAttr> {
        (n as usize)
            .checked_sub(1)
            .and_then(|i| self.ports.get(i))
            .ok_or(Error::InvalidArgument(
                "port number beyond the device's ports",
            ))
    }

    pub(crate) fn cfg_mut(&self) -> std::sync::RwLockWriteGuard<'_, DeviceConfig> {
        self.cfg.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn attr(&self) -> &DeviceAttr {
        &self.attr
    }

    pub(crate) fn gsi_event_fd(&self) -> RawFd {
        self.gsi_event
    }

    pub(crate) fn async_fd(&self) -> RawFd {
        self.async_fd
    }

    pub(crate) fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // Leave inspection first (waiting for a read in progress), so the fields it uses
        // outlive it (the engine was left already: `DeviceArc`); the wire's sockets then
        // close in this thread, at once.
        drop(self.inspect.take());
    }
}

/// The locked runtime ([`DeviceShared::runtime`]): the lock is released before the held
/// CQ wake-ups fire (fields drop in order).
pub(crate) struct RtGuard<'a> {
    rt: MutexGuard<'a, Runtime>,
    _wakes: cq_wake::Hold,
}

impl std::ops::Deref for RtGuard<'_> {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.rt
    }
}

impl std::ops::DerefMut for RtGuard<'_> {
    fn deref_mut(&mut self) -> &mut Runtime {
        &mut self.rt
    }
}

/// A software RoCEv2 device: one port per netdev it is attached to (usually one; a device
/// group has several, [`DeviceConfig::group`]), one key space for all.
///
/// ```
/// use rdma_soft::verbs::{Device, DeviceConfig, Mtu};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// assert_eq!(dev.name(), "lo");
/// let port = dev.query_port(1).unwrap();
/// assert_eq!(port.active_mtu, Mtu::Mtu4096); // lo's MTU is 65536
/// assert!(dev.query_device().max_sge >= 1);
/// assert_eq!(dev.query_port(2).unwrap_err().errno(), libc::EINVAL);
/// ```
#[derive(Clone)]
pub struct Device {
    shared: DeviceArc,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.shared.name)
            .field("netdev", &self.shared.netdev)
            .finish()
    }
}

/// Limits of this implementation.
const MAX_QP: u32 = 1 << 16;
const MAX_QP_WR: u32 = 1 << 14;
const MAX_CQ: u32 = 1 << 14;
const MAX_CQE: u32 = (1 << 16) - 1;
const MAX_MR: u32 = 1 << 16;
const MAX_PD: u32 = 1 << 16;
const MAX_SRQ: u32 = 1 << 12;
const MAX_INLINE: u32 = 256;
const MAX_MSG: u32 = 1 << 31;
const MAX_RD_ATOM: u32 = 128;

impl Device {
    /// Opens a device on a UDP wire configured from the environment
    /// ([`SoftConfig::from_env`]: port 4791, fault injection from `RDMA_SOFT_FAULTS` ...):
    /// [`Device::open_with_config`] with that configuration. EINVAL when a variable does not
    /// parse.
    pub fn open(cfg: DeviceConfig) -> Result<Device> {
        Device::open_with_config(cfg, &SoftConfig::from_env()?)
    }

    /// Opens a device on a UDP wire with `soft`'s wire settings, after applying its
    /// process-wide ones if none were ([`SoftConfig::apply_process`]). No socket is opened
    /// yet: a QP opens UDP 4791 on its source address when it moves to RTR. EINVAL when the
    /// netdev MTU is too small for a 256-byte IB MTU.
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// use rdma_soft::SoftConfig;
    /// let soft = SoftConfig::builder().host_local(false).build().unwrap();
    /// let dev = Device::open_with_config(DeviceConfig::for_netdev("lo").unwrap(), &soft).unwrap();
    /// assert_eq!(dev.host_local(), None, "the host-local wire is off");
    /// ```
    pub fn open_with_config(cfg: DeviceConfig, soft: &SoftConfig) -> Result<Device> {
        soft.apply_process();
        let mut wire = soft.wire.clone();
        // the process has one runtime directory: the first configuration applied says where
        wire.runtime_dir = crate::config::process_runtime_dir();
        let wire = UdpWire::new(wire)?;
        Device::open_with_wire(cfg, Box::new(wire))
    }

    /// Opens a device on the given wire (another UDP port, a host-local wire, a test wire).
    ///
    /// ```
    /// use rdma_soft::io::{UdpConfig, UdpWire};
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// let wire = UdpWire::new(UdpConfig { port: 47913, ..UdpConfig::default() }).unwrap();
    /// let dev = Device::open_with_wire(DeviceConfig::for_netdev("lo").unwrap(), Box::new(wire)).unwrap();
    /// assert_eq!(dev.wire_stats().sent, 0);
    /// ```
    pub fn open_with_wire(cfg: DeviceConfig, wire: Box<dyn DatagramWire>) -> Result<Device> {
        let mtus = cfg.check_ports()?;
        let attr = DeviceAttr {
            fw_ver: concat!("rdma-soft ", env!("CARGO_PKG_VERSION")).to_owned(),
            node_guid: cfg.node_guid,
            sys_image_guid: cfg.node_guid,
            max_mr_size: isize::MAX as u64,
            page_size_cap: 0xffff_f000,
            vendor_id: 0,
            vendor_part_id: 0,
            max_qp: MAX_QP,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE as u32,
            max_sge_rd: MAX_SGE as u32,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_QP_WR,
            max_srq_sge: MAX_SGE as u32,
            max_pkeys: 1,
            phys_port_cnt: cfg.port_count(),
            atomic_hca: true,
            max_inline_data: MAX_INLINE,
            max_msg_sz: MAX_MSG,
        };
        let ports = mtus
            .iter()
            .enumerate()
            .map(|(i, &active)| {
                // port numbers fit: check_ports allows MAX_PORTS
                let (_, netdev_mtu, up, gids) = cfg.port_parts(i as u8 + 1)?;
                Ok(PortAttr {
                    state: if up {
                        PortState::Active
                    } else {
                        PortState::Down
                    },
                    max_mtu: Mtu::Mtu4096,
                    active_mtu: active,
                    netdev_mtu,
                    gid_tbl_len: gids.len() as u32,
                    max_msg_sz: MAX_MSG,
                    pkey_tbl_len: 1,
                    link_layer_ethernet: true,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (pull_min, in_place_min) = (wire.pull_min(), wire.in_place_min());
        let mut rt = Runtime::new(wire)?;
        let wait_fd = rt.wait_fd();
        let gsi_event = rt.gsi_event_fd();
        let async_fd = rt.async_events().fd();
        let shared = Arc::new(DeviceShared {
            mrs: Arc::new(MrTable::new(MAX_MR as usize)),
            name: cfg.name.clone(),
            netdev: cfg.netdev.clone(),
            cfg: RwLock::new(cfg),
            attr,
            ports,
            pds: Quota::new(MAX_PD, "protection domains"),
            cqs: Quota::new(MAX_CQ, "completion queues"),
            waker: OnceLock::new(),
            inspect: OnceLock::new(),
            inline_at: AtomicU64::new(0),
            inline_polls: AtomicU32::new(0),
            watch: WatchState::default(),
            created: Instant::now(),
            rt: Mutex::new(rt),
            wait_fd,
            gsi_event,
            async_fd,
            pull_min,
            in_place_min,
        });
        let weak = Arc::downgrade(&shared);
        let shared = Arc::new(Registered::new(shared)?);
        if let Some(fd) = wait_fd {
            shared.registration().add_fd(fd)?;
        }
        // Cannot be set already: the Arc is ours alone.
        let _ = shared.waker.set(shared.registration().waker());
        // SAFETY: stored in `shared.inspect`, which `DeviceShared::drop` drops first.
        #[allow(unsafe_code)] // the SAFETY comment above
        let p = unsafe { crate::inspect::register_borrowed("devices", weak, inspect::snapshot) };
        let _ = shared.inspect.set(p);
        shared.update_port_map();
        tracing::debug!(device = %shared.name, netdev = %shared.netdev, "device open");
        Ok(Device { shared })
    }

    pub(crate) fn shared(&self) -> &DeviceShared {
        &self.shared
    }

    pub(crate) fn shared_arc(&self) -> DeviceArc {
        self.shared.clone()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The netdev it is attached to.
    pub fn netdev(&self) -> &str {
        &self.shared.netdev
    }

    /// Port 1's GID table as it is now (index = `sgid_index`). The table follows the
    /// netdev's addresses through [`Device::add_gid`] and [`Device::remove_gid`]; other
    /// ports': [`Device::gids_on`].
    pub fn gids(&self) -> Vec<WireAddr> {
        self.shared.cfg().gids.clone()
    }

    /// The index of `ip` in port 1's GID table, if it holds it ([`Device::gid_index_on`]).
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        self.gid_index_on(1, ip)
    }

    /// Adds `gid` to port 1's GID table of the open device (an address added to its netdev)
    /// and returns its index; a GID already present keeps its index. QPs and AHs made later
    /// may use it (existing UD QPs keep receiving on the addresses they started with). It
    /// takes the table's lock for the call only; the data path never reads the table.
    /// [`Error::Exhausted`] (`ENOMEM`) when the table has `MAX_GIDS` (256) entries. Other
    /// ports: [`Device::add_gid_on`].
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let a = "127.0.7.1".parse().unwrap();
    /// assert_eq!(dev.add_gid(a).unwrap(), 0);
    /// assert_eq!(dev.add_gid(a).unwrap(), 0);
    /// assert_eq!(dev.gid_index(a.ip()), Some(0));
    /// assert_eq!(dev.query_port(1).unwrap().gid_tbl_len, 1);
    /// assert!(dev.remove_gid(a.ip()));
    /// assert_eq!(dev.gid_index(a.ip()), None);
    /// ```
    pub fn add_gid(&self, gid: WireAddr) -> Result<u8> {
        self.add_gid_on(1, gid)
    }

    /// Removes the GID of `ip` from port 1's table (an address removed from the netdev);
    /// false if absent. Later entries move down one index (Linux leaves an empty entry
    /// instead): QPs already past INIT → RTR keep their address, only later `sgid_index`
    /// lookups see the change. Nothing is torn down.
    pub fn remove_gid(&self, ip: IpAddr) -> bool {
        self.remove_gid_on(1, ip)
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let (id, slot) = self.shared.pds.take()?;
        Ok(ProtectionDomain::new(PdId(id), slot, self.shared.clone()))
    }

    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        CompletionChannel::new()
    }

    /// Creates a completion queue of at least `cqe` entries (EINVAL for 0 or more than
    /// `max_cqe`), notifying `channel` when armed.
    pub fn create_cq(
        &self,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue> {
        if cqe == 0 || cqe > MAX_CQE as usize {
            return Err(Error::InvalidArgument("cqe out of range 1..=max_cqe"));
        }
        let (id, slot) = self.shared.cqs.take()?;
        Ok(CompletionQueue::new_on(
            Arc::downgrade(self.shared.source()) as Weak<DeviceShared>,
            (id, slot),
            cqe,
            channel,
        ))
    }

    /// Creates a shared receive queue in `pd` (EINVAL beyond `max_srq_wr` / `max_srq_sge`).
    pub fn create_srq(
        &self,
        pd: &ProtectionDomain,
        max_wr: usize,
        max_sge: usize,
    ) -> Result<SharedReceiveQueue> {
        if max_wr == 0 || max_wr > MAX_QP_WR as usize || max_sge > MAX_SGE {
            return Err(Error::InvalidArgument("SRQ max_wr or max_sge out of range"));
        }
        Ok(SharedReceiveQueue::new(pd, max_wr, max_sge))
    }

    /// Registered memory regions.
    pub fn mr_count(&self) -> usize {
        self.shared.mrs.len()
    }

    /// The key table as the transport sees it ([`rdma_proto::memory::MemoryTable`]): take one
    /// view per batch of packets (it holds the table's read lock; registration waits for it).
    pub fn memory(&self) -> MrTableView<'_> {
        self.shared.mrs.view()
    }

    /// Drives the device once in the caller's thread: receives what the wire has (up to a few
    /// `recvmmsg` batches), hands each packet to its QP, runs expired transport timers,
    /// transmits the results and moves completions to their CQs. Returns the datagrams
    /// received. Never needed for correctness: the process's progress engine
    /// ([`crate::engine`]) drives every device on its own; polling an empty CQ does this
    /// inline to save a thread hop while busy-polling.
    pub fn progress(&self) -> Result<usize> {
        self.shared.progress()
    }

    /// When [`Device::progress`] must run next even if no packet arrives (the earliest
    /// retransmission or RNR timer, or a packet held by the fault injector).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.shared.next_deadline()
    }

    /// Counters of the device's wire (datagrams, system calls, faults injected).
    pub fn wire_stats(&self) -> WireStats {
        self.shared.runtime().wire_stats()
    }

    /// The device's slot among the processes sharing its addresses (claimed now if not
    /// yet), `None` when its wire does not share. A connection manager puts it in the top
    /// byte of its comm ids, as the device does in its QPNs.
    pub fn share_slot(&self) -> Result<Option<u8>> {
        self.shared.runtime().share_slot()
    }

    /// Counters of the device's runtime.
    pub fn runtime_stats(&self) -> RuntimeStats {
        self.shared.runtime().stats()
    }
}
