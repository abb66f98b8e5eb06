//! Same-host connections take the host-local wire (shared-memory rings, `rdma_soft::io::local`)
//! instead of UDP; what stays on UDP (the CM's MADs) still does. Between processes:
//! `crates/tools/tests/share_procs.rs`; with the wire turned off: `local_wire_off.rs`.

use rdmacm::{Buf, RemoteBuf};

mod aio;

use aio::{pair, within};

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
    let (r, back) = within("read", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    assert!(back[..] == data[..], "READ differs");
    let after = dev.wire_stats();
    let local = after.local.sent - before.local.sent;
    // 400 messages (some of several packets), their ACKs, 512 WRITE and READ packets
    assert!(local > 1000, "{local} packets through the rings");
    assert_eq!(after.local.received - before.local.received, local);
    assert_eq!(
        after.local.ring_full + after.local.dead + after.local.malformed,
        0
    );
    // nothing of the data path went through UDP
    assert_eq!(after.sent - before.sent, 0, "UDP datagrams sent");
    within("disconnect", c.disconnect()).await.unwrap();
}
