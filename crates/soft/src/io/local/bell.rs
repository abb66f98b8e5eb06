//! A host-local wire's bell: a Unix datagram socket bound in the per-user runtime
//! directory. Peers send it a new ring (its memfd, `SCM_RIGHTS`) and wake-ups.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// A bound, non-blocking Unix datagram socket; unlinked on drop.
pub(crate) struct Bell {
    fd: OwnedFd,
    path: PathBuf,
}

fn sockaddr(path: &Path) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a plain C struct, zeroed.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, &s) in a.sun_path.iter_mut().zip(b) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + b.len() + 1;
    Ok((a, len as libc::socklen_t))
}

/// A non-blocking, close-on-exec Unix datagram socket.
fn dgram_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket; checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Bell {
    /// Binds `path` (a stale file there is removed first: the caller owns the name).
    pub fn bind(path: PathBuf) -> std::io::Result<Bell> {
        let (addr, len) = sockaddr(&path)?;
        let fd = dgram_socket()?;
        let raw = fd.as_raw_fd();
        let _ = std::fs::remove_file(&path);
        // SAFETY: a live sockaddr of `len` bytes.
        if unsafe { libc::bind(raw, (&addr as *const libc::sockaddr_un).cast(), len) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // every message then carries its sender's pid and uid, as the kernel knows them
        let on: libc::c_int = 1;
        // SAFETY: a live int option on our socket.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Bell { fd, path })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends `msg` to the bell at `to`, with `pass` as `SCM_RIGHTS` when given. Fails
    /// with `ECONNREFUSED` / `ENOENT` when nobody is bound there (its owner died).
    pub fn send(&self, to: &Path, msg: &[u8], pass: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
        let (mut addr, alen) = sockaddr(to)?;
        let mut iov = libc::iovec {
            iov_base: msg.as_ptr() as *mut libc::c_void,
            iov_len: msg.len(),
        };
        // room for one fd, u64-aligned
        let mut cbuf = [0u64; 4];
        // SAFETY: a plain C struct, zeroed, then filled with live pointers.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
        hdr.msg_namelen = alen;
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if let Some(fd) = pass {
            // SAFETY: CMSG_SPACE of one int fits the 32-byte buffer.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            hdr.msg_control = cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = space;
            // SAFETY: the control buffer is set up above and large enough for one cmsg.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&hdr);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
                libc::CMSG_DATA(c)
                    .cast::<RawFd>()
                    .write_unaligned(fd.as_raw_fd());
            }
        }
        // SAFETY: a live msghdr; MSG_DONTWAIT: a full peer queue is an error, not a wait.
        let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &hdr, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// A socket connected to the bell at `path`, for [`Bell::ring`]: a wake-up through it
    /// costs no path lookup (a `sendmsg` to a name walks the path every time).
    pub fn connect(path: &Path) -> std::io::Result<OwnedFd> {
        let (addr, len) = sockaddr(path)?;
        let fd = dgram_socket()?;
        let raw = fd.as_raw_fd();
        // SAFETY: a live sockaddr of `len` bytes.
        if unsafe { libc::connect(raw, (&addr as *const libc::sockaddr_un).cast(), len) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// Sends the one-byte `msg` through a socket from [`Bell::connect`]. Fails with
    /// `ECONNREFUSED` when the bell's owner closed it (died), `EAGAIN` when its queue is
    /// full.
    pub fn ring(conn: BorrowedFd<'_>, msg: u8) -> std::io::Result<()> {
        // SAFETY: a one-byte live buffer; MSG_DONTWAIT: a full queue is an error.
        let n = unsafe {
            libc::send(
                conn.as_raw_fd(),
                (&msg as *const u8).cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives every queued message (at most `max`), each with the fd it carried and its
    /// sender's user: one `recvmmsg` per [`BATCH`] messages (a wake-up usually finds
    /// one or two).
    pub fn drain(&self, max: usize, mut each: impl FnMut(&[u8], Option<OwnedFd>, Option<Sender>)) {
        let mut left = max;
        while left > 0 {
            let want = left.min(BATCH);
            let mut bufs = [[0u8; 64]; BATCH];
            let mut cbufs = [[0u64; 8]; BATCH];
            // SAFETY: plain C structs, zeroed, then filled with live pointers below.
            let mut iovs: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            for k in 0..want {
                iovs[k] = libc::iovec {
                    iov_base: bufs[k].as_mut_ptr().cast(),
                    iov_len: 64,
                };
                let h = &mut hdrs[k].msg_hdr;
                h.msg_iov = &mut iovs[k];
                h.msg_iovlen = 1;
                h.msg_control = cbufs[k].as_mut_ptr().cast();
                h.msg_controllen = std::mem::size_of_val(&cbufs[k]);
            }
            // SAFETY: `want` live headers; received fds are close-on-exec.
            let n = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    want as u32,
                    libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
                    std::ptr::null_mut(),
                )
            };
            if n <= 0 {
                return;
            }
            let n = n as usize;
            for k in 0..n {
                let hdr = &hdrs[k].msg_hdr;
                let mut got: Option<OwnedFd> = None;
                let mut sender = None;
                // SAFETY: walking the control messages the kernel wrote into `cbufs[k]`;
                // every fd it passed is taken into an OwnedFd (so extra ones are closed,
                // not leaked).
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(hdr);
                    while !c.is_null() {
                        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS
                        {
                            let data = libc::CMSG_DATA(c).cast::<RawFd>();
                            let room = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                            for i in 0..room / std::mem::size_of::<RawFd>() {
                                let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                                if got.is_none() {
                                    got = Some(fd);
                                }
                            }
                        }
                        if (*c).cmsg_level == libc::SOL_SOCKET
                            && (*c).cmsg_type == libc::SCM_CREDENTIALS
                            && (*c).cmsg_len
                                >= libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32)
                                    as usize
                        {
                            let u = libc::CMSG_DATA(c).cast::<libc::ucred>().read_unaligned();
                            sender = Some(Sender { uid: u.uid });
                        }
                        c = libc::CMSG_NXTHDR(hdr, c);
                    }
                }
                let len = (hdrs[k].msg_len as usize).min(64);
                each(&bufs[k][..len], got, sender);
            }
            if n < want {
                return;
            }
            left -= n;
        }
    }
}

/// `fd` as an eventfd we may write without blocking, or `None` when it is anything else
/// (a pipe, a socket, a file: a peer's `MSG_EFD` is untrusted). It is made non-blocking
/// here; a same-user peer that clears `O_NONBLOCK` on the shared file later is not caught.
pub(crate) fn eventfd(fd: OwnedFd) -> Option<crate::fd::EventFd> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return None;
    }
    // SAFETY: plain flag calls on a live descriptor; results checked.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return None;
        }
    }
    Some(crate::fd::EventFd::from(fd))
}

/// Who sent a bell message, as the kernel reports it (`SCM_CREDENTIALS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sender {
    pub uid: u32,
}

/// Bell messages read per `recvmmsg`.
const BATCH: usize = 8;

impl Drop for Bell {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
