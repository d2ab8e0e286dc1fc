//! The short chaos run (cases 1, 3, 7 and 10 of `cargo xtask bench chaos`, and one node of its
//! rolling upgrade, case 14: the owner's node goes down, lbd and backend, and comes back) in
//! the lbd lab with the connection sync on, under the full client load, asserting every case's
//! targets; among them, that only connections whose backend was on a node that went down are
//! lost. Needs root; `cargo xtask test`. The numbers of each case are printed; the bench runs
//! all thirteen cases twice.

use lb_tests::{
    chaos::{Case, Chaos, lbd::LbdFlavor, run_cases, table_header, table_row},
    cluster::{CONTROL_PLANE, node_addr},
};
use lb_userspace::status::StatsRow;

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

    // What made it work is visible: every control-plane lbd syncs with the other two, has heard
    // from both, and `lbctl stats` prints them in its peer table; the upgrade's exceptions
    // crossed the cluster.
    // The last case may have just restarted a node: its peers answer its hello within a
    // settle period and send to it at every full scan (every fifth interval), so wait for that
    // before asking whether every peer was heard.
    let heard_all = lb_tests::lab::wait_for(std::time::Duration::from_secs(15), || {
        CONTROL_PLANE
            .iter()
            .all(|n| {
                let socket = ch.flavor.lab().dir.join(format!("{n}.sock"));
                let json =
                    lb_tests::lbctl_output(socket.to_str().unwrap(), &["-o", "json", "stats"]);
                serde_json::from_slice::<StatsRow>(&json.stdout)
                    .ok()
                    .and_then(|s| s.sync)
                    .is_some_and(|s| s.peers.iter().all(|p| p.last_received_unix_ms > 0))
            })
            .then_some(())
    });
    println!("every sync peer heard: {}", heard_all.is_some());
    let mut received = 0;
    for n in CONTROL_PLANE {
        let socket = ch.flavor.lab().dir.join(format!("{n}.sock"));
        let socket = socket.to_str().unwrap();
        let json = lb_tests::lbctl_output(socket, &["-o", "json", "stats"]);
        let stats: StatsRow = serde_json::from_slice(&json.stdout)
            .unwrap_or_else(|e| panic!("{n}: lbctl -o json stats: {e}"));
        let sync = stats
            .sync
            .unwrap_or_else(|| panic!("{n}: no sync in lbctl stats"));
        let mut peers: Vec<String> = sync.peers.iter().map(|p| p.address.to_string()).collect();
        peers.sort();
        let mut want: Vec<String> = CONTROL_PLANE
            .iter()
            .filter(|m| **m != n)
            .map(|m| node_addr(m))
            .collect();
        want.sort();
        assert_eq!(peers, want, "{n}: sync peers");
        received += sync.received_entries;
        let text = lb_tests::lbctl_output(socket, &["stats"]);
        let text = String::from_utf8_lossy(&text.stdout);
        println!("{n}: lbctl stats\n{text}");
        assert!(
            text.contains("SYNC PEER") && text.contains("LAG MS"),
            "{n}: {text}"
        );
        for p in &sync.peers {
            assert!(
                p.last_received_unix_ms > 0,
                "{n}: never heard from {}",
                p.address
            );
            let row = text
                .lines()
                .find(|l| l.starts_with(&p.address.to_string()))
                .unwrap_or_else(|| panic!("{n}: no row for {} in\n{text}", p.address));
            assert!(row.contains(" s ago"), "{n}: {row}");
        }
    }
    assert!(
        received > 0,
        "no exception entries crossed the cluster during the upgrade"
    );
}
