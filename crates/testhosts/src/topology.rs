//! Building and tearing down a topology of namespaces and veth pairs.

use std::fmt;

use crate::host::Host;
use crate::{nl, ns};

/// A failed topology operation: the `ip` command or sysctl that failed and why.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

#[derive(Debug, Clone)]
enum Step {
    Link {
        a: String,
        a_if: String,
        b: String,
        b_if: String,
    },
    Addr {
        host: String,
        dev: String,
        cidr: String,
    },
    Route {
        host: String,
        args: Vec<String>,
    },
    Forwarding {
        host: String,
    },
}

/// Describes a topology; [`TopologyBuilder::build`] creates it.
///
/// ```no_run
/// use rdma_testhosts::Topology;
/// let topo = Topology::builder("demo")
///     .host("a")
///     .host("b")
///     .link("a", "eth0", "b", "eth0")
///     .addr("a", "eth0", "192.0.2.1/24")
///     .addr("b", "eth0", "192.0.2.2/24")
///     .addr("a", "eth0", "2001:db8:1::1/64")
///     .build()
///     .unwrap();
/// assert_eq!(topo.hosts().len(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    name: String,
    hosts: Vec<String>,
    steps: Vec<Step>,
}

impl TopologyBuilder {
    /// Adds a host (a namespace with `lo` up and IPv6 DAD off).
    pub fn host(mut self, name: &str) -> Self {
        self.hosts.push(name.to_string());
        self
    }

    /// Joins `a:a_if` and `b:b_if` by a veth pair; both ends are set up.
    pub fn link(mut self, a: &str, a_if: &str, b: &str, b_if: &str) -> Self {
        self.steps.push(Step::Link {
            a: a.into(),
            a_if: a_if.into(),
            b: b.into(),
            b_if: b_if.into(),
        });
        self
    }

    /// Adds an address (`ADDR/LEN`) to `host:dev`; IPv6 addresses get `nodad`, and the
    /// build waits until the kernel routes one locally (on an up link).
    pub fn addr(mut self, host: &str, dev: &str, cidr: &str) -> Self {
        self.steps.push(Step::Addr {
            host: host.into(),
            dev: dev.into(),
            cidr: cidr.into(),
        });
        self
    }

    /// Adds a route: `args` as for `ip route add`, e.g. `"198.51.100.0/24 via 192.0.2.254"`.
    pub fn route(mut self, host: &str, args: &str) -> Self {
        self.steps.push(Step::Route {
            host: host.into(),
            args: args.split_whitespace().map(String::from).collect(),
        });
        self
    }

    /// Turns on IPv4 and IPv6 forwarding in `host`.
    pub fn forwarding(mut self, host: &str) -> Self {
        self.steps.push(Step::Forwarding { host: host.into() });
        self
    }

    /// Creates the namespaces, links, addresses and routes. On error everything created so far
    /// is removed again.
    ///
    /// The first build of a process also sweeps away namespaces left by test processes that
    /// were killed before their `Drop` could run ([`crate::sweep_stale`]).
    pub fn build(self) -> Result<Topology, Error> {
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(|| {
            ns::sweep_stale();
        });
        let tag = ns::unique_tag();
        self.build_with_tag(&tag)
    }

    /// Like [`TopologyBuilder::build`] with namespaces named `<tag><host>`; used by the
    /// `testhosts` command for topologies that outlive the process (see [`Topology::keep`]).
    pub fn build_with_tag(self, tag: &str) -> Result<Topology, Error> {
        let mut topo = Topology {
            name: self.name,
            hosts: Vec::new(),
        };
        for h in &self.hosts {
            // Keep namespace names short and free of odd characters.
            let clean: String = h.chars().filter(char::is_ascii_alphanumeric).collect();
            let host = Host {
                name: h.clone(),
                netns: format!("{tag}{clean}"),
            };
            ns::ip(&["netns", "add", &host.netns])?;
            topo.hosts.push(host.clone());
            host.run(|| nl::link_up("lo"))?;
            for conf in ["all", "default"] {
                host.set_sysctl(&format!("net/ipv6/conf/{conf}/accept_dad"), "0")?;
            }
        }
        for step in &self.steps {
            topo.apply(step)?;
        }
        Ok(topo)
    }
}

/// A built topology; dropping it deletes every namespace (and with them the veth pairs).
#[derive(Debug)]
pub struct Topology {
    name: String,
    hosts: Vec<Host>,
}

impl Topology {
    /// Starts describing a topology; `name` is for messages only.
    pub fn builder(name: &str) -> TopologyBuilder {
        TopologyBuilder {
            name: name.to_string(),
            hosts: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The name given to [`Topology::builder`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All hosts, in the order they were added.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host with logical name `name`. Panics if there is none (a test bug).
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("topology {} has no host {name}", self.name))
    }

    /// Keeps the namespaces after this value is dropped (for manual use); returns the hosts.
    pub fn keep(mut self) -> Vec<Host> {
        std::mem::take(&mut self.hosts)
    }

    fn apply(&self, step: &Step) -> Result<(), Error> {
        match step {
            Step::Link { a, a_if, b, b_if } => {
                let (ha, hb) = (self.host(a), self.host(b));
                nl::veth(a_if, &ha.netns, b_if, &hb.netns)?;
                ha.run(|| nl::link_up(a_if))?;
                hb.run(|| nl::link_up(b_if))?;
            }
            Step::Addr { host, dev, cidr } => {
                let h = self.host(host);
                h.run(|| nl::addr_add(dev, cidr))?;
                h.wait_ipv6_local(dev, cidr);
            }
            Step::Route { host, args } => match nl::Route::parse(args) {
                Some(r) => self.host(host).run(|| r.add())?,
                // Forms other than `DEST via GW [dev DEV]` / `DEST dev DEV` (metrics, types,
                // tables, ...) are handed to `ip route add` as given rather than parsed here.
                None => {
                    let mut v = vec!["route", "add"];
                    v.extend(args.iter().map(String::as_str));
                    self.host(host).ip(&v)?;
                }
            },
            Step::Forwarding { host } => {
                let h = self.host(host);
                h.set_sysctl("net/ipv4/ip_forward", "1")?;
                h.set_sysctl("net/ipv6/conf/all/forwarding", "1")?;
            }
        }
        Ok(())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Err(e) = ns::ip(&["netns", "del", &h.netns]) {
                eprintln!("testhosts: removing {}: {e}", h.netns);
            }
        }
    }
}
