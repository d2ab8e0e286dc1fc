//! `bench scale`: what adding LB nodes behind an ECMP router buys, and what a node death costs.
//!
//! Two measurements of capacity, 1 vs 3 LB nodes in the same run:
//! - **mpps** (the `cases` of scale.json): each LB node is its own loaded data plane (own maps
//!   and program) with a fixed CPU budget: a cgroup capped at `LB_SCALE_NODE_CPU` (default 0.25) of a core, the way a
//!   real node has its own receive CPU. Flows are split over the nodes as an ECMP hash would
//!   (flow i to node i mod N) and each node forwards its share of established-flow packets
//!   through BPF_PROG_TEST_RUN in its own thread. The capped CPU is the bottleneck by
//!   construction, so the ratio shows the scale-out, not the size of this (shared, 2-core)
//!   machine. Aggregate rate = packets forwarded by all nodes / wall time.
//! - **rps** (`lab_cases`): short TCP connections per second through the BGP lab (router with
//!   ECMP, 3 LB nodes, 3 backends) with 1 or 3 nodes announcing. Here every namespace shares
//!   the same two cores, so the client, router and backends limit the rate, not the LB nodes:
//!   reported for completeness, not as the scale-out figure.
//!
//! `node_death`: the lab's node-death scenario (see [`crate::bgp_lab::BgpLab::node_death`]).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use lb_common::PROTO_TCP;
use lb_userspace::dataplane::{Desired, ServiceSpec, vip_key};
use serde_json::json;

use super::{median, write_json};
use crate::{
    TestDataplane, backend,
    bgp_lab::{BgpLab, LB_NODES, PORT, VIP4},
    frames::*,
};

/// CPU budget of one LB node: this fraction of one core (cgroup v1 CFS quota); LB_SCALE_NODE_CPU
/// overrides it (0: no cap, e.g. on a machine with a core per node).
fn node_cpu() -> f64 {
    std::env::var("LB_SCALE_NODE_CPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.25)
}
const FLOWS: u32 = 1024;
const SECONDS: u64 = 3;
const ROUNDS: usize = 3;

/// A cgroup (v1 cpu controller) capped at `share` of a core; removed on drop.
struct CpuCap {
    dir: std::path::PathBuf,
}

impl CpuCap {
    fn new(share: f64) -> Option<CpuCap> {
        let dir = std::path::Path::new("/sys/fs/cgroup/cpu").join(crate::unique("lbscale"));
        std::fs::create_dir(&dir).ok()?;
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").ok()?;
        std::fs::write(
            dir.join("cpu.cfs_quota_us"),
            format!("{}", (share * 100_000.0) as u64),
        )
        .ok()?;
        Some(CpuCap { dir })
    }

    /// Move the calling thread into the cgroup.
    fn enter(&self) {
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        std::fs::write(self.dir.join("tasks"), tid.to_string()).expect("join the cpu cgroup");
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // The threads have exited, so the group is empty.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn loaded_node() -> TestDataplane {
    let mut t = TestDataplane::new(lb_common::DEFAULT_TABLE_SIZE);
    let vip: IpAddr = VIP4.parse().unwrap();
    let mut b3 = backend("10.81.0.23", 23);
    b3.weight = 2;
    t.dp.apply(&Desired {
        services: vec![ServiceSpec {
            key: vip_key(vip, PORT.parse().unwrap(), PROTO_TCP),
            owned: true,
            backends: vec![backend("10.81.0.21", 21), backend("10.81.0.22", 22), b3],
        }],
        ..Default::default()
    })
    .unwrap();
    t
}

fn flow_frame(i: u32, flags: u8) -> Vec<u8> {
    ipv4_frame(
        [10, 82, (i >> 8) as u8, i as u8],
        [10, 83, 0, 10],
        PROTO_TCP,
        &tcp(20000 + i as u16, PORT.parse().unwrap(), flags),
    )
}

/// Aggregate Mpps of `n` capped nodes forwarding established flows for SECONDS.
fn capped_mpps(n: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(SECONDS) + Duration::from_millis(300);
    let threads: Vec<_> = (0..n)
        .map(|node| {
            std::thread::spawn(move || {
                let mut t = loaded_node();
                let flows: Vec<Vec<u8>> = (0..FLOWS)
                    .filter(|i| *i as usize % n == node)
                    .map(|i| {
                        t.dp.test_run("lb_xdp", &flow_frame(i, SYN), 1).unwrap();
                        flow_frame(i, ACK)
                    })
                    .collect();
                let cap = (node_cpu() > 0.0).then(|| {
                    let c = CpuCap::new(node_cpu())
                        .expect("create a cpu cgroup (cgroup v1 cpu controller)");
                    c.enter();
                    c
                });
                // Start together, after every node is loaded.
                while Instant::now() + Duration::from_secs(SECONDS) < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let start = Instant::now();
                let mut packets = 0u64;
                // Large batches: each BPF_PROG_TEST_RUN call of an XDP program costs tens of ms
                // of fixed setup (the kernel swaps the XDP dispatcher), whatever the repeat.
                let repeat = 1_000_000u32;
                for f in flows.iter().cycle() {
                    let (verdict, _, _) = t.dp.test_run("lb_xdp", f, repeat).unwrap();
                    assert_eq!(verdict, 3, "XDP_TX expected for an established flow");
                    packets += repeat as u64;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                let secs = start.elapsed().as_secs_f64();
                if std::env::var_os("LB_SCALE_DEBUG").is_some() {
                    let t0 = Instant::now();
                    let (_, _, ns) = t.dp.test_run("lb_xdp", &flows[0], repeat).unwrap();
                    eprintln!("node {node}: {packets} packets in {secs:.3}s; one call {:?}, kernel {ns} ns/packet", t0.elapsed());
                }
                drop(t);
                (packets, secs, cap)
            })
        })
        .collect();
    let results: Vec<(u64, f64, Option<CpuCap>)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Each node's rate over its own (overlapping) window, summed.
    results.iter().map(|r| r.0 as f64 / r.1 / 1e6).sum()
}

fn lab_rps(l: &BgpLab, n: usize) -> f64 {
    for (i, node) in LB_NODES.iter().enumerate() {
        let cmd = if i < n { "undrain" } else { "drain" };
        l.lbctl(node, &["bgp", cmd])
            .expect("lbctl bgp drain/undrain");
    }
    l.wait_nexthops(n, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("router never got {n} next hops"));
    std::thread::sleep(Duration::from_millis(500));
    let r = l.client(&["connect-for", VIP4, PORT, "4", "8", "3000"]);
    println!(
        "  {n} node(s) announcing: ok {} failed {} errors {}",
        r["ok"], r["failed"], r["errors"]
    );
    let ok = r["ok"].as_f64().unwrap_or(0.0);
    ok / (r["elapsed_ms"].as_f64().unwrap_or(4000.0) / 1000.0)
}

pub fn run() {
    println!(
        "capacity: 1 vs 3 LB node(s) each capped at {} of a core, {FLOWS} flows split by ECMP",
        node_cpu()
    );
    let mut per: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (k, n) in [1usize, 3].iter().enumerate() {
            let m = capped_mpps(*n);
            println!("  round {round}: {n} node(s): {m:.3} Mpps");
            per[k].push(m);
        }
    }
    let one = median(per[0].clone());
    let three = median(per[1].clone());

    println!("\nBGP lab: connections per second through the router (1 vs 3 nodes announcing)");
    let mut l = BgpLab::new();
    let rps3 = lab_rps(&l, 3);
    let rps1 = lab_rps(&l, 1);
    lab_rps(&l, 3);
    println!("\nnode death (lb2 hung, link up; BFD detects)");
    let death = l.node_death("lb2");

    println!("\n{:<8} {:>12} {:>10}", "lb_nodes", "Mpps", "x 1 node");
    println!("{:<8} {:>12.3} {:>10.2}", 1, one, 1.0);
    println!("{:<8} {:>12.3} {:>10.2}", 3, three, three / one);
    println!(
        "\n{:<8} {:>12} {:>10}   (lab, shared CPUs: not LB-bound)",
        "lb_nodes", "conn/s", "x 1 node"
    );
    println!("{:<8} {:>12.0} {:>10.2}", 1, rps1, 1.0);
    println!("{:<8} {:>12.0} {:>10.2}", 3, rps3, rps3 / rps1);
    println!(
        "\nnode death: new connections failed for {:.0} ms (router FIB changed after {:?} ms), long-lived lost {} of {}",
        death.new_failed_ms, death.fib_changed_ms, death.long_lived_lost, death.long_lived
    );
    let doc = json!({
        "cases": [
            {"lb_nodes": 1, "mpps": one, "rounds": per[0]},
            {"lb_nodes": 3, "mpps": three, "rounds": per[1]},
        ],
        "ratio_3_to_1": three / one,
        "node_cpu": node_cpu(),
        "method": format!("each LB node a separate data plane in a cgroup capped at {} core; established-flow packets through BPF_PROG_TEST_RUN; {FLOWS} flows split over the nodes; median of {ROUNDS} interleaved rounds of {SECONDS} s", node_cpu()),
        "lab_cases": [
            {"lb_nodes": 1, "rps": rps1},
            {"lb_nodes": 3, "rps": rps3},
        ],
        "lab_note": "short connections through the FRR router's ECMP; client, router, backends and LB nodes share the machine's cores, so this is not LB-bound",
        "node_death": {
            "new_failed_ms": death.new_failed_ms,
            "long_lived_lost": death.long_lived_lost,
            "long_lived": death.long_lived,
            "new_failed": death.new_failed,
            "new_ok": death.new_ok,
            "router_fib_changed_ms": death.fib_changed_ms,
            "bfd_detect_ms": crate::bgp_lab::BFD_MS * crate::bgp_lab::BFD_MULT,
        },
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    write_json("scale", &doc);
}
