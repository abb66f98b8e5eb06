//! udaddy's command line (its SIDR + datagram run is in `tools_netns.rs`: on loopback a UD
//! QP opens UDP 4791 on every address of the `lo` device, which other processes hold).

mod procs;

use std::process::Command;
use std::time::Duration;

use procs::spawn;

const UDADDY: &str = env!("CARGO_BIN_EXE_udaddy");
const T: Duration = Duration::from_secs(20);

fn udaddy(args: &[&str]) -> Command {
    let mut c = Command::new(UDADDY);
    c.args(args);
    c
}

#[test]
fn udaddy_bad_usage_fails_in_one_line() {
    for args in [
        &["-z"][..],
        &["-C", "-1"][..],
        &["-c", "0"][..],
        &["-p"][..],
        &["-s", "no.such.host.invalid"][..],
    ] {
        let o = spawn(udaddy(args), "udaddy").wait(T);
        assert_eq!(o.code, Some(1), "{args:?}: {o:#?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:#?}");
        assert!(o.stderr.starts_with("udaddy: "), "{args:?}: {o:#?}");
    }
    let h = spawn(udaddy(&["-h"]), "-h").wait(T);
    h.ok("-h");
    assert!(h
        .stdout
        .starts_with("usage: udaddy\n\t[-s server_address]\n"));
}
