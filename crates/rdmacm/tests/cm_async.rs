//! The event channel's async form as a `futures_core::Stream`.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

const T: Duration = Duration::from_secs(10);

async fn next(s: &mut rdmacm::cm::EventStream<'_>, kind: EventType) -> rdmacm::cm::Event {
    let ev = tokio::time::timeout(T, s.next())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {kind}"))
        .expect("the stream never ends")
        .expect("event");
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
    ev
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_channel_is_a_stream() {
    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr("127.0.0.135:0".parse().unwrap()).unwrap();
    l.listen(0).unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let (mut cev, mut lev) = (ch.events(), lch.events());
    // Nothing queued: the stream is pending (no busy loop, no end).
    assert!(tokio::time::timeout(Duration::from_millis(100), lev.next())
        .await
        .is_err());
    let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let src = SocketAddr::new(addr.ip(), 0);
    tokio::task::block_in_place(|| c.resolve_addr(Some(src), addr, T)).unwrap();
    next(&mut cev, EventType::AddrResolved).await;
    c.resolve_route(T).unwrap();
    next(&mut cev, EventType::RouteResolved).await;
    c.create_qp_default().unwrap();
    c.connect(&ConnParam {
        private_data: b"via a stream".to_vec(),
        ..Default::default()
    })
    .unwrap();
    // Events arrive while the test only awaits the streams (the progress thread drives
    // the CM).
    let mut ev = next(&mut lev, EventType::ConnectRequest).await;
    assert!(ev.private_data().starts_with(b"via a stream"));
    let s = ev.take_id().unwrap();
    drop(ev);
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    // Both streams polled together.
    let (a, b) = tokio::join!(
        next(&mut cev, EventType::Established),
        next(&mut lev, EventType::Established)
    );
    drop((a, b));
    c.disconnect().unwrap();
    next(&mut lev, EventType::Disconnected).await;
    s.disconnect().unwrap();
    next(&mut cev, EventType::Disconnected).await;
}
