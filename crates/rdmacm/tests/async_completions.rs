//! `CompletionStream` for applications that post their own work requests on a `CmId`'s
//! QP: completions arrive through the completion channel and tokio, in order, with their
//! statuses.
//!
//! On 127.0.61.40.

use std::time::Duration;

use futures::StreamExt;
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};
use rdmacm::verbs::{AccessFlags, QpInitAttr, RecvWr, SendOp, SendWr, WcOpcode};
use rdmacm::CompletionStream;

mod support_async;
use support_async::*;

async fn expect(ch: &EventChannel, kind: EventType) -> rdmacm::cm::Event {
    let ev = within("event", ch.next_event()).await.unwrap();
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
    ev
}

/// Both sides use plain ids with their own CQ (with a channel) and QP; the client posts
/// N SENDs, the server's stream yields N receive completions with the right lengths and
/// bytes, the client's stream N send completions in posting order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_of_own_work_requests_as_a_stream() {
    const N: u64 = 100; // within the default 128 WRs per queue
    let cma = Cma::new().unwrap();
    let sch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&sch, PortSpace::Tcp).unwrap();
    l.bind_addr("127.0.61.40:0".parse().unwrap()).unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap();

    let cch = EventChannel::with_cma(&cma).unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    c.bind_addr("127.0.61.40:0".parse().unwrap()).unwrap();
    c.resolve_addr(None, addr, Duration::from_secs(2)).unwrap();
    expect(&cch, EventType::AddrResolved).await;
    c.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&cch, EventType::RouteResolved).await;
    let dev = c.device().unwrap();
    let (cpd, ccc) = (dev.alloc_pd().unwrap(), dev.create_comp_channel().unwrap());
    let ccq = dev.create_cq(1024, Some(&ccc)).unwrap();
    let cqp = c.create_qp(&cpd, &QpInitAttr::rc(&ccq, &ccq)).unwrap();
    let mut csend = CompletionStream::new(ccq, ccc).unwrap();
    c.connect(&ConnParam::default()).unwrap();

    let mut req = expect(&sch, EventType::ConnectRequest).await;
    let s = req.take_id().unwrap();
    drop(req);
    let dev = s.device().unwrap();
    let (spd, scc) = (dev.alloc_pd().unwrap(), dev.create_comp_channel().unwrap());
    let scq = dev.create_cq(1024, Some(&scc)).unwrap();
    let sqp = s.create_qp(&spd, &QpInitAttr::rc(&scq, &scq)).unwrap();
    let smr = spd
        .register(vec![0u8; N as usize * 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    for i in 0..N {
        let sge = smr.sge(i as usize * 64, 64).unwrap();
        sqp.post_recv(&RecvWr::new(1000 + i).with_sge(sge)).unwrap();
    }
    let mut srecv = CompletionStream::new(scq, scc).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventType::Established).await;
    expect(&sch, EventType::Established).await;

    let cmr = cpd
        .register(vec![0u8; N as usize * 64], AccessFlags::LOCAL_WRITE)
        .unwrap();
    for i in 0..N {
        let len = 1 + (i as usize % 64);
        let msg: Vec<u8> = (0..len).map(|b| (b as u64 + i) as u8).collect();
        cmr.write(i as usize * 64, &msg).unwrap();
        let wr = SendWr::new(i, SendOp::Send)
            .with_sge(cmr.sge(i as usize * 64, len as u32).unwrap())
            .signaled();
        cqp.post_send(&wr).unwrap();
    }
    let mut got = 0;
    while got < N {
        let wc = within("recv completion", srecv.next()).await.unwrap();
        assert!(wc.status.is_success(), "{}", wc.status);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        let i = wc.wr_id - 1000;
        assert_eq!(i, got, "receive completions in order");
        let len = 1 + (i as usize % 64);
        assert_eq!(wc.byte_len as usize, len);
        let mut b = vec![0u8; len];
        smr.read(i as usize * 64, &mut b).unwrap();
        assert!(b
            .iter()
            .enumerate()
            .all(|(k, &x)| x == (k as u64 + i) as u8));
        got += 1;
    }
    let mut batch = Vec::new();
    while (batch.len() as u64) < N {
        within("send completions", csend.next_batch(&mut batch, 64)).await;
    }
    let ids: Vec<u64> = batch.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>());
    assert!(batch.iter().all(|c| c.status.is_success()));
    // DREQ; the server answers with its own rdma_disconnect (the DREP), as with rdma_cm.
    c.disconnect().unwrap();
    expect(&sch, EventType::Disconnected).await;
    s.disconnect().unwrap();
    expect(&cch, EventType::Disconnected).await;
}
