//! Debian's unmodified RDMA programs (ibverbs-utils, rdmacm-utils) over our libraries: each
//! pair runs on 127.0.0.1 (and rping between two namespace hosts, as root), C against C, and
//! must succeed with its usual output. The libraries are linked from the static library cargo
//! built for this test (`scripts/build-cabi.sh --no-build`). A missing program fails the
//! test: CI installs them (`.ci/run`).

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::{cm_listening, finish_or_kill as finish, lib_dir, prog, start, LIMIT};

/// What a server listens on once it is ready for its client.
#[derive(Clone, Copy)]
enum Ready {
    /// An rdma_cm listener on this port (seen by our `rdma-soft resource show cm_id`).
    Cm(u16),
    /// A TCP socket (the programs that exchange QP data over TCP).
    Tcp(u16),
}

fn listening(r: Ready) -> bool {
    match r {
        Ready::Cm(port) => cm_listening(None, port),
        Ready::Tcp(port) => ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            // local_address is HEX_IP:HEX_PORT, state 0A is LISTEN
            let want = format!(":{port:04X} ");
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&want))
                        && l.split_whitespace().nth(3) == Some("0A")
                })
        }),
    }
}

/// Runs a server and, once it listens, a client; both must exit 0. Returns their outputs.
fn pair(server: Command, client: Command, ready: Ready) -> (String, String) {
    pair_with(server, client, ready, true)
}

/// [`pair`]; a server that runs until stopped (`server_exits` false) is stopped once the
/// client is done.
fn pair_with(
    server: Command,
    client: Command,
    ready: Ready,
    server_exits: bool,
) -> (String, String) {
    let s = start(server);
    let end = Instant::now() + LIMIT;
    while !listening(ready) {
        assert!(Instant::now() < end, "the server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (cs, ct) = finish(start(client), false);
    let (ss, st) = finish(s, !server_exits);
    let cut = |t: &str| t.chars().take(4000).collect::<String>();
    assert!(
        cs.success(),
        "client failed ({cs:?}):\n{}\nserver:\n{}",
        cut(&ct),
        cut(&st)
    );
    if server_exits {
        assert!(
            ss.success(),
            "server failed ({ss:?}):\n{}\nclient:\n{}",
            cut(&st),
            cut(&ct)
        );
    }
    (st, ct)
}

fn with(mut c: Command, args: &[&str]) -> Command {
    c.args(args);
    c
}

#[test]
fn ibv_devices_and_devinfo_show_our_devices() {
    let o = prog("ibv_devices").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).lines().any(|l| l.trim_start().starts_with("lo ")),
        "{}",
        text(&o)
    );
    let o = with(prog("ibv_devinfo"), &["-v", "-d", "lo"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "hca_id:\tlo",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "::ffff:127.0.0.1, RoCE v2",
        "phys_port_cnt:\t\t\t1",
    ] {
        assert!(t.contains(want), "{want:?} missing in:\n{t}");
    }
}

fn rping(port: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut s = with(prog("rping"), &["-s", "-a", "127.0.0.1", "-p", port]);
    let mut c = with(prog("rping"), &["-c", "-a", "127.0.0.1", "-p", port, "-V"]);
    s.args(extra);
    c.args(extra);
    for (k, v) in env {
        s.env(k, v);
        c.env(k, v);
    }
    pair(s, c, Ready::Cm(port.parse().unwrap())).1
}

#[test]
fn rping_verifies_data_on_loopback() {
    let out = rping("17501", &["-C", "10", "-v"], &[]);
    for i in 0..10 {
        assert!(
            out.contains(&format!("ping data: rdma-ping-{i}: ")),
            "{out}"
        );
    }
}

#[test]
fn rping_64k_messages_over_roce_udp() {
    // RDMA_SOFT_LOCAL_WIRE=0: RoCEv2 datagrams on lo rather than the host-local rings.
    // -V: rping compares every message and fails on a mismatch.
    let out = rping(
        "17502",
        &["-C", "3", "-S", "65535"],
        &[("RDMA_SOFT_LOCAL_WIRE", "0")],
    );
    assert!(!out.contains("mismatch"), "{out}");
}

#[test]
fn ucmatose_two_connections() {
    let (s, c) = pair(
        with(prog("ucmatose"), &["-c", "2", "-C", "5", "-p", "17503"]),
        with(
            prog("ucmatose"),
            &["-s", "127.0.0.1", "-c", "2", "-C", "5", "-p", "17503"],
        ),
        Ready::Cm(17503),
    );
    assert!(
        s.contains("return status 0") && c.contains("return status 0"),
        "{s}\n{c}"
    );
    assert!(c.contains("data transfers complete"), "{c}");
}

#[test]
fn udaddy_two_connections() {
    let (s, c) = pair(
        // udaddy has no port option: it always uses 7174.
        with(prog("udaddy"), &["-c", "2", "-C", "5"]),
        with(prog("udaddy"), &["-s", "127.0.0.1", "-c", "2", "-C", "5"]),
        Ready::Cm(7174),
    );
    assert!(
        s.contains("return status 0") && c.contains("return status 0"),
        "{s}\n{c}"
    );
}

#[test]
fn cmtime_ten_connections() {
    // The cmtime server runs until stopped.
    let (_, c) = pair_with(
        with(prog("cmtime"), &["-c", "10", "-p", "17505"]),
        with(
            prog("cmtime"),
            &["-s", "127.0.0.1", "-c", "10", "-p", "17505"],
        ),
        Ready::Cm(17505),
        false,
    );
    assert!(c.contains("connect") && c.contains("destroy"), "{c}");
}

#[test]
fn rdma_server_and_client_endpoints() {
    let (s, c) = pair(
        with(prog("rdma_server"), &["-p", "17506"]),
        with(prog("rdma_client"), &["-s", "127.0.0.1", "-p", "17506"]),
        Ready::Cm(17506),
    );
    assert!(
        s.contains("rdma_server: end 0") && c.contains("rdma_client: end 0"),
        "{s}\n{c}"
    );
}

fn pingpong(name: &str, port: &str) {
    let (s, c) = pair(
        with(prog(name), &["-d", "lo", "-g", "0", "-n", "50", "-p", port]),
        with(
            prog(name),
            &["-d", "lo", "-g", "0", "-n", "50", "-p", port, "127.0.0.1"],
        ),
        Ready::Tcp(port.parse().unwrap()),
    );
    for t in [&s, &c] {
        assert!(t.contains("50 iters in"), "{t}");
        assert!(t.contains("GID ::ffff:127.0.0.1"), "{t}");
    }
}

#[test]
fn ibv_rc_pingpong_on_loopback() {
    pingpong("ibv_rc_pingpong", "17507");
}

#[test]
fn ibv_ud_pingpong_on_loopback() {
    pingpong("ibv_ud_pingpong", "17508");
}

#[test]
fn ibv_srq_pingpong_on_loopback() {
    pingpong("ibv_srq_pingpong", "17509");
}

/// `ibv_create_cq_ex` is not offered (EOPNOTSUPP, docs/CABI.md); the one Debian program
/// that would call it, `ibv_rc_pingpong --ts`, first asks `ibv_query_device_ex` for
/// `completion_timestamp_mask`, which is 0 on our device as on rxe, and says so.
#[test]
fn ibv_rc_pingpong_timestamps_are_refused_before_cq_ex() {
    let (status, out) = finish(
        start(with(
            prog("ibv_rc_pingpong"),
            &["-d", "lo", "-g", "0", "-p", "17513", "--ts"],
        )),
        false,
    );
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("isn't completion timestamp capable"), "{out}");
}

#[test]
fn rping_between_two_namespace_hosts() {
    if !rdma_testhosts::require_root("rping_between_two_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    let run = |h: &rdma_testhosts::Host, args: &[&str]| {
        let mut c = h.command("/usr/bin/rping");
        c.args(args).env("LD_LIBRARY_PATH", lib_dir());
        c
    };
    assert!(
        Path::new("/usr/bin/rping").exists(),
        "rping is missing: apt-get install rdmacm-utils"
    );
    let (_, out) = pair(
        run(b, &["-s", "-a", "192.0.2.2", "-p", "17510", "-C", "5"]),
        run(
            a,
            &[
                "-c",
                "-a",
                "192.0.2.2",
                "-p",
                "17510",
                "-C",
                "5",
                "-v",
                "-V",
            ],
        ),
        Ready::Cm(17510),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 5, "{out}");
}

/// Our Rust `rping` (crates/tools), from the same target directory as this test.
fn rust_rping() -> Command {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("rping");
    assert!(
        path.exists(),
        "{} is missing: cargo build -p rdma-tools --bin rping (cargo test --workspace builds it)",
        path.display()
    );
    Command::new(path)
}

#[test]
fn c_rping_against_rust_rping_both_ways() {
    let (_, out) = pair(
        with(
            rust_rping(),
            &["-s", "-a", "127.0.0.1", "-p", "17511", "-C", "5"],
        ),
        with(
            prog("rping"),
            &[
                "-c",
                "-a",
                "127.0.0.1",
                "-p",
                "17511",
                "-C",
                "5",
                "-v",
                "-V",
            ],
        ),
        Ready::Cm(17511),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 5, "{out}");
    let (_, out) = pair(
        with(
            prog("rping"),
            &["-s", "-a", "127.0.0.1", "-p", "17512", "-C", "5"],
        ),
        with(
            rust_rping(),
            &[
                "-c",
                "-a",
                "127.0.0.1",
                "-p",
                "17512",
                "-C",
                "5",
                "-v",
                "-V",
            ],
        ),
        Ready::Cm(17512),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 5, "{out}");
}

/// perftest's `test` with `args`, server and client, on the loopback device (GID 0), over a
/// TCP exchange or (`rdma_cm`) the CM's.
fn perftest(test: &str, port: u16, args: &[&str], rdma_cm: bool) -> String {
    let p = port.to_string();
    let mut common = vec!["-d", "lo", "-x", "0", "-p", &p];
    common.extend_from_slice(args);
    if rdma_cm {
        common.push("-R");
    }
    let ready = if rdma_cm {
        Ready::Cm(port)
    } else {
        Ready::Tcp(port)
    };
    let mut client = with(prog(test), &common);
    client.arg("127.0.0.1");
    let (_, c) = pair(with(prog(test), &common), client, ready);
    c
}

/// perftest over its TCP exchange. With `-R` (rdma_cm) the tests pass too when the client
/// starts a few seconds after the server, but a client right after the server's wildcard
/// listen is rejected (docs/CABI.md, "Not yet"), so `-R` is not in this test yet.
#[test]
fn perftest_latency_and_bandwidth() {
    let mut port = 17520;
    for test in [
        "ib_send_lat",
        "ib_send_bw",
        "ib_write_lat",
        "ib_write_bw",
        "ib_read_lat",
        "ib_read_bw",
        "ib_atomic_lat",
    ] {
        port += 1;
        let out = perftest(test, port, &["-n", "200"], false);
        // the results line: the message size, then the iterations asked for
        assert!(
            out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 2 && f[0].parse::<u32>().is_ok() && f[1] == "200"
            }),
            "{test}: no results line in\n{out}"
        );
    }
}

/// The harness ends its own programs on every path: a server whose client's assertion
/// failed first (or that never listened) is killed and reaped as the test unwinds, instead
/// of holding its port and failing later runs with "the server never listened".
#[test]
fn a_failed_assertion_leaves_no_server_running() {
    let mut c = Command::new("sleep");
    c.arg("30");
    let s = start(c);
    let pid = s.pid();
    let unwound = std::panic::catch_unwind(move || {
        let _server = s;
        panic!("the client's assertion");
    });
    assert!(unwound.is_err());
    let proc = Path::new("/proc").join(pid.to_string());
    assert!(!proc.exists(), "the server {pid} is still there");
}

/// A program killed by the harness takes the processes it forked with it (fio's job
/// processes outlived a killed fio, held 127.0.0.1:4791 and lost datagrams steered to them:
/// a later test's UD receive never came).
#[test]
fn a_killed_program_takes_its_forked_processes() {
    let file = std::env::temp_dir().join(format!("rdma-cabi-fork-{}", std::process::id()));
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("sleep 30 & echo $! > {}; wait", file.display()));
    let r = start(c);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let forked = loop {
        if let Some(p) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break p;
        }
        assert!(std::time::Instant::now() < end, "the shell never forked");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    std::fs::remove_file(&file).ok();
    let (status, _) = support::finish_or_kill(r, true);
    assert!(!status.success());
    // the killed sleep is reaped by init soon after
    let proc = Path::new("/proc").join(forked.to_string());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while proc.exists() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!proc.exists(), "the forked process {forked} is still there");
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `objdump -T` of a library: its defined (symbol, version) pairs, the version in
/// parentheses for a non-default (compat) one as objdump prints it.
fn exports(lib: &Path) -> std::collections::BTreeSet<(String, String)> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils)");
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(" .text") || l.contains(" .bss") || l.contains(" .data"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3).then(|| (f[f.len() - 1].to_string(), f[f.len() - 2].to_string()))
        })
        .collect()
}

#[test]
fn every_export_has_rdma_cores_symbol_version() {
    let ours = exports(&lib_dir().join("libibverbs.so.1"));
    let mut debian = exports(Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1"));
    debian.extend(exports(Path::new(
        "/usr/lib/x86_64-linux-gnu/librdmacm.so.1",
    )));
    assert!(ours.len() > 200, "{} exports", ours.len());
    // Every symbol we export carries a version Debian's libraries give it …
    let foreign: Vec<_> = ours.difference(&debian).collect();
    assert!(
        foreign.is_empty(),
        "exports rdma-core does not have: {foreign:?}"
    );
    // … and every version of a symbol we define is there (compat and default alike).
    let names: std::collections::BTreeSet<&String> = ours.iter().map(|(n, _)| n).collect();
    let missing: Vec<_> = debian
        .iter()
        .filter(|(n, _)| names.contains(n))
        .filter(|p| !ours.contains(*p))
        .collect();
    assert!(missing.is_empty(), "versions missing: {missing:?}");
    assert!(ours.contains(&("ibv_get_device_list".into(), "IBVERBS_1.1".into())));
    assert!(ours.contains(&("ibv_get_device_list".into(), "(IBVERBS_1.0)".into())));
}

#[test]
fn both_names_map_one_library() {
    // librdmacm.so.1 is a symlink to libibverbs.so.1: one file, mapped once, one runtime.
    let link = std::fs::read_link(lib_dir().join("librdmacm.so.1")).unwrap();
    assert_eq!(link, Path::new("libibverbs.so.1"));
    let s = start(with(
        prog("rping"),
        &["-s", "-a", "127.0.0.1", "-p", "17540"],
    ));
    let end = Instant::now() + LIMIT;
    while !listening(Ready::Cm(17540)) {
        assert!(Instant::now() < end, "rping never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", s.pid())).unwrap();
    let (_, _) = finish(s, true);
    let libs: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libibverbs") || p.contains("librdmacm"))
        .collect();
    let ours = lib_dir().join("libibverbs.so.1");
    assert_eq!(libs.len(), 1, "{libs:?}");
    assert_eq!(
        Path::new(libs.iter().next().unwrap()),
        std::fs::canonicalize(ours).unwrap()
    );
}

/// libfabric's verbs provider (Debian's libfabric-bin) over our libibverbs: its UD
/// (`FI_EP_DGRAM`) endpoints; `fi_pingpong` exchanges addresses over its own TCP socket.
#[test]
fn libfabric_verbs_dgram_pingpong() {
    let o = with(prog("fi_info"), &["-p", "verbs"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("domain: lo-dgram"), "{}", text(&o));
    let common = ["-p", "verbs", "-e", "dgram", "-I", "20"];
    let server = with(with(prog("fi_pingpong"), &common), &["-B", "17560"]);
    let client = with(
        with(prog("fi_pingpong"), &common),
        &["-P", "17560", "127.0.0.1"],
    );
    let (_, out) = pair(server, client, Ready::Tcp(17560));
    // bytes, #sent, #ack: every size's 20 messages acknowledged
    let rows = out
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[1] == "20" && f[2] == "=20"
        })
        .count();
    assert!(rows >= 4, "{out}");
}

/// fio's rdma engine (Debian's fio 3.33), RDMA writes: a short job, 4 MiB in 64 KiB blocks.
#[test]
fn fio_rdma_write_job() {
    let job = [
        "--ioengine=rdma",
        "--port=17562",
        "--bs=64k",
        "--size=4m",
        "--iodepth=4",
    ];
    let server = with(with(prog("fio"), &job), &["--name=recv", "--rw=read"]);
    let client = with(
        with(prog("fio"), &job),
        &[
            "--name=send",
            "--hostname=127.0.0.1",
            "--verb=write",
            "--rw=write",
        ],
    );
    let (_, out) = pair(server, client, Ready::Cm(17562));
    assert!(
        out.contains("WRITE: bw=") && out.contains("io=4096KiB"),
        "{out}"
    );
}

/// fio's rdma engine, RDMA reads. The engine's roles follow `--rw`, whatever the verb: the
/// `--rw=read` job listens, the `--rw=write` job connects (`--hostname`) and issues the
/// verb, here RDMA READs of the listener's buffer (fio's examples/rdmaio-*.fio). The reverse
/// (`--rw=write` without a hostname) crashes fio itself in `inet_aton(NULL)` while the other
/// job waits for a connection forever: the "hang" once seen.
#[test]
fn fio_rdma_read_job() {
    let job = [
        "--ioengine=rdma",
        "--port=17563",
        "--bs=64k",
        "--size=4m",
        "--iodepth=4",
    ];
    let server = with(with(prog("fio"), &job), &["--name=target", "--rw=read"]);
    let client = with(
        with(prog("fio"), &job),
        &[
            "--name=reader",
            "--hostname=127.0.0.1",
            "--verb=read",
            "--rw=write",
        ],
    );
    let (_, out) = pair(server, client, Ready::Cm(17563));
    assert!(
        out.contains("err= 0:") && out.contains("io=4096KiB"),
        "{out}"
    );
}
