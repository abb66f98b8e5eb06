//! Errors of the CM API calls.

use core::fmt;

use super::{CmState, ConnHandle};

/// Why a [`super::CmAgent`] API call was refused. Nothing changes when one is returned.
///
/// ```
/// use rdma_proto::cm::CmError;
/// let e = CmError::PrivateDataTooLong { max: 92, len: 93 };
/// assert_eq!(e.errno(), 22); // EINVAL
/// assert_eq!(e.to_string(), "private data too long: 93 bytes, at most 92");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmError {
    /// No such connection (never existed, or destroyed).
    UnknownConn(ConnHandle),
    /// The call is not allowed in the connection's current state.
    InvalidState {
        /// The call.
        op: &'static str,
        /// The state it found.
        state: CmState,
    },
    /// More private data than the message carries.
    PrivateDataTooLong {
        /// Capacity of the message.
        max: usize,
        /// Length given.
        len: usize,
    },
    /// A parameter does not fit its field (e.g. a QPN wider than 24 bits).
    InvalidParam(&'static str),
    /// Somebody already listens on this service id.
    AlreadyListening(u64),
    /// Nobody listens on this service id.
    NotListening(u64),
    /// The agent holds its configured maximum of connections.
    TooManyConnections,
}

impl CmError {
    /// The errno `rdma_cm` would report for this error.
    pub const fn errno(&self) -> i32 {
        const EINVAL: i32 = 22;
        const EADDRINUSE: i32 = 98;
        const ENOMEM: i32 = 12;
        match self {
            CmError::AlreadyListening(_) => EADDRINUSE,
            CmError::TooManyConnections => ENOMEM,
            _ => EINVAL,
        }
    }
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::UnknownConn(c) => write!(f, "unknown connection {}", c.0),
            CmError::InvalidState { op, state } => write!(f, "{op} not allowed in state {state:?}"),
            CmError::PrivateDataTooLong { max, len } => {
                write!(f, "private data too long: {len} bytes, at most {max}")
            }
            CmError::InvalidParam(p) => write!(f, "invalid parameter: {p}"),
            CmError::AlreadyListening(s) => write!(f, "already listening on service id {s:#x}"),
            CmError::NotListening(s) => write!(f, "not listening on service id {s:#x}"),
            CmError::TooManyConnections => write!(f, "too many connections"),
        }
    }
}

impl std::error::Error for CmError {}
