//! Namespace plumbing: names, root check, `ip` invocations, `setns()`, stale sweep.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace this crate creates: `rth<pid>x<counter><host>`.
pub const NAME_PREFIX: &str = "rth";

/// Where `ip netns` keeps its namespace handles.
pub(crate) const NETNS_DIR: &str = "/var/run/netns";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// True when the process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The environment variable that turns a skip into a failure: with `RDMA_REQUIRE_ROOT=1`
/// (CI sets it), [`require_root`] and [`skip`] panic instead of letting a test pass having
/// tested nothing.
pub const REQUIRE_ROOT_ENV: &str = "RDMA_REQUIRE_ROOT";

/// Whether skips are failures here ([`REQUIRE_ROOT_ENV`] set to anything but `0` or empty).
pub fn skips_fail() -> bool {
    std::env::var(REQUIRE_ROOT_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A test that cannot run here: prints `SKIPPED: <test>: <why>` and returns, or panics with
/// that text when [`REQUIRE_ROOT_ENV`] is set (a CI run that skips is a failed run).
///
/// ```no_run
/// let have_feature = false;
/// if !have_feature {
///     rdma_testhosts::skip("my_test", "this kernel lacks the feature");
///     return;
/// }
/// ```
pub fn skip(test: &str, why: &str) {
    if skips_fail() {
        panic!("SKIPPED: {test}: {why}, and {REQUIRE_ROOT_ENV} makes a skip a failure");
    }
    eprintln!("SKIPPED: {test}: {why}; not run");
    println!("SKIPPED: {test}: {why}; not run");
}

/// Returns true when root; otherwise prints `SKIPPED: <test> needs root` and returns false
/// (panics instead when [`REQUIRE_ROOT_ENV`] is set: see [`skip`]).
///
/// ```
/// if !rdma_testhosts::require_root("my_test") {
///     return;
/// }
/// ```
pub fn require_root(test: &str) -> bool {
    if is_root() {
        true
    } else {
        skip(test, "needs root (network namespaces)");
        false
    }
}

/// A fresh, process-unique tag for one topology: `rth<pid>x<counter>`.
pub(crate) fn unique_tag() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{NAME_PREFIX}{}x{n}", std::process::id())
}

/// Runs `ip ARGS`, returning stdout or an error carrying stderr.
///
/// Links, addresses and the usual routes go over rtnetlink (`nl.rs`); `ip` stays for what
/// rtnetlink has no equivalent of here: `ip netns add/del` (a named namespace is an
/// unshare(CLONE_NEWNET) bind-mounted on /var/run/netns/NAME under a shared mount, which
/// `ip netns exec` and other tools rely on; rtnetlink's `NetworkNamespace::add` forks the
/// calling process to do it, unsafe in a multi-threaded test binary), `ip netns exec` in
/// [`crate::Host::command`] (it also mounts a /sys for the namespace), and [`crate::Host::ip`],
/// the public passthrough that tests use for arbitrary `ip` commands.
pub(crate) fn ip(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Moves the calling thread into the network namespace `ns` (a name under /var/run/netns).
pub(crate) fn enter(ns: &str) -> io::Result<()> {
    let f = File::open(format!("{NETNS_DIR}/{ns}"))?;
    // SAFETY: f is an open namespace fd; setns only affects the calling thread here
    // (CLONE_NEWNET on a thread is allowed and per-thread).
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Parses `rth<pid>x...` and returns the pid.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || !rest[digits.len()..].starts_with('x') {
        return None;
    }
    digits.parse().ok()
}

/// Deletes namespaces named `rth<pid>x...` whose pid no longer exists. Returns how many.
///
/// Namespaces of live processes (other tests running right now) are left alone.
pub fn sweep_stale() -> usize {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return 0;
    };
    let mut n = 0;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = owner_pid(&name) {
            if !pid_alive(pid) && ip(&["netns", "del", &name]).is_ok() {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("rth123x0a"), Some(123));
        assert_eq!(owner_pid("rth123"), None);
        assert_eq!(owner_pid("rthx1"), None);
        assert_eq!(owner_pid("other123x0"), None);
    }

    #[test]
    fn tags_are_unique() {
        assert_ne!(unique_tag(), unique_tag());
    }
}
