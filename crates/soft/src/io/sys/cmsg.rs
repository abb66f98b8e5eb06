//! Control messages (`cmsg(3)`) of a received datagram, read out of their buffer as bytes:
//! no pointer walk, so no unsafe code. Headers and data are laid out as the kernel writes
//! them (`cmsg_len` a `size_t`, each message aligned to a `long`).

use std::mem::{offset_of, size_of};

/// Alignment of each control message (the kernel's `CMSG_ALIGN`: a `long`).
const ALIGN: usize = size_of::<usize>();
/// A control message's header (`CMSG_LEN(0)`).
const HDR: usize = size_of::<libc::cmsghdr>();

const fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// Space for the control messages of one datagram, aligned as `msg_control` must be.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(crate) struct CmsgBuf<const N: usize>([u8; N]);

impl<const N: usize> CmsgBuf<N> {
    /// Its size, for `msg_controllen`.
    pub const LEN: usize = N;

    /// A zeroed buffer.
    pub const fn new() -> Self {
        CmsgBuf([0; N])
    }

    /// For `msg_control`.
    pub fn as_mut_ptr(&mut self) -> *mut libc::c_void {
        self.0.as_mut_ptr().cast()
    }

    /// Writes the control messages `msgs` (level, type, data) as the kernel lays them out,
    /// from the start; returns the bytes used (`msg_controllen`: the sum of their
    /// `CMSG_SPACE`). Messages that do not fit are left out.
    pub fn fill(&mut self, msgs: &[(i32, i32, &[u8])]) -> usize {
        let mut at = 0;
        for &(level, kind, data) in msgs {
            let len = HDR + data.len();
            if align(at + len) > N {
                break;
            }
            let b = &mut self.0;
            b[at..at + size_of::<usize>()].copy_from_slice(&len.to_ne_bytes());
            let l = at + offset_of!(libc::cmsghdr, cmsg_level);
            b[l..l + 4].copy_from_slice(&level.to_ne_bytes());
            let t = at + offset_of!(libc::cmsghdr, cmsg_type);
            b[t..t + 4].copy_from_slice(&kind.to_ne_bytes());
            b[at + HDR..at + len].copy_from_slice(data);
            b[at + len..align(at + len)].fill(0);
            at = align(at + len);
        }
        at
    }

    /// The messages in the first `used` bytes (`msg_controllen` after the call: a `size_t`
    /// with glibc, a `socklen_t` with musl).
    pub fn messages<L: TryInto<usize>>(&self, used: L) -> Messages<'_> {
        let used = used.try_into().unwrap_or(0);
        Messages {
            rest: &self.0[..used.min(N)],
        }
    }
}

/// One control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cmsg<'a> {
    /// `cmsg_level` (`IPPROTO_IP`, `SOL_UDP`, ...).
    pub level: i32,
    /// `cmsg_type` (`IP_PKTINFO`, `UDP_GRO`, ...).
    pub kind: i32,
    /// Its data, as long as its header says and the buffer holds.
    pub data: &'a [u8],
}

impl Cmsg<'_> {
    /// The data as a native-endian `i32` (one byte, as `IP_TOS` comes, widened).
    pub fn int(&self) -> Option<i32> {
        match self.data {
            [a, b, c, d, ..] => Some(i32::from_ne_bytes([*a, *b, *c, *d])),
            [a, ..] => Some(i32::from(*a)),
            [] => None,
        }
    }

    /// The native-endian `u32` at byte `at` of the data.
    pub fn u32_at(&self, at: usize) -> Option<u32> {
        let b = self.data.get(at..at + 4)?;
        Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The control messages of a buffer, in order ([`CmsgBuf::messages`]); ends at the first
/// header that does not fit, as `CMSG_NXTHDR` does.
pub(crate) struct Messages<'a> {
    rest: &'a [u8],
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> Iterator for Messages<'a> {
    type Item = Cmsg<'a>;

    fn next(&mut self) -> Option<Cmsg<'a>> {
        let b = self.rest;
        if b.len() < HDR {
            return None;
        }
        let mut len = [0u8; size_of::<usize>()];
        len.copy_from_slice(&b[..size_of::<usize>()]);
        let len = usize::from_ne_bytes(len);
        if len < HDR || len > b.len() {
            self.rest = &[];
            return None;
        }
        let msg = Cmsg {
            level: i32_at(b, offset_of!(libc::cmsghdr, cmsg_level)),
            kind: i32_at(b, offset_of!(libc::cmsghdr, cmsg_type)),
            data: &b[align(HDR).min(len)..len],
        };
        self.rest = &b[align(len).min(b.len())..];
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_messages_as_written_and_stops_at_a_bad_length() {
        let mut b = CmsgBuf::<128>::new();
        let first = b.fill(&[(libc::IPPROTO_IP, libc::IP_TOS, &[0xb8])]);
        assert_eq!(first, align(HDR + 1));
        let n = b.fill(&[
            (libc::IPPROTO_IP, libc::IP_TOS, &[0xb8]),
            (libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes()),
        ]);
        // as CMSG_SPACE(1) + CMSG_SPACE(4)
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(1) + libc::CMSG_SPACE(4) } as usize;
        assert_eq!(n, space);
        let all: Vec<_> = b.messages(n).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[0].level, all[0].kind, all[0].int()),
            (libc::IPPROTO_IP, libc::IP_TOS, Some(0xb8))
        );
        assert_eq!((all[1].kind, all[1].int()), (libc::UDP_GRO, Some(1400)));
        // a message longer than the bytes used ends the walk
        assert_eq!(b.messages(first + HDR + 3).count(), 1);
        // a header claiming less than a header ends it too
        b.0[..size_of::<usize>()].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(b.messages(n).count(), 0);
        // `used` beyond the buffer is clamped
        assert_eq!(b.messages(usize::MAX).count(), 0);
    }
}
