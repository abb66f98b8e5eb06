//! perftest's `-R` messages, as perftest (6.29, and 6.06: Debian 12's) puts them on its
//! rdma_cm communication QP: every one is a SEND of exactly the bytes of a C object, so their
//! sizes and byte order are fixed here and nowhere else. `docs/PERFTEST.md` lists the whole
//! exchange.

/// The version we announce: the perftest whose exchange this implements.
pub const VERSION: &str = "6.29";
/// `char version[MAX_VERSION]`: the version message's size.
pub const VERSION_LEN: usize = 16;
/// `sizeof(struct pingpong_dest)` from 6.29 (with `tail_markers_vaddr`).
pub const DEST_LEN: usize = 64;
/// `sizeof(struct pingpong_dest)` before 6.29 (Debian 12's perftest 4.5 announces 6.06).
pub const DEST_LEN_OLD: usize = 56;
/// The first version whose `pingpong_dest` has `tail_markers_vaddr`.
pub const TAIL_MARKERS_FROM: f64 = 6.29;

/// The size of the `pingpong_dest` a peer announcing `rem_version` sends and reads: perftest
/// does not gate it by version, so each side must match the other's build.
pub fn dest_len(rem_version: f64) -> usize {
    if rem_version >= TAIL_MARKERS_FROM {
        DEST_LEN
    } else {
        DEST_LEN_OLD
    }
}
/// `sizeof(struct perftest_parameters_negotiate)` without the mlx5dv comp mask (a build with
/// mlx5dv sends 8 more bytes, which we accept).
pub const NEGOTIATE_LEN: usize = 312;
/// `sizeof(struct ibv_device_attr)` on a 64-bit Linux host.
pub const DEVICE_ATTR_LEN: usize = 232;
/// Offset of the device attributes in the negotiate message.
const ATTR_OFF: usize = 80;
/// Offset of `max_qp_rd_atom` in `struct ibv_device_attr`.
const MAX_QP_RD_ATOM_OFF: usize = 144;
/// perftest's default port.
pub const DEF_PORT: u16 = 18515;
/// perftest's `DEF_DURATION` (sent in the negotiation even without `-D`).
pub const DEF_DURATION: u32 = 5;
/// perftest's `MAX_SIZE` (the size `-a` negotiates).
pub const MAX_SIZE: u64 = 8_388_608;

/// `VerbType` values.
pub mod verb {
    /// SEND.
    pub const SEND: u32 = 0;
    /// RDMA WRITE.
    pub const WRITE: u32 = 2;
    /// RDMA READ.
    pub const READ: u32 = 4;
}

/// The version message: the string, NUL padded to 16 bytes.
pub fn version_msg() -> [u8; VERSION_LEN] {
    let mut v = [0u8; VERSION_LEN];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    v
}

/// `atof` of a version message: its leading decimal number (0 when there is none).
pub fn parse_version(b: &[u8]) -> f64 {
    let s: String = b
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as char)
        .collect();
    let t = s.trim_start();
    let end = t
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !t[..i].contains('.'))))
        .map_or(t.len(), |(i, _)| i);
    t[..end].parse().unwrap_or(0.0)
}

/// The MTU message (`sprintf("%d", enum ibv_mtu)`): 2 bytes from 5.31 on, else 4.
pub fn mtu_msg(mtu_enum: u8, len: usize) -> Vec<u8> {
    let mut v = format!("{mtu_enum}").into_bytes();
    v.resize(len, 0);
    v
}

/// `strtol` of an MTU message.
pub fn parse_mtu(b: &[u8]) -> Option<u8> {
    let s: String = b
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .map(|&c| c as char)
        .collect();
    s.parse().ok()
}

/// `struct pingpong_dest` (each field `htobe32`/`htobe64`, the GID as bytes; the 4 bytes
/// after `rkey` are the C struct's padding, zero from us and ignored from the peer). Before
/// 6.29 it has no `tail_markers_vaddr` and is 56 bytes: the GID at 32, `srqn` 48,
/// `gid_index` 52.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u32,
    /// Outstanding RDMA READs.
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// PSN (unused with `-R`: the CM sets the PSNs).
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Address the peer writes to / reads from.
    pub vaddr: u64,
    /// Data validation only (0).
    pub tail_markers_vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// XRC/DC only (0).
    pub srqn: u32,
    /// GID index.
    pub gid_index: u32,
}

impl Dest {
    /// The 64 bytes on the wire.
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..40].copy_from_slice(&self.tail_markers_vaddr.to_be_bytes());
        b[40..56].copy_from_slice(&self.gid);
        b[56..60].copy_from_slice(&self.srqn.to_be_bytes());
        b[60..64].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// The bytes on the wire in the layout of `len` ([`DEST_LEN`] or [`DEST_LEN_OLD`], which
    /// has no `tail_markers_vaddr`).
    pub fn encode_len(&self, len: usize) -> Vec<u8> {
        let new = self.encode();
        if len != DEST_LEN_OLD {
            return new.to_vec();
        }
        // The old layout is the new one without bytes 32..40.
        let mut b = Vec::with_capacity(DEST_LEN_OLD);
        b.extend_from_slice(&new[..32]);
        b.extend_from_slice(&new[40..]);
        b
    }

    /// Decodes 64 bytes, or 56 (the layout before 6.29: `tail_markers_vaddr` is 0).
    pub fn decode(b: &[u8]) -> Option<Dest> {
        let (tail, rest) = match b.len() {
            DEST_LEN_OLD => (None, 32),
            n if n >= DEST_LEN => (Some(32), 40),
            _ => return None,
        };
        let u = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let q = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[rest..rest + 16]);
        Some(Dest {
            lid: u(0),
            out_reads: u(4),
            qpn: u(8),
            psn: u(12),
            rkey: u(16),
            vaddr: q(24),
            tail_markers_vaddr: tail.map_or(0, q),
            gid,
            srqn: u(rest + 16),
            gid_index: u(rest + 20),
        })
    }
}

/// `struct perftest_parameters_negotiate` (ints `htonl`, `size`/`iters` big-endian 64-bit;
/// the device attributes are `ibv_query_device`'s struct as it is in memory: little-endian
/// on the hosts we run on, of which perftest reads `max_qp_rd_atom`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Negotiate {
    /// 0 RUN_REGULAR, 1 RUN_ALL (`-a`).
    pub test_method: u32,
    /// 0 RC.
    pub connection_type: u32,
    /// [`verb`].
    pub verb: u32,
    /// 0 LAT, 1 BW.
    pub tst: u32,
    /// 0 CMP_AND_SWAP (the default outside atomic tests).
    pub atomic_type: u32,
    /// 0 ITERATIONS, 1 DURATION (`-D`).
    pub test_type: u32,
    /// 1 MBS (default), 0 GBS.
    pub report_fmt: u32,
    /// Message size ([`MAX_SIZE`] with `-a`).
    pub size: u64,
    /// Iterations (0 with `-D`).
    pub iters: u64,
    /// AES-XTS (0).
    pub aes_xts: u32,
    /// QPs.
    pub num_of_qps: u32,
    /// `-D` seconds ([`DEF_DURATION`] without it).
    pub duration: u32,
    /// 1: rdma_cm communication (always with `-R`).
    pub use_rdma_cm: u32,
    /// 0.
    pub use_write_with_imm: u32,
    /// 0.
    pub no_enhanced_reorder: u32,
    /// 0.
    pub sig_offload: u32,
    /// 0.
    pub data_validation: u32,
    /// The device's `max_qp_rd_atom`.
    pub max_qp_rd_atom: u32,
    /// The device's `max_qp_init_rd_atom`.
    pub max_qp_init_rd_atom: u32,
    /// The device's `max_qp` and `max_qp_wr`, `max_sge`, `max_cq`, `max_cqe`, `max_mr`,
    /// `max_pd` (informational).
    pub caps: [u32; 7],
    /// The device's `vendor_id`.
    pub vendor_id: u32,
}

impl Negotiate {
    /// The fields perftest compares, with their names and values (`attr` is not compared:
    /// perftest only lowers its out_reads to the peer's `max_qp_rd_atom`).
    pub fn compared(&self) -> [(&'static str, u64); 17] {
        [
            ("test_method", self.test_method.into()),
            ("connection_type", self.connection_type.into()),
            ("verb", self.verb.into()),
            ("tst", self.tst.into()),
            ("atomicType", self.atomic_type.into()),
            ("test_type", self.test_type.into()),
            ("report_fmt", self.report_fmt.into()),
            ("size", self.size),
            ("iters", self.iters),
            ("aes_xts", self.aes_xts.into()),
            ("num_of_qps", self.num_of_qps.into()),
            ("duration", self.duration.into()),
            ("use_rdma_cm", self.use_rdma_cm.into()),
            ("use_write_with_imm", self.use_write_with_imm.into()),
            ("no_enhanced_reorder", self.no_enhanced_reorder.into()),
            ("sig_offload", self.sig_offload.into()),
            ("data_validation", self.data_validation.into()),
        ]
    }

    /// The first field that differs, as perftest reports it.
    pub fn mismatch(&self, remote: &Negotiate) -> Option<String> {
        self.compared()
            .iter()
            .zip(remote.compared().iter())
            .find(|(a, b)| a.1 != b.1)
            .map(|(a, b)| format!("{} mismatch: local={}, remote={}", a.0, a.1, b.1))
    }

    /// The 312 bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; NEGOTIATE_LEN];
        let ints = [
            self.test_method,
            self.connection_type,
            self.verb,
            self.tst,
            self.atomic_type,
            self.test_type,
            self.report_fmt,
        ];
        for (i, v) in ints.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
        }
        b[32..40].copy_from_slice(&self.size.to_be_bytes());
        b[40..48].copy_from_slice(&self.iters.to_be_bytes());
        let ints = [
            self.aes_xts,
            self.num_of_qps,
            self.duration,
            self.use_rdma_cm,
            self.use_write_with_imm,
            self.no_enhanced_reorder,
            self.sig_offload,
            self.data_validation,
        ];
        for (i, v) in ints.iter().enumerate() {
            b[48 + i * 4..52 + i * 4].copy_from_slice(&v.to_be_bytes());
        }
        let a = &mut b[ATTR_OFF..ATTR_OFF + DEVICE_ATTR_LEN];
        a[..8].copy_from_slice(b"rdma-sof");
        a[96..100].copy_from_slice(&self.vendor_id.to_le_bytes());
        // max_qp, max_qp_wr at 108, 112; max_sge 120; max_cq, max_cqe, max_mr, max_pd 128..144.
        let at = [108, 112, 120, 128, 132, 136, 140];
        for (o, v) in at.iter().zip(self.caps) {
            a[*o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
        a[MAX_QP_RD_ATOM_OFF..MAX_QP_RD_ATOM_OFF + 4]
            .copy_from_slice(&self.max_qp_rd_atom.to_le_bytes());
        a[156..160].copy_from_slice(&self.max_qp_init_rd_atom.to_le_bytes());
        // max_pkeys 224, phys_port_cnt 227.
        a[224..226].copy_from_slice(&1u16.to_le_bytes());
        a[227] = 1;
        b
    }

    /// Decodes 312 (or 320) bytes.
    pub fn decode(b: &[u8]) -> Option<Negotiate> {
        if b.len() < NEGOTIATE_LEN {
            return None;
        }
        let u = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let le = |o: usize| {
            let o = ATTR_OFF + o;
            u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
        };
        let q = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        Some(Negotiate {
            test_method: u(0),
            connection_type: u(4),
            verb: u(8),
            tst: u(12),
            atomic_type: u(16),
            test_type: u(20),
            report_fmt: u(24),
            size: q(32),
            iters: q(40),
            aes_xts: u(48),
            num_of_qps: u(52),
            duration: u(56),
            use_rdma_cm: u(60),
            use_write_with_imm: u(64),
            no_enhanced_reorder: u(68),
            sig_offload: u(72),
            data_validation: u(76),
            max_qp_rd_atom: le(MAX_QP_RD_ATOM_OFF),
            max_qp_init_rd_atom: le(156),
            caps: [
                le(108),
                le(112),
                le(120),
                le(128),
                le(132),
                le(136),
                le(140),
            ],
            vendor_id: le(96),
        })
    }
}

/// `struct bw_report_data` as `xchg_bw_reports` sends it: five messages of 8 bytes each,
/// big-endian (`size`, `iters`, `bw_peak`, `bw_avg`, `msgRate_avg`; MiB/s and Mpps).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Peak, MiB/s.
    pub bw_peak: f64,
    /// Average, MiB/s.
    pub bw_avg: f64,
    /// Messages per second, millions.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five messages (iters as 4 bytes for a peer older than 5.33).
    pub fn encode(&self, rem_version: f64) -> [Vec<u8>; 5] {
        let iters = if rem_version >= 5.33 {
            self.iters.to_be_bytes().to_vec()
        } else {
            (self.iters as u32).to_be_bytes().to_vec()
        };
        [
            self.size.to_be_bytes().to_vec(),
            iters,
            self.bw_peak.to_bits().to_be_bytes().to_vec(),
            self.bw_avg.to_bits().to_be_bytes().to_vec(),
            self.msg_rate.to_bits().to_be_bytes().to_vec(),
        ]
    }

    /// Decodes the five messages.
    pub fn decode(m: &[Vec<u8>]) -> Option<BwReport> {
        let q = |i: usize| -> Option<u64> {
            let b = m.get(i)?;
            match b.len() {
                8 => Some(u64::from_be_bytes(b.as_slice().try_into().ok()?)),
                4 => Some(u32::from_be_bytes(b.as_slice().try_into().ok()?).into()),
                _ => None,
            }
        };
        Some(BwReport {
            size: q(0)?,
            iters: q(1)?,
            bw_peak: f64::from_bits(q(2)?),
            bw_avg: f64::from_bits(q(3)?),
            msg_rate: f64::from_bits(q(4)?),
        })
    }
}

/// perftest's `INC(size, cache_line_size)`: the stride of successive bandwidth messages.
pub fn inc(size: usize, cache_line: usize) -> usize {
    let cl = cache_line.max(1);
    if size > cl {
        size.div_ceil(cl) * cl
    } else {
        cl
    }
}

/// perftest's `BUFF_SIZE(size, cycle_buffer)`: the bytes of the peer's buffer a QP uses.
pub fn buff_size(size: usize, cycle_buffer: usize) -> usize {
    size.max(cycle_buffer)
}

/// Offset from the peer's `vaddr` of bandwidth message `k` (perftest's
/// `increase_rem_addr`: strides of [`inc`] within the cycle buffer, one place for messages
/// above half of it).
pub fn bw_offset(k: u64, size: usize, cycle_buffer: usize, cache_line: usize) -> usize {
    if size > cycle_buffer / 2 {
        return 0;
    }
    let step = inc(size, cache_line);
    let slots = (cycle_buffer / step).max(1) as u64;
    (k % slots) as usize * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x12,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x7f00_0000_1000,
            tail_markers_vaddr: 0,
            gid: [1; 16],
            srqn: 0,
            gid_index: 3,
        };
        let e = d.encode();
        assert_eq!(&e[8..12], &[0, 0, 0, 0x12]);
        assert_eq!(&e[16..24], &[0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0]);
        assert_eq!(&e[24..32], &0x7f00_0000_1000u64.to_be_bytes());
        assert_eq!(Dest::decode(&e), Some(d));
        // perftest 6.06 (Debian 12): 56 bytes, the GID right after vaddr.
        let o = d.encode_len(dest_len(6.06));
        assert_eq!(o.len(), 56);
        assert_eq!(&o[24..32], &0x7f00_0000_1000u64.to_be_bytes());
        assert_eq!(&o[32..48], &[1; 16]);
        assert_eq!(&o[52..56], &[0, 0, 0, 3]);
        assert_eq!(Dest::decode(&o), Some(d));
        assert_eq!(d.encode_len(dest_len(6.29)), e.to_vec());
        let n = Negotiate {
            verb: verb::READ,
            tst: 1,
            report_fmt: 1,
            size: 65536,
            iters: 5000,
            num_of_qps: 2,
            duration: 5,
            use_rdma_cm: 1,
            max_qp_rd_atom: 16,
            ..Default::default()
        };
        let e = n.encode();
        assert_eq!(e.len(), 312);
        assert_eq!(&e[8..12], &[0, 0, 0, 4]);
        assert_eq!(&e[32..40], &65536u64.to_be_bytes());
        assert_eq!(&e[224..228], &16u32.to_le_bytes());
        assert_eq!(Negotiate::decode(&e).unwrap().compared(), n.compared());
        assert!(n.mismatch(&n).is_none());
        let mut m = n.clone();
        m.iters = 7;
        assert_eq!(
            n.mismatch(&m).unwrap(),
            "iters mismatch: local=5000, remote=7"
        );
        assert_eq!(parse_version(&version_msg()), 6.29);
        assert_eq!(parse_version(b"5.70-beta\0"), 5.70);
        assert_eq!(mtu_msg(5, 2), b"5\0");
        assert_eq!(parse_mtu(b"3\0\0\0"), Some(3));
        assert_eq!(bw_offset(0, 64, 4096, 64), 0);
        assert_eq!(bw_offset(65, 64, 4096, 64), 64);
        assert_eq!(bw_offset(3, 100, 4096, 64), 384);
        assert_eq!(bw_offset(3, 65536, 4096, 64), 0);
        let r = BwReport {
            size: 4096,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.5,
        };
        assert_eq!(BwReport::decode(&r.encode(6.29)), Some(r));
    }
}
