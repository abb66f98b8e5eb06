//! The network namespace a context was made in. The progress engine is one thread per
//! process, but a context (and everything it opens: sockets, netlink queries, device MTU
//! lookups) belongs to the namespace of the thread that created it, so the engine enters
//! that namespace while it runs the context's CM, and only when it differs from the one the
//! engine thread is in (never, for a process that stays in one namespace).

use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A handle on a network namespace.
#[derive(Debug)]
pub(crate) struct NetNs {
    fd: OwnedFd,
    ino: u64,
}

thread_local! {
    /// The namespace this thread is in, as far as [`NetNs::enter`] knows (0: not looked up).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

fn open_current() -> std::io::Result<NetNs> {
    let path = c"/proc/thread-self/ns/net";
    // SAFETY: a valid C string; the fd is owned right after.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and a live stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NetNs { fd, ino: st.st_ino })
}

impl NetNs {
    /// The calling thread's namespace.
    pub(crate) fn current() -> std::io::Result<NetNs> {
        let ns = open_current()?;
        CURRENT.with(|c| c.set(ns.ino));
        Ok(ns)
    }

    /// Puts the calling thread into this namespace until the guard drops (nothing to do
    /// when it is there already). `None` when the switch failed (no privilege): the caller
    /// runs in the thread's own namespace then.
    pub(crate) fn enter(&self) -> Option<Entered> {
        let cur = CURRENT.with(|c| c.get());
        let cur = if cur == 0 {
            let ino = open_current().ok()?.ino;
            CURRENT.with(|c| c.set(ino));
            ino
        } else {
            cur
        };
        if cur == self.ino {
            return Some(Entered(None));
        }
        let back = open_current().ok()?;
        // SAFETY: a valid namespace fd.
        if unsafe { libc::setns(self.fd.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
            return None;
        }
        CURRENT.with(|c| c.set(self.ino));
        Some(Entered(Some(back)))
    }
}

/// See [`NetNs::enter`]: returns the thread to where it was.
pub(crate) struct Entered(Option<NetNs>);

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(back) = self.0.take() {
            // SAFETY: a valid namespace fd. Failing to return (not expected: we came from
            // there) leaves the thread where it is; CURRENT says so.
            if unsafe { libc::setns(back.fd.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
                CURRENT.with(|c| c.set(back.ino));
            }
        }
    }
}
