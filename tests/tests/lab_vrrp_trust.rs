//! A control plane you can trust: foreign and hostile VRRP peers, reloads that move nothing
//! they do not change, interface churn, and scrapes of a full connection table. lbd nodes in
//! network namespaces (`VrrpLab`); the lab's client plays the foreign router with
//! `labnode vrrp-send`. Needs root; `cargo xtask test`.
//!
//! CPU use under an advert flood is measured from /proc (user + system time of lbd over the
//! flood) and printed, not asserted: this debug build's cost is the machine's as much as lbd's
//! (a shared 2-core VM). Its target is checked, on release binaries, by `cargo xtask bench
//! failover` (`advert_flood` in `target/bench/failover.json`).

use std::time::{Duration, Instant};

use lb_tests::{
    lab::wait_for,
    vrrp_lab::{NodeOpts, VIP4, VRID, VrrpLab},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
/// The flood rate (adverts per second); a real router sends 10.
const FLOOD_PPS: u64 = 20_000;

fn prio(priority: u8) -> NodeOpts {
    NodeOpts {
        priority,
        ..Default::default()
    }
}

fn master_of(l: &VrrpLab, running: &[usize]) -> usize {
    l.wait_one_master(running, Duration::from_secs(15))
        .unwrap_or_else(|| {
            let states: Vec<_> = running.iter().map(|i| l.state(*i)).collect();
            panic!(
                "no single master among {running:?}: {states:?}\n{}",
                l.logs()
            )
        })
}

fn counter(s: &Value, path: &[&str]) -> u64 {
    let mut v = s;
    for p in path {
        v = &v[*p];
    }
    v.as_u64().unwrap_or(0)
}

/// Run `labnode vrrp-send` in the client (the foreign router) and wait for it.
fn send_from_client(l: &mut VrrpLab, tag: &str, args: &[&str]) -> u64 {
    l.vrrp_send_from_client(LABNODE, tag, args)
}

/// Lines of node `i`'s log containing `needle`.
fn log_lines(l: &VrrpLab, i: usize, needle: &str) -> usize {
    l.log(i).lines().filter(|x| x.contains(needle)).count()
}

#[test]
fn foreign_vip_set_at_priority_255_never_votes_and_a_flood_costs_little() {
    let mut l = VrrpLab::new(LABNODE, vec![prio(150), prio(100)]);
    assert_eq!(master_of(&l, &[0, 1]), 0);
    assert!(l.wait_serving(Duration::from_secs(10)));
    let before: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    let vrid = VRID.to_string();

    // Idle CPU over 3 s, for comparison.
    let cpu0 = l.cpu_seconds(0).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let idle = (l.cpu_seconds(0).unwrap() - cpu0) / 3.0;

    // A foreign router with our VRID, another VIP set and priority 255, flooding.
    let secs = 5.0;
    let cpu0 = l.cpu_seconds(0).unwrap();
    let t = Instant::now();
    let sent = send_from_client(
        &mut l,
        "flood",
        &[
            "224.0.0.18",
            &vrid,
            "255",
            "10.78.0.200",
            &FLOOD_PPS.to_string(),
            &secs.to_string(),
        ],
    );
    let wall = t.elapsed().as_secs_f64();
    let busy = (l.cpu_seconds(0).unwrap() - cpu0) / wall;
    println!(
        "advert flood: {sent} adverts in {wall:.1} s ({:.0}/s) -> lbd master CPU {:.1}% of a core (idle {:.1}%)",
        sent as f64 / wall,
        busy * 100.0,
        idle * 100.0
    );

    // Nobody stepped down or flapped; the VIP never moved.
    assert_eq!(l.masters(&[0, 1]), vec![0], "{}", l.logs());
    assert_eq!(l.holders(&[0, 1]), vec![0]);
    let after: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    assert_eq!(before, after, "no state change during the flood");
    assert!(l.wait_serving(Duration::from_secs(5)));
    for i in 0..2 {
        let s = l.status(i).unwrap();
        let dropped = counter(&s, &["counters", "drops", "other_vips"]);
        // Every advert that reaches lbd is counted; under a flood the kernel may drop some
        // before (a full socket buffer), so at least half.
        assert!(
            dropped * 2 >= sent,
            "n{}: counted {dropped} of {sent} foreign adverts",
            i + 1
        );
        let client = l.lab.node("client").v4.clone();
        assert!(
            s["collisions"]["peers"][client.as_str()]["count"]
                .as_u64()
                .unwrap_or(0)
                > 0,
            "collision reported: {}",
            s["collisions"]
        );
        assert_eq!(counter(&s, &["counters", "split_brain"]), 0);
        // Bounded logging: one WARN for this peer and reason per interval, not one per advert.
        let warns = log_lines(&l, i, "VRID collision") + log_lines(&l, i, "VRRP packet dropped");
        assert!(warns <= 3, "n{}: {warns} WARN lines for one flood", i + 1);
    }

    // An address count of 0 is dropped too (and votes for nothing).
    send_from_client(
        &mut l,
        "empty",
        &["224.0.0.18", &vrid, "255", "-", "100", "1"],
    );
    let s = l.status(0).unwrap();
    assert!(counter(&s, &["counters", "drops", "no_addresses"]) >= 50);
    assert_eq!(l.masters(&[0, 1]), vec![0]);
}

#[test]
fn unicast_instances_accept_only_their_peers() {
    let base = NodeOpts {
        unicast: true,
        ..Default::default()
    };
    let mut l = VrrpLab::new(
        LABNODE,
        vec![
            NodeOpts {
                priority: 150,
                ..base.clone()
            },
            NodeOpts {
                priority: 100,
                ..base
            },
        ],
    );
    assert_eq!(master_of(&l, &[0, 1]), 0);
    let before: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    // A host outside unicast_peers sends priority-255 adverts with our VRID and VIP set,
    // straight to both nodes, for 3 s.
    let dsts = format!("{},{}", l.lab.node("n1").v4, l.lab.node("n2").v4);
    let sent = send_from_client(
        &mut l,
        "stranger",
        &[&dsts, &VRID.to_string(), "255", VIP4, "200", "3"],
    );
    assert!(sent > 100);
    assert_eq!(l.masters(&[0, 1]), vec![0], "{}", l.logs());
    assert_eq!(l.holders(&[0, 1]), vec![0]);
    let after: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    assert_eq!(before, after, "the stranger never voted");
    for i in 0..2 {
        let s = l.status(i).unwrap();
        let n = counter(&s, &["counters", "drops", "not_a_peer"]);
        assert!(
            n * 10 >= sent / 2 * 9,
            "n{}: not_a_peer {n} of {}",
            i + 1,
            sent / 2
        );
        // It claimed our VIP at 255 while n1 was master, but a stranger's adverts are no
        // evidence of a second master: neither counted nor logged as split brain.
        assert_eq!(counter(&s, &["counters", "split_brain"]), 0, "{s}");
        assert!(s["last_split_brain"].is_null(), "{s}");
        assert_eq!(log_lines(&l, i, "split brain"), 0);
    }
}

/// A host off the segment that forges a peer's source (it knows the peer's address, the VRID
/// and the VIPs) reaches us with a TTL below 255: dropped and counted, the VIP stays put.
#[test]
fn forged_peer_adverts_with_ttl_64_leave_the_vip_where_it_is() {
    let base = NodeOpts {
        unicast: true,
        ..Default::default()
    };
    let mut l = VrrpLab::new(
        LABNODE,
        vec![
            NodeOpts {
                priority: 150,
                ..base.clone()
            },
            NodeOpts {
                priority: 100,
                ..base
            },
        ],
    );
    assert_eq!(master_of(&l, &[0, 1]), 0);
    let before: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    let n1 = l.lab.node("n1").v4.clone();
    let n2 = l.lab.node("n2").v4.clone();
    // n2's address, priority 255, to the master, as if routed one hop or more (TTL 64).
    let from = format!("from={n2}");
    let vrid = VRID.to_string();
    let sent = send_from_client(
        &mut l,
        "forged",
        &[&n1, &vrid, "255", VIP4, "200", "3", "ttl=64", &from],
    );
    assert!(sent > 100);
    assert_eq!(l.masters(&[0, 1]), vec![0], "{}", l.logs());
    assert_eq!(l.holders(&[0, 1]), vec![0]);
    let after: Vec<_> = (0..2).map(|i| l.transitions(i)).collect();
    assert_eq!(before, after, "the forged adverts never voted");
    let s = l.status(0).unwrap();
    let n = counter(&s, &["counters", "drops", "bad_ttl"]);
    assert!(n * 10 >= sent * 9, "bad_ttl {n} of {sent}: {s}");
    // The same adverts with TTL 255 (from on the segment) vote: what made the difference is
    // the TTL.
    send_from_client(
        &mut l,
        "onlink",
        &[&n1, &vrid, "255", VIP4, "200", "1", &from],
    );
    assert!(
        l.transitions(0) > before[0],
        "an on-link advert at 255 moves the master: {}",
        l.logs()
    );
}

#[test]
fn preemption_is_not_split_brain() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150), prio(100)]);
    l.start(1);
    assert_eq!(master_of(&l, &[1]), 1);
    // The higher priority node arrives and preempts: an ordinary election.
    l.start(0);
    assert_eq!(master_of(&l, &[0, 1]), 0);
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..2 {
        let s = l.status(i).unwrap();
        assert_eq!(
            counter(&s, &["counters", "split_brain"]),
            0,
            "n{}: {s}",
            i + 1
        );
    }
}

/// A static VIP and a VRRP instance on one interface: start-up cleanup of an earlier
/// configuration's VIPs must not take the static one, at start, reload or restart.
#[test]
fn a_static_vip_and_a_vrrp_instance_on_one_interface_both_hold() {
    const STATIC: &str = "10.78.0.102";
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    let c = l.config(0);
    std::fs::write(
        l.config_path(0),
        c + &format!(
            "\n[[vips]]\nname = \"static\"\naddress = \"{STATIC}\"\nports = [80]\nowned = true\n"
        ),
    )
    .unwrap();
    let both_held = |l: &VrrpLab, when: &str| {
        let held = wait_for(Duration::from_secs(10), || {
            let a = addrs(l, 0, "eth0");
            (a.iter().any(|x| x == VIP4) && a.iter().any(|x| x == STATIC)).then_some(())
        });
        assert!(
            held.is_some(),
            "{when}: eth0 has {:?}\n{}",
            addrs(l, 0, "eth0"),
            l.logs()
        );
        // And they stay (nothing removes one a moment later).
        std::thread::sleep(Duration::from_secs(1));
        let a = addrs(l, 0, "eth0");
        assert!(
            a.iter().any(|x| x == VIP4) && a.iter().any(|x| x == STATIC),
            "{when}, a second later: {a:?}"
        );
    };
    l.start(0);
    assert_eq!(master_of(&l, &[0]), 0);
    both_held(&l, "after start");
    l.signal(0, libc::SIGHUP);
    both_held(&l, "after reload");
    l.stop(0, libc::SIGTERM);
    l.start(0);
    assert_eq!(master_of(&l, &[0]), 0);
    both_held(&l, "after restart");
}

/// The client's neighbour entry for `ip`: its MAC, if any.
fn client_neigh(l: &VrrpLab, ip: &str) -> Option<String> {
    let netns = l.lab.node("client").netns.clone();
    let out = lb_tests::lab::try_sh(&["ip", "-n", &netns, "-j", "neigh", "show", ip]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["lladdr"].as_str().map(String::from)
}

/// The master's MAC changes under lbd (a bond failing over with fail_over_mac, a cloned MAC):
/// it announces the new MAC at once, so clients follow without waiting for their caches.
#[test]
fn a_mac_change_is_announced_at_once() {
    // n1 also holds a static VIP: announced again too.
    const STATIC: &str = "10.78.0.102";
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150), prio(100)]);
    let c = l.config(0)
        + &format!(
            "\n[[vips]]\nname = \"static\"\naddress = \"{STATIC}\"\nports = [80]\nowned = true\n"
        );
    std::fs::write(l.config_path(0), c).unwrap();
    l.start(0);
    l.start(1);
    assert_eq!(master_of(&l, &[0, 1]), 0);
    assert!(l.wait_serving(Duration::from_secs(10)), "{}", l.logs());
    let client_ns = l.lab.node("client").netns.clone();
    let resolved = wait_for(Duration::from_secs(5), || {
        // A connection attempt makes the client's kernel resolve the address.
        lb_tests::lab::try_sh(&[
            "ip",
            "netns",
            "exec",
            &client_ns,
            LABNODE,
            "connect-many",
            STATIC,
            "80",
            "1",
            "1",
            "300",
        ]);
        client_neigh(&l, STATIC).map(|_| ())
    });
    assert!(resolved.is_some(), "the client resolved the static VIP");
    let old = client_neigh(&l, VIP4).expect("the client resolved the VIP");
    let new = if old == "02:00:00:00:7e:01" {
        "02:00:00:00:7e:02"
    } else {
        "02:00:00:00:7e:01"
    };
    let netns = l.lab.node(&l.nodes[0]).netns.clone();
    lb_tests::lab::sh(&[
        "ip", "-n", &netns, "link", "set", "dev", "eth0", "address", new,
    ]);
    let followed = wait_for(Duration::from_secs(3), || {
        (client_neigh(&l, VIP4).as_deref() == Some(new)).then_some(())
    });
    assert!(
        followed.is_some(),
        "client still has {:?} for the VIP, not {new}\n{}",
        client_neigh(&l, VIP4),
        l.logs()
    );
    let static_followed = wait_for(Duration::from_secs(3), || {
        (client_neigh(&l, STATIC).as_deref() == Some(new)).then_some(())
    });
    assert!(
        static_followed.is_some(),
        "client still has {:?} for the static VIP, not {new}",
        client_neigh(&l, STATIC)
    );
    let s = l.status(0).unwrap();
    assert_eq!(counter(&s, &["counters", "mac_changes"]), 1, "{s}");
    assert_eq!(l.masters(&[0, 1]), vec![0], "a MAC change moves nothing");
}

/// A master whose adverts cannot leave (a firewall rule on the node drops them, the socket
/// gets EPERM) is master only in its own eyes: every failure is counted, the last one is shown
/// by `lbctl vrrp status`, and the WARN is rate-limited (one per destination per minute).
#[test]
fn advert_send_failures_are_counted_shown_and_warned_once() {
    let l = VrrpLab::new(LABNODE, vec![prio(150)]);
    assert_eq!(master_of(&l, &[0]), 0);
    let netns = l.lab.node(&l.nodes[0]).netns.clone();
    let table = format!("{}_adverts", l.lab.prefix.replace('-', "_"));
    lb_tests::lab::sh(&[
        "ip", "netns", "exec", &netns, "nft", "add", "table", "inet", &table,
    ]);
    lb_tests::lab::sh(&[
        "ip",
        "netns",
        "exec",
        &netns,
        "nft",
        "add",
        "chain",
        "inet",
        &table,
        "out",
        "{ type filter hook output priority 0 ; }",
    ]);
    lb_tests::lab::sh(&[
        "ip", "netns", "exec", &netns, "nft", "add", "rule", "inet", &table, "out", "meta",
        "l4proto", "112", "drop",
    ]);
    // 2 s of 100 ms adverts: about 20 failures.
    std::thread::sleep(Duration::from_secs(2));
    let s = l.status(0).unwrap();
    let errors = counter(&s, &["counters", "send_errors"]);
    assert!(errors >= 10, "{s}");
    let last = &s["last_send_error"];
    assert_eq!(last["dst"], "224.0.0.18", "{s}");
    assert!(
        last["error"]
            .as_str()
            .unwrap_or("")
            .contains("not permitted"),
        "{s}"
    );
    let warned = log_lines(&l, 0, "VRRP advert not sent");
    assert_eq!(warned, 1, "one WARN for {errors} failures\n{}", l.log(0));
    let text = lb_tests::lbctl_output(&l.socket(0), &["vrrp", "status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("send error"), "{text}");
    assert!(
        text.contains("send errors ") && !text.contains("send errors 0;"),
        "{text}"
    );
}

/// A new master announces its VIPs in a burst, and again `garp_master_delay_s` later (5 s by
/// default, keepalived's `garp_master_delay`) for switches and hosts that missed the first.
#[test]
fn a_second_announcement_burst_follows_after_garp_master_delay() {
    let l = VrrpLab::new(LABNODE, vec![prio(150)]);
    assert_eq!(master_of(&l, &[0]), 0);
    let announcements =
        |l: &VrrpLab| counter(&l.status(0).unwrap(), &["counters", "announcements"]);
    let first = wait_for(Duration::from_secs(3), || {
        (announcements(&l) == 5).then_some(())
    });
    assert!(first.is_some(), "first burst: {}", announcements(&l));
    let second = wait_for(Duration::from_secs(15), || {
        (announcements(&l) == 10).then_some(())
    });
    assert!(second.is_some(), "second burst: {}", announcements(&l));
    // Then only the refresh (every 60 s).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(announcements(&l), 10);
}

/// A second instance for a one-node lab (api: VRID 51, ingress: VRID 52), both master.
fn ingress(priority: u8) -> String {
    format!(
        "\n[[vrrp]]\nname = \"ingress\"\nvrid = 52\npriority = {priority}\nvips = [\"10.78.0.101\"]\n"
    )
}

#[test]
fn reloading_one_instance_never_touches_another() {
    let mut l = VrrpLab::prepare(LABNODE, vec![prio(150)]);
    let base = l.config(0);
    std::fs::write(l.config_path(0), base.clone() + &ingress(100)).unwrap();
    l.start(0);
    let both_master = || {
        wait_for(Duration::from_secs(10), || {
            let v = l.lbctl(0, &["vrrp", "status"])?;
            let all = v.as_array()?;
            (all.len() == 2 && all.iter().all(|s| s["state"] == "master")).then_some(v)
        })
    };
    let before = both_master().unwrap_or_else(|| panic!("both master\n{}", l.logs()));
    let transitions = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| counter(s, &["counters", "transitions"]))
            .collect()
    };
    assert!(l.holds_vip(0));

    // Only the ingress priority changes.
    std::fs::write(l.config_path(0), base.clone() + &ingress(120)).unwrap();
    l.signal(0, libc::SIGHUP);
    std::thread::sleep(Duration::from_secs(2));
    assert!(l.holds_vip(0), "the api VIP is still on eth0\n{}", l.log(0));
    let after = both_master().expect("both still master");
    assert_eq!(transitions(&before), transitions(&after), "nobody resigned");
    let ing = after
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "ingress")
        .unwrap();
    assert_eq!(ing["base_priority"], 120, "applied in place");
    assert!(l.wait_serving(Duration::from_secs(5)));

    // Reloads at once (API and SIGHUP) run one after the other: every one succeeds and each
    // instance still runs exactly once.
    std::fs::write(l.config_path(0), base.clone() + &ingress(110)).unwrap();
    let reloads = |l: &VrrpLab| l.lbctl(0, &["stats"]).unwrap()["reloads"].as_u64().unwrap();
    let before_reloads = reloads(&l);
    let socket = l.socket(0);
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..4)
            .map(|_| s.spawn(|| lb_tests::lbctl_output(&socket, &["reload"])))
            .collect();
        l.signal(0, libc::SIGHUP);
        for c in calls {
            let out = c.join().unwrap();
            assert!(
                out.status.success(),
                "a concurrent reload failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
    let settled = wait_for(Duration::from_secs(5), || {
        (reloads(&l) == before_reloads + 5).then_some(())
    });
    assert!(settled.is_some(), "5 reloads counted: {}", reloads(&l));
    let again = both_master().expect("both still master");
    assert_eq!(again.as_array().unwrap().len(), 2, "each instance once");
    assert_eq!(transitions(&before), transitions(&again), "nobody resigned");

    // Only the api advert interval changes: in place too.
    let faster = base.replace("advert_interval_ms = 100", "advert_interval_ms = 200");
    assert_ne!(faster, base);
    std::fs::write(l.config_path(0), faster + &ingress(120)).unwrap();
    l.signal(0, libc::SIGHUP);
    std::thread::sleep(Duration::from_secs(2));
    let again = both_master().expect("both still master");
    assert_eq!(transitions(&before), transitions(&again));
    let api = again
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "api")
        .unwrap();
    assert_eq!(api["advert_interval_ms"], 200);
    assert!(l.holds_vip(0));

    // A setting lbd cannot apply while running is refused by name; the running config stays.
    let refused = "metrics_listen = \"127.0.0.1:9\"\n".to_string() + &base;
    std::fs::write(l.config_path(0), refused + &ingress(120)).unwrap();
    let out = lb_tests::lbctl_output(&l.socket(0), &["reload"]);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("metrics_listen"), "{text}");
    let stats = l.lbctl(0, &["stats"]).unwrap();
    assert!(
        stats["last_reload_error"]
            .as_str()
            .unwrap_or("")
            .contains("metrics_listen")
    );
}

/// `GET path` on node `i`'s API socket: (status, body).
fn probe(l: &VrrpLab, i: usize, path: &str) -> (u16, String) {
    l.get(i, path)
}

#[test]
fn a_recreated_interface_is_followed_on_backup_and_owner() {
    let mut l = VrrpLab::new(LABNODE, vec![prio(150), prio(100)]);
    assert_eq!(master_of(&l, &[0, 1]), 0);
    assert!(l.wait_serving(Duration::from_secs(10)));
    assert_eq!(probe(&l, 1, "/readyz").0, 200);
    assert_eq!(probe(&l, 1, "/healthz").0, 200);

    // The backup's interface goes away: fault (no adverts, no VIP), then it comes back as a
    // new device with the same name.
    l.lab.delete_link("n2");
    let fault = wait_for(Duration::from_secs(5), || {
        (l.state(1).as_deref() == Some("fault")).then_some(())
    });
    assert!(
        fault.is_some(),
        "backup in fault while its interface is gone: {:?}",
        l.state(1)
    );
    let not_ready = wait_for(Duration::from_secs(5), || {
        let (code, body) = probe(&l, 1, "/readyz");
        (code == 503).then_some(body)
    });
    assert!(
        not_ready
            .as_deref()
            .is_some_and(|b| b.contains("not attached")),
        "/readyz says the data plane is not attached: {not_ready:?}"
    );
    assert_eq!(probe(&l, 1, "/healthz").0, 200, "alive, only not ready");
    l.lab.create_link("n2");
    assert_eq!(
        master_of(&l, &[0, 1]),
        0,
        "one master after the backup's interface returned"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        l.holders(&[0, 1]),
        vec![0],
        "the backup did not become a second master"
    );
    let s = l.status(1).unwrap();
    assert!(counter(&s, &["counters", "rebinds"]) >= 1, "{s}");
    assert_eq!(
        s["master"],
        l.lab.node("n1").v4.as_str(),
        "it hears n1 again"
    );
    let ready = wait_for(Duration::from_secs(5), || {
        (probe(&l, 1, "/readyz").0 == 200).then_some(())
    });
    assert!(
        ready.is_some(),
        "ready again: XDP attached to the new device"
    );

    // The owner's interface goes away: n2 takes over; n1 returns, preempts, re-attaches XDP
    // and forwards again.
    l.lab.delete_link("n1");
    assert!(l.wait_master(1, Duration::from_secs(5)), "{}", l.logs());
    assert!(l.wait_serving(Duration::from_secs(10)), "n2 serves");
    l.lab.create_link("n1");
    assert_eq!(master_of(&l, &[0, 1]), 0, "{}", l.logs());
    let ready = wait_for(Duration::from_secs(10), || {
        lb_tests::lbctl_output(&l.socket(0), &["stats"])
            .status
            .success()
            .then_some(())
    });
    assert!(ready.is_some());
    assert!(
        l.wait_serving(Duration::from_secs(10)),
        "the recreated owner forwards\n{}",
        l.log(0)
    );
    assert!(
        l.log(0)
            .contains("XDP program attached to the recreated interface"),
        "{}",
        l.log(0)
    );

    // lbd restarted after such a change adopts nothing stale: it starts cleanly.
    l.stop(0, libc::SIGTERM);
    l.lab.delete_link("n1");
    l.lab.create_link("n1");
    l.start(0);
    assert_eq!(master_of(&l, &[0, 1]), 0, "{}", l.logs());
    assert!(l.wait_serving(Duration::from_secs(10)));
}

#[test]
fn a_two_second_link_flap_on_owner_and_backup() {
    let l = VrrpLab::new(LABNODE, vec![prio(150), prio(100)]);
    assert_eq!(master_of(&l, &[0, 1]), 0);
    for (who, i) in [("backup", 1), ("owner", 0)] {
        l.set_link(i, false);
        let fault = wait_for(Duration::from_secs(3), || {
            (l.state(i).as_deref() == Some("fault")).then_some(())
        });
        assert!(fault.is_some(), "{who} in fault while its link is down");
        assert!(!l.holds_vip(i), "{who} holds no VIP in fault");
        std::thread::sleep(Duration::from_millis(1500));
        l.set_link(i, true);
        assert_eq!(
            master_of(&l, &[0, 1]),
            0,
            "after the {who}'s flap\n{}",
            l.logs()
        );
        assert_eq!(l.holders(&[0, 1]), vec![0]);
        assert!(
            l.wait_serving(Duration::from_secs(10)),
            "serving after the {who}'s flap"
        );
    }
}

/// Node `i` lists all three backends active.
fn all_active(l: &VrrpLab, i: usize) -> Option<()> {
    wait_for(Duration::from_secs(20), || {
        let rows = l.lbctl(i, &["backends", "list"])?;
        let rows = rows.as_array()?;
        (rows.len() == 3 && rows.iter().all(|r| r["state"] == "active")).then_some(())
    })
}

#[test]
fn a_dead_masters_backend_takes_no_new_flows_at_once() {
    // Slow checks (2 s, as production checks are seconds apart) so that without fate sharing
    // the dead node's backend would keep a third of new connections for several seconds.
    let slow = |priority| NodeOpts {
        priority,
        health_interval_ms: 2000,
        ..Default::default()
    };
    let mut l = VrrpLab::new(LABNODE, vec![slow(150), slow(100), slow(50)]);
    assert_eq!(master_of(&l, &[0, 1, 2]), 0);
    assert!(all_active(&l, 1).is_some(), "n2 sees every backend up");
    assert!(l.wait_serving(Duration::from_secs(10)));
    let start = Instant::now();
    l.fail_node(0);
    let (first, restored) = l.restored_since(start, Duration::from_secs(15), 30);
    let (first, restored) = (first.expect("answered"), restored.expect("fully restored"));
    println!("node failure: first answer {first:?}, fully restored {restored:?}");
    let n1 = l.lab.node("n1").v4.clone();
    let rows = l.lbctl(1, &["backends", "list"]).unwrap();
    let dead = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["backend"] == n1.as_str())
        .unwrap()
        .clone();
    assert_eq!(dead["state"], "down", "{dead}");
    assert!(
        dead["reason"]
            .as_str()
            .unwrap_or("")
            .contains("went silent"),
        "{dead}"
    );
    // Fully restored right after the takeover, well before a 2 s check could have failed.
    assert!(
        restored < first + Duration::from_millis(1000),
        "fully restored {restored:?} long after the first answer {first:?}"
    );
    // The node comes back: its backend returns through the rise count, and it preempts.
    l.restore_node(0);
    assert_eq!(master_of(&l, &[0, 1, 2]), 0);
    assert!(all_active(&l, 1).is_some(), "n1's backend is back on n2");
}

/// The new master takes the dead master's backend out of new flows before it forwards: no SYN
/// that reaches it at the takeover is placed there. (A SYN placed on the dead backend is lost,
/// and so is its retransmission, which follows the entry the first one wrote.) SYNs from
/// spoofed clients, 4000 a second, below flood mode's rate, arrive through the failover; none
/// of the new master's connection-table entries may name the dead node's backend.
#[test]
fn no_syn_at_a_takeover_is_placed_on_the_dead_masters_backend() {
    // No handover grace: a node that was master before n1 preempted it (at startup) would
    // forward the flood for 2 s more, and its entries naming n1 then are right.
    let node = |priority| NodeOpts {
        priority,
        top: "handover_grace_ms = 0\n".into(),
        ..Default::default()
    };
    let mut l = VrrpLab::new(LABNODE, vec![node(150), node(100), node(50)]);
    assert_eq!(master_of(&l, &[0, 1, 2]), 0);
    assert!(all_active(&l, 1).is_some(), "n2 sees every backend up");
    assert!(l.wait_serving(Duration::from_secs(10)));
    let spoofed_on = |l: &VrrpLab, i: usize| -> Vec<Value> {
        let rows = l
            .lbctl(i, &["flows", VIP4, "--limit", "100000"])
            .expect("lbctl flows");
        rows["flows"]
            .as_array()
            .expect("flows")
            .iter()
            .filter(|f| f["client"].as_str().is_some_and(|c| c.starts_with("198.1")))
            .cloned()
            .collect()
    };
    assert!(spoofed_on(&l, 1).is_empty(), "n2 forwarded before the test");
    let hostile = lb_tests::bin_dir().join("hostile");
    let flood = l
        .lab
        .cmd("client", &hostile)
        .args([
            "syn-flood",
            "--dst",
            VIP4,
            "--port",
            "8080",
            "--count",
            "12000",
            "--pps",
            "4000",
            "--seed",
            "7",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run hostile syn-flood");
    std::thread::sleep(Duration::from_millis(500));
    l.fail_node(0);
    assert_eq!(master_of(&l, &[1, 2]), 1);
    let out = flood.wait_with_output().expect("syn-flood");
    assert!(out.status.success(), "syn-flood failed");
    let n1 = l.lab.node("n1").v4.clone();
    let spoofed = spoofed_on(&l, 1);
    // The flood reached the new master (so the check below means something).
    assert!(
        spoofed.len() > 1000,
        "only {} entries from the flood on n2 ({})",
        spoofed.len(),
        String::from_utf8_lossy(&out.stdout)
    );
    let on_dead: Vec<&Value> = spoofed
        .iter()
        .filter(|f| f["backend"].as_str() == Some(n1.as_str()))
        .collect();
    println!(
        "{} entries from the flood on the new master, {} on the dead master's backend",
        spoofed.len(),
        on_dead.len()
    );
    assert!(
        on_dead.is_empty(),
        "{} of {} new flows at the takeover placed on the dead master's backend {n1}, e.g. {}\n{}",
        on_dead.len(),
        spoofed.len(),
        on_dead[0],
        l.log(1)
    );
}

/// A sysctl inside node `i`'s namespace.
fn sysctl(l: &VrrpLab, i: usize, key: &str) -> String {
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    let out = lb_tests::lab::sh(&[
        "nsenter",
        &format!("--net=/run/netns/{netns}"),
        "cat",
        &format!("/proc/sys/net/ipv4/conf/{key}"),
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Addresses on a node's interface, as `ip -j addr` lists them.
fn addrs(l: &VrrpLab, i: usize, dev: &str) -> Vec<String> {
    let netns = l.lab.node(&l.nodes[i]).netns.clone();
    let out = lb_tests::lab::try_sh(&["ip", "-n", &netns, "-j", "addr", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["addr_info"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["local"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn teardown_removes_everything_lbd_added() {
    let mut l = VrrpLab::new(LABNODE, vec![prio(150)]);
    assert_eq!(master_of(&l, &[0]), 0);
    let keys = [
        "all/arp_ignore",
        "all/arp_announce",
        "eth0/arp_ignore",
        "eth0/arp_announce",
    ];
    let set: Vec<String> = keys.iter().map(|k| sysctl(&l, 0, k)).collect();
    assert_eq!(set, ["1", "2", "1", "2"], "lbd set the DSR sysctls");
    assert!(addrs(&l, 0, "lo").contains(&VIP4.to_string()));
    assert!(addrs(&l, 0, "eth0").contains(&VIP4.to_string()));
    // A crash leaves everything in place; the rollback then runs teardown.
    l.stop(0, libc::SIGKILL);
    let out = l.lbd(0, &["teardown"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: Vec<String> = keys.iter().map(|k| sysctl(&l, 0, k)).collect();
    assert_eq!(
        after,
        ["0", "0", "0", "0"],
        "sysctls back to what lbd found"
    );
    assert!(
        !addrs(&l, 0, "lo").contains(&VIP4.to_string()),
        "no VIP on lo"
    );
    assert!(
        !addrs(&l, 0, "eth0").contains(&VIP4.to_string()),
        "no VIP on eth0"
    );
    let pins = std::fs::read_dir("/sys/fs/bpf")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&l.lab.prefix.replace('-', "_"))
        })
        .count();
    assert_eq!(pins, 0, "no pins left");
}

#[test]
fn scrapes_of_a_full_connection_table_do_not_delay_updates() {
    use aya::maps::{HashMap as BpfHashMap, Map, MapData};
    use lb_common::{FlowKey, FlowValue};
    const ENTRIES: u32 = 1 << 19;
    let mut l = VrrpLab::prepare(
        LABNODE,
        vec![NodeOpts {
            top: format!("conntrack_size = {ENTRIES}\n"),
            ..prio(150)
        }],
    );
    l.start(0);
    assert_eq!(master_of(&l, &[0]), 0);
    // Fill the connection table (as a million clients would).
    let pin_dir = std::fs::read_dir("/sys/fs/bpf")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&l.lab.prefix.replace('-', "_"))
            })
        })
        .expect("lbd's pin directory");
    let data = MapData::from_pin(pin_dir.join(lb_common::maps::CONNTRACK)).unwrap();
    let mut map: BpfHashMap<MapData, FlowKey, FlowValue> =
        BpfHashMap::try_from(Map::LruHashMap(data)).unwrap();
    let t = Instant::now();
    for i in 0..ENTRIES {
        let mut key = FlowKey {
            src: [0; 16],
            dst: [0; 16],
            sport: (i & 0xffff) as u16,
            dport: 8080,
            proto: 6,
            family: 4,
            _pad: [0; 2],
        };
        key.src[..4].copy_from_slice(&(0x0a00_0000 | (i >> 16)).to_be_bytes());
        map.insert(key, FlowValue::default(), 0).unwrap();
    }
    println!("filled {ENTRIES} entries in {:?}", t.elapsed());
    let backend = l.lab.node("n1").v4.clone();
    let socket = l.socket(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (worst, scrapes) = std::thread::scope(|s| {
        let scraper = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(lb_tests::lbctl_output(&socket, &["stats"]).status.success());
                n += 1;
            }
            n
        });
        let mut worst = Duration::ZERO;
        for k in 0..20 {
            let verb = if k % 2 == 0 { "drain" } else { "undrain" };
            let t = Instant::now();
            let out = lb_tests::lbctl_output(&socket, &["backends", verb, "api", &backend]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (worst, scraper.join().unwrap())
    });
    println!("{scrapes} scrapes of a {ENTRIES}-entry table; slowest drain/undrain {worst:?}");
    assert!(scrapes > 5);
    assert!(
        worst < Duration::from_millis(500),
        "an update waited {worst:?} behind scrapes"
    );
    // The count arrives from the background walk.
    let counted = wait_for(Duration::from_secs(25), || {
        let s = l.lbctl(0, &["stats"])?;
        (s["conntrack_entries"].as_u64()? >= u64::from(ENTRIES) / 2).then_some(s)
    });
    assert!(counted.is_some(), "conntrack counted in the background");
}

/// lb removed under a node disruption policy that skips the reboot: the MCO deletes the
/// config file and kubelet stops the pod. The stop then tears down what lbd added (issue 31).
#[test]
fn a_stop_after_the_config_was_removed_tears_everything_down() {
    let mut l = VrrpLab::new(LABNODE, vec![prio(150)]);
    assert_eq!(master_of(&l, &[0]), 0);
    let keys = [
        "all/arp_ignore",
        "all/arp_announce",
        "eth0/arp_ignore",
        "eth0/arp_announce",
    ];
    assert_eq!(
        keys.iter().map(|k| sysctl(&l, 0, k)).collect::<Vec<_>>(),
        ["1", "2", "1", "2"]
    );
    assert!(addrs(&l, 0, "lo").contains(&VIP4.to_string()));
    std::fs::remove_file(l.config_path(0)).unwrap();
    l.stop(0, libc::SIGTERM);
    assert_eq!(
        keys.iter().map(|k| sysctl(&l, 0, k)).collect::<Vec<_>>(),
        ["0", "0", "0", "0"],
        "sysctls back to what lbd found\n{}",
        l.logs()
    );
    assert!(
        !addrs(&l, 0, "lo").contains(&VIP4.to_string()),
        "no VIP on lo"
    );
    assert!(
        !addrs(&l, 0, "eth0").contains(&VIP4.to_string()),
        "no VIP on eth0"
    );
    let pins = std::fs::read_dir("/sys/fs/bpf")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&l.lab.prefix.replace('-', "_"))
        })
        .count();
    assert_eq!(pins, 0, "no pins left");
}
