//! Long copies into and out of registered memory with the CPU's own copy instructions.
//!
//! Registered memory is only ever accessed atomically (`shared_mem.rs`). Word-sized relaxed
//! stores run at less than half of `memcpy`'s speed from a few hundred bytes up (the
//! `mr_copy` bench), and a pulled WRITE between processes is exactly one such copy. So on
//! x86_64 a long copy runs inside an `asm!` block: 32-byte vector moves (AVX2) up to 32 KiB,
//! `rep movsb` above (the string copy is the fastest there, and slow to start below).
//!
//! Soundness: the compiler sees the block as opaque. What it does is a byte-wise relaxed
//! atomic copy (every byte load and store of these instructions is single-copy atomic on
//! x86), so a byte that a racing access touches ends up unspecified, as with the word path
//! and as on hardware, never undefined. The block never creates a Rust reference to the
//! source or the destination.

/// Copies `len` bytes from `src` to `dst` when this CPU has a fast copy for that length;
/// returns false, having touched nothing, when it has not (the caller copies with atomics).
///
/// # Safety
/// `src` is valid for `len` reads and `dst` for `len` writes, and the two do not overlap.
/// Other threads or processes may access either range meanwhile (see the module docs).
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: forwarded from the caller.
        unsafe { x86::copy(dst, src, len) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src, len);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// Shortest copy done with vector moves (AVX2).
    const VECTOR_MIN: usize = 256;
    /// Longest copy done with vector moves; `rep movsb` above.
    const VECTOR_MAX: usize = 32 << 10;
    /// Shortest copy done with `rep movsb` when the CPU has no AVX2.
    const STRING_MIN: usize = 4096;

    /// See [`super::copy`].
    #[inline]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
        if len > VECTOR_MAX {
            // SAFETY: forwarded from the caller.
            unsafe { string(dst, src, len) };
            return true;
        }
        if len >= VECTOR_MIN && std::is_x86_feature_detected!("avx2") {
            // SAFETY: forwarded from the caller; AVX2 is present; len >= 128.
            unsafe { vector(dst, src, len) };
            return true;
        }
        if len >= STRING_MIN {
            // SAFETY: forwarded from the caller.
            unsafe { string(dst, src, len) };
            return true;
        }
        false
    }

    /// `rep movsb`.
    unsafe fn string(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller's ranges; the direction flag is clear on entry to asm!.
        unsafe {
            asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rdi") dst => _,
                inout("rsi") src => _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// 128 bytes per step, then the last 128 bytes again for what is left (`len >= 128`).
    #[target_feature(enable = "avx2")]
    unsafe fn vector(dst: *mut u8, src: *const u8, len: usize) {
        debug_assert!(len >= 128);
        let mut at = 0;
        while at + 128 <= len {
            // SAFETY: `[at, at + 128)` lies inside both ranges.
            unsafe { block(dst.add(at), src.add(at)) };
            at += 128;
        }
        if at < len {
            // SAFETY: len >= 128, so `[len - 128, len)` lies inside both ranges.
            unsafe { block(dst.add(len - 128), src.add(len - 128)) };
        }
        // SAFETY: clears the upper halves of the vector registers, all caller-saved.
        unsafe {
            asm!(
                "vzeroupper",
                clobber_abi("C"),
                options(nostack, nomem, preserves_flags)
            )
        };
    }

    /// Copies 128 bytes with four 32-byte loads and stores.
    #[target_feature(enable = "avx2")]
    unsafe fn block(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's 128 bytes at each pointer.
        unsafe {
            asm!(
                "vmovdqu {a}, [{s}]",
                "vmovdqu {b}, [{s} + 32]",
                "vmovdqu {c}, [{s} + 64]",
                "vmovdqu {d}, [{s} + 96]",
                "vmovdqu [{t}], {a}",
                "vmovdqu [{t} + 32], {b}",
                "vmovdqu [{t} + 64], {c}",
                "vmovdqu [{t} + 96], {d}",
                s = in(reg) src,
                t = in(reg) dst,
                a = out(ymm_reg) _,
                b = out(ymm_reg) _,
                c = out(ymm_reg) _,
                d = out(ymm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_copies_move_exactly_their_bytes_at_every_alignment() {
        let lens = [
            0,
            1,
            127,
            255,
            256,
            257,
            1000,
            4095,
            4096,
            4097,
            32 << 10,
            (32 << 10) + 1,
        ];
        let src: Vec<u8> = (0..(40 << 10)).map(|i| (i * 7 + 3) as u8).collect();
        for &len in &lens {
            for (s_off, d_off) in [(0, 0), (1, 0), (0, 3), (5, 9)] {
                let mut dst = vec![0xeeu8; len + 32];
                // SAFETY: both ranges inside their vectors, distinct allocations.
                let done =
                    unsafe { copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(s_off), len) };
                if !done {
                    assert!(
                        dst.iter().all(|&b| b == 0xee),
                        "refused, yet written: {len}"
                    );
                    assert!(len < 4096, "a long copy ({len}) refused");
                    continue;
                }
                assert_eq!(
                    &dst[d_off..d_off + len],
                    &src[s_off..s_off + len],
                    "len {len}"
                );
                assert!(dst[..d_off].iter().all(|&b| b == 0xee), "before, len {len}");
                assert!(
                    dst[d_off + len..].iter().all(|&b| b == 0xee),
                    "after, len {len}"
                );
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_long_copy_takes_the_fast_path_and_short_ones_never_do() {
        let src = vec![1u8; 64 << 10];
        let mut dst = vec![0u8; 64 << 10];
        // SAFETY: inside both vectors.
        let fast = |n: usize, d: &mut Vec<u8>| unsafe { copy(d.as_mut_ptr(), src.as_ptr(), n) };
        assert!(fast(4096, &mut dst) && fast(64 << 10, &mut dst));
        assert!(!fast(64, &mut dst) && !fast(0, &mut dst));
    }
}
