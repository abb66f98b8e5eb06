//! One host of a topology: a network namespace and ways to run code inside it.

use std::io;
use std::process::Command;

use crate::ns;

/// A host: a network namespace with a logical name (`"a"`, `"router"`, ...).
///
/// ```no_run
/// # let topo = rdma_testhosts::topologies::two_hosts_one_link().unwrap();
/// let a = topo.host("a");
/// let n = a.run(|| std::fs::read_to_string("/proc/net/if_inet6").unwrap().lines().count());
/// assert!(n > 0);
/// ```
#[derive(Debug, Clone)]
pub struct Host {
    pub(crate) name: String,
    pub(crate) netns: String,
}

impl Host {
    /// The logical name given in the topology.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The real namespace name (usable with `ip -n` / `ip netns exec`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Runs `f` in a new thread that has entered this host's network namespace and returns its
    /// result. A panic in `f` is propagated. Sockets, netlink connections and tokio runtimes
    /// created inside `f` belong to the namespace: create runtimes inside the closure.
    pub fn run<F, R>(&self, f: F) -> R
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                ns::enter(&self.netns).unwrap_or_else(|e| panic!("setns into {}: {e}", self.netns));
                f()
            });
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// A command that runs `program` inside this host (`ip netns exec <ns> <program>`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns, program]);
        c
    }

    /// Runs `ip -n <ns> ARGS` and returns its stdout.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        let mut v = vec!["-n", self.netns.as_str()];
        v.extend_from_slice(args);
        ns::ip(&v)
    }

    /// Waits until `dev` has its carrier (`LOWER_UP`: a new veth pair takes a moment);
    /// panics after 10 s (a setup guard, not a speed target).
    ///
    /// ```no_run
    /// # let topo = rdma_testhosts::topologies::two_hosts_one_link().unwrap();
    /// topo.host("a").wait_carrier("eth0");
    /// ```
    pub fn wait_carrier(&self, dev: &str) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self
            .ip(&["-o", "link", "show", dev])
            .unwrap_or_else(|e| panic!("ip link show {dev} in {}: {e}", self.name))
            .contains("LOWER_UP")
        {
            assert!(
                std::time::Instant::now() < end,
                "{dev} of {} never came up",
                self.name
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// After an IPv6 address was added to `dev` (up): waits until the kernel routes it
    /// locally. The kernel installs the local route of a new IPv6 address from its
    /// address-configuration work queue, after `ip addr add` has returned (even with
    /// `nodad`); until then a route lookup of the address answers with the on-link prefix,
    /// and a resolution to it asks for a neighbour that never answers (seen under load:
    /// `local_route_through_lo_is_loopback_seed_001` timed out in 1 of 3 release runs).
    /// Gives up silently after 10 s (a setup guard); IPv4 and down links: nothing to wait
    /// for.
    pub(crate) fn wait_ipv6_local(&self, dev: &str, cidr: &str) {
        let Some(addr) = cidr.split('/').next().filter(|a| a.contains(':')) else {
            return;
        };
        let up = self.ip(&["-o", "link", "show", dev]).is_ok_and(|l| {
            l.split('>')
                .next()
                .is_some_and(|f| f.contains(",UP") || f.contains("<UP"))
        });
        if !up {
            return;
        }
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < end {
            let local = self
                .ip(&["-6", "route", "show", "table", "local", addr])
                .is_ok_and(|r| r.contains("local"));
            if local {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Sets a sysctl under /proc/sys/net inside this host, e.g.
    /// `set_sysctl("net/ipv4/ip_forward", "1")`.
    pub fn set_sysctl(&self, path: &str, value: &str) -> io::Result<()> {
        let p = format!("/proc/sys/{path}");
        let v = value.to_string();
        self.run(move || std::fs::write(&p, v))
    }
}
