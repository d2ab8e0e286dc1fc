//! `bench throughput`: packets per second through the real XDP path, in native (driver) mode.
//!
//! Two namespaces joined by one veth pair: `gen0` (generator side) and `lb0` (the load
//! balancer's interface). A generator built into the bench runs `bench_gen` with
//! BPF_PROG_TEST_RUN in live-frames mode, as if the frames had arrived on gen0: its XDP_TX sends
//! them out of gen0 into lb0. The program under test, attached natively to lb0, forwards them
//! with XDP_TX back out of lb0, and `bench_sink` on gen0 counts and drops them (it also makes
//! the veth deliver them: a native-mode veth only delivers XDP_TX frames to a peer with an XDP
//! program). Forwarded packets per second = the sink's count over the generator's run time.
//!
//! Cases, interleaved round by round so drift hits all of them alike: the MAC-swap baseline
//! (`lb_baseline`), `lb_xdp` with one established flow, `lb_xdp` with 100k established flows
//! (the generator rewrites the source address of every frame, walking the flows with a large
//! stride), and non-VIP traffic through `lb_xdp` (XDP_PASS: counted by lb_xdp's own counters,
//! the frames then end in the kernel stack of the LB namespace, which drops them).
//!
//! CPUs: the generator thread and the sink's NAPI thread are pinned to CPU 0, lb0's NAPI
//! (threaded NAPI: the load balancer's receive path) to CPU 1, when the machine has two.
//!
//! Then the new-flow rate with the connection sync off and on ([`new_flows_sync`]): every
//! frame a SYN of a flow not in the table (each writes a connection-table entry), samples
//! alternating between no sync task and lbd's sync task (`daemon::sync`) scanning the same
//! pinned tables and sending to a peer namespace; and the sync received by two peers' tasks
//! while the table fills ([`sync_receive`]: the peers' `Udp RcvbufErrors`).
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{PerCpuArray, PerCpuValues},
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
    },
};
use lb_common::{DEFAULT_CONNTRACK_SIZE, DEFAULT_TABLE_SIZE, PROTO_TCP, maps, stat};
use lb_userspace::dataplane::{Desired, ServiceSpec, vip_key};
use serde_json::json;

use super::{live, median, write_json};
use crate::{
    TestDataplane, backend,
    frames::{ACK, SYN, ipv4_frame, tcp},
    lab::{sh, thread_cpu_seconds, threaded_napi, try_sh},
    unique,
};

const VIP: [u8; 4] = [10, 77, 0, 100];
const MANY_FLOWS: u32 = 100_000;
/// Coprime with MANY_FLOWS: consecutive frames belong to flows far apart in the table.
const FLOW_STEP: u32 = 38_201;
const BATCH: u32 = 64;
const GEN_IF: &str = "gen0";
const LB_IF: &str = "lb0";

/// Two namespaces and a veth pair between them, removed on drop.
pub(super) struct Wire {
    gen_ns: String,
    lb_ns: String,
}

impl Wire {
    fn new() -> Wire {
        let w = Wire {
            gen_ns: unique("tpg"),
            lb_ns: unique("tpl"),
        };
        sh(&["ip", "netns", "add", &w.gen_ns]);
        sh(&["ip", "netns", "add", &w.lb_ns]);
        sh(&[
            "ip", "-n", &w.gen_ns, "link", "add", GEN_IF, "type", "veth", "peer", "name", LB_IF,
            "netns", &w.lb_ns,
        ]);
        sh(&["ip", "-n", &w.gen_ns, "link", "set", GEN_IF, "up"]);
        sh(&["ip", "-n", &w.lb_ns, "link", "set", LB_IF, "up"]);
        w
    }

    fn path(ns: &str) -> String {
        format!("/run/netns/{ns}")
    }

    /// Run `f` on this thread inside namespace `ns`.
    pub(super) fn within<T>(ns: &str, f: impl FnOnce() -> T) -> T {
        let old = live::enter_netns(&Self::path(ns)).expect("enter the bench namespace");
        let r = f();
        live::restore_netns(old).expect("return to the bench's namespace");
        r
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = try_sh(&["ip", "netns", "del", &self.gen_ns]);
        let _ = try_sh(&["ip", "netns", "del", &self.lb_ns]);
    }
}

/// The bench programs (generator, sink, baseline), loaded from their own object
/// (`lb_userspace::BENCH_OBJECT`, never the one lbd loads), or programs of another object, with
/// maps of their own (pinned in a directory removed on drop, sized small).
pub(super) struct BenchProgs {
    ebpf: Ebpf,
    pin_dir: PathBuf,
}

impl BenchProgs {
    fn load() -> BenchProgs {
        Self::load_programs(&["bench_gen", "bench_sink", "lb_baseline", "bench_slot_floor"])
    }

    /// Load `programs` of the benches' object (verified by the kernel, not attached).
    pub(super) fn load_programs(programs: &[&str]) -> BenchProgs {
        Self::load_from(lb_userspace::BENCH_OBJECT, programs)
    }

    /// Load `programs` of `object` (verified by the kernel, not attached).
    pub(super) fn load_from(object: &[u8], programs: &[&str]) -> BenchProgs {
        let pin_dir = PathBuf::from("/sys/fs/bpf").join(unique("lbtp"));
        std::fs::create_dir_all(&pin_dir).unwrap();
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .map_max_entries(maps::TABLES, lb_common::table_elements(7))
            .map_max_entries(maps::NEW_TABLES, lb_common::table_elements(7))
            .map_max_entries(maps::CONNTRACK, 1024)
            .map_max_entries(maps::FLOW_CACHE, 64)
            .load(object)
            .expect("load the XDP object for the bench programs");
        for name in programs {
            let p: &mut Xdp = ebpf.program_mut(name).unwrap().try_into().unwrap();
            p.load().unwrap_or_else(|e| panic!("load {name}: {e}"));
        }
        BenchProgs { ebpf, pin_dir }
    }

    pub(super) fn prog(&mut self, name: &str) -> &mut Xdp {
        self.ebpf.program_mut(name).unwrap().try_into().unwrap()
    }

    /// BPF_PROG_TEST_RUN of `name` on `frame`, `repeat` times: verdict, output frame, ns per
    /// run (the kernel's whole ns).
    pub(super) fn test_run(
        &mut self,
        name: &str,
        frame: &[u8],
        repeat: u32,
    ) -> (u32, Vec<u8>, f64) {
        use aya::programs::{TestRun, TestRunOptions};
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat: repeat.max(1),
            ..TestRunOptions::new()
        };
        let r = self.prog(name).test_run(opts).expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out, r.duration.as_nanos() as f64)
    }

    pub(super) fn prog_fd(&mut self, name: &str) -> i32 {
        use std::os::fd::{AsFd, AsRawFd};
        self.prog(name).fd().unwrap().as_fd().as_raw_fd()
    }

    /// Generator settings: spread frames over `flows` flows (1: leave them alone).
    pub(super) fn set_flows(&mut self, flows: u32) {
        let mut m: PerCpuArray<_, [u32; 4]> =
            PerCpuArray::try_from(self.ebpf.map_mut("BENCH_GEN").unwrap()).unwrap();
        let n = aya::util::nr_cpus().unwrap();
        let v = PerCpuValues::try_from(vec![[flows, FLOW_STEP % flows.max(1), 0, 0]; n]).unwrap();
        m.set(0, v, 0).unwrap();
    }

    /// `bench_dsr_floor`'s rule: TCP for `vip` goes to one of `backends` (by the client's
    /// port), sent from `own_mac`.
    pub(super) fn set_dsr_rule(
        &mut self,
        vip: std::net::Ipv4Addr,
        backends: &[[u8; 6]],
        own_mac: [u8; 6],
    ) {
        assert!((1..=4).contains(&backends.len()), "1-4 backends");
        let mut m: aya::maps::Array<_, [u8; 16]> =
            aya::maps::Array::try_from(self.ebpf.map_mut("BENCH_DSR").unwrap()).unwrap();
        for (i, mac) in backends.iter().enumerate() {
            let mut rule = [0u8; 16];
            rule[..4].copy_from_slice(&vip.octets());
            rule[4..10].copy_from_slice(mac);
            rule[10..].copy_from_slice(&own_mac);
            m.set(i as u32, rule, 0).unwrap();
        }
        let mut n: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(self.ebpf.map_mut("BENCH_DSR_N").unwrap()).unwrap();
        n.set(0, backends.len() as u32, 0).unwrap();
    }

    pub(super) fn sunk(&self) -> u64 {
        let m: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("BENCH_SINK").unwrap()).unwrap();
        m.get(&0, 0).unwrap().iter().sum()
    }
}

impl Drop for BenchProgs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Program {
    Baseline,
    Lb,
    /// `bench_slot_floor`: a random slot of an 8 MiB table per packet, then the MAC swap.
    SlotFloor,
}

struct Case {
    name: &'static str,
    program: Program,
    frame: Vec<u8>,
    flows: u32,
    /// Counted by lb_xdp's pass counter instead of the sink.
    passes: bool,
    /// Mpps per LB core (or forwarded Mpps when the LB thread cannot be timed), per round.
    mpps: Vec<f64>,
    /// Forwarded (or passed) Mpps by the wall clock.
    forwarded: Vec<f64>,
    sent_mpps: Vec<f64>,
    /// Connection-table misses lb_xdp counted (0 when every packet was an established flow).
    misses: u64,
    /// Share of the run the LB's NAPI thread was on a CPU (1.0: its core was saturated).
    lb_busy: Vec<f64>,
}

pub fn run() {
    let secs: f64 = std::env::var("LB_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("LB_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let cpus = aya::util::online_cpus().map(|c| c.len()).unwrap_or(1);
    let wire = Wire::new();

    // The load balancer: production table sizes, one VIP with three backends (XDP_TX).
    let mut t = TestDataplane::with_conntrack(DEFAULT_TABLE_SIZE, DEFAULT_CONNTRACK_SIZE);
    // The 100k flows below are set up by SYNs sent as fast as BPF_PROG_TEST_RUN goes: no SYN
    // flood mode (it would stop remembering them after the first thousand or so).
    t.opts.syn_flood_rate = 0;
    t.restart(DEFAULT_TABLE_SIZE, t.opts.hash_seed);
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
    // The one-flow case's flow, established as a real one would be (SYN first).
    let syn = ipv4_frame(client, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    assert_eq!(t.dp.test_run("lb_xdp", &syn, 1).unwrap().0, 3);
    let ack = ipv4_frame(client, VIP, PROTO_TCP, &tcp(40000, 6443, ACK));
    // The 100k flows the generator walks (sources 10.x.y.z, x.y.z = 1..=100000; see bench_gen).
    for f in 1..=MANY_FLOWS {
        let src = [10, (f >> 16) as u8, (f >> 8) as u8, f as u8];
        let syn = ipv4_frame(src, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
        assert_eq!(t.dp.test_run("lb_xdp", &syn, 1).unwrap().0, 3);
    }
    let mut other = ipv4_frame(client, [10, 77, 0, 50], PROTO_TCP, &tcp(40000, 443, ACK));
    // Not addressed to lb0's MAC: the LB namespace's stack drops it early (PACKET_OTHERHOST).
    other[..6].copy_from_slice(&[0x02, 0xee, 0, 0, 0, 1]);

    let entries = t.dp.conntrack_entries();
    assert!(
        entries > MANY_FLOWS as usize,
        "the connection table holds {entries} flows, want {MANY_FLOWS} + 1"
    );

    let mut progs = BenchProgs::load();
    Wire::within(&wire.lb_ns, || {
        t.dp.attach(LB_IF, lb_userspace::config::XdpMode::Driver)
            .expect("attach lb_xdp natively to the veth")
    });
    Wire::within(&wire.gen_ns, || {
        progs
            .prog("bench_sink")
            .attach(GEN_IF, XdpMode::Driver)
            .expect("attach the sink natively to the veth")
    });
    let link_pin = t.opts.pin_dir().join(format!("link_{LB_IF}"));

    let gen_cpu = 0;
    let lb_cpu = if cpus > 1 { 1 } else { 0 };
    let lb_napi = threaded_napi(&wire.lb_ns, LB_IF);
    let sink_napi = threaded_napi(&wire.gen_ns, GEN_IF);
    let pinned = match (lb_napi, sink_napi) {
        (Some(l), Some(s)) if cpus > 1 => {
            // Real-time priority: the other work on this machine (builds) must not time-slice
            // the receive paths; they sleep whenever there is no traffic.
            live::pin_to_cpu(l, lb_cpu).is_ok()
                && live::pin_to_cpu(s, gen_cpu).is_ok()
                && live::realtime(l, 50).is_ok()
                && live::realtime(s, 50).is_ok()
        }
        _ => false,
    };
    println!(
        "generator on CPU {gen_cpu}; LB receive path {}",
        if pinned {
            format!("on CPU {lb_cpu} (threaded NAPI, SCHED_FIFO), sink on CPU {gen_cpu}")
        } else {
            "not pinned (softirq wherever the kernel runs it)".into()
        }
    );

    let mut cases = vec![
        Case {
            name: "baseline",
            program: Program::Baseline,
            frame: ack.clone(),
            flows: 1,
            passes: false,
            mpps: vec![],
            forwarded: vec![],
            sent_mpps: vec![],
            misses: 0,
            lb_busy: vec![],
        },
        Case {
            name: "lb_xdp_1_flow",
            program: Program::Lb,
            frame: ack.clone(),
            flows: 1,
            passes: false,
            mpps: vec![],
            forwarded: vec![],
            sent_mpps: vec![],
            misses: 0,
            lb_busy: vec![],
        },
        Case {
            name: "lb_xdp_100k_flows",
            program: Program::Lb,
            frame: ack.clone(),
            flows: MANY_FLOWS,
            passes: false,
            mpps: vec![],
            forwarded: vec![],
            sent_mpps: vec![],
            misses: 0,
            lb_busy: vec![],
        },
        Case {
            name: "floor_random_slot_100k_flows",
            program: Program::SlotFloor,
            frame: ack.clone(),
            flows: MANY_FLOWS,
            passes: false,
            mpps: vec![],
            forwarded: vec![],
            sent_mpps: vec![],
            misses: 0,
            lb_busy: vec![],
        },
        Case {
            name: "pass_non_vip",
            program: Program::Lb,
            frame: other,
            flows: 1,
            passes: true,
            mpps: vec![],
            forwarded: vec![],
            sent_mpps: vec![],
            misses: 0,
            lb_busy: vec![],
        },
    ];

    // `LB_THROUGHPUT_CASES=lb_xdp_100k_flows,...`: only these cases besides the baseline (which
    // every ratio needs), e.g. to profile one case's receive thread with perf.
    if let Ok(only) = std::env::var("LB_THROUGHPUT_CASES") {
        cases.retain(|c| c.name == "baseline" || only.split(',').any(|n| n == c.name));
    }
    let gen_fd = progs.prog_fd("bench_gen");
    let gen_ns = Wire::path(&wire.gen_ns);
    // Round 0 warms up; not counted.
    for round in 0..=rounds {
        for case in cases.iter_mut() {
            match case.program {
                Program::Baseline | Program::SlotFloor => {
                    let link: FdLink = PinnedLink::from_pin(&link_pin)
                        .expect("the pinned XDP link of lb0")
                        .into();
                    let name = if matches!(case.program, Program::Baseline) {
                        "lb_baseline"
                    } else {
                        "bench_slot_floor"
                    };
                    progs
                        .prog(name)
                        .attach_to_link(link.try_into().unwrap())
                        .expect("swap in a bench program");
                }
                Program::Lb => Wire::within(&wire.lb_ns, || {
                    t.dp.attach(LB_IF, lb_userspace::config::XdpMode::Driver)
                        .expect("swap lb_xdp back in")
                }),
            }
            progs.set_flows(case.flows);
            let counted = |t: &TestDataplane, progs: &BenchProgs| -> u64 {
                if case.passes {
                    stat_value(t, stat::PASS_NOT_VIP)
                } else {
                    progs.sunk()
                }
            };
            let before = counted(&t, &progs);
            let misses_before = stat_value(&t, stat::CONNTRACK_MISS);
            let busy_before = lb_napi.map(thread_cpu_seconds);
            let (sent, elapsed) = generate(&gen_ns, gen_fd, &case.frame, secs, gen_cpu);
            // Frames still in the veth's ring land within microseconds.
            std::thread::sleep(Duration::from_millis(20));
            let got = counted(&t, &progs) - before;
            if std::env::var_os("LB_BENCH_DEBUG").is_some() {
                for (ns, dev) in [(&wire.lb_ns, LB_IF), (&wire.gen_ns, GEN_IF)] {
                    let o = try_sh(&["ip", "netns", "exec", ns, "ethtool", "-S", dev]);
                    eprintln!(
                        "{} {dev}:\n{}",
                        case.name,
                        String::from_utf8_lossy(&o.stdout)
                    );
                }
            }
            if round == 0 {
                continue;
            }
            case.misses += stat_value(&t, stat::CONNTRACK_MISS) - misses_before;
            let forwarded = got as f64 / elapsed / 1e6;
            case.forwarded.push(forwarded);
            case.sent_mpps.push(sent as f64 / elapsed / 1e6);
            // Per LB core: what the receive path forwards per second of its own CPU time. The
            // generator shares its CPU with other work, so the LB thread idles between bursts;
            // its CPU time, not the wall clock, is what the forwarding cost.
            let busy = match (lb_napi, busy_before) {
                (Some(pid), Some(b)) if pinned => Some((thread_cpu_seconds(pid) - b) / elapsed),
                _ => None,
            };
            case.lb_busy.extend(busy);
            case.mpps.push(match busy {
                Some(b) if b > 0.01 => forwarded / b,
                _ => forwarded,
            });
        }
    }

    let per_core = cases.iter().all(|c| c.lb_busy.len() == rounds);
    println!(
        "{:<20} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "case",
        if per_core { "Mpps/core" } else { "Mpps" },
        "x baseline",
        "forwarded",
        "sent",
        "LB busy",
        "ct miss"
    );
    let mut rows = Vec::new();
    for c in &cases {
        let mpps = median(c.mpps.clone());
        // Rounds are interleaved: each round's ratio compares neighbours in time.
        let ratio = median(
            c.mpps
                .iter()
                .zip(&cases[0].mpps)
                .map(|(m, b)| m / b)
                .collect(),
        );
        let forwarded = median(c.forwarded.clone());
        let sent = median(c.sent_mpps.clone());
        let busy = (!c.lb_busy.is_empty()).then(|| median(c.lb_busy.clone()));
        println!(
            "{:<20} {:>9.2} {:>10.2} {:>10.2} {:>10.2} {:>8} {:>8}",
            c.name,
            mpps,
            ratio,
            forwarded,
            sent,
            busy.map(|b| format!("{:.0}%", b * 100.0))
                .unwrap_or_else(|| "?".into()),
            c.misses,
        );
        rows.push(json!({
            "name": c.name,
            "mpps": mpps,
            "ratio_to_baseline": ratio,
            "forwarded_mpps": forwarded,
            "sent_mpps": sent,
            "lb_napi_busy": busy,
            "samples_mpps": c.mpps,
            "samples_forwarded_mpps": c.forwarded,
            "flows": c.flows,
            "conntrack_misses": c.misses,
            "counted_by": if c.passes { "lb_xdp pass_not_vip counter (XDP_PASS)" } else { "sink on the generator side (XDP_TX back)" },
        }));
    }
    println!(
        "Mpps{}: forwarded packets per second{}; forwarded/sent are wall-clock rates.",
        if per_core { "/core" } else { "" },
        if per_core {
            " per second of the LB receive thread's CPU time"
        } else {
            " (the LB thread could not be pinned and timed)"
        }
    );
    let new_flows = new_flows_sync(
        &mut t,
        &mut progs,
        &wire,
        Timing {
            secs,
            rounds,
            gen_cpu,
            lb_napi: lb_napi.filter(|_| pinned),
        },
    );
    let receive = sync_receive(
        &mut t,
        &mut progs,
        &wire,
        Timing {
            secs,
            rounds,
            gen_cpu,
            lb_napi: lb_napi.filter(|_| pinned),
        },
    );
    let doc = json!({
        "cases": rows,
        "new_flows_sync": new_flows,
        "sync_receive": receive,
        "seconds_per_sample": secs,
        "rounds": rounds,
        "batch_size": BATCH,
        "xdp_mode": "driver (native) on veth",
        "cpus": cpus,
        "pinned": pinned,
        "mpps_is_per_lb_core": per_core,
    });
    write_json("throughput", &doc);
}

pub(super) fn stat_value(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

/// Drive frames for about `secs` seconds from a thread in the generator's namespace pinned to
/// `cpu`; returns (frames sent, seconds).
pub(super) fn generate(ns: &str, prog_fd: i32, frame: &[u8], secs: f64, cpu: usize) -> (u64, f64) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = live::pin_to_cpu(0, cpu);
            let _old = live::enter_netns(ns).expect("enter the generator's namespace");
            let ifindex = live::ifindex(GEN_IF).expect("gen0's index");
            let chunk = 200_000;
            let start = Instant::now();
            let mut sent = 0u64;
            while start.elapsed().as_secs_f64() < secs {
                live::xdp_live_frames(prog_fd, frame, ifindex, chunk, BATCH)
                    .expect("BPF_PROG_TEST_RUN in live-frames mode");
                sent += chunk as u64;
            }
            (sent, start.elapsed().as_secs_f64())
        })
        .join()
        .unwrap()
    })
}

/// Flows the new-flow cases walk: more than a sample sends, and each sample has a source port
/// of its own, so every frame is a miss that writes an entry.
const NEW_FLOWS: u32 = 1 << 22;
/// Shortest new-flow sample: longer than the sync's default interval, so a sync-on sample holds
/// its first scan (all exceptions sent) and a periodic one.
const NEW_FLOW_MIN_SECS: f64 = 2.5;

#[derive(Clone, Copy)]
struct Timing {
    secs: f64,
    rounds: usize,
    gen_cpu: usize,
    /// The LB's receive thread, when pinned (per-core rates).
    lb_napi: Option<i32>,
}

/// A namespace holding a sync peer's address, joined to the LB's namespace by a veth of its
/// own (not lb0: sync datagrams never reach the measured path), each peer `i` on a /24 of its
/// own (the LB's end `10.78.i.1`, the peer's `10.78.i.2`). In the on/off comparison nothing
/// listens there: the kernel drops the datagrams, as a peer's socket would consume them; in
/// [`sync_receive`] a receiving sync task does.
struct SyncPeer {
    ns: String,
    i: u8,
}

impl SyncPeer {
    fn lb_addr(&self) -> String {
        format!("10.78.{}.1", self.i)
    }

    fn addr(&self) -> String {
        format!("10.78.{}.2", self.i)
    }

    fn new(lb_ns: &str, i: u8) -> SyncPeer {
        let p = SyncPeer {
            ns: unique("tps"),
            i,
        };
        sh(&["ip", "netns", "add", &p.ns]);
        let (lb_dev, peer_dev) = (format!("sy{}", 2 * i), format!("sy{}", 2 * i + 1));
        sh(&[
            "ip", "-n", lb_ns, "link", "add", &lb_dev, "type", "veth", "peer", "name", &peer_dev,
            "netns", &p.ns,
        ]);
        for (ns, dev, a) in [(lb_ns, &lb_dev, p.lb_addr()), (&p.ns, &peer_dev, p.addr())] {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                dev,
            ]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        p
    }
}

impl Drop for SyncPeer {
    fn drop(&mut self) {
        let _ = try_sh(&["ip", "netns", "del", &self.ns]);
    }
}

/// The new-flow rate with the sync off and on, interleaved sample by sample. Before each
/// sample the VIP's backend set changes (three backends, then four, then three...), so about a
/// quarter of the table's entries are exceptions (off their new slot) that a sync-on sample
/// scans and sends, up to `max_entries`. A sync-on sample starts lbd's sync task afresh (its
/// first scan, 200 ms after the view, sends every exception; the next comes with the interval)
/// and stops it after: two scans in [`NEW_FLOW_MIN_SECS`], more than the steady one per
/// `interval_ms`, so the cost is an upper bound.
fn new_flows_sync(
    t: &mut TestDataplane,
    progs: &mut BenchProgs,
    wire: &Wire,
    timing: Timing,
) -> serde_json::Value {
    use lb_userspace::sync::config::SyncConfig;
    use std::os::unix::fs::PermissionsExt;

    let peer = SyncPeer::new(&wire.lb_ns, 0);
    let key = std::env::temp_dir().join(unique("lb-tp-sync-key"));
    std::fs::write(&key, unique("bench-sync-key-").repeat(4)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = SyncConfig {
        peers: vec![peer.addr().parse().unwrap()],
        key_file: key.clone(),
        accept_key_files: Vec::new(),
        port: lb_userspace::sync::config::DEFAULT_PORT,
        listen: Some(peer.lb_addr().parse().unwrap()),
        interval_ms: lb_userspace::sync::config::DEFAULT_INTERVAL_MS,
        max_entries: lb_userspace::sync::config::DEFAULT_MAX_ENTRIES,
    };
    lb_userspace::config::Validate::validate(&cfg).expect("the bench's sync config");
    lb_userspace::dataplane::sync_view::ConntrackPins::open(&t.opts.pin_dir())
        .expect("the sync task's view of the pinned connection table");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pin_dir = t.opts.pin_dir();
    let start_sync = || spawn_sync(&rt, &wire.lb_ns, &cfg, &pin_dir);
    let secs = timing.secs.max(NEW_FLOW_MIN_SECS);
    Wire::within(&wire.lb_ns, || {
        t.dp.attach(LB_IF, lb_userspace::config::XdpMode::Driver)
            .expect("lb_xdp on lb0")
    });
    let gen_fd = progs.prog_fd("bench_gen");
    let gen_ns = Wire::path(&wire.gen_ns);
    // [off, on]: per-core (or wall-clock) Mpps, misses per forwarded frame.
    let mut mpps: [Vec<f64>; 2] = [vec![], vec![]];
    let mut miss_share: [Vec<f64>; 2] = [vec![], vec![]];
    let mut synced = Vec::new();
    let mut change = 0u16;
    for round in 0..=timing.rounds {
        for on in [false, true] {
            change += 1;
            t.dp.apply(&sync_services(if change.is_multiple_of(2) { 3 } else { 4 }))
                .expect("change the backend set");
            let handle = on.then(|| {
                let h = start_sync();
                h.view(t.dp.sync_view());
                h
            });
            progs.set_flows(NEW_FLOWS);
            // A source port per sample: no flow of an earlier sample comes again.
            let port = 20_000 + change;
            let syn = ipv4_frame([10, 200, 0, 1], VIP, PROTO_TCP, &tcp(port, 6443, SYN));
            let before = progs.sunk();
            let misses_before = stat_value(t, stat::CONNTRACK_MISS);
            let busy_before = timing.lb_napi.map(thread_cpu_seconds);
            let (_, elapsed) = generate(&gen_ns, gen_fd, &syn, secs, timing.gen_cpu);
            std::thread::sleep(Duration::from_millis(20));
            let got = progs.sunk() - before;
            let misses = stat_value(t, stat::CONNTRACK_MISS) - misses_before;
            let scans_in_sample = handle.as_ref().map(|h| h.stats.snapshot().scans);
            // A scan still running finishes before the task stops (outside the measurement).
            let stats = handle.as_ref().map(|h| {
                let start = Instant::now();
                while h.stats.snapshot().scans == 0 && start.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                h.stats.snapshot()
            });
            drop(handle);
            if round == 0 {
                continue;
            }
            let forwarded = got as f64 / elapsed / 1e6;
            let busy = match (timing.lb_napi, busy_before) {
                (Some(pid), Some(b)) => Some((thread_cpu_seconds(pid) - b) / elapsed),
                _ => None,
            };
            let i = on as usize;
            mpps[i].push(match busy {
                Some(b) if b > 0.01 => forwarded / b,
                _ => forwarded,
            });
            miss_share[i].push(misses as f64 / got.max(1) as f64);
            if let Some(s) = stats {
                synced.push(json!({
                    "scans_in_sample": scans_in_sample,
                    "scans": s.scans,
                    "scan_ms": s.scan_ms,
                    "scanned": s.scanned,
                    "exceptions": s.exceptions,
                    "sent_entries": s.sent_entries,
                    "sent_datagrams": s.sent_datagrams,
                    "send_errors": s.send_errors,
                }));
            }
        }
    }
    let _ = std::fs::remove_file(&key);
    drop(peer);
    let ratios: Vec<f64> = mpps[1]
        .iter()
        .zip(&mpps[0])
        .map(|(on, off)| on / off)
        .collect();
    let (off, on, ratio) = (
        median(mpps[0].clone()),
        median(mpps[1].clone()),
        median(ratios),
    );
    let per_core = timing.lb_napi.is_some();
    println!(
        "\nnew flows (every frame a SYN of a flow not in the table), {}:",
        if per_core { "Mpps/core" } else { "Mpps" }
    );
    println!(
        "  sync off {off:.3}  sync on {on:.3}  on/off {ratio:.3}  (misses per frame {:.2} / {:.2})",
        median(miss_share[0].clone()),
        median(miss_share[1].clone())
    );
    if let Some(last) = synced.last() {
        println!("  a sync-on sample: {last}");
    }
    json!({
        "flows": NEW_FLOWS,
        "seconds_per_sample": secs,
        "mpps_is_per_lb_core": per_core,
        "sync_off_mpps": off,
        "sync_on_mpps": on,
        "ratio_on_to_off": ratio,
        "samples_off_mpps": mpps[0],
        "samples_on_mpps": mpps[1],
        "misses_per_frame_off": median(miss_share[0].clone()),
        "misses_per_frame_on": median(miss_share[1].clone()),
        "sync_samples": synced,
        "sync_interval_ms": cfg.interval_ms,
        "sync_max_entries": cfg.max_entries,
    })
}

/// The kernel's `Udp: RcvbufErrors` in namespace `ns` (`/proc/net/snmp`): datagrams dropped
/// on a full socket receive queue, any socket of the namespace.
fn rcvbuf_errors(ns: &str) -> u64 {
    let out = sh(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "RcvbufErrors")
        .expect("Udp RcvbufErrors in /proc/net/snmp");
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// Samples of [`sync_receive`].
const RECEIVE_SAMPLES: usize = 3;
/// Receiving peers in [`sync_receive`].
const RECEIVERS: u8 = 2;

/// Two peers receiving a node's sync while its table fills at the new-flow rate: each sample
/// starts lbd's sync task on the pinned tables (the owner) and one in each peer's namespace
/// (backups: the same services, not forwarded there; they install into the same pinned
/// tables, where the owner's entries already are, and scan them every `interval_ms` as a
/// backup scans its own), then SYNs of new flows for the sample, the VIP's set changing from
/// three to four backends one second in: a quarter of the entries written so far leave their
/// slot, so the owner's scan after the change finds exceptions up to `max_entries` and sends
/// them at once (about 2,980 datagrams per peer at the default bound), while the peers scan
/// too. Each peer's namespace's `Udp: RcvbufErrors` is read before and after, with each task's
/// counters. Every task has a runtime (one worker) of its own, as each lbd has.
fn sync_receive(
    t: &mut TestDataplane,
    progs: &mut BenchProgs,
    wire: &Wire,
    timing: Timing,
) -> serde_json::Value {
    use lb_userspace::{
        daemon::sync::SyncHandle,
        sync::config::{DEFAULT_INTERVAL_MS, DEFAULT_MAX_ENTRIES, DEFAULT_PORT, SyncConfig},
    };
    use std::os::unix::fs::PermissionsExt;

    let peers: Vec<SyncPeer> = (0..RECEIVERS)
        .map(|i| SyncPeer::new(&wire.lb_ns, i))
        .collect();
    let key = std::env::temp_dir().join(unique("lb-tp-sync-key"));
    std::fs::write(&key, unique("bench-sync-key-").repeat(4)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let base = SyncConfig {
        peers: Vec::new(),
        key_file: key.clone(),
        accept_key_files: Vec::new(),
        port: DEFAULT_PORT,
        listen: None,
        interval_ms: DEFAULT_INTERVAL_MS,
        max_entries: DEFAULT_MAX_ENTRIES,
    };
    let owner_cfg = SyncConfig {
        peers: peers.iter().map(|p| p.addr().parse().unwrap()).collect(),
        ..base.clone()
    };
    let pin_dir = t.opts.pin_dir();
    // Binding fails while the previous sample's task still holds the port: retry briefly.
    let spawn = |rt: &tokio::runtime::Runtime, ns: &str, cfg: &SyncConfig| {
        spawn_sync(rt, ns, cfg, &pin_dir)
    };
    let backup_view = |t: &TestDataplane| {
        let mut v = t.dp.sync_view();
        for s in &mut v.services {
            s.owned = false;
        }
        v
    };
    let secs = timing.secs.max(NEW_FLOW_MIN_SECS);
    let gen_fd = progs.prog_fd("bench_gen");
    let gen_ns = Wire::path(&wire.gen_ns);
    let mut samples = Vec::new();
    println!(
        "\nsync received by {RECEIVERS} peers while the table fills with new flows (the set changes 1 s into each {secs} s sample):"
    );
    println!(
        "{:<7} {:>10} {:>10} {:>8} {:>10} {:>10} {:>9} {:>13} {:>13}",
        "sample",
        "exceptions",
        "owner scan",
        "peer",
        "sent dgrams",
        "received",
        "refused",
        "RcvbufErrors",
        "receive_drops"
    );
    for sample in 0..RECEIVE_SAMPLES {
        t.dp.apply(&sync_services(3)).expect("three backends");
        let rts: Vec<tokio::runtime::Runtime> = (0..=RECEIVERS)
            .map(|_| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap()
            })
            .collect();
        let errors_before: Vec<u64> = peers.iter().map(|p| rcvbuf_errors(&p.ns)).collect();
        let receivers: Vec<SyncHandle> = peers
            .iter()
            .zip(&rts[1..])
            .map(|(p, rt)| {
                let cfg = SyncConfig {
                    peers: vec![p.lb_addr().parse().unwrap()],
                    listen: Some(p.addr().parse().unwrap()),
                    ..base.clone()
                };
                let h = spawn(rt, &p.ns, &cfg);
                h.view(backup_view(t));
                h
            })
            .collect();
        let owner = spawn(&rts[0], &wire.lb_ns, &owner_cfg);
        owner.view(t.dp.sync_view());
        progs.set_flows(NEW_FLOWS);
        let port = 30_000 + sample as u16;
        let syn = ipv4_frame([10, 200, 0, 1], VIP, PROTO_TCP, &tcp(port, 6443, SYN));
        let before = progs.sunk();
        let (_, elapsed) = std::thread::scope(|s| {
            let g = s.spawn(|| generate(&gen_ns, gen_fd, &syn, secs, timing.gen_cpu));
            std::thread::sleep(Duration::from_secs(1));
            t.dp.apply(&sync_services(4)).expect("four backends");
            owner.view(t.dp.sync_view());
            for r in &receivers {
                r.view(backup_view(t));
            }
            g.join().unwrap()
        });
        let new_flows_mpps = (progs.sunk() - before) as f64 / elapsed / 1e6;
        // The owner's scans after the change have sent (the last within an interval of the
        // sample's end); the peers then read what is queued.
        std::thread::sleep(Duration::from_millis(DEFAULT_INTERVAL_MS + 500));
        // A scan in progress runs to its end after the handle goes, and the peers read what is
        // queued: the counts are read once neither changed for 2 s (longer than a scan).
        let owner_stats = owner.stats.clone();
        drop(owner);
        let counts = || {
            let o = owner_stats.snapshot();
            let got: Vec<_> = receivers.iter().map(|h| h.stats.snapshot()).collect();
            let key: Vec<u64> = std::iter::once(o.sent_datagrams)
                .chain(got.iter().map(|r| r.received_datagrams))
                .collect();
            (o, got, key)
        };
        let (mut o, mut got, mut key) = counts();
        let mut still = Instant::now();
        while still.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(250));
            let now = counts();
            if now.2 != key {
                still = Instant::now();
            }
            (o, got, key) = now;
        }
        let errors: Vec<u64> = peers
            .iter()
            .zip(&errors_before)
            .map(|(p, b)| rcvbuf_errors(&p.ns) - b)
            .collect();
        drop(receivers);
        drop(rts);
        let mut per_peer = Vec::new();
        for ((p, r), e) in peers.iter().zip(&got).zip(&errors) {
            let addr: std::net::IpAddr = p.addr().parse().unwrap();
            let sent = o
                .peers
                .iter()
                .find(|x| x.address == addr)
                .map_or(0, |x| x.sent_datagrams);
            let refused =
                r.refused.not_a_peer + r.refused.auth + r.refused.malformed + r.refused.replay;
            println!(
                "{:<7} {:>10} {:>10} {:>8} {:>10} {:>10} {:>9} {:>13} {:>13}",
                sample + 1,
                o.exceptions,
                format!("{} ms", o.scan_ms),
                p.addr(),
                sent,
                r.received_datagrams,
                refused,
                e,
                r.receive_drops
            );
            per_peer.push(json!({
                "peer": p.addr(),
                "sent_datagrams_to_it": sent,
                "received_datagrams": r.received_datagrams,
                "received_entries": r.received_entries,
                "refused_datagrams": refused,
                "earlier_run_entries": r.refused.earlier_run,
                "already_present": r.already_present,
                "installed": r.installed,
                "rcvbuf_errors": e,
                "receive_drops": r.receive_drops,
                "scans": r.scans,
                "scan_ms": r.scan_ms,
            }));
        }
        samples.push(json!({
            "new_flows_mpps": new_flows_mpps,
            "owner": {
                "scans": o.scans,
                "scan_ms": o.scan_ms,
                "scanned": o.scanned,
                "exceptions": o.exceptions,
                "sent_datagrams": o.sent_datagrams,
                "send_errors": o.send_errors,
            },
            "peers": per_peer,
        }));
    }
    let _ = std::fs::remove_file(&key);
    drop(peers);
    println!(
        "sent dgrams: the owner's to that peer; received: accepted by the peer's task; RcvbufErrors: the peer namespace's Udp counter over the sample; receive_drops: the peer's socket drops as of its last scan."
    );
    json!({
        "receivers": RECEIVERS,
        "seconds_per_sample": secs,
        "set_change_after_s": 1,
        "sync_interval_ms": DEFAULT_INTERVAL_MS,
        "sync_max_entries": DEFAULT_MAX_ENTRIES,
        "samples": samples,
    })
}

/// The sync task in namespace `ns` on runtime `rt`. Binding fails while the previous sample's
/// task still holds the port: retry briefly.
fn spawn_sync(
    rt: &tokio::runtime::Runtime,
    ns: &str,
    cfg: &lb_userspace::sync::config::SyncConfig,
    pin_dir: &std::path::Path,
) -> lb_userspace::daemon::sync::SyncHandle {
    let start = Instant::now();
    loop {
        let r = Wire::within(ns, || {
            let _g = rt.enter();
            lb_userspace::daemon::sync::SyncHandle::spawn(cfg, pin_dir.to_path_buf())
        });
        match r {
            Ok(h) => return h,
            Err(e) if start.elapsed() > Duration::from_secs(5) => {
                panic!("start a sync task: {e:#}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The sync benches' one service: the VIP's 6443 over `n` backends (10.77.0.11 on).
fn sync_services(n: u8) -> Desired {
    Desired {
        services: vec![ServiceSpec {
            key: vip_key(VIP.into(), 6443, PROTO_TCP),
            owned: true,
            backends: (11..11 + n)
                .map(|i| backend(&format!("10.77.0.{i}"), i))
                .collect(),
        }],
        ..Default::default()
    }
}
