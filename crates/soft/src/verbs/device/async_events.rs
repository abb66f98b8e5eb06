//! The device's asynchronous events as verbs: polling, waiting and the eventfd of its queue
//! ([`crate::queues::async_event`]), and taps ([`AsyncTap`]).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::Device;
use crate::queues::{AsyncEvent, AsyncTap};
use crate::Result;

impl Device {
    /// The next asynchronous event without blocking (`ibv_get_async_event` on a
    /// non-blocking fd), oldest first.
    ///
    /// ```
    /// use rdma_soft::verbs::{AsyncEvent, Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// assert_eq!(dev.poll_async_event(), None);
    /// dev.set_port_state(1, false).unwrap();
    /// assert_eq!(dev.poll_async_event(), Some(AsyncEvent::PortError { port: 1 }));
    /// dev.set_port_state(1, false).unwrap(); // no change, no event
    /// assert_eq!(dev.poll_async_event(), None);
    /// ```
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.shared().runtime().async_events().pop()
    }

    /// Waits up to `timeout` (forever with `None`) for an asynchronous event, in `poll(2)`
    /// on [`Device::async_event_fd`] (the progress engine drives the device meanwhile).
    pub fn wait_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.poll_async_event() {
                return Ok(Some(e));
            }
            if end.is_some_and(|e| Instant::now() >= e) {
                return Ok(None);
            }
            crate::wait::wait_fds(&[self.async_event_fd().as_raw_fd()], end)?;
        }
    }

    /// An fd (eventfd) that polls readable while asynchronous events are queued: register it
    /// with epoll or tokio's `AsyncFd`, then drain [`Device::poll_async_event`]. It lives as
    /// long as the device (keep a clone of the [`Device`] next to a registration).
    #[allow(unsafe_code)]
    pub fn async_event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the eventfd is owned by the runtime, which lives as long as the device
        // state this borrow holds on to.
        unsafe { BorrowedFd::borrow_raw(self.shared().async_fd()) }
    }

    /// Events dropped because the queue was full ([`ASYNC_QUEUE_LEN`](crate::queues::ASYNC_QUEUE_LEN)).
    pub fn async_events_dropped(&self) -> u64 {
        self.shared().runtime().async_events().dropped()
    }
}

impl Device {
    /// A tap on the device's asynchronous events: a copy of every later one, taken
    /// independently of [`Device::poll_async_event`] and of other taps.
    pub fn async_tap(&self) -> Result<AsyncTap> {
        self.shared().runtime().async_events().taps().add()
    }
}
