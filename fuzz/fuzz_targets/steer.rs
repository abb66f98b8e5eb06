//! The reuseport steering program (classic BPF, run by the kernel) against `steer::dest`,
//! the same rules in Rust: for any group table and any datagram, the program picks the
//! member `dest` names, or "nobody" (the kernel's hash) when `dest` names no member.
//!
//! Input: byte 0 = number of member slots (`n`), `n` slot bytes (0 and repeats dropped),
//! byte = number of services (`m`, at most 16), `m` × (8-byte service id, 1-byte member
//! index), then the datagram (a RoCEv2 UDP payload).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_soft::io::steer::{dest, program, run, Dest, Table};

const NONE: u32 = u32::MAX;

fuzz_target!(|data: &[u8]| {
    let mut at = 0usize;
    let mut next = |n: usize| {
        let b = data.get(at..at + n)?;
        at += n;
        Some(b)
    };
    let Some(&[n]) = next(1) else { return };
    let Some(raw) = next(n as usize) else { return };
    let mut slots = Vec::new();
    for &s in raw {
        if s != 0 && !slots.contains(&s) {
            slots.push(s);
        }
    }
    let Some(&[m]) = next(1) else { return };
    let mut services: Vec<(u64, u32)> = Vec::new();
    for _ in 0..m.min(16) {
        let Some(b) = next(9) else { return };
        let sid = u64::from_be_bytes(b[..8].try_into().unwrap());
        if !services.iter().any(|s| s.0 == sid) {
            services.push((sid, u32::from(b[8])));
        }
    }
    let pkt = &data[at..];
    let t = Table {
        slots: slots.clone(),
        services: services.clone(),
    };
    let prog = program(&t);
    let member = |s: u8| {
        slots
            .iter()
            .position(|&x| x == s)
            .map_or(NONE, |i| i as u32)
    };
    let want = match dest(pkt) {
        Dest::Slot(s) | Dest::Comm(s) => member(s),
        Dest::Service(sid) => services.iter().find(|x| x.0 == sid).map_or(NONE, |x| x.1),
        Dest::Any => NONE,
    };
    assert_eq!(run(&prog, pkt), want, "{:?} for {t:?}", dest(pkt));
});
