//! The short chaos run (cases 1, 3, 7 and 10 of `cargo xtask bench chaos`, and one node of its
//! rolling upgrade, case 14: the owner's node goes down, lbd and backend, and comes back) in
//! the lbd lab with the connection sync on, under the full client load, asserting every case's
//! targets; among them, that only connections whose backend was on a node that went down are
//! lost. Needs root; `cargo xtask test`. The numbers of each case are printed; the bench runs
//! all thirteen cases twice.

use lb_tests::chaos::{Case, Chaos, lbd::LbdFlavor, run_cases, table_header, table_row};

#[test]
fn chaos_short_owner_death_sigterm_reload_hostile_upgrade() {
    let seed = std::env::var("LB_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut ch = Chaos::start(Box::new(LbdFlavor::new()));
    let cases = [
        Case::NodeDies,
        Case::OwnerSigterm,
        Case::Reload,
        Case::HostileAdverts,
        Case::UpgradeOneNode,
    ];
    let results = run_cases(&mut ch, &cases, seed, "short");
    println!("{}", table_header());
    for r in &results {
        println!("{}", table_row(r));
    }
    let missed: Vec<String> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("{}: {}", r.name, r.notes.join("; ")))
        .collect();
    assert_eq!(results.len(), cases.len(), "every case ran");
    assert!(
        missed.is_empty(),
        "cases missed their targets (seed {seed}):\n{}",
        missed.join("\n")
    );
}
