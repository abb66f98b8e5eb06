//! Shared pieces of the command-line tools (`rping`, `cmtime`, `ucmatose`, `udaddy`,
//! `rdma-perf`, `rdmacm-demo`): argument parsing in the style of rdma-core's tools, event
//! printing by `rdma_event_str` name, and one-line failure reporting.
#![warn(missing_docs)]

/// Short-option parsing (`getopt` style), `-h` usage, one-line `tool: reason` failures.
pub mod cli;
/// `ucmatose` and `udaddy`: their shared options and client/server run.
pub mod cmatose_common;
/// `cmtime`: per-step CM timing over many connections.
pub mod cmtime;
/// `rdmacm-demo`: the connection manager and the software device in one short run.
pub mod demo;
/// A connection's PD/CQ/QP and the "next completion or CM event" wait (rping, ucmatose, udaddy).
pub mod endpoint;
/// CM event printing by `rdma_event_str` name and waiting for an expected event.
pub mod events;
/// `rdma-perf`: perftest's tests over connections made by the connection manager.
pub mod perf;
/// Progress of long steps: an indicatif bar on a terminal, plain lines otherwise.
pub mod progress;
