//! Which ranges `ProtectionDomain::register_raw` (the C ABI's `ibv_reg_mr`) may move onto a
//! region file in place (`crate::memfd::InPlace`), so that a peer process on this host
//! pulls WRITEs and SENDs from them as from `ProtectionDomain::alloc`'s regions (`crate::pull`).
//!
//! A range is moved only when replacing its mapping changes nothing the application can
//! see but sharing:
//! - page-aligned at both ends: a mapping covers whole pages, and the bytes around the
//!   range (malloc's chunk headers, another thread's data) must stay where they are;
//! - private anonymous read-write memory (the heap, an anonymous `mmap`): a file mapping
//!   would stop reaching its file, a `MAP_SHARED` one its other users, and a stack its
//!   guard and growth;
//! - at least the pull minimum long (shorter WRITEs go through the ring anyway), and the
//!   process's shared places ([`super::shared_mem::MAX_SHARED_REGIONS`]) not all taken.
//!
//! Anything else stays the caller's memory, as before.

use crate::maps::{self, Map};

/// Why `[addr, addr + len)` cannot be moved; `Ok` when it can. `maps` is
/// `/proc/self/maps`.
pub(crate) fn movable(
    addr: usize,
    len: usize,
    page: usize,
    maps: &str,
) -> Result<(), &'static str> {
    if len == 0 || addr % page != 0 || len % page != 0 {
        return Err("not page-aligned");
    }
    maps::covered(
        maps,
        addr,
        len,
        private_anonymous,
        "not private anonymous read-write memory",
    )
}

/// [`movable`] of this process's mappings now (reads `/proc/self/maps`).
pub(crate) fn movable_now(addr: usize, len: usize) -> Result<(), &'static str> {
    let page = crate::memfd::page_size();
    if addr % page != 0 || len % page != 0 {
        return Err("not page-aligned"); // without reading the maps
    }
    let maps = maps::read().map_err(|_| "no /proc/self/maps")?;
    movable(addr, len, page, &maps)
}

/// Read-write, private, no file: anonymous memory, the heap, or a named anonymous mapping;
/// not a stack or the kernel's pages (`[stack]`, `[vvar]` ...).
fn private_anonymous(m: &Map<'_>) -> bool {
    let name_ok = m.name.is_empty() || m.name == "[heap]" || m.name.starts_with("[anon:");
    m.perms == "rw-p" && m.inode == 0 && name_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0002000 r--p 00000000 08:01 1234 /usr/bin/prog
55d0c1000000-55d0c1400000 rw-p 00000000 00:00 0          [heap]
7f0000000000-7f0000020000 rw-p 00000000 00:00 0 
7f0000020000-7f0000040000 rw-p 00000000 00:00 0          [anon:glibc malloc]
7f0000040000-7f0000050000 rw-s 00000000 00:01 77         /memfd:rdma-mr (deleted)
7f0000050000-7f0000060000 rw-p 00001000 08:01 99         /tmp/a file
7f0000060000-7f0000070000 r--p 00000000 00:00 0 
7f0000080000-7f0000090000 rw-p 00000000 00:00 0 
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0          [stack]
";

    fn ok(addr: usize, len: usize) -> Result<(), &'static str> {
        movable(addr, len, 4096, MAPS)
    }

    #[test]
    fn anonymous_heap_and_adjacent_anonymous_ranges_move() {
        assert_eq!(ok(0x55d0c1000000, 0x10000), Ok(()), "the heap");
        assert_eq!(ok(0x7f0000000000, 0x20000), Ok(()), "an anonymous mmap");
        assert_eq!(
            ok(0x7f0000010000, 0x20000),
            Ok(()),
            "across two anonymous maps"
        );
    }

    #[test]
    fn anything_else_stays() {
        let no = |a, l| ok(a, l).is_err();
        assert!(no(0x7f0000000010, 0x10000), "unaligned start");
        assert!(no(0x7f0000000000, 0x10010), "unaligned end");
        assert!(no(0x7f0000040000, 0x10000), "a shared mapping");
        assert!(no(0x7f0000030000, 0x20000), "partly shared");
        assert!(no(0x7f0000050000, 0x10000), "a private file mapping");
        assert!(no(0x7f0000060000, 0x10000), "read-only");
        assert!(no(0x7f0000070000, 0x10000), "not mapped");
        assert!(no(0x7f0000080000, 0x20000), "runs past the mapping");
        assert!(no(0x7ffc00000000, 0x10000), "the stack");
        assert!(no(0x55d0c0000000, 0x1000), "the program's file");
        assert!(no(usize::MAX - 4095, 8192), "wraps");
        assert!(movable(0x1000, 0x1000, 4096, "garbage").is_err());
    }

    /// This process's own mappings: its code is a file mapping, which stays.
    #[test]
    fn this_process_maps() {
        let code = (movable_now as fn(usize, usize) -> _) as usize / 4096 * 4096;
        assert_eq!(
            movable_now(code, 4096),
            Err("not private anonymous read-write memory")
        );
        assert_eq!(movable_now(code + 1, 4096), Err("not page-aligned"));
    }
}
