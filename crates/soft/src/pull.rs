//! Pulled RDMA WRITEs and SENDs between two of our processes on one host: one copy.
//!
//! A memory region of at least the configured minimum of bytes made by `ProtectionDomain::alloc` lives in
//! a memfd (`SharedBytes::new_shared_zeroed`) while the host-local wire is on (a buffer the
//! application registers stays its own memory: moved in, never copied; one registered in
//! place, the C ABI's, is moved onto a memfd at its own addresses when it qualifies:
//! `verbs/in_place.rs`). On the host-local
//! wire (`io::local`) a WRITE or SEND (with immediate or not) of at least that many bytes
//! from such a region then carries
//! no data: it is one packet standing for the whole message and its PSNs, which names the
//! sender's regions and ranges ([`Piece`]), and the sender's wire hands each region's memfd
//! to the peer's bell once (`MSG_MR`, before the first packet that names it).
//! The peer's wire maps the file read-only and, for each pulled packet, turns the pieces into
//! addresses in its own mapping ([`RESOLVED`] pairs) before the transport sees them. The
//! responder checks key, protection domain, bounds and access for the whole message as for
//! any WRITE, then copies it from the mapping straight into the target region: one copy,
//! against three through the ring. A pulled SEND takes the next receive as any SEND does
//! (none: RNR NAK, and it is pulled again after the wait); a message longer than the
//! receive is the same error as an inline one's, checked before any copy; each piece of
//! the receive's scatter list is then checked (key, protection domain, bounds, local
//! write) and filled from the mapping. A piece the peer cannot resolve (file not received,
//! region deregistered) makes the responder ask again (PSN sequence NAK) and the message
//! comes with its data; a sender stops pulling on a QP after a few such rewinds.
//!
//! The device's wire configuration says which WRITEs and SENDs are pulled
//! ([`crate::io::UdpConfig::local_pull`], `RDMA_SOFT_LOCAL_PULL`: `off` turns pulls off,
//! regions stay private; a number of bytes is the shortest message pulled).

use std::os::fd::RawFd;

use rdma_proto::memory::MemError;

/// Environment variable: `off` (or `0`) turns pulled WRITEs and SENDs off; a number of
/// bytes is the shortest WRITE or SEND pulled and region shared (default [`DEFAULT_MIN`]). Read by
/// [`crate::SoftConfig::from_env`].
pub const PULL_ENV: &str = "RDMA_SOFT_LOCAL_PULL";
/// Environment variable: `off` keeps every buffer the application registers in place
/// (`ibv_reg_mr`) private memory; on (the default), one that qualifies is moved onto a
/// region file so that its WRITEs and SENDs are pulled too (see `verbs/in_place.rs`). Read by
/// [`crate::SoftConfig::from_env`].
pub const PULL_IN_PLACE_ENV: &str = "RDMA_SOFT_PULL_IN_PLACE";
/// The shortest WRITE or SEND pulled by default: below it the copies through the ring cost less
/// than mapping lookups and the extra packet work.
pub const DEFAULT_MIN: u32 = 16 << 10;
/// A sender's description of one range: region token, offset in the region, length, and
/// the memfd (a descriptor number in the sender, for its wire to hand over), 4 bytes pad.
pub(crate) const PIECE: usize = 32;
/// A resolved range, as the receiver's wire rewrites a piece: address here, length.
pub(crate) const RESOLVED: usize = 16;

/// One range of a sender's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub token: u64,
    pub offset: u64,
    pub len: u64,
    pub fd: RawFd,
}

impl Piece {
    pub fn write(&self, out: &mut [u8]) -> Result<usize, MemError> {
        let out = out.get_mut(..PIECE).ok_or(MemError::Unavailable)?;
        out[..8].copy_from_slice(&self.token.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..28].copy_from_slice(&self.fd.to_le_bytes());
        out[28..32].fill(0);
        Ok(PIECE)
    }

    pub fn parse(b: &[u8]) -> Piece {
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        Piece {
            token: u(0),
            offset: u(8),
            len: u(16),
            fd: i32::from_le_bytes(b[24..28].try_into().unwrap_or_default()),
        }
    }
}

/// Bytes before the pieces of a pull payload: the message's length and PSNs.
pub(crate) const PREFIX: usize = 8;

/// The pieces after a pull payload's prefix; `None` when they do not divide.
pub(crate) fn pieces(payload: &[u8]) -> Option<impl Iterator<Item = Piece> + '_> {
    let rest = payload.get(PREFIX..)?;
    (rest.len() % PIECE == 0).then(|| rest.chunks_exact(PIECE).map(Piece::parse))
}

/// Copies `len` bytes, from byte `skip` of what the resolved pairs in `source` name, with
/// `write(offset, source address, length)` (into a checked range of a registered region). `Unavailable`
/// when a pair it needs is unresolved (address 0) or the pairs hold fewer bytes; nothing
/// is copied then.
///
/// The pairs come only from this process's host-local wire, which resolved them into its
/// read-only mappings of the peer's regions; they stay mapped while the packet is
/// delivered.
pub(crate) fn copy_range(
    source: &[u8],
    skip: u64,
    len: u64,
    mut write: impl FnMut(usize, *const u8, usize),
) -> Result<(), MemError> {
    if source.len() % RESOLVED != 0 {
        return Err(MemError::Unavailable);
    }
    // the pieces [skip, skip+len) touches: all resolved, enough of them
    let end = skip.checked_add(len).ok_or(MemError::Unavailable)?;
    let mut at = 0u64;
    for (addr, n) in resolved(source) {
        let next = at.saturating_add(n);
        // unresolved, or a pair no mapping could be (its end past the address space)
        if next > skip && at < end && (addr == 0 || addr.checked_add(n).is_none()) {
            return Err(MemError::Unavailable);
        }
        at = next;
    }
    if at < end {
        return Err(MemError::Unavailable);
    }
    let (mut at, mut done) = (0u64, 0usize);
    for (addr, n) in resolved(source) {
        // saturating: a piece's length is the peer's number (one left unresolved is
        // never read, but still counted)
        let (from, to) = (at.max(skip), at.saturating_add(n).min(end));
        if from < to {
            // `addr` is `n` readable bytes of a live mapping (see above) and `[from, to)`
            // lies inside this piece; the peer may change them meanwhile, which makes them
            // unspecified, as a DMA read would.
            let n = (to - from) as usize;
            write(done, (addr + (from - at)) as usize as *const u8, n);
            done += n;
        }
        at = at.saturating_add(n);
        if at >= end {
            break;
        }
    }
    Ok(())
}

/// The `(address, length)` pairs of a resolved source ([`RESOLVED`] bytes each).
fn resolved(source: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    source.chunks_exact(RESOLVED).map(|c| {
        let u = |o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap_or_default());
        (u(0), u(8))
    })
}

/// [`copy_range`] of a whole WRITE: the pairs must hold exactly `len` bytes.
pub(crate) fn copy_into(
    source: &[u8],
    len: u64,
    write: impl FnMut(usize, *const u8, usize),
) -> Result<(), MemError> {
    let total = resolved(source)
        .map(|(_, n)| n)
        .fold(0u64, u64::saturating_add);
    if total != len {
        return Err(MemError::Unavailable);
    }
    copy_range(source, 0, len, write)
}

/// Fuzzing: [`copy_range`] over arbitrary pairs (never dereferenced): on success the
/// writes cover `[0, len)` in order, each inside one resolved pair at the right place.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_copy_range(source: &[u8], skip: u64, len: u64) {
    let pairs: Vec<(u64, u64)> = if source.len() % RESOLVED == 0 {
        resolved(source).collect()
    } else {
        Vec::new()
    };
    let mut next = 0usize;
    let r = copy_range(source, skip, len, |at, src, n| {
        assert_eq!(at, next, "writes in order, without a gap");
        next += n;
        let src = src as usize as u64;
        let ok = pairs
            .iter()
            .any(|&(a, l)| a != 0 && src >= a && src - a < l && (n as u64) <= l - (src - a));
        assert!(ok, "a read outside every resolved pair");
    });
    if r.is_ok() {
        assert_eq!(next as u64, len, "the whole range");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(addr: u64, len: u64) -> [u8; RESOLVED] {
        let mut p = [0u8; RESOLVED];
        p[..8].copy_from_slice(&addr.to_le_bytes());
        p[8..].copy_from_slice(&len.to_le_bytes());
        p
    }

    #[allow(unsafe_code)]
    fn copied(source: &[u8], skip: u64, len: u64) -> Result<Vec<u8>, MemError> {
        let mut out = vec![0u8; len as usize];
        copy_range(source, skip, len, |at, src, n| {
            // SAFETY: the test's pairs name live vectors.
            out[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(src, n) })
        })?;
        Ok(out)
    }

    #[test]
    fn a_piece_of_any_length_never_overflows_the_count() {
        let b: Vec<u8> = (5..15).collect();
        let mut source = Vec::new();
        // an unresolved piece of nearly 2^64 bytes (the peer's number) before a real one
        source.extend_from_slice(&pair(0, u64::MAX - 2));
        source.extend_from_slice(&pair(b.as_ptr() as u64, 10));
        assert_eq!(copied(&source, u64::MAX - 1, 1).unwrap(), [6]);
        // a pair whose end is past the address space is no mapping: nothing is read
        let wrap = pair(u64::MAX - 10, 100);
        assert_eq!(copied(&wrap, 20, 5), Err(MemError::Unavailable));
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_range_reads_only_the_pieces_it_touches() {
        let a: Vec<u8> = (0..100).collect();
        let b: Vec<u8> = (100..150).collect();
        let mut source = Vec::new();
        source.extend_from_slice(&pair(a.as_ptr() as u64, 100));
        source.extend_from_slice(&pair(0, 10)); // a piece the wire could not resolve
        source.extend_from_slice(&pair(b.as_ptr() as u64, 50));
        assert_eq!(copied(&source, 90, 10).unwrap(), &a[90..]);
        assert_eq!(copied(&source, 110, 50).unwrap(), &b[..]);
        assert_eq!(copied(&source, 115, 20).unwrap(), &b[5..25]);
        assert_eq!(
            copied(&source, 95, 10),
            Err(MemError::Unavailable),
            "unresolved"
        );
        assert_eq!(
            copied(&source, 150, 20),
            Err(MemError::Unavailable),
            "past the end"
        );
        assert_eq!(
            copied(&source[..20], 0, 1),
            Err(MemError::Unavailable),
            "torn pair"
        );
        // a whole WRITE: exactly the pieces' bytes, all resolved
        let whole = |len| copy_into(&source, len, |_, _, _| {});
        assert_eq!(whole(160), Err(MemError::Unavailable));
        let two: Vec<u8> = [pair(a.as_ptr() as u64, 100), pair(b.as_ptr() as u64, 50)].concat();
        assert_eq!(
            copy_into(&two, 149, |_, _, _| {}),
            Err(MemError::Unavailable)
        );
        let mut out = vec![0u8; 150];
        copy_into(&two, 150, |at, src, n| {
            // SAFETY: the pairs name `a` and `b`, alive here.
            out[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(src, n) })
        })
        .unwrap();
        assert_eq!(out, (0..150).collect::<Vec<u8>>());
    }
}
