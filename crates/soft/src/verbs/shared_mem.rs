//! Registered memory that the application and the device may touch at the same time.
//!
//! RDMA lets a remote peer write into memory while the local application reads it: with plain
//! `&mut [u8]` access that is a data race, undefined behaviour in Rust. So while memory is
//! registered, *every* access, by the device and by the application, goes through atomic
//! loads and stores with relaxed ordering: racing accesses give unspecified bytes (as on real
//! hardware) but never undefined behaviour. Ordering between the device's writes and the
//! application's reads comes from the completion queue (release on push, acquire on poll).
//!
//! Short copies split the buffer once by address: the 8-byte aligned middle is accessed as
//! `AtomicU64`, the unaligned head and tail as `AtomicU8`. Partial words use
//! `fetch_and`/`fetch_or` on the bytes concerned. Long copies, where word stores would halve
//! the speed, run as the CPU's own copy instructions in an `asm!` block, which is a byte-wise
//! relaxed atomic copy (`bulk_copy.rs`). Accesses of different sizes to one byte only meet
//! when the application races the device on it, and the byte is unspecified then, as on
//! hardware. RDMA atomics (8-byte aligned by the IB rules) are real `AtomicU64` operations,
//! atomic against local atomics on the same word ([`SharedBytes::atomic_u64`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

use super::bulk_copy;
use crate::memfd::{InPlace, Mapping};

/// Bytes before the data in a shared region's file: the `live` word (1 while registered).
pub(crate) const SHARED_HEADER: usize = 4096;
/// Shared regions a process holds at most: each keeps a descriptor open (to hand to
/// peers), and the application's descriptors must not run out for them. Past it, regions
/// are private memory (their WRITEs go through the ring with their data).
pub const MAX_SHARED_REGIONS: usize = 256;
/// Shared regions held now.
static SHARED_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An owned byte buffer accessed only atomically (see the module docs).
pub(crate) struct SharedBytes {
    ptr: NonNull<u8>,
    len: usize,
    /// Offsets of the aligned middle `[mid_start, mid_end)`.
    mid_start: usize,
    mid_end: usize,
    /// A memfd holding the bytes, which peer processes on the host map to read them
    /// (pulled WRITEs, `pull.rs`); `None`: a boxed slice or the caller's private memory.
    file: Option<RegionFile>,
    /// The caller's memory (`SharedBytes::borrowed`): never freed here.
    borrowed: bool,
}

/// The memfd of a shared region.
enum RegionFile {
    /// Ours, mapped whole here: the header, then the bytes at `ptr`.
    Own(OwnedFd, Mapping),
    /// The caller's range moved onto it at the caller's addresses (`ptr`); the header
    /// mapped apart. Dropping it makes the range private memory again.
    InPlace(InPlace),
}

impl RegionFile {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            RegionFile::Own(fd, _) => fd.as_fd(),
            RegionFile::InPlace(m) => m.fd(),
        }
    }

    /// A mapping that starts with the header (the `live` word).
    fn header(&self) -> &Mapping {
        match self {
            RegionFile::Own(_, map) => map,
            RegionFile::InPlace(m) => m.header(),
        }
    }

    /// Where the bytes are: after the header in our mapping, or the caller's addresses.
    fn data(&self) -> NonNull<u8> {
        match self {
            // SAFETY: the mapping is the header and then the bytes (`map_file`), so the
            // pointer is in it and not null.
            RegionFile::Own(_, map) => unsafe {
                NonNull::new_unchecked(map.ptr().as_ptr().add(SHARED_HEADER))
            },
            RegionFile::InPlace(m) => m.addr(),
        }
    }
}

// SAFETY: the buffer is owned and all access after construction is atomic.
unsafe impl Send for SharedBytes {}
// SAFETY: as above: shared access only through atomics.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// Takes ownership of `buf` (non-empty).
    pub fn new(buf: Box<[u8]>) -> SharedBytes {
        let len = buf.len();
        let raw = Box::into_raw(buf) as *mut u8;
        // SAFETY: Box::into_raw never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw) };
        let addr = raw as usize;
        let mid_start = (addr.next_multiple_of(8) - addr).min(len);
        let mid_end = mid_start + (len - mid_start) / 8 * 8;
        SharedBytes {
            ptr,
            len,
            mid_start,
            mid_end,
            file: None,
            borrowed: false,
        }
    }

    /// `len` bytes at `ptr` that the caller owns and frees (the C ABI's `ibv_reg_mr`).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` (non-zero) bytes until this value
    /// is dropped.
    pub unsafe fn borrowed(ptr: NonNull<u8>, len: usize) -> SharedBytes {
        let addr = ptr.as_ptr() as usize;
        let mid_start = (addr.next_multiple_of(8) - addr).min(len);
        SharedBytes {
            ptr,
            len,
            mid_start,
            mid_end: mid_start + (len - mid_start) / 8 * 8,
            file: None,
            borrowed: true,
        }
    }

    /// `len` zero bytes in a memfd mapped here, after a [`SHARED_HEADER`] whose `live` word
    /// is 1 until the bytes are dropped or given back, so that peer processes can map it
    /// read-only (the file's pages are zero until written); a boxed zeroed buffer when the
    /// file cannot be made.
    pub fn new_shared_zeroed(len: usize) -> SharedBytes {
        SharedBytes::shared(len, false, || {
            map_file(len).map(|(fd, map)| RegionFile::Own(fd, map))
        })
        .unwrap_or_else(|| SharedBytes::new(vec![0; len].into_boxed_slice()))
    }

    /// [`SharedBytes::borrowed`], with the caller's range moved onto a memfd at the
    /// same addresses and with the same bytes ([`InPlace`]), so that peer processes can
    /// map it as a region of [`SharedBytes::new_shared_zeroed`]; dropping the value makes
    /// the range private memory again, bytes kept. `None` (the range untouched, or as it
    /// was) when the move fails or [`MAX_SHARED_REGIONS`] are held.
    ///
    /// # Safety
    /// As [`SharedBytes::borrowed`] and [`InPlace::new`]: `ptr` and `len` are page
    /// multiples of private anonymous read-write memory, which nothing else unmaps or
    /// remaps while this value lives (a write by another thread during this call or the
    /// drop may be lost).
    pub unsafe fn borrowed_in_place(ptr: NonNull<u8>, len: usize) -> Option<SharedBytes> {
        SharedBytes::shared(len, true, || {
            // SAFETY: from the caller.
            unsafe { InPlace::new(c"rdma-mr", ptr, len, SHARED_HEADER) }.map(RegionFile::InPlace)
        })
    }

    /// `len` bytes in the region file `make` makes, its `live` word set, if one of the
    /// process's [`MAX_SHARED_REGIONS`] places is free; the place is given back when `make`
    /// fails. The bytes start at a page boundary, so the aligned middle is all but the tail.
    fn shared(
        len: usize,
        borrowed: bool,
        make: impl FnOnce() -> std::io::Result<RegionFile>,
    ) -> Option<SharedBytes> {
        if !claim(&SHARED_NOW, MAX_SHARED_REGIONS) {
            return None;
        }
        match make() {
            Ok(file) => {
                if let Some(live) = file.header().atomic_u32(0) {
                    live.store(1, Relaxed);
                }
                Some(SharedBytes {
                    ptr: file.data(),
                    len,
                    mid_start: 0,
                    mid_end: len / 8 * 8,
                    file: Some(file),
                    borrowed,
                })
            }
            Err(e) => {
                SHARED_NOW.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                tracing::debug!(error = %e, "memory region not shareable: kept private");
                None
            }
        }
    }

    /// The memfd peers map, for a shared region ([`SharedBytes::new_shared_zeroed`],
    /// [`SharedBytes::borrowed_in_place`]).
    pub fn file(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(RegionFile::fd)
    }

    /// Ends a shared buffer: `live` to 0 (peers that map the file stop reading it), then
    /// unmap (ours) or give the caller's range back as private memory (in place).
    fn unmap(&mut self) {
        if let Some(file) = self.file.take() {
            if let Some(live) = file.header().atomic_u32(0) {
                live.store(0, std::sync::atomic::Ordering::Release);
            }
            drop(file);
            SHARED_NOW.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Gives the buffer back. Needs `self` by value: no other access can be in flight.
    pub fn into_inner(self) -> Box<[u8]> {
        let mut me = std::mem::ManuallyDrop::new(self);
        if me.borrowed {
            // the caller keeps its memory (private again if it was moved): nothing to give
            me.unmap();
            return Box::new([]);
        }
        if me.file.is_some() {
            let mut out = vec![0u8; me.len].into_boxed_slice();
            // SAFETY: `len` mapped bytes; no other access is in flight (`self` by value).
            unsafe { std::ptr::copy_nonoverlapping(me.ptr.as_ptr(), out.as_mut_ptr(), me.len) };
            me.unmap();
            return out;
        }
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of this length, and `me`
        // will not free it again.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(me.ptr.as_ptr(), me.len)) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Start address, the region's virtual address as the peer sees it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        debug_assert!(off < self.len && (off < self.mid_start || off >= self.mid_end));
        // SAFETY: in bounds, and this byte is only ever accessed as an AtomicU8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(
            off >= self.mid_start && off + 8 <= self.mid_end && off % 8 == self.mid_start % 8
        );
        // SAFETY: in bounds, 8-byte aligned (mid_start is aligned), only accessed as AtomicU64.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }

    /// Whether `[off, off+len)` is inside the buffer.
    pub fn contains(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `src` to offset `off`. The caller checks bounds with [`SharedBytes::contains`].
    pub fn write(&self, off: usize, src: &[u8]) {
        // SAFETY: a slice is valid for its length and cannot overlap our atomic bytes.
        unsafe { self.write_raw(off, src.as_ptr(), src.len()) }
    }

    /// Copies `len` bytes from `src` to offset `off`. The caller checks bounds.
    ///
    /// # Safety
    /// `src` is valid for `len` reads (another process may write them meanwhile: those
    /// bytes are then unspecified) and does not overlap this buffer.
    pub unsafe fn write_raw(&self, off: usize, src: *const u8, len: usize) {
        assert!(self.contains(off, len), "bounds checked by the caller");
        // SAFETY: `[off, off + len)` is inside the buffer; `src` from the caller.
        if unsafe { bulk_copy::copy(self.ptr.as_ptr().add(off), src, len) } {
            return;
        }
        // SAFETY: from the caller; a short copy (the bulk copy takes the long ones).
        let src = unsafe { std::slice::from_raw_parts(src, len) };
        let mut i = 0;
        while i < src.len() {
            let at = off + i;
            if at < self.mid_start || at >= self.mid_end {
                self.byte(at).store(src[i], Relaxed);
                i += 1;
                continue;
            }
            let w = self.mid_start + (at - self.mid_start) / 8 * 8;
            let lo = at - w;
            let n = (8 - lo).min(src.len() - i);
            let word = self.word(w);
            if n == 8 {
                // Every whole word from here in one tight loop.
                let words = ((self.mid_end - at) / 8).min((src.len() - i) / 8);
                let run = &src[i..i + words * 8];
                for (k, c) in run.chunks_exact(8).enumerate() {
                    let v = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
                    self.word(at + k * 8).store(v, Relaxed);
                }
                i += words * 8;
                continue;
            } else {
                let mut mask = [0u8; 8];
                let mut val = [0u8; 8];
                mask[lo..lo + n].fill(0xff);
                val[lo..lo + n].copy_from_slice(&src[i..i + n]);
                word.fetch_and(!u64::from_ne_bytes(mask), Relaxed);
                word.fetch_or(u64::from_ne_bytes(val), Relaxed);
            }
            i += n;
        }
    }

    /// Copies from offset `off` into `dst`. The caller checks bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(
            self.contains(off, dst.len()),
            "bounds checked by the caller"
        );
        // SAFETY: `[off, off + len)` is inside the buffer; `dst` is ours alone.
        if unsafe { bulk_copy::copy(dst.as_mut_ptr(), self.ptr.as_ptr().add(off), dst.len()) } {
            return;
        }
        let mut i = 0;
        while i < dst.len() {
            let at = off + i;
            if at < self.mid_start || at >= self.mid_end {
                dst[i] = self.byte(at).load(Relaxed);
                i += 1;
                continue;
            }
            let w = self.mid_start + (at - self.mid_start) / 8 * 8;
            let lo = at - w;
            let n = (8 - lo).min(dst.len() - i);
            if n == 8 {
                // Every whole word from here in one tight loop.
                let words = ((self.mid_end - at) / 8).min((dst.len() - i) / 8);
                let run = &mut dst[i..i + words * 8];
                for (k, c) in run.chunks_exact_mut(8).enumerate() {
                    c.copy_from_slice(&self.word(at + k * 8).load(Relaxed).to_ne_bytes());
                }
                i += words * 8;
                continue;
            }
            let b = self.word(w).load(Relaxed).to_ne_bytes();
            dst[i..i + n].copy_from_slice(&b[lo..lo + n]);
            i += n;
        }
    }

    /// Sets `len` bytes at `off` to `value`. The caller checks bounds.
    pub fn fill(&self, off: usize, len: usize, value: u8) {
        let chunk = [value; 64];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.write(off + done, &chunk[..n]);
            done += n;
        }
    }

    /// The 8-byte word at `off` as an atomic, if `off` is inside and 8-byte aligned in memory.
    pub fn atomic_u64(&self, off: usize) -> Option<&AtomicU64> {
        let aligned = (self.addr() as usize).wrapping_add(off) % 8 == 0;
        (aligned && self.contains(off, 8)).then(|| self.word(off))
    }
}

impl Drop for SharedBytes {
    fn drop(&mut self) {
        if self.file.is_some() {
            self.unmap();
            return;
        }
        if self.borrowed {
            return;
        }
        // SAFETY: as in into_inner; drop runs once and no reference outlives `self`.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        });
    }
}

/// Takes one of `cap` places counted by `count`; false when none is left.
fn claim(count: &std::sync::atomic::AtomicUsize, cap: usize) -> bool {
    use std::sync::atomic::Ordering::AcqRel;
    count
        .fetch_update(AcqRel, Relaxed, |n| (n < cap).then_some(n + 1))
        .is_ok()
}

/// A memfd of [`SHARED_HEADER`] + `len` bytes, mapped read-write here and read-only for
/// anyone else: peers map it and must never find it shorter, nor write our memory.
fn map_file(len: usize) -> std::io::Result<(OwnedFd, Mapping)> {
    crate::memfd::mapped_for_readers(c"rdma-mr", SHARED_HEADER + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_buffer_holds_its_bytes_in_its_file_and_gives_them_back() {
        let orig: Vec<u8> = (0..20_000u32).map(|i| (i * 31) as u8).collect();
        let s = SharedBytes::new_shared_zeroed(orig.len());
        s.write(0, &orig);
        let fd = s.file().expect("a memfd").try_clone_to_owned().unwrap();
        assert_eq!(
            s.addr() % 4096,
            0,
            "the data starts a page after the header"
        );
        s.write(3, b"xyz");
        let mut got = vec![0u8; 5];
        s.read(1, &mut got);
        assert_eq!(got, [orig[1], orig[2], b'x', b'y', b'z']);
        // another mapping of the file sees the live word and the bytes
        let mut peek = [0u8; 8];
        // SAFETY: pread into a live buffer.
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                peek.as_mut_ptr().cast(),
                4,
                0,
            )
        };
        assert_eq!(
            (n, u32::from_ne_bytes(peek[..4].try_into().unwrap())),
            (4, 1)
        );
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                peek.as_mut_ptr().cast(),
                8,
                (SHARED_HEADER + 1) as i64,
            )
        };
        assert_eq!(n, 8);
        assert_eq!(&peek[2..5], b"xyz", "bytes 1..9: byte 3 is at 2");
        let mut want = orig;
        want[3..6].copy_from_slice(b"xyz");
        assert_eq!(s.into_inner().to_vec(), want);
        // given back: the file says so
        // SAFETY: as above.
        let n = unsafe {
            libc::pread(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                peek.as_mut_ptr().cast(),
                4,
                0,
            )
        };
        assert_eq!(
            (n, u32::from_ne_bytes(peek[..4].try_into().unwrap())),
            (4, 0)
        );
    }

    #[test]
    fn shared_places_are_bounded() {
        let count = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..3 {
            assert!(claim(&count, 3));
        }
        assert!(!claim(&count, 3), "past the bound");
        count.fetch_sub(1, Relaxed);
        assert!(claim(&count, 3), "a place given back is taken again");
        assert_eq!(count.load(Relaxed), 3);
    }

    #[test]
    fn every_offset_and_length_round_trips() {
        for start in 0..9 {
            // A buffer whose data starts at every alignment: slice a bigger one.
            let owner: Box<[u8]> = (0..64u8).collect();
            let s = SharedBytes::new(owner[start..start + 40].to_vec().into_boxed_slice());
            let mut model: Vec<u8> = (start as u8..start as u8 + 40).collect();
            for off in 0..40 {
                for len in 0..=(40 - off) {
                    let src: Vec<u8> = (0..len).map(|k| (off * 7 + k * 13) as u8).collect();
                    s.write(off, &src);
                    model[off..off + len].copy_from_slice(&src);
                    let mut all = vec![0u8; 40];
                    s.read(0, &mut all);
                    assert_eq!(all, model, "start {start} off {off} len {len}");
                }
            }
            s.fill(3, 30, 0xee);
            model[3..33].fill(0xee);
            assert_eq!(s.into_inner().to_vec(), model);
        }
    }

    #[test]
    fn long_copies_meet_short_ones_byte_for_byte() {
        let size = 70_000;
        let s = SharedBytes::new(vec![0u8; size].into_boxed_slice());
        let shared = SharedBytes::new_shared_zeroed(size);
        for region in [&s, &shared] {
            let mut model = vec![0u8; size];
            for (k, len) in [255usize, 256, 4097, 40_000, 65_536]
                .into_iter()
                .enumerate()
            {
                for off in 0..9 {
                    let src: Vec<u8> = (0..len).map(|i| (i * 3 + k + off) as u8).collect();
                    region.write(off, &src);
                    model[off..off + len].copy_from_slice(&src);
                    // read back long, and in short pieces (the atomic word path)
                    let mut long = vec![0u8; size];
                    region.read(0, &mut long);
                    assert_eq!(long, model, "len {len} off {off}");
                    let mut short = [0u8; 77];
                    for at in (0..size - 77).step_by(7919) {
                        region.read(at, &mut short);
                        assert_eq!(&short[..], &model[at..at + 77], "at {at}");
                    }
                }
            }
        }
    }

    #[test]
    fn atomics_only_on_aligned_words() {
        let s = SharedBytes::new(vec![0u8; 64].into_boxed_slice());
        let aligned = (8 - (s.addr() % 8) as usize) % 8;
        let w = s.atomic_u64(aligned).unwrap();
        w.fetch_add(5, Relaxed);
        assert_eq!(s.atomic_u64(aligned).unwrap().load(Relaxed), 5);
        assert!(s.atomic_u64(aligned + 1).is_none());
        assert!(s.atomic_u64(64).is_none());
    }

    #[test]
    fn concurrent_writers_and_readers_are_sound() {
        let s = std::sync::Arc::new(SharedBytes::new(vec![0u8; 4096].into_boxed_slice()));
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 100];
                    for k in 0..2000 {
                        s.write((k * 37 + t) % 3996, &[t as u8; 100]);
                        s.read((k * 91) % 3996, &mut buf);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let mut all = vec![0u8; 4096];
        s.read(0, &mut all);
        assert!(all.iter().all(|&b| b <= 1));
    }
}
