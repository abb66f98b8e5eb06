//! Shared by the tests that run C programs over our libraries (`qp_ex.rs`,
//! `perftest_paths.rs`, `programs.rs`, `programs_hosts.rs`, `programs_rust.rs`, `mckey.rs`,
//! `perftest_cm.rs`, `signals.rs`): the library directory (linked once per run from the
//! static library cargo built, `scripts/build-cabi.sh --no-build`), Debian's programs (in a
//! namespace host too), our Rust tools, their runs, server/client pairs, listener checks,
//! GID indexes.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one program may run.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The directory holding our libibverbs.so.1 / librdmacm.so.1.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // target/<profile>/deps/<test>-<hash>
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let target = profile_dir.parent().unwrap();
        let profile = profile_dir.file_name().unwrap().to_str().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cmd = Command::new("bash");
        cmd.arg(root.join("scripts/build-cabi.sh"))
            .arg("--no-build")
            .env("CARGO_TARGET_DIR", target);
        if profile != "release" {
            cmd.arg("--debug");
        }
        let out = cmd.current_dir(&root).output().expect("bash");
        assert!(
            out.status.success(),
            "link step failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = profile_dir.join("cabi");
        assert!(dir.join("libibverbs.so.1").exists() && dir.join("librdmacm.so.1").exists());
        dir
    })
}

/// The path of Debian's program `name`, which must be installed.
pub fn bin(name: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{name} is missing: apt-get install ibverbs-utils rdmacm-utils perftest qperf libfabric-bin fio (CI does)"
    );
    path
}

/// Debian's program `name` over our libraries.
pub fn prog(name: &str) -> Command {
    let mut c = Command::new(bin(name));
    c.env("LD_LIBRARY_PATH", lib_dir());
    c
}

/// A running program whose output goes to a file (a pipe nobody reads would stall it), in a
/// process group of its own. Dropped before it was finished (an assertion of the test failed
/// first), it is killed and reaped, with every process it forked (fio's job processes): a
/// server left running would hold its port and break later runs, and a process left holding
/// 127.0.0.1:4791 without reading it loses datagrams steered to it.
pub struct Run {
    child: Child,
    out: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.kill_group();
        self.child.wait().ok();
        std::fs::remove_file(&self.out).ok();
    }
}

impl Run {
    /// SIGKILL to the program and every process of its group (those it forked).
    fn kill_group(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) of the group this test made for the program (`start`).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    /// Waits until the output has `line` (the program still running), or fails.
    pub fn wait_for(&mut self, line: &str) {
        let end = Instant::now() + LIMIT;
        while !self.text().contains(line) {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "exited before {line:?}:\n{}",
                self.text()
            );
            assert!(Instant::now() < end, "no {line:?} in\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `c`.
pub fn start(mut c: Command) -> Run {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("rdma-cabi-t-{}-{n}.out", std::process::id()));
    let f = std::fs::File::create(&out).unwrap();
    let child = c
        .process_group(0)
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    Run { child, out }
}

/// Waits for the program (killed past LIMIT): its status and output.
pub fn finish(r: Run) -> (ExitStatus, String) {
    finish_or_kill(r, false)
}

/// [`finish`], killing the program first with `kill` (a server that runs until stopped).
pub fn finish_or_kill(mut r: Run, kill: bool) -> (ExitStatus, String) {
    let end = Instant::now() + LIMIT;
    if kill {
        r.kill_group();
    }
    while r.child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            r.kill_group();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = r.child.wait().unwrap();
    let text = r.text();
    (status, text) // r's output file goes with it (Drop)
}

/// Whether our `rdma-soft` tool (from this test's target directory; in `host`'s namespace
/// when given) shows an rdma_cm listener on `port`.
pub fn cm_listening(host: Option<&rdma_testhosts::Host>, port: u16) -> bool {
    let exe = std::env::current_exe().unwrap();
    let tool = exe.parent().unwrap().parent().unwrap().join("rdma-soft");
    assert!(
        tool.exists(),
        "{} is missing: cargo build -p rdma-tools --bin rdma-soft",
        tool.display()
    );
    let mut c = match host {
        Some(h) => h.command(tool.to_str().unwrap()),
        None => Command::new(&tool),
    };
    let o = c.args(["resource", "show", "cm_id"]).output().unwrap();
    let want = format!(":{port} ");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.contains("state LISTEN") && l.contains(&want))
}

/// Whether the process `pid` (in its own network namespace) has a TCP socket listening on
/// `port`.
pub fn tcp_listening(pid: u32, port: u16) -> bool {
    // local_address is HEX_IP:HEX_PORT, state 0A is LISTEN
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[1].ends_with(&want) && w[3] == "0A"
            })
    })
}

/// Runs a server and, once it listens on TCP `port`, a client; both must exit 0. Returns
/// the client's output.
pub fn tcp_pair(server: Command, client: Command, port: u16) -> String {
    let s = start(server);
    let end = Instant::now() + LIMIT;
    while !tcp_listening(s.pid(), port) {
        assert!(Instant::now() < end, "the server never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (cs, ct) = finish(start(client));
    let (ss, st) = finish(s);
    let cut = |t: &str| t.chars().take(4000).collect::<String>();
    assert!(
        cs.success() && ss.success(),
        "client {cs:?}:\n{}\nserver {ss:?}:\n{}",
        cut(&ct),
        cut(&st)
    );
    ct
}

/// Builds `tests/c/<name>.c` against the system headers (Debian's libibverbs-dev and
/// librdmacm-dev), linked with `libs`, into `dir`.
pub fn build_c(dir: &Path, name: &str, libs: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .expect("gcc (install gcc, libibverbs-dev and librdmacm-dev)");
    assert!(
        out.status.success(),
        "{name}.c does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Debian's program `name` in `h`'s network namespace over our libraries.
pub fn host_prog(h: &rdma_testhosts::Host, name: &str) -> Command {
    let mut c = h.command(bin(name).to_str().unwrap());
    c.env("LD_LIBRARY_PATH", lib_dir());
    c
}

/// Our Rust tool `name` (crates/tools), from the same target directory as this test.
pub fn rust_tool(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: cargo build -p rdma-tools --bin {name} (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// Runs a server and, once it has an rdma_cm listener on `port` (in `host`'s namespace when
/// given), a client. The client must exit 0; so must the server when `server_exits`, else it
/// is stopped once the client is done. Returns the server's and the client's outputs.
pub fn cm_pair(
    host: Option<&rdma_testhosts::Host>,
    server: Command,
    client: Command,
    port: u16,
    server_exits: bool,
) -> (String, String) {
    let s = start(server);
    let end = Instant::now() + LIMIT;
    while !cm_listening(host, port) {
        assert!(Instant::now() < end, "the server never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (cs, ct) = finish(start(client));
    let (ss, st) = finish_or_kill(s, !server_exits);
    let cut = |t: &str| t.chars().take(4000).collect::<String>();
    assert!(
        cs.success() && (ss.success() || !server_exits),
        "client {cs:?}:\n{}\nserver {ss:?}:\n{}",
        cut(&ct),
        cut(&st)
    );
    (st, ct)
}

/// The GID index of `::ffff:<v4>` on `dev` in `h`'s namespace, from Debian's `ibv_devinfo`
/// over our libraries.
pub fn gid_index(h: &rdma_testhosts::Host, dev: &str, v4: &str) -> String {
    let o = host_prog(h, "ibv_devinfo")
        .args(["-v", "-d", dev])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    // "GID[  1]:\t\t::ffff:192.0.2.1, RoCE v2"
    let want = format!("::ffff:{v4},");
    t.lines()
        .find(|l| l.contains("GID[") && l.contains(&want))
        .and_then(|l| l.split('[').nth(1)?.split(']').next())
        .map(|i| i.trim().to_string())
        .unwrap_or_else(|| panic!("no GID {v4} on {dev}:\n{t}"))
}

/// One test at a time in a test binary (pairs that busy-poll, or use fixed ports), until the
/// guard drops.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` with the two hosts of a fresh `two_hosts_one_link` (a 192.0.2.1, b
/// 192.0.2.2, `eth0` up); skipped (or failed, as `require_root` says) without root.
pub fn two_hosts(test: &str, body: impl FnOnce(&rdma_testhosts::Host, &rdma_testhosts::Host)) {
    if !rdma_testhosts::require_root(test) {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    a.wait_carrier("eth0");
    b.wait_carrier("eth0");
    body(a, b);
}

/// Asserts that a server's (`s`) and a client's (`c`) output of ucmatose or udaddy show
/// their transfers done with status 0; `what` names the pair in a failure.
pub fn assert_transfers_done(s: &str, c: &str, what: &str) {
    for t in [s, c] {
        assert!(t.contains("data transfers complete"), "{what}:\n{s}\n{c}");
        assert!(t.contains("return status 0"), "{what}:\n{s}\n{c}");
    }
}

/// The rows of cmtime's timing table, which the client prints once every connection went
/// through every step.
pub const CMTIME_STEPS: [&str; 7] = [
    "create id    :",
    "resolve addr :",
    "resolve route:",
    "create qp    :",
    "connect      :",
    "disconnect   :",
    "destroy      :",
];

/// Asserts that cmtime's client output `c` has every step's row and no error (a failed
/// event prints "event: ..., error: N", or ADDR/ROUTE_ERROR); `what` names the pair.
pub fn assert_cmtime_done(c: &str, what: &str) {
    for step in CMTIME_STEPS {
        assert!(c.contains(step), "{what}: {step:?} missing in:\n{c}");
    }
    assert!(!c.contains("error"), "{what}:\n{c}");
}
