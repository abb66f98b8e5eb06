//! The software RoCEv2 device.
//!
//! Layers, bottom up (a module imports only from those before it; `scripts/rdmacm_use_cycles.py`
//! checks it and names the exceptions):
//! - [`io`]: the datagram wire under the transport ([`io::DatagramWire`]), its UDP port 4791
//!   implementation ([`io::UdpWire`], `io/udp/`) with batched `recvmmsg`/`sendmmsg` into
//!   preallocated buffers, the sharing of an address between processes (`io/share/`), the
//!   host-local wire ([`io::local`]) and the fault injector switched on by `RDMA_SOFT_FAULTS`.
//! - [`config`]: every setting as one value ([`SoftConfig`]); [`SoftConfig::from_env`] is
//!   the one reader of the `RDMA_SOFT_*` variables (docs/CONFIG.md).
//! - [`inspect`]: the inspection socket; a device registers its snapshot with it.
//! - `queues`: what the runtime fills and the verbs hand out: completion queue rings and
//!   channels, the queue under a shared receive queue, the device's asynchronous event queue
//!   (the public types are re-exported by [`verbs`]).
//! - [`gsi`]: the GSI (QP1) MAD queue the connection manager uses.
//! - the runtime and its [`engine`]: a device always makes progress, as a NIC does. One engine
//!   thread per process sleeps in `epoll` on every device's wire and the earliest transport
//!   deadline, and receives, acknowledges, answers READs, retransmits and times out whatever
//!   the application does (asleep, blocked, computing). The fast path stays in the caller's
//!   thread: posting a work request transmits at once, and polling an empty CQ drives the
//!   device inline (the engine then leaves it to the poller until it stops polling).
//! - [`verbs`]: the device, its attributes and ports, protection domains, memory regions
//!   (keys, bounds, access), completion queues with a completion channel, shared receive
//!   queues, queue pairs, and the device's GSI verbs.
//!
//! Every public call returns [`Error`], which maps to the errno verbs would give
//! ([`Error::errno`]).
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod addr;
pub mod config;
// The unsafe code of the crate (`#![deny(unsafe_code)]` above) is in the modules marked
// `#[allow(unsafe_code)]` here and in `io` and `verbs`, and in a few named functions; each
// unsafe block has its SAFETY comment.
pub mod engine;
mod error;
#[allow(unsafe_code)] // eventfd, poll, epoll, flock, user ids: the safe wrappers
pub mod fd;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gsi;
pub mod inspect;
pub mod io;
mod maps;
#[allow(unsafe_code)]
// the mmap/memfd edge: Mapping (unmapped on drop), InPlace, memfd_create, seals
mod memfd;
mod pull;
mod queues;
mod quota;
mod ratelimit;
mod runtime;
pub mod verbs;
mod wait;

pub use config::{SoftConfig, SoftConfigBuilder};
pub use error::{Error, Result};
pub use pull::{DEFAULT_MIN as PULL_DEFAULT_MIN, PULL_ENV, PULL_IN_PLACE_ENV};
pub use runtime::{RuntimeStats, ROUNDS, SEND_WINDOW};
