//! rping's wire messages and ping data: the 16-byte buffer descriptor (`struct
//! rping_rdma_info`: be64 address, be32 rkey, be32 length) and the `rdma-ping-N: ABC...`
//! pattern.

/// Size of the descriptor (and of every SEND rping makes, "go ahead" included).
pub const DESC_LEN: usize = 16;
/// Smallest `-S`: `sizeof(stringify(INT_MAX)) + sizeof("rdma-ping-%d: ")`, as rping.
pub const MIN_SIZE: usize = 26;
/// rping's `RPING_BUFSIZE`; `-S` must be below it.
pub const BUFSIZE: usize = 64 * 1024;

/// A buffer descriptor: where the peer may READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Virtual address of the buffer.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub len: u32,
}

impl Desc {
    /// Big-endian encoding (htobe64 / htobe32 / htobe32).
    pub fn encode(&self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes the first 16 bytes.
    pub fn decode(b: &[u8; DESC_LEN]) -> Desc {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        let mut k = [0u8; 4];
        k.copy_from_slice(&b[8..12]);
        let mut l = [0u8; 4];
        l.copy_from_slice(&b[12..]);
        Desc {
            addr: u64::from_be_bytes(a),
            rkey: u32::from_be_bytes(k),
            len: u32::from_be_bytes(l),
        }
    }
}

/// Fills `buf` with ping number `ping`'s data: `rdma-ping-N: ` then letters from 'A' + N
/// (mod 58) cycling through 'A'..='z', and a NUL in the last byte.
pub fn fill_ping(buf: &mut [u8], ping: u64) {
    if buf.is_empty() {
        return;
    }
    let head = format!("rdma-ping-{ping}: ");
    // snprintf(buf, size, ...) writes at most size - 1 characters.
    let cc = head.len().min(buf.len() - 1);
    buf[..cc].copy_from_slice(&head.as_bytes()[..cc]);
    let mut c = 65 + (ping % 58) as u8;
    for b in &mut buf[cc..] {
        *b = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    let last = buf.len() - 1;
    buf[last] = 0;
}

/// The C string at the start of `buf` (up to the first NUL), lossily as text.
pub fn c_str(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_is_big_endian() {
        let d = Desc {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            len: 64,
        };
        let b = d.encode();
        assert_eq!(
            b,
            [1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0, 64]
        );
        assert_eq!(Desc::decode(&b), d);
    }

    #[test]
    fn ping_pattern_as_rping() {
        let mut b = vec![0u8; 64];
        fill_ping(&mut b, 0);
        assert_eq!(
            c_str(&b),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        fill_ping(&mut b, 1);
        assert_eq!(
            c_str(&b),
            "rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs"
        );
        fill_ping(&mut b, 58);
        assert!(c_str(&b).starts_with("rdma-ping-58: ABC"));
        let mut b = vec![0u8; 100];
        fill_ping(&mut b, 57);
        // 'z' wraps to 'A'
        assert!(c_str(&b).starts_with("rdma-ping-57: zABC"));
        assert_eq!(b[99], 0);
    }
}
