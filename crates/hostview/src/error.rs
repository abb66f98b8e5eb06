//! The error type of every host-view call, with its errno.

use std::net::IpAddr;

/// What went wrong; [`Error::errno`] gives the errno rdma_cm would report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No route to the destination's network (`ENETUNREACH`).
    #[error("network unreachable")]
    NetworkUnreachable,
    /// No route to the host (`EHOSTUNREACH`): an `unreachable` route, a neighbour that went
    /// FAILED, or a lookup constrained to a netdev that has no route to the destination.
    #[error("no route to host")]
    HostUnreachable,
    /// A `prohibit` route matched (`EACCES`).
    #[error("administratively prohibited")]
    Prohibited,
    /// A deadline passed, e.g. neighbour resolution (`ETIMEDOUT`).
    #[error("timed out")]
    TimedOut,
    /// No such netdev (`ENODEV`).
    #[error("no such netdev: {0}")]
    NoDevice(String),
    /// The address is held by no netdev (`EADDRNOTAVAIL`).
    #[error("address not held by any netdev: {0}")]
    AddressNotAvailable(IpAddr),
    /// A caller's argument is invalid (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The kernel refused a request with this (positive) errno; e.g. `EINVAL` for a lookup that
    /// hits a `blackhole` route or has a source address that is not local.
    #[error("kernel refused {op}: errno {errno}")]
    Kernel {
        /// The request, e.g. `"RTM_GETROUTE"`.
        op: &'static str,
        /// Positive errno.
        errno: i32,
    },
    /// The netlink connection failed or answered something unexpected (`EIO`).
    #[error("netlink: {0}")]
    Netlink(String),
    /// An I/O error (its own errno, else `EIO`).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The positive errno for this error.
    ///
    /// ```
    /// assert_eq!(rdma_hostview::Error::TimedOut.errno(), libc::ETIMEDOUT);
    /// ```
    pub fn errno(&self) -> i32 {
        match self {
            Error::NetworkUnreachable => libc::ENETUNREACH,
            Error::HostUnreachable => libc::EHOSTUNREACH,
            Error::Prohibited => libc::EACCES,
            Error::TimedOut => libc::ETIMEDOUT,
            Error::NoDevice(_) => libc::ENODEV,
            Error::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::Kernel { errno, .. } => *errno,
            Error::Netlink(_) => libc::EIO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Maps a kernel errno (positive or negative) from request `op` to an error.
    pub(crate) fn from_errno(op: &'static str, errno: i32) -> Error {
        match errno.abs() {
            libc::ENETUNREACH => Error::NetworkUnreachable,
            libc::EHOSTUNREACH => Error::HostUnreachable,
            libc::EACCES => Error::Prohibited,
            libc::ENODEV => Error::NoDevice(format!("({op})")),
            e => Error::Kernel { op, errno: e },
        }
    }
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
