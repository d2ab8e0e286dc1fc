//! Active-active VIPs over BGP ECMP through FRR (issue 12): three LB nodes announce the VIPs to
//! a router that spreads flows over them by the 5-tuple. Needs root and FRR; `cargo xtask test`.

use std::{collections::BTreeMap, time::Duration};

use lb_tests::bgp_lab::{
    BACKENDS, BFD_MS, BFD_MULT, BgpLab, LB_NODES, PORT, VIP4, VIP6, child_json,
};
use serde_json::Value;

/// Connections per backend within 15 % of its weight share.
fn assert_weighted(by_id: &Value, total: u64) {
    let by_id: BTreeMap<String, u64> = serde_json::from_value(by_id.clone()).unwrap();
    let sum: u32 = BACKENDS.iter().map(|(_, w)| w).sum();
    for (id, w) in BACKENDS {
        let want = total as f64 * w as f64 / sum as f64;
        let got = *by_id.get(id).unwrap_or(&0) as f64;
        assert!(
            (got - want).abs() / want <= 0.15,
            "{id}: {got} connections, want {want} +-15% ({by_id:?})"
        );
    }
}

fn status(l: &BgpLab, node: &str) -> Value {
    l.lbctl(node, &["bgp", "status"]).expect("lbctl bgp status")
}

#[test]
fn bgp_ecmp_all_nodes_forward_and_a_drained_node_loses_nothing() {
    let mut l = BgpLab::new();

    // Every node: the session is up with BFD, both host routes announced.
    for n in LB_NODES {
        let s = status(&l, n);
        assert_eq!(s["sessions"][0]["state"], "Established", "{n}: {s}");
        assert_eq!(s["sessions"][0]["bfd"], "up", "{n}: {s}");
        let prefixes = s["prefixes"].as_array().unwrap();
        assert_eq!(prefixes.len(), 2, "{n}: {s}");
        assert!(
            prefixes
                .iter()
                .all(|p| p["announce"] == true && p["installed"] == true),
            "{n}: {s}"
        );
        assert_eq!(s["bfd_detect_ms"], BFD_MS * BFD_MULT);
    }

    let text = String::from_utf8_lossy(
        &lb_tests::lbctl_output(&l.socket("lb2"), &["bgp", "status"]).stdout,
    )
    .to_string();
    for want in [
        "local AS 65001",
        "10.81.0.1 (router)",
        "Established",
        "10.83.0.10/32",
        "announced",
    ] {
        assert!(
            text.contains(want),
            "lbctl bgp status lacks {want:?}:\n{text}"
        );
    }

    // All three LB nodes forward at once, and backends get connections by weight.
    // 2400 connections each: the +-15 % bound is then over 4 standard deviations of the
    // binomial spread for a 1/4 share (600 for IPv6 failed it by chance: 176 against 172.5).
    for (vip, count) in [(VIP4, 2400u64), (VIP6, 2400)] {
        let before: Vec<u64> = LB_NODES.iter().map(|n| l.vip_packets(n)).collect();
        let r = l.client(&["connect-many", vip, PORT, &count.to_string(), "8", "3000"]);
        assert_eq!(r["ok"], count, "{vip}: every connection completes: {r}");
        assert_weighted(&r["by_id"], count);
        let deltas: Vec<u64> = LB_NODES
            .iter()
            .zip(&before)
            .map(|(n, b)| l.vip_packets(n) - b)
            .collect();
        let total: u64 = deltas.iter().sum();
        // Each connection sends at least SYN, ACK and FIN through an LB node.
        assert!(total >= 3 * count, "{vip}: LB nodes forwarded {deltas:?}");
        for (n, d) in LB_NODES.iter().zip(&deltas) {
            assert!(
                *d as f64 >= total as f64 * 0.15,
                "{vip}: {n} forwarded {d} of {total} packets ({deltas:?}): ECMP should spread flows"
            );
        }
    }

    // Drain lb1 while long-lived connections and a stream of new ones run: it is withdrawn,
    // its flows continue through the other nodes, nothing fails.
    let hold = l.client_spawn(&["hold-ids", VIP4, PORT, "24", "8", "100", "5"]);
    let short = l.client_spawn(&["connect-for", VIP4, PORT, "7", "2", "3000"]);
    std::thread::sleep(Duration::from_secs(2));
    let drained = l.lbctl("lb1", &["bgp", "drain"]).expect("lbctl bgp drain");
    assert_eq!(drained["node_drained"], true);
    let took = l.wait_nexthops(2, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "lb1 withdrawn from the router: {:?}",
        l.router_nexthops(VIP4)
    );
    assert!(!l.router_nexthops(VIP4).contains(&"10.81.0.11".to_string()));
    let s = status(&l, "lb1");
    for p in s["prefixes"].as_array().unwrap() {
        assert_eq!(p["announce"], false, "{s}");
        assert_eq!(p["installed"], false, "{s}");
        assert!(p["reason"].as_str().unwrap().contains("drained"), "{s}");
    }
    let text = String::from_utf8_lossy(
        &lb_tests::lbctl_output(&l.socket("lb1"), &["bgp", "status"]).stdout,
    )
    .to_string();
    assert!(
        text.contains("DRAINED") && text.contains("withdrawn"),
        "{text}"
    );
    let hold = child_json(hold);
    let short = child_json(short);
    assert_eq!(
        hold["failed_by_id"],
        serde_json::json!({}),
        "long-lived: {hold}"
    );
    let survived: u64 = hold["survived_by_id"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(survived, 24, "{hold}");
    assert_eq!(
        short["failed"], 0,
        "new connections during the drain: {short}"
    );
    assert!(short["ok"].as_u64().unwrap() > 20, "{short}");

    // A drained node gets no new flows.
    let before = l.vip_packets("lb1");
    let r = l.client(&["connect-many", VIP4, PORT, "300", "8", "3000"]);
    assert_eq!(r["ok"], 300, "{r}");
    assert_eq!(
        l.vip_packets("lb1"),
        before,
        "drained lb1 still receives traffic"
    );

    // The drain survives an lbd restart (an upgrade during maintenance).
    l.lab.stop("lbd-lb1", libc::SIGTERM);
    l.start_lbd("lb1");
    let back = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        let s = l.lbctl("lb1", &["bgp", "status"])?;
        (s["prefixes"].as_array()?.len() == 2).then_some(s)
    })
    .expect("restarted lbd answers");
    assert_eq!(back["node_drained"], true, "{back}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!l.router_nexthops(VIP4).contains(&"10.81.0.11".to_string()));

    // Undrain: back in the ECMP group.
    l.lbctl("lb1", &["bgp", "undrain"]).expect("undrain");
    assert!(
        l.wait_nexthops(3, Duration::from_secs(5)).is_some(),
        "{:?}",
        l.router_nexthops(VIP4)
    );
}

#[test]
fn bgp_node_death_keeps_established_flows_and_fails_new_ones_only_until_bfd_detects() {
    let mut l = BgpLab::new();
    let d = l.node_death("lb2");
    eprintln!("node death: {d:?}");
    assert!(
        d.withdrawn_after_ms.is_some(),
        "the router never dropped lb2: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
    assert!(!l.router_nexthops(VIP4).contains(&"10.81.0.12".to_string()));
    assert_eq!(d.failed_before_kill, 0, "{d:?}");
    assert_eq!(
        d.long_lived_lost, 0,
        "established connections survive on the other nodes: {d:?}"
    );
    // BFD detects in 300 ms; BGP, zebra and the kernel then update the route. The margin
    // covers scheduling on a loaded machine; `cargo xtask bench scale` reports the value.
    let detect = (BFD_MS * BFD_MULT) as f64;
    assert!(
        d.new_failed_ms <= detect + 700.0,
        "new connections failed for {} ms after the node died (BFD detection {detect} ms): {d:?}",
        d.new_failed_ms
    );
    let fib = d.fib_changed_ms.expect("the router's route changed");
    assert!(
        fib <= detect + 700.0,
        "router dropped lb2 after {fib} ms: {d:?}"
    );
    assert!(
        d.new_failed > 0,
        "some new connections hit the dead node before BFD: {d:?}"
    );
    assert!(d.new_ok > 20, "{d:?}");
    // The survivors still carry new connections.
    let r = l.client(&["connect-many", VIP4, PORT, "300", "8", "3000"]);
    assert_eq!(r["ok"], 300, "{r}");
}

#[test]
fn bgp_lbd_stop_withdraws_and_an_frr_restart_is_repaired() {
    let mut l = BgpLab::new();
    // lbd stops (SIGTERM): it withdraws its prefixes; the XDP program stays and keeps
    // forwarding what still arrives, so no connection fails meanwhile.
    let short = l.client_spawn(&["connect-for", VIP4, PORT, "4", "4", "3000"]);
    std::thread::sleep(Duration::from_secs(1));
    l.lab.stop("lbd-lb3", libc::SIGTERM);
    assert!(
        l.wait_nexthops(2, Duration::from_secs(5)).is_some(),
        "lb3 withdrawn when its lbd stopped: {:?}",
        l.router_nexthops(VIP4)
    );
    assert!(!l.router_nexthops(VIP4).contains(&"10.81.0.13".to_string()));
    let short = child_json(short);
    assert_eq!(short["failed"], 0, "{short}");
    // Started again, it announces again once its backends pass their checks.
    l.start_lbd("lb3");
    assert!(
        l.wait_nexthops(3, Duration::from_secs(20)).is_some(),
        "lb3 back: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );

    // FRR restarts on lb1 with an empty config: lbd notices and configures it again; the
    // announcement routes were in the kernel all along.
    l.restart_frr("lb1");
    assert!(
        l.wait_nexthops(3, Duration::from_secs(30)).is_some(),
        "lb1 announced again after its FRR restarted: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
    assert!(l.router_nexthops(VIP4).contains(&"10.81.0.11".to_string()));
    let r = l.client(&["connect-many", VIP4, PORT, "300", "8", "3000"]);
    assert_eq!(r["ok"], 300, "{r}");
}

/// What lbd announces stays true when someone else changes the node: FRR restarting with an
/// operator's own `router bgp` of the same AS (lbd's policies and neighbours gone, the
/// instance line there), and lbd's kernel routes flushed by hand. lbd checks its own objects
/// and the kernel's routes, and repairs both.
#[test]
fn bgp_lost_frr_objects_and_flushed_routes_are_repaired() {
    let mut l = BgpLab::new();
    assert!(
        l.wait_nexthops(3, Duration::from_secs(30)).is_some(),
        "all announced: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
    l.restart_frr_with(
        "lb1",
        &format!(
            "router bgp {}\n bgp router-id 10.81.0.11\nexit\n",
            lb_tests::bgp_lab::LB_ASN
        ),
    );
    assert!(
        l.wait_nexthops(3, Duration::from_secs(30)).is_some(),
        "lb1 announced again after FRR came back with a bare section of its AS: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
    assert!(l.router_nexthops(VIP4).contains(&"10.81.0.11".to_string()));
    assert!(!l.announcement_routes("lb2").is_empty());
    l.flush_announcement_routes("lb2");
    let back = lb_tests::lab::wait_for(Duration::from_secs(15), || {
        (!l.announcement_routes("lb2").is_empty()).then_some(())
    });
    assert!(
        back.is_some(),
        "lb2's flushed routes installed again\n{}",
        l.diagnostics()
    );
    assert!(
        l.wait_nexthops(3, Duration::from_secs(20)).is_some(),
        "lb2 announced again: {:?}",
        l.router_nexthops(VIP4)
    );
}

/// A hung FRR (every read of its running config hangs, as when a daemon stops answering its
/// vty) delays nothing that matters: a drain is withdrawn while lbd's check of FRR hangs, not
/// after its 10 s timeout, and FRR's configuration is checked again once it answers.
#[test]
fn a_drain_is_withdrawn_at_once_while_vtysh_hangs() {
    let l = BgpLab::new();
    assert!(
        l.hang_vtysh("lb3", Duration::from_secs(15)),
        "lb3's lbd never checked FRR\n{}",
        l.diagnostics()
    );
    l.lbctl("lb3", &["bgp", "drain"]).expect("drain lb3");
    let took = l.wait_nexthops(2, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "lb3 still announced 5 s after its drain, with its FRR check hanging: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
    assert!(!l.router_nexthops(VIP4).contains(&"10.81.0.13".to_string()));
    l.unhang_vtysh("lb3");
    l.lbctl("lb3", &["bgp", "undrain"]).expect("undrain lb3");
    assert!(
        l.wait_nexthops(3, Duration::from_secs(20)).is_some(),
        "lb3 back: {:?}\n{}",
        l.router_nexthops(VIP4),
        l.diagnostics()
    );
}
