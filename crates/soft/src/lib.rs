//! The software RoCEv2 device.
//!
//! Layers, bottom up:
//! - [`io`]: the datagram wire under the transport ([`io::DatagramWire`]), its UDP port 4791
//!   implementation ([`io::UdpWire`]) with batched `recvmmsg`/`sendmmsg` into preallocated
//!   buffers, and the fault injector switched on by `RDMA_SOFT_FAULTS`.
//! - [`verbs`]: device attributes, protection domains, memory regions (keys, bounds, access),
//!   completion queues with a completion channel, shared receive queues, queue pairs.
//! - the runtime: run to completion in the caller's thread. Posting a send transmits at once;
//!   polling an empty CQ, waiting on a completion channel or [`verbs::Device::progress`]
//!   drains the wire, feeds each packet to its QP's transport (rdma-proto), runs timers and
//!   transmits the results; [`verbs::Device::spawn_progress`] starts an optional thread that
//!   does it asynchronously.
//!
//!   Unlike a NIC, nothing answers the peer while no thread drives the device: a side that
//!   stops polling after its last completion (and is not waiting in the connection manager's
//!   `get_event`, which drives its devices) cannot re-ACK a peer whose last ACK was lost, and
//!   the peer ends in `RetryExcErr`. Keep polling while peers may still send, or run the
//!   progress thread.
//!
//! - [`gsi`]: the GSI (QP1) MAD path the connection manager uses.
//!
//! Every public call returns [`Error`], which maps to the errno verbs would give
//! ([`Error::errno`]).
#![warn(missing_docs)]

mod error;
pub mod gsi;
pub mod io;
mod progress;
mod runtime;
pub mod verbs;

pub use error::{Error, Result};
pub use progress::ProgressThread;
pub use runtime::{RuntimeStats, ROUNDS, SEND_WINDOW};
