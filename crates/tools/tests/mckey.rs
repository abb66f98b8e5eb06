//! mckey as processes on namespace hosts bridged on one segment (root; SKIPPED otherwise):
//! a sender on `a` and receivers on `b` and `c`, with rdma-core's output lines; and its
//! command line.

mod procs;

use std::process::Command;
use std::time::Duration;

use procs::spawn;
use rdma_testhosts::{require_root, Host, Topology};

const MCKEY: &str = env!("CARGO_BIN_EXE_mckey");
const T: Duration = Duration::from_secs(30);

fn mckey(h: Option<&Host>, args: &[&str]) -> Command {
    let mut c = match h {
        Some(h) => h.command(MCKEY),
        None => Command::new(MCKEY),
    };
    c.args(args);
    c
}

#[test]
fn mckey_usage_and_bad_input() {
    let h = spawn(mckey(None, &["-h"]), "-h").wait(T);
    h.ok("-h");
    assert!(
        h.stdout
            .starts_with("usage: mckey\n\t-m multicast_address\n"),
        "{h:#?}"
    );
    // -M needs -b, as rdma-core's
    let m = spawn(mckey(None, &["-M", "::ffff:239.1.2.3"]), "-M").wait(T);
    assert_eq!(m.code, Some(1), "{m:#?}");
    assert_eq!(
        m.stdout.trim(),
        "unmapped multicast address requires binding to source address"
    );
    let z = spawn(mckey(None, &["-z"]), "-z").wait(T);
    assert_eq!(z.code, Some(1), "{z:#?}");
    assert!(z.stderr.starts_with("mckey: "), "{z:#?}");
}

#[test]
fn mckey_sender_to_receivers_on_two_hosts() {
    if !require_root("mckey_sender_to_receivers_on_two_hosts") {
        return;
    }
    let mut b = Topology::builder("mckey");
    for (h, n) in [("a", 1), ("b", 2), ("c", 3)] {
        b = b.host(h).link("sw", &format!("p{h}"), h, "eth0").addr(
            h,
            "eth0",
            &format!("192.0.2.{n}/24"),
        );
    }
    let t = b.host("sw").build().expect("topology");
    let sw = t.host("sw");
    sw.ip(&[
        "link",
        "add",
        "br0",
        "type",
        "bridge",
        "mcast_snooping",
        "0",
    ])
    .unwrap();
    for p in ["pa", "pb", "pc"] {
        sw.ip(&["link", "set", p, "master", "br0"]).unwrap();
        sw.ip(&["link", "set", p, "up"]).unwrap();
    }
    sw.ip(&["link", "set", "br0", "up"]).unwrap();
    for h in ["a", "b", "c"] {
        t.host(h).wait_carrier("eth0");
    }
    let recv = |h: &str, ip: &str| {
        spawn(
            mckey(Some(t.host(h)), &["-m", "239.1.2.3", "-b", ip, "-C", "20"]),
            h,
        )
    };
    let rb = recv("b", "192.0.2.2");
    let rc = recv("c", "192.0.2.3");
    // the receivers join at once; the sender's 3 s pause covers their start
    std::thread::sleep(Duration::from_millis(500));
    let s = spawn(
        mckey(
            Some(t.host("a")),
            &["-m", "239.1.2.3", "-b", "192.0.2.1", "-s", "-C", "20"],
        ),
        "sender",
    )
    .wait(T);
    s.ok("sender");
    assert_eq!(
        s.stdout,
        "mckey: starting client\nmckey: joining\nmckey: joined dgid: ::ffff:239.1.2.3 mlid 0x0 sl 0\n\
         initiating data transfers\ndata transfers complete\ntest complete\nreturn status 0\n"
    );
    for (who, r) in [("b", rb), ("c", rc)] {
        let o = r.wait(T);
        o.ok(who);
        assert_eq!(
            o.stdout,
            "mckey: starting server\nmckey: joining\nmckey: joined dgid: ::ffff:239.1.2.3 mlid 0x0 sl 0\n\
             receiving data transfers\ndata transfers complete\ntest complete\nreturn status 0\n",
            "{who}"
        );
    }
}
