//! The loop guard between two real lbd nodes in network namespaces. Both nodes believe they own
//! the VIP (static ownership: a split brain) and their tables deliberately disagree: node a's
//! only backend is node b, node b's only backend is node a. Without the guard a SYN would bounce
//! between them forever (an L2 rewrite never decrements the TTL). With it, b sees a frame from a
//! (its backend, so another lbd node) and gives it to its local stack: every SYN is forwarded
//! exactly once and the connection is served by the other node. Needs root; `cargo xtask test`.

use std::time::Duration;

use lb_tests::{
    bin_dir,
    lab::{Lab, wait_for},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
const VIP: &str = "10.81.0.100";
const PORT: &str = "8080";

fn config(lab: &Lab, name: &str, socket: &str, backend: &str) -> String {
    format!(
        "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\n\n[[vips]]\nname = \"web\"\naddress = \"{VIP}\"\nports = [{PORT}]\nowned = true\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n[[vips.backends]]\naddress = \"{}\"\n",
        lab.node(backend).v4
    )
}

fn counters(socket: &str) -> Value {
    lb_tests::lbctl_json(socket, &["stats"]).unwrap_or(Value::Null)["counters"].clone()
}

#[test]
fn two_nodes_whose_tables_disagree_forward_a_syn_at_most_once() {
    let mut lab = Lab::new("lp");
    lab.add_node("client", "10.81.0.1", "fd81::1");
    lab.add_node("lba", "10.81.0.11", "fd81::11");
    lab.add_node("lbb", "10.81.0.12", "fd81::12");
    for n in ["lba", "lbb"] {
        lab.make_dsr_backend(n, &[VIP]);
        lab.spawn(n, &format!("server-{n}"), LABNODE, &["serve-id", PORT, n]);
    }
    let mut sockets = Vec::new();
    for (n, other) in [("lba", "lbb"), ("lbb", "lba")] {
        let name = format!("{}_{n}", lab.prefix.replace('-', "_"));
        let socket = lab.dir.join(format!("{n}.sock")).display().to_string();
        let cfg = lab.dir.join(format!("{n}.toml"));
        std::fs::write(&cfg, config(&lab, &name, &socket, other)).unwrap();
        lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(&name));
        lab.spawn(
            n,
            &format!("lbd-{n}"),
            bin_dir().join("lbd"),
            &["--config", cfg.to_str().unwrap()],
        );
        sockets.push(socket);
    }
    for s in &sockets {
        let active = wait_for(Duration::from_secs(20), || {
            let rows = lb_tests::lbctl_json(s, &["backends", "list"])?;
            (rows[0]["state"] == "active").then_some(())
        });
        assert!(
            active.is_some(),
            "backend active\n{}\n{}",
            lab.log("lbd-lba"),
            lab.log("lbd-lbb")
        );
    }
    let out = lab.run(
        "client",
        LABNODE,
        &["connect-many", VIP, PORT, "50", "4", "3000"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let (a, b) = (counters(&sockets[0]), counters(&sockets[1]));
    println!(
        "client: {v}\nnode a: forwarded {} pass_from_peer {}\nnode b: forwarded {} pass_from_peer {}",
        a["forwarded"], a["pass_from_peer"], b["forwarded"], b["pass_from_peer"]
    );
    assert_eq!(v["ok"], 50, "every connection is served: {v}");
    // Both nodes hold the VIP (static ownership on both: lbd adds and announces it), so the
    // client reaches whichever answered its ARP last, and that may change during the run.
    // Whatever reached a node was forwarded once, to the other node, whose loop guard gave
    // every such frame to its local stack: nothing is forwarded twice.
    let fwd = |c: &Value| c["forwarded"].as_u64().unwrap();
    let guard = |c: &Value| c["pass_from_peer"].as_u64().unwrap();
    assert!(
        fwd(&a) + fwd(&b) >= 150,
        "each client packet was forwarded once ({} + {})",
        fwd(&a),
        fwd(&b)
    );
    assert_eq!(
        guard(&b),
        fwd(&a),
        "everything a forwarded ended at b's stack"
    );
    assert_eq!(
        guard(&a),
        fwd(&b),
        "everything b forwarded ended at a's stack"
    );
    let served = v["by_id"]["lba"].as_u64().unwrap_or(0) + v["by_id"]["lbb"].as_u64().unwrap_or(0);
    assert_eq!(served, 50, "every connection served by a local stack: {v}");
    // The flood view sits next to the table size in `lbctl stats`.
    let stats = lb_tests::lbctl_json(&sockets[0], &["stats"]).unwrap();
    assert_eq!(stats["syn_flood"]["conntrack_size"], 262144, "{stats}");
    assert_eq!(stats["syn_flood"]["active"], false, "{stats}");
    let text = String::from_utf8_lossy(&lb_tests::lbctl_output(&sockets[0], &["stats"]).stdout)
        .to_string();
    assert!(
        text.contains("new connections/s against 262144 entries"),
        "{text}"
    );
}
