//! Another user holds UDP 4791 on one of our addresses (UDP ports are unprivileged): a
//! wildcard listener skips that address and says so (ADDR_CHANGE `-EADDRINUSE` naming it,
//! and a warning), also for an address that appears after the listen, and still works on
//! the others; a specific listen or an active id on that address fails with `EADDRINUSE`.
//! Issue 34, item 3. Root: a namespace of its own (127.0.0.1 and 127.0.0.5/32 on its `lo`,
//! 127.0.0.6/32 added later), the squatter is this binary run as uid 65534 (`setpriv`). The
//! async layer: `Listener::unusable_addrs`.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdmacm::cm::{CmId, Cma, ConnParam, EventChannel, EventType, PortSpace};
use rdmacm::{ConnectOptions, Connection, Listener};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

const T: Duration = Duration::from_secs(10);
const SQUAT_ENV: &str = "RDMACM_TEST_SQUAT_ADDR";

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

/// Keeps every warn event as ` field=value ...`.
struct Capture;

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut f = Fields(String::new());
            event.record(&mut f);
            WARNINGS.lock().unwrap().push(f.0);
        }
    }
}

/// The squatter: binds each of `$RDMACM_TEST_SQUAT_ADDR` (comma separated; UDP, no
/// `SO_REUSEPORT`), says so, and holds them until its stdin closes. Run by the test below,
/// as another user.
#[test]
#[ignore = "run by the tests below as their squatter"]
fn squatter_child() {
    let addrs = std::env::var(SQUAT_ENV).expect("run by the test");
    let _s: Vec<_> = addrs
        .split(',')
        .map(|a| std::net::UdpSocket::bind(a).expect("bind"))
        .collect();
    println!("bound");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn wildcard_listener_reports_a_squatted_address() {
    if !rdma_testhosts::require_root("wildcard_listener_reports_a_squatted_address") {
        return;
    }
    let (t, mut squatter) = squatted("squat");
    let a = t.host("a");

    let sub = tracing_subscriber::registry().with(Capture);
    tracing::subscriber::set_global_default(sub).unwrap();
    a.run(|| {
        let cma = Cma::new().unwrap();
        let lch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
        l.bind_addr("0.0.0.0:7471".parse().unwrap()).unwrap();
        l.listen(0).unwrap();
        // the squatted address is reported to the listener, before listen returned
        let ev = lch
            .try_get_event()
            .expect("an event for the squatted address");
        assert_eq!(ev.kind(), EventType::AddrChange);
        assert_eq!(ev.status(), -libc::EADDRINUSE);
        assert_eq!(ev.addr(), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ev.id_num(), l.num());
        drop(ev);
        // and only that one (127.0.0.5 and ::1 are open)
        assert!(lch.try_get_event().is_err(), "one event only");
        let warned = WARNINGS.lock().unwrap().clone();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("addr=127.0.0.1 ") && w.contains("wildcard listen")),
            "a warning names the squatted address: {warned:?}"
        );
        assert!(
            !warned.iter().any(|w| w.contains("addr=127.0.0.5 ")),
            "{warned:?}"
        );
        // a specific listen there fails, so does an active id from there
        let sp = CmId::new(&lch, PortSpace::Tcp).unwrap();
        sp.bind_addr("127.0.0.1:7472".parse().unwrap()).unwrap();
        let e = sp.listen(0).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
        let ach = EventChannel::with_cma(&cma).unwrap();
        let act = CmId::new(&ach, PortSpace::Tcp).unwrap();
        let e = act
            .resolve_addr(
                Some("127.0.0.1:0".parse().unwrap()),
                "127.0.0.5:7471".parse().unwrap(),
                T,
            )
            .unwrap_err();
        assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
        // an address that appears later, squatted too: reported the same way
        add_squatted_address(a);
        let ev = lch
            .get_event_timeout(T)
            .unwrap()
            .expect("an event for the address added later");
        assert_eq!(
            (ev.kind(), ev.status(), ev.addr()),
            (
                EventType::AddrChange,
                -libc::EADDRINUSE,
                Some("127.0.0.6".parse().unwrap())
            )
        );
        drop(ev);
        // the other address still takes connections
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        let dst: SocketAddr = "127.0.0.5:7471".parse().unwrap();
        c.resolve_addr(Some("127.0.0.5:0".parse().unwrap()), dst, T)
            .unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        c.create_qp_default().unwrap();
        c.connect(&ConnParam::default()).unwrap();
        let s = expect(&lch, EventType::ConnectRequest).take_id().unwrap();
        s.create_qp_default().unwrap();
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, EventType::Established);
    });
    drop(squatter.stdin.take());
    squatter.wait().unwrap();
}

fn expect(ch: &EventChannel, kind: EventType) -> rdmacm::cm::Event {
    let ev = ch
        .get_event_timeout(T)
        .unwrap()
        .unwrap_or_else(|| panic!("timed out waiting for {kind}"));
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
    ev
}

/// A namespace `name` with host `a` (127.0.0.1 and 127.0.0.5/32 on its `lo`), and another
/// user (uid 65534) there holding UDP 4791 on 127.0.0.1 and 127.0.0.6 until its stdin
/// closes.
fn squatted(name: &str) -> (rdma_testhosts::Topology, std::process::Child) {
    let t = rdma_testhosts::Topology::builder(name)
        .host("a")
        .addr("a", "lo", "127.0.0.5/32")
        .build()
        .expect("namespace");
    let a = t.host("a");
    let exe = std::env::current_exe().unwrap();
    let mut squatter = Command::new("ip")
        .args(["netns", "exec", a.netns(), "setpriv"])
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(["--ignored", "--exact", "squatter_child", "--nocapture"])
        // 127.0.0.6 is local through lo's 127/8 route before it is an address of lo
        .env(SQUAT_ENV, "127.0.0.1:4791,127.0.0.6:4791")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let mut out = BufReader::new(squatter.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("bound") {
        line.clear();
    }
    assert!(line.contains("bound"), "the squatter holds 127.0.0.1:4791");
    // kept open: the squatter writes its test summary there when it exits
    squatter.stdout = Some(out.into_inner());
    (t, squatter)
}

/// 127.0.0.6 (squatted already) becomes an address of `a`'s `lo`.
fn add_squatted_address(a: &rdma_testhosts::Host) {
    let ok = Command::new("ip")
        .args(["-n", a.netns(), "addr", "add", "127.0.0.6/32", "dev", "lo"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "ip addr add");
}

/// The async layer sees the same: [`Listener::unusable_addrs`] names the squatted address
/// when `bind` returns, and the one squatted before it appeared once the listener has
/// waited for requests since; requests to the other address are accepted.
#[test]
fn async_listener_reports_a_squatted_address() {
    if !rdma_testhosts::require_root("async_listener_reports_a_squatted_address") {
        return;
    }
    let (t, mut squatter) = squatted("squatas");
    let a = t.host("a");
    a.run(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cma = Cma::new().unwrap();
            let l = Listener::builder()
                .cma(cma.clone())
                .bind("0.0.0.0:7471".parse().unwrap())
                .await
                .unwrap();
            let one: IpAddr = "127.0.0.1".parse().unwrap();
            let six: IpAddr = "127.0.0.6".parse().unwrap();
            assert_eq!(l.unusable_addrs(), vec![one]);
            let l = Arc::new(l);
            let server = tokio::spawn({
                let l = l.clone();
                async move {
                    let c = l.accept().await?;
                    c.recv().await
                }
            });
            add_squatted_address(a);
            let deadline = Instant::now() + T;
            while l.unusable_addrs().len() < 2 {
                assert!(Instant::now() < deadline, "{:?}", l.unusable_addrs());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(l.unusable_addrs(), vec![one, six]);
            let opts = ConnectOptions::new()
                .src("127.0.0.5:0".parse().unwrap())
                .cma(cma);
            let c = Connection::connect("127.0.0.5:7471".parse().unwrap(), opts)
                .await
                .unwrap();
            c.send(b"over 127.0.0.5").await.unwrap();
            let got = tokio::time::timeout(T, server).await.unwrap().unwrap();
            assert_eq!(got.unwrap(), b"over 127.0.0.5");
        });
    });
    drop(squatter.stdin.take());
    squatter.wait().unwrap();
}
