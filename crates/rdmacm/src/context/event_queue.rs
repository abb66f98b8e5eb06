//! Event queues: pending events per channel, acknowledgement and the waits of destroy.

use std::sync::MutexGuard;

use crate::context::id_entry::{IdNum, IdState};
use crate::context::state::State;
use crate::context::Inner;
use crate::error::Error;
use crate::params::{ConnEventParam, EventType, PendingEvent, UdParam};

impl Inner {
    /// Queues an event for an id's channel.
    pub(crate) fn push_event(st: &mut State, ev: PendingEvent) {
        let Some(slot) = st.ids.get_mut(&ev.id) else {
            return;
        };
        slot.counters.events += 1;
        slot.queued_events += 1;
        let own = slot.channel;
        let ch = match ev.listen_id.and_then(|l| st.ids.get(&l)) {
            Some(l) if ev.kind == EventType::ConnectRequest => l.channel,
            _ => own,
        };
        if let Some(c) = st.channels.get_mut(&ch) {
            if c.queue.is_empty() {
                c.efd.signal();
            }
            c.queue.push_back(ev);
        }
    }

    pub(crate) fn event(
        st: &mut State,
        id: IdNum,
        kind: EventType,
        status: i32,
        param: ConnEventParam,
    ) {
        Inner::push_event(
            st,
            PendingEvent {
                id,
                kind,
                status,
                param,
                ud: None,
                listen_id: None,
                mc: None,
                addr: None,
            },
        );
    }

    pub(crate) fn event_ud(st: &mut State, id: IdNum, ud: UdParam, param: ConnEventParam) {
        Inner::push_event(
            st,
            PendingEvent {
                id,
                kind: EventType::Established,
                status: 0,
                param,
                ud: Some(ud),
                listen_id: None,
                mc: None,
                addr: None,
            },
        );
    }

    /// A wildcard listener could not open `addr`: logged at warn and, when another process
    /// holds UDP 4791 there (`EADDRINUSE`), reported to the listener as ADDR_CHANGE with
    /// `-EADDRINUSE` and the address ([`crate::Event::addr`]). Other errors (an IPv6
    /// address still tentative, one gone meanwhile) pass: the address is opened when it
    /// appears (again).
    pub(crate) fn listen_addr_lost(st: &mut State, id: IdNum, addr: std::net::IpAddr, e: &Error) {
        tracing::warn!(
            target: "rdmacm",
            id,
            addr = %addr,
            error = %e,
            "wildcard listen: address skipped (is UDP 4791 held by another process?)"
        );
        if e.errno() != libc::EADDRINUSE {
            return;
        }
        // once while one is queued (address events may repeat after a table re-read)
        let queued = st
            .ids
            .get(&id)
            .and_then(|s| st.channels.get(&s.channel))
            .is_some_and(|c| {
                c.queue
                    .iter()
                    .any(|e| e.id == id && e.kind == EventType::AddrChange && e.addr == Some(addr))
            });
        if queued {
            return;
        }
        Inner::push_event(
            st,
            PendingEvent {
                id,
                kind: EventType::AddrChange,
                status: -e.errno(),
                param: ConnEventParam::default(),
                ud: None,
                listen_id: None,
                mc: None,
                addr: Some(addr),
            },
        );
    }

    /// An event was dropped by the application.
    pub(crate) fn ack(&self, id: IdNum) {
        let mut st = self.lock();
        if let Some(s) = st.ids.get_mut(&id) {
            s.outstanding = s.outstanding.saturating_sub(1);
        }
        let waiting = st.ack_waiters > 0;
        drop(st);
        if waiting {
            self.acked.notify_all();
        }
    }

    /// Waits until `id` has no outstanding event (`rdma_destroy_id`).
    pub(crate) fn wait_acked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        id: IdNum,
    ) -> MutexGuard<'a, State> {
        while st.ids.get(&id).is_some_and(|s| s.outstanding > 0) {
            st.ack_waiters += 1;
            st = self.acked.wait(st).unwrap_or_else(|e| e.into_inner());
            st.ack_waiters -= 1;
        }
        st
    }

    /// Takes the next event of channel `ch`, with the context value of its id.
    pub(crate) fn take_pending(&self, ch: u64) -> Option<(PendingEvent, u64)> {
        let mut st = self.lock();
        let ev = loop {
            let c = st.channels.get_mut(&ch)?;
            let Some(ev) = c.queue.pop_front() else {
                c.efd.clear();
                return None;
            };
            if c.queue.is_empty() {
                c.efd.clear();
            }
            // An event of a destroyed id left behind by a long queue (`cm_engine::destroy`;
            // id numbers are never reused), or queued while its id is being destroyed (which
            // waits for the events handed out before): dropped here, as rdma_destroy_id
            // discards what was not retrieved.
            if st
                .ids
                .get(&ev.id)
                .is_some_and(|s| s.state != IdState::Destroying)
            {
                break ev;
            }
            if let Some(ls) = ev
                .listen_id
                .filter(|_| ev.kind == EventType::ConnectRequest)
                .and_then(|l| st.ids.get_mut(&l))
                .and_then(|l| l.listen.as_mut())
            {
                ls.queued = ls.queued.saturating_sub(1);
            }
        };
        if ev.kind == EventType::ConnectRequest {
            if let Some(l) = ev.listen_id.and_then(|l| st.ids.get_mut(&l)) {
                if let Some(ls) = l.listen.as_mut() {
                    ls.queued = ls.queued.saturating_sub(1);
                }
            }
        }
        let mut context = 0;
        if let Some(s) = st.ids.get_mut(&ev.id) {
            s.queued_events = s.queued_events.saturating_sub(1);
            s.outstanding += 1;
            context = s.context;
        }
        if ev.kind == EventType::ConnectRequest {
            if let Some(l) = ev.listen_id.and_then(|l| st.ids.get(&l)) {
                context = l.context;
            }
        }
        Some((ev, context))
    }
}
