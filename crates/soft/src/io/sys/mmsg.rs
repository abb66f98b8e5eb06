//! `recvmmsg` and `sendmmsg` behind safe types: the message headers point only into memory
//! the same value owns ([`RecvHeaders`]) or borrows for as long as the headers live
//! ([`SendHeaders::load`]), so no caller handles a raw pointer. Nothing is allocated per
//! call: the headers and their iovecs are allocated once and rewritten in place.

use std::marker::PhantomData;
use std::mem::zeroed;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::cmsg::{CmsgBuf, Messages};
use super::STORAGE_LEN;

/// Control-message space per received datagram: pktinfo (28 B for IPv6), TOS/tclass, TTL /
/// hop limit and the UDP GRO segment size, each with its header (112 B), fit.
type RecvCtrl = CmsgBuf<128>;

/// Control-message space per sent message: `UDP_SEGMENT` (header and a u16) and `IP_TOS` /
/// `IPV6_TCLASS` (header and an int), 24 bytes each.
pub(crate) type SendCtrl = CmsgBuf<48>;

/// One received datagram of [`RecvHeaders`], as the kernel left it.
pub(crate) struct RecvEntry<'a> {
    /// Its source address.
    pub name: &'a libc::sockaddr_storage,
    /// Its control messages.
    pub ctrl: Messages<'a>,
    /// It was longer than the buffer (`MSG_TRUNC`).
    pub truncated: bool,
    /// Its bytes (at most the buffer's).
    pub data: &'a mut [u8],
}

/// Buffers, addresses, control space and headers for one `recvmmsg` of up to `count`
/// datagrams of `slot` bytes each.
pub(crate) struct RecvHeaders {
    slot: usize,
    bufs: Box<[u8]>,
    names: Box<[libc::sockaddr_storage]>,
    ctrl: Box<[RecvCtrl]>,
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    /// Datagrams the last call received.
    filled: usize,
    /// Entries the kernel may have written since they were set up (reset before the next
    /// call; the others keep the values `new` gave them).
    dirty: usize,
}

// SAFETY: the raw pointers inside `iovs`/`hdrs` only ever point into the boxes owned by the
// same value, which never move or change size, so moving the value to another thread is sound.
unsafe impl Send for RecvHeaders {}

impl RecvHeaders {
    /// `count` buffers (at least one) of `slot` bytes.
    pub fn new(count: usize, slot: usize) -> RecvHeaders {
        let count = count.max(1);
        let mut b = RecvHeaders {
            slot,
            bufs: vec![0u8; count * slot].into_boxed_slice(),
            // SAFETY: all-zero is valid for these plain C structs.
            names: (0..count).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![RecvCtrl::new(); count].into_boxed_slice(),
            iovs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            hdrs: (0..count).map(|_| unsafe { zeroed() }).collect(),
            filled: 0,
            dirty: count,
        };
        // The boxed slices never move or change size: the pointers are set up once.
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

    /// Receives up to `max` datagrams from `fd` without blocking; returns how many (0 when
    /// none was waiting, or the call was interrupted).
    pub fn recv(&mut self, fd: BorrowedFd<'_>, max: usize) -> std::io::Result<usize> {
        let n = max.clamp(1, self.capacity());
        self.filled = 0;
        // only what the kernel wrote into the entries of the last call is reset (a busy
        // poll's empty calls cost no setup)
        for i in 0..self.dirty.max(1).min(self.capacity()) {
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_namelen = STORAGE_LEN;
            h.msg_controllen = RecvCtrl::LEN as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        self.dirty = 0;
        // SAFETY: the first `n` headers point into buffers owned by `self` with the sizes
        // given; `fd` is open for the call.
        let rc = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
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
        self.filled = (rc as usize).min(n);
        self.dirty = self.filled;
        Ok(self.filled)
    }

    /// The `i`-th datagram of the last [`RecvHeaders::recv`].
    pub fn get(&mut self, i: usize) -> Option<RecvEntry<'_>> {
        if i >= self.filled {
            return None;
        }
        let hdr = &self.hdrs[i];
        let len = (hdr.msg_len as usize).min(self.slot);
        Some(RecvEntry {
            name: &self.names[i],
            ctrl: self.ctrl[i].messages(hdr.msg_hdr.msg_controllen),
            truncated: hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            data: &mut self.bufs[i * self.slot..i * self.slot + len],
        })
    }
}

/// Headers, iovecs and control space for `sendmmsg` runs of up to `msgs` messages made of up
/// to `iovs` datagrams in all. [`SendHeaders::load`] fills them with borrowed buffers.
pub(crate) struct SendHeaders {
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    ctrl: Box<[SendCtrl]>,
}

// SAFETY: the raw pointers in `iovs`/`hdrs` are only used while a `Loaded` borrows this value
// and the memory they point to; between loads they are never read.
unsafe impl Send for SendHeaders {}

impl SendHeaders {
    /// Room for `msgs` messages and `iovs` datagrams.
    pub fn new(msgs: usize, iovs: usize) -> SendHeaders {
        SendHeaders {
            // SAFETY: all-zero is valid for these plain C structs.
            iovs: (0..iovs.max(1)).map(|_| unsafe { zeroed() }).collect(),
            hdrs: (0..msgs.max(1)).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![SendCtrl::new(); msgs.max(1)].into_boxed_slice(),
        }
    }

    /// Starts a run: messages are added to the returned value, which borrows the datagrams
    /// and addresses it is given for as long as it lives.
    pub fn load<'a>(&'a mut self) -> Loaded<'a> {
        Loaded {
            h: self,
            msgs: 0,
            iovs: 0,
            _data: PhantomData,
        }
    }
}

/// The messages of one run ([`SendHeaders::load`]).
pub(crate) struct Loaded<'a> {
    h: &'a mut SendHeaders,
    msgs: usize,
    iovs: usize,
    _data: PhantomData<&'a [u8]>,
}

impl<'a> Loaded<'a> {
    /// Messages added.
    pub fn len(&self) -> usize {
        self.msgs
    }

    /// Adds a message with its first datagram `data`, to `to` (`None`: the socket is
    /// connected). False when the headers are full.
    pub fn message(
        &mut self,
        to: Option<&'a (libc::sockaddr_storage, libc::socklen_t)>,
        data: &'a [u8],
    ) -> bool {
        if self.msgs >= self.h.hdrs.len() || self.iovs >= self.h.iovs.len() {
            return false;
        }
        self.h.iovs[self.iovs] = libc::iovec {
            // the kernel only reads a sent buffer
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut m: libc::msghdr = unsafe { zeroed() };
        if let Some((name, len)) = to {
            m.msg_name =
                (name as *const libc::sockaddr_storage as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = *len;
        }
        m.msg_iov = &mut self.h.iovs[self.iovs];
        m.msg_iovlen = 1;
        self.h.hdrs[self.msgs] = libc::mmsghdr {
            msg_hdr: m,
            msg_len: 0,
        };
        self.msgs += 1;
        self.iovs += 1;
        true
    }

    /// Adds datagram `data` to the last message (a GSO segment). False when there is none
    /// or the iovecs are full.
    pub fn append(&mut self, data: &'a [u8]) -> bool {
        if self.msgs == 0 || self.iovs >= self.h.iovs.len() {
            return false;
        }
        self.h.iovs[self.iovs] = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        self.h.hdrs[self.msgs - 1].msg_hdr.msg_iovlen += 1;
        self.iovs += 1;
        true
    }

    /// Gives message `m` the control messages `cmsgs` (level, type, data).
    pub fn control(&mut self, m: usize, cmsgs: &[(i32, i32, &[u8])]) {
        if m >= self.msgs {
            return;
        }
        let (c, h) = (&mut self.h.ctrl[m], &mut self.h.hdrs[m]);
        let len = c.fill(cmsgs);
        h.msg_hdr.msg_control = c.as_mut_ptr();
        h.msg_hdr.msg_controllen = len as _;
    }

    /// Sends messages `from..` on `fd` (one `sendmsg` when one is left: `sendmmsg` costs
    /// more per call); returns how many the kernel took.
    pub fn send(&mut self, fd: BorrowedFd<'_>, from: usize) -> std::io::Result<usize> {
        let rest = &mut self.h.hdrs[from.min(self.msgs)..self.msgs];
        let rc = match rest.len() {
            0 => return Ok(0),
            // SAFETY: the header points at iovecs, addresses and buffers this value borrows
            // (and its own control space); `fd` is open for the call.
            1 => match unsafe { libc::sendmsg(fd.as_raw_fd(), &rest[0].msg_hdr, 0) } {
                r if r < 0 => -1,
                _ => 1,
            },
            // SAFETY: as above, for every header of `rest`.
            n => unsafe { libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), n as _, 0) },
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(rc as usize)
    }
}

/// Waits up to `ms` milliseconds for `fd` to take more data (a full socket buffer).
pub(crate) fn wait_writable(fd: BorrowedFd<'_>, ms: i32) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
