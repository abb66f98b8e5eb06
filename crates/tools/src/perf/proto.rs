//! What the two sides exchange in the CM private data (little-endian, fixed layout) and the
//! immediates of the phase handshake.

use std::time::Duration;

use super::{Params, Test};

const MAGIC: [u8; 4] = *b"RPf1";

/// Immediate of the server's "ready for phase N" SEND.
pub const IMM_READY: u32 = 0x5EAD_0000;
/// Immediate of the client's "phase N done" SEND.
pub const IMM_END: u32 = 0xE0D0_0000;

/// A buffer the peer may access: address, rkey, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Remote {
    /// Virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u32,
}

/// The client's request: its parameters, which connection this is, and its buffer
/// (49 bytes: fits the 56 of a REQ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Test code ([`Test::code`]).
    pub test: u8,
    /// Index of this connection among `qps`.
    pub qp_index: u8,
    /// Connections of the test.
    pub qps: u8,
    /// `-a`.
    pub all: bool,
    /// Message size.
    pub size: u32,
    /// Iterations (0 with a duration).
    pub iters: u64,
    /// Duration in seconds (0: iterations).
    pub duration: u32,
    /// Work requests in flight.
    pub tx_depth: u16,
    /// The client's data region.
    pub region: Remote,
}

impl Hello {
    /// The request of connection `qp_index` for `p`.
    pub fn new(p: &Params, qp_index: u8, region: Remote) -> Hello {
        Hello {
            test: p.test.code(),
            qp_index,
            qps: p.qps as u8,
            all: p.all,
            size: p.size as u32,
            iters: p.iters,
            duration: p.duration.map_or(0, |d| d.as_secs() as u32),
            tx_depth: p.tx_depth as u16,
            region,
        }
    }

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(49);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&[self.test, self.qp_index, self.qps, u8::from(self.all)]);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.iters.to_le_bytes());
        v.extend_from_slice(&self.duration.to_le_bytes());
        v.extend_from_slice(&self.tx_depth.to_le_bytes());
        v.extend_from_slice(&self.region.addr.to_le_bytes());
        v.extend_from_slice(&self.region.rkey.to_le_bytes());
        v.extend_from_slice(&self.region.len.to_le_bytes());
        v
    }

    /// Decodes; `None` for anything that is not a well-formed request.
    pub fn decode(b: &[u8]) -> Option<Hello> {
        let mut r = Reader(b);
        if r.take(4)? != MAGIC {
            return None;
        }
        let h = r.take(4)?;
        let (test, qp_index, qps, all) = (h[0], h[1], h[2], h[3] != 0);
        Test::from_code(test)?;
        let hello = Hello {
            test,
            qp_index,
            qps,
            all,
            size: r.u32()?,
            iters: r.u64()?,
            duration: r.u32()?,
            tx_depth: r.u16()?,
            region: Remote {
                addr: r.u64()?,
                rkey: r.u32()?,
                len: r.u32()?,
            },
        };
        (qps > 0 && qp_index < qps && hello.size > 0 && hello.tx_depth > 0).then_some(hello)
    }

    /// The server's view of the parameters: the client's, on the server's port and bind.
    pub fn params(&self, server: &Params) -> Option<Params> {
        Some(Params {
            test: Test::from_code(self.test)?,
            size: self.size as usize,
            all: self.all,
            iters: self.iters.max(1),
            duration: (self.duration > 0).then(|| Duration::from_secs(self.duration.into())),
            qps: self.qps.into(),
            tx_depth: self.tx_depth.into(),
            cq_mod: server.cq_mod,
            port: server.port,
            bind: server.bind,
            server: None,
        })
    }
}

/// Encodes the server's answer: its data region.
pub fn encode_remote(r: &Remote) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&r.addr.to_le_bytes());
    v.extend_from_slice(&r.rkey.to_le_bytes());
    v.extend_from_slice(&r.len.to_le_bytes());
    v
}

/// Decodes the server's answer.
pub fn decode_remote(b: &[u8]) -> Option<Remote> {
    let mut r = Reader(b);
    if r.take(4)? != MAGIC {
        return None;
    }
    Some(Remote {
        addr: r.u64()?,
        rkey: r.u32()?,
        len: r.u32()?,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let h = Hello {
            test: 3,
            qp_index: 1,
            qps: 2,
            all: true,
            size: 65536,
            iters: 5000,
            duration: 0,
            tx_depth: 128,
            region: Remote {
                addr: 0x1000,
                rkey: 7,
                len: 1 << 20,
            },
        };
        let mut e = h.encode();
        assert!(e.len() <= 56);
        e.resize(56, 0);
        assert_eq!(Hello::decode(&e), Some(h));
        assert_eq!(Hello::decode(&e[..20]), None);
        assert_eq!(Hello::decode(&[0; 56]), None);
        let r = Remote {
            addr: 1,
            rkey: 2,
            len: 3,
        };
        assert_eq!(decode_remote(&encode_remote(&r)), Some(r));
        assert_eq!(decode_remote(b"xx"), None);
    }
}
