//! Checks that the golden-vector harness sees every RoCEv2 packet of the captures.
mod support;

#[test]
fn harness_reads_every_capture() {
    let pkts = support::roce_packets();
    let probes = pkts.iter().filter(|p| p.probe).count();
    for case in support::cases() {
        let n = pkts.iter().filter(|p| p.case == case).count();
        println!("{case}: {n} RoCEv2 packets");
        assert!(n > 0, "{case} has no RoCEv2 packet");
    }
    println!("total {} ({} probes)", pkts.len(), probes);
    // rping-2vm holds exactly 4 malformed probes (the captures' README)
    assert_eq!(probes, 4, "the malformed probes of rping-2vm");
    for p in &pkts {
        assert!(
            p.value("Base Transport Header").is_some() || p.probe,
            "{}",
            p.label()
        );
        let opcode = support::paren_num(p.value("Opcode").expect("opcode line"));
        assert_eq!(opcode, u64::from(p.payload[0]), "{}", p.label());
    }
}
