//! cmtime, rdma-perf and rdmacm-demo as real processes: a server and a client on two
//! loopback addresses (distinct 127.0.0.x per test: a process owns UDP 4791 on the
//! addresses it uses), and between two network-namespace hosts (root only).

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const CMTIME: &str = env!("CARGO_BIN_EXE_cmtime");
const PERF: &str = env!("CARGO_BIN_EXE_rdma-perf");
const DEMO: &str = env!("CARGO_BIN_EXE_rdmacm-demo");

/// A background server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the server `c` and waits until its CM listener on `port` is up.
fn spawn(mut c: Command, port: u16) -> Server {
    let mut s = Server(
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn server"),
    );
    wait_listening(&mut s.0, port);
    s
}

/// Until process `p` has a listener on `port` in the inspection view (`rdma-soft resource
/// show cm_id`, state LISTEN): a client that comes earlier is refused (REJ 8, as a TCP
/// connect before `listen`), and one that comes later must not be. Panics if `p` exits
/// first, or after [`HANG`].
fn wait_listening(p: &mut Child, port: u16) {
    let (pid, port) = (p.id().to_string(), format!(":{port}"));
    let end = std::time::Instant::now() + HANG;
    while std::time::Instant::now() < end {
        let text = Command::new(env!("CARGO_BIN_EXE_rdma-soft"))
            .args(["resource", "show", "cm_id"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let listening = text.lines().any(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            t.windows(2).any(|w| w == ["state", "LISTEN"])
                && t.windows(2).any(|w| w[0] == "pid" && w[1] == pid)
                && t.windows(2)
                    .any(|w| w[0] == "src-addr" && w[1].ends_with(&port))
        });
        if listening {
            return;
        }
        if let Ok(Some(st)) = p.try_wait() {
            panic!("the server exited ({st}) before listening on {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no listener on {port} within {HANG:?}");
}

/// Until cmtime server `p` also listens on its out-of-band TCP socket on `port` (opened
/// just after its CM listener; its client connects there first), as `/proc/PID/net/tcp`
/// shows it (the process's own network namespace).
fn wait_oob(p: &mut Child, port: u16) {
    let (path, port) = (format!("/proc/{}/net/tcp", p.id()), format!(":{port:04X}"));
    let end = std::time::Instant::now() + HANG;
    while std::time::Instant::now() < end {
        let tcp = std::fs::read_to_string(&path).unwrap_or_default();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1).is_some_and(|a| a.ends_with(&port)) && f.get(3) == Some(&"0A")
        }) {
            return;
        }
        if let Ok(Some(st)) = p.try_wait() {
            panic!("the server exited ({st}) before its out-of-band socket listened");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no out-of-band socket on {port} within {HANG:?}");
}

/// A stop for a wait that would otherwise hang, not a speed target.
const HANG: Duration = Duration::from_secs(60);

fn cmd(bin: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args);
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("run client")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Checks cmtime's table: the header, one row per step, four positive-or-zero numbers.
fn check_cmtime(out: &str, bound: bool) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["step", "total", "ms", "max", "ms", "min", "us", "us", "/", "conn"],
        "{out}"
    );
    let mut steps = vec!["create id"];
    if bound {
        steps.push("bind addr");
    }
    steps.extend([
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ]);
    assert_eq!(lines.len(), steps.len() + 1, "{out}");
    for (l, s) in lines[1..].iter().zip(steps) {
        let (name, nums) = l.split_once(':').expect("step: numbers");
        assert_eq!(name.trim_end(), s, "{out}");
        assert_eq!(name.len(), 13, "step name padded: {l}");
        let v: Vec<f64> = nums
            .split_whitespace()
            .map(|x| x.parse().expect("number"))
            .collect();
        assert_eq!(v.len(), 4, "{l}");
        assert!(v.iter().all(|x| x.is_finite() && *x >= 0.0), "{l}");
        if s == "connect" {
            assert!(v[0] > 0.0 && v[3] > 0.0, "{l}");
        }
    }
}

/// Checks perftest's table: the header with its columns, one positive row per size.
fn check_perf(out: &str, lat: bool, rows: usize) {
    let header = out
        .lines()
        .position(|l| l.trim_start().starts_with("#bytes"))
        .unwrap_or_else(|| panic!("no header: {out}"));
    let lines: Vec<&str> = out.lines().collect();
    let cols = if lat {
        vec![
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
        ]
    } else {
        vec![
            "#bytes",
            "#iterations",
            "BW",
            "peak[MB/sec]",
            "BW",
            "average[MB/sec]",
        ]
    };
    let h: Vec<&str> = lines[header].split_whitespace().collect();
    assert_eq!(&h[..cols.len()], cols.as_slice(), "{out}");
    if lat {
        assert!(lines[header].contains("99% percentile[usec]   99.9% percentile[usec]"));
    } else {
        assert!(lines[header].ends_with("MsgRate[Mpps]"));
    }
    assert!(lines[header - 1].starts_with("-----"), "{out}");
    for r in 0..rows {
        let l = lines[header + 1 + r];
        let v: Vec<f64> = l
            .split_whitespace()
            .map(|x| x.parse().unwrap_or_else(|_| panic!("number in {l:?}")))
            .collect();
        assert_eq!(v.len(), if lat { 9 } else { 5 }, "{l}");
        assert!(v.iter().all(|x| x.is_finite() && *x > 0.0), "{l}");
    }
    assert!(lines[header + 1 + rows].starts_with("-----"), "{out}");
}

fn perf_pair(test: &str, srv: &str, cli: &str, port: &str, extra: &[&str], rows: usize) {
    let _s = spawn(
        cmd(PERF, &[test, "--bind", srv, "-p", port]),
        port.parse().unwrap(),
    );
    let mut args = vec![test, "--bind", cli, "-p", port, "-F"];
    args.extend_from_slice(extra);
    args.push(srv);
    // The server listens: one try (a REJ now is a steering or listener defect).
    let o = run(cmd(PERF, &args));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{test}: {err}\n{out}");
    check_perf(&out, test.ends_with("_lat"), rows);
}

#[test]
fn cmtime_table_over_loopback() {
    let mut s = spawn(cmd(CMTIME, &["-b", "127.0.0.141", "-p", "7601"]), 7601);
    wait_oob(&mut s.0, 7601);
    let o = run(cmd(
        CMTIME,
        &[
            "-s",
            "127.0.0.141",
            "-b",
            "127.0.0.142",
            "-p",
            "7601",
            "-c",
            "50",
        ],
    ));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    check_cmtime(&out, true);
}

#[test]
fn cmtime_without_server_fails_with_one_line() {
    let o = run(cmd(
        CMTIME,
        &[
            "-s",
            "127.0.0.143",
            "-b",
            "127.0.0.144",
            "-c",
            "2",
            "-t",
            "200",
            "-r",
            "0",
        ],
    ));
    let (out, err) = text(&o);
    assert!(!o.status.success());
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("cmtime: connect"), "{err}");
    let o = run(cmd(CMTIME, &["-c", "x"]));
    assert_eq!(o.status.code(), Some(1));
}

/// A cmtime server that is expected to exit by itself (killed if it has not when dropped,
/// so that a failing test leaves nothing running).
struct OwnServer(Child);

impl OwnServer {
    fn spawn(args: &[&str]) -> OwnServer {
        OwnServer(
            Command::new(CMTIME)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn server"),
        )
    }

    /// Its exit code within `limit`, or `None` when it is still running; and its stderr.
    fn exit_within(&mut self, limit: Duration) -> (Option<i32>, String) {
        let end = std::time::Instant::now() + limit;
        let mut code = None;
        while std::time::Instant::now() < end {
            if let Some(st) = self.0.try_wait().expect("try_wait") {
                code = Some(st.code());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if code.is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        let mut err = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        (code.flatten(), err)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Until a TCP socket listens on `addr` as `/proc/net/tcp` writes it (a fixed sleep lost
/// the race under CI load); 10 s at most, then the client's own error says what failed.
fn wait_tcp_listen(addr: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let listening = tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&addr) && f.get(3) == Some(&"0A")
        });
        if listening {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// rdma-core's cmtime server serves one client's run and exits with it; ours used to keep
/// running (and holding its address and port) until killed.
#[test]
fn cmtime_server_ends_with_its_client_run() {
    for round in 0..2 {
        // The same address and port both times: the first server must have let go of them.
        let mut srv = OwnServer::spawn(&["-b", "127.0.0.145", "-p", "7603"]);
        wait_tcp_listen("9100007F:1DB3"); // 127.0.0.145:7603, the out-of-band socket
        let o = run(cmd(
            CMTIME,
            &[
                "-s",
                "127.0.0.145",
                "-b",
                "127.0.0.146",
                "-p",
                "7603",
                "-c",
                "20",
            ],
        ));
        let (out, err) = text(&o);
        assert!(o.status.success(), "round {round}: {err}");
        check_cmtime(&out, true);
        let (code, serr) = srv.exit_within(Duration::from_secs(10));
        assert_eq!(
            code,
            Some(0),
            "round {round}: the server did not exit 0 after its client's run: {serr}"
        );
    }
}

/// A client that goes away before its run is over ends the server's run too, with one line.
#[test]
fn cmtime_server_ends_when_its_client_goes_away() {
    let mut srv = OwnServer::spawn(&["-b", "127.0.0.147", "-p", "7604"]);
    // The out-of-band socket is on the CM port; connect, then leave at once.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let sock = loop {
        match std::net::TcpStream::connect("127.0.0.147:7604") {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() >= end => panic!("server's socket: {e}"),
            Err(e) => {
                if let Ok(Some(st)) = srv.0.try_wait() {
                    let (_, serr) = srv.exit_within(Duration::ZERO);
                    panic!("server exited ({st}) before taking a connection ({e}): {serr}");
                }
                std::thread::sleep(Duration::from_millis(50))
            }
        }
    };
    drop(sock);
    let (code, serr) = srv.exit_within(Duration::from_secs(10));
    assert_eq!(code, Some(1), "{serr}");
    assert_eq!(serr.lines().count(), 1, "{serr}");
    assert!(serr.starts_with("cmtime: "), "{serr}");
}

#[test]
fn perf_send_lat_and_bw() {
    perf_pair(
        "send_lat",
        "127.0.0.151",
        "127.0.0.152",
        "18601",
        &["-s", "64", "-n", "500"],
        1,
    );
    perf_pair(
        "send_bw",
        "127.0.0.151",
        "127.0.0.152",
        "18602",
        &["-s", "65536", "-n", "500"],
        1,
    );
}

#[test]
fn perf_write_lat_and_bw() {
    perf_pair(
        "write_lat",
        "127.0.0.153",
        "127.0.0.154",
        "18603",
        &["-s", "4096", "-n", "500"],
        1,
    );
    perf_pair(
        "write_bw",
        "127.0.0.153",
        "127.0.0.154",
        "18604",
        &["-s", "65536", "-n", "500", "-q", "2"],
        1,
    );
}

#[test]
fn perf_read_lat_and_bw() {
    perf_pair(
        "read_lat",
        "127.0.0.155",
        "127.0.0.156",
        "18605",
        &["-s", "64", "-n", "500"],
        1,
    );
    perf_pair(
        "read_bw",
        "127.0.0.155",
        "127.0.0.156",
        "18606",
        &["-s", "65536", "-n", "500"],
        1,
    );
}

#[test]
fn perf_all_sizes() {
    perf_pair(
        "write_lat",
        "127.0.0.157",
        "127.0.0.158",
        "18607",
        &["-a", "-n", "5"],
        23,
    );
}

#[test]
fn perf_failures_are_one_line() {
    let o = run(cmd(
        PERF,
        &["send_lat", "--bind", "127.0.0.160", "127.0.0.159"],
    ));
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("rdma-perf: connect"), "{err}");
    for bad in [
        &["nosuch"][..],
        &["send_bw", "-s", "0"],
        &["send_bw", "-x"],
        &[],
    ] {
        let o = run(cmd(PERF, bad));
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{bad:?}");
        assert_eq!(err.lines().count(), 1, "{bad:?}: {err}");
    }
}

#[test]
fn demo_in_one_process() {
    let o = run(cmd(DEMO, &["-p", "7611", "--mib", "32", "--pings", "1000"]));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    for want in [
        "RDMA_CM_EVENT_ADDR_RESOLVED",
        "RDMA_CM_EVENT_ROUTE_RESOLVED",
        "RDMA_CM_EVENT_CONNECT_REQUEST",
        "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_DISCONNECTED",
        "connection set up in",
        "RDMA WRITE: 32 MiB",
        "SEND ping-pong, 64 B x 1000",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
}

#[test]
fn demo_in_two_processes() {
    let _s = spawn(cmd(DEMO, &["--server", "127.0.0.161", "-p", "7612"]), 7612);
    let o = run(cmd(
        DEMO,
        &[
            "--client",
            "127.0.0.161",
            "--bind",
            "127.0.0.162",
            "-p",
            "7612",
            "--mib",
            "16",
            "--pings",
            "500",
        ],
    ));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    assert!(
        out.contains("RDMA_CM_EVENT_ESTABLISHED") && out.contains("MiB/s"),
        "{out}"
    );
}

#[test]
fn namespaces_two_hosts() {
    if !rdma_testhosts::require_root("namespaces_two_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (topo.host("a"), topo.host("b"));
    let mut s = a.command(PERF);
    s.args(["write_bw", "--bind", "192.0.2.1", "-p", "18610"]);
    let _s = spawn(s, 18610);
    let mut c = b.command(PERF);
    c.args([
        "write_bw",
        "-s",
        "65536",
        "-n",
        "300",
        "-p",
        "18610",
        "192.0.2.1",
    ]);
    let o = run(c);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    check_perf(&out, false, 1);

    let mut s = a.command(CMTIME);
    s.args(["-p", "7620"]);
    let mut s2 = spawn(s, 7620);
    wait_oob(&mut s2.0, 7620);
    let mut c = b.command(CMTIME);
    c.args(["-s", "192.0.2.1", "-p", "7620", "-c", "20"]);
    let o = run(c);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    check_cmtime(&out, false);
}
