//! RoCEv2 and InfiniBand connection-manager wire formats.
//!
//! Each header has a typed, zero-copy view over a byte buffer (`Xxx<T: AsRef<[u8]>>`, with
//! `new_checked`, field getters and, for `AsMut`, setters) and a plain `XxxRepr` value with
//! `parse` and `emit`. Nothing here does I/O or allocates.
//!
//! Layers:
//! - transport: [`bth`], [`reth`], [`aeth`], [`deth`], [`imm`], [`atomic`], the [`opcode`]
//!   table, whole [`packet`]s and their [`icrc`];
//! - management: the common [`mad`] header, the CM messages in [`cm`], the IP CM service
//!   header and service ids in [`ip_cm`], and the IBA [`time`] encoding.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod field;
mod layout;

pub mod cm;
pub mod ip_cm;
pub mod mad;
pub mod time;

// Transport layer (RoCEv2).
pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod deth;
pub mod icrc;
pub mod imm;
pub mod opcode;
pub mod packet;
pub mod rdeth;
pub mod reth;

pub use error::{Error, Result};
