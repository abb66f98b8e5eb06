//! `ibv_reg_mr` of memalign'd memory (perftest's buffers) over our libraries:
//! `tests/c/reg_in_place.c` checks that a page-aligned buffer moves onto a region file in
//! place while registered, that an RDMA WRITE from it over a host-local rdma_cm connection
//! lands and was pulled (its QPs' `pulls_sent`/`pulls_done`, read from the program's own
//! inspection socket), and that `ibv_dereg_mr` leaves private memory with the same bytes; a
//! malloc'd (unaligned) buffer stays where it is and its WRITE carries its data. With
//! `RDMA_SOFT_PULL_IN_PLACE=off` nothing moves or is pulled and everything else holds.

mod support;

use std::process::Command;

fn run(port: &str, off: bool) -> String {
    let dir = std::env::temp_dir().join(format!("rdma-cabi-inplace-{}-{port}", std::process::id()));
    let exe = support::build_c(&dir, "reg_in_place", &["-lrdmacm", "-libverbs"]);
    // the program reads its own counters (pulls_sent, pulls_done) from its inspection socket
    let inspect = dir.join("inspect");
    std::fs::create_dir_all(&inspect).unwrap();
    let mut c = Command::new(&exe);
    c.arg(port)
        .env("LD_LIBRARY_PATH", support::lib_dir())
        .env("RDMA_SOFT_INSPECT", "on")
        .env("RDMA_SOFT_INSPECT_DIR", &inspect);
    if off {
        c.arg("kept").env("RDMA_SOFT_PULL_IN_PLACE", "off");
    }
    let (status, text) = support::finish(support::start(c));
    std::fs::remove_dir_all(&dir).ok();
    assert!(status.success(), "{text}");
    let checks = [
        "moved",
        "unaligned",
        "write",
        "pulled",
        "write unaligned",
        "not pulled",
        "dereg",
    ];
    for check in checks {
        assert!(text.contains(&format!("ok {check}\n")), "{check}: {text}");
    }
    assert!(text.ends_with("all passed\n"), "{text}");
    text
}

#[test]
fn a_memaligned_buffer_moves_in_place_while_registered() {
    run("17597", false);
    // one program at a time (C ABI tests never run two at once)
    run("17598", true);
}
