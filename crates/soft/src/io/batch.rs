//! Preallocated batches for `recvmmsg` (and, in `send_batch`, `sendmmsg`).
//!
//! All buffers, socket addresses, control-message space and `mmsghdr`s are allocated once; the
//! raw pointers the kernel needs are written into the headers right before each system call, so
//! the structures may move freely between calls.

use std::mem::zeroed;
use std::os::fd::RawFd;

use super::sys::{self, Ancillary, CmsgBuf, STORAGE_LEN};
use super::WireAddr;

/// Control-message space per datagram: pktinfo (28 B for IPv6), TOS/tclass, TTL/hop limit and
/// the UDP GRO segment size, each with its header (112 B), fit.
type Ctrl = CmsgBuf<128>;

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
    slot: usize,
    bufs: Box<[u8]>,
    names: Box<[libc::sockaddr_storage]>,
    ctrl: Box<[Ctrl]>,
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    filled: usize,
    /// Entries the kernel may have written since they were set up (reset before the next
    /// call; the rest keep the values `new` gave them).
    dirty: usize,
}

// SAFETY: the raw pointers inside `iovs`/`hdrs` only ever point into the boxes owned by the same
// value (they are rewritten before each use), so moving the value to another thread is sound.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `count` buffers of `slot` bytes.
    pub fn new(count: usize, slot: usize) -> RecvBatch {
        let count = count.max(1);
        let mut b = RecvBatch {
            slot,
            bufs: vec![0u8; count * slot].into_boxed_slice(),
            // SAFETY: all-zero is valid for these plain C structs.
            names: (0..count).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![Ctrl::new(); count].into_boxed_slice(),
            iovs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            hdrs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            filled: 0,
            dirty: count,
        };
        // The boxed slices never move or change size: set the pointers up once.
        for i in 0..count {
            b.iovs[i] = libc::iovec {
                iov_base: b.bufs[i * slot..].as_mut_ptr().cast(),
                iov_len: slot,
            };
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = b.ctrl[i].as_mut_ptr();
        }
        b
    }

    /// Number of buffers.
    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives up to `max` datagrams without blocking; returns how many arrived (0 when none
    /// was waiting).
    pub fn recv(&mut self, fd: RawFd, max: usize) -> std::io::Result<usize> {
        let n = max.min(self.capacity());
        self.filled = 0;
        // The pointers and lengths stay as `new` set them up; only what the kernel wrote into
        // the entries of the last call is reset (a busy poll's empty calls cost no setup).
        for i in 0..self.dirty.max(1).min(self.capacity()) {
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_namelen = STORAGE_LEN;
            h.msg_controllen = Ctrl::LEN as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        self.dirty = 0;
        // SAFETY: the first `n` headers point into buffers owned by `self` with the sizes given.
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as _,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        self.filled = rc as usize;
        self.dirty = self.filled;
        Ok(self.filled)
    }

    /// The `i`-th datagram of the last [`RecvBatch::recv`].
    pub fn get(&mut self, i: usize) -> Option<Received<'_>> {
        if i >= self.filled {
            return None;
        }
        let hdr = &self.hdrs[i];
        let len = (hdr.msg_len as usize).min(self.slot);
        let truncated = hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        // recvmmsg filled this header: its control length is what it wrote of `self.ctrl[i]`
        let anc = sys::parse_ancillary(self.ctrl[i].messages(hdr.msg_hdr.msg_controllen));
        let src = sys::from_sockaddr(&self.names[i]);
        Some(Received {
            src,
            anc,
            truncated,
            data: &mut self.bufs[i * self.slot..i * self.slot + len],
        })
    }
}
