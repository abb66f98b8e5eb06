//! [`ConnectOptions`]: how [`Connection::connect`](super::Connection::connect) connects.

use std::net::SocketAddr;
use std::time::Duration;

use super::setup::Setup;
use super::sizes::MsgSizes;
use super::{MAX_MESSAGE, WINDOW};
use crate::cm::cma::Cma;
use crate::error::Result;
use crate::ha_policy::HaPolicy;
use crate::params::ConnParam;

/// How [`Connection::connect`](super::Connection::connect) connects: a builder ([`ConnectOptions::new`], then a method
/// per setting); the fields are readable, and [`Resolved::options_mut`](super::Resolved::options_mut) changes them
/// between resolution and connect.
///
/// ```
/// use std::time::Duration;
/// let o = rdmacm::ConnectOptions::new()
///     .private_data(b"hello".to_vec())
///     .src("127.0.0.1:0".parse().unwrap())
///     .connect_timeout(Duration::from_secs(5));
/// assert_eq!(o.timeout, Duration::from_secs(2));
/// assert_eq!(o.connect_timeout, Some(Duration::from_secs(5)));
/// assert_eq!(o.private_data, b"hello");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Private data for the REQ (at most [`super::MAX_REQ_PRIVATE_DATA`], 56 bytes; more is
    /// `EINVAL`).
    pub private_data: Vec<u8>,
    /// Address and route resolution timeout (each step).
    pub timeout: Duration,
    /// A bound on the whole connect, resolution to ESTABLISHED (`ETIMEDOUT` after it;
    /// `None`: the CM's own retries bound the REQ, with the default CM timeouts about 74 s
    /// for a peer that never answers).
    pub connect_timeout: Option<Duration>,
    /// Source address to bind first (`None`: chosen by the route).
    pub src: Option<SocketAddr>,
    /// Everything else of the REQ (its `private_data` is replaced by the field above).
    pub conn_param: ConnParam,
    /// PD, CQ and QP sizes.
    pub setup: Setup,
    /// The context (`None`: [`Cma::global`]).
    pub cma: Option<Cma>,
    /// The id's HA policy (`None`: the context's, `RDMACM_HA`); with
    /// [`crate::cm::HaPolicy::Align`] the connection closes with [`CloseReason::PathMoved`](crate::CloseReason::PathMoved)
    /// when its path moves off its netdev, and [`Connection::reconnect`](super::Connection::reconnect) follows it.
    pub ha: Option<HaPolicy>,
    /// Messages in flight toward the peer, this side's (default [`WINDOW`]; 2 to 4096): the
    /// connection uses the smaller of both ends' ([`ConnectOptions::window`]).
    pub window: u32,
    /// Largest message, this side's (default [`MAX_MESSAGE`]; 64 B to 16 MiB): the
    /// connection uses the smaller of both ends' ([`ConnectOptions::max_message`]).
    pub max_message: usize,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            private_data: Vec::new(),
            timeout: Duration::from_secs(2),
            connect_timeout: None,
            src: None,
            conn_param: ConnParam::default(),
            setup: Setup::default(),
            cma: None,
            ha: None,
            window: WINDOW,
            max_message: MAX_MESSAGE,
        }
    }
}

impl ConnectOptions {
    /// The defaults: no private data, 2 s per resolution step, no bound on the whole
    /// connect, no source address, the global context and its HA policy.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Private data for the REQ ([`ConnectOptions::private_data`]).
    pub fn private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// Address and route resolution timeout, each step ([`ConnectOptions::timeout`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A bound on the whole connect ([`ConnectOptions::connect_timeout`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The source address to bind first ([`ConnectOptions::src`]).
    pub fn src(mut self, src: SocketAddr) -> Self {
        self.src = Some(src);
        self
    }

    /// The rest of the REQ ([`ConnectOptions::conn_param`]).
    pub fn conn_param(mut self, param: ConnParam) -> Self {
        self.conn_param = param;
        self
    }

    /// PD, CQ and QP sizes ([`ConnectOptions::setup`]).
    pub fn setup(mut self, setup: Setup) -> Self {
        self.setup = setup;
        self
    }

    /// The context ([`ConnectOptions::cma`]; default: [`Cma::global`]).
    pub fn cma(mut self, cma: Cma) -> Self {
        self.cma = Some(cma);
        self
    }

    /// The id's HA policy ([`ConnectOptions::ha`]).
    pub fn ha(mut self, policy: HaPolicy) -> Self {
        self.ha = Some(policy);
        self
    }

    /// This side's window: messages in flight toward the peer, each a receive posted and a
    /// send buffer registered (default [`WINDOW`]; 2 to 4096, else the connect fails with
    /// `EINVAL`). Both ends use the smaller of their two windows: a side whose setting is
    /// not the default sends it at the end of the REQ's or REP's private data (the last
    /// 12 bytes, so the application's private data is then at most 44 bytes in a REQ, 184
    /// in a REP); a peer that sends none is taken to
    /// have the defaults. Settings other than the defaults need a peer of this version or
    /// later (an older one takes the trailer for private data and keeps the defaults).
    ///
    /// ```
    /// let o = rdmacm::ConnectOptions::new().window(4).max_message(4096);
    /// assert_eq!((o.window, o.max_message), (4, 4096));
    /// ```
    pub fn window(mut self, window: u32) -> Self {
        self.window = window;
        self
    }

    /// This side's largest message (default [`MAX_MESSAGE`]; 64 B to 16 MiB, else
    /// `EINVAL`); both ends use the smaller of their two, carried as the window is
    /// ([`ConnectOptions::window`]). A longer `send` fails with `EINVAL`.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    pub(super) fn sizes(&self) -> Result<MsgSizes> {
        MsgSizes {
            window: self.window,
            max_message: self.max_message,
        }
        .check()
    }
}
