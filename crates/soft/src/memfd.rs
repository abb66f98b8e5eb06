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
    create(name, size, true)
}

/// A memfd of `size` zero bytes that cannot be sealed (tests: a file a peer must refuse).
#[cfg(test)]
pub(crate) fn unsealed(name: &CStr, size: usize) -> io::Result<OwnedFd> {
    create(name, size, false)
}

/// A memfd of `size` zero bytes (close-on-exec), allowing seals when `sealable`.
fn create(name: &CStr, size: usize, sealable: bool) -> io::Result<OwnedFd> {
    let flags = if sealable {
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING
    } else {
        libc::MFD_CLOEXEC
    };
    // SAFETY: a C string name; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
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
    use std::os::unix::fs::FileExt;

    /// `fd` as a file (a new descriptor of the same open file).
    fn file(fd: BorrowedFd<'_>) -> File {
        File::from(fd.try_clone_to_owned().unwrap())
    }

    #[test]
    fn a_sealed_file_keeps_its_size_and_says_so() {
        let fd = sealed(c"test", 8192).unwrap();
        assert!(size_sealed(fd.as_fd()));
        assert!(file(fd.as_fd()).set_len(0).is_err(), "cannot shrink");
        assert!(file(fd.as_fd()).set_len(1 << 20).is_err(), "cannot grow");
        assert!(add_seals(&fd, libc::F_SEAL_WRITE).is_err(), "sealed seals");
        let plain = unsealed(c"plain", 0).unwrap();
        assert!(!size_sealed(plain.as_fd()));
    }

    /// What a peer can do with a region file it was handed: read it, nothing else.
    #[test]
    fn a_region_file_handed_to_peers_cannot_be_written_through() {
        let region = crate::verbs::shared_mem::SharedBytes::new_shared_zeroed(8192);
        region.write(10, b"ours");
        let fd = region.file().expect("a memfd region");
        let size = 4096 + 8192;
        assert!(
            Mapping::shared(fd, size, true).is_err(),
            "no writable mapping"
        );
        assert!(file(fd).write_at(b"x", 4096).is_err(), "no pwrite");
        // a reopen through /proc is a new open file, with the same seals
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Ok(re) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            assert!(
                Mapping::shared(re.as_fd(), size, true).is_err(),
                "reopen: no mapping"
            );
            assert!(re.write_at(b"x", 4096).is_err(), "reopen: no pwrite");
        }
        // reading works, sees our writes, and cannot be turned into writing
        let ro = Mapping::shared(fd, size, false).unwrap();
        // SAFETY: in bounds of the read-only mapping, which lives until the end.
        let seen = unsafe { std::slice::from_raw_parts(ro.ptr().as_ptr().add(4096 + 10), 4) };
        assert_eq!(seen, b"ours");
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: our mapping; the result is checked.
        let rc = unsafe { libc::mprotect(ro.ptr().as_ptr().cast(), size, rw) };
        assert!(rc < 0, "no mprotect to writable");
        drop(ro);
        // we still write our region
        region.write(10, b"more");
        let mut got = [0u8; 4];
        region.read(10, &mut got);
        assert_eq!(&got, b"more");
    }
}
