//! The async layer (tokio), built on the event-channel API: [`Listener`] and
//! [`Connection`], with a message data path ([`Connection::send`], [`Connection::recv`]),
//! a byte stream over it ([`RdmaStream`]: `AsyncRead` + `AsyncWrite`), one-sided
//! operations ([`Connection::write`], [`Connection::read`] with a [`RemoteBuf`]), owned
//! zero-copy buffers ([`Buf`], [`BufPool`]), completions as a `Stream` for verbs users
//! ([`CompletionStream`]) and TCP-like teardown ([`Connection::closed`],
//! [`Connection::disconnect`]).
//!
//! Each listener and connection has its own [`EventChannel`]; the process's progress engine
//! drives the CM and the devices (an async caller is never inside `get_event` and never
//! spins). A connect's netlink questions and neighbour resolution are awaited on the
//! caller's runtime (a resolver call that has to wait runs on the context's own runtime
//! meanwhile; no thread waits for it); creating a connection's memory and QP, and a
//! listener's bind and listen, run on tokio's blocking pool.
//!
//! # The message layer
//!
//! A [`Connection`] owns its QP's data path. Its CQ has a completion channel, registered
//! with tokio's reactor (`AsyncFd`); one task per connection sleeps on that fd and on the
//! connection's event channel, takes the completions the engine queued, and wakes the
//! futures waiting for them. A waiting future also watches the fd itself and takes the
//! completions without the hop through that task. Nothing polls in a loop: an idle
//! connection costs no CPU.
//!
//! Messages travel in buffers the library registered when the connection was made: a
//! window's worth of send buffers and window + [`CONTROL_WINDOW`] receive buffers of the
//! largest message's size each ([`WINDOW`] and [`MAX_MESSAGE`] by default, settings of
//! [`ConnectOptions`] and [`ListenerBuilder`]), all receives posted before the REQ or REP leaves, so the
//! first message never meets an empty receive queue. [`Connection::send`] copies into a
//! free send buffer and posts a SEND with immediate data; [`Connection::send_buf`] sends an
//! owned [`Buf`] without a copy; [`Connection::recv`] copies a received message out and
//! reposts its buffer.
//!
//! ## Credits
//!
//! Both sides use the same window, the smaller of their two settings (a side whose
//! settings are not the defaults sends them at the end of its REQ's or REP's private
//! data; one that sends none has the defaults), and the smaller largest message: a sender
//! starts with a window of data credits and [`CONTROL_WINDOW`] control credits, one per receive
//! the peer has posted, and spends one per message, so a SEND never finds the peer's
//! receive queue empty (no RNR NAK, no retry). The 32-bit immediate of every SEND returns
//! credits: bits 0-15 are data receives the sender reposted since its last SEND (its
//! application took those messages), bits 16-23 control receives it reposted, bit 31 marks
//! a control message (no payload, not delivered). Returns ride on data messages; a side
//! that only receives sends a control message when it holds window / 2 unreturned
//! credits, or as soon as the peer may have none left. Control messages spend control
//! credits, which come back on the peer's next data message, so credit traffic never
//! feeds on itself.
//!
//! # Setup hooks
//!
//! [`Listener::incoming`] hands out a request before anything is created for it
//! ([`Incoming`]: its device, the peer's private data); [`Connection::resolve`] does the
//! same on the active side ([`Resolved`]). Between the two steps an application allocates
//! its own PD on that device, registers memory in it and puts the region's [`RemoteBuf`]
//! in the REP's or REQ's private data; [`Setup`] gives the PD and the CQ and QP sizes.

mod completions;
mod connection;
mod driver;
mod listener;
mod messages;
mod multicast;
mod options;
mod owned;
mod reconnect;
mod remote;
mod setup;
mod shared;
mod sizes;
mod stream;

use std::time::Duration;

pub use completions::CompletionStream;
pub use connection::{Connection, Resolved};
pub use listener::{AcceptOptions, Incoming, Listener, ListenerBuilder};
pub use multicast::{Datagram, Multicast};
pub use options::ConnectOptions;
pub use owned::{Buf, BufPool};
pub use reconnect::Reconnected;
pub use remote::RemoteBuf;
pub use setup::Setup;
pub use stream::RdmaStream;

use crate::cm::event::Event;
use crate::error::{Error, Result};
use crate::params::EventType;

/// Largest message [`Connection::send`] takes and [`Connection::recv`] returns (64 KiB), by
/// default: [`ConnectOptions::max_message`] and [`ListenerBuilder::max_message`] set it
/// per side, and a connection uses the smaller of its two ends' ([`Connection::max_message`]).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Messages a [`Connection`] may have in flight toward its peer (data receives each side
/// posts, and send buffers each side registers), by default: [`ConnectOptions::window`] and
/// [`ListenerBuilder::window`] set it per side, and a connection uses the smaller of its two
/// ends' ([`Connection::window`]).
pub const WINDOW: u32 = 16;
/// Extra receives each side posts for credit-only control messages.
pub const CONTROL_WINDOW: u32 = 2;
/// One-sided operations ([`Connection::write`], [`Connection::read`]) and owned sends
/// ([`Connection::send_buf`]) a connection keeps outstanding at most; more wait for one to
/// complete.
pub const MAX_RDMA_OPS: usize = 64;
/// How long [`Connection::disconnect`] waits for the peer's answer at most, beyond the CM's
/// own bound (the DREQ's retries end in DISCONNECTED too).
pub const DISCONNECT_WAIT: Duration = Duration::from_secs(30);
/// Largest private data of a REQ ([`ConnectOptions::private_data`]): 92 bytes less the
/// 36-byte IP CM header.
pub const MAX_REQ_PRIVATE_DATA: usize = 56;
/// Largest private data of a REP ([`AcceptOptions::private_data`]).
pub const MAX_REP_PRIVATE_DATA: usize = 196;

const TAG_SHIFT: u32 = 62;
/// One-sided operations and owned sends (tag 0: the wr_id is the operation's number).
const TAG_OP: u64 = 0;
const TAG_RECV: u64 = 1;
const TAG_SEND: u64 = 2;
const TAG_CTRL: u64 = 3;
const IMM_CTRL: u32 = 1 << 31;

fn tag(kind: u64, slot: u32) -> u64 {
    (kind << TAG_SHIFT) | slot as u64
}

fn event_error(ev: &Event) -> Error {
    match ev.kind() {
        EventType::Rejected => Error::ConnectionRefused(ev.status().max(0) as u16),
        EventType::Unreachable => Error::TimedOut,
        _ if ev.status() < 0 => Error::Io(std::io::Error::from_raw_os_error(-ev.status())),
        _ => Error::InvalidArgument(format!("unexpected event {}", ev.kind())),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?
}

/// docs/ASYNC.md's code blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/ASYNC.md")]
struct AsyncDocDoctests;
