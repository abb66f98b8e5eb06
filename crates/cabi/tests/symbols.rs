//! rdma-core 44's libibverbs symbols: every one Debian's `libibverbs.so.1` exports is ours,
//! at the same version; the pure functions among them (rates, `ibv_copy_*_kern`) give what
//! Debian's own give (loaded with `dlopen` beside ours); `ibv_rereg_mr` really moves a region.

mod support;

use std::collections::BTreeSet;
use std::ffi::{c_void, CString};
use std::path::Path;
use std::process::Command;

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// `objdump -T`: defined (symbol, version) pairs, a compat version in parentheses.
fn exports(lib: &Path) -> BTreeSet<(String, String)> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump");
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(" .text") || l.contains(" .bss") || l.contains(" .data"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3).then(|| (f[f.len() - 1].to_string(), f[f.len() - 2].to_string()))
        })
        .collect()
}

#[test]
fn every_libibverbs_symbol_of_rdma_core_44_is_defined() {
    let ours = exports(&support::lib_dir().join("libibverbs.so.1"));
    let debian = exports(Path::new(DEBIAN));
    let missing: Vec<_> = debian.difference(&ours).collect();
    assert!(missing.is_empty(), "not defined: {missing:?}");
    assert!(ours.contains(&("ibv_register_driver".into(), "(IBVERBS_1.1)".into())));
}

/// Debian's function `name` (its own copy, not ours).
fn theirs(name: &str) -> *mut c_void {
    static LIB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let h = *LIB.get_or_init(|| {
        let p = CString::new(DEBIAN).unwrap();
        // SAFETY: dlopen of a system library, kept open.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {DEBIAN}");
        h as usize
    });
    let n = CString::new(name).unwrap();
    // SAFETY: a symbol of that library.
    let f = unsafe { libc::dlsym(h as *mut c_void, n.as_ptr()) };
    assert!(!f.is_null(), "{name} in {DEBIAN}");
    f
}

#[test]
fn rate_conversions_match_rdma_core() {
    type F = unsafe extern "C" fn(i32) -> i32;
    let pairs: [(&str, F); 4] = [
        ("ibv_rate_to_mult", rdma_cabi::misc::ibv_rate_to_mult),
        ("mult_to_ibv_rate", rdma_cabi::misc::mult_to_ibv_rate),
        ("ibv_rate_to_mbps", rdma_cabi::misc::ibv_rate_to_mbps),
        ("mbps_to_ibv_rate", rdma_cabi::misc::mbps_to_ibv_rate),
    ];
    let mut inputs: Vec<i32> = (-2..=64).collect();
    // every rate's Mb/s, as Debian's library gives them
    // SAFETY: Debian's function of that signature.
    let to_mbps: F = unsafe { std::mem::transmute(theirs("ibv_rate_to_mbps")) };
    inputs.extend((0..=30).map(|r| unsafe { to_mbps(r) }));
    inputs.extend([480, 160, 240, 320, 2500, 1_000_000]);
    for (name, ours) in pairs {
        // SAFETY: as above.
        let f: F = unsafe { std::mem::transmute(theirs(name)) };
        for &x in &inputs {
            // SAFETY: pure functions of an int.
            let (a, b) = unsafe { (ours(x), f(x)) };
            assert_eq!(a, b, "{name}({x}): ours {a}, rdma-core {b}");
        }
    }
}

/// Bytes 1, 2, 3 … (no two fields alike), as a `T`.
fn pattern<T: Copy>(seed: u8) -> T {
    let n = std::mem::size_of::<T>();
    let bytes: Vec<u8> = (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect();
    // SAFETY: plain-data structs of n bytes.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) }
}

fn bytes<T>(v: &T) -> Vec<u8> {
    // SAFETY: reads a plain-data struct's bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

/// Runs our `ours` and Debian's `name` from the same source into destinations that start
/// alike, and compares the destinations byte for byte.
fn same_copy<S: Copy, D: Copy>(name: &str, ours: unsafe extern "C" fn(*mut D, *const S)) {
    for seed in [1u8, 99, 200] {
        let src: S = pattern(seed);
        let (mut a, mut b): (D, D) = (pattern(3), pattern(3));
        // SAFETY: Debian's function of that signature; both take valid structs.
        unsafe {
            let f: unsafe extern "C" fn(*mut D, *const S) = std::mem::transmute(theirs(name));
            ours(&mut a, &src);
            f(&mut b, &src);
        }
        assert_eq!(bytes(&a), bytes(&b), "{name} (seed {seed})");
    }
}

#[test]
fn kernel_struct_copies_match_rdma_core() {
    use rdma_cabi::marshall::*;
    use rdma_cabi::types::{ibv_ah_attr, ibv_qp_attr};
    same_copy::<ib_uverbs_ah_attr, ibv_ah_attr>(
        "ibv_copy_ah_attr_from_kern",
        ibv_copy_ah_attr_from_kern,
    );
    same_copy::<ib_uverbs_qp_attr, ibv_qp_attr>(
        "ibv_copy_qp_attr_from_kern",
        ibv_copy_qp_attr_from_kern,
    );
    same_copy::<ib_user_path_rec, ibv_sa_path_rec>(
        "ibv_copy_path_rec_from_kern",
        ibv_copy_path_rec_from_kern,
    );
    same_copy::<ibv_sa_path_rec, ib_user_path_rec>(
        "ibv_copy_path_rec_to_kern",
        ibv_copy_path_rec_to_kern,
    );
}

#[test]
fn rereg_mr_moves_the_region_and_checks_its_input() {
    use rdma_cabi::device::*;
    use rdma_cabi::objects::*;
    use rdma_cabi::rereg::ibv_rereg_mr;
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap();
    // SAFETY: the C API as a program uses it.
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        let devs = std::slice::from_raw_parts(list, n as usize);
        let lo = devs
            .iter()
            .copied()
            .find(|&d| std::ffi::CStr::from_ptr((*d).name.as_ptr()).to_bytes() == b"lo")
            .expect("device lo");
        let ctx = ibv_open_device(lo);
        let pd = ibv_alloc_pd(ctx);
        let pd2 = ibv_alloc_pd(ctx);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 8192];
        let mr = ibv_reg_mr(pd, a.as_mut_ptr().cast(), a.len(), 1);
        assert!(!mr.is_null());
        // Input errors: IBV_REREG_MR_ERR_INPUT (-1), EINVAL; the region is unchanged.
        assert_eq!(ibv_rereg_mr(mr, 8, pd, std::ptr::null_mut(), 0, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv_rereg_mr(mr, 1, pd, std::ptr::null_mut(), 0, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            ibv_rereg_mr(mr, 1, pd, b.as_mut_ptr().cast(), b.len(), 3),
            -1
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!((*mr).addr, a.as_mut_ptr().cast());
        assert_eq!(ibv_rereg_mr(mr, 0, pd, std::ptr::null_mut(), 0, 0), 0);
        // Translation, PD and access at once.
        let old_lkey = (*mr).lkey;
        assert_eq!(
            ibv_rereg_mr(mr, 1 | 2 | 4, pd2, b.as_mut_ptr().cast(), b.len(), 1 | 2),
            0
        );
        assert_eq!((*mr).addr, b.as_mut_ptr().cast());
        assert_eq!((*mr).length, b.len());
        assert_eq!((*mr).pd, pd2);
        let m = &*mr.cast::<Mr>();
        assert_eq!(m.mr.access().bits(), 1 | 2);
        assert_eq!(m.mr.addr(), b.as_ptr() as u64);
        assert_eq!((*mr).lkey, m.mr.lkey());
        assert_ne!((*mr).lkey, old_lkey, "a new registration");
        // Access alone keeps the memory; an unsupported access flag is ERR_CMD (-4).
        assert_eq!(ibv_rereg_mr(mr, 4, pd, std::ptr::null_mut(), 0, 1), 0);
        assert_eq!((*mr).addr, b.as_mut_ptr().cast());
        assert_eq!(ibv_rereg_mr(mr, 4, pd, std::ptr::null_mut(), 0, 1 << 6), -4);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(ibv_dereg_mr(mr), 0);
        assert_eq!(ibv_dealloc_pd(pd), 0);
        assert_eq!(ibv_dealloc_pd(pd2), 0);
        drop(a);
    }
}

#[test]
fn unsupported_late_calls_fail_as_rdma_core_without_the_feature() {
    use rdma_cabi::unsupported::*;
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap();
    // A pipe is no uverbs device: EINVAL, as rdma-core; no such fd either.
    let mut fds = [0; 2];
    // SAFETY: plain system calls.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        assert!(ibv_import_device(fds[0]).is_null());
        assert_eq!(errno(), libc::EINVAL);
        libc::close(fds[0]);
        libc::close(fds[1]);
        let null = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        assert!(ibv_import_device(null.as_raw_fd()).is_null());
        assert_eq!(errno(), libc::ENODEV);
    }
    assert_eq!(
        ibv_query_ece(std::ptr::null_mut(), std::ptr::null_mut()),
        libc::EOPNOTSUPP
    );
    assert!(ibv_import_pd().is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);
}
