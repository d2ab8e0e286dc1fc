//! `bench failover`: after a node failure of the VRRP master (its link goes down, its daemon is
//! killed with SIGKILL), the time until the client gets a first answer through the VIP, and
//! until it is fully restored (every new connection succeeds: no dead backend left in the
//! owner's rotation), repeated, in the same run for:
//! - lbd with its defaults (VRRPv3, 100 ms adverts, 200 ms TCP checks, fate sharing);
//! - keepalived + haproxy as OpenShift renders them (VRRPv2, advert_int 1, unicast, PASS auth;
//!   haproxy `check inter 5s fall 3 rise 1`): fully restored includes haproxy noticing the
//!   dead node's server;
//! - the same keepalived + haproxy with VRRPv3 at 100 ms adverts, so the table shows what comes
//!   from the interval and what from lbd;
//! - OpenShift's real priorities: an equal base priority on every node plus tracked weights
//!   (+28: haproxy +20, apiserver +5, machine-config-server +3; all passing), VRRPv2 1 s.
//!
//! Each side runs three nodes (priorities 150, 100, 50 unless said otherwise; preemption on) and
//! a client on one bridge in network namespaces; every node runs a `labnode serve-id` server
//! (the "apiserver"), and all three are backends. The lbd owner forwards with XDP to the nodes
//! (DSR); the keepalived owner's haproxy balances over them. The client starts a short TCP
//! connection (200 ms timeout) every 20 ms without waiting for earlier ones
//! (`VrrpLab::restored_since`): first answer is the first that succeeds; fully restored is the
//! start of 30 consecutive successes with no failure after. Each failure happens at a random
//! point of the advert cycle. After each failure the node comes back and the lab settles.
//! `LB_FAILOVER_ROUNDS` (default 10) sets the repetitions.
//!
//! Fast failover: lbd at `FAST_ADVERT_MS` adverts (the same three nodes), measured like the
//! rest, and a stress case: the same lab left alone for `LB_FAILOVER_STRESS_SECS` (default 300)
//! with every core kept busy (two spinning threads per CPU) and short connections through the
//! owner as fast as 32 concurrent clients go; a false failover is a backup that became master
//! meanwhile (lbd's `became_master` counter). `LB_FAILOVER_RT_PRIORITY` sets the fast nodes'
//! `vrrp_rt_priority` (0: their VRRP threads at normal priority).
//!
//! Advert flood: two lbd nodes; the client, as a foreign router on the segment, floods the master
//! with adverts of the instance's VRID (another VIP set, priority 255) at `FLOOD_PPS` for
//! `FLOOD_SECS`. The master lbd's CPU (user + system, /proc) over the flood as a share of one
//! core, against a target of `FLOOD_CPU_TARGET`; that the VIP stayed is asserted by
//! `lab_vrrp_trust`. `LB_FAILOVER_ONLY=advert_flood` runs it alone.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;

use super::{median, write_json};
use crate::vrrp_lab::{NodeOpts, VrrpLab};

fn rounds() -> usize {
    std::env::var("LB_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(1)
}

/// A pseudo-random delay below `ms` milliseconds.
fn jitter(ms: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let x = u64::from(nanos).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    Duration::from_millis(x % u64::from(ms.max(1)))
}

/// One column of the table.
struct Setup {
    name: &'static str,
    key: &'static str,
    base: NodeOpts,
    priorities: [u8; 3],
    limit: Duration,
}

/// (first answer, fully restored) in ms per round.
type Rounds = Vec<(f64, f64)>;

/// Fail the master `rounds` times.
fn measure(s: &Setup, rounds: usize) -> Rounds {
    let labnode = crate::bin_dir().join("labnode");
    let opts: Vec<NodeOpts> = s
        .priorities
        .into_iter()
        .map(|priority| NodeOpts {
            priority,
            ..s.base.clone()
        })
        .collect();
    let mut l = VrrpLab::new(&labnode.display().to_string(), opts);
    let all = [0, 1, 2];
    let what = s.key;
    let mut out = Vec::new();
    for r in 0..rounds {
        let m = l
            .wait_one_master(&all, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{what}: no single master\n{}", l.logs()));
        assert!(
            l.wait_serving(Duration::from_secs(20)),
            "{what}: client not served before round {r}\n{}",
            l.logs()
        );
        // Every backend back in rotation before the next failure (haproxy: rise 1 at 5 s).
        std::thread::sleep(if s.base.haproxy {
            Duration::from_secs(6)
        } else {
            Duration::from_secs(1)
        });
        // Fail at a random point of the advert cycle (the backups' timers run from the last
        // advert they heard), not always at the same phase.
        std::thread::sleep(jitter(s.base.advert_ms));
        let start = Instant::now();
        l.fail_node(m);
        let (first, full) = l.restored_since(start, s.limit, 30);
        let ms = |d: Option<Duration>, what_: &str| match d {
            Some(d) => d.as_secs_f64() * 1000.0,
            None => {
                eprintln!(
                    "{what}: round {r}: no {what_} within {:?}; counted as that",
                    s.limit
                );
                s.limit.as_secs_f64() * 1000.0
            }
        };
        let (first, full) = (ms(first, "answer"), ms(full, "full restore"));
        println!(
            "  {what:<16} round {:>2}: first answer {first:>7.0} ms, fully restored {full:>7.0} ms",
            r + 1
        );
        out.push((first, full));
        l.restore_node(m);
    }
    out
}

/// lbd's fast-failover advert interval (what `lbctl render`'s `fast_failover` writes).
pub const FAST_ADVERT_MS: u32 = lb_userspace::vrrp::config::FAST_ADVERT_INTERVAL_MS;

/// `LB_FAILOVER_RT_PRIORITY`: the lbd nodes' `vrrp_rt_priority` in the fast cases (unset:
/// lbd's default; 0: normal scheduling), to compare the stress case with and without it.
fn rt_priority_line() -> String {
    std::env::var("LB_FAILOVER_RT_PRIORITY")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
        .map(|p| format!("vrrp_rt_priority = {p}\n"))
        .unwrap_or_default()
}

fn stress_secs() -> u64 {
    std::env::var("LB_FAILOVER_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// What the stress case saw: false failovers, the owner's transitions, connections ok/failed.
struct Stress {
    false_failovers: u64,
    owner_transitions: u64,
    ok: u64,
    failed: u64,
    secs: u64,
}

/// The fast setting left alone under load: every core busy and heavy traffic through the
/// owner; count backups that became master.
fn stress(secs: u64) -> Stress {
    let labnode = crate::bin_dir().join("labnode");
    let opts = [150, 100, 50]
        .into_iter()
        .map(|priority| NodeOpts {
            priority,
            advert_ms: FAST_ADVERT_MS,
            top: rt_priority_line(),
            ..NodeOpts::default()
        })
        .collect();
    let l = VrrpLab::new(&labnode.display().to_string(), opts);
    let all = [0, 1, 2];
    let owner = l
        .wait_one_master(&all, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("stress: no single master\n{}", l.logs()));
    assert!(
        l.wait_serving(Duration::from_secs(20)),
        "stress: client not served\n{}",
        l.logs()
    );
    let became = |i: usize| {
        l.status(i)
            .and_then(|v| v["counters"]["became_master"].as_u64())
            .unwrap_or_else(|| panic!("stress: no status from node {i}\n{}", l.logs()))
    };
    let before: Vec<u64> = all.iter().map(|&i| became(i)).collect();
    let owner_before = l.transitions(owner).unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spinners: Vec<_> = (0..2 * cpus)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let out = l
        .lab
        .cmd("client", &labnode)
        .args([
            "connect-for",
            l.vip,
            crate::vrrp_lab::PORT,
            &secs.to_string(),
            "32",
            "1000",
        ])
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let after: Vec<u64> = all.iter().map(|&i| became(i)).collect();
    let false_failovers = all
        .iter()
        .filter(|&&i| i != owner)
        .map(|&i| after[i] - before[i])
        .sum();
    Stress {
        false_failovers,
        owner_transitions: l.transitions(owner).unwrap_or(0) - owner_before,
        ok: v["ok"].as_u64().unwrap_or(0),
        failed: v["failed"].as_u64().unwrap_or(0),
        secs,
    }
}

/// Adverts per second of the flood (a real router sends 10 at 1 s adverts, 50 at 20 ms).
const FLOOD_PPS: u64 = 20_000;
const FLOOD_SECS: f64 = 5.0;
/// The master may use at most this share of one core while flooded at `FLOOD_PPS`.
const FLOOD_CPU_TARGET: f64 = 0.5;

/// What the advert flood cost the master.
struct Flood {
    sent: u64,
    secs: f64,
    /// The master lbd's CPU over the flood, and over 3 s before it, as shares of one core.
    busy: f64,
    idle: f64,
    /// Adverts the master counted as dropped (`other_vips`).
    counted: u64,
    vip_stayed: bool,
}

fn advert_flood() -> Flood {
    let labnode = crate::bin_dir().join("labnode");
    let opts = [150, 100]
        .into_iter()
        .map(|priority| NodeOpts {
            priority,
            ..NodeOpts::default()
        })
        .collect();
    let mut l = VrrpLab::new(&labnode.display().to_string(), opts);
    let master = l
        .wait_one_master(&[0, 1], Duration::from_secs(30))
        .unwrap_or_else(|| panic!("advert flood: no single master\n{}", l.logs()));
    let cpu = |l: &VrrpLab| {
        l.cpu_seconds(master)
            .unwrap_or_else(|| panic!("advert flood: no CPU time of the master"))
    };
    let c0 = cpu(&l);
    std::thread::sleep(Duration::from_secs(3));
    let idle = (cpu(&l) - c0) / 3.0;
    let (vrid, pps, secs) = (
        crate::vrrp_lab::VRID.to_string(),
        FLOOD_PPS.to_string(),
        FLOOD_SECS.to_string(),
    );
    let c0 = cpu(&l);
    let t = Instant::now();
    let sent = l.vrrp_send_from_client(
        &labnode.display().to_string(),
        "flood",
        &["224.0.0.18", &vrid, "255", "10.78.0.200", &pps, &secs],
    );
    let wall = t.elapsed().as_secs_f64();
    let busy = (cpu(&l) - c0) / wall;
    let counted = l
        .status(master)
        .and_then(|v| v["counters"]["drops"]["other_vips"].as_u64())
        .unwrap_or(0);
    Flood {
        sent,
        secs: wall,
        busy,
        idle,
        counted,
        vip_stayed: l.holders(&[0, 1]) == vec![master],
    }
}

fn setups() -> Vec<Setup> {
    let ka = NodeOpts {
        haproxy: true,
        ..NodeOpts::openshift_keepalived(100)
    };
    vec![
        Setup {
            name: "lbd (VRRPv3 100 ms, 200 ms checks, fate sharing)",
            key: "lbd",
            base: NodeOpts::default(),
            priorities: [150, 100, 50],
            limit: Duration::from_secs(10),
        },
        Setup {
            name: "lbd fast (VRRPv3 20 ms, 200 ms checks, fate sharing)",
            key: "lbd_fast",
            base: NodeOpts {
                advert_ms: FAST_ADVERT_MS,
                top: rt_priority_line(),
                ..NodeOpts::default()
            },
            priorities: [150, 100, 50],
            limit: Duration::from_secs(10),
        },
        Setup {
            name: "keepalived+haproxy (VRRPv3 100 ms)",
            key: "keepalived_v3_100ms",
            base: NodeOpts {
                version: 3,
                advert_ms: 100,
                auth_pass: None,
                ..ka.clone()
            },
            priorities: [150, 100, 50],
            limit: Duration::from_secs(30),
        },
        Setup {
            name: "keepalived+haproxy (OpenShift: v2, 1 s, PASS)",
            key: "keepalived",
            base: ka.clone(),
            priorities: [150, 100, 50],
            limit: Duration::from_secs(30),
        },
        Setup {
            name: "keepalived+haproxy (OpenShift: base 40 + 28 tracked)",
            key: "keepalived_openshift_weights",
            base: NodeOpts {
                track_weight: Some(28),
                ..ka
            },
            priorities: [40, 40, 40],
            limit: Duration::from_secs(30),
        },
    ]
}

pub fn run() {
    let n = rounds();
    let t = Instant::now();
    let only = std::env::var("LB_FAILOVER_ONLY").ok();
    let mut results: Vec<(&Setup, Rounds)> = Vec::new();
    let all = setups();
    for s in &all {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|k| k == s.key))
        {
            continue;
        }
        results.push((s, measure(s, n)));
    }
    let col = |r: &Rounds, f: fn(&(f64, f64)) -> f64| -> Vec<f64> { r.iter().map(f).collect() };
    let range = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        (median(v.to_vec()), min, max)
    };
    println!("\nnode failure of the VRRP master ({n} rounds each): median [min-max] ms");
    println!("{:<54} {:>22} {:>22}", "", "first answer", "fully restored");
    let mut columns = Vec::new();
    for (s, r) in &results {
        let (first, full) = (col(r, |x| x.0), col(r, |x| x.1));
        let ((fm, fmin, fmax), (rm, rmin, rmax)) = (range(&first), range(&full));
        println!(
            "{:<54} {:>6.0} [{:>5.0}-{:>5.0}] {:>6.0} [{:>5.0}-{:>5.0}]",
            s.name, fm, fmin, fmax, rm, rmin, rmax
        );
        columns.push(json!({
            "key": s.key,
            "name": s.name,
            "first_answer_ms": first,
            "fully_restored_ms": full,
            "first_answer_median_ms": fm,
            "fully_restored_median_ms": rm,
        }));
    }
    let median_of = |key: &str, f: fn(&(f64, f64)) -> f64| {
        results
            .iter()
            .find(|(s, _)| s.key == key)
            .map(|(_, r)| median(col(r, f)))
    };
    if let Some(lm) = median_of("lbd", |x| x.0) {
        println!(
            "target lbd median first answer < 500 ms: {}",
            if lm < 500.0 { "met" } else { "NOT met" }
        );
    }
    let fast = median_of("lbd_fast", |x| x.0);
    let stressed = fast.map(|_| {
        let s = stress(stress_secs());
        println!(
            "stress (lbd fast, {} s, every core busy, 32 concurrent clients): false failovers {}, owner transitions {}, connections ok {} failed {}",
            s.secs, s.false_failovers, s.owner_transitions, s.ok, s.failed
        );
        s
    });
    if let (Some(fm), Some(s)) = (fast, &stressed) {
        println!(
            "target lbd fast median first answer <= 100 ms with 0 false failovers: {}",
            if fm <= 100.0 && s.false_failovers == 0 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    let flood = only
        .as_deref()
        .is_none_or(|o| o.split(',').any(|k| k == "advert_flood"))
        .then(advert_flood);
    if let Some(f) = &flood {
        println!(
            "advert flood: {} foreign adverts in {:.1} s ({:.0}/s): master lbd {:.1}% of a core (idle {:.1}%), {} counted, VIP stayed: {}",
            f.sent,
            f.secs,
            f.sent as f64 / f.secs,
            f.busy * 100.0,
            f.idle * 100.0,
            f.counted,
            f.vip_stayed
        );
        println!(
            "target master below {:.0}% of a core under {FLOOD_PPS} adverts/s: {}",
            FLOOD_CPU_TARGET * 100.0,
            if f.busy < FLOOD_CPU_TARGET && f.vip_stayed {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    println!("total {:.0} s", t.elapsed().as_secs_f64());
    let first_of = |key: &str| {
        results
            .iter()
            .find(|(s, _)| s.key == key)
            .map(|(_, r)| col(r, |x| x.0))
    };
    write_json(
        "failover",
        &json!({
            "rounds": n,
            "columns": columns,
            // Earlier schema: first answer only.
            "lbd_ms": first_of("lbd"),
            "keepalived_ms": first_of("keepalived"),
            "lbd_median_ms": median_of("lbd", |x| x.0),
            "keepalived_median_ms": median_of("keepalived", |x| x.0),
            "lbd_fast_interval_ms": fast.map(|_| FAST_ADVERT_MS),
            "lbd_fast_median_ms": fast,
            "lbd_fast_restored_median_ms": median_of("lbd_fast", |x| x.1),
            "false_failovers_under_stress": stressed.as_ref().map(|s| s.false_failovers),
            "vrrp_rt_priority": std::env::var("LB_FAILOVER_RT_PRIORITY").ok(),
            "advert_flood": flood.as_ref().map(|f| json!({
                "target_pps": FLOOD_PPS,
                "sent": f.sent,
                "seconds": f.secs,
                "master_cpu_share": f.busy,
                "idle_cpu_share": f.idle,
                "counted": f.counted,
                "vip_stayed": f.vip_stayed,
                "cpu_share_target": FLOOD_CPU_TARGET,
            })),
            "stress": stressed.as_ref().map(|s| json!({
                "seconds": s.secs,
                "owner_transitions": s.owner_transitions,
                "connections_ok": s.ok,
                "connections_failed": s.failed,
            })),
        }),
    );
}
