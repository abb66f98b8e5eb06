//! Preallocated batches for `recvmmsg` (and, in `send_batch`, `sendmmsg`).
//!
//! All buffers, socket addresses, control-message space and `mmsghdr`s are allocated once
//! (`sys::mmsg::RecvHeaders`, the unsafe edge); this reads what each call received.

use std::os::fd::BorrowedFd;

use super::sys::{self, mmsg::RecvHeaders, Ancillary};
use super::WireAddr;

/// One received datagram, borrowed from a [`RecvBatch`].
pub(crate) struct Received<'a> {
    /// Source address and port.
    pub src: Option<(WireAddr, u16)>,
    /// What the control messages said.
    pub anc: Ancillary,
    /// The datagram was longer than the buffer (`MSG_TRUNC`).
    pub truncated: bool,
    /// The bytes.
    pub data: &'a mut [u8],
}

/// Receive buffers for one `recvmmsg` call.
pub(crate) struct RecvBatch {
    h: RecvHeaders,
}

impl RecvBatch {
    /// `count` buffers of `slot` bytes.
    pub fn new(count: usize, slot: usize) -> RecvBatch {
        RecvBatch {
            h: RecvHeaders::new(count, slot),
        }
    }

    /// Number of buffers.
    pub fn capacity(&self) -> usize {
        self.h.capacity()
    }

    /// Receives up to `max` datagrams without blocking; returns how many arrived (0 when none
    /// was waiting).
    pub fn recv(&mut self, fd: BorrowedFd<'_>, max: usize) -> std::io::Result<usize> {
        self.h.recv(fd, max)
    }

    /// The `i`-th datagram of the last [`RecvBatch::recv`].
    pub fn get(&mut self, i: usize) -> Option<Received<'_>> {
        let e = self.h.get(i)?;
        Some(Received {
            src: sys::from_sockaddr(e.name),
            anc: sys::parse_ancillary(e.ctrl),
            truncated: e.truncated,
            data: e.data,
        })
    }
}
