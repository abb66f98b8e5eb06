//! Sans-IO InfiniBand transport for a software RoCEv2 device.
//!
//! This crate owns no socket, clock, thread or random source. State machines take the current
//! time (`now`, monotonic nanoseconds as a `u64`) and an input, and expose what they want to send
//! and when they next need to be woken:
//!
//! - [`verbs`]: the verbs vocabulary shared with the software device (work requests,
//!   completions, QP states and attributes, access flags);
//! - [`memory`]: the [`memory::MemoryTable`] trait through which the transport reads and writes
//!   registered memory, with every access checked against key, protection domain, bounds and
//!   access flags, and [`memory::InMemoryTable`], a complete implementation for tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod memory;
pub mod packet;
pub mod psn;
pub mod rc;
pub mod sim;
pub mod ud;
pub mod verbs;
pub mod wire;
