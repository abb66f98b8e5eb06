//! `/proc/self/maps`: which mappings cover a range of this process's addresses (memory
//! registered in place, `verbs/in_place.rs`, and its way back, `memfd::InPlace`).

/// One line of `/proc/self/maps`.
#[derive(Debug)]
pub(crate) struct Map<'a> {
    pub start: usize,
    pub end: usize,
    /// `rw-p`, `r-xs` ...
    pub perms: &'a str,
    /// 0 for anonymous memory.
    pub inode: u64,
    /// The path, `[heap]`, `[stack]` ..., or empty.
    pub name: &'a str,
}

impl<'a> Map<'a> {
    /// `start-end perms offset dev inode [name]`.
    pub fn parse(line: &'a str) -> Option<Map<'a>> {
        let mut f = line.split_ascii_whitespace();
        let (start, end) = f.next()?.split_once('-')?;
        let perms = f.next()?;
        let (_offset, _dev, inode) = (f.next()?, f.next()?, f.next()?);
        // the name is the rest, spaces included
        let name = f.next().map_or("", |first| {
            let at = first.as_ptr() as usize - line.as_ptr() as usize;
            line[at..].trim_end()
        });
        Some(Map {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            perms,
            inode: inode.parse().ok()?,
            name,
        })
    }
}

/// This process's mappings now.
pub(crate) fn read() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/maps")
}

/// Whether `[addr, addr + len)` is mapped without a gap, by mappings that are all `ok`;
/// why not otherwise (`unwanted` when a mapping is not `ok`).
pub(crate) fn covered(
    maps: &str,
    addr: usize,
    len: usize,
    ok: impl Fn(&Map<'_>) -> bool,
    unwanted: &'static str,
) -> Result<(), &'static str> {
    let end = addr.checked_add(len).ok_or("past the address space")?;
    let mut at = addr;
    // the mappings covering the range, in address order (as the file lists them)
    for line in maps.lines() {
        let m = Map::parse(line).ok_or("unreadable /proc/self/maps")?;
        if m.end <= at {
            continue;
        }
        if m.start > at {
            return Err("not mapped");
        }
        if !ok(&m) {
            return Err(unwanted);
        }
        at = m.end;
        if at >= end {
            return Ok(());
        }
    }
    Err("not mapped")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_spaces_and_no_name_parse() {
        let m =
            Map::parse("7f0000050000-7f0000060000 rw-p 00001000 08:01 99  /tmp/a file").unwrap();
        assert_eq!((m.name, m.inode, m.perms), ("/tmp/a file", 99, "rw-p"));
        let m = Map::parse("7f0000000000-7f0000020000 rw-p 00000000 00:00 0").unwrap();
        assert_eq!(
            (m.start, m.end, m.name),
            (0x7f0000000000, 0x7f0000020000, "")
        );
        assert!(Map::parse("7f0000000000-7f0000020000 rw-p").is_none());
    }

    #[test]
    fn a_range_is_covered_without_gaps_by_wanted_maps() {
        let maps = "\
1000-3000 rw-p 00000000 00:00 0
3000-5000 rw-s 00000000 00:01 7 /memfd:x (deleted)
6000-7000 rw-p 00000000 00:00 0
";
        let anon = |m: &Map<'_>| m.inode == 0;
        assert_eq!(covered(maps, 0x1000, 0x2000, anon, "x"), Ok(()));
        assert_eq!(
            covered(maps, 0x2000, 0x2000, |_| true, "x"),
            Ok(()),
            "two maps"
        );
        assert!(
            covered(maps, 0x2000, 0x2000, anon, "x").is_err(),
            "one unwanted"
        );
        assert!(
            covered(maps, 0x4000, 0x3000, |_| true, "x").is_err(),
            "a gap"
        );
        assert!(
            covered(maps, 0x6000, 0x2000, |_| true, "x").is_err(),
            "past the end"
        );
        assert!(
            covered(maps, 0x8000, 0x1000, |_| true, "x").is_err(),
            "not mapped"
        );
        assert!(
            covered(maps, usize::MAX, 2, |_| true, "x").is_err(),
            "wraps"
        );
        assert!(covered("garbage", 0x1000, 1, |_| true, "x").is_err());
    }
}
