//! `rdma_destroy_id` with events of the id still queued: they never come out of the
//! channel, whether the queue is short (removed at once) or long (left in place and
//! dropped when reached, so that destroying each of many ids is not a scan of the queue
//! each time); the other ids' events all do, once each.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{CmId, Cma, EventChannel, EventType, PortSpace};

const T: Duration = Duration::from_secs(5);

fn check(ids: usize, addr: &str) {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let dst: SocketAddr = format!("{addr}:7471").parse().unwrap();
    let src = SocketAddr::new(dst.ip(), 0);
    let mut all: Vec<CmId> = (0..ids)
        .map(|_| {
            let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
            id.resolve_addr(Some(src), dst, T).unwrap();
            id
        })
        .collect();
    // every other id is destroyed with its ADDR_RESOLVED still queued
    let mut kept = BTreeSet::new();
    let mut k = 0;
    all.retain(|id| {
        k += 1;
        if k % 2 == 0 {
            kept.insert(id.num());
        }
        k % 2 == 0
    });
    let mut got = BTreeSet::new();
    while let Some(ev) = ch.get_event_timeout(Duration::from_millis(300)).unwrap() {
        assert_eq!(ev.kind(), EventType::AddrResolved);
        assert!(got.insert(ev.id_num()), "id {} reported twice", ev.id_num());
    }
    assert_eq!(got, kept, "exactly the live ids' events, {ids} ids");
    drop(all);
}

#[test]
fn a_short_queue_loses_the_destroyed_ids_events() {
    check(10, "127.0.93.1");
}

#[test]
fn a_long_queue_loses_the_destroyed_ids_events() {
    check(400, "127.0.93.2");
}

/// `rdma_destroy_id` of an id whose event the application still holds waits for the ack
/// (the event's drop), and returns once it comes, from another thread.
#[test]
fn destroy_waits_for_the_held_event_and_returns_at_its_ack() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let dst: SocketAddr = "127.0.93.3:7471".parse().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    let ev = ch.get_event_timeout(T).unwrap().expect("ADDR_RESOLVED");
    assert_eq!(ev.kind(), EventType::AddrResolved);
    let acked = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let a = acked.clone();
    let destroyer = std::thread::spawn(move || {
        drop(id);
        done_tx.send(a.load(Ordering::SeqCst)).unwrap();
    });
    // the destroy waits while the event is held
    assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err());
    acked.store(true, Ordering::SeqCst);
    drop(ev);
    let saw_ack = done_rx
        .recv_timeout(T)
        .expect("destroy did not return after the ack");
    assert!(saw_ack, "destroy returned before the event was acked");
    destroyer.join().unwrap();
}
