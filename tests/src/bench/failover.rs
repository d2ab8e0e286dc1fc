//! `bench failover`: time from a node failure of the VRRP master (its link goes down, its
//! daemon is killed with SIGKILL) to the client getting answers through the VIP from the new
//! owner, repeated, for lbd with its default timers (VRRPv3, 100 ms adverts) and for keepalived
//! with OpenShift's settings (VRRPv2, advert_int 1, unicast peers, PASS auth), in the same run.
//!
//! Each side runs three nodes (priorities 150, 100, 50; preemption on, as both default) and a
//! client on one bridge in network namespaces; every node runs a `labnode serve-id` server. The
//! lbd owner forwards with XDP to the nodes (DSR); the keepalived owner serves the VIP it holds
//! on eth0 itself. The client starts a short TCP connection (200 ms timeout) every 20 ms
//! without waiting for earlier ones (`VrrpLab::answered_since`); the time is that of the first
//! answer. Each failure happens at a random point of the advert cycle. After each failure the
//! node comes back, preempts, and the lab settles before the next round.
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

/// Fail the master `rounds` times; milliseconds from the failure to the first answer.
fn measure(what: &str, base: NodeOpts, rounds: usize, limit: Duration) -> Vec<f64> {
    let labnode = crate::bin_dir().join("labnode");
    let opts: Vec<NodeOpts> = [150, 100, 50]
        .into_iter()
        .map(|priority| NodeOpts {
            priority,
            ..base.clone()
        })
        .collect();
    let mut l = VrrpLab::new(&labnode.display().to_string(), opts);
    let all = [0, 1, 2];
    let mut out = Vec::new();
    for r in 0..rounds {
        assert!(
            l.wait_master(0, Duration::from_secs(30)),
            "{what}: n1 never became master\n{}",
            l.logs()
        );
        let m = l
            .wait_one_master(&all, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{what}: no single master\n{}", l.logs()));
        assert!(
            l.wait_serving(Duration::from_secs(10)),
            "{what}: client not served before round {r}\n{}",
            l.logs()
        );
        // Fail at a random point of the advert cycle (the backups' timers run from the last
        // advert they heard), not always at the same phase.
        std::thread::sleep(jitter(base.advert_ms));
        let start = Instant::now();
        l.fail_node(m);
        let took = l.answered_since(start, limit);
        let ms = match took {
            Some(d) => d.as_secs_f64() * 1000.0,
            None => {
                eprintln!("{what}: round {r}: no answer within {limit:?}; counted as {limit:?}");
                limit.as_secs_f64() * 1000.0
            }
        };
        println!("  {what:<11} round {:>2}: {ms:>7.0} ms", r + 1);
        out.push(ms);
        l.restore_node(m);
    }
    out
}

pub fn run() {
    let n = rounds();
    let t = Instant::now();
    let lbd = measure("lbd", NodeOpts::default(), n, Duration::from_secs(10));
    let keepalived = measure(
        "keepalived",
        NodeOpts::openshift_keepalived(100),
        n,
        Duration::from_secs(20),
    );
    let (lm, km) = (median(lbd.clone()), median(keepalived.clone()));
    let stats = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        (min, max)
    };
    let ((lmin, lmax), (kmin, kmax)) = (stats(&lbd), stats(&keepalived));
    println!(
        "\nnode failure of the VRRP master -> client answered by the new owner ({n} rounds each)"
    );
    println!("{:<48} {:>9} {:>9} {:>9}", "", "median", "min", "max");
    println!(
        "{:<48} {:>6.0} ms {:>6.0} ms {:>6.0} ms",
        "lbd (VRRPv3, 100 ms adverts, multicast)", lm, lmin, lmax
    );
    println!(
        "{:<48} {:>6.0} ms {:>6.0} ms {:>6.0} ms",
        "keepalived (VRRPv2, advert_int 1, unicast, PASS)", km, kmin, kmax
    );
    println!(
        "lbd is {:.1}x faster; target lbd median < 500 ms: {}",
        km / lm,
        if lm < 500.0 { "met" } else { "NOT met" }
    );
    println!("total {:.0} s", t.elapsed().as_secs_f64());
    write_json(
        "failover",
        &json!({
            "lbd_ms": lbd,
            "keepalived_ms": keepalived,
            "lbd_median_ms": lm,
            "keepalived_median_ms": km,
        }),
    );
}
