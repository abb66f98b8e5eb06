//! Shared-memory files whose size nobody can change: the host-local rings and the region
//! files of pulled WRITEs. A process maps a file another process made; if the maker could
//! shrink it afterwards, a read of the mapping past the new end would kill the reader
//! (`SIGBUS`). So the maker seals the size (`F_SEAL_SHRINK`, `F_SEAL_GROW`, then
//! `F_SEAL_SEAL`) before handing the file over, and a reader maps only a sealed file.
//!
//! A region file peers only read ([`mapped_for_readers`]) is also sealed against writes
//! (`F_SEAL_FUTURE_WRITE`) once its maker has its own writable mapping: a peer holding the
//! descriptor can neither map it writable, `pwrite` it, nor write through a reopen of it.
//!
//! This module is the crate's mmap/memfd edge: [`Mapping`] owns a shared mapping (its Drop
//! unmaps), and the memfd calls are safe functions over `OwnedFd`/`BorrowedFd`. What users
//! do with the mapped bytes (atomics on memory another process writes) stays in their own
//! named modules (`io/local/ring.rs`, `verbs/shared_mem.rs`).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

/// A shared mapping of a file (`MAP_SHARED`), unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; no thread-bound state.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` gives out an address and checked atomics only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The first `len` bytes of `fd` mapped shared, read-write or read-only.
    pub fn shared(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping at an address the kernel picks; it aliases nothing of
        // ours. The result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Mapping { ptr, len })
    }

    /// The first mapped byte (valid for [`Mapping::len`] bytes while `self` lives).
    #[inline]
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The mapped length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The 4-byte word at `off` as an atomic; `None` when out of bounds or unaligned.
    pub fn atomic_u32(&self, off: usize) -> Option<&AtomicU32> {
        let fits = off.checked_add(4).is_some_and(|end| end <= self.len);
        let addr = (self.ptr.as_ptr() as usize).wrapping_add(off);
        (fits && addr % 4 == 0).then(|| {
            // SAFETY: in bounds and aligned (checked); the mapping lives as long as the
            // borrow, and shared memory is only ever accessed atomically through this.
            unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `shared` mapped, once; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The size of the file `fd` (`fstat`), keeping the descriptor.
pub(crate) fn file_size(fd: OwnedFd) -> (OwnedFd, io::Result<u64>) {
    let f = File::from(fd);
    let size = f.metadata().map(|m| m.len());
    (OwnedFd::from(f), size)
}

/// The seals a shared file must carry.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A memfd of `size` zero bytes whose size is sealed.
pub(crate) fn sealed(name: &CStr, size: usize) -> io::Result<OwnedFd> {
    let fd = sized(name, size)?;
    add_seals(&fd, SIZE_SEALS | libc::F_SEAL_SEAL)?;
    Ok(fd)
}

/// A memfd of `size` zero bytes mapped read-write here, then sealed so that nobody else
/// can write it: its size, new writable mappings and `write`s (`F_SEAL_FUTURE_WRITE`).
/// Our own mapping stays writable.
pub(crate) fn mapped_for_readers(name: &CStr, size: usize) -> io::Result<(OwnedFd, Mapping)> {
    let fd = sized(name, size)?;
    let map = Mapping::shared(std::os::fd::AsFd::as_fd(&fd), size, true)?;
    // on failure the mapping drops: unmapped
    add_seals(
        &fd,
        SIZE_SEALS | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
    )?;
    Ok((fd, map))
}

/// Adds `seals` to our memfd.
fn add_seals(fd: &OwnedFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain call on our descriptor; the result is checked.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A memfd of `size` zero bytes that allows sealing, not sealed yet.
fn sized(name: &CStr, size: usize) -> io::Result<OwnedFd> {
    // SAFETY: a C string name; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned here.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    let len = u64::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    f.set_len(len)?;
    Ok(OwnedFd::from(f))
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

    /// What a peer can do with a region file it was handed: read it, nothing else.
    #[test]
    fn a_region_file_handed_to_peers_cannot_be_written_through() {
        let region = crate::verbs::shared_mem::SharedBytes::new_shared_zeroed(8192);
        region.write(10, b"ours");
        let fd = region.file().expect("a memfd region");
        let raw = fd.as_raw_fd();
        let size = 4096 + 8192;
        let map = |fd: i32, prot| {
            // SAFETY: a fresh shared mapping of a live descriptor; the result is checked.
            unsafe { libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd, 0) }
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        assert_eq!(map(raw, rw), libc::MAP_FAILED, "no writable mapping");
        // SAFETY: pwrite from a live buffer.
        let n = unsafe { libc::pwrite(raw, b"x".as_ptr().cast(), 1, 4096) };
        assert!(n < 0, "no pwrite");
        // a reopen through /proc is a new open file, with the same seals
        let path = std::ffi::CString::new(format!("/proc/self/fd/{raw}")).unwrap();
        // SAFETY: a C string path; the result is checked.
        let re = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if re >= 0 {
            // SAFETY: a fresh descriptor owned here.
            let re = unsafe { OwnedFd::from_raw_fd(re) };
            assert_eq!(
                map(re.as_raw_fd(), rw),
                libc::MAP_FAILED,
                "reopen: no mapping"
            );
            // SAFETY: pwrite from a live buffer.
            let n = unsafe { libc::pwrite(re.as_raw_fd(), b"x".as_ptr().cast(), 1, 4096) };
            assert!(n < 0, "reopen: no pwrite");
        }
        // reading works, sees our writes, and cannot be turned into writing
        let ro = map(raw, libc::PROT_READ);
        assert_ne!(ro, libc::MAP_FAILED);
        // SAFETY: in bounds of the read-only mapping.
        let seen = unsafe { std::slice::from_raw_parts(ro.cast::<u8>().add(4096 + 10), 4) };
        assert_eq!(seen, b"ours");
        // SAFETY: our mapping; the results are checked.
        unsafe {
            assert!(libc::mprotect(ro, size, rw) < 0, "no mprotect to writable");
            libc::munmap(ro, size);
        }
        // we still write our region
        region.write(10, b"more");
        let mut got = [0u8; 4];
        region.read(10, &mut got);
        assert_eq!(&got, b"more");
    }
}
