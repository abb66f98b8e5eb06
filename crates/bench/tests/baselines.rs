//! Runs each baseline binary briefly and checks that its `--json` line parses and is
//! plausible. No timing thresholds: the machine may be loaded.

use std::process::{Command, Output};

use serde_json::Value;

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"))
}

fn json(bin: &str, args: &[&str]) -> Value {
    let out = run(bin, args);
    assert!(
        out.status.success(),
        "{bin} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "--json prints one line, got {stdout:?}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("bad JSON {stdout:?}: {e}"))
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
    assert!(x > 0.0 && x.is_finite(), "{key} = {x} in {v}");
    x
}

#[test]
fn udp_pingpong_json() {
    let v = json(
        env!("CARGO_BIN_EXE_udp-pingpong"),
        &["-n", "300", "-w", "20", "--json", "-q"],
    );
    assert_eq!(v["tool"], "udp-pingpong");
    assert_eq!(v["size"], 64);
    let results = v["results"].as_array().expect("results array");
    let modes: Vec<&str> = results
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["blocking", "busy-poll"]);
    for r in results {
        let min = positive(r, "rtt_min_us");
        let median = positive(r, "rtt_median_us");
        let p99 = positive(r, "rtt_p99_us");
        let p999 = positive(r, "rtt_p999_us");
        positive(r, "rtt_avg_us");
        assert!(min <= median && median <= p99 && p99 <= p999, "{r}");
        let half = positive(r, "one_way_median_us");
        assert!((half * 2.0 - median).abs() < 0.01, "{r}");
    }
}

#[test]
fn tcp_stream_json() {
    let v = json(
        env!("CARGO_BIN_EXE_tcp-stream"),
        &["-d", "0.2", "--json", "-q"],
    );
    assert_eq!(v["tool"], "tcp-stream");
    let mb = positive(&v, "mb_per_s");
    let gb = positive(&v, "gbit_per_s");
    positive(&v, "seconds");
    assert!(v["bytes"].as_u64().unwrap() > 0);
    // both figures are the same rate in different units
    assert!((mb * 1048576.0 * 8.0 / 1e9 - gb).abs() / gb < 1e-3, "{v}");
}

#[test]
fn tcp_connect_json() {
    let v = json(
        env!("CARGO_BIN_EXE_tcp-connect"),
        &["-n", "50", "-c", "4", "--json", "-q"],
    );
    assert_eq!(v["tool"], "tcp-connect");
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["mode"], "sequential");
    assert_eq!(results[1]["mode"], "concurrent");
    assert_eq!(results[1]["concurrency"], 4);
    for r in results {
        assert_eq!(r["count"], 50);
        positive(r, "conn_per_s");
        positive(r, "us_per_conn");
        positive(r, "cycle_median_us");
    }
}

#[test]
fn two_processes() {
    // ports chosen away from the defaults so a manual run does not collide
    let server = Command::new(env!("CARGO_BIN_EXE_tcp-stream"))
        .args(["--server", "127.0.0.1:18626", "-q"])
        .spawn()
        .expect("server");
    let mut server = server;
    let mut v = None;
    for _ in 0..50 {
        let out = run(
            env!("CARGO_BIN_EXE_tcp-stream"),
            &["--client", "127.0.0.1:18626", "-d", "0.1", "--json", "-q"],
        );
        if out.status.success() {
            v = Some(serde_json::from_slice::<Value>(&out.stdout).expect("JSON"));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = server.wait().expect("server exit");
    assert!(status.success());
    positive(&v.expect("client never connected"), "mb_per_s");
}

#[test]
fn bad_input_is_one_line_and_nonzero() {
    for (bin, args) in [
        (env!("CARGO_BIN_EXE_udp-pingpong"), &["-n", "abc"][..]),
        (
            env!("CARGO_BIN_EXE_udp-pingpong"),
            &["--client", "192.0.2.1:5"][..],
        ),
        (
            env!("CARGO_BIN_EXE_udp-pingpong"),
            &["--mode", "sideways"][..],
        ),
        (env!("CARGO_BIN_EXE_tcp-stream"), &["-d"][..]),
        (env!("CARGO_BIN_EXE_tcp-stream"), &["extra"][..]),
        (env!("CARGO_BIN_EXE_tcp-connect"), &["-c", "0"][..]),
        (
            env!("CARGO_BIN_EXE_tcp-connect"),
            &["--bind", "8.8.8.8"][..],
        ),
    ] {
        let out = run(bin, args);
        assert!(!out.status.success(), "{bin} {args:?} succeeded");
        assert!(out.stdout.is_empty(), "{bin} {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{bin} {args:?}: {err}");
        assert!(!err.contains("panicked"), "{bin} {args:?}: {err}");
    }
    for bin in [
        env!("CARGO_BIN_EXE_udp-pingpong"),
        env!("CARGO_BIN_EXE_tcp-stream"),
        env!("CARGO_BIN_EXE_tcp-connect"),
    ] {
        let out = run(bin, &["-h"]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
    }
}
