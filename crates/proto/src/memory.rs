//! Registered memory as the transport sees it.
//!
//! The transport never touches memory directly: every gather, scatter, remote write, remote
//! read and atomic goes through a [`MemoryTable`], whose operations each check the key, the
//! protection domain, the bounds and the access rights before copying a single byte. The
//! software device implements the trait over registered user memory; [`InMemoryTable`] is a
//! complete implementation over one flat simulated address space, for tests and the simulator.
//!
//! ```
//! use rdma_proto::memory::{InMemoryTable, MemError, MemKey, MemoryTable};
//! use rdma_proto::verbs::{AccessFlags, PdId};
//! let mut mem = InMemoryTable::new(0x10_0000, 8192);
//! let pd = PdId(1);
//! let mr = mem.register(pd, 0x10_0100, 256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//! mem.write(pd, MemKey::Remote(mr.rkey), 0x10_0100, b"hello").unwrap();
//! assert_eq!(mem.bytes(0x10_0100, 5).unwrap(), b"hello");
//! // one byte past the end of the region is refused and nothing is written
//! assert_eq!(mem.write(pd, MemKey::Remote(mr.rkey), 0x10_01fc, b"12345"), Err(MemError::OutOfBounds));
//! assert_eq!(mem.bytes(0x10_01fc, 4).unwrap(), &[0, 0, 0, 0]);
//! // wrong protection domain, missing right
//! assert_eq!(mem.write(PdId(2), MemKey::Remote(mr.rkey), 0x10_0100, b"x"), Err(MemError::WrongPd));
//! let mut out = [0u8; 1];
//! assert_eq!(mem.read(pd, MemKey::Remote(mr.rkey), 0x10_0100, &mut out),
//!            Err(MemError::AccessDenied(AccessFlags::REMOTE_READ)));
//! ```

use crate::verbs::{AccessFlags, PdId};
use core::fmt;
use std::collections::HashMap;

/// Why a memory access was refused. No byte is read or written when one of these is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No valid region has this key (never registered, deregistered or invalidated).
    InvalidKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The range is not inside the region (or overflows the address space).
    OutOfBounds,
    /// The region lacks these access rights.
    AccessDenied(AccessFlags),
    /// An atomic on an address that is not 8-byte aligned.
    Misaligned,
    /// The memory cannot be reached this way: a same-host copy
    /// ([`MemoryTable::locate`], [`MemoryTable::pull_remote`]) that this table does not
    /// do, or whose source process is gone or refuses.
    Unavailable,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::InvalidKey => write!(f, "invalid memory key"),
            MemError::WrongPd => write!(f, "memory key of another protection domain"),
            MemError::OutOfBounds => write!(f, "range outside the memory region"),
            MemError::AccessDenied(a) => write!(f, "memory region lacks access {a:?}"),
            MemError::Misaligned => write!(f, "atomic address not 8-byte aligned"),
            MemError::Unavailable => write!(f, "memory not reachable by a same-host copy"),
        }
    }
}
impl std::error::Error for MemError {}

/// A 64-bit atomic operation on remote memory.
///
/// ```
/// use rdma_proto::memory::AtomicOp;
/// assert_eq!(AtomicOp::FetchAdd { add: 2 }.apply(40), 42);
/// assert_eq!(AtomicOp::CmpSwap { compare: 1, swap: 9 }.apply(1), 9);
/// assert_eq!(AtomicOp::CmpSwap { compare: 1, swap: 9 }.apply(2), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Compare and swap.
    CmpSwap {
        /// Compare operand.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// Fetch and add (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

impl AtomicOp {
    /// The new value given the original one.
    pub fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CmpSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        }
    }
}

/// The key a memory access presents, which decides its checks: an lkey for the local side
/// of a work request, an rkey for a peer's access (an invalidated rkey no longer works).
///
/// ```
/// use rdma_proto::memory::MemKey;
/// use rdma_proto::verbs::AccessFlags;
/// assert_eq!(MemKey::Remote(7).write_access(), AccessFlags::REMOTE_WRITE);
/// assert_eq!(MemKey::Local(7).read_access(), AccessFlags::empty());
/// assert_eq!(MemKey::Local(7).value(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemKey {
    /// An lkey: gather, scatter, a READ response's target.
    Local(u32),
    /// An rkey: a peer's READ, WRITE or atomic.
    Remote(u32),
}

impl MemKey {
    /// The key's value.
    pub fn value(self) -> u32 {
        match self {
            MemKey::Local(k) | MemKey::Remote(k) => k,
        }
    }

    /// Whether a peer presents it (an rkey).
    pub fn is_remote(self) -> bool {
        matches!(self, MemKey::Remote(_))
    }

    /// The right a read through this key needs: none for an lkey, REMOTE_READ for an rkey.
    pub fn read_access(self) -> AccessFlags {
        match self {
            MemKey::Local(_) => AccessFlags::empty(),
            MemKey::Remote(_) => AccessFlags::REMOTE_READ,
        }
    }

    /// The right a write through this key needs: LOCAL_WRITE for an lkey, REMOTE_WRITE for
    /// an rkey.
    pub fn write_access(self) -> AccessFlags {
        match self {
            MemKey::Local(_) => AccessFlags::LOCAL_WRITE,
            MemKey::Remote(_) => AccessFlags::REMOTE_WRITE,
        }
    }
}

/// The device's table of registered memory, through which the transport performs every
/// memory access.
///
/// Each method checks key, protection domain, bounds (with overflow) and access rights and
/// returns a [`MemError`] without touching memory if any check fails. Each access presents a
/// [`MemKey`]: an lkey for local accesses, an rkey for remote ones. Atomics operate on a host-order `u64` at an 8-byte aligned
/// address and are atomic with respect to every other access through the table.
pub trait MemoryTable {
    /// Checks that `[addr, addr+len)` is inside the region of `key`, in `pd`, with `need`
    /// (and, for an rkey, that it was not invalidated).
    fn check(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError>;
    /// Copies memory out: gather through an lkey (needs no access right), a READ through an
    /// rkey (needs [`AccessFlags::REMOTE_READ`]): [`MemKey::read_access`].
    fn read(&self, pd: PdId, key: MemKey, addr: u64, dst: &mut [u8]) -> Result<(), MemError>;
    /// Copies into memory: scatter through an lkey (needs [`AccessFlags::LOCAL_WRITE`]), a
    /// WRITE through an rkey (needs [`AccessFlags::REMOTE_WRITE`]): [`MemKey::write_access`].
    fn write(&mut self, pd: PdId, key: MemKey, addr: u64, src: &[u8]) -> Result<(), MemError>;
    /// Performs an atomic and returns the original value; needs
    /// [`AccessFlags::REMOTE_ATOMIC`] and an 8-byte aligned `va`.
    fn atomic_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError>;
    /// Invalidates `rkey` (SEND with invalidate); fails if it is not valid in `pd`.
    fn invalidate_remote(&mut self, pd: PdId, rkey: u32) -> Result<(), MemError>;
    /// Copies the data of an inline work request at post time: unregistered memory of the
    /// posting process, no key check (as `IBV_SEND_INLINE`).
    fn read_inline(&self, pd: PdId, addr: u64, dst: &mut [u8]) -> Result<(), MemError>;
    /// Describes where the bytes `[addr, addr+len)` of the region of `key` are, in the
    /// table's own format, into `out`, so that a peer process on the same host copies them
    /// itself; returns the bytes written. Checked as [`MemoryTable::read`]: an lkey's bytes
    /// for a pulled WRITE (the peer's [`MemoryTable::pull_remote`]), an rkey's for a READ the
    /// peer asked for (its [`MemoryTable::pull_local`]). [`MemError::Unavailable`] when the
    /// table cannot (no same-host copies, memory not shareable, `out` too short); the default.
    fn locate(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        out: &mut [u8],
    ) -> Result<usize, MemError> {
        let _ = (pd, key, addr, len, out);
        Err(MemError::Unavailable)
    }
    /// Copies `len` bytes, from byte `skip` of what `source` names (a peer's memory, in
    /// the table's format), into `[addr, addr+len)` of the region of `lkey` (needs
    /// [`AccessFlags::LOCAL_WRITE`], checked first): a READ response the peer answered
    /// with where its data is. [`MemError::Unavailable`] when the source cannot be read
    /// (part of the range may have been written, which the access allowed); the default.
    fn pull_local(
        &mut self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        source: &[u8],
        skip: u64,
    ) -> Result<(), MemError> {
        let _ = (pd, lkey, addr, len, source, skip);
        Err(MemError::Unavailable)
    }
    /// Copies `len` bytes into `[va, va+len)` of the region of `rkey` (needs
    /// [`AccessFlags::REMOTE_WRITE`], checked first) from the memory of a peer process on
    /// the same host, which `source` names in the table's own format (the runtime that
    /// delivered the packet framed it). [`MemError::Unavailable`] when the source cannot be
    /// read: then part of the range may have been written, which the access allowed. The
    /// default: [`MemError::Unavailable`].
    fn pull_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        source: &[u8],
    ) -> Result<(), MemError> {
        let _ = (pd, rkey, va, len, source);
        Err(MemError::Unavailable)
    }
}

/// A registered region as one access sees it: the checks after the key has found it, shared
/// by every [`MemoryTable`] (this crate's [`InMemoryTable`] and the software device's key
/// table), so each makes the same checks in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionAccess {
    /// The region's protection domain.
    pub pd: PdId,
    /// The region's first address.
    pub addr: u64,
    /// The region's length in bytes.
    pub len: u64,
    /// The region's access rights.
    pub access: AccessFlags,
}

impl RegionAccess {
    /// Checks an access of `[addr, addr+len)` in `pd` needing `need`, in this order: the key
    /// is still valid for it (`key_valid`: false for a remote access through an invalidated
    /// rkey), the protection domain, the bounds (with overflow) and the access rights.
    /// Returns the offset of `addr` in the region.
    ///
    /// ```
    /// use rdma_proto::memory::{MemError, RegionAccess};
    /// use rdma_proto::verbs::{AccessFlags, PdId};
    /// let r = RegionAccess { pd: PdId(1), addr: 0x100, len: 16, access: AccessFlags::REMOTE_READ };
    /// assert_eq!(r.check(true, PdId(1), 0x104, 12, AccessFlags::REMOTE_READ), Ok(4));
    /// assert_eq!(r.check(false, PdId(1), 0x104, 4, AccessFlags::empty()), Err(MemError::InvalidKey));
    /// assert_eq!(r.check(true, PdId(2), 0x104, 4, AccessFlags::empty()), Err(MemError::WrongPd));
    /// assert_eq!(r.check(true, PdId(1), 0x104, 13, AccessFlags::empty()), Err(MemError::OutOfBounds));
    /// assert_eq!(r.check(true, PdId(1), 0xff, 1, AccessFlags::empty()), Err(MemError::OutOfBounds));
    /// assert_eq!(r.check(true, PdId(1), 0x104, u64::MAX, AccessFlags::empty()), Err(MemError::OutOfBounds));
    /// assert_eq!(r.check(true, PdId(1), 0x100, 1, AccessFlags::REMOTE_WRITE),
    ///            Err(MemError::AccessDenied(AccessFlags::REMOTE_WRITE)));
    /// ```
    pub fn check(
        &self,
        key_valid: bool,
        pd: PdId,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<u64, MemError> {
        if !key_valid {
            return Err(MemError::InvalidKey);
        }
        if self.pd != pd {
            return Err(MemError::WrongPd);
        }
        let off = addr.checked_sub(self.addr).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.len {
            return Err(MemError::OutOfBounds);
        }
        let missing = need.difference(self.access);
        if !missing.is_empty() {
            return Err(MemError::AccessDenied(missing));
        }
        Ok(off)
    }
}

/// Keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

#[derive(Debug, Clone)]
struct Region {
    pd: PdId,
    addr: u64,
    len: u64,
    access: AccessFlags,
    remote_valid: bool,
}

/// A [`MemoryTable`] over one flat simulated address space `[base, base+size)`, with regions
/// registered over parts of it (regions may overlap, as MRs over the same user buffer do).
///
/// Bytes outside every region are still in the address space, so tests can place canaries
/// around a region and check that no refused access touched them.
#[derive(Debug, Clone)]
pub struct InMemoryTable {
    base: u64,
    mem: Vec<u8>,
    regions: HashMap<u32, Region>,
    next_index: u32,
}

impl InMemoryTable {
    /// An address space of `size` zero bytes starting at `base`.
    pub fn new(base: u64, size: usize) -> Self {
        InMemoryTable {
            base,
            mem: vec![0; size],
            regions: HashMap::new(),
            next_index: 1,
        }
    }

    /// Registers `[addr, addr+len)` in `pd` with `access`. Remote rights need
    /// [`AccessFlags::LOCAL_WRITE`] when they include writes or atomics, as in verbs.
    pub fn register(
        &mut self,
        pd: PdId,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, MemError> {
        self.offset(addr, len)?;
        let needs_lw = access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
        if needs_lw && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(MemError::AccessDenied(AccessFlags::LOCAL_WRITE));
        }
        let idx = self.next_index;
        self.next_index = self.next_index.wrapping_add(1);
        // index in the upper 24 bits, a "key" byte below, as rxe numbers them
        let key = (idx << 8) | (idx.wrapping_mul(0x9d) & 0xff);
        self.regions.insert(
            key,
            Region {
                pd,
                addr,
                len,
                access,
                remote_valid: true,
            },
        );
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }

    /// Deregisters a region; its keys become invalid.
    pub fn deregister(&mut self, lkey: u32) -> bool {
        self.regions.remove(&lkey).is_some()
    }

    /// Test access to the address space (no key checks).
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let o = self.offset(addr, len).ok()?;
        self.mem.get(o..o + len as usize)
    }

    /// Mutable test access to the address space (no key checks).
    pub fn bytes_mut(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        let o = self.offset(addr, len).ok()?;
        self.mem.get_mut(o..o + len as usize)
    }

    fn offset(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.checked_sub(self.base).ok_or(MemError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > self.mem.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok(off as usize)
    }

    /// The offset of `addr` once key, protection domain, bounds and `need` allow the access.
    fn offset_of(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<usize, MemError> {
        let r = self.regions.get(&key.value()).ok_or(MemError::InvalidKey)?;
        RegionAccess {
            pd: r.pd,
            addr: r.addr,
            len: r.len,
            access: r.access,
        }
        .check(!key.is_remote() || r.remote_valid, pd, addr, len, need)?;
        self.offset(addr, len)
    }
}

impl MemoryTable for InMemoryTable {
    fn check(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        self.offset_of(pd, key, addr, len, need).map(|_| ())
    }
    fn read(&self, pd: PdId, key: MemKey, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let o = self.offset_of(pd, key, addr, dst.len() as u64, key.read_access())?;
        dst.copy_from_slice(&self.mem[o..o + dst.len()]);
        Ok(())
    }
    fn write(&mut self, pd: PdId, key: MemKey, addr: u64, src: &[u8]) -> Result<(), MemError> {
        let o = self.offset_of(pd, key, addr, src.len() as u64, key.write_access())?;
        self.mem[o..o + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn atomic_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        if va % 8 != 0 {
            return Err(MemError::Misaligned);
        }
        let o = self.offset_of(pd, MemKey::Remote(rkey), va, 8, AccessFlags::REMOTE_ATOMIC)?;
        let cell: &mut [u8] = &mut self.mem[o..o + 8];
        let mut b = [0u8; 8];
        b.copy_from_slice(cell);
        let orig = u64::from_ne_bytes(b);
        cell.copy_from_slice(&op.apply(orig).to_ne_bytes());
        Ok(orig)
    }
    fn invalidate_remote(&mut self, pd: PdId, rkey: u32) -> Result<(), MemError> {
        let r = self.regions.get_mut(&rkey).ok_or(MemError::InvalidKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        if !r.remote_valid {
            return Err(MemError::InvalidKey);
        }
        r.remote_valid = false;
        Ok(())
    }
    fn read_inline(&self, _pd: PdId, addr: u64, dst: &mut [u8]) -> Result<(), MemError> {
        let o = self.offset(addr, dst.len() as u64)?;
        dst.copy_from_slice(&self.mem[o..o + dst.len()]);
        Ok(())
    }
    /// A piece is `(address, length)`, 16 bytes little-endian, in this address space.
    fn locate(
        &self,
        pd: PdId,
        key: MemKey,
        addr: u64,
        len: u64,
        out: &mut [u8],
    ) -> Result<usize, MemError> {
        self.offset_of(pd, key, addr, len, key.read_access())?;
        piece(addr, len, out)
    }
    /// As [`InMemoryTable::pull_remote`], into local memory.
    fn pull_local(
        &mut self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: u64,
        source: &[u8],
        skip: u64,
    ) -> Result<(), MemError> {
        let dst = self.offset_of(pd, MemKey::Local(lkey), addr, len, AccessFlags::LOCAL_WRITE)?;
        let total = self.pieces_len(source)?;
        self.copy_pieces(source, total, skip, len, dst)
    }
    /// Reads `source`'s pieces ([`MemoryTable::locate`]'s for an lkey) from this same address
    /// space: a table that stands for both peers (fuzzing one QP, for one); `Unavailable`
    /// when they do not add up to `len` or leave the address space.
    fn pull_remote(
        &mut self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        source: &[u8],
    ) -> Result<(), MemError> {
        let dst = self.offset_of(pd, MemKey::Remote(rkey), va, len, AccessFlags::REMOTE_WRITE)?;
        let total = self.pieces_len(source)?;
        if total != len {
            return Err(MemError::Unavailable);
        }
        self.copy_pieces(source, total, 0, len, dst)
    }
}

impl InMemoryTable {
    /// The bytes `source`'s `(address, length)` pieces name, all inside the space.
    fn pieces_len(&self, source: &[u8]) -> Result<u64, MemError> {
        if source.len() % 16 != 0 {
            return Err(MemError::Unavailable);
        }
        let mut total = 0u64;
        for (addr, n) in pieces(source) {
            self.offset(addr, n).map_err(|_| MemError::Unavailable)?;
            total = total.checked_add(n).ok_or(MemError::Unavailable)?;
        }
        Ok(total)
    }

    /// Copies `len` bytes from byte `skip` of the pieces (`total` bytes, [`Self::pieces_len`])
    /// to offset `dst` of the space.
    fn copy_pieces(
        &mut self,
        source: &[u8],
        total: u64,
        skip: u64,
        len: u64,
        dst: usize,
    ) -> Result<(), MemError> {
        match skip.checked_add(len) {
            Some(end) if end <= total => {}
            _ => return Err(MemError::Unavailable),
        }
        let (mut skip, mut left, mut at) = (skip, len, dst);
        for (addr, n) in pieces(source) {
            if left == 0 {
                break;
            }
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(left);
            let from = self
                .offset(addr + skip, take)
                .map_err(|_| MemError::Unavailable)?;
            self.mem.copy_within(from..from + take as usize, at);
            at += take as usize;
            left -= take;
            skip = 0;
        }
        Ok(())
    }
}

/// Writes the [`InMemoryTable`] piece `(addr, len)` into `out`: 16 bytes.
fn piece(addr: u64, len: u64, out: &mut [u8]) -> Result<usize, MemError> {
    let out = out.get_mut(..16).ok_or(MemError::Unavailable)?;
    out[..8].copy_from_slice(&addr.to_le_bytes());
    out[8..].copy_from_slice(&len.to_le_bytes());
    Ok(16)
}

/// The `(address, length)` pieces of an [`InMemoryTable`] source.
fn pieces(source: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    source.chunks_exact(16).map(|c| {
        let u = |o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap_or_default());
        (u(0), u(8))
    })
}

/// Why [`scatter`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScatterError {
    /// The data does not fit the scatter list.
    TooLong,
    /// A piece was refused.
    Mem(MemError),
}

/// Writes `data` into the scatter list `sg` starting `off` bytes into it (local writes,
/// checked by [`MemoryTable::write`] piece by piece).
///
/// ```
/// use rdma_proto::memory::{scatter, InMemoryTable, ScatterError};
/// use rdma_proto::verbs::{AccessFlags, PdId, Sge};
/// let mut m = InMemoryTable::new(0, 64);
/// let k = m.register(PdId(0), 0, 64, AccessFlags::LOCAL_WRITE).unwrap();
/// let sg = [Sge { addr: 0, length: 2, lkey: k.lkey }, Sge { addr: 10, length: 4, lkey: k.lkey }];
/// scatter(&mut m, PdId(0), &sg, 1, b"abcd").unwrap();
/// assert_eq!(m.bytes(0, 2).unwrap(), b"\0a");
/// assert_eq!(m.bytes(10, 4).unwrap(), b"bcd\0");
/// assert_eq!(scatter(&mut m, PdId(0), &sg, 4, b"xyz"), Err(ScatterError::TooLong));
/// ```
pub fn scatter<M: MemoryTable + ?Sized>(
    mem: &mut M,
    pd: PdId,
    sg: &[crate::verbs::Sge],
    off: u64,
    data: &[u8],
) -> Result<(), ScatterError> {
    let total: u64 = sg.iter().map(|s| s.length as u64).sum();
    let fits = match off.checked_add(data.len() as u64) {
        Some(end) => end <= total,
        None => false,
    };
    if !fits {
        return Err(ScatterError::TooLong);
    }
    let mut skip = off;
    let mut done = 0usize;
    for s in sg {
        if done == data.len() {
            break;
        }
        let l = s.length as u64;
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(data.len() - done);
        let addr = s
            .addr
            .checked_add(skip)
            .ok_or(ScatterError::Mem(MemError::OutOfBounds))?;
        mem.write(pd, MemKey::Local(s.lkey), addr, &data[done..done + n])
            .map_err(ScatterError::Mem)?;
        done += n;
        skip = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    const A: AccessFlags = AccessFlags::all();

    #[test]
    fn checks() {
        let mut m = InMemoryTable::new(1000, 1000);
        let pd = PdId(1);
        assert_eq!(m.register(pd, 900, 10, A), Err(MemError::OutOfBounds));
        assert_eq!(m.register(pd, 1990, 11, A), Err(MemError::OutOfBounds));
        assert_eq!(
            m.register(pd, 1000, 10, AccessFlags::REMOTE_WRITE),
            Err(MemError::AccessDenied(AccessFlags::LOCAL_WRITE))
        );
        let k = m.register(pd, 1100, 100, A).unwrap();
        assert_eq!(m.check(pd, MemKey::Remote(k.rkey), 1100, 100, A), Ok(()));
        assert_eq!(
            m.check(pd, MemKey::Remote(k.rkey), 1099, 1, A),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, MemKey::Remote(k.rkey), 1101, 100, A),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, MemKey::Remote(k.rkey), u64::MAX, 2, A),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.check(pd, MemKey::Remote(k.rkey ^ 1), 1100, 1, A),
            Err(MemError::InvalidKey)
        );
        assert_eq!(
            m.atomic_remote(pd, k.rkey, 1102, AtomicOp::FetchAdd { add: 1 }),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            m.atomic_remote(pd, k.rkey, 1192, AtomicOp::FetchAdd { add: 5 }),
            Ok(0)
        );
        assert_eq!(
            m.atomic_remote(pd, k.rkey, 1192, AtomicOp::FetchAdd { add: 5 }),
            Ok(5)
        );
        assert_eq!(
            m.atomic_remote(pd, k.rkey, 1200, AtomicOp::FetchAdd { add: 5 }),
            Err(MemError::OutOfBounds)
        );
        m.invalidate_remote(pd, k.rkey).unwrap();
        assert_eq!(
            m.check(pd, MemKey::Remote(k.rkey), 1100, 1, A),
            Err(MemError::InvalidKey)
        );
        assert_eq!(m.check(pd, MemKey::Local(k.lkey), 1100, 1, A), Ok(()));
        assert!(m.deregister(k.lkey));
        assert_eq!(
            m.check(pd, MemKey::Local(k.lkey), 1100, 1, A),
            Err(MemError::InvalidKey)
        );
    }
}

#[cfg(test)]
mod pull_tests {
    use super::*;

    #[test]
    fn a_pull_checks_the_target_then_copies_pieces_of_the_same_space() {
        let mut m = InMemoryTable::new(0x1000, 8192);
        let pd = PdId(1);
        for (i, b) in m.bytes_mut(0x1000, 8192).unwrap().iter_mut().enumerate() {
            *b = i as u8;
        }
        let src = m
            .register(pd, 0x1000, 4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = m
            .register(
                pd,
                0x2000,
                1024,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let mut piece = [0u8; 32];
        assert_eq!(
            m.locate(pd, MemKey::Local(src.lkey), 0x1010, 100, &mut piece),
            Ok(16)
        );
        assert_eq!(
            m.locate(pd, MemKey::Local(src.lkey), 0x1f00, 0x200, &mut piece),
            Err(MemError::OutOfBounds)
        );
        let mut two = [0u8; 32];
        m.locate(pd, MemKey::Local(src.lkey), 0x1010, 100, &mut two[..16])
            .unwrap();
        m.locate(pd, MemKey::Local(src.lkey), 0x1100, 28, &mut two[16..])
            .unwrap();
        m.pull_remote(pd, dst.rkey, 0x2004, 128, &two).unwrap();
        let want: Vec<u8> = (0x10..0x10 + 100).chain(0..28).map(|b| b as u8).collect();
        assert_eq!(m.bytes(0x2004, 128).unwrap(), &want[..]);
        let before = m.bytes(0x1000, 8192).unwrap().to_vec();
        // refused before any copy: past the region, wrong PD, no remote write
        assert_eq!(
            m.pull_remote(pd, dst.rkey, 0x2400 - 64, 128, &two),
            Err(MemError::OutOfBounds)
        );
        assert_eq!(
            m.pull_remote(PdId(2), dst.rkey, 0x2000, 128, &two),
            Err(MemError::WrongPd)
        );
        assert!(matches!(
            m.pull_remote(pd, src.rkey, 0x1000, 128, &two),
            Err(MemError::AccessDenied(_))
        ));
        // pieces that do not add up, or leave the address space
        assert_eq!(
            m.pull_remote(pd, dst.rkey, 0x2000, 127, &two),
            Err(MemError::Unavailable)
        );
        let mut far = two;
        far[..8].copy_from_slice(&0x9000u64.to_le_bytes());
        assert_eq!(
            m.pull_remote(pd, dst.rkey, 0x2000, 128, &far),
            Err(MemError::Unavailable)
        );
        assert_eq!(
            m.pull_remote(pd, dst.rkey, 0x2000, 128, &two[..20]),
            Err(MemError::Unavailable)
        );
        assert_eq!(
            m.bytes(0x1000, 8192).unwrap(),
            &before[..],
            "nothing written"
        );
    }
}
