//! A change monitor: one netlink multicast subscription, typed events, no polling.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use futures::channel::mpsc::UnboundedReceiver;
use futures::StreamExt;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REPLACE};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::SocketAddr;
use rtnetlink::MulticastGroup;
use tokio::task::JoinHandle;

use crate::addr_entry::Address;
use crate::error::{Error, Result};
use crate::links::{Link, MacAddr};
use crate::neigh_entry::Neighbour;
use crate::nl;
use crate::route::RouteEntry;

/// A change of the host's network state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A link appeared.
    LinkAdded(Link),
    /// A link became usable (up and running).
    LinkUp(Link),
    /// A link stopped being usable (admin down or carrier lost).
    LinkDown(Link),
    /// A link changed otherwise (name, MAC, MTU, flags) without changing usability.
    LinkChanged(Link),
    /// A link went away.
    LinkRemoved(Link),
    /// An address was added.
    AddressAdded(Address),
    /// An address was removed.
    AddressRemoved(Address),
    /// A route was added.
    RouteAdded(RouteEntry),
    /// A route was replaced (`ip route replace` of an existing route).
    RouteChanged(RouteEntry),
    /// A route was removed.
    RouteRemoved(RouteEntry),
    /// A neighbour entry was created or updated (any state, FAILED included).
    Neighbour(Neighbour),
    /// A neighbour's hardware address changed (reported after the [`Event::Neighbour`]).
    NeighbourMacChanged {
        /// ifindex.
        link: u32,
        /// The neighbour's IP.
        addr: IpAddr,
        /// MAC before.
        old: MacAddr,
        /// MAC now.
        new: MacAddr,
    },
    /// A neighbour entry was deleted.
    NeighbourRemoved(Neighbour),
    /// The kernel dropped notifications (socket buffer full): state must be re-read.
    Overrun,
}

type Notifications = UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// Subscribes to link, address (v4/v6), route (v4/v6) and neighbour notifications on one
/// netlink socket and turns them into [`Event`]s. Must be created inside a tokio runtime; the
/// socket belongs to the calling thread's network namespace.
///
/// ```no_run
/// # async fn f() -> rdma_hostview::Result<()> {
/// let mut mon = rdma_hostview::Monitor::new().await?;
/// while let Some(ev) = mon.next().await {
///     println!("{ev:?}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Monitor {
    rx: Notifications,
    conn: JoinHandle<()>,
    links: HashMap<u32, Link>,
    macs: HashMap<(u32, IpAddr), MacAddr>,
    queue: VecDeque<Event>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

const ALL: &[MulticastGroup] = &[
    MulticastGroup::Link,
    MulticastGroup::Ipv4Ifaddr,
    MulticastGroup::Ipv6Ifaddr,
    MulticastGroup::Ipv4Route,
    MulticastGroup::Ipv6Route,
    MulticastGroup::Neigh,
];

impl Monitor {
    /// Subscribes to every group and records the current links and neighbour MACs (so that
    /// up/down transitions and MAC changes are recognised from the first notification on).
    pub async fn new() -> Result<Monitor> {
        Self::with_groups(ALL, true).await
    }

    /// Neighbour notifications only, no initial state: what neighbour resolution waits on.
    pub(crate) async fn neighbours_only() -> Result<Monitor> {
        Self::with_groups(&[MulticastGroup::Neigh], false).await
    }

    async fn with_groups(groups: &[MulticastGroup], seed: bool) -> Result<Monitor> {
        let (conn, _handle, rx) = rtnetlink::new_multicast_connection(groups)?;
        let conn = tokio::spawn(conn);
        let mut mon = Monitor {
            rx,
            conn,
            links: HashMap::new(),
            macs: HashMap::new(),
            queue: VecDeque::new(),
        };
        if seed {
            // Subscribed first, dumped second: nothing falls between the two.
            let req = nl::Requester::new()?;
            let links = req.request(
                "RTM_GETLINK",
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                NLM_F_DUMP,
            )?;
            for m in &links {
                if let RouteNetlinkMessage::NewLink(l) = m {
                    let l = Link::from_message(l);
                    mon.links.insert(l.index, l);
                }
            }
            let neighs = req.request(
                "RTM_GETNEIGH",
                RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()),
                NLM_F_DUMP,
            )?;
            for m in &neighs {
                if let RouteNetlinkMessage::NewNeighbour(n) = m {
                    if let Some(n) = Neighbour::from_message(n) {
                        if let (Some(mac), true) = (n.mac, n.state.is_valid()) {
                            mon.macs.insert((n.link, n.addr), mac);
                        }
                    }
                }
            }
        }
        Ok(mon)
    }

    /// The next event; `None` if the netlink socket closed.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some(ev);
            }
            let (msg, _) = self.rx.next().await?;
            self.translate(msg);
        }
    }

    /// Like [`Monitor::next`] with a deadline: `Err(TimedOut)` when it passes first.
    pub async fn next_before(&mut self, deadline: tokio::time::Instant) -> Result<Event> {
        match tokio::time::timeout_at(deadline, self.next()).await {
            Ok(Some(ev)) => Ok(ev),
            Ok(None) => Err(Error::Netlink("monitor socket closed".into())),
            Err(_) => Err(Error::TimedOut),
        }
    }

    fn translate(&mut self, msg: NetlinkMessage<RouteNetlinkMessage>) {
        let replace = msg.header.flags & NLM_F_REPLACE != 0;
        let inner = match msg.payload {
            NetlinkPayload::InnerMessage(m) => m,
            NetlinkPayload::Overrun(_) => {
                self.queue.push_back(Event::Overrun);
                return;
            }
            _ => return,
        };
        use RouteNetlinkMessage as M;
        let ev = match inner {
            M::NewLink(l) => self.link_event(Link::from_message(&l)),
            M::DelLink(l) => {
                let l = Link::from_message(&l);
                self.links.remove(&l.index);
                Some(Event::LinkRemoved(l))
            }
            M::NewAddress(a) => Address::from_message(&a).map(Event::AddressAdded),
            M::DelAddress(a) => Address::from_message(&a).map(Event::AddressRemoved),
            M::NewRoute(r) => RouteEntry::from_message(&r).map(|e| {
                if replace {
                    Event::RouteChanged(e)
                } else {
                    Event::RouteAdded(e)
                }
            }),
            M::DelRoute(r) => RouteEntry::from_message(&r).map(Event::RouteRemoved),
            M::NewNeighbour(n) => {
                if let Some(n) = Neighbour::from_message(&n) {
                    self.neighbour_event(n);
                }
                None
            }
            M::DelNeighbour(n) => Neighbour::from_message(&n).map(|n| {
                self.macs.remove(&(n.link, n.addr));
                Event::NeighbourRemoved(n)
            }),
            _ => None,
        };
        self.queue.extend(ev);
    }

    fn link_event(&mut self, l: Link) -> Option<Event> {
        let ev = match self.links.get(&l.index) {
            None => Event::LinkAdded(l.clone()),
            Some(old) if old.is_usable() && !l.is_usable() => Event::LinkDown(l.clone()),
            Some(old) if !old.is_usable() && l.is_usable() => Event::LinkUp(l.clone()),
            Some(old) if *old != l => Event::LinkChanged(l.clone()),
            Some(_) => return None,
        };
        self.links.insert(l.index, l);
        Some(ev)
    }

    fn neighbour_event(&mut self, n: Neighbour) {
        let key = (n.link, n.addr);
        let changed = match (n.mac, n.state.is_valid()) {
            (Some(new), true) => self
                .macs
                .insert(key, new)
                .filter(|old| *old != new)
                .map(|old| (old, new)),
            _ => None,
        };
        self.queue.push_back(Event::Neighbour(n));
        if let Some((old, new)) = changed {
            self.queue.push_back(Event::NeighbourMacChanged {
                link: key.0,
                addr: key.1,
                old,
                new,
            });
        }
    }
}
