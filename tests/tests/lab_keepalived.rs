//! Interop with a real keepalived (Debian package) in one VRRP instance with lbd nodes,
//! configured the way OpenShift renders it: VRRPv2, PASS auth, advert_int 1, unicast peers;
//! and the same in VRRPv3 mode over IPv6 (what OpenShift renders for IPv6 VIPs). keepalived runs inside a lab namespace (`nsenter --net`) with
//! its own pid files in the lab directory; it is killed with the lab. Needs root;
//! `cargo xtask test`.
//!
//! The keepalived node is a DSR backend like the lbd nodes (the VIP on lo, ARP sysctls); as
//! master it holds the VIP on eth0 too and serves it itself, as keepalived does.

use std::time::{Duration, Instant};

use lb_tests::vrrp_lab::{NodeOpts, VrrpLab};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

fn master_of(l: &VrrpLab, running: &[usize]) -> usize {
    l.wait_one_master(running, Duration::from_secs(20))
        .unwrap_or_else(|| {
            let states: Vec<_> = running.iter().map(|i| l.state(*i)).collect();
            panic!(
                "no single master among {running:?}: {states:?}\n{}",
                l.logs()
            )
        })
}

/// For `secs`, exactly `master` holds the VIP and nobody changes state (counted by lbd's
/// transition counter and keepalived's "Entering ... STATE" log lines).
fn steady(l: &VrrpLab, running: &[usize], master: usize, secs: u64) {
    let before: Vec<_> = running.iter().map(|i| l.transitions(*i)).collect();
    let start = Instant::now();
    let mut samples = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        assert_eq!(
            l.holders(running),
            vec![master],
            "one VIP holder at a time\n{}",
            l.logs()
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let after: Vec<_> = running.iter().map(|i| l.transitions(*i)).collect();
    if before != after {
        let statuses: Vec<_> = running.iter().map(|i| l.status(*i)).collect();
        panic!(
            "flapping over {secs} s: transitions {before:?} -> {after:?}\nlbd status: {statuses:?}\n{}",
            l.logs()
        );
    }
    assert_eq!(l.masters(running), vec![master]);
    assert!(samples > 5);
}

/// lbd node `i` hears `master`'s adverts and drops nothing.
fn lbd_follows(l: &VrrpLab, i: usize, master: usize) {
    let s = l.status(i).expect("lbd answers");
    let addr = l.addr(&l.nodes[master]);
    assert_eq!(s["state"], "backup", "{s}");
    assert_eq!(s["master"], addr.as_str(), "{s}");
    assert!(s["counters"]["adverts_received"].as_u64().unwrap() > 0);
    let drops = s["counters"]["drops"].as_object().unwrap();
    assert!(
        drops.values().all(|v| v == 0),
        "lbd dropped adverts: {drops:?}"
    );
    assert_eq!(s["collisions"]["peers"], serde_json::json!({}), "{s}");
}

fn interop(keepalived: NodeOpts, lbd: NodeOpts) {
    // n1: keepalived (100); n2: lbd (150); n3: lbd (50).
    let opts = vec![
        NodeOpts {
            priority: 100,
            ..keepalived
        },
        NodeOpts {
            priority: 150,
            ..lbd.clone()
        },
        NodeOpts {
            priority: 50,
            ..lbd
        },
    ];
    let mut l = VrrpLab::new(LABNODE, opts);
    println!("keepalived.conf:\n{}", l.keepalived_config(0));
    assert_eq!(master_of(&l, &[0, 1, 2]), 1, "lbd n2 (150) is master");
    assert_eq!(
        l.state(0).as_deref(),
        Some("backup"),
        "keepalived is backup"
    );
    assert!(l.wait_serving(Duration::from_secs(10)));
    steady(&l, &[0, 1, 2], 1, 4);
    lbd_follows(&l, 2, 1);

    // lbd master -> keepalived takes over when lbd stops (priority 0 from lbd).
    l.stop(1, libc::SIGTERM);
    assert_eq!(master_of(&l, &[0, 2]), 0, "keepalived (100) takes over");
    assert!(l.wait_serving(Duration::from_secs(10)));
    steady(&l, &[0, 2], 0, 4);
    lbd_follows(&l, 2, 0);

    // keepalived master -> lbd takes over when keepalived stops.
    l.stop(0, libc::SIGTERM);
    assert!(!l.holds_vip(0), "keepalived gave the VIP back");
    assert_eq!(master_of(&l, &[2]), 2, "lbd n3 takes over");
    assert_eq!(l.holders(&[0, 1, 2]), vec![2]);
    assert!(l.wait_serving(Duration::from_secs(10)));

    // keepalived comes back with the higher priority and preempts lbd; then lbd n2 comes back
    // and preempts keepalived.
    l.start(0);
    assert!(l.wait_master(0, Duration::from_secs(15)), "{}", l.logs());
    assert_eq!(master_of(&l, &[0, 2]), 0, "keepalived preempts lbd");
    lbd_follows(&l, 2, 0);
    l.start(1);
    assert!(l.wait_master(1, Duration::from_secs(15)), "{}", l.logs());
    assert_eq!(master_of(&l, &[0, 1, 2]), 1, "lbd preempts keepalived");
    steady(&l, &[0, 1, 2], 1, 3);
    assert!(l.wait_serving(Duration::from_secs(10)));
}

#[test]
fn keepalived_openshift_v2_and_lbd_share_one_instance() {
    interop(
        NodeOpts::openshift_keepalived(100),
        NodeOpts::openshift_lbd(100),
    );
}

/// OpenShift runs keepalived in VRRPv3 mode for IPv6 VIPs: the same over IPv6 (fd78::100).
#[test]
fn keepalived_v3_ipv6_and_lbd_share_one_instance() {
    let v3 = |keepalived| NodeOpts {
        version: 3,
        auth_pass: None,
        ipv6: true,
        keepalived,
        ..NodeOpts::openshift_keepalived(100)
    };
    interop(v3(true), v3(false));
}

/// The VRRP version migration (docs/operations.md): keepalived in OpenShift's VRRPv2 with
/// lbd nodes that run VRRPv3 with `v2_compat` (they send v2 and v3 adverts and count v2 ones):
/// one master throughout, also when the keepalived node stops and when the last nodes drop
/// `v2_compat` by reload. Without `v2_compat` the same mix has two masters, and lbd reports
/// it as split brain.
#[test]
fn v2_to_v3_migration_keeps_one_master() {
    let compat = |priority| NodeOpts {
        version: 3,
        v2_compat: true,
        ..NodeOpts::openshift_lbd(priority)
    };
    let mut l = VrrpLab::new(
        LABNODE,
        vec![NodeOpts::openshift_keepalived(150), compat(100), compat(50)],
    );
    assert_eq!(master_of(&l, &[0, 1, 2]), 0, "keepalived (150) is master");
    steady(&l, &[0, 1, 2], 0, 4);
    lbd_follows(&l, 1, 0);
    lbd_follows(&l, 2, 0);
    // The keepalived node is migrated: it stops; the compat lbd node takes over, and the
    // other one follows it.
    l.stop(0, libc::SIGTERM);
    assert_eq!(master_of(&l, &[1, 2]), 1);
    steady(&l, &[1, 2], 1, 3);
    lbd_follows(&l, 2, 1);
    // keepalived (v2 only) comes back with the highest priority: it hears the compat master's
    // v2 adverts and preempts; nobody sees two masters.
    l.start(0);
    assert!(l.wait_master(0, Duration::from_secs(15)), "{}", l.logs());
    assert_eq!(master_of(&l, &[0, 1, 2]), 0);
    l.stop(0, libc::SIGTERM);
    assert_eq!(master_of(&l, &[1, 2]), 1);
    // Every node is lbd now: drop v2_compat and the password, backup first, by reload (in
    // place: no resignation, the VIP does not move).
    for i in [2, 1] {
        l.opts[i].v2_compat = false;
        l.opts[i].auth_pass = None;
        l.write_config(i);
        let before = l.transitions(i);
        l.signal(i, libc::SIGHUP);
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(l.transitions(i), before, "n{} applied it in place", i + 1);
        assert_eq!(master_of(&l, &[1, 2]), 1);
    }
    steady(&l, &[1, 2], 1, 3);
    for i in 1..3 {
        assert_eq!(l.status(i).unwrap()["counters"]["split_brain"], 0);
    }
    assert!(l.wait_serving(Duration::from_secs(10)));
}

/// What the migration must avoid: a plain VRRPv3 lbd next to a VRRPv2 keepalived. Neither
/// hears the other, both are master; lbd counts one split-brain episode and says why.
#[test]
fn mixed_versions_without_compat_are_reported_as_split_brain() {
    let plain_v3 = NodeOpts {
        version: 3,
        auth_pass: None,
        ..NodeOpts::openshift_lbd(100)
    };
    let l = VrrpLab::new(LABNODE, vec![NodeOpts::openshift_keepalived(150), plain_v3]);
    let both = lb_tests::lab::wait_for(Duration::from_secs(15), || {
        (l.masters(&[0, 1]).len() == 2).then_some(())
    });
    assert!(both.is_some(), "two masters\n{}", l.logs());
    let s = lb_tests::lab::wait_for(Duration::from_secs(5), || {
        let s = l.status(1)?;
        (s["counters"]["split_brain"] == 1).then_some(s)
    })
    .unwrap_or_else(|| panic!("no split brain reported: {:?}", l.status(1)));
    assert_eq!(
        s["last_split_brain"]["their_adverts"], "wrong_version",
        "{s}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        l.status(1).unwrap()["counters"]["split_brain"],
        1,
        "one episode, not one per advert"
    );
}

/// A planned restart in a mixed cluster: the lbd master stops (a priority-0 advert) and the
/// highest-priority backup, lbd, takes over after its skew, as keepalived's backups time it.
/// The lower-priority keepalived backup never becomes master in between: one VIP move, one
/// round of announcements (counted by keepalived's "Entering ... STATE" lines).
#[test]
fn a_resignation_moves_the_vip_once_with_keepalived_backups() {
    let mut l = VrrpLab::new(
        LABNODE,
        vec![
            NodeOpts::openshift_lbd(200),
            NodeOpts::openshift_lbd(150),
            NodeOpts::openshift_keepalived(100),
        ],
    );
    assert_eq!(master_of(&l, &[0, 1, 2]), 0);
    steady(&l, &[0, 1, 2], 0, 3);
    let keepalived_before = l.transitions(2);
    let became_before = l.status(1).unwrap()["counters"]["became_master"]
        .as_u64()
        .unwrap();
    l.stop(0, libc::SIGTERM);
    assert_eq!(master_of(&l, &[1, 2]), 1, "lbd (150) takes over");
    steady(&l, &[1, 2], 1, 3);
    assert_eq!(
        l.transitions(2),
        keepalived_before,
        "keepalived (100) stayed backup throughout\n{}",
        l.logs()
    );
    let s = l.status(1).unwrap();
    assert_eq!(
        s["counters"]["became_master"].as_u64().unwrap(),
        became_before + 1,
        "{s}"
    );
    assert_eq!(
        s["last_transition"]["reason"], "master resigned (priority 0 advert)",
        "{s}"
    );
}

/// A check tracked with keepalived's rules next to a keepalived peer: a negative weight is
/// taken off while the check fails (a migrated `weight -60`), and weight 0 puts the instance
/// in FAULT while it fails, as keepalived does.
#[test]
fn tracked_weights_follow_keepalived_rules() {
    const CHECK_PORT: u16 = 18_443;
    let mut l = VrrpLab::prepare(
        LABNODE,
        vec![
            NodeOpts::openshift_lbd(150),
            NodeOpts::openshift_keepalived(100),
        ],
    );
    let track = |weight: i32| {
        format!(
            "\n[[track]]\ninstance = \"api\"\nname = \"local\"\nweight = {weight}\naddress = \"127.0.0.1:{CHECK_PORT}\"\n[track.health]\nkind = \"tcp\"\ninterval_ms = 200\n"
        )
    };
    // The check fails (nothing listens): 150 - 60 = 90 < 100, keepalived is master.
    std::fs::write(l.config_path(0), l.config(0) + &track(-60)).unwrap();
    l.start(1);
    l.start(0);
    assert_eq!(
        master_of(&l, &[0, 1]),
        1,
        "keepalived (100) over lbd (150 - 60)"
    );
    steady(&l, &[0, 1], 1, 3);
    let s = l.status(0).unwrap();
    assert_eq!(s["effective_priority"], 90, "{s}");
    // It passes: lbd is back at 150 and preempts.
    let node = l.nodes[0].clone();
    l.lab.spawn(
        &node,
        "check-listener",
        LABNODE,
        &["serve-id", &CHECK_PORT.to_string(), "check"],
    );
    assert!(l.wait_master(0, Duration::from_secs(15)), "{}", l.logs());
    assert_eq!(master_of(&l, &[0, 1]), 0);
    assert_eq!(l.status(0).unwrap()["effective_priority"], 150);
    // Weight 0 (applied by reload, in place) and the check failing again: FAULT, the VIP goes
    // to keepalived; lbd is not in the election at all.
    std::fs::write(l.config_path(0), l.config(0) + &track(0)).unwrap();
    l.signal(0, libc::SIGHUP);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        l.state(0).as_deref(),
        Some("master"),
        "a passing weight-0 check changes nothing"
    );
    l.lab.stop("check-listener", libc::SIGTERM);
    let fault = lb_tests::lab::wait_for(Duration::from_secs(10), || {
        (l.state(0).as_deref() == Some("fault")).then_some(())
    });
    assert!(
        fault.is_some(),
        "lbd in fault: {:?}\n{}",
        l.status(0),
        l.logs()
    );
    assert_eq!(master_of(&l, &[1]), 1);
    assert_eq!(l.holders(&[0, 1]), vec![1]);
}
