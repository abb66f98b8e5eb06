//! Change tracking: host network changes that concern resolved ids become per-id
//! [`Notification`]s (ADDR_CHANGE, DEVICE_REMOVAL). Nothing is torn down: connections are
//! sticky and the application decides (DESIGN.md, seed 002 option 1).

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;

use rdma_hostview::{Event, Link, MacAddr, Monitor};

use crate::error::{Error, Result};
use crate::host::resolve::{ResolvedAddr, Resolver, RouteQuery};

/// Identifies a watched id (the CM's id number).
pub type WatchId = u64;

/// What an id was resolved to: the key its changes are judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchKey {
    /// The id's netdev (its device).
    pub netdev: u32,
    /// The peer address.
    pub peer: IpAddr,
    /// The gateway towards the peer, if any.
    pub gateway: Option<IpAddr>,
    /// The next hop's MAC, if known.
    pub dmac: Option<MacAddr>,
    /// The local address.
    pub src: IpAddr,
}

/// Why an id gets ADDR_CHANGE.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeReason {
    /// The route to the peer now goes through another netdev or gateway; `netdev: None` when
    /// there is no route any more.
    RouteChanged {
        /// The route's netdev now.
        netdev: Option<u32>,
        /// The route's gateway now.
        gateway: Option<IpAddr>,
    },
    /// The next hop's MAC changed.
    NeighbourMacChanged {
        /// MAC before.
        old: MacAddr,
        /// MAC now.
        new: MacAddr,
    },
    /// The local address was removed from its netdev.
    SourceAddressRemoved,
    /// The id's netdev went down (admin down or carrier lost).
    NetdevDown,
    /// The MAC of the id's netdev changed (the one case Linux reports: a bonding
    /// fail-over changing the bond's MAC).
    LocalMacChanged {
        /// MAC before.
        old: MacAddr,
        /// MAC now.
        new: MacAddr,
    },
}

/// A per-id notification; the CM turns it into an event on the id's channel.
///
/// ```
/// use rdmacm::host::{ChangeReason, Notification};
/// let n = Notification::AddrChange { id: 3, reason: ChangeReason::NetdevDown };
/// assert_eq!(n.id(), 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// RDMA_CM_EVENT_ADDR_CHANGE: a hint, the id keeps its device and path.
    AddrChange {
        /// The id.
        id: WatchId,
        /// What changed.
        reason: ChangeReason,
    },
    /// RDMA_CM_EVENT_DEVICE_REMOVAL: the id's netdev (so its device) is gone.
    DeviceRemoval {
        /// The id.
        id: WatchId,
        /// ifindex of the removed netdev.
        netdev: u32,
    },
}

impl Notification {
    /// The id it concerns.
    pub fn id(&self) -> WatchId {
        match self {
            Notification::AddrChange { id, .. } | Notification::DeviceRemoval { id, .. } => *id,
        }
    }
}

#[derive(Debug, Clone)]
struct Watched {
    key: WatchKey,
    query: RouteQuery,
    src_netdev: u32,
    next_hop: IpAddr,
    /// The route as last seen: (netdev, gateway), `None` if there was none.
    route_now: Option<(u32, Option<IpAddr>)>,
    dmac_now: Option<MacAddr>,
    smac_now: MacAddr,
    down: bool,
    removed: bool,
}

/// Watches resolved ids and reports what changed under them.
///
/// It owns a hostview [`Monitor`] (create it in the ids' namespace, inside a tokio runtime)
/// and reacts to: route changes (every watched id of the family has its lookup redone and
/// compared with the route it last saw), neighbour updates of an id's next hop (MAC
/// changes), removal of an id's local address, its netdev going down or changing its MAC,
/// and its netdev being deleted (DEVICE_REMOVAL, once; the id stays watched until
/// [`Watcher::unwatch`]). After a report the new state becomes the reference, so a change back is
/// reported again; one host change may yield several notifications for one id (e.g. an
/// address removal also removes its prefix route): the CM may coalesce them.
///
/// ```no_run
/// # async fn f(a: rdmacm::host::ResolvedAddr) -> rdmacm::Result<()> {
/// let r = rdmacm::host::Resolver::new()?;
/// let mut w = rdmacm::host::Watcher::new(&r).await?;
/// w.watch(1, &a);
/// let n = w.next().await?;
/// println!("id {} {:?}", n.id(), n);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Watcher {
    resolver: Resolver,
    monitor: Monitor,
    ids: BTreeMap<WatchId, Watched>,
    queue: VecDeque<Notification>,
    /// Address and link events kept for the CM's device registry (only when enabled).
    host: Option<VecDeque<Event>>,
}

impl Watcher {
    /// Subscribes to the host's changes.
    pub async fn new(resolver: &Resolver) -> Result<Watcher> {
        Ok(Watcher {
            resolver: resolver.clone(),
            monitor: Monitor::new().await?,
            ids: BTreeMap::new(),
            queue: VecDeque::new(),
            host: None,
        })
    }

    /// Also keep address and link events (added, removed, up, down) for
    /// [`Watcher::take_host_events`]: the CM's device registry follows the host's addresses
    /// and its ports the links' states with them.
    pub(crate) fn track_host(&mut self) {
        self.host.get_or_insert_with(VecDeque::new);
    }

    /// Address, link and route events seen since the last call (with [`Watcher::track_host`]).
    pub(crate) fn take_host_events(&mut self) -> Vec<Event> {
        self.host
            .as_mut()
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// A queued notification, without waiting.
    pub(crate) fn pop(&mut self) -> Option<Notification> {
        self.queue.pop_front()
    }

    /// The next raw host event. Cancel-safe (nothing is lost when the future is dropped):
    /// the CM waits on it together with its watch requests, then runs
    /// [`Watcher::handle_event`] to completion, so a watch request arriving mid-way can no
    /// longer cancel the processing of a change.
    pub(crate) async fn next_event(&mut self) -> Result<Event> {
        self.monitor
            .next()
            .await
            .ok_or_else(|| Error::Host(rdma_hostview::Error::Netlink("monitor closed".into())))
    }

    /// Processes one host event (queues the notifications it causes).
    pub(crate) async fn handle_event(&mut self, ev: Event) -> Result<()> {
        self.handle(ev).await
    }

    /// Queues `ev` for [`Watcher::take_host_events`] if it is a host event the registry
    /// follows (before [`Watcher::handle_event`] judges the watched ids against it, which
    /// may wait on the network: a port going down must not wait behind that).
    pub(crate) fn note_host(&mut self, ev: &Event) {
        if let Some(h) = self.host.as_mut() {
            if matches!(
                ev,
                Event::AddressAdded(_)
                    | Event::AddressRemoved(_)
                    | Event::LinkAdded(_)
                    | Event::LinkRemoved(_)
                    | Event::LinkUp(_)
                    | Event::LinkDown(_)
                    | Event::RouteAdded(_)
                    | Event::RouteChanged(_)
                    | Event::RouteRemoved(_)
                    | Event::Overrun
            ) {
                h.push_back(ev.clone());
            }
        }
    }

    /// Starts watching id `id` resolved as `addr` (replaces an earlier watch of `id`).
    pub fn watch(&mut self, id: WatchId, addr: &ResolvedAddr) {
        let key = WatchKey {
            netdev: addr.netdev.index,
            peer: addr.dst,
            gateway: addr.gateway,
            dmac: addr.dmac,
            src: addr.src,
        };
        self.ids.insert(
            id,
            Watched {
                query: addr.query.clone(),
                src_netdev: addr.src_netdev,
                next_hop: addr.next_hop,
                route_now: Some((addr.netdev.index, addr.gateway)),
                dmac_now: addr.dmac,
                smac_now: addr.smac,
                down: !(addr.netdev.up && addr.netdev.running),
                removed: false,
                key,
            },
        );
    }

    /// Stops watching `id`; false if it was not watched.
    pub fn unwatch(&mut self, id: WatchId) -> bool {
        self.queue.retain(|n| n.id() != id);
        self.ids.remove(&id).is_some()
    }

    /// The key `id` is watched under.
    pub fn key(&self, id: WatchId) -> Option<&WatchKey> {
        self.ids.get(&id).map(|w| &w.key)
    }

    /// Number of watched ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no id is watched.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The next notification. Errors only if the netlink monitor fails.
    pub async fn next(&mut self) -> Result<Notification> {
        loop {
            if let Some(n) = self.queue.pop_front() {
                return Ok(n);
            }
            let ev = self.monitor.next().await.ok_or_else(|| {
                Error::Host(rdma_hostview::Error::Netlink("monitor closed".into()))
            })?;
            self.handle(ev).await?;
        }
    }

    /// Like [`Watcher::next`] with a deadline (`ETIMEDOUT` when it passes first).
    pub async fn next_before(&mut self, deadline: tokio::time::Instant) -> Result<Notification> {
        match tokio::time::timeout_at(deadline, self.next()).await {
            Ok(r) => r,
            Err(_) => Err(Error::TimedOut),
        }
    }

    fn push_change(&mut self, id: WatchId, reason: ChangeReason) {
        self.queue
            .push_back(Notification::AddrChange { id, reason });
    }

    async fn handle(&mut self, ev: Event) -> Result<()> {
        match ev {
            Event::LinkRemoved(l) => {
                let hit: Vec<WatchId> = self
                    .ids
                    .iter_mut()
                    .filter(|(_, w)| w.key.netdev == l.index && !w.removed)
                    .map(|(id, w)| {
                        w.removed = true;
                        *id
                    })
                    .collect();
                for id in hit {
                    self.queue.push_back(Notification::DeviceRemoval {
                        id,
                        netdev: l.index,
                    });
                }
            }
            Event::LinkAdded(l) | Event::LinkUp(l) | Event::LinkDown(l) | Event::LinkChanged(l) => {
                self.link_state(&l);
            }
            Event::AddressRemoved(a) => {
                let hit: Vec<WatchId> = self
                    .ids
                    .iter()
                    .filter(|(_, w)| w.key.src == a.addr && w.src_netdev == a.link && !w.removed)
                    .map(|(id, _)| *id)
                    .collect();
                for id in hit {
                    self.push_change(id, ChangeReason::SourceAddressRemoved);
                }
            }
            Event::RouteAdded(r) | Event::RouteChanged(r) | Event::RouteRemoved(r) => {
                self.recheck_routes(Some(r.dst.is_ipv4())).await;
            }
            Event::Neighbour(n) => {
                if let (Some(mac), true) = (n.mac, n.state.is_valid()) {
                    self.neighbour_mac(n.link, n.addr, mac);
                }
            }
            Event::Overrun => self.recheck().await?,
            _ => {}
        }
        Ok(())
    }

    /// A link's state as just seen: its MAC (the id's smac) and whether it is usable.
    fn link_state(&mut self, l: &Link) {
        let mut changes = Vec::new();
        for (id, w) in self.ids.iter_mut() {
            if w.key.netdev != l.index || w.removed {
                continue;
            }
            if let Some(mac) = l.mac {
                if mac != w.smac_now {
                    changes.push((
                        *id,
                        ChangeReason::LocalMacChanged {
                            old: w.smac_now,
                            new: mac,
                        },
                    ));
                    w.smac_now = mac;
                }
            }
            match (l.is_usable(), w.down) {
                (false, false) => {
                    w.down = true;
                    changes.push((*id, ChangeReason::NetdevDown));
                }
                (true, true) => w.down = false,
                _ => {}
            }
        }
        for (id, reason) in changes {
            self.push_change(id, reason);
        }
    }

    fn neighbour_mac(&mut self, link: u32, addr: IpAddr, mac: MacAddr) {
        let mut changes = Vec::new();
        for (id, w) in self.ids.iter_mut() {
            if w.key.netdev != link || w.next_hop != addr || w.removed {
                continue;
            }
            match w.dmac_now {
                Some(old) if old != mac => changes.push((*id, old, mac)),
                _ => {}
            }
            w.dmac_now = Some(mac);
        }
        for (id, old, new) in changes {
            self.push_change(id, ChangeReason::NeighbourMacChanged { old, new });
        }
    }

    /// Redoes the route lookup of every live id (of one family, if given) and reports those
    /// whose netdev or gateway differs from what they last saw.
    async fn recheck_routes(&mut self, v4: Option<bool>) {
        let ids: Vec<(WatchId, RouteQuery)> = self
            .ids
            .iter()
            .filter(|(_, w)| !w.removed && v4.is_none_or(|v| w.query.dst.is_ipv4() == v))
            .map(|(id, w)| (*id, w.query.clone()))
            .collect();
        for (id, q) in ids {
            let now = self
                .resolver
                .choose(&q)
                .await
                .ok()
                .map(|c| (c.netdev.index, c.gateway));
            let Some(w) = self.ids.get_mut(&id) else {
                continue;
            };
            if w.route_now != now {
                w.route_now = now;
                let reason = ChangeReason::RouteChanged {
                    netdev: now.map(|n| n.0),
                    gateway: now.and_then(|n| n.1),
                };
                self.push_change(id, reason);
            }
        }
    }

    /// Re-reads links, addresses, routes and neighbours and queues a notification for every
    /// difference from what the ids last saw. Done automatically when the kernel reports
    /// lost notifications (overrun); callers may also use it, e.g. after not polling for a
    /// long time.
    pub async fn recheck(&mut self) -> Result<()> {
        let hv = self.resolver.view().clone();
        let links = hv.links().await?;
        let addrs = hv.addresses().await?;
        let ids: Vec<WatchId> = self.ids.keys().copied().collect();
        for id in ids {
            let Some(w) = self.ids.get(&id).cloned() else {
                continue;
            };
            if w.removed {
                continue;
            }
            match links.iter().find(|l| l.index == w.key.netdev) {
                None => {
                    if let Some(x) = self.ids.get_mut(&id) {
                        x.removed = true;
                    }
                    self.queue.push_back(Notification::DeviceRemoval {
                        id,
                        netdev: w.key.netdev,
                    });
                    continue;
                }
                Some(l) => self.link_state(l),
            }
            if !addrs
                .iter()
                .any(|a| a.addr == w.key.src && a.link == w.src_netdev)
                && !w.key.src.is_loopback()
            {
                self.push_change(id, ChangeReason::SourceAddressRemoved);
            }
            if let Ok(Some(n)) = hv.neighbour(w.key.netdev, w.next_hop).await {
                if let (Some(mac), true) = (n.mac, n.state.is_valid()) {
                    self.neighbour_mac(w.key.netdev, w.next_hop, mac);
                }
            }
        }
        self.recheck_routes(None).await;
        Ok(())
    }
}
