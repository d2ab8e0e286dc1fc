//! `bench micro`: per-packet cost of lb_xdp through BPF_PROG_TEST_RUN against a baseline XDP
//! program that only swaps the MACs and returns XDP_TX, measured in the same run.
use std::net::IpAddr;

use lb_common::{PROTO_TCP, PROTO_UDP};
use lb_userspace::dataplane::{Desired, ServiceSpec, vip_key};
use serde_json::json;

use super::{median, write_json};
use crate::{TestDataplane, backend, frames::*};

/// Per-packet time of `program` on `frame`: median of `rounds` runs of `repeat` packets each.
fn time(t: &mut TestDataplane, program: &str, frame: &[u8], repeat: u32, rounds: usize) -> f64 {
    median(
        (0..rounds)
            .map(|_| t.dp.test_run(program, frame, repeat).unwrap().2)
            .collect(),
    )
}

pub fn run() {
    let vip: IpAddr = "10.77.0.100".parse().unwrap();
    let vip6: IpAddr = "fd77::100".parse().unwrap();
    let mut t = TestDataplane::new(lb_common::DEFAULT_TABLE_SIZE);
    // One 5-tuple's SYN repeated a million times is a flood: measure the SYN path of a real
    // client (the entry is written) by keeping flood mode off; its accounting still runs.
    t.opts.syn_flood_rate = 0;
    t.restart(lb_common::DEFAULT_TABLE_SIZE, t.opts.hash_seed);
    let svc = |addr, backends| ServiceSpec {
        key: vip_key(addr, 6443, PROTO_TCP),
        owned: true,
        backends,
    };
    t.dp.apply(&Desired {
        services: vec![
            svc(
                vip,
                vec![
                    backend("10.77.0.11", 11),
                    backend("10.77.0.12", 12),
                    backend("10.77.0.13", 13),
                ],
            ),
            svc(
                vip6,
                vec![
                    backend("fd77::11", 11),
                    backend("fd77::12", 12),
                    backend("fd77::13", 13),
                ],
            ),
            ServiceSpec {
                key: vip_key(vip, 53, PROTO_UDP),
                owned: true,
                backends: vec![backend("10.77.0.11", 11)],
            },
        ],
        ..Default::default()
    })
    .unwrap();
    let (c4, v4) = ([10, 77, 0, 1], [10, 77, 0, 100]);
    let (c6, v6) = (
        lb_userspace::dataplane::addr_bytes("fd77::1".parse().unwrap()).0,
        lb_userspace::dataplane::addr_bytes(vip6).0,
    );
    let syn = ipv4_frame(c4, v4, PROTO_TCP, &tcp(40000, 6443, SYN));
    let ack = ipv4_frame(c4, v4, PROTO_TCP, &tcp(40000, 6443, ACK));
    let ack6 = ipv6_frame(c6, v6, PROTO_TCP, &tcp(40000, 6443, ACK));
    let other = ipv4_frame(c4, [10, 77, 0, 50], PROTO_TCP, &tcp(40000, 443, ACK));
    // Establish the flows the "established" cases hit.
    t.dp.test_run("lb_xdp", &syn, 1).unwrap();
    t.dp.test_run(
        "lb_xdp",
        &ipv6_frame(c6, v6, PROTO_TCP, &tcp(40000, 6443, SYN)),
        1,
    )
    .unwrap();

    let (repeat, rounds) = (1_000_000, 7);
    let baseline = time(&mut t, "lb_baseline", &ack, repeat, rounds);
    let cases = [
        ("pass_non_vip", other),
        // A SYN takes the new-connection path: VIP lookup, flow hash, Maglev slot, and a
        // connection-table write (repeated on one 5-tuple: an update of the entry).
        ("tcp_new_flow", syn),
        ("tcp_established", ack),
        ("tcp6_established", ack6),
    ];
    let mut rows = Vec::new();
    println!("{:<18} {:>12} {:>10}", "case", "ns/packet", "x baseline");
    println!(
        "{:<18} {:>12.1} {:>10.2}",
        "baseline (MAC swap)", baseline, 1.0
    );
    for (name, frame) in cases {
        let ns = time(&mut t, "lb_xdp", &frame, repeat, rounds);
        println!("{:<18} {:>12.1} {:>10.2}", name, ns, ns / baseline);
        rows.push(json!({"name": name, "ns_per_packet": ns, "ratio_to_baseline": ns / baseline}));
    }
    // A flow seen first mid-stream (e.g. on a new VIP owner after failover) misses the
    // connection table and inserts a new entry: that needs a fresh 5-tuple every packet, so it
    // is measured as single runs (repeat = 1) over distinct source ports, against the baseline
    // measured the same way.
    let single = |t: &mut TestDataplane, program: &str, frames: &[Vec<u8>]| -> f64 {
        frames
            .iter()
            .map(|f| t.dp.test_run(program, f, 1).unwrap().2)
            .sum::<f64>()
            / frames.len() as f64
    };
    let acks: Vec<Vec<u8>> = (0..20000u32)
        .map(|i| {
            ipv4_frame(
                [10, 78, (i >> 8) as u8, i as u8],
                v4,
                PROTO_TCP,
                &tcp(1024 + (i % 60000) as u16, 6443, ACK),
            )
        })
        .collect();
    let base_single = single(&mut t, "lb_baseline", &acks);
    let first_ack = single(&mut t, "lb_xdp", &acks);
    println!(
        "{:<18} {:>12.1} {:>10.2}   (single runs; baseline {:.1} ns the same way)",
        "tcp_midstream_new",
        first_ack,
        first_ack / base_single,
        base_single
    );
    rows.push(json!({"name": "tcp_midstream_new", "ns_per_packet": first_ack, "ratio_to_baseline": first_ack / base_single,
        "note": "repeat=1 runs over 20000 new 5-tuples; ratio against the baseline measured the same way"}));
    let doc = json!({"baseline_ns": baseline, "repeat": repeat, "rounds": rounds, "cases": rows});
    write_json("micro", &doc);
}
