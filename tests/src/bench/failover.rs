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

use std::time::{Duration, Instant};

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
        }),
    );
}
