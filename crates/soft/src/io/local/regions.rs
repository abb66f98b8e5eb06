//! Peer regions this wire maps to pull messages from (`crate::pull`): each a memfd that the
//! sender handed over its bell (`MSG_MR`), mapped read-only, found by its token.
//!
//! A region's file starts with a header page whose first word is 1 while the sender has the
//! region registered; one found at 0 is unmapped and forgotten. At most [`MAX_REGIONS`] per
//! peer are mapped, [`MAX_BYTES`] in all (the oldest goes first): the address space a peer
//! can make us map is bounded (a sparse file costs its maker nothing), and the sender, which remembers as many in the same order, hands an evicted one over
//! again at its next use.
//!
//! Safe code: the mappings are `crate::memfd::Mapping`s, their header word a checked atomic.
#![deny(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::memfd::Mapping;
use crate::pull::{self, Piece, RESOLVED};

/// Regions mapped per peer at most.
pub(crate) const MAX_REGIONS: usize = 256;
/// Bytes of region files mapped per peer at most; a larger file is refused.
pub(crate) const MAX_BYTES: usize = 1 << 36;
/// The header page before a region's bytes (`SharedBytes::new_shared_zeroed`).
const HEADER: usize = 4096;

struct Mapped {
    token: u64,
    /// The whole file, read-only: the header page, then the region's bytes.
    map: Mapping,
}

impl Mapped {
    /// The region's length (the file less the header).
    fn len(&self) -> usize {
        self.map.len() - HEADER
    }

    fn live(&self) -> bool {
        // the header's first word (page start: aligned, in bounds)
        self.map
            .atomic_u32(0)
            .is_some_and(|w| w.load(Ordering::Acquire) == 1)
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
        // a file whose size could change under the mapping would kill us (SIGBUS)
        if !crate::memfd::size_sealed(fd.as_fd()) {
            return false;
        }
        let (fd, size) = crate::memfd::file_size(fd);
        let Some(size) = size.ok().and_then(|n| usize::try_from(n).ok()) else {
            return false;
        };
        if size <= HEADER || size > MAX_BYTES {
            return false;
        }
        let Ok(map) = Mapping::shared(fd.as_fd(), size, false) else {
            return false;
        };
        if self.maps.len() >= MAX_REGIONS {
            self.maps.remove(0);
        }
        while self.maps.iter().map(|m| m.map.len()).sum::<usize>() + size > MAX_BYTES {
            self.maps.remove(0);
        }
        self.maps.push(Mapped { token, map });
        true
    }

    /// Whether `token` is mapped and live (a dead one is dropped).
    pub fn knows(&mut self, token: u64) -> bool {
        match self.maps.iter().position(|m| m.token == token) {
            Some(k) if self.maps[k].live() => true,
            Some(k) => {
                // keep the order: the sender forgets its oldest handed-over regions as we do
                self.maps.remove(k);
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
            // an address in bounds of the mapping (checked), handed on as a number
            Some(end) if end <= m.len() as u64 => {
                m.map.ptr().as_ptr() as usize as u64 + HEADER as u64 + p.offset
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

    /// Writes `payload` (a pull payload: length and PSNs, then pieces) with each piece
    /// resolved to an address here and its length ([`RESOLVED`] bytes each) into `out`;
    /// returns its length. `None` when the payload breaks the format or `out` is too short.
    pub fn rewrite(&self, payload: &[u8], out: &mut [u8]) -> Option<usize> {
        let pieces = pull::pieces(payload)?;
        out.get_mut(..pull::PREFIX)?
            .copy_from_slice(&payload[..pull::PREFIX]);
        let mut at = pull::PREFIX;
        for p in pieces {
            let o = out.get_mut(at..at + RESOLVED)?;
            o[..8].copy_from_slice(&self.resolve(&p).to_le_bytes());
            o[8..].copy_from_slice(&p.len.to_le_bytes());
            at += RESOLVED;
        }
        Some(at)
    }
}

/// Fuzzing: `payload` as a pull payload from a peer that handed over regions 1 (4 KiB) and
/// 2 (8 KiB): rewritten, then copied from as the responder does. Every resolved address
/// must lie inside a mapping; the copy reads only there.
#[cfg(feature = "fuzzing")]
#[allow(unsafe_code)] // reads at the resolved addresses
pub(crate) fn fuzz_rewrite(payload: &[u8]) {
    let mut regs = Regions::default();
    for (token, len) in [(1u64, 4096usize), (2, 8192)] {
        let Ok(f) = crate::memfd::sealed(c"fuzz-region", HEADER + len) else {
            return;
        };
        let Ok(dup) = f.try_clone() else {
            return;
        };
        let file = std::fs::File::from(dup);
        if std::os::unix::fs::FileExt::write_all_at(&file, &1u32.to_ne_bytes(), 0).is_err() {
            return;
        }
        assert!(regs.insert(token, f));
    }
    let _ = regs.missing(payload);
    let mut out = [0u8; 4096];
    let Some(n) = regs.rewrite(payload, &mut out) else {
        return;
    };
    let source = &out[pull::PREFIX..n];
    let inside = |addr: u64, len: u64| {
        regs.maps.iter().any(|m| {
            let start = m.map.ptr().as_ptr() as u64 + HEADER as u64;
            addr >= start
                && addr
                    .checked_add(len)
                    .is_some_and(|e| e <= start + m.len() as u64)
        })
    };
    for c in source.chunks_exact(RESOLVED) {
        let u = |o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap_or_default());
        assert!(
            u(0) == 0 || inside(u(0), u(8)),
            "resolved outside a mapping"
        );
    }
    let len = u32::from_le_bytes(payload[..4].try_into().unwrap_or_default()) as u64;
    let mut sum = 0u8;
    let _ = pull::copy_range(source, 0, len.min(1 << 16), |_, src, k| {
        assert!(inside(src as u64, k as u64), "a copy outside a mapping");
        // SAFETY: checked above: `k` bytes of a live read-only mapping.
        let b = unsafe { std::slice::from_raw_parts(src, k) };
        sum = b.iter().fold(sum, |a, &x| a.wrapping_add(x));
    });
    std::hint::black_box(sum);
}

#[allow(unsafe_code)] // plain system calls on test files
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::verbs::shared_mem::SharedBytes;
    use std::os::unix::fs::FileExt;

    fn region(len: usize, fill: u8) -> SharedBytes {
        let r = SharedBytes::new_shared_zeroed(len);
        r.fill(0, len, fill);
        assert!(r.file().is_some(), "a memfd region");
        r
    }

    fn file(r: &SharedBytes) -> OwnedFd {
        r.file().unwrap().try_clone_to_owned().unwrap()
    }

    /// A pull payload (64 KiB, 16 PSNs) naming `pieces`.
    fn payload(pieces: &[(u64, u64, u64)]) -> Vec<u8> {
        let mut p = vec![0u8; pull::PREFIX + pull::PIECE * pieces.len()];
        p[..4].copy_from_slice(&65536u32.to_le_bytes());
        p[4..8].copy_from_slice(&16u32.to_le_bytes());
        for (k, &(token, offset, len)) in pieces.iter().enumerate() {
            let at = pull::PREFIX + k * pull::PIECE;
            let piece = Piece {
                token,
                offset,
                len,
                fd: 3,
            };
            piece.write(&mut p[at..]).unwrap();
        }
        p
    }

    fn resolved(regs: &Regions, p: &[u8]) -> Vec<(u64, u64)> {
        let mut out = [0u8; 512];
        let n = regs.rewrite(p, &mut out).unwrap();
        assert_eq!(out[..8], p[..8], "the length and PSNs stay");
        out[8..n]
            .chunks_exact(RESOLVED)
            .map(|c| {
                let u = |o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap());
                (u(0), u(8))
            })
            .collect()
    }

    #[test]
    fn pieces_resolve_inside_their_mapping_and_nowhere_else() {
        let r = region(64 << 10, 0xab);
        let mut regs = Regions::default();
        assert!(regs.insert(7, file(&r)));
        let p = payload(&[
            (7, 0, 64 << 10),       // the whole region
            (7, 1000, 64 << 10),    // past its end
            (8, 0, 16),             // a region we never got
            (7, u64::MAX - 1, 4),   // an offset that overflows
            (7, (64 << 10) - 1, 1), // its last byte
        ]);
        let got = resolved(&regs, &p);
        assert_eq!(got.len(), 5);
        assert_ne!(got[0].0, 0);
        assert_eq!((got[1].0, got[2].0, got[3].0), (0, 0, 0));
        assert_eq!(got[4].0, got[0].0 + (64 << 10) - 1);
        // the mapping holds the region's bytes
        // SAFETY: resolved above: 64 KiB of the read-only mapping, alive in `regs`.
        let seen = unsafe { std::slice::from_raw_parts(got[0].0 as *const u8, 64 << 10) };
        assert!(seen.iter().all(|&b| b == 0xab));
        // and follows what the owner writes
        r.write(5, &[1, 2, 3]);
        assert_eq!(&seen[4..9], &[0xab, 1, 2, 3, 0xab]);
        assert_eq!(regs.missing(&p), Some(8));
        assert_eq!(regs.missing(&payload(&[(7, 0, 1)])), None);
        // a payload whose pieces do not divide is not rewritten
        assert_eq!(regs.rewrite(&p[..p.len() - 1], &mut [0u8; 512]), None);
    }

    #[test]
    fn a_deregistered_region_is_forgotten_and_its_owner_keeps_its_bytes() {
        let r = region(32 << 10, 0x5a);
        r.write(0, b"mine");
        let mut regs = Regions::default();
        assert!(regs.insert(9, file(&r)));
        assert!(regs.knows(9));
        let back = r.into_inner();
        assert_eq!(&back[..4], b"mine");
        assert!(back[4..].iter().all(|&b| b == 0x5a));
        assert!(!regs.knows(9), "its live word went to 0");
        assert_eq!(resolved(&regs, &payload(&[(9, 0, 4)]))[0].0, 0);
    }

    /// A region file as `SharedBytes::new_shared_zeroed` makes one (live header, `len`
    /// zero bytes), without taking one of the process's shared regions.
    pub(crate) fn region_file(len: usize) -> OwnedFd {
        let f = crate::memfd::sealed(c"test-region", HEADER + len).unwrap();
        let file = std::fs::File::from(f.try_clone().unwrap());
        file.write_all_at(&1u32.to_ne_bytes(), 0).unwrap();
        f
    }

    #[test]
    fn other_files_are_refused_and_the_mappings_per_peer_are_bounded() {
        let f = crate::memfd::unsealed(c"not-a-region", 0).unwrap();
        assert!(!Regions::default().insert(1, f), "shorter than the header");
        // a region file whose size is not sealed (its maker could shrink it under us)
        let f = crate::memfd::unsealed(c"unsealed", 2 * HEADER).unwrap();
        assert!(!Regions::default().insert(1, f), "size not sealed");
        let mut regs = Regions::default();
        for k in 0..=MAX_REGIONS {
            assert!(regs.insert(k as u64 + 1, region_file(64)));
        }
        assert_eq!(regs.maps.len(), MAX_REGIONS);
        assert!(!regs.knows(1), "the oldest went");
        assert!(regs.knows(MAX_REGIONS as u64 + 1));
        // and in bytes: sparse files cost their maker nothing, our address space is bounded
        let big = MAX_BYTES / 2 - HEADER;
        let mut regs = Regions::default();
        assert!(
            !regs.insert(1, region_file(MAX_BYTES)),
            "larger than the bound"
        );
        for k in 2..=4 {
            assert!(regs.insert(k, region_file(big)));
        }
        assert!(!regs.knows(2), "the oldest went");
        assert!(regs.knows(3) && regs.knows(4));
        let mapped: usize = regs.maps.iter().map(|m| m.map.len()).sum();
        assert!(mapped <= MAX_BYTES, "{mapped}");
    }
}
