//! The crate's error type and its errno mapping.

use crate::addr::WireAddr;

/// Result of every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, typed, with the errno verbs or the socket layer would report
/// ([`Error::errno`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another user's process, a process that does not share (`UdpConfig::share` off), or
    /// the kernel's `rdma_rxe` (which binds the wildcard address) holds UDP port 4791 on
    /// this address.
    #[error("UDP {port} on {addr} is held by another process")]
    AddrInUse {
        /// The local address asked for.
        addr: WireAddr,
        /// The UDP port (4791 unless configured otherwise).
        port: u16,
    },
    /// Another live process (or id) listens on this address and port of the port space.
    #[error("port {port} on {addr} is in use by another process")]
    PortInUse {
        /// The address asked for.
        addr: std::net::IpAddr,
        /// The port.
        port: u16,
    },
    /// A wildcard and a specific address on one port, in two processes.
    #[error("port {port} is held with a wildcard address by another process")]
    PortWildcard {
        /// The port.
        port: u16,
    },
    /// The address is not one of this host's (in this network namespace).
    #[error("{addr} is not an address of this host")]
    AddrNotAvailable {
        /// The local address asked for.
        addr: WireAddr,
    },
    /// An IPv6 link-local address came without the scope (interface index) that selects its link.
    #[error("link-local address {addr} needs a scope id (interface)")]
    ScopeRequired {
        /// The address without scope.
        addr: WireAddr,
    },
    /// A packet was sent from a local address that the wire has not opened.
    #[error("{addr} is not open on this wire")]
    NotOpen {
        /// The local address.
        addr: WireAddr,
    },
    /// A packet is larger than the wire carries.
    #[error("packet of {len} bytes exceeds the wire's maximum of {max}")]
    TooLong {
        /// Bytes offered.
        len: usize,
        /// Largest datagram the wire carries.
        max: usize,
    },
    /// `RDMA_SOFT_FAULTS` (or a fault spec given in code) could not be parsed.
    #[error("bad fault spec {spec:?}: {reason}")]
    FaultSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value (an environment variable's, or one given in code) is invalid.
    #[error("{var}: {reason}")]
    Config {
        /// The variable (or the setting named after it).
        var: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A resource limit of the device (reported by `query_device`) was reached.
    #[error("{what}: limit of {max} reached")]
    Exhausted {
        /// Which resource.
        what: &'static str,
        /// Its limit.
        max: usize,
    },
    /// A key, protection domain, bound or access flag check failed.
    #[error("access denied: {0}")]
    Access(&'static str),
    /// The object is still in use by the device (e.g. deregistering an MR that a transfer holds).
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// A queue is full (completion queue overflow, receive queue full).
    #[error("{0} is full")]
    QueueFull(&'static str),
    /// `modify` was refused by the QP state machine (illegal transition, missing or extra
    /// attributes, a value out of range).
    #[error("modify QP: {0}")]
    Modify(#[from] rdma_proto::verbs::ModifyError),
    /// A work request could not be posted (queue full, wrong state, invalid request).
    #[error("post: {0}")]
    Post(#[from] rdma_proto::verbs::PostError),
    /// An operating-system call failed.
    #[error("{op}{}: {source}", .addr.map(|a| format!(" on {a}")).unwrap_or_default())]
    Os {
        /// The call or step, e.g. `"bind"`.
        op: &'static str,
        /// The local address concerned, if any.
        addr: Option<WireAddr>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The errno the equivalent libibverbs / socket call would set.
    pub fn errno(&self) -> i32 {
        match self {
            Error::AddrInUse { .. } | Error::PortInUse { .. } => libc::EADDRINUSE,
            Error::PortWildcard { .. } => libc::EADDRNOTAVAIL,
            Error::AddrNotAvailable { .. } => libc::EADDRNOTAVAIL,
            Error::ScopeRequired { .. }
            | Error::NotOpen { .. }
            | Error::FaultSpec { .. }
            | Error::Config { .. }
            | Error::InvalidArgument(_) => libc::EINVAL,
            Error::TooLong { .. } => libc::EMSGSIZE,
            Error::Exhausted { .. } | Error::QueueFull(_) => libc::ENOMEM,
            Error::Access(_) => libc::EACCES,
            Error::Busy(_) => libc::EBUSY,
            Error::Modify(_) => libc::EINVAL,
            Error::Post(e) => e.errno(),
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// An [`Error::Os`] from the current `errno`.
    pub(crate) fn last_os(op: &'static str, addr: Option<WireAddr>) -> Error {
        Error::Os {
            op,
            addr,
            source: std::io::Error::last_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_and_message_name_the_address() {
        let addr = WireAddr::from(std::net::Ipv4Addr::new(127, 0, 0, 2));
        let e = Error::AddrInUse { addr, port: 4791 };
        assert_eq!(e.errno(), libc::EADDRINUSE);
        assert_eq!(
            e.to_string(),
            "UDP 4791 on 127.0.0.2 is held by another process"
        );
        let os = Error::Os {
            op: "bind",
            addr: Some(addr),
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(os.errno(), libc::EPERM);
        assert!(os.to_string().starts_with("bind on 127.0.0.2: "));
    }
}
