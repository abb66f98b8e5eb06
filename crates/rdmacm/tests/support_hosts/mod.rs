//! Helpers shared by the namespace tests.
#![allow(dead_code)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_hostview::{Link, MacAddr};
use rdma_testhosts::{topologies, Host, Topology};
use rdmacm::host::{BlockingResolver, Notification, ScopedIp, Watcher};

/// Runs `f` inside `h` with a fresh blocking resolver.
pub fn with_resolver<R: Send>(h: &Host, f: impl FnOnce(&BlockingResolver) -> R + Send) -> R {
    h.run(move || {
        let r = BlockingResolver::new().expect("resolver");
        f(&r)
    })
}

/// The link named `name`.
pub fn link(r: &BlockingResolver, name: &str) -> Link {
    r.block_on(r.resolver().view().link_by_name(name))
        .unwrap_or_else(|e| panic!("link {name}: {e}"))
}

/// ifindex of `name`.
pub fn index(r: &BlockingResolver, name: &str) -> u32 {
    link(r, name).index
}

/// Waits until `name` is up and running (veth carrier takes about a second).
pub fn wait_running(r: &BlockingResolver, name: &str) {
    let t0 = Instant::now();
    while !link(r, name).is_usable() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{name} never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two hosts `a` and `b` on one link (`topologies::two_hosts_one_link`), each one's `eth0`
/// up and running.
pub fn two_hosts_running() -> Topology {
    let t = topologies::two_hosts_one_link().expect("topology");
    for h in t.hosts() {
        with_resolver(h, |r| wait_running(r, "eth0"));
    }
    t
}

/// The MAC of `dev` in host `h`.
pub fn mac_of(h: &Host, dev: &str) -> MacAddr {
    let dev = dev.to_string();
    with_resolver(h, move |r| link(r, &dev).mac.expect("mac"))
}

/// Parses a scoped address.
pub fn sip(s: &str) -> ScopedIp {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Parses an address.
pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Runs `ip ARGS` in `h`, panicking on failure.
pub fn sh(h: &Host, args: &[&str]) {
    h.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
}

/// Collects notifications until `done` holds for one of them (returns all seen so far) or
/// `limit` passes (panics).
pub fn wait_for(
    r: &BlockingResolver,
    w: &mut Watcher,
    limit: Duration,
    done: impl Fn(&Notification) -> bool,
) -> Vec<Notification> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        match r.block_on(w.next_before(deadline)) {
            Ok(n) => {
                let hit = done(&n);
                seen.push(n);
                if hit {
                    return seen;
                }
            }
            Err(e) => panic!("no matching notification ({e}); saw {seen:?}"),
        }
    }
}

/// Collects every notification within `d`.
pub fn drain(r: &BlockingResolver, w: &mut Watcher, d: Duration) -> Vec<Notification> {
    let deadline = tokio::time::Instant::now() + d;
    let mut seen = Vec::new();
    while let Ok(n) = r.block_on(w.next_before(deadline)) {
        seen.push(n);
    }
    seen
}

/// Logs to stderr when `RUST_LOG` is set (e.g. `RUST_LOG=rdmacm=debug`), for a failing
/// run to be read; nothing otherwise.
pub fn log_from_env() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}
