//! The pieces behind rdmacm-rs's command-line tools, which keep rdma-core's and perftest's
//! names, flags and output: `rping`, `cmtime`, `ucmatose`, `udaddy`, `rdma-perf`
//! (`send_lat` ... `read_bw`) and `rdmacm-demo`.
//!
//! | module | what |
//! | --- | --- |
//! | [`cli`] | getopt-style options (the `getopts` crate), `-h` usage, one-line `tool: reason` failures |
//! | [`events`] | CM events by their `rdma_event_str` names, waiting for an expected event |
//! | [`endpoint`] | a connection's PD/CQ/QP and the "next completion or CM event" wait |
//! | [`cmatose_common`] | what `ucmatose` and `udaddy` share |
//! | [`cmtime`] | per-step timing of CM connection setup and teardown |
//! | [`perf`] | perftest's tests over CM-made connections |
//! | [`demo`] | the connection manager and the software device in one short run |
//! | [`progress`] | progress of long steps: a bar on a terminal, plain lines otherwise |
//! | [`log`] | `-d` / `RUST_LOG` onto a `tracing` subscriber writing to stderr |
//! | [`inspect`] | `ibv_devices`, `ibv_devinfo` and `rdma-soft` views of every process's soft devices |
//!
//! Every tool fails with one line on stderr and exit status 1:
//!
//! ```
//! use rdma_tools::cli::getopt;
//! let args = ["-x"].map(String::from);
//! assert_eq!(getopt(&args, "sc").unwrap_err(), "invalid option -- 'x'");
//! ```
#![warn(missing_docs)]

pub mod cli;
pub mod cmatose_common;
pub mod cmtime;
pub mod demo;
pub mod endpoint;
pub mod events;
pub mod inspect;
pub mod log;
pub mod perf;
pub mod progress;
