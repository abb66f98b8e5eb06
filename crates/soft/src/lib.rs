//! The software RoCEv2 device.
//!
//! Layers, bottom up:
//! - [`io`]: the datagram wire under the transport ([`io::DatagramWire`]), its UDP port 4791
//!   implementation ([`io::UdpWire`]) with batched `recvmmsg`/`sendmmsg` into preallocated
//!   buffers, and the fault injector switched on by `RDMA_SOFT_FAULTS`.
//! - [`verbs`]: device attributes, protection domains, memory regions (keys, bounds, access),
//!   completion queues with a completion channel, shared receive queues.
//!
//! Every public call returns [`Error`], which maps to the errno verbs would give
//! ([`Error::errno`]).
#![warn(missing_docs)]

mod error;
pub mod io;
pub mod verbs;

pub use error::{Error, Result};
