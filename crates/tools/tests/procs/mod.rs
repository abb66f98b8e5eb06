//! Running the tools as real processes in tests: spawn with piped output, wait with a
//! timeout (killing the child, by its pid, when it runs over), wait until a server's device
//! holds UDP 4791 on its address.

#![allow(dead_code)]

use std::io::Read;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished process left.
#[derive(Debug)]
pub struct Out {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Out {
    /// Exit code 0, or a panic showing both streams.
    pub fn ok(&self, what: &str) -> &Self {
        assert_eq!(self.code, Some(0), "{what} failed: {self:#?}");
        self
    }
}

/// A running child with piped output.
pub struct Proc {
    child: Child,
    what: String,
    /// [`spawn_streamed`]: threads reading stdout and stderr as they come.
    streams: Option<[Stream; 2]>,
}

/// A pipe read by its own thread into a shared buffer.
struct Stream {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Stream {
    fn new(mut from: impl Read + Send + 'static) -> Stream {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let to = text.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                to.lock().unwrap().push_str(&chunk);
            }
        });
        Stream { text, reader }
    }

    /// Everything read, once the pipe closed (the child exited).
    fn finish(self) -> String {
        let _ = self.reader.join();
        std::mem::take(&mut *self.text.lock().unwrap())
    }
}

/// Starts `cmd` with stdout/stderr piped.
pub fn spawn(mut cmd: Command, what: &str) -> Proc {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    Proc {
        child,
        what: what.to_string(),
        streams: None,
    }
}

/// [`spawn`], with its output read as it comes (so that a test can wait for a line, and a
/// long run never blocks on a full pipe).
pub fn spawn_streamed(cmd: Command, what: &str) -> Proc {
    let mut p = spawn(cmd, what);
    let out = p.child.stdout.take().expect("piped stdout");
    let err = p.child.stderr.take().expect("piped stderr");
    p.streams = Some([Stream::new(out), Stream::new(err)]);
    p
}

impl Drop for Proc {
    /// A test that panics before waiting for its processes does not leave them running
    /// (they would hold their addresses and ports for the next run): killed by their pid.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Proc {
    /// The child's process id (for the inspection view's `pid`).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits until its stdout holds `pat` (a [`spawn_streamed`] process); false after `t`
    /// or when it exited without it.
    pub fn wait_for_stdout(&mut self, pat: &str, t: Duration) -> bool {
        let end = Instant::now() + t;
        let text = self.streams.as_ref().expect("spawn_streamed")[0]
            .text
            .clone();
        while Instant::now() < end {
            if text.lock().unwrap().contains(pat) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return text.lock().unwrap().contains(pat);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Its stdout and stderr, from the pipes or the streams.
    fn outputs(&mut self) -> (String, String) {
        if let Some([o, e]) = self.streams.take() {
            return (o.finish(), e.finish());
        }
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut stdout);
        }
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        (stdout, stderr)
    }

    /// Waits up to `t`, then kills it (SIGKILL to its own pid); returns its output.
    pub fn wait(mut self, t: Duration) -> Out {
        let end = Instant::now() + t;
        let mut killed = false;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() >= end => {
                    let _ = self.child.kill();
                    killed = true;
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("wait {}: {e}", self.what),
            }
        }
        let status = self.child.wait().expect("wait");
        let (stdout, stderr) = self.outputs();
        let out = Out {
            code: status.code(),
            stdout,
            stderr,
        };
        assert!(!killed, "{} ran over {t:?}: {out:#?}", self.what);
        out
    }

    /// Kills it (a server that runs forever) and returns its output.
    pub fn kill(mut self) -> Out {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait");
        let (stdout, stderr) = self.outputs();
        Out {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

/// `/proc/net/udp`-style local address of `ip`:4791.
fn proc_net_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{:02X}{:02X}{:02X}{:02X}:12B7", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::new();
            for w in v6.octets().chunks(4) {
                s.push_str(&format!("{:02X}{:02X}{:02X}{:02X}", w[3], w[2], w[1], w[0]));
            }
            s + ":12B7"
        }
    }
}

/// Waits until some process holds UDP 4791 on `ip` (in the namespace `netns`, if given),
/// then a little more so that the listen after the bind is done.
pub fn wait_udp_4791(ip: IpAddr, netns: Option<&str>) {
    let key = proc_net_key(ip);
    let file = if ip.is_ipv4() {
        "/proc/net/udp"
    } else {
        "/proc/net/udp6"
    };
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let text = match netns {
            None => std::fs::read_to_string(file).unwrap_or_default(),
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "cat", file])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default(),
        };
        if text
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(key.as_str()))
        {
            std::thread::sleep(Duration::from_millis(150));
            return;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("nothing bound UDP 4791 on {ip} within 10 s");
}

/// Lines of `s` that start with `prefix`.
pub fn lines_with<'a>(s: &'a str, prefix: &str) -> Vec<&'a str> {
    s.lines().filter(|l| l.starts_with(prefix)).collect()
}
