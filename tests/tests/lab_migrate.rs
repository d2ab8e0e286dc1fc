//! The migration from keepalived + haproxy to lb, rehearsed under the chaos lab's load (the
//! short version of `cargo xtask bench migrate`, see `lb_tests::bench::migrate`): three
//! control-plane nodes (keepalived, haproxy with TLS `/readyz` checks behind the `ocp_nat`
//! redirect) and two workers (keepalived for the ingress VIP) move one by one with the
//! documented steps, the cluster switches to VRRPv3 by rewriting the config files, goes back
//! to the migration profile, and one node returns to keepalived.
//! Needs root; `cargo xtask test`.

use lb_tests::bench::migrate::rehearse;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

#[test]
fn nodes_move_to_lb_and_back_without_two_masters() {
    let (steps, reference) = rehearse(LABNODE, 8);
    let reference = &reference[0];
    for s in &steps {
        println!("{s:?}");
        // Never two holders for longer than one sample (20 ms), never more than one move.
        assert!(s.dual_master_ms <= 20.0, "{s:?}");
        assert!(s.vip_moves <= 1, "{s:?}");
        assert!(s.new_attempted > 0, "{s:?}");
        // A step loses no more long-lived connections than keepalived + haproxy's own failover.
        assert!(
            s.long_lived_lost <= reference.long_lived_lost,
            "{s:?} vs {reference:?}"
        );
    }
    // Only the step that stops the VIP holder's keepalived moves the VIP; the profile switches
    // are in-place reloads: nothing moves, no long-lived connection is lost, and new ones fail
    // no more than a loaded lab's odd timeout (under 1%).
    assert_eq!(
        steps.iter().map(|s| s.vip_moves).sum::<u64>(),
        1,
        "{steps:?}"
    );
    // The workers' ingress VIP likewise: one move (its holder's step), never two holders.
    assert_eq!(
        steps.iter().map(|s| s.ingress_vip_moves).sum::<u64>(),
        1,
        "{steps:?}"
    );
    assert!(
        steps.iter().all(|s| s.ingress_dual_master_ms <= 20.0),
        "{steps:?}"
    );
    for s in steps.iter().filter(|s| s.step.contains("reload")) {
        assert_eq!(
            (s.vip_moves, s.new_failed, s.long_lived_lost),
            (0, 0, 0),
            "{s:?}"
        );
    }
}
