//! `testhosts`: build, remove and list test topologies by hand.
//!
//! * `testhosts up <topology>`: creates namespaces `rthcli-<topology>-<host>` and leaves them;
//! * `testhosts down [<topology>]`: removes them (all `rthcli-` ones without an argument);
//! * `testhosts list`: lists every namespace this crate made, and the topology names;
//! * `testhosts sweep`: removes namespaces of test processes that no longer run.

#![warn(missing_docs)]

use std::process::ExitCode;

use rdma_testhosts::{topologies, NAME_PREFIX};

fn usage() -> ExitCode {
    eprintln!("usage: testhosts up <topology> | down [<topology>] | list | sweep");
    eprintln!("topologies: {}", topologies::NAMES.join(", "));
    ExitCode::from(2)
}

fn our_namespaces() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(NAME_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["up", name] => {
            let tag = format!("{NAME_PREFIX}cli-{name}-");
            let built = topologies::builder_by_name(name).and_then(|b| b.build_with_tag(&tag));
            match built {
                Ok(topo) => {
                    for h in topo.keep() {
                        println!("{} {}", h.name(), h.netns());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("testhosts up {name}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        ["down", rest @ ..] if rest.len() <= 1 => {
            let prefix = match rest {
                [name] => format!("{NAME_PREFIX}cli-{name}-"),
                _ => format!("{NAME_PREFIX}cli-"),
            };
            let mut failed = false;
            for ns in our_namespaces()
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
            {
                let ok = std::process::Command::new("ip")
                    .args(["netns", "del", &ns])
                    .status()
                    .is_ok_and(|s| s.success());
                println!("{} {ns}", if ok { "removed" } else { "FAILED" });
                failed |= !ok;
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        ["list"] => {
            for ns in our_namespaces() {
                println!("{ns}");
            }
            println!("# topologies: {}", topologies::NAMES.join(", "));
            ExitCode::SUCCESS
        }
        ["sweep"] => {
            println!("removed {}", rdma_testhosts::sweep_stale());
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}
