//! Memory regions: the device's key table and the application's handle.
//!
//! Ownership makes misuse impossible in safe Rust: [`MemoryRegion`] *owns* the registered
//! buffer (any `Box<[u8]>` or `Vec<u8>`), so it cannot be freed or moved while registered, and
//! gives it back only from [`MemoryRegion::deregister`], after the key table has dropped its
//! reference. Local access goes through copying methods that are sound while the device writes
//! concurrently (see `shared_mem.rs` for why every access is atomic).
//!
//! Keys: `lkey == rkey == (index + 1) << 8 | key`, where `key` is a random byte drawn for each
//! registration (as rxe does), never the byte the index had before: a stale key is refused,
//! and one known key says nothing about the byte of the next.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha12Rng as StdRng;

use rdma_proto::memory::{AtomicOp, MemError, MemKey, MemoryTable, RegionAccess};
use rdma_proto::verbs::{AccessFlags, PdId, Sge};

use super::pd::ProtectionDomain;
use super::shared_mem::SharedBytes;
use crate::{Error, Result};

/// A registered region as the device sees it.
pub(crate) struct Region {
    pd: PdId,
    access: AccessFlags,
    key: u32,
    mem: SharedBytes,
    remote_valid: AtomicBool,
    /// Names the region to peer processes that map its file (pulled WRITEs), unique in
    /// this process.
    token: u64,
}

struct Slot {
    key: u8,
    region: Option<Arc<Region>>,
}

struct Slots {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Draws key bytes: a ChaCha stream keyed from the OS once per table.
    keys: StdRng,
}

/// The device's table of memory regions, by key.
pub(crate) struct MrTable {
    inner: RwLock<Slots>,
    max: usize,
}

impl MrTable {
    pub fn new(max: usize) -> MrTable {
        MrTable {
            inner: RwLock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
                keys: key_stream(),
            }),
            max: max.min(0xff_fffe),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Slots> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, pd: PdId, access: AccessFlags, mem: SharedBytes) -> Result<Arc<Region>> {
        let mut t = self.write();
        let idx = match t.free.pop() {
            Some(i) => i,
            None if t.slots.len() < self.max => {
                t.slots.push(Slot {
                    key: 0,
                    region: None,
                });
                t.slots.len() - 1
            }
            None => {
                return Err(Error::Exhausted {
                    what: "memory regions",
                    max: self.max,
                })
            }
        };
        let mut byte = t.keys.next_u32() as u8;
        let slot = &mut t.slots[idx];
        if byte == slot.key {
            byte = byte.wrapping_add(1);
        }
        slot.key = byte;
        let key = ((idx as u32 + 1) << 8) | u32::from(slot.key);
        let region = Arc::new(Region {
            pd,
            access,
            key,
            mem,
            remote_valid: AtomicBool::new(true),
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
        });
        slot.region = Some(region.clone());
        Ok(region)
    }

    /// Removes the region of `key` if nothing but the table and the handle (`handles`
    /// references) hold it; `Err(Busy)` otherwise.
    fn remove(&self, key: u32, handles: usize) -> Result<()> {
        let mut t = self.write();
        let Some(idx) = (key >> 8).checked_sub(1).map(|i| i as usize) else {
            return Ok(());
        };
        let Some(slot) = t.slots.get_mut(idx) else {
            return Ok(());
        };
        match &slot.region {
            Some(r) if r.key == key => {
                if Arc::strong_count(r) > 1 + handles {
                    return Err(Error::Busy("memory region in use by the device"));
                }
                slot.region = None;
                t.free.push(idx);
            }
            _ => {}
        }
        Ok(())
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        let t = self.inner.read().unwrap_or_else(|e| e.into_inner());
        t.slots.len() - t.free.len()
    }

    /// A view for the transport: one read lock for a whole batch of packets, not one per access.
    pub fn view(&self) -> MrTableView<'_> {
        MrTableView {
            guard: self.inner.read().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// The next region token (see `Region::token`).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// A per-process random byte (from the std hasher's random keys): the first key of each index.
fn key_stream() -> StdRng {
    let mut seed = [0u8; 32];
    if getrandom::getrandom(&mut seed).is_err() {
        // No OS randomness (never on Linux): hash-seeded, still different per table.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(NEXT_TOKEN.load(Ordering::Relaxed));
        return StdRng::seed_from_u64(h.finish());
    }
    StdRng::from_seed(seed)
}

/// The key table as the transport sees it: implements [`MemoryTable`], checking key,
/// protection domain, bounds and access on every access. Holds the table's read lock, so the
/// runtime takes one view per batch of packets.
pub struct MrTableView<'a> {
    guard: RwLockReadGuard<'a, Slots>,
}

impl MrTableView<'_> {
    fn lookup(&self, key: u32) -> Option<&Region> {
        let idx = (key >> 8).checked_sub(1)? as usize;
        let slot = self.guard.slots.get(idx)?;
        slot.region.as_deref().filter(|r| r.key == key)
    }

    /// The region of `key` and the offset of `addr` in it, once key, protection domain,
    /// bounds and `need` allow the access.
    fn region_at(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<(&Region, usize), MemError> {
        let r = self.lookup(key.value()).ok_or(MemError::InvalidKey)?;
        let key_valid = !key.is_remote() || r.remote_valid.load(Ordering::Acquire);
        let off = RegionAccess {
            pd: r.pd,
            addr: r.mem.addr(),
            len: r.mem.len() as u64,
            access: r.access,
        }
        .check(key_valid, pd, addr, len, need)?;
        Ok((r, off as usize))
    }
}

impl MemoryTable for MrTableView<'_> {
    fn check(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<(), MemError> {
        self.region_at(pd, key, addr, len, need).map(|_| ())
    }

    fn read(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), MemError> {
        let (r, off) = self.region_at(pd, key, addr, dst.len() as u64, key.read_access())?;
        r.mem.read(off, dst);
        Ok(())
    }

    fn write(
        &mut self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        src: &[u8],
    ) -> std::result::Result<(), MemError> {
        let (r, off) = self.region_at(pd, key, addr, src.len() as u64, key.write_access())?;
        r.mem.write(off, src);
        Ok(())
    }

    /// Writes where the region's bytes at `addr` are (a `pull::Piece`) into `out`;
    /// `Unavailable` for a region not in shared memory.
    fn locate(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        out: &mut [u8],
    ) -> std::result::Result<usize, MemError> {
        let (r, off) = self.region_at(pd, key, addr, len, key.read_access())?;
        let fd = r.mem.file().ok_or(MemError::Unavailable)?;
        crate::pull::Piece {
            token: r.token,
            offset: off as u64,
            len,
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        }
        .write(out)
    }

    #[allow(unsafe_code)]
    fn pull_local(
        &mut self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        source: &[u8],
        skip: u64,
    ) -> std::result::Result<(), MemError> {
        let (r, off) =
            self.region_at(pd, MemKey::Local(lkey), addr, len, AccessFlags::LOCAL_WRITE)?;
        // SAFETY: copy_range hands out ranges of live mappings of the peer's regions.
        crate::pull::copy_range(source, skip, len, |at, src, n| unsafe {
            r.mem.write_raw(off + at, src, n)
        })
    }

    #[allow(unsafe_code)]
    fn pull_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        source: &[u8],
    ) -> std::result::Result<(), MemError> {
        let (r, off) =
            self.region_at(pd, MemKey::Remote(rkey), va, len, AccessFlags::REMOTE_WRITE)?;
        // SAFETY: as in pull_local.
        crate::pull::copy_into(source, len, |at, src, n| unsafe {
            r.mem.write_raw(off + at, src, n)
        })
    }

    fn atomic_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> std::result::Result<u64, MemError> {
        if va % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let (r, off) =
            self.region_at(pd, MemKey::Remote(rkey), va, 8, AccessFlags::REMOTE_ATOMIC)?;
        let word = r.mem.atomic_u64(off).ok_or(MemError::Misaligned)?;
        let orig = match op {
            AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::AcqRel),
            AtomicOp::CmpSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                }
            }
        };
        Ok(orig)
    }

    fn invalidate_remote(&mut self, pd: PdId, rkey: u32) -> std::result::Result<(), MemError> {
        let r = self.lookup(rkey).ok_or(MemError::InvalidKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        if !r.remote_valid.swap(false, Ordering::AcqRel) {
            return Err(MemError::InvalidKey);
        }
        Ok(())
    }

    /// Inline data must lie in memory registered in `pd`: this device never reads arbitrary
    /// process memory (that would be unsound from safe Rust). Without such a region the access
    /// is refused with `OutOfBounds`.
    fn read_inline(
        &self,
        pd: PdId,
        addr: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), MemError> {
        let len = dst.len() as u64;
        for r in self.guard.slots.iter().filter_map(|s| s.region.as_deref()) {
            if r.pd != pd {
                continue;
            }
            let Some(off) = addr.checked_sub(r.mem.addr()) else {
                continue;
            };
            if off
                .checked_add(len)
                .is_some_and(|end| end <= r.mem.len() as u64)
            {
                r.mem.read(off as usize, dst);
                return Ok(());
            }
        }
        Err(MemError::OutOfBounds)
    }
}

/// A registered memory region: owns its buffer until [`MemoryRegion::deregister`].
///
/// The application reads and writes it with [`MemoryRegion::read`], [`MemoryRegion::write`]
/// and friends (copies that are sound while a peer writes into the region at the same time),
/// and hands [`MemoryRegion::sge`]s and [`MemoryRegion::rkey`]/[`MemoryRegion::addr`] to work
/// requests and peers.
///
/// ```
/// use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let mr = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
/// mr.write(10, b"hello").unwrap();
/// let mut out = [0u8; 5];
/// mr.read(10, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// assert!(mr.read(4093, &mut out).is_err()); // out of bounds: EINVAL, nothing read
/// let sge = mr.sge(0, 64).unwrap();
/// assert_eq!((sge.addr, sge.lkey), (mr.addr(), mr.lkey()));
/// // The buffer comes back, with what was written into it.
/// let buf = mr.deregister().unwrap();
/// assert_eq!(&buf[10..15], b"hello");
/// ```
pub struct MemoryRegion {
    region: Option<Arc<Region>>,
    table: Arc<MrTable>,
    pd: ProtectionDomain,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("access", &self.access())
            .finish()
    }
}

/// [`MemoryRegion::deregister`] failed; the region is handed back, still registered.
#[derive(Debug)]
pub struct DeregisterError {
    /// The region, still registered.
    pub mr: MemoryRegion,
    /// Why (EBUSY: the device still uses it).
    pub error: Error,
}

impl std::fmt::Display for DeregisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deregister {:#x}: {}", self.mr.lkey(), self.error)
    }
}

impl std::error::Error for DeregisterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl MemoryRegion {
    pub(crate) fn register(
        pd: &ProtectionDomain,
        table: &Arc<MrTable>,
        buf: Box<[u8]>,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        Self::check_args(buf.len(), access)?;
        // the application's own buffer, moved in: no copy (`alloc` makes shareable regions)
        Self::insert(pd, table, SharedBytes::new(buf), access)
    }

    /// # Safety
    /// As [`ProtectionDomain::register_raw`].
    #[allow(unsafe_code)]
    pub(crate) unsafe fn register_raw(
        pd: &ProtectionDomain,
        table: &Arc<MrTable>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        Self::check_args(len, access)?;
        let ptr = std::ptr::NonNull::new(addr)
            .ok_or(Error::InvalidArgument("cannot register a NULL address"))?;
        // long enough to be pulled: onto a region file in place, when it qualifies
        let moved = match pd.device().in_place_min {
            Some(min) if len >= min as usize => {
                match super::in_place::movable_now(addr as usize, len) {
                    // SAFETY: the caller keeps the range valid while registered, and it is
                    // page-aligned private anonymous read-write memory (checked just now).
                    Ok(()) => unsafe { SharedBytes::borrowed_in_place(ptr, len) },
                    Err(why) => {
                        tracing::debug!(?addr, len, why, "registered in place, kept private");
                        None
                    }
                }
            }
            _ => None,
        };
        if moved.is_some() {
            tracing::debug!(?addr, len, "registered in place, moved onto a region file");
        }
        // SAFETY: the caller keeps `len` bytes at `addr` valid while registered.
        let mem = moved.unwrap_or_else(|| unsafe { SharedBytes::borrowed(ptr, len) });
        Self::insert(pd, table, mem, access)
    }

    pub(crate) fn alloc(
        pd: &ProtectionDomain,
        table: &Arc<MrTable>,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        Self::check_args(len, access)?;
        let mem = if pd.device().pull_min.is_some_and(|m| len >= m as usize) {
            SharedBytes::new_shared_zeroed(len)
        } else {
            SharedBytes::new(vec![0; len].into_boxed_slice())
        };
        Self::insert(pd, table, mem, access)
    }

    fn insert(
        pd: &ProtectionDomain,
        table: &Arc<MrTable>,
        mem: SharedBytes,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        let region = table.insert(pd.id(), access, mem)?;
        Ok(MemoryRegion {
            region: Some(region),
            table: table.clone(),
            pd: pd.clone(),
        })
    }

    fn check_args(len: usize, access: AccessFlags) -> Result<()> {
        if len == 0 {
            return Err(Error::InvalidArgument("cannot register an empty buffer"));
        }
        let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if access.intersects(writes) && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "remote write or atomic access needs LOCAL_WRITE",
            ));
        }
        Ok(())
    }

    fn r(&self) -> &Region {
        // Always Some outside deregister, which consumes the handle.
        self.region
            .as_deref()
            .expect("region present until deregistered")
    }

    /// Local key, for scatter/gather elements.
    pub fn lkey(&self) -> u32 {
        self.r().key
    }

    /// Remote key, for peers (valid for the remote rights given at registration).
    pub fn rkey(&self) -> u32 {
        self.r().key
    }

    /// Start address of the region, as scatter/gather elements and peers name it.
    pub fn addr(&self) -> u64 {
        self.r().mem.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.r().mem.len()
    }

    /// Always false: empty buffers cannot be registered.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Access rights given at registration.
    pub fn access(&self) -> AccessFlags {
        self.r().access
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    fn bounds(&self, offset: usize, len: usize) -> Result<()> {
        if self.r().mem.contains(offset, len) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("range outside the memory region"))
        }
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.bounds(offset, dst.len())?;
        self.r().mem.read(offset, dst);
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.bounds(offset, src.len())?;
        self.r().mem.write(offset, src);
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.bounds(offset, len)?;
        self.r().mem.fill(offset, len, value);
        Ok(())
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.r().mem.read(0, &mut v);
        v
    }

    /// The 8-byte word at `offset` as an atomic (for flags a peer writes, or words a peer
    /// updates with RDMA atomics), if the address is 8-byte aligned and inside the region.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        self.r().mem.atomic_u64(offset)
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        self.bounds(offset, len as usize)?;
        Ok(Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        })
    }

    /// Deregisters the region and returns its buffer with its current contents. Fails with
    /// EBUSY (handing the region back) while the device still holds a reference to it.
    pub fn deregister(mut self) -> std::result::Result<Box<[u8]>, DeregisterError> {
        let key = self.lkey();
        if let Err(error) = self.table.remove(key, 1) {
            return Err(DeregisterError { mr: self, error });
        }
        let region = self.region.take().expect("present");
        match Arc::try_unwrap(region) {
            Ok(r) => Ok(r.mem.into_inner()),
            // Unreachable: the table's reference is gone and the count was checked under its
            // write lock, after which no new reference can be made.
            Err(region) => {
                self.region = Some(region);
                Err(DeregisterError {
                    mr: self,
                    error: Error::Busy("memory region in use by the device"),
                })
            }
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            // Dropping a handle deregisters; the memory is freed when the last device reference
            // (if any) goes.
            let _ = self.table.remove(r.key, usize::MAX / 2);
        }
    }
}
