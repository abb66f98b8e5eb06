//! cmtime against both generations of rdma-core's cmtime, as real processes on loopback.
//! rdma-core 44 (Debian 12) has no out-of-band sync: its client only connects and
//! disconnects, its server accepts and disconnects until killed. Ours used to wait for the
//! out-of-band socket before answering any request (the REQs got only MRAs), and our client
//! failed at once when the server had no such socket ("Connection refused"). The models of
//! rdma-core 44's sides below are written from its `cmtime.c` (`run_client`, `run_server`,
//! `cma_handler`), on rdmacm; checked against the real binaries in `../shared/refvm`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};

const CMTIME: &str = env!("CARGO_BIN_EXE_cmtime");
/// Connections per run.
const N: usize = 8;

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// rdma-core 44's cmtime client: `N` ids resolved, given QPs and connected all at once, then
/// all disconnected; every connection must be ESTABLISHED within `limit` (an MRA only
/// postpones the REP), and DISCONNECTED after. No out-of-band socket.
fn old_client(src: SocketAddr, dst: SocketAddr, limit: Duration) {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let ids: Vec<CmId> = (0..N)
        .map(|_| CmId::new(&ch, PortSpace::Tcp).unwrap())
        .collect();
    for id in &ids {
        id.resolve_addr(Some(src), dst, Duration::from_secs(2))
            .unwrap();
    }
    let nums: Vec<u64> = ids.iter().map(|i| i.num()).collect();
    let until = |want: EventType, what: &str| {
        let end = Instant::now() + limit;
        let mut seen = HashSet::new();
        while seen.len() < N {
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what}: {} of {N} in time", seen.len());
            let Some(ev) = ch.get_event_timeout(left).unwrap() else {
                continue;
            };
            let i = nums.iter().position(|&n| n == ev.id_num()).unwrap();
            match ev.kind() {
                k if k == want => {
                    seen.insert(i);
                }
                EventType::AddrResolved => {
                    drop(ev);
                    ids[i].resolve_route(Duration::from_secs(2)).unwrap();
                }
                EventType::RouteResolved => {
                    drop(ev);
                    ids[i].create_qp_default().unwrap();
                    ids[i].connect(&ConnParam::default()).unwrap();
                }
                k => panic!("{what}: connection {i}: {k:?} status {}", ev.status()),
            }
        }
    };
    until(EventType::Established, "connect");
    for id in &ids {
        id.disconnect().unwrap();
    }
    until(EventType::Disconnected, "disconnect");
}

/// rdma-core 44's cmtime server on `at`: accepts every request, disconnects a connection
/// when its client does, no out-of-band socket; returns after `runs` × `N` disconnects.
fn old_server(at: SocketAddr, runs: usize, ready: std::sync::mpsc::Sender<()>) {
    let cma = Cma::new().unwrap();
    let ch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
    l.bind_addr(at).unwrap();
    l.listen(0).unwrap();
    ready.send(()).unwrap();
    let mut live = Vec::new();
    let mut done = 0;
    let end = Instant::now() + Duration::from_secs(60);
    while done < runs * N {
        assert!(Instant::now() < end, "server: {done} disconnects in time");
        let Some(mut ev) = ch.get_event_timeout(Duration::from_millis(200)).unwrap() else {
            continue;
        };
        match ev.kind() {
            EventType::ConnectRequest => {
                let id = ev.take_id().unwrap();
                drop(ev);
                id.create_qp_default().unwrap();
                id.accept(&ConnParam::default()).unwrap();
                live.push(id);
            }
            EventType::Disconnected => {
                let n = ev.id_num();
                drop(ev);
                let i = live.iter().position(|x| x.num() == n).unwrap();
                let id = live.swap_remove(i);
                id.disconnect().ok();
                done += 1;
            }
            _ => {}
        }
    }
}

/// Until something listens on TCP `port` of `ip` (our server's out-of-band socket, bound
/// after its CM listener), 10 s at most.
fn wait_listening(ip: [u8; 4], port: u16) {
    let key = format!(
        "{:02X}{:02X}{:02X}{:02X}:{port:04X}",
        ip[3], ip[2], ip[1], ip[0]
    );
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&key.as_str()) && f.get(3) == Some(&"0A")
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {key}");
}

/// rdma-core 44's client against our server: every request is answered (not held for an
/// out-of-band socket that never comes), twice (that generation's server keeps serving).
#[test]
fn old_client_our_server() {
    let mut srv = Proc(
        Command::new(CMTIME)
            .args(["-b", "127.0.50.1", "-p", "7611"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening([127, 0, 50, 1], 7611);
    for _ in 0..2 {
        old_client(
            addr("127.0.50.2:0"),
            addr("127.0.50.1:7611"),
            Duration::from_secs(10),
        );
    }
    assert!(
        srv.0.try_wait().unwrap().is_none(),
        "the server serves on after a run without out-of-band sync"
    );
}

/// Our client against rdma-core 44's server, which has no out-of-band socket: the client
/// runs without sync (its default) and prints its table; `-O` does the same on purpose.
#[test]
fn our_client_old_server() {
    let (tx, rx) = std::sync::mpsc::channel();
    let srv = std::thread::spawn(move || old_server(addr("127.0.50.3:7612"), 2, tx));
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for extra in [None, Some("-O")] {
        let mut args = vec!["-s", "127.0.50.3", "-b", "127.0.50.4", "-p", "7612", "-c"];
        let n = N.to_string();
        args.push(&n);
        args.extend(extra);
        let o = Command::new(CMTIME).args(&args).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{extra:?}: {err}");
        assert!(out.starts_with("step "), "{out}");
        for step in ["create id", "resolve addr", "connect", "disconnect"] {
            assert!(out.contains(&format!("{step:<13}:")), "{step}: {out}");
        }
    }
    srv.join().unwrap();
}

/// Both of ours with `-O` on the client: the server serves without sync too.
#[test]
fn our_client_without_sync_our_server() {
    let _srv = Proc(
        Command::new(CMTIME)
            .args(["-b", "127.0.50.5", "-p", "7613"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening([127, 0, 50, 5], 7613);
    let o = Command::new(CMTIME)
        .args([
            "-s",
            "127.0.50.5",
            "-b",
            "127.0.50.6",
            "-p",
            "7613",
            "-c",
            "8",
            "-O",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
