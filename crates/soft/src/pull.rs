//! Pulled RDMA WRITEs between two of our processes on one host: one copy, by the kernel.
//!
//! On the host-local wire (`io::local`) a WRITE of at least [`min_len`] bytes carries no
//! data: its first packet names where the message is in the sender's memory (host address
//! and length pairs, [`rdma_proto::packet::TxPlacement::Pull`]) and the later ones only
//! their length. The responder checks key, protection domain, bounds and access for the
//! whole message as for any WRITE, then copies it with one `process_vm_readv(2)` from the
//! sending process straight into the target region (the kernel's cross-memory attach, as
//! UCX's `cma` transport does). The sender's pid comes from the kernel
//! (`SCM_CREDENTIALS` when its ring was handed over), never from the packet.
//!
//! The kernel allows the copy between processes of one user unless ptrace is restricted
//! (Yama `ptrace_scope` above 0, a seccomp filter, a non-dumpable process). Where it
//! refuses, the responder asks for the WRITE again and it comes with its data; a sender
//! stops pulling on a QP after a few such refusals, and on a host with Yama restrictions
//! never starts. `RDMA_SOFT_LOCAL_PULL=0` turns pulls off; a number sets [`min_len`].

use std::sync::OnceLock;

use rdma_proto::memory::MemError;
use rdma_proto::packet::{Placement, TxPlacement};

use crate::io::Arrival;

/// Environment variable: `0` or `off` turns pulled WRITEs off; a number of bytes is the
/// shortest WRITE pulled (default [`DEFAULT_MIN`]).
pub const PULL_ENV: &str = "RDMA_SOFT_LOCAL_PULL";
/// The shortest WRITE pulled by default: below it the two copies through the ring cost
/// less than the system call.
pub const DEFAULT_MIN: u32 = 16 << 10;
/// Pieces of memory a pulled WRITE may name at most.
pub(crate) const MAX_PAIRS: usize = 32;
/// A framed source: the sender's pid (4 bytes), 4 reserved, then the pairs.
pub(crate) const MAX_SOURCE: usize = 8 + 16 * MAX_PAIRS;

/// The shortest WRITE a host-local QP pulls, or `None` (off, or the kernel would refuse).
pub(crate) fn min_len() -> Option<u32> {
    static MIN: OnceLock<Option<u32>> = OnceLock::new();
    *MIN.get_or_init(|| {
        let min = match std::env::var(PULL_ENV).ok().as_deref().map(str::trim) {
            None | Some("") => Some(DEFAULT_MIN),
            Some("0" | "off") => None,
            Some(v) => match v.parse::<u32>() {
                Ok(n) => Some(n.max(1)),
                Err(_) => {
                    tracing::warn!(value = v, "{PULL_ENV}: not a number of bytes; default used");
                    Some(DEFAULT_MIN)
                }
            },
        };
        let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if min.is_some() && yama > 0 {
            tracing::debug!(
                yama,
                "ptrace restricted: host-local WRITEs carry their data"
            );
            return None;
        }
        min
    })
}

/// The placement of a packet that arrived as `arr` with `payload`; a pulled WRITE's source
/// is copied out of the shared ring into `frame` and framed with the sender's pid. `None`
/// when the packet breaks the format (or the sender is unknown).
pub(crate) fn placement<'a>(
    arr: &Arrival,
    payload: &[u8],
    frame: &'a mut [u8; MAX_SOURCE],
) -> Option<Placement<'a>> {
    match Placement::decode(arr.placement, payload)? {
        Placement::Inline => Some(Placement::Inline),
        Placement::Pulled { len } => Some(Placement::Pulled { len }),
        Placement::Pull { len, source } => {
            if arr.peer_pid == 0 || source.len() % 16 != 0 || source.len() > 16 * MAX_PAIRS {
                return None;
            }
            debug_assert_eq!(arr.placement, TxPlacement::Pull);
            frame[..4].copy_from_slice(&arr.peer_pid.to_le_bytes());
            frame[4..8].fill(0);
            frame[8..8 + source.len()].copy_from_slice(source);
            Some(Placement::Pull {
                len,
                source: &frame[..8 + source.len()],
            })
        }
    }
}

/// Copies the `len` bytes a framed `source` names from its process to `dst`, which must be
/// writable for `len` bytes (a checked range of a registered region). `Unavailable` when
/// the pairs do not add up to `len` or the kernel refuses or copies less.
pub(crate) fn copy_into(source: &[u8], dst: *mut u8, len: u64) -> Result<(), MemError> {
    let bad = Err(MemError::Unavailable);
    if source.len() < 8 || (source.len() - 8) % 16 != 0 {
        return bad;
    }
    let pid = u32::from_le_bytes([source[0], source[1], source[2], source[3]]);
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_PAIRS];
    let mut n = 0usize;
    let mut total = 0u64;
    for pair in source[8..].chunks_exact(16) {
        let at = u64::from_le_bytes(pair[..8].try_into().unwrap_or_default());
        let l = u64::from_le_bytes(pair[8..].try_into().unwrap_or_default());
        if n == MAX_PAIRS {
            return bad;
        }
        remote[n] = libc::iovec {
            iov_base: at as usize as *mut libc::c_void,
            iov_len: l as usize,
        };
        n += 1;
        total = total.saturating_add(l);
    }
    if total != len || pid == 0 {
        return bad;
    }
    let local = libc::iovec {
        iov_base: dst.cast(),
        iov_len: len as usize,
    };
    // SAFETY: `local` is `len` writable bytes (the caller's checked region range); the
    // kernel reads the remote pairs in the other process and fails on bad addresses.
    let got = unsafe {
        libc::process_vm_readv(pid as libc::pid_t, &local, 1, remote.as_ptr(), n as u64, 0)
    };
    if got < 0 || got as u64 != len {
        if got < 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!(pid, error = %e, "pulled WRITE: source not readable");
        }
        return bad;
    }
    Ok(())
}
