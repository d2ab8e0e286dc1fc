//! `bench throughput-brex`: packets per second `lb_xdp` forwards on OVN-Kubernetes' br-ex, at
//! each of the two places it can attach (docs/kernels.md, "OVN-Kubernetes' br-ex"), in one run.
//!
//! Two namespaces joined by a veth pair: the generator's `gen0` and the node's uplink `lb0`,
//! the port of an Open vSwitch bridge `br-ex` with the node's address and the shared-gateway
//! flows (`lb_tests::brex`). The generator (`bench_gen`, BPF_PROG_TEST_RUN in live-frames
//! mode) sends TCP frames of one established flow to the VIP, addressed to br-ex's MAC;
//! `bench_sink` on gen0 counts what comes back. Cases, interleaved round by round:
//!
//! - `native_uplink`: `lb_xdp` in driver mode on lb0, below br-ex: XDP_TX straight back out of
//!   lb0.
//! - `generic_br_ex`: `lb_pass` on lb0 (the NIC's driver handing frames up), `lb_xdp` in generic
//!   mode on br-ex: each frame goes through OVS (conntrack zone 64000, then to the host port),
//!   is forwarded by the program after the bridge, and its XDP_TX enters OVS again from the host
//!   port (committed to conntrack, out of lb0).
//!
//! Needs Open vSwitch's datapath (the `openvswitch` module): `cargo xtask bench
//! throughput-brex` runs it in the kernel matrix's VM (xtask/src/vm.rs). Under software
//! emulation the absolute rates mean nothing; the ratio of the two, measured side by side,
//! does.

use aya::programs::links::{FdLink, PinnedLink};
use lb_common::{PROTO_TCP, stat};
use lb_userspace::{
    config::XdpMode,
    dataplane::{Desired, ServiceSpec, vip_key},
};
use serde_json::json;

use super::{
    median,
    throughput::{BenchProgs, Wire, generate, stat_value},
    write_json,
};
use crate::{
    TestDataplane, backend, brex,
    frames::{ACK, SYN, ipv4_frame, tcp},
    lab::{Lab, sh},
};

const VIP: [u8; 4] = [10, 77, 0, 100];
/// The generator's device (`throughput::generate` sends from it) and the node's uplink.
const GEN_IF: &str = "gen0";
const UPLINK: &str = "lb0";

#[derive(Clone, Copy, PartialEq)]
enum Attach {
    NativeUplink,
    GenericBrEx,
}

struct Case {
    name: &'static str,
    attach: Attach,
    /// Forwarded Mpps (the sink's count over the generator's time), per round.
    forwarded: Vec<f64>,
    sent: Vec<f64>,
}

pub fn run() {
    if let Err(why) = brex::available() {
        eprintln!(
            "bench throughput-brex: {why}; `cargo xtask bench throughput-brex` runs it in a VM"
        );
        std::process::exit(2);
    }
    let secs: f64 = std::env::var("LB_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("LB_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);

    // The generator and the node, joined by gen0 -- lb0; br-ex on lb0 with the node's address.
    let mut lab = Lab::new("tpb");
    lab.add_detached_node("gen", "10.77.0.1");
    lab.add_detached_node("lb", "10.77.0.2");
    lab.link("gen", GEN_IF, "10.77.0.1/24", "lb", UPLINK, "10.77.0.2/24");
    let (gen_ns, lb_ns) = (lab.node("gen").netns.clone(), lab.node("lb").netns.clone());
    let mac = mac_of(&lb_ns, UPLINK);
    {
        let n = lab.nodes.get_mut("lb").unwrap();
        n.mac = mac.clone();
        n.v6 = "fd77::2".into();
    }
    brex::make_br_ex_on(&mut lab, "lb", UPLINK);

    // The load balancer: one VIP with three backends (XDP_TX), one established flow.
    let mut t = TestDataplane::new(257);
    t.dp.apply(&Desired {
        services: vec![ServiceSpec {
            key: vip_key(VIP.into(), 6443, PROTO_TCP),
            owned: true,
            backends: vec![
                backend("10.77.0.11", 11),
                backend("10.77.0.12", 12),
                backend("10.77.0.13", 13),
            ],
        }],
        ..Default::default()
    })
    .unwrap();
    let client = [10, 200, 0, 1];
    let syn = ipv4_frame(client, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    assert_eq!(t.dp.test_run("lb_xdp", &syn, 1).unwrap().0, 3);
    let mut ack = ipv4_frame(client, VIP, PROTO_TCP, &tcp(40000, 6443, ACK));
    // To br-ex's MAC (the uplink's), as a client's router sends it: OVS hands it to the host.
    ack[..6].copy_from_slice(&parse_mac(&mac));

    // lb_xdp generic on br-ex for good; lb0's link swaps between lb_xdp and lb_pass.
    let mut progs = BenchProgs::load_from(lb_userspace::EBPF_OBJECT, &["lb_pass"]);
    let mut sink = BenchProgs::load_programs(&["bench_gen", "bench_sink"]);
    Wire::within(&lb_ns, || {
        t.dp.attach("br-ex", XdpMode::Skb)
            .expect("attach lb_xdp to br-ex in generic mode");
        t.dp.attach(UPLINK, XdpMode::Driver)
            .expect("attach lb_xdp natively to the uplink")
    });
    Wire::within(&gen_ns, || {
        sink.prog("bench_sink")
            .attach(GEN_IF, aya::programs::XdpMode::Driver)
            .expect("attach the sink natively to gen0")
    });
    let link_pin = t.opts.pin_dir().join(format!("link_{UPLINK}"));
    sink.set_flows(1);
    let gen_fd = sink.prog_fd("bench_gen");
    let gen_path = format!("/run/netns/{gen_ns}");

    let mut cases = vec![
        Case {
            name: "native_uplink",
            attach: Attach::NativeUplink,
            forwarded: vec![],
            sent: vec![],
        },
        Case {
            name: "generic_br_ex",
            attach: Attach::GenericBrEx,
            forwarded: vec![],
            sent: vec![],
        },
    ];
    let tx_before = stat_value(&t, stat::VERDICT_TX);
    // Round 0 warms up; not counted.
    for round in 0..=rounds {
        for case in cases.iter_mut() {
            match case.attach {
                Attach::NativeUplink => Wire::within(&lb_ns, || {
                    t.dp.attach(UPLINK, XdpMode::Driver)
                        .expect("swap lb_xdp back in on the uplink")
                }),
                Attach::GenericBrEx => {
                    let link: FdLink = PinnedLink::from_pin(&link_pin)
                        .expect("the pinned XDP link of the uplink")
                        .into();
                    progs
                        .prog("lb_pass")
                        .attach_to_link(link.try_into().unwrap())
                        .expect("swap lb_pass in on the uplink");
                }
            }
            let before = sink.sunk();
            let (sent, elapsed) = generate(&gen_path, gen_fd, &ack, secs, 0);
            std::thread::sleep(std::time::Duration::from_millis(50));
            let got = sink.sunk() - before;
            if round == 0 {
                continue;
            }
            case.forwarded.push(got as f64 / elapsed / 1e6);
            case.sent.push(sent as f64 / elapsed / 1e6);
        }
    }
    for c in &cases {
        assert!(
            c.forwarded.iter().all(|f| *f > 0.0),
            "{}: some round forwarded nothing ({:?} Mpps); br-ex's flows:\n{}",
            c.name,
            c.forwarded,
            brex::dump_flows(&lab, "lb")
        );
    }
    // Every frame the sink counted went through lb_xdp (the sink sees nothing else).
    let forwarded_by_lb = stat_value(&t, stat::VERDICT_TX) - tx_before;
    let ratios: Vec<f64> = cases[1]
        .forwarded
        .iter()
        .zip(&cases[0].forwarded)
        .map(|(g, n)| g / n)
        .collect();
    let ratio = median(ratios.clone());

    println!(
        "{:<16} {:>10} {:>10} {:>12}",
        "case", "forwarded", "sent", "x native"
    );
    let mut rows = Vec::new();
    for c in &cases {
        let fwd = median(c.forwarded.clone());
        let r = if c.attach == Attach::NativeUplink {
            1.0
        } else {
            ratio
        };
        println!(
            "{:<16} {:>10.4} {:>10.4} {:>12.3}",
            c.name,
            fwd,
            median(c.sent.clone()),
            r
        );
        rows.push(json!({
            "name": c.name,
            "forwarded_mpps": fwd,
            "sent_mpps": median(c.sent.clone()),
            "ratio_to_native": r,
            "samples_forwarded_mpps": c.forwarded,
        }));
    }
    println!(
        "forwarded/sent: Mpps by the wall clock; x native: the median of each round's generic/native ratio. lb_xdp sent {forwarded_by_lb} frames with XDP_TX."
    );
    let doc = json!({
        "cases": rows,
        "generic_to_native": ratio,
        "samples_generic_to_native": ratios,
        "seconds_per_sample": secs,
        "rounds": rounds,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "lb_xdp_tx": forwarded_by_lb,
    });
    write_json("throughput-brex", &doc);
    drop(lab);
}

fn mac_of(ns: &str, dev: &str) -> String {
    let out = sh(&["ip", "-n", ns, "-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

fn parse_mac(s: &str) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (i, b) in s.split(':').enumerate().take(6) {
        m[i] = u8::from_str_radix(b, 16).unwrap();
    }
    m
}
