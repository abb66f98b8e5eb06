//! `route_get` agrees with `ip -j route get` run in the same namespace, across the test
//! topologies, IPv4 and IPv6, with and without source and oif, failures included; and its
//! on-link-guess verdict agrees with `ip route get fibmatch`.

use std::net::IpAddr;
use std::process::Command;

use rdma_hostview::{BlockingHostView, RouteOrigin, RouteType};
use rdma_testhosts::{require_root, topologies, Topology};
use serde_json::Value;

/// One lookup: destination, optional `from`, optional `oif` name.
type Case = (&'static str, Option<&'static str>, Option<&'static str>);

fn ip_json(args: &[String]) -> Result<Value, String> {
    let out = Command::new("ip").args(args).output().unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        let e = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(e.trim_start_matches("RTNETLINK answers: ").to_string())
    }
}

fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    s[..s.find(" (os error").unwrap_or(s.len())].to_string()
}

/// Runs every case inside `host` of `topo`; returns (cases compared, on-link guesses seen).
fn compare(topo: &Topology, host: &str, cases: &[Case]) -> (usize, usize) {
    topo.host(host).run(|| {
        let hv = BlockingHostView::new().unwrap();
        let links = hv.links().unwrap();
        let name_of = |i: u32| links.iter().find(|l| l.index == i).unwrap().name.clone();
        let index_of = |n: &str| links.iter().find(|l| l.name == n).unwrap().index;
        let mut guesses = 0;
        for &(dst, from, oif) in cases {
            let what = format!(
                "[{}:{host}] ip route get {dst} from {from:?} oif {oif:?}",
                topo.name()
            );
            let mut args: Vec<String> = vec!["-j".into(), "route".into(), "get".into(), dst.into()];
            if let Some(f) = from {
                args.extend(["from".into(), f.into()]);
            }
            if let Some(o) = oif {
                args.extend(["oif".into(), o.into()]);
            }
            let ours = hv.route_get(
                dst.parse().unwrap(),
                from.map(|f| f.parse().unwrap()),
                oif.map(index_of),
            );
            let theirs = ip_json(&args);
            match (&ours, &theirs) {
                (Ok(a), Ok(j)) => {
                    let j = &j[0];
                    let kind = j["type"].as_str().unwrap_or("unicast");
                    let want_kind = match a.kind {
                        RouteType::Unicast => "unicast",
                        RouteType::Local => "local",
                        RouteType::Broadcast => "broadcast",
                        RouteType::Multicast => "multicast",
                        other => panic!("{what}: unexpected {other:?}"),
                    };
                    assert_eq!(kind, want_kind, "{what}: type; ours {a:?}, ip {j}");
                    assert_eq!(
                        j["dev"].as_str(),
                        a.oif.map(name_of).as_deref(),
                        "{what}: dev; ours {a:?}, ip {j}"
                    );
                    let ip_of = |k: &str| j[k].as_str().map(|s| s.parse::<IpAddr>().unwrap());
                    assert_eq!(
                        ip_of("prefsrc"),
                        a.prefsrc,
                        "{what}: prefsrc; ours {a:?}, ip {j}"
                    );
                    assert_eq!(
                        ip_of("gateway"),
                        a.gateway,
                        "{what}: gateway; ours {a:?}, ip {j}"
                    );
                    if let Some(o) = oif {
                        // Independent check of the on-link-guess verdict with `fibmatch`.
                        let mut fm = args.clone();
                        fm.insert(3, "fibmatch".into());
                        let fib_via_oif = match ip_json(&fm) {
                            Ok(v) => v[0]["dev"].as_str() == Some(o) || v[0]["dev"].is_null(),
                            Err(_) => false,
                        };
                        if a.kind == RouteType::Unicast {
                            assert_eq!(
                                a.origin == RouteOrigin::Fib,
                                fib_via_oif,
                                "{what}: origin {:?} vs fibmatch",
                                a.origin
                            );
                        }
                        if a.origin == RouteOrigin::OnLinkGuess {
                            guesses += 1;
                            let bound = hv.route_get_bound(
                                dst.parse().unwrap(),
                                from.map(|f| f.parse().unwrap()),
                                index_of(o),
                            );
                            assert_eq!(bound.unwrap_err().errno(), libc::EHOSTUNREACH, "{what}");
                        }
                    }
                    println!(
                        "{what}: {kind} dev {:?} src {:?} gw {:?} {:?}",
                        j["dev"], a.prefsrc, a.gateway, a.origin
                    );
                }
                (Err(e), Err(msg)) => {
                    assert_eq!(&strerror(e.errno()), msg, "{what}: errors differ ({e:?})");
                    println!("{what}: error {msg}");
                }
                _ => panic!("{what}: ours {ours:?}, ip {theirs:?}"),
            }
        }
        (cases.len(), guesses)
    })
}

#[test]
fn route_get_agrees_with_ip_route_get() {
    if !require_root("route_get_agrees_with_ip_route_get") {
        return;
    }
    let mut total = 0;
    let mut guesses = 0;
    let mut add = |(n, g): (usize, usize)| {
        total += n;
        guesses += g;
    };

    let t = topologies::two_hosts_one_link().unwrap();
    add(compare(
        &t,
        "a",
        &[
            ("192.0.2.2", None, None),
            ("192.0.2.2", Some("192.0.2.1"), None),
            ("192.0.2.2", None, Some("eth0")),
            ("192.0.2.99", None, None),
            ("192.0.2.1", None, None),
            ("127.0.0.1", None, None),
            ("127.0.0.5", Some("127.0.0.1"), None),
            ("203.0.113.9", None, None),
            ("203.0.113.9", None, Some("eth0")),
            ("203.0.113.9", None, Some("lo")),
            ("192.0.2.2", Some("198.51.100.7"), None),
            ("2001:db8:1::2", None, None),
            ("2001:db8:1::2", Some("2001:db8:1::1"), Some("eth0")),
            ("2001:db8:1::1", None, None),
            ("::1", None, None),
            ("2001:db8:9::1", None, None),
            ("2001:db8:9::1", None, Some("eth0")),
            ("fe80::2", None, Some("eth0")),
            ("fe80::2", Some("fe80::1"), Some("eth0")),
        ],
    ));
    drop(t);

    let t = topologies::two_nics_two_subnets().unwrap();
    add(compare(
        &t,
        "a",
        &[
            ("192.0.2.2", None, None),
            ("198.51.100.3", None, None),
            ("198.51.100.3", None, Some("eth0")),
            ("192.0.2.2", None, Some("eth1")),
            ("192.0.2.2", None, Some("eth0")),
            ("198.51.100.3", Some("192.0.2.1"), None),
            ("198.51.100.1", None, None),
            ("198.51.100.1", None, Some("eth0")),
            ("2001:db8:2::3", None, None),
            ("2001:db8:2::3", None, Some("eth0")),
            ("2001:db8:2::3", None, Some("eth1")),
            ("2001:db8:1::2", Some("2001:db8:2::1"), None),
            ("fe80::3", None, Some("eth1")),
            ("fe80::2", None, Some("eth0")),
        ],
    ));
    drop(t);

    let t = topologies::two_nics_same_subnet().unwrap();
    add(compare(
        &t,
        "a",
        &[
            ("192.0.2.2", None, None),
            ("192.0.2.3", None, None),
            ("192.0.2.3", None, Some("eth1")),
            ("192.0.2.2", None, Some("eth0")),
            ("192.0.2.3", Some("192.0.2.11"), None),
            ("192.0.2.11", None, None),
            ("192.0.2.11", None, Some("eth0")),
            ("2001:db8:1::3", None, None),
            ("2001:db8:1::3", None, Some("eth1")),
            ("2001:db8:1::2", Some("2001:db8:1::11"), None),
        ],
    ));
    drop(t);

    let t = topologies::link_local_only().unwrap();
    add(compare(
        &t,
        "a",
        &[
            ("fe80::2", None, Some("eth0")),
            ("fe80::2", Some("fe80::1"), Some("eth0")),
            ("fe80::1", None, Some("eth0")),
            ("2001:db8::1", None, None),
            ("192.0.2.1", None, None),
            ("192.0.2.1", None, Some("eth0")),
        ],
    ));
    drop(t);

    let t = topologies::local_route_via_lo().unwrap();
    add(compare(
        &t,
        "a",
        &[
            ("192.0.2.11", Some("198.51.100.1"), None),
            ("2001:db8:1::11", Some("2001:db8:2::1"), None),
            ("192.0.2.12", Some("198.51.100.1"), None),
            ("198.51.100.1", Some("192.0.2.11"), None),
            ("192.0.2.11", None, Some("eth1")),
            ("2001:db8:1::11", None, Some("eth1")),
        ],
    ));
    drop(t);

    let t = topologies::router_between_subnets().unwrap();
    let a = t.host("a");
    for r in [
        "unreachable 203.0.113.0/26",
        "prohibit 203.0.113.64/26",
        "blackhole 203.0.113.128/26",
        "unreachable 2001:db8:f1::/48",
        "prohibit 2001:db8:f2::/48",
        "blackhole 2001:db8:f3::/48",
    ] {
        let mut args = vec!["route", "add"];
        args.extend(r.split(' '));
        a.ip(&args).unwrap();
    }
    add(compare(
        &t,
        "a",
        &[
            ("198.51.100.2", None, None),
            ("198.51.100.2", None, Some("eth0")),
            ("198.51.100.2", Some("192.0.2.1"), None),
            ("2001:db8:2::2", None, None),
            ("2001:db8:2::2", None, Some("eth0")),
            ("192.0.2.254", None, None),
            ("203.0.113.1", None, None),
            ("203.0.113.65", None, None),
            ("203.0.113.129", None, None),
            ("203.0.113.200", None, None),
            ("203.0.113.1", None, Some("eth0")),
            ("2001:db8:f1::1", None, None),
            ("2001:db8:f2::1", None, None),
            ("2001:db8:f3::1", None, None),
        ],
    ));
    add(compare(
        &t,
        "r",
        &[
            ("192.0.2.1", None, None),
            ("198.51.100.2", None, None),
            ("198.51.100.2", None, Some("eth0")),
            ("2001:db8:1::1", None, None),
            ("2001:db8:2::2", None, Some("eth0")),
            ("192.0.2.1", Some("198.51.100.254"), None),
        ],
    ));
    add(compare(
        &t,
        "b",
        &[
            ("192.0.2.1", None, None),
            ("2001:db8:1::1", Some("2001:db8:2::2"), None),
        ],
    ));
    drop(t);

    println!("route_get: {total} cases compared with `ip -j route get`, {guesses} on-link guesses detected");
    assert!(total >= 50, "{total}");
    assert!(guesses >= 3, "{guesses}");
}
