//! Memory registered in place (`ProtectionDomain::register_raw`, the C ABI's `ibv_reg_mr`)
//! that is page-aligned private anonymous memory moves onto a region file at the same
//! addresses, so that host-local WRITEs from it are pulled; deregistered, it is private
//! memory again with its bytes. Other memory (unaligned, a shared file mapping) stays as
//! it is and still works.
#![allow(unsafe_code)] // mmap'd test buffers, written through their pointers

mod common;

use common::{device, host_local_pair, poll_within, LocalEnd, LIMIT};
use rdma_soft::verbs::*;

const LEN: usize = 64 << 10;

/// The `/proc/self/maps` line of the mapping holding `addr`.
fn mapping_of(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, _) = line.split_once(' ').unwrap();
        let (s, e) = range.split_once('-').unwrap();
        let (s, e) = (
            usize::from_str_radix(s, 16).unwrap(),
            usize::from_str_radix(e, 16).unwrap(),
        );
        if (s..e).contains(&addr) {
            return line.to_owned();
        }
    }
    panic!("{addr:#x} not mapped")
}

/// A fresh mapping of `len` bytes (anonymous private, or shared of `fd`).
fn map(len: usize, fd: Option<i32>) -> *mut u8 {
    let flags = match fd {
        None => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        Some(_) => libc::MAP_SHARED,
    };
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new mapping where the kernel picks; checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, flags, fd.unwrap_or(-1), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Two connected RC QPs on two devices of this process (the host-local wire between
/// them), and a target region on `b`.
struct Pair {
    a: LocalEnd,
    b: LocalEnd,
    target: MemoryRegion,
}

fn pair(ip_a: &str, ip_b: &str) -> Pair {
    let (a, b) = host_local_pair(|ip| device(ip, None), ip_a, ip_b);
    let target =
        b.1.alloc(LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    Pair { a, b, target }
}

impl Pair {
    /// WRITEs `len` bytes of `mr` to the target; returns the sender's pulled WRITEs so far.
    fn write(&self, mr: &MemoryRegion, len: u32) -> u64 {
        let op = SendOp::RdmaWrite {
            remote_addr: self.target.addr(),
            rkey: self.target.rkey(),
        };
        let wr = SendWr::new(1, op)
            .with_sge(mr.sge(0, len).unwrap())
            .signaled();
        self.a.3.post_send(&wr).unwrap();
        let c = poll_within(&self.a.2, LIMIT, "WRITE completion");
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        self.a.3.transport_stats().unwrap().pulls_sent
    }
}

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_READ);

#[test]
fn an_anonymous_page_aligned_buffer_is_pulled_from_and_given_back_private() {
    let p = pair("127.0.64.1", "127.0.64.2");
    let buf = map(LEN, None);
    let want = pattern(7, LEN);
    // SAFETY: LEN bytes of our mapping.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), buf, LEN) };
    assert!(!mapping_of(buf as usize).contains("memfd"));
    // SAFETY: `buf` stays mapped until the end.
    let mr = unsafe { p.a.1.register_raw(buf, LEN, ACCESS) }.unwrap();
    assert_eq!(mr.addr(), buf as u64, "same addresses");
    let line = mapping_of(buf as usize);
    assert!(
        line.contains("/memfd:rdma-mr") && line.contains("rw-s"),
        "{line}"
    );
    assert_eq!(mr.to_vec(), want, "same bytes");
    // the application writes through its own pointer: the region sees it
    // SAFETY: inside our mapping; nothing else accesses it now.
    unsafe { std::ptr::copy_nonoverlapping(b"mine".as_ptr(), buf.add(100), 4) };
    let mut got = [0u8; 4];
    mr.read(100, &mut got).unwrap();
    assert_eq!(&got, b"mine");
    // a host-local WRITE from it is pulled, and lands
    assert_eq!(p.write(&mr, LEN as u32), 1, "pulled");
    let mut want = want;
    want[100..104].copy_from_slice(b"mine");
    assert_eq!(p.target.to_vec(), want);
    assert_eq!(p.b.3.transport_stats().unwrap().pulls_done, 1);
    // the region writes into the application's memory (a local write, as a receive does)
    mr.write(200, b"device").unwrap();
    // deregistered: private anonymous memory again, every byte kept
    drop(mr);
    let line = mapping_of(buf as usize);
    assert!(!line.contains("memfd") && line.contains("rw-p"), "{line}");
    want[200..206].copy_from_slice(b"device");
    // SAFETY: LEN bytes of our mapping, ours alone again.
    let back = unsafe { std::slice::from_raw_parts(buf, LEN) }.to_vec();
    assert!(back == want, "bytes changed by the way back");
    // registered again: moved again, and pulled again
    // SAFETY: as above.
    let mr = unsafe { p.a.1.register_raw(buf, LEN, ACCESS) }.unwrap();
    assert!(mapping_of(buf as usize).contains("memfd"));
    assert_eq!(p.write(&mr, LEN as u32), 2);
    drop(mr);
    // SAFETY: our mapping, unregistered.
    unsafe { libc::munmap(buf.cast(), LEN) };
    drop(p.b);
}

#[test]
fn unaligned_and_shared_file_memory_stays_where_it_is_and_still_works() {
    let p = pair("127.0.64.3", "127.0.64.4");
    // not page-aligned: the bytes around it are not the region's
    let buf = map(LEN + 4096, None);
    let want = pattern(9, LEN);
    // SAFETY: inside our mapping.
    let at = unsafe { buf.add(64) };
    // SAFETY: LEN bytes from `at` are inside the mapping.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), at, LEN) };
    // SAFETY: the mapping outlives the region.
    let mr = unsafe { p.a.1.register_raw(at, LEN, ACCESS) }.unwrap();
    assert!(!mapping_of(at as usize).contains("memfd"), "not moved");
    assert_eq!(p.write(&mr, LEN as u32), 0, "not pulled");
    assert_eq!(p.target.to_vec(), want);
    drop(mr);
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf.cast(), LEN + 4096) };

    // a shared mapping of a file: the file must keep seeing what the region gets
    let file = tempfile_of(LEN);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let buf = map(LEN, Some(fd));
    let before = mapping_of(buf as usize);
    // SAFETY: as above.
    let mr = unsafe { p.a.1.register_raw(buf, LEN, ACCESS) }.unwrap();
    assert_eq!(mapping_of(buf as usize), before, "not moved");
    mr.write(10, b"through the region").unwrap();
    let mut got = [0u8; 18];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut got, 10).unwrap();
    assert_eq!(
        &got, b"through the region",
        "the file sees the region's writes"
    );
    assert_eq!(p.write(&mr, LEN as u32), 0, "not pulled");
    let mut target = vec![0u8; 18];
    p.target.read(10, &mut target).unwrap();
    assert_eq!(&target[..], b"through the region");
    drop(mr);
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf.cast(), LEN) };
}

/// An unlinked file of `len` zero bytes in the temporary directory.
fn tempfile_of(len: usize) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("rdma-soft-in-place-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(len as u64).unwrap();
    f
}

/// With `RDMA_SOFT_PULL_IN_PLACE` off (`SoftConfig::pull_in_place(false)`) nothing moves.
#[test]
fn turned_off_nothing_moves() {
    let cfg = rdma_soft::SoftConfig::builder()
        .pull_in_place(false)
        .build()
        .unwrap();
    let mut dc = DeviceConfig::for_netdev("lo").unwrap();
    dc.gids = vec!["127.0.64.5".parse().unwrap()];
    let dev = Device::open_with_config(dc, &cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let buf = map(LEN, None);
    // SAFETY: the mapping outlives the region.
    let mr = unsafe { pd.register_raw(buf, LEN, ACCESS) }.unwrap();
    assert!(!mapping_of(buf as usize).contains("memfd"), "not moved");
    drop(mr);
    // SAFETY: our mapping.
    unsafe { libc::munmap(buf.cast(), LEN) };
}
