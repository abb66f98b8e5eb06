//! Device groups in the CM (issue 11): `RDMACM_DEVICES` / `CmaConfig` entry `ha0=h0+h1`
//! gives H one device with a port per link (root; SKIPPED otherwise; topology in
//! `ha/mod.rs`: H h0 192.0.2.1, h1 198.51.100.1 — B b0 192.0.2.2, b1 198.51.100.2).
//! A connection from each of H's addresses lands on the one device, on the port of its
//! netdev; one memory region registered once is written by B through both; a link going
//! down shows on its port.

mod support_ha;
mod support_hosts;

use std::sync::mpsc;

use rdma_soft::verbs::{AsyncEvent, PortState};
use rdma_testhosts::require_root;
use rdmacm::cm::HaPolicy;
use rdmacm::verbs::AccessFlags;
use rdmacm::{AcceptOptions, ConnectOptions, Connection, Listener, RemoteBuf};
use support_ha::{group, rt, topo, within, HANG};

/// What B writes over the connection from `src`.
fn payload(src: &str) -> Vec<u8> {
    format!("written by B over the path from {src}").into_bytes()
}

#[test]
fn a_group_device_carries_a_connection_on_each_link_with_one_mr() {
    if !require_root("a_group_device_carries_a_connection_on_each_link_with_one_mr") {
        return;
    }
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let addr = "0.0.0.0:7490".parse().unwrap();
                    let l = Listener::bind(addr).await.unwrap();
                    ready_tx.send(()).unwrap();
                    let mut conns = Vec::new();
                    for n in 0..2 {
                        let inc = within("request", l.incoming()).await.unwrap();
                        let rb = RemoteBuf::from_bytes(inc.private_data()).unwrap();
                        let src = inc.peer_addr().unwrap().ip().to_string();
                        let c = inc.accept(AcceptOptions::default()).await.unwrap();
                        within("write", c.write(&rb, &payload(&src))).await.unwrap();
                        // The write is complete at H before this message arrives (RC order).
                        within("send", c.send(b"done")).await.unwrap();
                        conns.push(c);
                        eprintln!("B: connection {n} from {src} written");
                    }
                    for c in &conns {
                        within("peer's disconnect", c.closed()).await;
                    }
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let cma = group("ha0", "h0", "h1", HaPolicy::Notify, false);
                // One device for both links, with two ports.
                let list = cma.device_list().unwrap();
                let names: Vec<String> = list.iter().map(|d| d.name().to_string()).collect();
                assert_eq!(names, ["ha0"], "the group is one device, listed once");
                let dev = list[0].clone();
                assert_eq!(dev.query_device().phys_port_cnt, 2);
                let pd = dev.alloc_pd().unwrap();
                let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
                let mr = pd.register(vec![0u8; 256], access).unwrap();
                let keys = (mr.lkey(), mr.rkey());
                let whole = RemoteBuf::of(&mr);
                let mut conns = Vec::new();
                for (n, (src, dst, port, netdev)) in [
                    ("192.0.2.1", "192.0.2.2", 1u8, "h0"),
                    ("198.51.100.1", "198.51.100.2", 2, "h1"),
                ]
                .into_iter()
                .enumerate()
                {
                    let region = whole.slice(n as u32 * 128, 128).unwrap();
                    let opts = ConnectOptions::new()
                        .cma(cma.clone())
                        .src(format!("{src}:0").parse().unwrap())
                        .private_data(region.to_bytes().to_vec());
                    let addr = format!("{dst}:7490").parse().unwrap();
                    let mut r = within("resolve", Connection::resolve(addr, opts))
                        .await
                        .unwrap();
                    assert_eq!(r.device().name(), "ha0");
                    r.options_mut().setup.pd = Some(pd.clone());
                    let c = within("connect", r.connect()).await.unwrap();
                    let id = c.id().unwrap();
                    assert_eq!(id.port_num(), Some(port), "{src}");
                    assert_eq!(id.netdev().unwrap().0, "h0", "the group's first netdev");
                    assert_eq!(
                        c.qp().query().unwrap().port_num,
                        port,
                        "the QP is on {netdev}'s port"
                    );
                    assert_eq!(within("done", c.recv()).await.unwrap(), b"done");
                    let want = payload(src);
                    let mut got = vec![0u8; want.len()];
                    mr.read(n * 128, &mut got).unwrap();
                    assert_eq!(got, want, "B's write over {netdev}");
                    conns.push(c);
                }
                assert_eq!((mr.lkey(), mr.rkey()), keys, "registered once");
                let rx = dev.rx_by_port();
                assert!(rx[1] > 0 && rx[2] > 0, "datagrams on both ports: {rx:?}");
                for c in conns {
                    within("disconnect", c.disconnect()).await.unwrap();
                }
                // Port 2 follows h1's link.
                support_hosts::sh(host, &["link", "set", "h1", "down"]);
                // The CM's engine sets the port's state on the netlink event: the device
                // reports it as IBV_EVENT_PORT_ERR.
                loop {
                    let e = dev.wait_async_event(Some(HANG)).unwrap();
                    match e {
                        Some(AsyncEvent::PortError { port: 2 }) => break,
                        Some(_) => continue,
                        None => panic!("hang guard: port 2 stayed up"),
                    }
                }
                assert_eq!(dev.query_port(2).unwrap().state, PortState::Down);
                assert_eq!(dev.query_port(1).unwrap().state, PortState::Active);
            })
        });
    });
}
