//! Traffic class on the wire: every datagram leaves with the IPv4 TOS / IPv6 traffic class
//! it was queued with, also when datagrams of different classes share one `sendmmsg` batch
//! and would otherwise form one UDP GSO message, and when the fault injector holds them
//! back. The receiver reads the byte from the IP header (`IP_RECVTOS` / `IPV6_RECVTCLASS`);
//! the ICRC stays valid (it masks the byte). Loopback only, no root.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdma_soft::io::{Arrival, DatagramWire, FaultSpec, TxMeta, UdpConfig, UdpWire, WireAddr};

mod common;
use common::send_only as packet;

fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// Sends `classes.len()` equal-size packets from `la` to `lb` in one batch (GSO would group
/// them all), packet k with traffic class `classes[k]`; returns what `lb`'s wire (`b`, or
/// `a` itself when `b` is `None`) received: tag -> `seen` of its arrival (the traffic class
/// in the IP header, say).
fn exchange<T>(
    a: &mut UdpWire,
    mut b: Option<&mut UdpWire>,
    (la, lb): (WireAddr, WireAddr),
    classes: &[u8],
    seen: impl Fn(&Arrival) -> T,
) -> HashMap<u16, T> {
    for (k, &tclass) in classes.iter().enumerate() {
        a.send_with(
            la,
            lb,
            TxMeta {
                tclass,
                ..Default::default()
            },
            &packet(k as u16, 1040),
        )
        .unwrap();
    }
    a.flush().unwrap();
    let mut got = HashMap::new();
    let end = Instant::now() + Duration::from_secs(5);
    while got.len() < classes.len() && Instant::now() < end {
        let _ = a.flush(); // releases held datagrams (fault injection)
        let rx: &mut UdpWire = match b.as_deref_mut() {
            Some(b) => b,
            None => &mut *a,
        };
        rx.recv(&mut |arr, pkt| {
            let tag = u16::from_be_bytes([pkt[12], pkt[13]]);
            assert!(got.insert(tag, seen(arr)).is_none(), "datagram {tag} twice");
        })
        .unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

/// Runs and checks the mixed-class exchange from `la` to `lb` (one wire when they are the
/// same address).
fn mixed_batch(la: &str, lb: &str, port: u16, faults: Option<FaultSpec>) {
    let (la, lb) = (addr(la), addr(lb));
    let held = faults.is_some();
    // Raw packets to made-up QPNs: wires that do not share (a sharing one drops them).
    let cfg = UdpConfig {
        port,
        faults,
        share: false,
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    a.open(la).unwrap();
    let mut b = (la != lb).then(|| {
        let mut b = UdpWire::new(UdpConfig {
            faults: None,
            ..cfg
        })
        .unwrap();
        b.open(lb).unwrap();
        b
    });
    // Runs of one class, single datagrams between them, class 0 among non-zero ones and
    // ECN bits: every change of class must start a new message.
    let classes: Vec<u8> = [
        0x48, 0x48, 0x48, 0x00, 0x00, 0xb8, 0x48, 0x48, 0x00, 0x4a, 0x4a, 0x4a, 0x4a, 0xb8, 0x00,
        0x01, 0x48, 0xfc,
    ]
    .to_vec();
    let got = exchange(&mut a, b.as_mut(), (la, lb), &classes, |arr| arr.tclass);
    assert_eq!(got.len(), classes.len(), "all datagrams arrived");
    for (k, &want) in classes.iter().enumerate() {
        assert_eq!(
            got[&(k as u16)],
            want,
            "datagram {k}: traffic class on the wire ({la} -> {lb})"
        );
    }
    let sa = a.stats();
    let st = b.as_ref().map_or(sa, |b| b.stats());
    assert_eq!(st.icrc_errors, 0, "the ICRC masks the traffic class");
    assert_eq!(sa.send_errors, 0);
    assert_eq!(sa.sent, classes.len() as u64);
    // With GSO, a run of one class is one message whose IPv4 segments k > 0 get
    // Identification k: the receiver checks those for k when UDP GRO hands it the message
    // whole, or recovers k (it cannot see the Identification), so their count is the
    // datagrams minus the messages (the runs of equal class). Grouping across a class change
    // would show as fewer messages here (and as wrong classes above).
    let runs = 1 + classes.windows(2).filter(|w| w[0] != w[1]).count();
    // (IPv6 has no Identification: only a GRO receiver, which counts what it splits, sees
    // its segments apart.)
    let rx_gro = b.as_ref().map_or(a.gro(), |b| b.gro());
    let grouped = !held && sa.gso_refused == 0 && (la.ip().is_ipv4() || rx_gro);
    let want = if grouped { classes.len() - runs } else { 0 };
    assert_eq!(
        st.icrc_recovered_id + st.gro_coalesced,
        want as u64,
        "segments after the first of a GSO message"
    );
    assert_eq!(sa.send_calls, if held { sa.send_calls } else { 1 });
}

#[test]
fn mixed_traffic_classes_in_one_gso_batch_ipv4() {
    mixed_batch("127.0.3.1", "127.0.3.2", 47941, None);
}

#[test]
fn mixed_traffic_classes_in_one_gso_batch_ipv6() {
    mixed_batch("::1", "::1", 47942, None);
}

#[test]
fn held_datagrams_keep_their_traffic_class() {
    // every datagram is delayed by the fault injector and sent later on its own
    let spec: FaultSpec = "delay=1:1ms,seed=3".parse().unwrap();
    mixed_batch("127.0.3.3", "127.0.3.4", 47943, Some(spec.clone()));
    mixed_batch("::1", "::1", 47944, Some(spec));
}

#[test]
fn default_send_is_class_zero_and_one_message_per_gso_run() {
    let (la, lb) = (addr("127.0.3.5"), addr("127.0.3.6"));
    let cfg = UdpConfig {
        port: 47945,
        share: false, // made-up QPNs
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    let mut b = UdpWire::new(cfg).unwrap();
    a.open(la).unwrap();
    b.open(lb).unwrap();
    // equal sizes, one class: one GSO message (segments 1..7 checked for their Identification
    // by a GRO receiver, recovered by another)
    for k in 0..8u16 {
        a.send(la, lb, &packet(k, 1040)).unwrap();
    }
    a.flush().unwrap();
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while got.len() < 8 && Instant::now() < end {
        b.recv(&mut |arr, _| got.push(arr.tclass)).unwrap();
    }
    assert_eq!(got, vec![0u8; 8]);
    assert_eq!(b.stats().icrc_errors, 0);
    if a.stats().gso_refused == 0 {
        let st = b.stats();
        assert_eq!(
            st.icrc_recovered_id + st.gro_coalesced,
            7,
            "one GSO message of 8"
        );
    }
}

/// What `lb` receives of one packet with traffic class 0x48 from `la`: (traffic class, hop
/// limit) per arrival; `b` receives, or `a` itself when `None`.
fn ip_meta_of(
    a: &mut UdpWire,
    b: Option<&mut UdpWire>,
    la: WireAddr,
    lb: WireAddr,
) -> Vec<(u8, u8)> {
    let got = exchange(a, b, (la, lb), &[0x48], |arr| (arr.tclass, arr.hop_limit));
    got.into_values().collect()
}

/// `set_ip_meta(false)` stops the kernel's TOS and TTL control messages: arrivals say 0 for
/// both, on a socket open before the change and on one opened after it; on again, they
/// carry the IP header's values.
#[test]
fn ip_meta_off_and_on_ipv4() {
    let (la, lb) = (addr("127.0.3.7"), addr("127.0.3.8"));
    let cfg = UdpConfig {
        port: 47947,
        share: false,
        ..UdpConfig::default()
    };
    let mut a = UdpWire::new(cfg.clone()).unwrap();
    let mut b = UdpWire::new(cfg).unwrap();
    a.open(la).unwrap();
    b.set_ip_meta(false);
    b.open(lb).unwrap(); // opened while off
    assert_eq!(ip_meta_of(&mut a, Some(&mut b), la, lb), [(0, 0)], "off");
    b.set_ip_meta(true);
    assert_eq!(
        ip_meta_of(&mut a, Some(&mut b), la, lb),
        [(0x48, 64)],
        "on again"
    );
    b.set_ip_meta(false);
    assert_eq!(
        ip_meta_of(&mut a, Some(&mut b), la, lb),
        [(0, 0)],
        "off again"
    );
}

/// The same over IPv6 (traffic class and hop limit), one wire sending to itself on ::1;
/// the socket was open before the first change.
#[test]
fn ip_meta_off_and_on_ipv6() {
    let l = addr("::1");
    let mut a = UdpWire::new(UdpConfig {
        port: 47948,
        share: false,
        ..UdpConfig::default()
    })
    .unwrap();
    a.open(l).unwrap();
    assert_eq!(
        ip_meta_of(&mut a, None, l, l),
        [(0x48, 64)],
        "on by default"
    );
    a.set_ip_meta(false);
    assert_eq!(ip_meta_of(&mut a, None, l, l), [(0, 0)], "off");
    a.set_ip_meta(true);
    assert_eq!(ip_meta_of(&mut a, None, l, l), [(0x48, 64)], "on again");
}
