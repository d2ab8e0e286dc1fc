//! VRRP groups (`group = "..."`, keepalived's vrrp_sync_group) on two lbd nodes: an IPv4 and
//! an IPv6 instance of one group, as lb renders the API VIPs of a dual-stack OpenStack cluster.
//! A check tracked by only one member fails on the node holding both VIPs (the follower's FAULT
//! check, then the leader's weighted check): both VIPs move, and come back when it passes. A
//! sampler counts the moments the two VIPs are held by different nodes: at most the instant of
//! a preemption, between the leader's move and the other member's resignation. Needs root;
//! `cargo xtask test`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use lb_tests::{
    lab::{has_address, wait_for},
    vrrp_lab::{NodeOpts, VIP4, VIP6, VRID, VrrpLab},
};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
/// The follower's check (weight 0: FAULT while failing) and the leader's (-60 while failing).
const FAULT_PORT: &str = "9446";
const WEIGHT_PORT: &str = "9447";

/// n1 (priority 150) and n2 (100), each with instance "api" (VIP4, the group's leader) and
/// "api6" (VIP6) in group "g"; n1 tracks the two checks, served by listeners it runs.
fn lab() -> VrrpLab {
    let opts = [150, 100]
        .iter()
        .map(|p| NodeOpts {
            priority: *p,
            vrrp_extra: "group = \"g\"\n".into(),
            ..Default::default()
        })
        .collect();
    let mut l = VrrpLab::prepare(LABNODE, opts);
    for i in 0..2 {
        let prio = l.opts[i].priority;
        let mut c = l.config(i);
        c += &format!(
            "\n[[vrrp]]\nname = \"api6\"\nvrid = {VRID}\npriority = {prio}\nadvert_interval_ms = 100\nvips = [\"{VIP6}\"]\ngroup = \"g\"\n"
        );
        if i == 0 {
            for (instance, name, weight, port) in [
                ("api6", "follower", 0, FAULT_PORT),
                ("api", "leader", -60, WEIGHT_PORT),
            ] {
                c += &format!(
                    "\n[[track]]\ninstance = \"{instance}\"\nname = \"{name}\"\nweight = {weight}\naddress = \"127.0.0.1:{port}\"\n[track.health]\nkind = \"tcp\"\ninterval_ms = 300\n"
                );
            }
        }
        std::fs::write(l.config_path(i), c).unwrap();
    }
    let n1 = l.nodes[0].clone();
    for port in [FAULT_PORT, WEIGHT_PORT] {
        l.lab.spawn(
            &n1,
            &format!("check-{port}"),
            LABNODE,
            &["serve-id", port, "check"],
        );
    }
    l
}

/// Each node's (holds VIP4, holds VIP6) on eth0.
fn held(netns: &[String]) -> Vec<(bool, bool)> {
    netns
        .iter()
        .map(|ns| (has_address(ns, "eth0", VIP4), has_address(ns, "eth0", VIP6)))
        .collect()
}

/// The two VIPs are on different nodes.
fn split(h: &[(bool, bool)]) -> bool {
    h.iter()
        .enumerate()
        .any(|(a, (v4, _))| *v4 && h.iter().enumerate().any(|(b, (_, v6))| *v6 && a != b))
}

/// Wait until node `i` alone holds both VIPs.
fn wait_both_on(l: &VrrpLab, netns: &[String], i: usize, what: &str) {
    wait_for(Duration::from_secs(20), || {
        let h = held(netns);
        h.iter()
            .enumerate()
            .all(|(j, x)| *x == (j == i, j == i))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{what}: {:?}\n{}", held(netns), l.logs()));
}

#[test]
fn a_group_moves_together() {
    let mut l = lab();
    l.start(0);
    l.start(1);
    let netns: Vec<String> = l
        .nodes
        .iter()
        .map(|n| l.lab.node(n).netns.clone())
        .collect();
    wait_both_on(&l, &netns, 0, "n1 (150) holds both");
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, netns) = (stop.clone(), netns.clone());
        std::thread::spawn(move || {
            // Split samples, and the longest run of consecutive ones.
            let (mut samples, mut splits, mut run, mut longest) = (0u64, Vec::new(), 0, 0);
            while !stop.load(Ordering::Relaxed) {
                let h = held(&netns);
                samples += 1;
                if split(&h) {
                    splits.push(h);
                    run += 1;
                    longest = longest.max(run);
                } else {
                    run = 0;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (samples, splits, longest)
        })
    };
    let n1 = l.nodes[0].clone();
    for port in [FAULT_PORT, WEIGHT_PORT] {
        // Only one member tracks this check; the other follows it off n1...
        l.lab.stop(&format!("check-{port}"), libc::SIGKILL);
        wait_both_on(
            &l,
            &netns,
            1,
            &format!("check {port} failing: n2 holds both"),
        );
        std::thread::sleep(Duration::from_secs(1));
        wait_both_on(&l, &netns, 1, "and keeps both");
        // ...and back once it passes (n1 preempts with 150).
        l.lab.spawn(
            &n1,
            &format!("check-{port}"),
            LABNODE,
            &["serve-id", port, "check"],
        );
        wait_both_on(
            &l,
            &netns,
            0,
            &format!("check {port} passing: n1 holds both"),
        );
        std::thread::sleep(Duration::from_secs(1));
        wait_both_on(&l, &netns, 0, "and keeps both");
    }
    stop.store(true, Ordering::Relaxed);
    let (samples, splits, longest) = sampler.join().unwrap();
    println!(
        "{samples} samples, {} split, at most {longest} in a row",
        splits.len()
    );
    assert!(samples > 100, "{samples}");
    // A preemption moves the leader first; the old holder's other member resigns as soon as
    // its leader has stepped down, so the VIPs can be apart for that instant (one sample,
    // rarely two back to back on a loaded machine), never longer: without the group they
    // stay apart until the check passes again (hundreds of samples).
    assert!(
        longest <= 2,
        "the VIPs were on different nodes for {longest} samples in a row ({} of {samples}), e.g. {:?}\n{}",
        splits.len(),
        splits.first(),
        l.logs()
    );
}

#[test]
fn split_is_any_two_nodes_holding_one_vip_each() {
    assert!(split(&[(true, false), (false, true)]));
    assert!(!split(&[(true, true), (false, false)]));
    assert!(!split(&[(true, false), (false, false)]));
    // Both VIPs on both nodes (two masters) has each VIP on another node too.
    assert!(split(&[(true, true), (true, true)]));
}
