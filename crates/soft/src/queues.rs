//! The queues the application and the runtime share: completion queues and their channels,
//! the queue under a shared receive queue, the device's asynchronous event queue, and the lock-free ring
//! they are built on ([`mpmc`]). The runtime fills them, the verbs layer hands them out
//! ([`crate::verbs`] re-exports the public types).

pub(crate) mod async_event;
pub(crate) mod async_tap;
pub(crate) mod cq;
pub(crate) mod cq_wake;
#[allow(unsafe_code)] // the lock-free ring's slots (UnsafeCell, MaybeUninit)
pub(crate) mod mpmc;
pub(crate) mod srq;

pub(crate) use async_event::AsyncQueue;
pub use async_event::{AsyncEvent, ASYNC_QUEUE_LEN};
pub use async_tap::AsyncTap;
pub use cq::{CompletionChannel, CompletionQueue};
pub use srq::SrqAttr;
