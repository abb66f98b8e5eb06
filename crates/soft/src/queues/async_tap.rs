//! More than one consumer of a device's asynchronous events: a tap gets a copy of every
//! event queued after it was made, in a bounded queue and with an eventfd of its own, so
//! that a library driving the device (the connection manager follows path migrations with
//! one) never takes events from the application's [`crate::verbs::Device::poll_async_event`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, Weak};

use super::async_event::{AsyncEvent, ASYNC_QUEUE_LEN};
use crate::fd::EventFd;
use crate::{Error, Result};

struct TapQueue {
    q: VecDeque<AsyncEvent>,
    dropped: u64,
}

struct TapInner {
    q: Mutex<TapQueue>,
    efd: EventFd,
}

/// A copy of a device's asynchronous events ([`crate::verbs::Device::async_tap`]); dropping it stops
/// the copies.
///
/// ```
/// use rdma_soft::verbs::{AsyncEvent, Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let tap = dev.async_tap().unwrap();
/// dev.set_port_state(1, false).unwrap();
/// // both see it
/// assert_eq!(tap.poll(), Some(AsyncEvent::PortError { port: 1 }));
/// assert_eq!(dev.poll_async_event(), Some(AsyncEvent::PortError { port: 1 }));
/// assert_eq!(tap.poll(), None);
/// ```
pub struct AsyncTap {
    inner: Arc<TapInner>,
}

impl std::fmt::Debug for AsyncTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncTap")
            .field("fd", &self.inner.efd.raw())
            .finish()
    }
}

impl AsyncTap {
    /// The oldest event not yet taken from this tap.
    pub fn poll(&self) -> Option<AsyncEvent> {
        let mut q = self.inner.q.lock().unwrap_or_else(|e| e.into_inner());
        let e = q.q.pop_front();
        if q.q.is_empty() {
            self.inner.efd.clear();
        }
        e
    }

    /// Readable while this tap holds events (epoll, `AsyncFd`, the CM's engine).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.efd.as_fd()
    }

    /// Events this tap dropped because it held [`ASYNC_QUEUE_LEN`] already.
    pub fn dropped(&self) -> u64 {
        self.inner
            .q
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dropped
    }
}

/// The device side: the live taps, fed by `AsyncQueue::push`.
#[derive(Default)]
pub(crate) struct Taps(Vec<Weak<TapInner>>);

impl Taps {
    pub fn add(&mut self) -> Result<AsyncTap> {
        let efd = EventFd::new().map_err(|source| Error::Os {
            op: "eventfd",
            addr: None,
            source,
        })?;
        let inner = Arc::new(TapInner {
            q: Mutex::new(TapQueue {
                q: VecDeque::new(),
                dropped: 0,
            }),
            efd,
        });
        self.0.retain(|w| w.strong_count() > 0);
        self.0.push(Arc::downgrade(&inner));
        Ok(AsyncTap { inner })
    }

    /// Copies `e` to every live tap (events are rare: a migration, a port change).
    pub fn push(&mut self, e: AsyncEvent) {
        self.0.retain(|w| {
            let Some(t) = w.upgrade() else { return false };
            let mut q = t.q.lock().unwrap_or_else(|e| e.into_inner());
            if q.q.len() >= ASYNC_QUEUE_LEN {
                q.q.pop_front();
                q.dropped += 1;
            }
            q.q.push_back(e);
            t.efd.signal();
            true
        });
    }

    #[cfg(test)]
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        self.0
            .iter()
            .filter_map(Weak::upgrade)
            .map(|t| t.efd.raw())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_taps_are_forgotten_and_full_ones_drop_their_oldest() {
        let mut taps = Taps::default();
        let a = taps.add().unwrap();
        let b = taps.add().unwrap();
        drop(b);
        for port in 0..ASYNC_QUEUE_LEN + 2 {
            taps.push(AsyncEvent::PortError { port: port as u8 });
        }
        assert_eq!(taps.fds().len(), 1);
        assert_eq!(a.dropped(), 2);
        assert_eq!(a.poll(), Some(AsyncEvent::PortError { port: 2 }));
    }
}
