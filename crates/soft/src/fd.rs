//! The one eventfd wrapper and the one `poll(2)` helper of the workspace: the engine's
//! doorbell, the GSI queue, completion channels and the CM's channels all use them; and the
//! crate's safe calls on epoll sets, `flock` and user ids.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// A non-blocking eventfd used as a level-triggered "something is ready" flag.
///
/// ```
/// use rdma_soft::fd::{wait_readable, EventFd};
/// let e = EventFd::new()?;
/// assert!(!wait_readable(&[e.raw()], Some(std::time::Instant::now()))?);
/// e.signal();
/// assert!(wait_readable(&[e.raw()], None)?);
/// e.clear();
/// assert!(!wait_readable(&[e.raw()], Some(std::time::Instant::now()))?);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh, clear eventfd (non-blocking, close-on-exec).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a valid fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. EAGAIN (counter full) leaves it readable.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the fd not readable.
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when already clear.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The raw fd (for epoll / poll sets).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl From<OwnedFd> for EventFd {
    /// An eventfd received from elsewhere (another process's, over `SCM_RIGHTS`).
    fn from(fd: OwnedFd) -> EventFd {
        EventFd(fd)
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks in `poll(2)` until one of `fds` (any number) is readable or `until` passes
/// (`None`: forever). True when an fd was readable; EINTR is a wake-up with nothing ready.
/// A deadline is rounded up to the next millisecond, so a wait never ends just before it.
pub fn wait_readable(fds: &[RawFd], until: Option<Instant>) -> io::Result<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = match until {
        None => -1,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        }
    };
    // SAFETY: `pfds` is a valid array of pollfd of the given length for the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

/// A new epoll set (close-on-exec).
pub(crate) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a valid fd is owned at once.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `epoll_ctl(op)` of `fd` in `epoll` with `events` and `token` (ignored by DEL). `fd` is a
/// number to the kernel: a closed one fails with EBADF.
pub(crate) fn epoll_ctl(
    epoll: BorrowedFd<'_>,
    op: i32,
    fd: RawFd,
    events: u32,
    token: u64,
) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: `ev` is a live event for the call's duration.
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `epoll_wait` on `epoll` into `evs` for up to `timeout_ms` (-1: forever); the number of
/// events filled.
pub(crate) fn epoll_wait(
    epoll: BorrowedFd<'_>,
    evs: &mut [libc::epoll_event],
    timeout_ms: i32,
) -> io::Result<usize> {
    let max = evs.len().min(i32::MAX as usize) as i32;
    // SAFETY: `evs` is writable for `max` entries.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), evs.as_mut_ptr(), max, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `flock(op)` on `fd`.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: i32) -> io::Result<()> {
    // SAFETY: flock takes no pointers.
    if unsafe { libc::flock(fd.as_raw_fd(), op) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The real user id of the process.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The effective user id of the process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
