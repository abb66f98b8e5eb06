//! The error type of every resolution and port-space call, with the errno rdma_cm gives.

use std::net::IpAddr;

/// Why the passive side refuses an incoming connection request. On the wire every cause
/// but [`RejectCause::InvalidServiceId`] is REJ reason 28 ("consumer defined"), as Linux
/// sends when its listener lookup fails, and [`RejectCause::BacklogFull`] is no answer at all
/// (the requester retries). The server logs each refusal with its cause (`tracing`, target
/// `rdmacm`, level `info`) and counts it ([`crate::cm::Cma::reject_counts`]): "why was my connect
/// rejected" is answered on the server.
///
/// ```
/// use rdmacm::cm::RejectCause;
/// assert_eq!(RejectCause::NoListenerForAddress.wire_reason(), Some(28));
/// assert_eq!(RejectCause::BacklogFull.wire_reason(), None);
/// assert!(RejectCause::NotOnReverseRoute.to_string().contains("reverse route"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RejectCause {
    /// The netdev the request arrived on is administratively down.
    ArrivalNetdevDown,
    /// The netdev the request arrived on no longer exists.
    ArrivalNetdevGone,
    /// The reverse route (local address → requester, output constrained to the arrival
    /// netdev) does not go out through the arrival netdev.
    NotOnReverseRoute,
    /// The request is addressed to an address this host does not hold.
    NotOurAddress,
    /// A listener holds the port, but none takes this address (another address, the other
    /// family, or an AFONLY IPv6 listener and an IPv4 request).
    NoListenerForAddress,
    /// The listener's backlog is full: the request is dropped unanswered, as Linux does.
    BacklogFull,
    /// The REQ's private data does not start with a valid IP CM header.
    BadIpCmHeader,
    /// The service id is not of the RDMA IP CM range (REJ 8, invalid service id).
    InvalidServiceId,
    /// The path back to the requester cannot carry RoCE (e.g. the arrival netdev's MTU).
    PathUnusable,
    /// The IP CM header names a source address other than the one the request came from:
    /// answering it would aim our REPs and data at a third host.
    SourceMismatch,
}

impl RejectCause {
    /// The IB CM reject reason the CM puts in its REJ for the causes Linux reports as a
    /// failed listener lookup: 28 (consumer defined).
    pub const REJ_REASON: u16 = 28;

    /// What goes on the wire: the REJ reason, or `None` when the request is dropped.
    pub fn wire_reason(self) -> Option<u16> {
        match self {
            RejectCause::BacklogFull => None,
            RejectCause::InvalidServiceId => Some(8),
            _ => Some(Self::REJ_REASON),
        }
    }

    /// A short name for counters: `no_listener_for_address` etc.
    ///
    /// ```
    /// assert_eq!(rdmacm::cm::RejectCause::BacklogFull.name(), "backlog_full");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            RejectCause::ArrivalNetdevDown => "arrival_netdev_down",
            RejectCause::ArrivalNetdevGone => "arrival_netdev_gone",
            RejectCause::NotOnReverseRoute => "not_on_reverse_route",
            RejectCause::NotOurAddress => "not_our_address",
            RejectCause::NoListenerForAddress => "no_listener_for_address",
            RejectCause::BacklogFull => "backlog_full",
            RejectCause::BadIpCmHeader => "bad_ip_cm_header",
            RejectCause::InvalidServiceId => "invalid_service_id",
            RejectCause::PathUnusable => "path_unusable",
            RejectCause::SourceMismatch => "source_mismatch",
        }
    }

    /// Every cause, for counters and tables.
    pub const ALL: [RejectCause; 10] = [
        RejectCause::ArrivalNetdevDown,
        RejectCause::ArrivalNetdevGone,
        RejectCause::NotOnReverseRoute,
        RejectCause::NotOurAddress,
        RejectCause::NoListenerForAddress,
        RejectCause::BacklogFull,
        RejectCause::BadIpCmHeader,
        RejectCause::InvalidServiceId,
        RejectCause::PathUnusable,
        RejectCause::SourceMismatch,
    ];
}

impl std::fmt::Display for RejectCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RejectCause::ArrivalNetdevDown => "the netdev the request arrived on is down",
            RejectCause::ArrivalNetdevGone => "the netdev the request arrived on is gone",
            RejectCause::NotOnReverseRoute => {
                "the reverse route to the requester does not leave through the arrival netdev"
            }
            RejectCause::NotOurAddress => "the destination address is not held by this host",
            RejectCause::NoListenerForAddress => {
                "a listener holds the port but none takes this address or family"
            }
            RejectCause::BacklogFull => "the listener's backlog is full (dropped, unanswered)",
            RejectCause::BadIpCmHeader => "the private data has no valid IP CM header",
            RejectCause::InvalidServiceId => "the service id is not an RDMA IP CM one",
            RejectCause::PathUnusable => "the path to the requester cannot carry RoCE",
            RejectCause::SourceMismatch => {
                "the IP CM header's source is not the address the request came from"
            }
        })
    }
}

/// What went wrong; [`Error::errno`] gives the (positive) errno rdma_cm would report.
///
/// ```
/// use rdmacm::Error;
/// assert_eq!(Error::HostUnreachable.errno(), libc::EHOSTUNREACH);
/// assert_eq!(Error::AddressInUse.errno(), libc::EADDRINUSE);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller's argument is invalid (`EINVAL`): e.g. a link-local address without a scope
    /// id, families that do not match, an MTU too small for RoCE.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Recognised but not supported here (`EOPNOTSUPP`): e.g. the `migrate` HA policy
    /// without a device group.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The address family is not IPv4 or IPv6 (`EAFNOSUPPORT`).
    #[error("address family not supported")]
    AddressFamilyNotSupported,
    /// The address (and port) is bound by another id (`EADDRINUSE`).
    #[error("address in use")]
    AddressInUse,
    /// The address is held by no netdev, or a port conflicts with a wildcard binding, or the
    /// ephemeral range is exhausted (`EADDRNOTAVAIL`).
    #[error("address not available: {0}")]
    AddressNotAvailable(String),
    /// A netdev (scope id, bound or route netdev) does not exist (`ENODEV`).
    #[error("no such device: {0}")]
    NoDevice(String),
    /// No route to the host (`EHOSTUNREACH`): the bound netdev has no route to the
    /// destination, an `unreachable` route, or a neighbour that went FAILED.
    #[error("no route to host")]
    HostUnreachable,
    /// No route to the destination's network (`ENETUNREACH`).
    #[error("network unreachable")]
    NetworkUnreachable,
    /// Neighbour resolution did not finish within the caller's timeout (`ETIMEDOUT`).
    #[error("timed out")]
    TimedOut,
    /// A port below the unprivileged start (1024) without `CAP_NET_BIND_SERVICE`, or a
    /// `prohibit` route (`EACCES`).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The passive side refuses a request (the CM sends REJ reason 28); errno
    /// `EHOSTUNREACH` (`ENODEV` when the arrival netdev is gone), as Linux's listener lookup.
    #[error("request rejected: {0}")]
    Rejected(RejectCause),
    /// Another error of the host view (netlink), with its own errno.
    #[error("host view: {0}")]
    Host(rdma_hostview::Error),
    /// An I/O error (its own errno, else `EIO`).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A call made in a state of the id that does not allow it (`EINVAL`), as rdma_cm's
    /// compare-and-swap on the id state (`cma_comp_exch`) refuses it.
    #[error("{op}: not allowed in state {state}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// The id's state when it was made.
        state: &'static str,
    },
    /// The software device refused a verbs call (its own errno).
    #[error("device: {0}")]
    Device(rdma_soft::Error),
    /// The IB CM refused a call (its errno: `EINVAL`, `EADDRINUSE`, `ENOMEM`).
    #[error("cm: {0}")]
    Cm(rdma_proto::cm::CmError),
    /// The peer rejected the connection (`ECONNREFUSED`), with the IB CM reject reason
    /// (named with its meaning by [`reject_reason_text`]).
    ///
    /// ```
    /// let e = rdmacm::Error::ConnectionRefused(8);
    /// assert!(e.to_string().contains("invalid service id"), "{e}");
    /// ```
    #[error("connection refused: {}", reject_reason_text(*.0))]
    ConnectionRefused(u16),
    /// An operation on an id that was disconnected or whose connection failed (`ENOTCONN`).
    #[error("not connected")]
    NotConnected,
    /// The connection closed while the call was waiting (`ECONNRESET`; `ENOTCONN` when it
    /// was closed locally), with the reason.
    ///
    /// ```
    /// use rdmacm::{CloseReason, Error};
    /// let e = Error::Closed(CloseReason::PeerDisconnected);
    /// assert_eq!(e.errno(), libc::ECONNRESET);
    /// assert!(e.to_string().contains("peer disconnected"), "{e}");
    /// ```
    #[error("connection closed: {0}")]
    Closed(CloseReason),
    /// No event is ready (`EAGAIN`), from the non-blocking calls.
    #[error("would block")]
    WouldBlock,
    /// The context was shut down (`ENODEV`).
    #[error("connection manager shut down")]
    Shutdown,
}

impl Error {
    /// The positive errno for this error.
    ///
    /// ```
    /// use rdmacm::Error;
    /// use rdmacm::cm::RejectCause;
    /// assert_eq!(Error::Rejected(RejectCause::NotOnReverseRoute).errno(), libc::EHOSTUNREACH);
    /// assert_eq!(Error::InvalidArgument("x".into()).errno(), libc::EINVAL);
    /// ```
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::AddressFamilyNotSupported => libc::EAFNOSUPPORT,
            Error::AddressInUse => libc::EADDRINUSE,
            Error::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            Error::NoDevice(_) => libc::ENODEV,
            Error::HostUnreachable => libc::EHOSTUNREACH,
            Error::NetworkUnreachable => libc::ENETUNREACH,
            Error::TimedOut => libc::ETIMEDOUT,
            Error::PermissionDenied(_) => libc::EACCES,
            Error::Rejected(RejectCause::ArrivalNetdevGone) => libc::ENODEV,
            Error::Rejected(_) => libc::EHOSTUNREACH,
            Error::Host(e) => e.errno(),
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::InvalidState { .. } => libc::EINVAL,
            Error::Device(e) => e.errno(),
            Error::Cm(e) => e.errno(),
            Error::ConnectionRefused(_) => libc::ECONNREFUSED,
            Error::NotConnected => libc::ENOTCONN,
            Error::Closed(CloseReason::LocalDisconnect | CloseReason::Dropped) => libc::ENOTCONN,
            Error::Closed(_) => libc::ECONNRESET,
            Error::WouldBlock => libc::EAGAIN,
            Error::Shutdown => libc::ENODEV,
        }
    }

    pub(crate) fn not_held(ip: IpAddr) -> Error {
        Error::AddressNotAvailable(format!("{ip} is held by no netdev"))
    }
}

impl From<rdma_hostview::Error> for Error {
    fn from(e: rdma_hostview::Error) -> Self {
        use rdma_hostview::Error as H;
        match e {
            H::NetworkUnreachable => Error::NetworkUnreachable,
            H::HostUnreachable => Error::HostUnreachable,
            H::Prohibited => Error::PermissionDenied("prohibit route".into()),
            H::TimedOut => Error::TimedOut,
            H::NoDevice(d) => Error::NoDevice(d),
            H::AddressNotAvailable(ip) => Error::not_held(ip),
            H::InvalidArgument(s) => Error::InvalidArgument(s),
            other => match other.errno() {
                libc::EINVAL => Error::InvalidArgument(other.to_string()),
                libc::ENETUNREACH => Error::NetworkUnreachable,
                libc::EHOSTUNREACH => Error::HostUnreachable,
                _ => Error::Host(other),
            },
        }
    }
}

impl From<rdma_soft::Error> for Error {
    fn from(e: rdma_soft::Error) -> Self {
        Error::Device(e)
    }
}

impl From<rdma_proto::cm::CmError> for Error {
    fn from(e: rdma_proto::cm::CmError) -> Self {
        Error::Cm(e)
    }
}

/// Why a [`crate::Connection`] closed ([`crate::Connection::closed`], [`Error::Closed`]).
///
/// ```
/// use rdmacm::CloseReason;
/// use rdmacm::verbs::WcStatus;
/// let why = CloseReason::Failed(WcStatus::RetryExcErr);
/// assert!(why.to_string().contains("retry"), "{why}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer disconnected (the CM reported DISCONNECTED: its DREQ arrived).
    PeerDisconnected,
    /// [`crate::Connection::disconnect`] was called.
    LocalDisconnect,
    /// The [`crate::Connection`] was dropped.
    Dropped,
    /// A work request completed with an error (the QP is in Err).
    Failed(rdma_soft::verbs::WcStatus),
    /// The CM reported this event (UNREACHABLE, CONNECT_ERROR, DEVICE_REMOVAL).
    Event(crate::cm::EventType),
    /// The device refused a post (e.g. the QP was destroyed).
    PostFailed(String),
    /// The CM ended the connection because its path moved off its netdev (HA policy
    /// [`crate::cm::HaPolicy::Align`]): `status` is the DISCONNECTED event's,
    /// [`crate::cm::ALIGN_PATH_MOVED`] or [`crate::cm::ALIGN_ADDR_GONE`].
    /// [`crate::Connection::reconnect`] makes a new connection on the new path.
    PathMoved {
        /// The DISCONNECTED status (a negative errno).
        status: i32,
    },
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::PeerDisconnected => {
                f.write_str("the peer disconnected (DISCONNECTED); reconnect to continue")
            }
            CloseReason::LocalDisconnect => f.write_str("disconnected locally (disconnect())"),
            CloseReason::Dropped => f.write_str("the connection was dropped"),
            CloseReason::Failed(s) => write!(f, "a work request failed: {s}"),
            CloseReason::Event(k) => write!(
                f,
                "the connection manager reported {k}: the peer or the path is gone"
            ),
            CloseReason::PostFailed(e) => write!(f, "the device refused a post: {e}"),
            CloseReason::PathMoved { status } => write!(
                f,
                "the path moved off the connection's netdev (align policy, {}); reconnect \
                 to follow it",
                std::io::Error::from_raw_os_error(-status)
            ),
        }
    }
}

/// An IB CM reject reason (a REJECTED event's status, [`Error::ConnectionRefused`]) by
/// name, with what it usually means for an rdma_cm application.
///
/// ```
/// let t = rdmacm::cm::reject_reason_text(28);
/// assert!(t.starts_with("28 consumer defined"), "{t}");
/// assert!(rdmacm::cm::reject_reason_text(34).starts_with("34"));
/// ```
pub fn reject_reason_text(reason: u16) -> String {
    let (name, meaning) = match reason {
        1 => ("no QP", "the peer has no QP for the request"),
        2 => ("no EE context", "RD only"),
        3 => ("no resources", "the peer is out of resources; retry later"),
        4 => (
            "timeout",
            "the peer gave up on the connection (its id was destroyed while connecting)",
        ),
        5 => (
            "unsupported request",
            "the peer does not support the request",
        ),
        6 => (
            "invalid communication id",
            "the peer does not know this connection",
        ),
        7 => (
            "invalid communication instance",
            "stale or mismatched connection",
        ),
        8 => (
            "invalid service id",
            "nobody listens on that port at the peer: start the server or check the port",
        ),
        9 => (
            "invalid transport service type",
            "the peer does not accept this QP type",
        ),
        10 => (
            "stale connection",
            "the peer still holds an old connection with these ids; retry after its timewait",
        ),
        12 => (
            "primary remote port GID rejected",
            "the peer refuses the path's GID",
        ),
        26 => ("invalid path MTU", "the peer refuses the path MTU"),
        27 => (
            "insufficient responder resources",
            "ask for fewer responder resources / initiator depth",
        ),
        28 => (
            "consumer defined",
            "the peer's application or listener refused (rdma_reject, or its listener does \
             not take this address)",
        ),
        29 => (
            "invalid RNR retry count",
            "the peer refuses the RNR retry count",
        ),
        30 => (
            "duplicate local communication id",
            "the peer already has this connection",
        ),
        31 => ("unsupported class version", "CM version mismatch"),
        35 => (
            "vendor option not supported",
            "the peer does not support ECE",
        ),
        11 | 13..=25 | 32 | 33 => ("path parameter rejected", "the peer refuses the path"),
        _ => ("unknown reason", "not a reason the IB CM defines"),
    };
    format!("{reason} {name}: {meaning}")
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
