//! Steering of inbound RoCEv2 datagrams between the processes that share one address.
//!
//! Every process's socket on `ADDR:4791` is in one `SO_REUSEPORT` group; the classic-BPF
//! program built here (attached with `SO_ATTACH_REUSEPORT_CBPF`, no privilege needed) picks
//! the member from the UDP payload:
//! - a packet to QP n ≠ 1: the top byte of its 24-bit destination QPN, which is the owner's
//!   [slot](super::share) (every QPN a sharing device hands out carries its slot);
//! - a CM MAD on QP1: REQ and SIDR_REQ by service id (the listener's owner); SIDR_REP by the
//!   top byte of the request id, every other CM message by the top byte of the "remote comm
//!   id" field (our comm id: the CM agent mints them with the slot in the top byte).
//!
//! Anything else returns an index past the group, so the kernel falls back to its hash.
//! The program is a routing hint only: the receiving wire checks [`dest`] again and drops a
//! datagram that is not its own ([`super::WireStats::misdelivered`]), so no packet ever
//! reaches another process's QP, whatever the group's order. A CM message naming a slot
//! that no member of the group holds (a dead process's, a made-up one) is kept by whoever
//! the kernel's hash picks: its CM answers as Linux's does for an unknown comm id (a DREP
//! to a DREQ, a REJ to a stale REP), so the dead process's peers learn of it.

use std::os::fd::RawFd;

/// Offset of the destination QPN's top byte in the UDP payload (BTH byte 5).
const QPN_HIGH: u32 = 5;
/// BTH 12 + DETH 8: the MAD header starts here on QP1.
const MAD: u32 = 20;
/// `mgmt_class` of the MAD header.
const MGMT_CLASS: u32 = MAD + 1;
/// `attr_id` of the MAD header.
const ATTR_ID: u32 = MAD + 16;
/// First byte of the CM message (after the 24-byte MAD header).
const CM_DATA: u32 = MAD + 24;
/// The service id of REQ and SIDR_REQ (8 bytes at CM data offset 8).
const SERVICE_ID: u32 = CM_DATA + 8;
/// Shortest payload every rule can read: up to the end of the service id.
const MIN_MAD: u32 = SERVICE_ID + 8;
/// The CM management class.
const CM_CLASS: u8 = 0x07;
const ATTR_REQ: u16 = 0x0010;
const ATTR_SIDR_REQ: u16 = 0x0017;
const ATTR_SIDR_REP: u16 = 0x0018;
/// "No member": past any group, so the kernel uses its hash.
const NONE: u32 = u32::MAX;

/// Who a datagram is for, as [`dest`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// The member with this slot (a QPN's top byte).
    Slot(u8),
    /// A CM message for the comm id whose top byte is this slot. When no member of the
    /// group holds that slot, whoever gets it answers as Linux would for an unknown id.
    Comm(u8),
    /// The listener of this service id (REQ, SIDR_REQ).
    Service(u64),
    /// Anyone (a MAD of another class, a malformed packet): the receiver decides.
    Any,
}

/// Reads the owner of a RoCEv2 packet (BTH first), with the same rules as the program.
///
/// ```
/// use rdma_soft::io::steer::{dest, Dest};
/// let mut pkt = [0u8; 64];
/// pkt[5..8].copy_from_slice(&[7, 0, 0x22]); // QPN 0x070022
/// assert_eq!(dest(&pkt), Dest::Slot(7));
/// ```
pub fn dest(pkt: &[u8]) -> Dest {
    if pkt.len() < 12 {
        return Dest::Any;
    }
    let qpn = u32::from_be_bytes([0, pkt[5], pkt[6], pkt[7]]);
    if qpn != 1 {
        return Dest::Slot(pkt[QPN_HIGH as usize]);
    }
    if pkt.len() < MIN_MAD as usize || pkt[MGMT_CLASS as usize] != CM_CLASS {
        return Dest::Any;
    }
    let at = |o: u32| pkt[o as usize];
    let attr = u16::from_be_bytes([at(ATTR_ID), at(ATTR_ID + 1)]);
    match attr {
        ATTR_REQ | ATTR_SIDR_REQ => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&pkt[SERVICE_ID as usize..MIN_MAD as usize]);
            Dest::Service(u64::from_be_bytes(b))
        }
        ATTR_SIDR_REP => Dest::Comm(at(CM_DATA)),
        _ => Dest::Comm(at(CM_DATA + 4)),
    }
}

/// The group as the program sees it: members by index (their slots) and listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Slot of the socket at each group index (the kernel's join order).
    pub slots: Vec<u8>,
    /// Service ids with the group index of their listener.
    pub services: Vec<(u64, u32)>,
}

// Classic BPF opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_LEN: u16 = 0x80;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
const AND_K: u16 = 0x54;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Largest program the kernel takes (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

/// Builds the steering program for `t` (at most 255 members and 700 services).
pub fn program(t: &Table) -> Vec<libc::sock_filter> {
    let services = &t.services[..t.services.len().min(700)];
    let slots = &t.slots[..t.slots.len().min(255)];
    let mut p = vec![
        ins(LD_W_LEN, 0, 0, 0),
        ins(JGE_K, 1, 0, 12),
        ins(RET_K, 0, 0, NONE),
        ins(LD_W_ABS, 0, 0, 4),
        ins(AND_K, 0, 0, 0x00ff_ffff),
        ins(JEQ_K, 1, 0, 1),
    ];
    let to_qpn = p.len();
    p.push(ins(JA, 0, 0, 0)); // patched: to the QPN rule
                              // QP1: a CM MAD long enough for every rule, else the hash.
    p.extend([
        ins(LD_W_LEN, 0, 0, 0),
        ins(JGE_K, 1, 0, MIN_MAD),
        ins(RET_K, 0, 0, NONE),
        ins(LD_B_ABS, 0, 0, MGMT_CLASS),
        ins(JEQ_K, 1, 0, u32::from(CM_CLASS)),
        ins(RET_K, 0, 0, NONE),
        ins(LD_H_ABS, 0, 0, ATTR_ID),
        ins(JEQ_K, 6, 0, u32::from(ATTR_REQ)),
        ins(JEQ_K, 5, 0, u32::from(ATTR_SIDR_REQ)),
        ins(JEQ_K, 2, 0, u32::from(ATTR_SIDR_REP)),
        // every other CM message: our comm id is the "remote comm id"
        ins(LD_B_ABS, 0, 0, CM_DATA + 4),
        ins(JA, 0, 0, 0), // patched: to the slot table
        ins(LD_B_ABS, 0, 0, CM_DATA),
    ]);
    let other_ja = p.len() - 2;
    let to_table_2 = p.len();
    p.push(ins(JA, 0, 0, 0)); // patched: to the slot table
                              // REQ / SIDR_REQ: the service id.
    for &(sid, idx) in services {
        p.extend([
            ins(LD_W_ABS, 0, 0, SERVICE_ID),
            ins(JEQ_K, 0, 3, (sid >> 32) as u32),
            ins(LD_W_ABS, 0, 0, SERVICE_ID + 4),
            ins(JEQ_K, 0, 1, sid as u32),
            ins(RET_K, 0, 0, idx),
        ]);
    }
    p.push(ins(RET_K, 0, 0, NONE));
    let qpn_rule = p.len();
    p.push(ins(LD_B_ABS, 0, 0, QPN_HIGH));
    let table = p.len();
    for (idx, &slot) in slots.iter().enumerate() {
        p.extend([
            ins(JEQ_K, 0, 1, u32::from(slot)),
            ins(RET_K, 0, 0, idx as u32),
        ]);
    }
    p.push(ins(RET_K, 0, 0, NONE));
    p[to_qpn].k = (qpn_rule - to_qpn - 1) as u32;
    p[other_ja].k = (table - other_ja - 1) as u32;
    p[to_table_2].k = (table - to_table_2 - 1) as u32;
    debug_assert!(p.len() <= MAX_INSNS);
    p
}

/// Attaches the program for `t` to the reuseport group of `fd` (one member is enough: the
/// program belongs to the group).
#[allow(unsafe_code)]
pub(crate) fn attach(fd: RawFd, t: &Table) -> std::io::Result<()> {
    let prog = program(t);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points to `prog`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs a classic-BPF program on `pkt` with the kernel's rules for the opcodes [`program`]
/// uses (an out-of-bounds load ends the program with 0). For tests of the program.
pub fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    let load = |k: u32, n: usize| -> Option<u32> {
        let k = k as usize;
        let b = pkt.get(k..k.checked_add(n)?)?;
        Some(b.iter().fold(0u32, |acc, &x| (acc << 8) | u32::from(x)))
    };
    while let Some(i) = prog.get(pc) {
        pc += 1;
        match i.code {
            LD_W_LEN => a = pkt.len() as u32,
            LD_W_ABS | LD_H_ABS | LD_B_ABS => {
                let n = match i.code {
                    LD_W_ABS => 4,
                    LD_H_ABS => 2,
                    _ => 1,
                };
                match load(i.k, n) {
                    Some(v) => a = v,
                    None => return 0,
                }
            }
            AND_K => a &= i.k,
            JA => pc += i.k as usize,
            JEQ_K | JGE_K => {
                let hit = if i.code == JEQ_K { a == i.k } else { a >= i.k };
                pc += usize::from(if hit { i.jt } else { i.jf });
            }
            RET_K => return i.k,
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    fn mad(attr: u16, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 8 + 256 + 4];
        p[7] = 1;
        p[MGMT_CLASS as usize] = CM_CLASS;
        p[ATTR_ID as usize..ATTR_ID as usize + 2].copy_from_slice(&attr.to_be_bytes());
        f(&mut p);
        p
    }

    fn table() -> Table {
        Table {
            slots: vec![9, 3, 200],
            services: vec![(0x0106_1d2f, 1), (0x1_0111_0007, 2)],
        }
    }

    #[test]
    fn qpn_slot_picks_the_member() {
        let prog = program(&table());
        assert_eq!(run(&prog, &bth(0x09_0002)), 0);
        assert_eq!(run(&prog, &bth(0x03_ffff)), 1);
        assert_eq!(run(&prog, &bth(0xc8_0010)), 2);
        assert_eq!(run(&prog, &bth(0x04_0010)), NONE);
        assert_eq!(run(&prog, &bth(0x00_0000)), NONE);
        assert_eq!(run(&prog, &[0u8; 11]), NONE, "short: hash, never index 0");
        assert_eq!(dest(&bth(0xc8_0010)), Dest::Slot(200));
    }

    #[test]
    fn cm_messages_go_by_service_or_comm_id() {
        let prog = program(&table());
        let sid = |s: u64| move |p: &mut [u8]| p[52..60].copy_from_slice(&s.to_be_bytes());
        let req = mad(ATTR_REQ, sid(0x0106_1d2f));
        assert_eq!(run(&prog, &req), 1);
        assert_eq!(dest(&req), Dest::Service(0x0106_1d2f));
        let sidr = mad(ATTR_SIDR_REQ, sid(0x1_0111_0007));
        assert_eq!(run(&prog, &sidr), 2);
        // same low word, other high word: nobody
        assert_eq!(run(&prog, &mad(ATTR_REQ, sid(0x2_0106_1d2f))), NONE);
        assert_eq!(run(&prog, &mad(ATTR_REQ, sid(0x0106_0001))), NONE);
        // REP/RTU/DREQ...: remote comm id top byte at CM data + 4
        let rep = mad(0x0013, |p| p[48] = 200);
        assert_eq!(run(&prog, &rep), 2);
        assert_eq!(dest(&rep), Dest::Comm(200));
        let rep_local = mad(0x0013, |p| p[44] = 200);
        assert_eq!(
            run(&prog, &rep_local),
            NONE,
            "the sender's own id does not steer"
        );
        let sidr_rep = mad(ATTR_SIDR_REP, |p| p[44] = 3);
        assert_eq!(run(&prog, &sidr_rep), 1);
        assert_eq!(dest(&sidr_rep), Dest::Comm(3));
        // another class, or a MAD cut short: hash
        let other = mad(ATTR_REQ, |p| p[MGMT_CLASS as usize] = 0x01);
        assert_eq!(run(&prog, &other), NONE);
        assert_eq!(dest(&other), Dest::Any);
        assert_eq!(run(&prog, &req[..50]), NONE);
        assert_eq!(dest(&req[..50]), Dest::Any);
    }

    #[test]
    fn largest_table_fits_the_kernel_limit() {
        let t = Table {
            slots: (1..=255).collect(),
            services: (0..700)
                .map(|i| (0x0106_0000 + i, (i % 255) as u32))
                .collect(),
        };
        let prog = program(&t);
        assert!(prog.len() <= MAX_INSNS, "{}", prog.len());
        assert_eq!(run(&prog, &bth(0xff_0001)), 254);
    }
}
