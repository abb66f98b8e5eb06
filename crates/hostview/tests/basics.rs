//! Links and addresses as the kernel reports them, through the async and blocking APIs.

use std::net::IpAddr;

use rdma_hostview::{BlockingHostView, HostView, Scope};
use rdma_testhosts::{require_root, topologies};

#[test]
fn links_and_addresses_of_a_two_nic_host() {
    if !require_root("links_and_addresses_of_a_two_nic_host") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    t.host("a").run(|| {
        let hv = BlockingHostView::new().unwrap();
        let links = hv.links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        assert!(lo.flags.loopback && lo.flags.up && !lo.needs_neighbour());
        let eth0 = hv.link_by_name("eth0").unwrap();
        let eth1 = hv.link_by_name("eth1").unwrap();
        assert!(eth0.is_usable() && eth1.is_usable() && eth0.needs_neighbour());
        assert!(eth0.mac.is_some_and(|m| !m.is_zero()));
        assert_eq!(eth0.mtu, 1500);
        assert_eq!(hv.link(eth1.index).unwrap(), eth1);
        assert_eq!(hv.link(4242).unwrap_err().errno(), libc::ENODEV);
        assert_eq!(hv.link_by_name("nope").unwrap_err().errno(), libc::ENODEV);

        let addrs = hv.addresses().unwrap();
        let find = |ip: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            addrs.iter().find(|a| a.addr == ip).cloned().unwrap()
        };
        let a = find("198.51.100.1");
        assert_eq!(
            (a.link, a.prefix_len, a.scope),
            (eth1.index, 24, Scope::Global)
        );
        let ll = find("fe80::11");
        assert!(ll.is_link_local() && ll.scope == Scope::Link && ll.link == eth1.index);
        assert_eq!(find("127.0.0.1").scope, Scope::Host);
        assert_eq!(find("2001:db8:1::1").link, eth0.index);

        let holder = |ip: &str, scope| hv.link_holding(ip.parse().unwrap(), scope);
        assert_eq!(holder("192.0.2.1", None).unwrap().name, "eth0");
        assert_eq!(holder("2001:db8:2::1", None).unwrap().name, "eth1");
        assert_eq!(holder("fe80::1", Some(eth0.index)).unwrap().name, "eth0");
        assert_eq!(
            holder("fe80::1", Some(eth1.index)).unwrap_err().errno(),
            libc::EADDRNOTAVAIL
        );
        assert_eq!(
            holder("203.0.113.1", None).unwrap_err().errno(),
            libc::EADDRNOTAVAIL
        );

        let routes = hv.routes().unwrap();
        assert!(routes
            .iter()
            .any(|r| r.dst == "198.51.100.0".parse::<IpAddr>().unwrap()
                && r.dst_len == 24
                && r.goes_through(eth1.index)));
        let e = hv
            .route_get(
                "192.0.2.2".parse().unwrap(),
                Some("2001:db8:1::1".parse().unwrap()),
                None,
            )
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        // The fail-fast rule of DESIGN.md: bound to eth1, no route to subnet 1 through it.
        let e = hv
            .route_get_bound("192.0.2.2".parse().unwrap(), None, eth1.index)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EHOSTUNREACH);
        let ok = hv
            .route_get_bound("192.0.2.2".parse().unwrap(), None, eth0.index)
            .unwrap();
        assert_eq!(ok.oif, Some(eth0.index));
    });
}

#[test]
fn async_api_inside_a_host() {
    if !require_root("async_api_inside_a_host") {
        return;
    }
    let t = topologies::router_between_subnets().unwrap();
    t.host("a").run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let hv = HostView::new().unwrap();
            let r = hv
                .route_get("198.51.100.2".parse().unwrap(), None, None)
                .await
                .unwrap();
            assert_eq!(r.gateway, Some("192.0.2.254".parse().unwrap()));
            assert_eq!(r.next_hop(), "192.0.2.254".parse::<IpAddr>().unwrap());
            let mac = hv
                .resolve_neighbour(
                    r.oif.unwrap(),
                    r.next_hop(),
                    std::time::Duration::from_secs(3),
                )
                .await
                .unwrap();
            assert!(!mac.is_zero());
        });
    });
}
