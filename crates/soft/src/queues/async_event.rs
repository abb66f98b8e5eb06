//! The device's asynchronous events (`ibv_get_async_event`): path migration of RC QPs and
//! port state changes, in a bounded queue with an eventfd to wait on.
//!
//! Events are queued by the runtime while it drives the QPs (a migration happens on a packet,
//! a timeout or a port going down) and by [`crate::verbs::Device::set_port_state`]. The queue holds
//! [`ASYNC_QUEUE_LEN`] events; when it is full the oldest is dropped and counted
//! ([`crate::verbs::Device::async_events_dropped`]). The eventfd ([`crate::verbs::Device::async_event_fd`]) polls
//! readable exactly while events are queued, so epoll and tokio (`AsyncFd`) users can wait
//! on it and then drain [`crate::verbs::Device::poll_async_event`].

use std::collections::VecDeque;
use std::os::fd::RawFd;

use rdma_proto::rc::{MigrationCause, QpEvent};

use crate::fd::EventFd;
use crate::{Error, Result};

/// Events the queue holds at most; older ones are dropped beyond it.
pub const ASYNC_QUEUE_LEN: usize = 256;

/// An asynchronous event of a device (`ibv_async_event`: the element and the event type).
///
/// ```
/// use rdma_soft::verbs::{AsyncEvent, MigrationCause};
/// let e = AsyncEvent::PathMigrated { qpn: 0x12, cause: MigrationCause::Forced, from_port: 1, to_port: 2 };
/// assert_eq!((e.event_type(), e.qpn(), e.port()), (6, Some(0x12), Some(2))); // IBV_EVENT_PATH_MIG
/// assert_eq!(AsyncEvent::PortError { port: 1 }.event_type(), 10); // IBV_EVENT_PORT_ERR
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_PATH_MIG`: the RC QP `qpn` moved to its alternate path, which is now its
    /// primary (`from_port` → `to_port`); its packets leave from the new path's addresses.
    PathMigrated {
        /// The QP.
        qpn: u32,
        /// Why: forced (port down, [`crate::verbs::QueuePair::migrate`]), retries exhausted on the
        /// old path, or the peer migrated.
        cause: MigrationCause,
        /// The port it left.
        from_port: u8,
        /// The port it uses now.
        to_port: u8,
    },
    /// `IBV_EVENT_PATH_MIG_ERR`: the path the QP migrated to exhausted its retries before
    /// anything was acknowledged on it; the QP then fails (`RetryExcErr`).
    PathMigrationFailed {
        /// The QP.
        qpn: u32,
        /// The port that failed.
        port: u8,
    },
    /// `IBV_EVENT_PORT_ACTIVE`: the port's netdev came up ([`crate::verbs::Device::set_port_state`]).
    PortActive {
        /// The port.
        port: u8,
    },
    /// `IBV_EVENT_PORT_ERR`: the port's netdev went down.
    PortError {
        /// The port.
        port: u8,
    },
}

impl AsyncEvent {
    /// The `ibv_event_type` value.
    pub fn event_type(&self) -> u32 {
        match self {
            AsyncEvent::PathMigrated { .. } => 6,
            AsyncEvent::PathMigrationFailed { .. } => 7,
            AsyncEvent::PortActive { .. } => 9,
            AsyncEvent::PortError { .. } => 10,
        }
    }

    /// The QP it is about (`element.qp`), for QP events.
    pub fn qpn(&self) -> Option<u32> {
        match *self {
            AsyncEvent::PathMigrated { qpn, .. } | AsyncEvent::PathMigrationFailed { qpn, .. } => {
                Some(qpn)
            }
            _ => None,
        }
    }

    /// The port it is about: a port event's port, the port a QP migrated to or failed on.
    pub fn port(&self) -> Option<u8> {
        match *self {
            AsyncEvent::PathMigrated { to_port, .. } => Some(to_port),
            AsyncEvent::PathMigrationFailed { port, .. }
            | AsyncEvent::PortActive { port }
            | AsyncEvent::PortError { port } => Some(port),
        }
    }

    /// The device event for a transport event of QP `qpn`.
    pub(crate) fn of_qp(qpn: u32, e: QpEvent) -> AsyncEvent {
        match e {
            QpEvent::PathMigrated {
                cause,
                from_port,
                to_port,
            } => AsyncEvent::PathMigrated {
                qpn,
                cause,
                from_port,
                to_port,
            },
            QpEvent::PathMigrationFailed { port } => AsyncEvent::PathMigrationFailed { qpn, port },
        }
    }
}

/// The bounded queue (lives in the runtime, under its lock) and its eventfd.
pub(crate) struct AsyncQueue {
    q: VecDeque<AsyncEvent>,
    efd: EventFd,
    dropped: u64,
    taps: super::async_tap::Taps,
}

impl AsyncQueue {
    pub fn new() -> Result<AsyncQueue> {
        let efd = EventFd::new().map_err(|source| Error::Os {
            op: "eventfd",
            addr: None,
            source,
        })?;
        Ok(AsyncQueue {
            q: VecDeque::with_capacity(ASYNC_QUEUE_LEN),
            efd,
            dropped: 0,
            taps: super::async_tap::Taps::default(),
        })
    }

    /// Queues `e`, dropping the oldest when full; the fd becomes readable.
    pub fn push(&mut self, e: AsyncEvent) {
        if self.q.len() >= ASYNC_QUEUE_LEN {
            self.q.pop_front();
            self.dropped += 1;
        }
        tracing::debug!(event = ?e, "async event");
        self.q.push_back(e);
        self.efd.signal();
        self.taps.push(e);
    }

    /// The taps fed by [`AsyncQueue::push`].
    pub fn taps(&mut self) -> &mut super::async_tap::Taps {
        &mut self.taps
    }

    /// The oldest event; the fd is cleared with the last one.
    pub fn pop(&mut self) -> Option<AsyncEvent> {
        let e = self.q.pop_front();
        if self.q.is_empty() {
            self.efd.clear();
        }
        e
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn fd(&self) -> RawFd {
        self.efd.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fd::wait_readable;
    use std::time::Instant;

    #[test]
    fn bounded_drop_oldest_and_fd_level() {
        let mut q = AsyncQueue::new().unwrap();
        let now = Some(Instant::now());
        assert!(!wait_readable(&[q.fd()], now).unwrap());
        for port in 0..ASYNC_QUEUE_LEN + 3 {
            q.push(AsyncEvent::PortError { port: port as u8 });
        }
        assert_eq!(q.dropped(), 3);
        assert!(wait_readable(&[q.fd()], now).unwrap());
        let mut got = Vec::new();
        while let Some(e) = q.pop() {
            got.push(e.port().unwrap());
            // readable exactly while events remain
            assert_eq!(
                wait_readable(&[q.fd()], Some(Instant::now())).unwrap(),
                got.len() < ASYNC_QUEUE_LEN
            );
        }
        assert_eq!(got.len(), ASYNC_QUEUE_LEN);
        assert_eq!(got[0], 3, "the three oldest were dropped");
    }
}
