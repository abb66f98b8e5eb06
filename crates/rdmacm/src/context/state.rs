//! Everything behind the context's lock: ids, devices, channels, port tables.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::context::counters::CmCounters;
use crate::context::device_entry::DevEntry;
use crate::context::held_request::HeldReq;
use crate::context::id_entry::{IdNum, IdSlot};
use crate::host::resolve::ResolvedAddr;
use crate::params::PendingEvent;
use crate::ports::PortTables;
use rdma_soft::fd::EventFd;
use rustc_hash::FxHashMap as HashMap;

/// A channel's queue.
pub(crate) struct ChanState {
    pub queue: VecDeque<PendingEvent>,
    pub efd: Arc<EventFd>,
}

/// Everything behind the context's lock. Its maps are keyed by numbers this process hands
/// out (ids, channels, ifindexes): they hash with `rustc-hash`'s multiply, not SipHash (a
/// fifth of a connection's instructions went to SipHash, BENCHMARKS.md, issue 35).
pub(crate) struct State {
    pub ids: HashMap<IdNum, Box<IdSlot>>,
    /// Threads in [`crate::context::Inner::wait_acked`]: an ack wakes the condvar only then
    /// (a `notify_all` is a system call even with nobody waiting).
    pub ack_waiters: usize,
    pub next_id: IdNum,
    /// Devices by key: the ifindex of their first netdev (port 1).
    pub devices: HashMap<u32, DevEntry>,
    /// A device group's other members' ifindexes → the group's key ([`State::key_of`]).
    pub members: HashMap<u32, u32>,
    pub channels: HashMap<u64, ChanState>,
    pub next_channel: u64,
    pub ports: PortTables,
    pub seed: u64,
    /// CM response timeout (IBA time code) put in our REQs (rdma_cm: 20).
    pub cm_response_timeout: u8,
    /// REQ / SIDR_REQ retries (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// The context's CM counters (requests taken and refused, by cause).
    pub counters: CmCounters,
    /// Per device, the request whose path is being looked up without the lock: the
    /// device's later CM events wait behind it (`crate::context::held_request`).
    pub held: HashMap<u32, HeldReq>,
    /// Migrate ids whose restored primary is loaded as their alternate: they migrate
    /// back to it once their QP is armed (`crate::ha::lap::poll_returns`).
    pub returning: Vec<IdNum>,
}

impl State {
    /// The listener (if any) on device `dev` that gets a request for service `sid` to
    /// `local` arriving on netdev `arrival`.
    pub(crate) fn find_listener(
        &self,
        dev: u32,
        sid: u64,
        arrival: u32,
        local: std::net::IpAddr,
    ) -> Option<IdNum> {
        let d = self.devices.get(&dev)?;
        d.listeners.get(&sid)?.iter().copied().find(|l| {
            self.ids.get(l).is_some_and(|s| {
                s.state == crate::context::id_entry::IdState::Listen
                    && s.binding
                        .as_ref()
                        .is_some_and(|b| b.accepts(arrival, local, s.afonly()))
            })
        })
    }

    /// The device key of netdev `link`: the group's key for a member of a device group,
    /// the netdev's own ifindex otherwise (opened or not).
    pub fn key_of(&self, link: u32) -> u32 {
        self.members.get(&link).copied().unwrap_or(link)
    }

    /// The device of netdev `link` (a group member's: the group's), if open.
    pub fn device_of(&self, link: u32) -> Option<&DevEntry> {
        self.devices.get(&self.key_of(link))
    }
}

/// A request to the watcher task.
#[derive(Debug)]
pub(crate) enum WatchCmd {
    Watch(IdNum, Box<ResolvedAddr>),
    /// Resolve (our address, the peer's) and watch the result: a migrated connection's
    /// new path.
    Rewatch(IdNum, std::net::IpAddr, std::net::IpAddr, u32),
    Unwatch(IdNum),
}

/// The port of the id's device that its local address is on (a device group has one per
/// member netdev; 1 before the id has a device and an address).
pub(crate) fn id_port(st: &State, s: &IdSlot) -> u8 {
    let dev = s.dev.and_then(|k| st.devices.get(&k));
    match (dev, s.local) {
        (Some(d), Some(l)) => d.sgid(l.ip()).map_or(1, |(p, _)| p),
        _ => 1,
    }
}
