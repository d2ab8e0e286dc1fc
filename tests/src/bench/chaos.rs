//! `bench chaos`: the fault matrix of [`crate::chaos`] under client load. Every case alone in
//! order, then all again in an order shuffled from a seed (`LB_CHAOS_SEED`, default: from the
//! clock, printed), against lbd; then cases 1-4, 6, 8 and 11 against keepalived + haproxy.
//! Writes `chaos.json` (`{"seed", "cases": [...]}`, lbd's runs), `chaos-detail.json` (every
//! run with owners, restarts, error kinds and notes, both flavors) and prints the tables.
//!
//! `LB_CHAOS_CASES=1,3,7` runs only those cases; `LB_CHAOS_SHUFFLED=0` skips the shuffled pass;
//! `LB_CHAOS_KEEPALIVED=0` skips keepalived + haproxy.

use serde_json::json;

use super::write_json;
use crate::chaos::{
    Case, CaseResult, Chaos, Rng, keepalived::KeepalivedFlavor, lbd::LbdFlavor, run_cases, shuffle,
    table_header, table_row,
};

fn env_flag(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

/// The seed: `LB_CHAOS_SEED`, the bench's second argument, or the clock.
pub fn seed() -> u64 {
    std::env::var("LB_CHAOS_SEED")
        .ok()
        .or_else(|| std::env::args().nth(2))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}

fn chosen() -> Vec<Case> {
    match std::env::var("LB_CHAOS_CASES") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .filter_map(Case::from_number)
            .collect(),
        Err(_) => Case::ALL.to_vec(),
    }
}

fn print_table(title: &str, rows: &[CaseResult]) {
    println!("\n{title}");
    println!("{}", table_header());
    for r in rows {
        println!("{}", table_row(r));
    }
}

/// Markdown: lbd (its run in order, else the shuffled one) next to keepalived + haproxy for the
/// cases both ran.
fn side_by_side(in_order: &[CaseResult], shuffled: &[CaseResult], ka: &[CaseResult]) -> String {
    let ran = |r: &&CaseResult| r.new_attempted > 0;
    let lbd: Vec<CaseResult> = ka
        .iter()
        .filter_map(|k| {
            in_order
                .iter()
                .filter(ran)
                .chain(shuffled.iter().filter(ran))
                .find(|l| l.name == k.name)
                .cloned()
        })
        .collect();
    let mut s = String::from(
        "| case | lbd new failed | lbd lost/expected | lbd gap ms | lbd dual ms | lbd ok | keepalived+haproxy new failed | lost/expected | gap ms | dual ms | ok |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for k in ka {
        let Some(l) = lbd.iter().find(|l| l.name == k.name) else {
            continue;
        };
        let cell = |r: &CaseResult| {
            format!(
                "{}/{} | {}/{} | {:.0} | {:.0} | {}",
                r.new_failed,
                r.new_attempted,
                r.long_lived_lost,
                r.long_lived_lost_expected,
                r.max_gap_ms,
                r.dual_master_ms,
                if r.ok { "yes" } else { "no" }
            )
        };
        s += &format!("| {} | {} | {} |\n", k.name, cell(l), cell(k));
    }
    s
}

pub fn run() {
    let seed = seed();
    let cases = chosen();
    println!(
        "chaos: seed {seed} (LB_CHAOS_SEED={seed} reruns this order), cases {:?}",
        cases.iter().map(|c| c.number()).collect::<Vec<_>>()
    );
    let t = std::time::Instant::now();
    let (in_order, shuffled, order) = {
        let mut ch = Chaos::start(Box::new(LbdFlavor::new()));
        let in_order = run_cases(&mut ch, &cases, seed, "in order");
        let mut order = cases.clone();
        let shuffled = if env_flag("LB_CHAOS_SHUFFLED") {
            shuffle(&mut Rng::new(seed), &mut order);
            run_cases(&mut ch, &order, seed.wrapping_add(1), "shuffled")
        } else {
            Vec::new()
        };
        (in_order, shuffled, order)
    };
    print_table("lbd, each case alone in order", &in_order);
    if !shuffled.is_empty() {
        print_table(
            &format!(
                "lbd, shuffled (seed {seed}): {:?}",
                order.iter().map(|c| c.number()).collect::<Vec<_>>()
            ),
            &shuffled,
        );
    }
    let ka = if env_flag("LB_CHAOS_KEEPALIVED") {
        let mut ch = Chaos::start(Box::new(KeepalivedFlavor::new()));
        let r = run_cases(&mut ch, &cases, seed, "keepalived");
        print_table("keepalived + haproxy (OpenShift's settings)", &r);
        r
    } else {
        Vec::new()
    };
    if !ka.is_empty() {
        println!("\n{}", side_by_side(&in_order, &shuffled, &ka));
    }
    let all: Vec<&CaseResult> = in_order.iter().chain(&shuffled).collect();
    let failed: Vec<&str> = all
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.name.as_str())
        .collect();
    println!(
        "\nlbd: {} of {} case runs met every target{}; total {:.0} s",
        all.len() - failed.len(),
        all.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" (missed: {})", failed.join(", "))
        },
        t.elapsed().as_secs_f64()
    );
    write_json(
        "chaos",
        &json!({
            "seed": seed,
            "cases": all.iter().map(|r| r.json()).collect::<Vec<_>>(),
        }),
    );
    write_json(
        "chaos-detail",
        &json!({
            "seed": seed,
            "order": order.iter().map(|c| c.number()).collect::<Vec<_>>(),
            "lbd_in_order": in_order.iter().map(|r| r.detail_json()).collect::<Vec<_>>(),
            "lbd_shuffled": shuffled.iter().map(|r| r.detail_json()).collect::<Vec<_>>(),
            "keepalived_haproxy": ka.iter().map(|r| r.detail_json()).collect::<Vec<_>>(),
        }),
    );
}
