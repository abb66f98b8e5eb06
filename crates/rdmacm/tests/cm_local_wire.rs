//! Same-host connections take the host-local wire (shared-memory rings, `rdma_soft::io::local`)
//! instead of UDP; what stays on UDP (the CM's MADs) still does. Between processes:
//! `crates/tools/tests/share_procs.rs`; with the wire turned off (`SoftConfig::host_local`,
//! `RDMA_SOFT_LOCAL_WIRE=off`): every connection stays on UDP, what the benchmarks of the
//! RoCEv2 path and the lossy suites rely on.

use rdmacm::{Buf, RemoteBuf};

mod support_async;

use rdmacm::cm::CmaConfig;
use support_async::{pair, pair_with, within};

fn pattern(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ seq.wrapping_mul(2654435761)) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_connection_moves_its_data_through_shared_memory() {
    let (c, s) = pair("127.0.62.1").await;
    let dev = c.device().unwrap();
    let me = dev.host_local().expect("the device has a host-local wire");
    // one device for both ends (one process, one context): each QP sends to it
    assert_eq!(c.qp().host_peer(), Some(me));
    assert_eq!(s.qp().host_peer(), Some(me));
    let before = dev.wire_stats();
    // messages both ways, every byte checked
    for i in 0..200u32 {
        let m = pattern(i, 1 + (i as usize * 997) % 20_000);
        within("send", c.send(&m)).await.unwrap();
        let got = within("recv", s.recv()).await.unwrap();
        assert!(got == m, "message {i} differs");
        within("echo", s.send(&got)).await.unwrap();
        assert!(within("echo back", c.recv()).await.unwrap() == m);
    }
    // 1 MiB WRITE and READ
    const MIB: usize = 1 << 20;
    let mr = s.register_remote(MIB).unwrap();
    s.send(&RemoteBuf::of(&mr).to_bytes()).await.unwrap();
    let remote = RemoteBuf::from_bytes(&within("rkey", c.recv()).await.unwrap()).unwrap();
    let data = pattern(7, MIB);
    let (r, _) = within("write", c.write_buf(&remote, Buf::from(data.clone()))).await;
    r.unwrap();
    assert!(mr.to_vec() == data, "server memory differs after the WRITE");
    let pulls = |q: &rdmacm::Connection| q.qp().transport_stats().unwrap();
    assert_eq!(
        pulls(&c).pulls_sent,
        0,
        "the application's buffer goes with its data"
    );
    // from a region the device allocated: the server copies it from the client's memory
    let src = c.register_remote(MIB).unwrap();
    let data2 = pattern(8, MIB);
    src.write(0, &data2).unwrap();
    let (r, src) = within("write_from", c.write_from(&remote, src, 0, MIB)).await;
    r.unwrap();
    assert!(
        mr.to_vec() == data2,
        "server memory differs after the pulled WRITE"
    );
    assert_eq!(pulls(&c).pulls_sent, 1);
    assert_eq!((pulls(&s).pulls_done, pulls(&s).pull_failures), (1, 0));
    // a part of the region, to the middle of the target
    let (r, _src) = within(
        "write_from part",
        c.write_from(&remote.slice(4096, 40_000).unwrap(), src, 100, 40_000),
    )
    .await;
    r.unwrap();
    let got = mr.to_vec();
    assert!(got[4096..44_096] == data2[100..40_100]);
    assert!(got[..4096] == data2[..4096] && got[44_096..] == data2[44_096..]);
    assert_eq!(pulls(&s).pulls_done, 2);
    // bad arguments fail before anything is posted, and the region comes back
    let einval = |r: rdmacm::Result<()>| matches!(r, Err(rdmacm::Error::InvalidArgument(_)));
    let src = c.register_remote(4096).unwrap();
    let (r, src) = c.write_from(&remote, src, 4000, 200).await;
    assert!(einval(r), "a range past the region");
    let (r, _src) = c
        .write_from(&remote.slice(0, 10).unwrap(), src, 0, 20)
        .await;
    assert!(einval(r), "longer than the remote buffer");
    let foreign = s.register_remote(4096).unwrap();
    let (r, _) = c.write_from(&remote, foreign, 0, 10).await;
    assert!(einval(r), "a region of the other connection's PD");
    let (r, back) = within("read", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    assert!(back[..] == got[..], "READ differs from the server's memory");
    // the READ of the server's region: answered with where its data is, copied once here
    assert_eq!(pulls(&s).pulls_sent, 1);
    assert_eq!((pulls(&c).pulls_done, pulls(&c).pull_failures), (1, 0));
    let after = dev.wire_stats();
    let local = after.local.sent - before.local.sent;
    // 400 messages (some of several packets), their ACKs, 512 WRITE and READ packets
    assert!(local > 1000, "{local} packets through the rings");
    assert_eq!(after.local.received - before.local.received, local);
    assert_eq!(
        after.local.ring_full + after.local.dead + after.local.malformed,
        0
    );
    // nothing of the data path went through UDP, and no socket was connected for it
    assert_eq!(after.sent - before.sent, 0, "UDP datagrams sent");
    assert_eq!(
        after.peer_sockets, 0,
        "a host-local QP has no connected UDP socket"
    );
    within("disconnect", c.disconnect()).await.unwrap();
}

/// Over the rings, the remote checks are the transport's as over UDP: a WRITE past the end
/// of the region fails with a remote access error and writes nothing (inside the region or
/// beside it); a READ with a wrong rkey leaves the reader's buffer as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_accesses_touch_no_memory_on_either_side() {
    use rdmacm::verbs::WcStatus;
    use rdmacm::{CloseReason, Error};
    let refused = |r: rdmacm::Result<()>| match r {
        Err(Error::Closed(CloseReason::Failed(WcStatus::RemAccessErr))) => {}
        other => panic!("not a remote access error: {other:?}"),
    };
    let (c, s) = pair("127.0.62.3").await;
    assert!(c.qp().host_peer().is_some());
    // the region sits between two others, all with a pattern
    let before = s.register_remote(4096).unwrap();
    let mr = s.register_remote(4096).unwrap();
    let after = s.register_remote(4096).unwrap();
    for (k, m) in [&before, &mr, &after].into_iter().enumerate() {
        m.write(0, &vec![0x10 + k as u8; 4096]).unwrap();
    }
    let mut past_end = RemoteBuf::of(&mr);
    past_end.addr += 4000;
    past_end.len = 4096; // the peer's claim; the region has 96 bytes there
    refused(within("write past the end", c.write(&past_end, &[0xee; 4096])).await);
    for (k, m) in [&before, &mr, &after].into_iter().enumerate() {
        assert!(
            m.to_vec().iter().all(|&b| b == 0x10 + k as u8),
            "region {k} changed"
        );
    }
    // a pulled WRITE (64 KiB) past the end: refused before any copy
    let (c, s) = pair("127.0.62.5").await;
    let before = s.register_remote(64 << 10).unwrap();
    let mr = s.register_remote(64 << 10).unwrap();
    let after = s.register_remote(64 << 10).unwrap();
    for (k, m) in [&before, &mr, &after].into_iter().enumerate() {
        m.write(0, &vec![0x20 + k as u8; 64 << 10]).unwrap();
    }
    let mut past_end = RemoteBuf::of(&mr);
    past_end.addr += 4000;
    let src = c.register_remote(64 << 10).unwrap();
    src.write(0, &[0xee; 64 << 10]).unwrap();
    let (r, src) = within(
        "pulled write past the end",
        c.write_from(&past_end, src, 0, 64 << 10),
    )
    .await;
    refused(r);
    for (k, m) in [&before, &mr, &after].into_iter().enumerate() {
        assert!(
            m.to_vec().iter().all(|&b| b == 0x20 + k as u8),
            "region {k} changed"
        );
    }
    assert!(
        src.to_vec().iter().all(|&b| b == 0xee),
        "the writer's region changed"
    );
    assert_eq!(c.qp().transport_stats().unwrap().pulls_sent, 1);
    let stats = s.qp().transport_stats().unwrap();
    assert_eq!(stats.pulls_done, 0, "refused before the copy");
    // a second pair: READ with a wrong rkey
    let (c, s) = pair("127.0.62.4").await;
    let mr = s.register_remote(4096).unwrap();
    mr.write(0, &[0x77; 4096]).unwrap();
    let mut bad = RemoteBuf::of(&mr);
    bad.rkey ^= 0x0101_0000;
    let mut buf = vec![0x33u8; 4096];
    refused(within("read with a bad rkey", c.read(&bad, &mut buf)).await);
    assert!(
        buf.iter().all(|&b| b == 0x33),
        "the reader's buffer changed"
    );
    assert!(mr.to_vec().iter().all(|&b| b == 0x77));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_local_wire_off_a_loopback_connection_stays_on_udp() {
    let cfg = CmaConfig::from_env().unwrap();
    let soft = cfg
        .soft
        .clone()
        .into_builder()
        .host_local(false)
        .build()
        .unwrap();
    let (c, s) = pair_with("127.0.62.2", cfg.into_builder().soft(soft).build()).await;
    let dev = c.device().unwrap();
    assert_eq!(dev.host_local(), None);
    assert_eq!((c.qp().host_peer(), s.qp().host_peer()), (None, None));
    let before = dev.wire_stats().sent;
    for i in 0..50u8 {
        within("send", c.send(&[i; 3000])).await.unwrap();
        assert_eq!(within("recv", s.recv()).await.unwrap(), vec![i; 3000]);
    }
    let after = dev.wire_stats();
    assert!(after.sent - before >= 50, "the data went through UDP");
    assert_eq!(after.local.sent, 0);
    // IPv4: no socket connected to the peer (see rdma-soft's io/peers.rs)
    assert_eq!(
        (after.peer_sockets, after.sent_connected),
        (0, 0),
        "{after:?}"
    );
}

/// `UdpConfig::local_pull` off (`RDMA_SOFT_LOCAL_PULL=off`) in one context's configuration:
/// its connections stay on the rings, and a WRITE from a region its device allocated goes
/// with its data instead of being pulled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pulls_off_a_write_from_an_allocated_region_carries_its_data() {
    let cfg = CmaConfig::from_env().unwrap();
    let soft = cfg
        .soft
        .clone()
        .into_builder()
        .local_pull(None)
        .build()
        .unwrap();
    let (c, s) = pair_with("127.0.62.3", cfg.into_builder().soft(soft).build()).await;
    assert!(c.qp().host_peer().is_some(), "still on the host-local wire");
    const MIB: usize = 1 << 20;
    let mr = s.register_remote(MIB).unwrap();
    s.send(&RemoteBuf::of(&mr).to_bytes()).await.unwrap();
    let remote = RemoteBuf::from_bytes(&within("rkey", c.recv()).await.unwrap()).unwrap();
    let src = c.register_remote(MIB).unwrap();
    let data = pattern(9, MIB);
    src.write(0, &data).unwrap();
    let (r, _src) = within("write_from", c.write_from(&remote, src, 0, MIB)).await;
    r.unwrap();
    assert!(mr.to_vec() == data, "server memory differs after the WRITE");
    let t = c.qp().transport_stats().unwrap();
    assert_eq!(t.pulls_sent, 0, "{t:?}");
    assert!(c.device().unwrap().wire_stats().local.sent > 0);
}
