//! `bench slowstart`: how a backend that returns takes new connections again, lbd with the API
//! checks `lbctl render` writes (`rise = 20`, `slow_start_ms = 60000`) next to haproxy with the
//! settings OpenShift's API haproxy has since OCPBUGS-100065 (`inter 5s fastinter 2s fall 2 rise
//! 3 weight 256 slowstart 60s`), in the same lab at the same time.
//!
//! b1's `/readyz` answers 500 for 15 s (both take it out), then 200 again; a client stream
//! through each load balancer records which backend answered each new connection. The table is
//! b1's share of new connections in 5 s buckets after its return (a third is its full share).

use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    detect::{HAPROXY_PORT, HTTPS_PORT, HttpsLab, Kind, Sample, VIP, now_ms},
    write_json,
};

const BUCKET_MS: u128 = 5000;
const AFTER_MS: u128 = 75_000;

/// b1's share of new connections, and how many there were, per bucket from `from`.
fn buckets(samples: &[Sample], from: u128) -> Vec<(f64, u64)> {
    (0..AFTER_MS / BUCKET_MS)
        .map(|i| {
            let (lo, hi) = (from + i * BUCKET_MS, from + (i + 1) * BUCKET_MS);
            let ok: Vec<&str> = samples
                .iter()
                .filter(|s| s.at_ms >= lo && s.at_ms < hi)
                .filter_map(|s| s.result.as_deref().ok())
                .collect();
            let b1 = ok.iter().filter(|id| **id == "b1").count();
            (b1 as f64 / ok.len().max(1) as f64, ok.len() as u64)
        })
        .collect()
}

fn first_after(samples: &[Sample], from: u128) -> Option<u128> {
    samples
        .iter()
        .find(|s| s.at_ms >= from && s.result.as_deref() == Ok("b1"))
        .map(|s| s.at_ms - from)
}

pub fn run() {
    let started = Instant::now();
    let api = lb_userspace::render::api_health();
    let lbd_settings = format!("rise = {}\nslow_start_ms = {}", api.rise, api.slow_start_ms);
    let mut l = HttpsLab::setup_with(
        &[
            ("b1", Kind::Https),
            ("b2", Kind::Https),
            ("b3", Kind::Https),
        ],
        &lbd_settings,
    );
    let hp_server =
        "check check-ssl verify none inter 5s fastinter 2s fall 2 rise 3 weight 256 slowstart 60s";
    l.start_haproxy_with(hp_server);
    let hp_target = format!("{}:{HAPROXY_PORT}", l.addr("lb"));
    l.start_stream("s-lbd", &format!("{VIP}:{HTTPS_PORT}"), 2, 20);
    l.start_stream("s-hp", &hp_target, 2, 20);
    std::thread::sleep(Duration::from_secs(8));
    l.set_ready("b1", false);
    std::thread::sleep(Duration::from_secs(15));
    let back_at = now_ms();
    l.set_ready("b1", true);
    println!(
        "b1 unready for 15 s, ready again; following it for {} s",
        AFTER_MS / 1000
    );
    std::thread::sleep(Duration::from_millis(AFTER_MS as u64 + 500));
    l.lab.stop("s-lbd", libc::SIGTERM);
    l.lab.stop("s-hp", libc::SIGTERM);
    // lbd's failed checks per backend over the run: on a loaded machine a 200 ms check times
    // out now and then, and three in a row take a backend out (and restart b1's climb).
    let failed_checks: std::collections::BTreeMap<String, u64> = ["b1", "b2", "b3"]
        .iter()
        .map(|n| {
            let failed = l
                .rows(n)
                .and_then(|r| r[0]["check"]["checks_failed"].as_u64())
                .unwrap_or(0);
            (n.to_string(), failed)
        })
        .collect();
    let (lbd, hp) = (l.samples("s-lbd"), l.samples("s-hp"));
    let (lb_b, hp_b) = (buckets(&lbd, back_at), buckets(&hp, back_at));
    println!(
        "lbd: {}; haproxy: {hp_server}",
        lbd_settings.replace('\n', ", ")
    );
    println!("{:>9} {:>14} {:>14}", "after s", "lbd b1 %", "haproxy b1 %");
    for (i, (a, b)) in lb_b.iter().zip(&hp_b).enumerate() {
        println!(
            "{:>4}-{:<4} {:>8.1} ({:>4}) {:>8.1} ({:>4})",
            i as u128 * BUCKET_MS / 1000,
            (i as u128 + 1) * BUCKET_MS / 1000,
            a.0 * 100.0,
            a.1,
            b.0 * 100.0,
            b.1
        );
    }
    let (lf, hf) = (first_after(&lbd, back_at), first_after(&hp, back_at));
    println!("first new connection to b1 after its return: lbd {lf:?} ms, haproxy {hf:?} ms");
    println!("lbd's failed checks over the run (b1's 15 s unready included): {failed_checks:?}");
    let errors = |s: &[Sample]| s.iter().filter(|x| x.result.is_err()).count();
    println!(
        "failed requests: lbd {}, haproxy {}; total {:.0} s",
        errors(&lbd),
        errors(&hp),
        started.elapsed().as_secs_f64()
    );
    let series = |b: &[(f64, u64)]| {
        b.iter()
            .enumerate()
            .map(|(i, (share, n))| {
                json!({"from_s": i as u128 * BUCKET_MS / 1000, "b1_share": share, "connections": n})
            })
            .collect::<Vec<_>>()
    };
    write_json(
        "slowstart",
        &json!({
            "lbd_settings": lbd_settings,
            "haproxy_settings": hp_server,
            "bucket_ms": BUCKET_MS as u64,
            "lbd": series(&lb_b),
            "haproxy": series(&hp_b),
            "lbd_first_ms": lf.map(|v| v as u64),
            "haproxy_first_ms": hf.map(|v| v as u64),
            "lbd_failed": errors(&lbd),
            "lbd_failed_checks": failed_checks,
            "haproxy_failed": errors(&hp),
        }),
    );
}
