//! Peer regions this wire maps to pull WRITEs from (`crate::pull`): each a memfd that the
//! sender handed over its bell (`MSG_MR`), mapped read-only, found by its token.
//!
//! A region's file starts with a header page whose first word is 1 while the sender has the
//! region registered; one found at 0 is unmapped and forgotten. At most [`MAX_REGIONS`] per
//! peer are mapped (the oldest goes first): the memory a peer can make us map is bounded.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::pull::{self, Piece, RESOLVED};

/// Regions mapped per peer at most.
pub(crate) const MAX_REGIONS: usize = 256;
/// The header page before a region's bytes (`SharedBytes::new_shared`).
const HEADER: usize = 4096;

struct Mapped {
    token: u64,
    map: *mut u8,
    /// The data's length (the file less the header).
    len: usize,
}

// SAFETY: a read-only shared mapping; reads go through raw pointers only.
unsafe impl Send for Mapped {}

impl Mapped {
    fn live(&self) -> bool {
        // SAFETY: the header's first word, 4-byte aligned (page start), mapped.
        unsafe { AtomicU32::from_ptr(self.map.cast()).load(Ordering::Acquire) == 1 }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped, once.
        unsafe { libc::munmap(self.map.cast(), HEADER + self.len) };
    }
}

/// The regions of one peer.
#[derive(Default)]
pub(crate) struct Regions {
    maps: Vec<Mapped>,
}

impl Regions {
    /// Maps the region file `fd` as `token` (read-only). False when it is not a region
    /// file (too short, not mappable).
    pub fn insert(&mut self, token: u64, fd: OwnedFd) -> bool {
        self.maps.retain(|m| m.token != token && m.live());
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 || (st.st_size as usize) <= HEADER {
            return false;
        }
        let size = st.st_size as usize;
        // SAFETY: a read-only shared mapping of the whole file; checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return false;
        }
        if self.maps.len() >= MAX_REGIONS {
            self.maps.remove(0);
        }
        self.maps.push(Mapped {
            token,
            map: map.cast(),
            len: size - HEADER,
        });
        true
    }

    /// Whether `token` is mapped and live (a dead one is dropped).
    pub fn knows(&mut self, token: u64) -> bool {
        match self.maps.iter().position(|m| m.token == token) {
            Some(k) if self.maps[k].live() => true,
            Some(k) => {
                self.maps.swap_remove(k);
                false
            }
            None => false,
        }
    }

    /// Where `p`'s bytes are mapped here; 0 when not (unknown, dead, out of bounds).
    fn resolve(&self, p: &Piece) -> u64 {
        let Some(m) = self.maps.iter().find(|m| m.token == p.token && m.live()) else {
            return 0;
        };
        match p.offset.checked_add(p.len) {
            Some(end) if end <= m.len as u64 => {
                // SAFETY: in bounds of the mapping (checked).
                unsafe { m.map.add(HEADER + p.offset as usize) as usize as u64 }
            }
            _ => 0,
        }
    }

    /// The first token of a pull payload that is not mapped, if any.
    pub fn missing(&mut self, payload: &[u8]) -> Option<u64> {
        for p in pull::pieces(payload)? {
            if !self.knows(p.token) {
                return Some(p.token);
            }
        }
        None
    }

    /// Writes `payload` (a pull payload: length, then pieces) with each piece resolved to
    /// an address here and its length ([`RESOLVED`] bytes each) into `out`; returns its
    /// length. `None` when the payload breaks the format or `out` is too short.
    pub fn rewrite(&self, payload: &[u8], out: &mut [u8]) -> Option<usize> {
        let pieces = pull::pieces(payload)?;
        out.get_mut(..4)?.copy_from_slice(&payload[..4]);
        let mut at = 4;
        for p in pieces {
            let o = out.get_mut(at..at + RESOLVED)?;
            o[..8].copy_from_slice(&self.resolve(&p).to_le_bytes());
            o[8..].copy_from_slice(&p.len.to_le_bytes());
            at += RESOLVED;
        }
        Some(at)
    }
}
