//! `bench micro`: per-packet cost of lb_xdp through BPF_PROG_TEST_RUN against a baseline XDP
//! program that only swaps the MACs and returns XDP_TX, measured in the same run.
//!
//! Every case is interleaved with the baseline (baseline, case, baseline, case, ...) on the same
//! frame, and its ratio is the median of the per-round ratios: a slow drift of the machine (other
//! work starting or stopping) then moves both sides of each ratio together instead of biasing it.
//! The data plane uses the production table sizes (Maglev and connection table).
use std::net::IpAddr;

use lb_common::{DEFAULT_CONNTRACK_SIZE, DEFAULT_TABLE_SIZE, PROTO_TCP, PROTO_UDP};
use lb_userspace::dataplane::{Desired, ServiceSpec, vip_key};
use serde_json::{Value, json};

use super::{median, throughput::BenchProgs, write_json};
use crate::{TestDataplane, backend, frames::*};

const XDP_TX: u32 = 3;
const VIP4: [u8; 4] = [10, 77, 0, 100];

/// One measured case: the case and the baseline, interleaved.
struct Measured {
    ns: f64,
    baseline_ns: f64,
    ratio: f64,
    ratios: Vec<f64>,
}

impl Measured {
    fn row(&self, name: &str, method: &str) -> Value {
        json!({"name": name, "ns_per_packet": self.ns, "ratio_to_baseline": self.ratio,
            "baseline_ns": self.baseline_ns, "ratio_samples": self.ratios, "method": method})
    }

    fn print(&self, name: &str) {
        let (lo, hi) = self
            .ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
        println!(
            "{:<22} {:>10.1} {:>10.1} {:>9.2}   ({:.2}-{:.2})",
            name, self.ns, self.baseline_ns, self.ratio, lo, hi
        );
    }
}

/// ns per packet of `repeat` runs of `program` on `frame`, by the kernel's clock (it leaves out
/// the time the bench was scheduled away, which the wall clock on a shared machine does not).
/// The kernel reports whole ns per run, truncated: with a baseline of a few ns that alone would
/// bias a ratio by up to 15 %, so this takes the middle of the interval (+0.5 ns).
fn run_timed(t: &mut TestDataplane, program: &str, frame: &[u8], repeat: u32) -> f64 {
    t.dp.test_run(program, frame, repeat).unwrap().2 + 0.5
}

/// The same for the baseline, which lives in the benches' own object.
fn baseline_timed(base: &mut BenchProgs, frame: &[u8], repeat: u32) -> f64 {
    base.test_run("lb_baseline", frame, repeat).2 + 0.5
}

/// `rounds` rounds of (baseline, lb_xdp) on `frame`, `repeat` packets per run.
fn abab(
    t: &mut TestDataplane,
    baseline: &mut BenchProgs,
    frame: &[u8],
    repeat: u32,
    rounds: usize,
) -> Measured {
    let (mut base, mut case, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let b = baseline_timed(baseline, frame, repeat);
        let c = run_timed(t, "lb_xdp", frame, repeat);
        base.push(b);
        case.push(c);
        ratios.push(c / b);
    }
    Measured {
        ns: median(case),
        baseline_ns: median(base),
        ratio: median(ratios.clone()),
        ratios,
    }
}

/// The floor of an established flow's path, beside the baseline in its own object load: one
/// LRU lookup of a key built from the frame, then the baseline's MAC swap, with the
/// connection table's 40-byte key and with a compact 16-byte IPv4 key. What no established path
/// that looks its flow up in a hash table can beat. And the floor of a new flow's: one insert of
/// a new 40-byte key into a full LRU hash.
fn floors(frame: &[u8], repeat: u32, rounds: usize) -> Vec<(&'static str, Measured)> {
    use aya::programs::{TestRun, TestRunOptions};
    let mut p = super::throughput::BenchProgs::load_programs(&[
        "lb_baseline",
        "bench_lru40",
        "bench_lru16",
        "bench_lru_insert40",
        "bench_lru_insert40_pcpu",
    ]);
    let mut timed = |name: &str| {
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::new()
        };
        let r = p.prog(name).test_run(opts).expect("BPF_PROG_TEST_RUN");
        assert_eq!(r.return_value, 3, "{name} sends the frame back");
        r.duration.as_nanos() as f64 + 0.5
    };
    [
        ("floor_lru_lookup_40b_key", "bench_lru40"),
        ("floor_lru_lookup_16b_key", "bench_lru16"),
        ("floor_lru_insert_40b_key", "bench_lru_insert40"),
        (
            "floor_lru_insert_40b_key_percpu_lru",
            "bench_lru_insert40_pcpu",
        ),
    ]
    .into_iter()
    .map(|(label, prog)| {
        let (mut base, mut case, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let b = timed("lb_baseline");
            let c = timed(prog);
            base.push(b);
            case.push(c);
            ratios.push(c / b);
        }
        let m = Measured {
            ns: median(case),
            baseline_ns: median(base),
            ratio: median(ratios.clone()),
            ratios,
        };
        (label, m)
    })
    .collect()
}

/// Cases that need a fresh frame per packet (a new flow, a cold entry): single runs
/// (repeat = 1), each lb_xdp run right after a baseline run on the same frame. The frames are
/// split into `rounds` groups; each group gives one ratio (sum over sum).
fn abab_single(
    t: &mut TestDataplane,
    baseline: &mut BenchProgs,
    frames: &[Vec<u8>],
    rounds: usize,
) -> Measured {
    let (mut base, mut case, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for group in frames.chunks(frames.len().div_ceil(rounds)) {
        let (mut b, mut c) = (0.0, 0.0);
        for f in group {
            // Whole ns, truncated: take the middle of the interval (see run_timed).
            b += baseline_timed(baseline, f, 1);
            let (verdict, _, ns) = t.dp.test_run("lb_xdp", f, 1).unwrap();
            assert_eq!(verdict, XDP_TX, "every single-run case is forwarded");
            c += ns + 0.5;
        }
        base.push(b / group.len() as f64);
        case.push(c / group.len() as f64);
        ratios.push(c / b);
    }
    Measured {
        ns: median(case),
        baseline_ns: median(base),
        ratio: median(ratios.clone()),
        ratios,
    }
}

/// `tcp_established` with the trace switch on (see `run`).
fn traced(
    t: &mut TestDataplane,
    baseline: &mut BenchProgs,
    frame: &[u8],
    rounds: usize,
) -> Measured {
    const RUN: u32 = 2000;
    let mut tap =
        t.dp.take_trace()
            .unwrap()
            .expect("the program has trace maps");
    tap.set(true).unwrap();
    let (mut base, mut case, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (mut b, mut c) = (0.0, 0.0);
        for _ in 0..50 {
            b += baseline_timed(baseline, frame, RUN);
            c += run_timed(t, "lb_xdp", frame, RUN);
            let mut n = 0;
            while tap.next_record().is_some() {
                n += 1;
            }
            assert_eq!(n, RUN, "every traced packet's record");
        }
        base.push(b / 50.0);
        case.push(c / 50.0);
        ratios.push(c / b);
    }
    tap.set(false).unwrap();
    Measured {
        ns: median(case),
        baseline_ns: median(base),
        ratio: median(ratios.clone()),
        ratios,
    }
}

/// A permutation of 0..n from a fixed seed (xorshift; reproducible runs, no dependency).
fn shuffled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// An ACK (or SYN) from a distinct client per `i`: addresses 10.<base>.x.y, ports varied too.
pub(super) fn client_frame(base: u8, i: u32, dst: [u8; 4], flags: u8) -> Vec<u8> {
    ipv4_frame(
        [
            10,
            base.wrapping_add((i >> 16) as u8),
            (i >> 8) as u8,
            i as u8,
        ],
        dst,
        PROTO_TCP,
        &tcp(1024 + (i % 60000) as u16, 6443, flags),
    )
}

/// The micro bench's data plane (production sizes, an IPv4 and an IPv6 VIP with three backends
/// each, one established flow per family) and its single-frame cases, as (name, frame).
pub(super) fn setup() -> (TestDataplane, Vec<(&'static str, Vec<u8>)>) {
    let vip: IpAddr = "10.77.0.100".parse().unwrap();
    let vip6: IpAddr = "fd77::100".parse().unwrap();
    let mut t = TestDataplane::with_conntrack(DEFAULT_TABLE_SIZE, DEFAULT_CONNTRACK_SIZE);
    // One 5-tuple's SYN repeated a million times is a flood: measure the SYN path of a real
    // client (the entry is written) by keeping flood mode off; its accounting still runs.
    t.opts.syn_flood_rate = 0;
    t.restart(DEFAULT_TABLE_SIZE, t.opts.hash_seed);
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
    let (c4, v4) = ([10, 77, 0, 1], VIP4);
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

    let cases = vec![
        ("pass_non_vip", other),
        // One 5-tuple's SYN, repeated: after the first, its entry is there and is kept (a SYN
        // never moves a live entry), so this is the path of a retransmitted SYN; a new
        // 5-tuple's SYN is `tcp_syn_new` below.
        ("tcp_new_flow", syn),
        ("tcp_established", ack),
        ("tcp6_established", ack6),
    ];
    (t, cases)
}

pub fn run() {
    let (mut t, cases) = setup();
    let mut baseline = BenchProgs::load_programs(&["lb_baseline"]);
    let v4 = VIP4;
    let (repeat, rounds) = (1_000_000, 9);
    // With BPF statistics on (e.g. while an e2e bench runs), every program run also reads the
    // clock twice: tens of ns on every case, which compresses every ratio.
    let stats_on = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|s| s.trim() != "0");
    if stats_on {
        println!("WARNING: kernel.bpf_stats_enabled is on: every run pays for its clock reads");
    }
    let mut rows = Vec::new();
    println!(
        "{:<22} {:>10} {:>10} {:>9}   (range over rounds)",
        "case", "ns/packet", "baseline", "x base"
    );
    let mut baselines = Vec::new();
    let established = cases
        .iter()
        .find(|c| c.0 == "tcp_established")
        .map(|c| c.1.clone())
        .unwrap();
    for (name, frame) in cases {
        let m = abab(&mut t, &mut baseline, &frame, repeat, rounds);
        m.print(name);
        baselines.push(m.baseline_ns);
        rows.push(m.row(
            name,
            "interleaved with the baseline, same frame, repeat runs",
        ));
    }

    // The same established flow's ACK while `lbctl trace` is attached: every packet takes the
    // full path, notes its steps and writes its record to the ring buffer. Runs of 2000 packets
    // (the ring holds about 2900 records), the ring drained after each, so none is dropped.
    let m = traced(&mut t, &mut baseline, &established, rounds);
    m.print("tcp_established_traced");
    rows.push(m.row(
        "tcp_established_traced",
        "trace attached, each packet's record written and read; repeat=2000 runs interleaved with the baseline, the ring drained between runs",
    ));

    // What an established path that looks its flow up in a hash table cannot beat.
    let established = client_frame(91, 0, v4, ACK);
    for (name, m) in floors(&established, repeat, rounds) {
        m.print(name);
        rows.push(m.row(
            name,
            "one LRU lookup of a key built from the frame, then the baseline's MAC swap; interleaved with the baseline, same frame, repeat runs",
        ));
    }

    // A connection's first SYN: a 5-tuple never seen, so the flow-cache slot misses, the
    // connection table misses, and the SYN writes its entry (an LRU insert) and its slot.
    let syns: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| client_frame(70, i, v4, SYN))
        .collect();
    let m = abab_single(&mut t, &mut baseline, &syns, rounds);
    m.print("tcp_syn_new");
    rows.push(m.row(
        "tcp_syn_new",
        "repeat=1 runs over 20000 SYNs of new 5-tuples, each after a baseline run on the same frame",
    ));

    // A flow seen first mid-stream (e.g. on a new VIP owner after failover) misses the
    // connection table and inserts a new entry: a fresh 5-tuple every packet.
    let midstream: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| client_frame(78, i, v4, ACK))
        .collect();
    let m = abab_single(&mut t, &mut baseline, &midstream, rounds);
    m.print("tcp_midstream_new");
    rows.push(m.row(
        "tcp_midstream_new",
        "repeat=1 runs over 20000 new 5-tuples, each after a baseline run on the same frame",
    ));

    // Cache-cold established flows: 100k entries in the default-size connection table, hit
    // in random order, so the entry (and its bucket) is rarely in the CPU cache.
    const COLD_FLOWS: u32 = 100_000;
    for i in 0..COLD_FLOWS {
        let (verdict, _, _) =
            t.dp.test_run("lb_xdp", &client_frame(90, i, v4, SYN), 1)
                .unwrap();
        assert_eq!(verdict, XDP_TX, "cold flow {i} established");
    }
    let entries = t.dp.conntrack_entries();
    assert!(
        entries >= COLD_FLOWS as usize,
        "connection table holds {entries} entries, want at least {COLD_FLOWS}"
    );
    let order = shuffled(COLD_FLOWS as usize);
    let cold: Vec<Vec<u8>> = order
        .iter()
        .map(|i| client_frame(90, *i as u32, v4, ACK))
        .collect();
    let m = abab_single(&mut t, &mut baseline, &cold, rounds);
    m.print("tcp_established_cold");
    rows.push(m.row(
        "tcp_established_cold",
        "repeat=1 runs over 100000 established flows (default-size table) in random order, each after a baseline run on the same frame",
    ));

    let doc = json!({
        "baseline_ns": median(baselines),
        "repeat": repeat,
        "rounds": rounds,
        "interleaved": true,
        "bpf_stats_enabled": stats_on,
        "table_size": DEFAULT_TABLE_SIZE,
        "conntrack_size": DEFAULT_CONNTRACK_SIZE,
        "cases": rows,
    });
    write_json("micro", &doc);
}
