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
//! unmaps), [`InPlace`] an application's range moved onto a region file at its own
//! addresses (its Drop makes the range private memory again, same bytes), and the memfd
//! calls are safe functions over `OwnedFd`/`BorrowedFd`. What users
//! do with the mapped bytes (atomics on memory another process writes) stays in their own
//! named modules (`io/local/ring.rs`, `verbs/shared_mem.rs`).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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

/// The system's page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: a plain query.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

/// An application's range moved onto a memfd in place (`ibv_reg_mr`'s memory, see
/// `verbs/in_place.rs`): the file holds a `header`-byte header, then the range's bytes,
/// which stay at the application's own addresses, now a shared mapping of the file that
/// peers can map read-only. Dropping it gives the application private memory back, with
/// the same bytes.
#[derive(Debug)]
pub(crate) struct InPlace {
    fd: OwnedFd,
    /// The header, mapped read-write here.
    header: Mapping,
    addr: NonNull<u8>,
    len: usize,
    header_len: usize,
}

// SAFETY: addresses and a descriptor; the bytes are accessed by their users, atomically.
unsafe impl Send for InPlace {}
// SAFETY: `&InPlace` gives out the descriptor and the header mapping only.
unsafe impl Sync for InPlace {}

impl InPlace {
    /// Moves `len` bytes at `addr` onto a new memfd named `name`, after a header of
    /// `header_len` zero bytes, sealed as [`mapped_for_readers`] seals. `addr`, `len` and
    /// `header_len` must be page multiples (EINVAL otherwise). On error the range is as it
    /// was (or, if even the way back failed, an error is logged).
    ///
    /// # Safety
    /// `[addr, addr + len)` is private anonymous memory of this process, readable and
    /// writable, that nothing else in the process unmaps or remaps while the result lives.
    /// (The kernel copies the bytes here and in the drop: a write by another thread
    /// meanwhile may be lost, and a read meanwhile may see zeros; no Rust reference to the
    /// range is made.)
    pub unsafe fn new(
        name: &CStr,
        addr: NonNull<u8>,
        len: usize,
        header_len: usize,
    ) -> io::Result<InPlace> {
        let page = page_size();
        let a = addr.as_ptr() as usize;
        if len == 0 || a % page != 0 || len % page != 0 || header_len % page != 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd = sized(name, header_len + len)?;
        // the bytes into the file: the kernel reads the application's memory
        // SAFETY: `[addr, addr + len)` is readable (the caller).
        unsafe { pwrite_all(&fd, addr.as_ptr(), len, header_len)? };
        let header = Mapping::shared(fd.as_fd(), header_len, true)?;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: replaces exactly the caller's range, which is private anonymous memory
        // nobody else maps (the caller); the file has its bytes, so the application reads
        // the same bytes at the same addresses. The result is checked.
        let p = unsafe {
            libc::mmap(
                addr.as_ptr().cast(),
                len,
                rw,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                header_len as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // a failed MAP_FIXED may have unmapped the range: private memory again, with
            // the bytes from the file
            // SAFETY: the caller's range, as above.
            if let Err(back) = unsafe { restore(addr, len, &fd, header_len) } {
                tracing::error!(error = %back, "registered memory lost on a failed move");
            }
            return Err(e);
        }
        let me = InPlace {
            fd,
            header,
            addr,
            len,
            header_len,
        };
        // a child of fork() would share the range, not copy it: it gets none, as
        // rdma-core's registered memory with fork support on (MADV_DONTFORK)
        // SAFETY: advice on our own mapping; a failure leaves it forkable (logged).
        if unsafe { libc::madvise(addr.as_ptr().cast(), len, libc::MADV_DONTFORK) } != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "MADV_DONTFORK refused");
        }
        // our writable mappings exist: nobody else may get one from now on
        add_seals(
            &me.fd,
            SIZE_SEALS | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )?; // on failure `me` drops: given back
        Ok(me)
    }

    /// The file peers map.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The header, mapped read-write.
    pub fn header(&self) -> &Mapping {
        &self.header
    }

    /// The application's range, now a shared mapping of the file.
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Whether the range is still our shared mapping of the file (`/proc/self/maps`; yes
    /// when it cannot be read).
    fn still_ours(&self) -> bool {
        // SAFETY: a plain query on our descriptor into a zeroed struct; checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return true;
        }
        let Ok(maps) = crate::maps::read() else {
            return true;
        };
        let ours = |m: &crate::maps::Map<'_>| m.perms == "rw-s" && m.inode == st.st_ino;
        crate::maps::covered(&maps, self.addr.as_ptr() as usize, self.len, ours, "moved").is_ok()
    }

    /// Private anonymous memory in place of the shared mapping, holding the file's bytes.
    fn give_back(&mut self) -> io::Result<()> {
        // SAFETY: the application's range, which it still owns (`new`'s contract), and
        // still our mapping (checked by the caller).
        unsafe { restore(self.addr, self.len, &self.fd, self.header_len) }
    }
}

/// Maps fresh private anonymous memory over `[addr, addr + len)` and reads the bytes of
/// `fd` from `off` into it.
///
/// # Safety
/// The range is the caller's to replace: no other mapping of anyone else's is there.
unsafe fn restore(addr: NonNull<u8>, len: usize, fd: &OwnedFd, off: usize) -> io::Result<()> {
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: replaces the caller's range only (the caller) with fresh private memory;
    // checked.
    let p = unsafe {
        libc::mmap(
            addr.as_ptr().cast(),
            len,
            rw,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `len` writable bytes at `addr`, just mapped.
    unsafe { pread_all(fd, addr.as_ptr(), len, off) }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        // the application must not have unmapped the range while registered; if it did,
        // the addresses may be someone else's now: left alone
        if !self.still_ours() {
            tracing::warn!(
                addr = ?self.addr,
                len = self.len,
                "registered memory unmapped or remapped before deregistration: left as it is"
            );
            return;
        }
        if let Err(e) = self.give_back() {
            tracing::error!(
                error = %e,
                addr = self.addr.as_ptr() as usize,
                len = self.len,
                "registered memory could not be made private again"
            );
        }
    }
}

/// Writes `len` bytes at `src` to `fd` at `off`.
///
/// # Safety
/// `src` is readable for `len` bytes.
unsafe fn pwrite_all(fd: &OwnedFd, src: *const u8, len: usize, off: usize) -> io::Result<()> {
    all(len, |done| {
        // SAFETY: inside the caller's readable range.
        let p = unsafe { src.add(done) };
        // SAFETY: `len - done` readable bytes at `p`; the result is checked by `all`.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                p.cast(),
                len - done,
                (off + done) as libc::off_t,
            )
        }
    })
}

/// Reads `len` bytes of `fd` at `off` into `dst`.
///
/// # Safety
/// `dst` is writable for `len` bytes, and nothing else accesses them meanwhile.
unsafe fn pread_all(fd: &OwnedFd, dst: *mut u8, len: usize, off: usize) -> io::Result<()> {
    all(len, |done| {
        // SAFETY: inside the caller's writable range.
        let p = unsafe { dst.add(done) };
        // SAFETY: `len - done` writable bytes at `p`; the result is checked by `all`.
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                p.cast(),
                len - done,
                (off + done) as libc::off_t,
            )
        }
    })
}

/// Runs `call(done)` (a `pread`/`pwrite` of the rest) until `len` bytes are done; retries
/// after EINTR, EIO at the file's end.
fn all(len: usize, mut call: impl FnMut(usize) -> isize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        match call(done) {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::from_raw_os_error(libc::EIO)),
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return Err(io::Error::last_os_error()),
        }
    }
    Ok(())
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
    let map = Mapping::shared(fd.as_fd(), size, true)?;
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

    /// An application's range moved in place: same bytes at the same addresses, shared
    /// through the file (read-only for others), and private again when given back: a
    /// reader that still maps the file sees nothing the application writes afterwards.
    #[test]
    fn a_range_moved_in_place_is_shared_then_private_again() {
        let len = 4 * 4096;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh mapping where the kernel picks; checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, anon, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let addr = NonNull::new(p.cast::<u8>()).unwrap();
        // SAFETY: `len` bytes of our mapping, only ours.
        let bytes = |k: usize| unsafe { *addr.as_ptr().add(k) };
        // SAFETY: as above.
        let set = |k: usize, v: u8| unsafe { *addr.as_ptr().add(k) = v };
        for k in 0..len {
            set(k, (k % 251) as u8);
        }
        // SAFETY: our private anonymous mapping, page-aligned, untouched meanwhile.
        let moved = unsafe { InPlace::new(c"test-in-place", addr, len, 4096) }.unwrap();
        assert!((0..len).all(|k| bytes(k) == (k % 251) as u8), "same bytes");
        let ro = Mapping::shared(moved.fd(), 4096 + len, false).unwrap();
        // SAFETY: in bounds of the read-only mapping, alive below.
        let seen = |k: usize| unsafe { *ro.ptr().as_ptr().add(4096 + k) };
        set(5, 0xaa);
        assert_eq!(seen(5), 0xaa, "the reader sees the application's writes");
        assert!(
            Mapping::shared(moved.fd(), 4096 + len, true).is_err(),
            "read-only for others"
        );
        assert!(file(moved.fd()).write_at(b"x", 4096).is_err(), "no pwrite");
        drop(moved);
        assert_eq!(bytes(5), 0xaa, "bytes kept");
        assert!((6..len).all(|k| bytes(k) == (k % 251) as u8));
        set(5, 0xbb);
        set(9000, 0xcc);
        assert_eq!((bytes(5), bytes(9000)), (0xbb, 0xcc), "private memory");
        assert_eq!(seen(5), 0xaa, "the reader sees no later write");
        assert_eq!(seen(9000), (9000 % 251) as u8);
        // unaligned ranges are refused, untouched
        let at = NonNull::new(addr.as_ptr().wrapping_add(8)).unwrap();
        // SAFETY: refused before any change (unaligned).
        let e = unsafe { InPlace::new(c"test-in-place", at, 4096, 4096) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        // a range the application unmapped while registered (its bug) is left alone: the
        // way back writes nothing over what is there by then
        // SAFETY: our private anonymous mapping, untouched meanwhile.
        let moved = unsafe { InPlace::new(c"test-in-place", addr, len, 4096) }.unwrap();
        // SAFETY: replaces our own mapping (as an application's free + reuse would).
        let q = unsafe { libc::mmap(p, len, rw, anon | libc::MAP_FIXED, -1, 0) };
        assert_eq!(q, p);
        set(0, 0x77);
        set(len - 1, 0x77);
        drop(moved);
        assert_eq!((bytes(0), bytes(len - 1)), (0x77, 0x77), "overwritten");
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(p, len) };
    }
}
