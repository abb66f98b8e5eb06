//! errno, NULL checks and small conversions shared by both halves.

use std::ptr::null_mut;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: glibc's thread-local errno location is always valid.
    unsafe { *libc::__errno_location() = e };
}

/// `NULL` with `errno = e` (the C ABI's failure for calls returning a pointer).
pub fn null_err<T>(e: i32) -> *mut T {
    set_errno(e);
    null_mut()
}

/// `e` with `errno = e` too (libibverbs' calls that return an errno: rdma-core's comes from
/// a failed `write`, which sets it).
pub fn errno_too(e: i32) -> libc::c_int {
    set_errno(e);
    e
}

/// `-1` with `errno = e` (librdmacm's failure convention).
pub fn minus_one(e: i32) -> libc::c_int {
    set_errno(e);
    -1
}

/// Copies `s` into a C char array, NUL-terminated and truncated to fit.
pub fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

/// The errno of an `rdma-soft` error.
pub fn soft_errno(e: &rdma_soft::Error) -> i32 {
    e.errno()
}

/// The errno of an `rdmacm` error.
pub fn cm_errno(e: &rdmacm::Error) -> i32 {
    e.errno()
}

/// Moves `v` to the heap for C and returns the pointer (freed by [`unbox`]).
pub fn boxed<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Takes back a value made by [`boxed`].
///
/// # Safety
/// `p` came from [`boxed`] for this `T` and is not used again.
pub unsafe fn unbox<T>(p: *mut T) -> T {
    // SAFETY: forwarded from the caller.
    *unsafe { Box::from_raw(p) }
}

/// The fd an application polls in place of one of the layers' own (non-blocking) eventfds:
/// an epoll instance watching it, readable exactly when it is. Its own flags are the
/// application's: it starts blocking, as rdma-core's fds do, and `O_NONBLOCK` set on it with
/// `fcntl` makes the matching call return EAGAIN instead of waiting ([`is_nonblocking`]).
pub fn poll_proxy(inner: libc::c_int) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system calls; the new fd is owned by the result.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = std::os::fd::OwnedFd::from_raw_fd(ep);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        if libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, inner, &mut ev) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(owned)
    }
}

/// Whether the application made `fd` non-blocking.
pub fn is_nonblocking(fd: libc::c_int) -> bool {
    // SAFETY: reads the fd's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
}

/// Blocks until `fd` is readable, as rdma-core's blocking `read` of a channel's fd does,
/// signals included: the kernel ends that read with `EINTR` when a signal handler without
/// `SA_RESTART` ran (qperf ends its tests with a `SIGALRM` that must interrupt
/// `ibv_get_cq_event`) and restarts it otherwise. `poll` cannot tell which handler ran, so
/// an interrupted wait is `Err(EINTR)` when any installed handler lacks `SA_RESTART`, and
/// waits on when every one has it.
pub fn wait_readable_or_signal(fd: libc::c_int) -> Result<(), i32> {
    wait_readable_while_open(fd, &|| true)
}

/// [`wait_readable_or_signal`] on the fd of a channel another thread may destroy meanwhile
/// (the caller holds the fd open): a wait restarted after `open()` turned false fails with
/// `EBADF`, as the kernel's restart of rdma-core's `read` finds the fd closed. Until a
/// signal comes, the wait goes on, as that `read` does (a close does not wake it).
pub fn wait_readable_while_open(fd: libc::c_int, open: &dyn Fn() -> bool) -> Result<(), i32> {
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let rc = unsafe { libc::poll(&mut p, 1, -1) };
        if rc > 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if rc < 0 && e != libc::EINTR {
            return Err(e);
        }
        if rc < 0 && !every_handler_restarts() {
            return Err(libc::EINTR);
        }
        if !open() {
            return Err(libc::EBADF);
        }
    }
}

/// Whether every signal with a handler installed has `SA_RESTART`.
fn every_handler_restarts() -> bool {
    (1..=libc::SIGRTMAX()).all(|sig| {
        // SAFETY: sigaction with a null new action only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        rc != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}
