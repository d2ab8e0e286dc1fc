//! A UserManaged install's phases, rehearsed under client load (issue 31): the configs are
//! rendered by `lbctl render` from a description with `[bootstrap]`, as docs/openshift.md's
//! Path 1 says.
//!
//! 1. Only the bootstrap node runs: its lbd holds the API VIP and forwards 6443, 22623 (the
//!    machine-config server, from which the control-plane nodes fetch their Ignition) and the
//!    lab's long-lived echo port to its own stand-ins.
//! 2. The control-plane nodes come up one by one (their services, then lbd): the first whose
//!    load balancer is ready takes the VIP from the bootstrap (priority 40 + 20 + 5 + 3 over
//!    the bootstrap's 50), once; the Maglev table is the same everywhere, so the connections
//!    the bootstrap forwarded to other nodes stay where they are.
//! 3. The bootstrap leaves as the installer destroys it (lbd killed, link down), then the
//!    control-plane nodes get their configs rendered without `[bootstrap]` (lbd reloads them
//!    in place).
//!
//! Throughout: never two holders of the API VIP; no long-lived connection lost but those the
//! bootstrap's own stand-in served; new connections to 22623 and the echo port fail, if at all,
//! within one window (one failover's gap). Needs root; `cargo xtask test`. Cost: about 60 s.

use std::time::Duration;

use lb_tests::{
    chaos::{
        load::{Load, Proto, Target},
        sampler::Sampler,
    },
    cluster::{
        API_VIP, BOOTSTRAP, CONTROL_PLANE, Cluster, ECHO_PORT, MCS_PORT, Options, Runner, Shape,
    },
};

/// Long-lived connections held through the whole install.
const LONG: usize = 24;
/// New connections a second, round robin over 22623 and the echo port.
const RATE: u32 = 40;
/// Failures of new connections further apart than this are separate windows.
const WINDOW_MS: u64 = 2000;

/// Windows of failed new connections (start, end, count): failures closer than [`WINDOW_MS`]
/// belong to one.
fn failure_windows(load: &Load, from: u64, to: u64) -> Vec<(u64, u64, usize)> {
    let mut fails: Vec<u64> = load
        .shorts(from, to)
        .iter()
        .filter(|s| s.result.is_err())
        .map(|s| s.start)
        .collect();
    fails.sort();
    let mut windows: Vec<(u64, u64, usize)> = Vec::new();
    for t in fails {
        match windows.last_mut() {
            Some(w) if t <= w.1 + WINDOW_MS => {
                w.1 = t;
                w.2 += 1;
            }
            _ => windows.push((t, t, 1)),
        }
    }
    windows
}

#[test]
fn the_install_phases_keep_the_api_vip_with_one_holder_and_its_connections() {
    let mut c = Cluster::boot_with(
        Shape::Compact,
        Runner::Process,
        Options {
            bootstrap: true,
            ..Default::default()
        },
    );
    let all: Vec<&str> = std::iter::once(BOOTSTRAP)
        .chain(CONTROL_PLANE.iter().copied())
        .collect();

    // Phase 1: the bootstrap alone holds the API VIP.
    assert_eq!(
        c.wait_master("api", &[BOOTSTRAP], Duration::from_secs(30))
            .as_deref(),
        Some(BOOTSTRAP),
        "the bootstrap holds the API VIP before any control-plane node runs"
    );
    let vip = |port: &str| format!("{API_VIP}:{port}").parse().unwrap();
    let echo = Target {
        addr: vip(ECHO_PORT),
        proto: Proto::Echo,
    };
    let mcs = Target {
        addr: vip(MCS_PORT),
        proto: Proto::Http,
    };
    let client = c.lab.node("client").netns.clone();
    let load = Load::start(&client, vec![echo.clone()], LONG, vec![mcs, echo], RATE);
    let netns: Vec<String> = all.iter().map(|n| c.lab.node(n).netns.clone()).collect();
    let sampler = Sampler::start(&netns, &[API_VIP.parse().unwrap()], load.clock());
    assert!(
        lb_tests::lab::wait_for(Duration::from_secs(20), || (load.long_up() == LONG)
            .then_some(()))
        .is_some(),
        "the long-lived connections open through the bootstrap ({} of {LONG})",
        load.long_up()
    );
    let by_backend = load.long_by_backend();
    assert_eq!(
        by_backend.keys().map(String::as_str).collect::<Vec<_>>(),
        [BOOTSTRAP],
        "only the bootstrap serves yet: {by_backend:?}"
    );
    std::thread::sleep(Duration::from_secs(2));

    // Phase 2: the control-plane nodes come up, services first (an apiserver takes a while),
    // then lbd. New long-lived connections spread over them (the old ones stay).
    let phase2 = load.now_ms();
    for n in CONTROL_PLANE {
        c.start_services(n);
        c.start(n);
        std::thread::sleep(Duration::from_secs(3));
    }
    let owner = c
        .wait_master("api", &all, Duration::from_secs(30))
        .expect("one master of the API instance");
    assert_ne!(
        owner, BOOTSTRAP,
        "a control-plane node whose load balancer is ready takes the VIP from the bootstrap"
    );
    // Renewed, the long-lived connections spread over the bootstrap and the control-plane
    // nodes whose apiservers are up (each ramps up over its slow start, so the last one may
    // have none yet).
    load.renew_long();
    assert!(
        lb_tests::lab::wait_for(Duration::from_secs(30), || {
            let b = load.long_by_backend();
            (load.long_all_fresh(phase2) && CONTROL_PLANE.iter().any(|n| b.contains_key(*n)))
                .then_some(())
        })
        .is_some(),
        "the renewed long-lived connections reach the control-plane nodes: {:?}",
        load.long_by_backend()
    );
    let backends = load.long_by_backend();
    println!("long-lived connections by backend before the bootstrap leaves: {backends:?}");

    // Phase 3: the installer destroys the bootstrap; then the control-plane nodes' configs
    // are rendered without it.
    let leave = load.now_ms();
    c.fail_node(BOOTSTRAP);
    std::thread::sleep(Duration::from_secs(3));
    let description = c.description();
    let without = description
        .split("\n[bootstrap]\n")
        .next()
        .unwrap()
        .to_string()
        + &description
            .split("\n[bootstrap]\n")
            .nth(1)
            .unwrap()
            .split_once("\n\n")
            .map(|(_, rest)| format!("\n{rest}"))
            .unwrap_or_default();
    assert!(!without.contains("[bootstrap]"), "{without}");
    for (n, cfg) in c.render_description(&without) {
        assert_ne!(n, BOOTSTRAP);
        c.write_config(&n, &cfg);
    }
    let bootstrap_addr: std::net::IpAddr = lb_tests::cluster::BOOTSTRAP_ADDR.parse().unwrap();
    assert!(
        lb_tests::lab::wait_for(Duration::from_secs(20), || {
            CONTROL_PLANE
                .iter()
                .all(|n| {
                    c.lbctl(n, &["vrrp", "status"])
                        .and_then(|v| {
                            let api = v.as_array()?.iter().find(|i| i["name"] == "api")?.clone();
                            let peers = api["unicast_peers"].as_array()?.clone();
                            Some(
                                !peers
                                    .iter()
                                    .any(|p| p.as_str() == Some(&bootstrap_addr.to_string())),
                            )
                        })
                        .unwrap_or(false)
                })
                .then_some(())
        })
        .is_some(),
        "every control-plane node reloads a config without the bootstrap"
    );
    std::thread::sleep(Duration::from_secs(3));
    let end = load.now_ms();
    let owner_after = c.master("api", &CONTROL_PLANE);

    let samples = sampler.samples(0, end);
    let doubles = samples.iter().filter(|s| s.holders[0].len() >= 2).count();
    let holders: Vec<Vec<usize>> = samples.iter().map(|s| s.holders[0].clone()).collect();
    let moves = holders
        .windows(2)
        .filter(|w| !w[1].is_empty() && w[0] != w[1])
        .count();
    let without_holder = samples.iter().filter(|s| s.holders[0].is_empty()).count();
    let lost = load.lost(0, end);
    let lost_elsewhere: Vec<_> = lost.iter().filter(|l| l.backend != BOOTSTRAP).collect();
    let windows = failure_windows(&load, 0, end);
    let shorts = load.shorts(0, end);
    let failed = shorts.iter().filter(|s| s.result.is_err()).count();
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    for s in &shorts {
        if let Err(e) = &s.result {
            *errors.entry(format!("{}: {e}", s.target)).or_default() += 1;
        }
    }
    println!(
        "install: {} samples, {doubles} with two holders, {without_holder} with none, {moves} holder changes; \
         {} long-lived connections lost ({} not on the bootstrap's own stand-in); \
         {failed} of {} new connections failed ({errors:?}), windows (start ms, end ms, count): {windows:?}; \
         the bootstrap left at {leave} ms; owner after: {owner_after:?}",
        samples.len(),
        lost.len(),
        lost_elsewhere.len(),
        shorts.len()
    );
    assert_eq!(doubles, 0, "never two holders of the API VIP");
    assert_eq!(
        moves, 1,
        "the VIP moves once, from the bootstrap to a control-plane node: {holders:?}"
    );
    assert!(
        lost_elsewhere.is_empty(),
        "no long-lived connection lost but those the bootstrap's own stand-in served: {lost_elsewhere:?}"
    );
    assert!(
        windows.len() <= 1,
        "new connections fail within one window at most: {windows:?}"
    );
    assert!(
        owner_after.is_some(),
        "a control-plane node holds the API VIP after the bootstrap left"
    );
    load.stop();
}
