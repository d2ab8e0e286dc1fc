//! The bench tools that must keep working as lb-ebpf changes (root, kernel).

/// `bench insns` interprets lb_xdp on every micro-bench path against the real maps; it panics
/// if its interpreter and the kernel disagree on a verdict or an output frame (e.g. after a
/// change to lb-ebpf uses an instruction or helper it does not know).
#[test]
fn insns_interpreter_agrees_with_the_kernel() {
    let doc = lb_tests::bench::insns::measure();
    let paths = doc["paths"].as_array().expect("paths");
    let total = |name: &str| {
        paths
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["profile"]["total"].as_u64())
            .unwrap_or_else(|| panic!("no count for {name}"))
    };
    let baseline = total("baseline");
    for name in [
        "pass_non_vip",
        "tcp_established",
        "tcp6_established",
        "tcp_new_flow",
        "tcp_midstream_new",
    ] {
        assert!(
            total(name) > baseline,
            "{name} executes more than the MAC swap"
        );
    }
    // A new flow does strictly more than an established one (hash, Maglev, table write).
    // (`tcp_new_flow` repeats one SYN, which finds its own entry since a SYN is looked up like
    // any packet: the first packet of a flow never seen is `tcp_midstream_new`.)
    assert!(total("tcp_midstream_new") > total("tcp_established"));
}
