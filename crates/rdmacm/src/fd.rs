//! Small fd helpers: an eventfd and `poll(2)` over a set of fds with a deadline.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// A non-blocking eventfd used as a level-triggered "something is ready" flag.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a valid fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. EAGAIN (counter full) is harmless.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the fd not readable.
    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when already clear.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks until one of `fds` is readable or `deadline` passes (no deadline: forever).
/// Returns true when an fd was readable.
pub(crate) fn poll_readable(fds: &[RawFd], deadline: Option<Instant>) -> bool {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = match deadline {
        None => -1,
        Some(d) => {
            let now = Instant::now();
            if d <= now {
                0
            } else {
                // Round up so that we do not wake just before the deadline.
                let ms = (d - now).as_micros().div_ceil(1000);
                ms.min(i32::MAX as u128) as i32
            }
        }
    };
    // SAFETY: pfds is a live array of pollfd of the given length.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
    n > 0
}
