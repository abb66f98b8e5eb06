//! Shared-memory files whose size nobody can change: the host-local rings and the region
//! files of pulled WRITEs. A process maps a file another process made; if the maker could
//! shrink it afterwards, a read of the mapping past the new end would kill the reader
//! (`SIGBUS`). So the maker seals the size (`F_SEAL_SHRINK`, `F_SEAL_GROW`, then
//! `F_SEAL_SEAL`) before handing the file over, and a reader maps only a sealed file.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The seals a shared file must carry.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A memfd of `size` zero bytes whose size is sealed.
pub(crate) fn sealed(name: &CStr, size: usize) -> io::Result<OwnedFd> {
    // SAFETY: a C string name; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len =
        libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: plain calls on our descriptor; results checked.
    unsafe {
        if libc::ftruncate(raw, len) < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::fcntl(raw, libc::F_ADD_SEALS, SIZE_SEALS | libc::F_SEAL_SEAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Whether `fd`'s size is sealed (it cannot shrink or grow).
pub(crate) fn size_sealed(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: a plain query on a live descriptor.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & SIZE_SEALS == SIZE_SEALS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_sealed_file_keeps_its_size_and_says_so() {
        let fd = sealed(c"test", 8192).unwrap();
        assert!(size_sealed(fd.as_fd()));
        // SAFETY: plain calls on our descriptor.
        unsafe {
            assert!(libc::ftruncate(fd.as_raw_fd(), 0) < 0, "cannot shrink");
            assert!(libc::ftruncate(fd.as_raw_fd(), 1 << 20) < 0, "cannot grow");
            assert!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) < 0);
        }
        // SAFETY: a plain call.
        let plain = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(plain >= 0);
        // SAFETY: fresh descriptor.
        let plain = unsafe { OwnedFd::from_raw_fd(plain) };
        assert!(!size_sealed(plain.as_fd()));
    }
}
