//! The CM engine: what the process's progress engine runs for a context. MADs in, agents
//! and their timers, MADs out, events; host changes applied to the device registry.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use rdma_proto::cm::{CmEvent, CmPath, ConnHandle};
use rdma_soft::engine::{Run, Source};

use crate::context::id_entry::{IdNum, IdState};
use crate::context::state::State;
use crate::context::{CmSource, Inner};
use crate::engine::mad_out::{count_retransmits, flush_gsi, mad_attr, send};
use crate::host::watch::Notification;

impl Source for CmSource {
    fn run(&self, now: Instant) -> Run {
        // Held for the whole run (declared first: dropped after `inner`): the last
        // application handle waits for it, so this run never lets the context go.
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Run::Idle;
        }
        let Some(inner) = self.inner.upgrade() else {
            return Run::Idle;
        };
        if inner.paused.load(std::sync::atomic::Ordering::Acquire) {
            return Run::Deferred(now + Duration::from_millis(5));
        }
        let _ns = inner.netns.as_ref().and_then(|n| n.enter());
        inner.wake.clear();
        inner.progress();
        Run::Idle
    }
}

impl Inner {
    /// Tells the engine when the CM must run next: the earliest timer of any agent.
    /// Called with the state locked (so a concurrent `wake_by` is not overwritten).
    fn set_engine_wake(&self, st: &State) {
        let Some((_, reg)) = self.engine.get() else {
            return;
        };
        let mut next = st
            .devices
            .values()
            .filter_map(|d| d.agent.poll_timeout())
            .min()
            .map(|t| self.instant(t));
        if !st.returning.is_empty() {
            // a returning connection migrates back once its QP is armed: look again soon
            let soon = std::time::Instant::now() + crate::ha::lap::RETURN_POLL;
            next = Some(next.map_or(soon, |n| n.min(soon)));
        }
        reg.set_wake(next);
    }

    /// One non-blocking round: MADs in, agents, timers, MADs out, events; host changes.
    /// Returns the number of events queued.
    pub(crate) fn progress(self: &Arc<Self>) -> usize {
        let mut st = self.lock();
        let before: usize = st.channels.values().map(|c| c.queue.len()).sum();
        let now = self.now();
        let idx: Vec<u32> = st.devices.keys().copied().collect();
        for i in idx {
            // A request held by an API call's drain, then receive: while another run
            // looks a request of this device up, that run receives after it.
            st = self.settle_held(st, i);
            while !st.held.contains_key(&i) {
                let Some(d) = st.devices.get_mut(&i).filter(|d| !d.open.is_empty()) else {
                    break;
                };
                let m = match d.dev.gsi_recv() {
                    Ok(Some(m)) => m,
                    _ => break,
                };
                // The arrival path: answers to this MAD go back along it.
                let path = CmPath::new(
                    Ipv6Addr::from(m.local.gid()),
                    Ipv6Addr::from(m.remote.gid()),
                    m.ifindex,
                );
                tracing::trace!(target: "rdmacm::mad", local = %m.local, remote = %m.remote, attr = mad_attr(&m.mad), "MAD received");
                d.agent.handle_mad(now, path, &m.mad);
                // the answers of this round leave together (flushed below)
                self.drain_agent_queued(&mut st, i);
                st = self.settle_held(st, i);
            }
            // peers no one listens at any more (their process ended): a DREQ to them
            // ends now, not after its retries (`rdma_proto::cm::CmAgent::peer_unreachable`)
            if let Some(d) = st.devices.get_mut(&i) {
                while let Some((_, remote)) = d.dev.gsi_unreachable() {
                    d.agent.peer_unreachable(now, Ipv6Addr::from(remote.gid()));
                }
            }
            flush_gsi(&st, i);
            crate::ha::migrate::on_device_events(self, &mut st, i);
            // Timers.
            if let Some(d) = st.devices.get_mut(&i) {
                if d.agent.poll_timeout().is_some_and(|t| t <= now) {
                    d.agent.handle_timeout(now);
                    count_retransmits(&mut st, i);
                }
            }
            self.drain_agent(&mut st, i);
            st = self.settle_held(st, i);
        }
        if !st.returning.is_empty() {
            crate::ha::lap::poll_returns(&mut st);
        }
        // Host changes.
        let notes: Vec<Notification> = self
            .notifications
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for n in notes {
            self.on_notification(&mut st, n);
        }
        let host: Vec<rdma_hostview::Event> = self
            .host_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        if !host.is_empty() {
            st = self.apply_host_events(st, host);
        }
        self.set_engine_wake(&st);
        let after: usize = st.channels.values().map(|c| c.queue.len()).sum();
        after.saturating_sub(before)
    }

    /// For each port that came back, a LAP on the migrate ids that left it (their new
    /// alternate: the path through it). The route lookups run without the lock.
    fn lap_restored<'a>(
        self: &'a Arc<Self>,
        st: MutexGuard<'a, State>,
        ups: &[(u32, u8, u32)],
    ) -> MutexGuard<'a, State> {
        let wants: Vec<(u32, crate::context::id_entry::IdNum, IpAddr, u8, u32)> = ups
            .iter()
            .flat_map(|&(dev, port, link)| {
                crate::ha::lap::want_lap(&st, dev, port)
                    .into_iter()
                    .map(move |(id, peer, _)| (dev, id, peer, port, link))
            })
            .collect();
        if wants.is_empty() {
            return st;
        }
        drop(st);
        let found: Vec<(
            u32,
            crate::context::id_entry::IdNum,
            crate::ha::migrate::AltPath,
        )> = wants
            .into_iter()
            .filter_map(|(dev, id, peer, port, link)| {
                let alt =
                    self.block(move |r| async move { r.alternate(peer, &[(port, link)]).await })?;
                Some((dev, id, alt))
            })
            .collect();
        self.send_laps(found)
    }

    /// After a route change, a LAP on the migrate ids whose peer's route now leaves through
    /// another up port of their group than the one they use (a route that moved them away
    /// came back): their new alternate is the path through it. The lookups run without
    /// the lock.
    fn lap_route_back<'a>(self: &'a Arc<Self>, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let wants = crate::ha::lap::want_route_lap(&st);
        if wants.is_empty() {
            return st;
        }
        drop(st);
        let found: Vec<(
            u32,
            crate::context::id_entry::IdNum,
            crate::ha::migrate::AltPath,
        )> = wants
            .into_iter()
            .filter_map(|(dev, id, peer, current, ports)| {
                let alt = self.block(move |r| async move {
                    let oif = r.view().route_get(peer, None, None).await.ok()?.oif?;
                    let &(port, link) = ports.iter().find(|p| p.1 == oif)?;
                    if port == current {
                        return None;
                    }
                    r.alternate(peer, &[(port, link)]).await
                })?;
                Some((dev, id, alt))
            })
            .collect();
        self.send_laps(found)
    }

    /// Takes the lock again and sends a LAP for each (device, id, alternate) found.
    fn send_laps(
        self: &Arc<Self>,
        found: Vec<(
            u32,
            crate::context::id_entry::IdNum,
            crate::ha::migrate::AltPath,
        )>,
    ) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        for (dev, id, alt) in found {
            crate::ha::lap::send_lap(self, &mut st, dev, id, alt);
        }
        self.drain_all(&mut st);
        st
    }

    /// Sends what every agent has queued (after API-like calls made outside a MAD round).
    fn drain_all(self: &Arc<Self>, st: &mut State) {
        let devs: Vec<u32> = st.devices.keys().copied().collect();
        for i in devs {
            self.drain_agent(st, i);
        }
    }

    /// The device registry follows the host: an address added to a netdev enters its
    /// device's GID table (and the wildcard listeners' addresses), a removed one leaves it;
    /// a netdev that gets an address while a wildcard listener exists gets its device and
    /// the listener. After lost notifications (overrun) every GID table is re-read.
    /// Opening a device needs the resolver, so the lock is released for it.
    fn apply_host_events<'a>(
        self: &'a Arc<Self>,
        mut st: MutexGuard<'a, State>,
        host: Vec<rdma_hostview::Event>,
    ) -> MutexGuard<'a, State> {
        use rdma_hostview::Event as H;
        let mut new_dev: Vec<(u32, IpAddr)> = Vec::new();
        // Ports that came back: (device, port, netdev), for a LAP of the migrate policy.
        let mut ups: Vec<(u32, u8, u32)> = Vec::new();
        let mut resync = false;
        let mut routes = false;
        for ev in host {
            match ev {
                H::AddressAdded(a) => {
                    if let Some(d) = st.device_of(a.link) {
                        let _ = d.ensure_gid_on(a.link, a.addr);
                        let key = st.key_of(a.link);
                        crate::engine::listen::wildcard_listen_on(&mut st, key, a.addr);
                    } else if crate::engine::listen::has_wildcard_listener(&st) {
                        new_dev.push((a.link, a.addr));
                    }
                }
                H::AddressRemoved(a) => {
                    if let Some(d) = st.device_of(a.link) {
                        // 127.0.0.0/8 stays usable through lo's /8 route.
                        if !(d.netdev.loopback && a.addr.is_loopback()) {
                            d.remove_gid_on(a.link, a.addr);
                        }
                    }
                }
                // The port of the link follows it (`query_port`; on a device group the
                // transport's path migration acts on a port going down).
                H::LinkUp(l) | H::LinkDown(l) => {
                    let key = st.key_of(l.index);
                    if let Some(d) = st.device_of(l.index) {
                        if let Some(port) = d.port_of_link(l.index) {
                            let _ = d.dev.set_port_state(port, l.is_usable());
                            if l.is_usable() && d.links.len() > 1 {
                                ups.push((key, port, l.index));
                            }
                        }
                    }
                }
                H::RouteAdded(_) | H::RouteChanged(_) | H::RouteRemoved(_) => routes = true,
                H::Overrun => resync = true,
                _ => {}
            }
        }
        if !ups.is_empty() {
            st = self.lap_restored(st, &ups);
        }
        if routes || resync {
            st = self.lap_route_back(st);
        }
        if new_dev.is_empty() && !resync {
            return st;
        }
        // Every netdev of every device (a group's members), with its device's key.
        let known: Vec<(u32, u32)> = st
            .devices
            .iter()
            .flat_map(|(&k, d)| d.links.iter().map(move |&l| (k, l)))
            .collect();
        drop(st);
        for (link, _) in &new_dev {
            // ENODEV when the configuration leaves the netdev out: nothing to do.
            let _ = self.ensure_device(*link);
        }
        let tables: Vec<(u32, u32, Vec<IpAddr>)> = if resync {
            known
                .iter()
                .filter_map(|&(k, l)| {
                    self.block(move |r| async move { r.gid_table(l).await })
                        .ok()
                        .map(|g| (k, l, g.iter().map(|e| e.ip).collect()))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut st = self.lock();
        for (link, addr) in new_dev {
            let key = st.key_of(link);
            if st.devices.contains_key(&key) {
                crate::engine::listen::wildcard_listen_on(&mut st, key, addr);
            }
        }
        for (k, link, ips) in tables {
            let Some(d) = st.devices.get(&k) else {
                continue;
            };
            let port = d.port_of_link(link).unwrap_or(1);
            for g in d.dev.gids_on(port).unwrap_or_default() {
                let keep = ips.contains(&g.ip()) || (d.netdev.loopback && g.ip().is_loopback());
                if !keep {
                    d.remove_gid_on(link, g.ip());
                }
            }
            for ip in &ips {
                let _ = d.ensure_gid_on(link, *ip);
            }
        }
        st
    }

    /// The request of device `i` held for its path (`crate::context::held_request`), if no other run has
    /// it: its route lookup without the lock, then, locked again, the listener checked once
    /// more and the request finished, and the device's events that waited behind it.
    fn settle_held<'a>(
        self: &'a Arc<Self>,
        mut st: MutexGuard<'a, State>,
        i: u32,
    ) -> MutexGuard<'a, State> {
        loop {
            let Some(h) = st.held.get_mut(&i).filter(|h| !h.in_flight) else {
                return st;
            };
            h.in_flight = true;
            let (arrival, local, peer) = (h.arrival(), h.hdr.dst, h.hdr.src);
            // A REQ offering the peer's address on another rail (crate::ha::rails).
            let rail = crate::ha::rails::passive_query(&st, i, &st.held[&i]);
            // what this round queued leaves before the lookup
            flush_gsi(&st, i);
            drop(st);
            let hold = self
                .lookup_hold
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(hold) = hold {
                hold.enter();
            }
            let (r, found) = self.block(move |r| async move {
                let a = r.accept_path(arrival, local, peer).await;
                let found = match (&a, rail) {
                    (Ok(_), Some((offered, cands))) => r.alternate(offered, &cands).await,
                    _ => None,
                };
                (a, found)
            });
            st = self.lock();
            if let Some(h) = st.held.remove(&i) {
                crate::engine::listen::finish_held(self, &mut st, i, h, r, found);
            }
            self.drain_agent(&mut st, i);
        }
    }

    /// Sends what the agent of device `i` wants to send and turns its events into ours,
    /// until it has nothing left. While a request of the device is held for its path, only
    /// sends: the events after it wait for it.
    pub(crate) fn drain_agent(self: &Arc<Self>, st: &mut State, i: u32) {
        self.drain_agent_queued(st, i);
        flush_gsi(st, i);
    }

    /// [`Inner::drain_agent`] leaving its MADs in the wire's batch (see [`flush_gsi`]).
    fn drain_agent_queued(self: &Arc<Self>, st: &mut State, i: u32) {
        loop {
            let held = st.held.contains_key(&i);
            let Some(d) = st.devices.get_mut(&i) else {
                return;
            };
            let mut did = false;
            while let Some(t) = d.agent.poll_transmit() {
                did = true;
                send(d, &t);
            }
            if held {
                return;
            }
            if let Some(ap) = d.agent.poll_ap_event() {
                crate::ha::lap::on_ap_event(st, i, ap);
                continue;
            }
            let ev = d.agent.poll_event();
            match ev {
                Some(CmEvent::ReqReceived(r)) => crate::engine::listen::on_req(self, st, i, r),
                Some(CmEvent::SidrReqReceived(r)) => {
                    crate::engine::listen::on_sidr_req(self, st, i, r)
                }
                Some(ev) => self.on_cm_event(st, i, ev),
                None if !did => {
                    // an API call may have armed a timer: the engine must wake for it
                    if let (Some(t), Some((_, reg))) = (d.agent.poll_timeout(), self.engine.get()) {
                        reg.wake_by(self.instant(t));
                    }
                    return;
                }
                None => {}
            }
        }
    }
}

/// Lets a destroyed id's connection linger in its agent (timewait) and forgets it.
pub(crate) fn forget_conn(st: &mut State, now: u64, dev: u32, conn: ConnHandle) {
    if let Some(d) = st.devices.get_mut(&dev) {
        // The connection keeps its path in the agent: what it sends for the destroy (a
        // DREQ, a REJ) leaves on it after the id is gone.
        let _ = d.agent.destroy(now, conn);
        d.conns.remove(&conn);
    }
}

/// [`crate::cm::Cma::end_connections`]: every id's connection ends as its destroy would end
/// it, and what that sends leaves now.
pub(crate) fn end_all(inner: &Arc<Inner>) {
    let mut st = inner.lock();
    let now = inner.now();
    let conns: Vec<(u32, ConnHandle)> = st
        .ids
        .values_mut()
        .filter_map(|s| Some((s.dev?, s.conn.take()?)))
        .collect();
    let mut devs: Vec<u32> = conns.iter().map(|(i, _)| *i).collect();
    devs.sort_unstable();
    devs.dedup();
    for (i, c) in conns {
        forget_conn(&mut st, now, i, c);
    }
    for i in devs {
        inner.drain_agent(&mut st, i);
    }
}

/// Queues up to this long are cleaned of a destroyed id's events at once.
const SCAN_QUEUE: usize = 64;

/// `rdma_destroy_id`: drops queued events of the id, waits for the ones handed out, then
/// releases everything (the CM connection lingers in its agent for the timewait).
pub(crate) fn destroy(inner: &Arc<Inner>, num: IdNum) {
    let mut st = inner.lock();
    let (ch, queued) = match st.ids.get_mut(&num) {
        Some(s) => {
            s.state = IdState::Destroying;
            (s.channel, std::mem::take(&mut s.queued_events))
        }
        None => return,
    };
    // Only an id with queued events looks at the queue, and only a short queue is scanned:
    // in a long one (50,000 ids each destroyed with an event left, say) the events stay
    // and `take_pending` drops them, since id numbers are never reused.
    if let Some(c) = st.channels.get_mut(&ch).filter(|_| queued > 0) {
        if c.queue.len() <= SCAN_QUEUE {
            c.queue.retain(|e| e.id != num);
        }
        if c.queue.is_empty() {
            c.efd.clear();
        }
    }
    let mut st = inner.wait_acked(st, num);
    inner.unwatch(&mut st, num);
    let Some(s) = st.ids.remove(&num) else { return };
    if let Some(h) = s.bind {
        st.ports.release(h);
    }
    if let Some(l) = &s.listen {
        for (i, sid) in &l.regs {
            if let Some(d) = st.devices.get_mut(i) {
                if let Some(v) = d.listeners.get_mut(sid) {
                    v.retain(|x| *x != num);
                    if v.is_empty() {
                        d.listeners.remove(sid);
                        let _ = d.agent.unlisten(*sid);
                    }
                }
            }
        }
    }
    if let (Some(i), Some(c)) = (s.dev, s.conn) {
        let now = inner.now();
        forget_conn(&mut st, now, i, c);
        inner.drain_agent(&mut st, i);
    }
    // The QP goes with the id: the soft device allocates QP numbers cyclically, so its
    // number does not come back while the peer may still be in timewait for it.
    drop(s.qp);
}
