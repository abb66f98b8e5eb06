//! Logs under loss: a subscriber layer that records every event (with the spans it is in)
//! sees the transport's retransmission and ACK-timeout decisions, inside the QP's span
//! (device, QPN, peer). One test in this binary: it installs the global subscriber, since
//! the progress engine's thread retransmits too.
//!
//! Addresses: 127.0.151.1 and 127.0.151.2.

mod common;

use std::fmt::Write;
use std::sync::Mutex;

use rdma_soft::verbs::{RecvWr, SendOp, SendWr};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records `span>span: message key=value ...` per event.
struct Capture;

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut line = String::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                let _ = write!(line, "{}>", span.name());
            }
        }
        let mut f = Fields(String::new());
        event.record(&mut f);
        line.push_str(&f.0);
        EVENTS.lock().unwrap().push(line);
    }
}

#[test]
fn retransmissions_under_loss_are_logged_in_the_qp_span() {
    let sub = tracing_subscriber::registry()
        .with(Capture.with_filter(tracing_subscriber::filter::LevelFilter::DEBUG));
    tracing::subscriber::set_global_default(sub).unwrap();

    let a = common::Side::new("127.0.151.1", 1 << 16, Some("loss=0.2,seed=11"));
    let b = common::Side::new("127.0.151.2", 1 << 16, None);
    common::connect(&a, &b);
    let n = 32u64;
    for i in 0..n {
        let sge = b.mr.sge(0, 4096).unwrap();
        b.qp.post_recv(&RecvWr::new(i).with_sge(sge)).unwrap();
    }
    for i in 0..n {
        let wr = SendWr::new(i, SendOp::Send)
            .with_sge(a.mr.sge(0, 4096).unwrap())
            .signaled();
        a.qp.post_send(&wr).unwrap();
    }
    for _ in 0..n {
        a.next_ok();
        b.next_ok();
    }
    let stats = a.qp.transport_stats().unwrap();
    assert!(stats.retransmitted > 0, "loss made a retransmit: {stats:?}");
    let events = EVENTS.lock().unwrap().clone();
    let qpn = a.qp.qpn();
    let resent: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("retransmitting") && e.contains(&format!("qpn={qpn} ")))
        .collect();
    assert!(!resent.is_empty(), "a retransmission event: {events:#?}");
    assert!(
        resent.iter().all(|e| e.starts_with("qp>")),
        "inside the QP span: {resent:#?}"
    );
    assert!(
        events.iter().any(|e| e.contains("RC QP created")),
        "the QP's creation: {events:#?}"
    );
    // per-packet events are trace level: none got through the DEBUG filter
    assert!(
        !events
            .iter()
            .any(|e| e.contains("message=rx") || e.contains("message=tx")),
        "{events:#?}"
    );
}
