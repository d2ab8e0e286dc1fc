//! `cargo xtask demo`: a self-contained lab of network namespaces that shows lb at work.
//! Everything it creates (namespaces, links, pinned maps, processes) is removed at the end.
use std::{collections::BTreeMap, process::Command, time::Instant};

use lb_tests::{
    bin_dir,
    dsr::{self, VIP4, VIP6},
};

fn say(step: &str) {
    println!("\n\x1b[1m==> {step}\x1b[0m");
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("demo: needs root (XDP and network namespaces)");
        std::process::exit(1);
    }
    let t0 = Instant::now();
    let labnode = bin_dir().join("labnode").display().to_string();

    say("Building the lab: client, LB node (lbd, XDP), three DSR backends on one bridge");
    let l = dsr::setup(&labnode);
    for n in ["client", "lb", "b1", "b2", "b3"] {
        let node = l.lab.node(n);
        println!("  {:<7} {:<12} {:<10} {}", n, node.v4, node.v6, node.mac);
    }
    println!(
        "  VIPs {VIP4}:{} and [{VIP6}]:{} owned by lb; backends b1, b2, b3 with weights 1, 1, 2",
        dsr::PORT,
        dsr::PORT
    );

    for vip in [VIP4, VIP6] {
        say(&format!("2000 TCP connections from the client to {vip}"));
        let (lb_rx0, _) = l.lab.counters("lb");
        let (_, client_tx0) = l.lab.counters("client");
        let r = l.connect_many(&labnode, vip, 2000);
        let by_id: BTreeMap<String, u64> =
            serde_json::from_value(r["by_id"].clone()).unwrap_or_default();
        println!(
            "  completed {} failed {} in {} ms",
            r["ok"], r["failed"], r["elapsed_ms"]
        );
        for (id, w) in [("b1", 1.0), ("b2", 1.0), ("b3", 2.0)] {
            let got = by_id.get(id).copied().unwrap_or(0);
            println!(
                "  {id}: {got:>5} connections ({:.1} %, weight share {:.1} %)",
                got as f64 / 20.0,
                w / 4.0 * 100.0
            );
        }
        let (lb_rx1, _) = l.lab.counters("lb");
        let (_, client_tx1) = l.lab.counters("client");
        println!(
            "  direct server return: the LB node received {} packets for the {} the client sent; replies bypassed it",
            lb_rx1 - lb_rx0,
            client_tx1 - client_tx0
        );
    }

    say("lbctl backends list");
    let out = Command::new(bin_dir().join("lbctl"))
        .args(["--socket", &l.socket, "backends", "list"])
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));

    say("lbctl stats (XDP counters by verdict and reason)");
    let out = Command::new(bin_dir().join("lbctl"))
        .args(["--socket", &l.socket, "stats"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if !line.ends_with(" 0") {
            println!("  {line}");
        }
    }

    say("Cleaning up");
    drop(l);
    println!(
        "  namespaces, links, pinned maps and processes removed; demo took {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}
