//! One direction of a host-local channel: a single-producer, single-consumer ring of
//! packets in a shared-memory file (a memfd) that the two processes map.
//!
//! Layout: a 4 KiB header (magic, capacity, then `head`, `tail` and `waiting` on their own
//! cache lines), then `capacity` bytes of records. A record is 8-aligned: `total: u32`
//! (its length with this header; [`SKIP`] marks the unused end of the buffer before a wrap),
//! `len: u16` (the packet's), `tclass: u8`, `placement: u8` (0 inline, 1 pull:
//! [`TxPlacement`]), `from` and `to` (16-byte GID
//! and 4-byte scope each), `ifindex: u32` (the arrival netdev of a datagram handed on, else
//! 0) and 4 bytes of zeros, then the packet. `head` and `tail` count bytes ever written and
//! consumed; the producer publishes a record by moving `head` past it (release), the
//! consumer frees it by moving `tail` (release). The consumer trusts nothing it reads: a
//! record that breaks the layout makes [`Ring::peek`] fail and the ring is dropped.
//!
//! `waiting` is the wake-up protocol: a consumer about to sleep sets it and looks again
//! ([`Ring::arm`]); a producer that published sets it back to 0 and rings the consumer's
//! bell when it was set ([`Ring::take_waiting`]), with a full fence between each side's
//! store and load, so one of them always sees the other.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::io::{TxPlacement, WireAddr};
use crate::memfd::Mapping;

/// "rdmaRng2" in the first 8 bytes of a ring file (the second record layout: a process of
/// the first refuses the ring rather than misread it).
const MAGIC: u64 = u64::from_be_bytes(*b"rdmaRng2");
/// Bytes before the records.
const HEADER: usize = 4096;
const HEAD: usize = 64;
const TAIL: usize = 128;
const WAITING: usize = 192;
const CLOSED: usize = 256;
const BLOCKED: usize = 260;
/// A record's own header.
pub(crate) const RECORD: usize = 56;
/// `total` of the filler at the end of the buffer before a wrap.
const SKIP: u32 = u32::MAX;
/// Smallest and largest ring capacity.
pub(crate) const MIN_CAPACITY: usize = 64 << 10;
pub(crate) const MAX_CAPACITY: usize = 1 << 30;

/// What a record says besides its packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordMeta {
    pub from: WireAddr,
    pub to: WireAddr,
    pub tclass: u8,
    pub placement: TxPlacement,
    pub ifindex: u32,
}

/// A record that breaks the layout (a buggy or hostile producer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

/// One mapped ring, as its producer or its consumer sees it.
pub(crate) struct Ring {
    map: Mapping,
    fd: OwnedFd,
    cap: u64,
    /// Producer: bytes written (published or not). Consumer: bytes consumed.
    pos: u64,
    /// Producer: the consumer's `tail` last read (refreshed when space seems short).
    /// Consumer: the length of the record [`Ring::peek`] returned last.
    limit: u64,
    /// Consumer: the last record's address bytes (`from` and `to`, 40 bytes) and what they
    /// decoded to; a record with the same bytes reuses them (one peer pair per ring, as a
    /// rule: the decoding was about 7 % of a record's receive path).
    addrs: Option<([u8; ADDRS], WireAddr, WireAddr)>,
}

/// A record's address bytes: `from` and `to`, GID and scope each.
const ADDRS: usize = 40;

/// Whether `n` bytes is a ring capacity: a power of two within the limits.
pub(crate) fn valid_capacity(n: usize) -> bool {
    n.is_power_of_two() && (MIN_CAPACITY..=MAX_CAPACITY).contains(&n)
}

impl Ring {
    /// Where `pos` falls in the data area (the capacity is a power of two: a mask, not a
    /// division, on every record).
    #[inline]
    fn offset(&self) -> u64 {
        debug_assert!(self.cap.is_power_of_two());
        self.pos & (self.cap - 1)
    }

    /// `fd` (`HEADER` + `cap` bytes long) mapped, at position 0.
    fn mapped(fd: OwnedFd, cap: usize) -> std::io::Result<Ring> {
        Ok(Ring {
            map: Mapping::shared(fd.as_fd(), HEADER + cap, true)?,
            fd,
            cap: cap as u64,
            pos: 0,
            limit: 0,
            addrs: None,
        })
    }

    /// A new ring of `capacity` bytes (see [`valid_capacity`]), for its producer.
    pub fn create(capacity: usize) -> std::io::Result<Ring> {
        if !valid_capacity(capacity) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // its size sealed: the consumer maps it and must never find it shorter
        let fd = crate::memfd::sealed(c"rdma-soft-ring", HEADER + capacity)?;
        let r = Ring::mapped(fd, capacity)?;
        // A fresh memfd reads as zeros: head, tail and waiting start at 0.
        r.word(8).store(capacity as u64, Ordering::Relaxed);
        r.word(0).store(MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Maps a ring another process made, for its consumer; checks that its size is sealed
    /// (a file that could shrink under the mapping would kill us) and the header.
    pub fn attach(fd: OwnedFd) -> std::io::Result<Ring> {
        let bad = || std::io::Error::from_raw_os_error(libc::EPROTO);
        if !crate::memfd::size_sealed(fd.as_fd()) {
            return Err(bad());
        }
        let (fd, size) = crate::memfd::file_size(fd);
        let len = usize::try_from(size?).map_err(|_| bad())?;
        let cap = len.checked_sub(HEADER).ok_or_else(bad)?;
        if !valid_capacity(cap) {
            return Err(bad());
        }
        let r = Ring::mapped(fd, cap)?;
        if r.word(0).load(Ordering::Acquire) != MAGIC
            || r.word(8).load(Ordering::Relaxed) != cap as u64
        {
            return Err(bad());
        }
        // the consumer reads records at 8-aligned offsets from here on
        let tail = r.word(TAIL).load(Ordering::Acquire);
        if tail % 8 != 0 {
            return Err(bad());
        }
        Ok(Ring { pos: tail, ..r })
    }

    /// The ring's file, to hand to the consumer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is an 8-aligned offset inside the header of a live mapping;
        // page-aligned mappings keep it aligned.
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn flag(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `word` (4-aligned offsets).
        unsafe { &*self.map.ptr().as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn waiting(&self) -> &AtomicU32 {
        self.flag(WAITING)
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the records start right after the header, inside the mapping.
        unsafe { self.map.ptr().as_ptr().add(HEADER) }
    }

    // ---- producer ----

    /// Whether `more` bytes past `pos` stay within a capacity of the consumer's `tail` as
    /// last read (`limit`). A `tail` the consumer moved past what was written, or back more
    /// than a capacity, is no room (the consumer is broken or hostile), never an underflow.
    fn fits(&self, more: u64) -> bool {
        self.pos
            .checked_sub(self.limit)
            .and_then(|used| used.checked_add(more))
            .is_some_and(|n| n <= self.cap)
    }

    /// Whether a packet of `max` bytes fits now.
    pub fn has_room(&mut self, max: usize) -> bool {
        let need = (RECORD + max).next_multiple_of(8) as u64;
        let at = self.offset();
        let wrap = if at + need > self.cap {
            self.cap - at
        } else {
            0
        };
        if self.fits(wrap + need) {
            return true;
        }
        self.limit = self.word(TAIL).load(Ordering::Acquire);
        self.fits(wrap + need)
    }

    /// The producer waits for room: the consumer rings its bell after freeing some
    /// ([`Ring::take_blocked`]). True when room appeared meanwhile (do not wait).
    pub fn block(&mut self, max: usize) -> bool {
        self.flag(BLOCKED).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.has_room(max)
    }

    /// Room for a packet of up to `max` bytes, as a slice to write it into, or `None` when
    /// the ring has no room now. Nothing is published until [`Ring::commit`].
    pub fn reserve(&mut self, max: usize) -> Option<&mut [u8]> {
        let need = (RECORD + max).next_multiple_of(8) as u64;
        if need > self.cap / 4 {
            return None;
        }
        let at = self.offset();
        let wrap = if at + need > self.cap {
            self.cap - at
        } else {
            0
        };
        if !self.fits(wrap + need) {
            self.limit = self.word(TAIL).load(Ordering::Acquire);
            if !self.fits(wrap + need) {
                return None;
            }
        }
        if wrap > 0 {
            // SAFETY: [at, cap) is free (checked above) and 8-aligned.
            unsafe { self.data().add(at as usize).cast::<u32>().write(SKIP) };
            self.pos += wrap;
        }
        let at = (self.offset()) as usize;
        // SAFETY: [at, at + need) is free space of the ring, owned by the producer until
        // published; the slice lives as long as `&mut self`.
        Some(unsafe { std::slice::from_raw_parts_mut(self.data().add(at + RECORD), max) })
    }

    /// Publishes the packet of `len` bytes written into the last [`Ring::reserve`].
    pub fn commit(&mut self, meta: &RecordMeta, len: usize) {
        let total = (RECORD + len).next_multiple_of(8);
        let at = (self.offset()) as usize;
        let mut h = [0u8; RECORD];
        h[0..4].copy_from_slice(&(total as u32).to_le_bytes());
        h[4..6].copy_from_slice(&(len as u16).to_le_bytes());
        h[6] = meta.tclass;
        h[7] = match meta.placement {
            TxPlacement::Inline => 0,
            TxPlacement::Pull => 1,
        };
        h[8..24].copy_from_slice(&meta.from.gid());
        h[24..28].copy_from_slice(&meta.from.scope_id().to_le_bytes());
        h[28..44].copy_from_slice(&meta.to.gid());
        h[44..48].copy_from_slice(&meta.to.scope_id().to_le_bytes());
        h[48..52].copy_from_slice(&meta.ifindex.to_le_bytes());
        // SAFETY: the record's header room, reserved above.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.data().add(at), RECORD) };
        self.pos += total as u64;
        self.word(HEAD).store(self.pos, Ordering::Release);
    }

    /// After publishing: whether the consumer was waiting (it is then no more: ring its
    /// bell once).
    pub fn take_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        self.waiting().load(Ordering::Relaxed) != 0 && self.waiting().swap(0, Ordering::AcqRel) != 0
    }

    /// The producer is done with the ring (its wire closed): the consumer drops it once
    /// drained.
    pub fn close_producer(&self) {
        self.flag(CLOSED).store(1, Ordering::Release);
    }

    // ---- consumer ----

    /// Whether the producer closed the ring.
    pub fn producer_closed(&self) -> bool {
        self.flag(CLOSED).load(Ordering::Acquire) != 0
    }

    /// The next record, or `None` when the ring is empty. [`Ring::advance`] frees it.
    pub fn peek(&mut self) -> Result<Option<(RecordMeta, &[u8])>, Malformed> {
        loop {
            let head = self.word(HEAD).load(Ordering::Acquire);
            if head == self.pos {
                return Ok(None);
            }
            let avail = head.wrapping_sub(self.pos);
            if avail > self.cap || avail % 8 != 0 {
                return Err(Malformed("head out of range"));
            }
            let at = (self.offset()) as usize;
            // SAFETY: [pos, head) is published and the consumer's to read; `at` is
            // 8-aligned inside the buffer.
            let total = unsafe { self.data().add(at).cast::<u32>().read() };
            if total == SKIP {
                let rest = self.cap - at as u64;
                if rest > avail {
                    return Err(Malformed("wrap past head"));
                }
                self.pos = self.pos.wrapping_add(rest);
                self.word(TAIL).store(self.pos, Ordering::Release);
                continue;
            }
            let total = total as usize;
            if total < RECORD
                || total % 8 != 0
                || total as u64 > avail
                || at + total > self.cap as usize
            {
                return Err(Malformed("record length"));
            }
            // SAFETY: the whole record is published and inside the buffer (checked).
            let rec = unsafe { std::slice::from_raw_parts(self.data().add(at), total) };
            let len = u16::from_le_bytes([rec[4], rec[5]]) as usize;
            if RECORD + len > total {
                return Err(Malformed("packet length"));
            }
            let placement = match rec[7] {
                0 => TxPlacement::Inline,
                1 => TxPlacement::Pull,
                _ => return Err(Malformed("placement")),
            };
            let (from, to) = match &self.addrs {
                Some((key, from, to)) if key[..] == rec[8..8 + ADDRS] => (*from, *to),
                _ => {
                    let addr = |o: usize| {
                        let mut g = [0u8; 16];
                        g.copy_from_slice(&rec[o..o + 16]);
                        let scope = u32::from_le_bytes([
                            rec[o + 16],
                            rec[o + 17],
                            rec[o + 18],
                            rec[o + 19],
                        ]);
                        WireAddr::new(std::net::Ipv6Addr::from(g).into(), scope)
                    };
                    let mut key = [0u8; ADDRS];
                    key.copy_from_slice(&rec[8..8 + ADDRS]);
                    let (from, to) = (addr(8), addr(28));
                    self.addrs = Some((key, from, to));
                    (from, to)
                }
            };
            let meta = RecordMeta {
                from,
                to,
                tclass: rec[6],
                placement,
                ifindex: u32::from_le_bytes([rec[48], rec[49], rec[50], rec[51]]),
            };
            self.limit = total as u64;
            return Ok(Some((meta, &rec[RECORD..RECORD + len])));
        }
    }

    /// Frees the record [`Ring::peek`] returned last (the producer may reuse its room).
    pub fn advance(&mut self) {
        // the length peek validated, not the shared word (the producer could change it)
        self.pos = self.pos.wrapping_add(std::mem::take(&mut self.limit));
        self.word(TAIL).store(self.pos, Ordering::Release);
    }

    /// After freeing records: whether the producer waits for room (it is then no more:
    /// ring its bell once).
    pub fn take_blocked(&self) -> bool {
        fence(Ordering::SeqCst);
        let f = self.flag(BLOCKED);
        f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::AcqRel) != 0
    }

    /// Whether a record is published and not consumed.
    pub fn pending(&self) -> bool {
        self.word(HEAD).load(Ordering::Acquire) != self.pos
    }

    /// The consumer is about to sleep: asks the producer to ring its bell, then looks
    /// again; true when a record arrived meanwhile (do not sleep).
    pub fn arm(&self) -> bool {
        self.waiting().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.pending()
    }
}

/// Fuzzing: a ring whose header words and records are `input` (tail, head less tail, then
/// the buffer), attached and read to the end as a consumer would.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_consume(input: &[u8]) {
    let word = |i: usize| {
        input
            .get(i..i + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let Ok(p) = Ring::create(MIN_CAPACITY) else {
        return;
    };
    let tail = word(0);
    let data = input.get(16..).unwrap_or(&[]);
    let n = data.len().min(MIN_CAPACITY);
    // SAFETY: `n` bytes into the producer's own buffer, as a hostile producer writes them.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.data(), n) };
    p.word(TAIL).store(tail, Ordering::Relaxed);
    p.word(HEAD)
        .store(tail.wrapping_add(word(8) & 0x3_ffff), Ordering::Release);
    let Ok(fd) = p.fd().try_clone_to_owned() else {
        return;
    };
    let Ok(mut c) = Ring::attach(fd) else {
        return;
    };
    for _ in 0..1024 {
        match c.peek() {
            Ok(Some((_, pkt))) => {
                assert!(pkt.len() + RECORD <= MIN_CAPACITY);
                c.advance();
            }
            Ok(None) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> RecordMeta {
        RecordMeta {
            from: "127.0.0.1".parse().unwrap(),
            to: "fe80::2%3".parse().unwrap(),
            tclass: 0x48,
            placement: TxPlacement::Pull,
            ifindex: 7,
        }
    }

    fn push(p: &mut Ring, bytes: &[u8]) -> bool {
        match p.reserve(bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                p.commit(&meta(), bytes.len());
                true
            }
            None => false,
        }
    }

    fn attach(p: &Ring) -> Ring {
        let fd = p.fd().try_clone_to_owned().unwrap();
        Ring::attach(fd).unwrap()
    }

    #[test]
    fn records_cross_in_order_through_wraps_and_fill_up() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        let mut c = attach(&p);
        let mut sent = 0u32;
        let mut got = 0u32;
        // many wraps: 3000-byte packets in a 64 KiB ring, the consumer lagging
        for round in 0..200 {
            while sent < got + 5 + round % 17 {
                let pkt = vec![sent as u8; 1000 + (sent as usize * 7) % 2000];
                if !push(&mut p, &pkt) {
                    break;
                }
                sent += 1;
            }
            for _ in 0..(round % 5 + 1) {
                let Some((m, pkt)) = c.peek().unwrap() else {
                    break;
                };
                assert_eq!(m, meta());
                assert_eq!(pkt.len(), 1000 + (got as usize * 7) % 2000);
                assert!(pkt.iter().all(|&b| b == got as u8));
                c.advance();
                got += 1;
            }
        }
        assert!(got > 300, "{got}");
        // a full ring refuses, and takes again once drained
        while push(&mut p, &[1u8; 4000]) {}
        assert!(p.reserve(4000).is_none());
        while c.peek().unwrap().is_some() {
            c.advance();
        }
        assert!(push(&mut p, &[2u8; 4000]));
    }

    #[test]
    fn each_record_reads_its_own_addresses() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        let mut c = attach(&p);
        let other = RecordMeta {
            from: "::1".parse().unwrap(),
            to: "fe80::2%4".parse().unwrap(),
            tclass: 0,
            placement: TxPlacement::Inline,
            ifindex: 0,
        };
        // the same pair twice (the decoded pair reused), then another, then the first again
        let metas = [meta(), meta(), other, other, meta()];
        for m in &metas {
            p.reserve(1).unwrap()[0] = 7;
            p.commit(m, 1);
        }
        for m in &metas {
            assert_eq!(c.peek().unwrap().unwrap().0, *m);
            c.advance();
        }
        // the producer rewrites a published record's address (a hostile peer): read anew
        p.reserve(1).unwrap()[0] = 7;
        p.commit(&meta(), 1);
        let at = (p.pos - (RECORD + 1).next_multiple_of(8) as u64) as usize;
        // SAFETY: the producer's own mapping, as a hostile peer would write it.
        unsafe { p.data().add(at + 8 + 15).write(2) };
        assert_eq!(
            c.peek().unwrap().unwrap().0.from,
            "127.0.0.2".parse().unwrap()
        );
    }

    #[test]
    fn the_waiting_flag_is_seen_by_exactly_one_publish() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        let c = attach(&p);
        assert!(!p.take_waiting());
        assert!(!c.arm());
        assert!(push(&mut p, b"x"));
        assert!(p.take_waiting());
        assert!(!p.take_waiting());
        assert!(c.arm(), "a record is pending");
    }

    #[test]
    fn a_hostile_producer_gets_an_error_not_a_read_out_of_bounds() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        let mut c = attach(&p);
        assert!(push(&mut p, b"hello"));
        // the length field of the record, overwritten by the producer after publishing
        for (bad, why) in [
            (8u32, "record length"),
            (MIN_CAPACITY as u32 * 2, "record length"),
            (61, "record length"),
        ] {
            // SAFETY: writing the producer's own mapping, as a hostile peer would.
            unsafe { p.data().cast::<u32>().write(bad) };
            assert_eq!(c.peek().unwrap_err(), Malformed(why));
        }
        // SAFETY: as above.
        unsafe { p.data().cast::<u32>().write(RECORD as u32) };
        // SAFETY: as above: a packet length past the record.
        unsafe { p.data().add(4).cast::<u16>().write(9) };
        assert_eq!(c.peek().unwrap_err(), Malformed("packet length"));
        p.word(HEAD)
            .store(MIN_CAPACITY as u64 * 3, Ordering::Release);
        assert_eq!(c.peek().unwrap_err(), Malformed("head out of range"));
    }

    #[test]
    fn a_hostile_consumer_cannot_make_the_producer_overflow() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        let c = attach(&p);
        // full: the producer rereads the consumer's tail at every try
        while push(&mut p, &[1u8; 100]) {}
        let written = p.word(HEAD).load(Ordering::Acquire);
        // a tail past what was written (an underflow of pos - tail): no room, no panic
        for bad in [written + 8, 1 << 40, u64::MAX - 7] {
            c.word(TAIL).store(bad, Ordering::Release);
            assert!(!p.has_room(100), "tail {bad}");
            assert!(p.reserve(100).is_none(), "tail {bad}");
        }
        // an honest tail (all consumed): room again
        c.word(TAIL).store(written, Ordering::Release);
        assert!(push(&mut p, b"two"));
    }

    #[test]
    fn a_consumer_attaches_only_at_an_aligned_tail() {
        let mut p = Ring::create(MIN_CAPACITY).unwrap();
        assert!(push(&mut p, b"hello"));
        // a producer that set a misaligned tail before handing the ring over: refused
        // (records would be read at unaligned offsets)
        p.word(TAIL).store(3, Ordering::Release);
        let fd = p.fd().try_clone_to_owned().unwrap();
        let e = Ring::attach(fd).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO));
        // near the end of the counter: attached, reads as malformed or empty, never panics
        p.word(TAIL).store(u64::MAX - 7, Ordering::Release);
        p.word(HEAD)
            .store((u64::MAX - 7).wrapping_add(64), Ordering::Release);
        let mut c = attach(&p);
        // the last 8 bytes of the buffer hold no record: refused without an overflow
        assert_eq!(c.peek().unwrap_err(), Malformed("record length"));
    }

    #[test]
    fn attach_refuses_what_is_not_a_ring() {
        use std::os::unix::fs::FileExt;
        // a file of a ring's size without its header
        let fd = crate::memfd::sealed(c"x", HEADER + MIN_CAPACITY).unwrap();
        let e = Ring::attach(fd).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO));
        // a real ring's file whose size is not sealed (its maker could shrink it under the
        // mapping): refused before it is mapped
        let fd = crate::memfd::unsealed(c"x", HEADER + MIN_CAPACITY).unwrap();
        let real = Ring::create(MIN_CAPACITY).unwrap();
        let mut head = [0u8; 16];
        let file = |fd: BorrowedFd<'_>| std::fs::File::from(fd.try_clone_to_owned().unwrap());
        assert_eq!(file(real.fd()).read_at(&mut head, 0).unwrap(), 16);
        assert_eq!(file(fd.as_fd()).write_at(&head, 0).unwrap(), 16);
        let e = Ring::attach(fd).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO));
        // the real one attaches
        let fd = real.fd().try_clone_to_owned().unwrap();
        assert!(Ring::attach(fd).is_ok());
        assert!(Ring::create(1000).is_err());
    }
}
