//! Drop-in `libibverbs.so.1` and `librdmacm.so.1` over the software RoCEv2 device and the
//! `rdmacm` connection manager: rdma-core's C ABI (rdma-core 44's structs and symbol
//! versions), so that unmodified C programs (rping, ibv_rc_pingpong, perftest …) run
//! without a kernel RDMA driver.
//!
//! This crate builds a static library; `scripts/build-cabi.sh` links it into one shared
//! object with rdma-core's version nodes, named `libibverbs.so.1`, with `librdmacm.so.1` a
//! symlink to it (one copy of the runtime for both). See `docs/CABI.md`.
//!
//! Every exported function is `unsafe extern "C"`: its safety contract is rdma-core's (the
//! pointers it is given are NULL or objects this library made).
#![allow(clippy::missing_safety_doc)]
#![warn(missing_docs)]

pub mod cm;
pub mod cm_types;
pub mod config;
pub mod cq;
pub mod device;
pub mod layout;
pub mod marshall;
pub mod misc;
pub mod objects;
pub mod ops;
pub mod qp;
pub mod qp_ex;
pub mod rereg;
pub mod types;
pub mod unsupported;
pub mod util;
