//! Connections survive a VIP move whatever the backend set did before (issue 21): three lbd
//! nodes, each an LB and a DSR backend, run the sequence of an OpenShift upgrade. One node
//! reboots (its backend and its lbd go away); 150 long-lived connections are opened meanwhile (so some of them sit on
//! the slots that backend owns); it comes back (those slots name it again: the connections are
//! now exceptions, kept only by the owner's connection table); then the owner's lbd gets
//! SIGTERM and every connection is used again through the new owner. With the connection sync
//! the new owner has the owner's exceptions and none is lost; a control run without it shows
//! what it prevents. Needs root; `cargo xtask test`.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use lb_tests::sum_counts;
use lb_tests::vrrp_lab::{NodeOpts, PORT, VrrpLab};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
const HOLD: u64 = 150;
const SECS: u64 = 25;
const HOLD_MS: u64 = 2000;

fn last_json(log: &str) -> Value {
    log.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null)
}

/// Three nodes; with `sync`, each syncs with the other two under one cluster key, scanning
/// every `interval_ms` (and after each table change).
fn lab(sync: bool, ipv6: bool, interval_ms: u64) -> VrrpLab {
    lab_with_hold(sync, ipv6, interval_ms, HOLD_MS)
}

/// [`lab`] with another `failed_backend_hold_ms`.
fn lab_with_hold(sync: bool, ipv6: bool, interval_ms: u64, hold_ms: u64) -> VrrpLab {
    let opts = NodeOpts {
        ipv6,
        ..Default::default()
    };
    let mut l = VrrpLab::prepare(LABNODE, vec![opts; 3]);
    let key = l.lab.dir.join("sync.key");
    std::fs::write(&key, "lab-cluster-key-0123456789abcdef0123456789\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    for i in 0..3 {
        // A short hold (fate sharing after a crash uses it too), so the away backend leaves the
        // set soon, as a rebooting node's does.
        let mut c = l.config(i).replacen(
            "\n[[vips]]",
            &format!("failed_backend_hold_ms = {hold_ms}\n\n[[vips]]"),
            1,
        );
        if sync {
            let peers: Vec<String> = (0..3)
                .filter(|j| *j != i)
                .map(|j| format!("\"{}\"", l.addr(&l.nodes[j])))
                .collect();
            c += &format!(
                "\n[sync]\npeers = [{}]\nkey_file = \"{}\"\ninterval_ms = {interval_ms}\n",
                peers.join(", "),
                key.display()
            );
        }
        std::fs::write(l.config_path(i), c).unwrap();
    }
    for i in 0..3 {
        l.start(i);
    }
    l
}

fn backend_states(l: &VrrpLab, i: usize) -> Vec<(String, String)> {
    l.lbctl(i, &["backends", "list"])
        .and_then(|v| {
            v.as_array().map(|a| {
                a.iter()
                    .map(|b| {
                        (
                            b["backend"].as_str().unwrap_or("").to_string(),
                            b["state"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Wait until every running node sees `addr`'s backend active (`true`) or not.
fn wait_backend(l: &VrrpLab, running: &[usize], addr: &str, active: bool) {
    let ok = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        running
            .iter()
            .all(|i| {
                let s = backend_states(l, *i);
                s.len() == 3
                    && s.iter()
                        .all(|(a, st)| a != addr || (st == "active") == active)
            })
            .then_some(())
    });
    assert!(
        ok.is_some(),
        "backend {addr} never active={active}\n{}",
        l.logs()
    );
}

fn sync_stats(l: &VrrpLab, i: usize) -> Value {
    l.lbctl(i, &["stats"])
        .map(|v| v["sync"].clone())
        .unwrap_or(Value::Null)
}

/// A synced lab once it serves: its master, and the node after it (whose backend a test
/// drains) with that node's address.
fn serving(l: &VrrpLab) -> (usize, usize, String) {
    let all = [0usize, 1, 2];
    let m = l
        .wait_one_master(&all, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no master\n{}", l.logs()));
    let k = (m + 1) % 3;
    let kaddr = l.addr(&l.nodes[k].clone());
    for n in l.nodes.clone() {
        wait_backend(l, &all, &l.addr(&n), true);
    }
    assert!(l.wait_serving(Duration::from_secs(20)), "{}", l.logs());
    (m, k, kaddr)
}

/// How the owner's node goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Move {
    /// Its lbd stops gracefully (a last flush, then the VIP moves).
    Sigterm,
    /// Its lbd crashes: what was synced before is all the peers have.
    Sigkill,
    /// The whole node goes: its link down, its lbd killed; its backend's connections go with it.
    NodeDeath,
}

struct Outcome {
    survived: u64,
    failed: u64,
    /// Failed connections by the backend they were on.
    failed_by_id: Value,
    /// The node name of the owner that went.
    owner: String,
    detail: String,
}

fn upgrade_sequence(sync: bool, mv: Move, ipv6: bool) -> Outcome {
    upgrade_sequence_with(sync, mv, ipv6, false)
}

/// Rewrite node `i`'s `[sync]` key settings (sign with `sign`, accept `accept` besides) and
/// wait until its lbd applied the file (its reload count grew).
fn rekey(l: &VrrpLab, i: usize, sign: &str, accept: &[&str]) {
    let path = l.config_path(i);
    let text = std::fs::read_to_string(&path).unwrap();
    let (head, sync) = text.split_once("\n[sync]\n").expect("a [sync] section");
    let kept: Vec<&str> = sync
        .lines()
        .filter(|l| !l.starts_with("key_file") && !l.starts_with("accept_key_files"))
        .collect();
    let accept: Vec<String> = accept.iter().map(|a| format!("\"{a}\"")).collect();
    let new = format!(
        "{head}\n[sync]\n{}\nkey_file = \"{sign}\"\naccept_key_files = [{}]\n",
        kept.join("\n"),
        accept.join(", ")
    );
    let reloads = || {
        l.lbctl(i, &["stats"])
            .and_then(|v| v["reloads"].as_u64())
            .unwrap_or(0)
    };
    let before = reloads();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, new).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let ok = lb_tests::lab::wait_for(Duration::from_secs(15), || {
        (reloads() > before).then_some(())
    });
    assert!(
        ok.is_some(),
        "n{} never reloaded its new key settings: {}\n{}",
        i + 1,
        l.lbctl(i, &["stats"]).unwrap_or(Value::Null)["last_reload_error"],
        l.logs()
    );
}

/// Datagrams node `i` refused for their MAC (a key it does not accept).
fn refused_auth(l: &VrrpLab, i: usize) -> u64 {
    sync_stats(l, i)["refused"]["auth"].as_u64().unwrap_or(0)
}

/// [`upgrade_sequence`]; with `rotate`, the cluster key is rotated meanwhile, in its three
/// steps (every node accepts the new key; each signs with it, the old one accepted; the old
/// one dropped), and the owner's lbd stops in the middle of the second step, when one peer
/// already signs with the new key and the owner still with the old one.
fn upgrade_sequence_with(sync: bool, mv: Move, ipv6: bool, rotate: bool) -> Outcome {
    // A dead owner's backends are held (fate sharing) before they leave the set, and leaving
    // moves a few other slots too (Maglev). The product's default hold (10 s) gives the new
    // owner time to see every connection's packets and write their entries first; the lab's
    // short hold (2 s) did not always, right after a failover where two backups were briefly
    // both master.
    let hold_ms = if mv == Move::NodeDeath {
        10_000
    } else {
        HOLD_MS
    };
    let mut l = lab_with_hold(sync, ipv6, 1000, hold_ms);
    let all = [0usize, 1, 2];
    let m = l
        .wait_one_master(&all, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no master\n{}", l.logs()));
    // The node whose backend goes away first: not the owner (the owner's node goes later).
    let k = (m + 1) % 3;
    let (kn, kaddr) = (l.nodes[k].clone(), l.addr(&l.nodes[k]));
    for n in l.nodes.clone() {
        wait_backend(&l, &all, &l.addr(&n), true);
    }
    assert!(l.wait_serving(Duration::from_secs(20)), "{}", l.logs());
    let old_key = l.lab.dir.join("sync.key").display().to_string();
    let new_key = l.lab.dir.join("sync-new.key");
    std::fs::write(&new_key, "lab-cluster-key-rotated-0123456789abcdef012345\n").unwrap();
    std::fs::set_permissions(&new_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let new_key = new_key.display().to_string();

    // Node k reboots: its backend and its lbd go away.
    l.lab.stop(&format!("server-{kn}"), libc::SIGKILL);
    l.stop(k, libc::SIGTERM);
    let others: Vec<usize> = all.iter().copied().filter(|i| *i != k).collect();
    wait_backend(&l, &others, &kaddr, false);
    // Its hold runs out: it leaves the set (setup, nothing is measured).
    std::thread::sleep(Duration::from_millis(hold_ms + 500));
    // The rotation's reloads take a few seconds more while the connections are held.
    let secs = if rotate { SECS + 15 } else { SECS }.to_string();
    l.lab.spawn(
        "client",
        "hold",
        LABNODE,
        &[
            "hold-ids",
            l.vip,
            PORT,
            &HOLD.to_string(),
            &secs,
            "200",
            "8",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    // It comes back, lbd and backend: its slots name it again, and its restarted lbd has none
    // of the owner's exceptions until the owner answers its hello.
    l.lab.spawn(
        &kn,
        &format!("server2-{kn}"),
        LABNODE,
        &["serve-id", PORT, &kn],
    );
    l.start(k);
    wait_backend(&l, &all, &kaddr, true);
    let mut exceptions = 0;
    if sync {
        // The owner found the connections its table keeps off their slots, and both peers
        // installed them (the periodic full sends repeat them, so this converges).
        let ok = lb_tests::lab::wait_for(Duration::from_secs(15), || {
            let s = sync_stats(&l, m);
            let e = s["exceptions"].as_u64().unwrap_or(0);
            let peers_have = all.iter().filter(|i| **i != m).all(|i| {
                let p = sync_stats(&l, *i);
                p["installed"].as_u64().unwrap_or(0) + p["already_present"].as_u64().unwrap_or(0)
                    >= e
            });
            (e > 0 && peers_have).then_some(e)
        });
        exceptions = ok.unwrap_or_else(|| {
            panic!(
                "sync never converged: owner {} peers {} {}\n{}",
                sync_stats(&l, m),
                sync_stats(&l, (m + 1) % 3),
                sync_stats(&l, (m + 2) % 3),
                l.logs()
            )
        });
        // lbctl stats shows it: the node's line and a table row per peer, both heard from
        // (the rebooted one after its first scan with its services in place).
        let text = || {
            String::from_utf8_lossy(&lb_tests::lbctl_output(&l.socket(m), &["stats"]).stdout)
                .to_string()
        };
        let shown = lb_tests::lab::wait_for(Duration::from_secs(10), || {
            let t = text();
            let heard = t
                .lines()
                .filter(|r| {
                    r.split_whitespace()
                        .next()
                        .is_some_and(|a| a.parse::<std::net::IpAddr>().is_ok())
                        && r.contains(" s ago")
                })
                .count();
            (t.contains(" exceptions of ") && t.contains("SYNC PEER") && heard == 2).then_some(())
        });
        assert!(shown.is_some(), "lbctl stats:\n{}", text());
    } else {
        std::thread::sleep(Duration::from_secs(2));
    }
    if rotate {
        // 1. Every node accepts the new key.
        for i in all {
            rekey(&l, i, &old_key, &[&new_key]);
        }
        // 2. One peer signs with it (the old one accepted); the owner still signs with the old.
        let first = (m + 2) % 3;
        rekey(&l, first, &new_key, &[&old_key]);
        std::thread::sleep(Duration::from_secs(2));
    }
    // The owner's node is next.
    match mv {
        Move::Sigterm => {
            l.signal(m, libc::SIGTERM);
        }
        Move::Sigkill => l.stop(m, libc::SIGKILL),
        Move::NodeDeath => l.fail_node(m),
    }
    let rest: Vec<usize> = all.iter().copied().filter(|i| *i != m).collect();
    let new_master = l
        .wait_one_master(&rest, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no new master\n{}", l.logs()));
    let mut refused = 0;
    if rotate {
        // The rest of step 2, then 3, on the nodes left.
        for i in rest.iter().copied().filter(|i| *i != (m + 2) % 3) {
            rekey(&l, i, &new_key, &[&old_key]);
        }
        // 3. Once no node signs with the old key: the stopping owner flushes (old key) until
        // the end of its handover grace, so the old key goes only after it exited.
        let owner = format!("lbd-{}", l.nodes[m]);
        assert!(
            l.lab.wait(&owner, Duration::from_secs(30)).is_some(),
            "the stopping owner's lbd exits\n{}",
            l.logs()
        );
        for i in rest.iter().copied() {
            rekey(&l, i, &new_key, &[]);
        }
        std::thread::sleep(Duration::from_secs(2));
        refused = rest.iter().map(|i| refused_auth(&l, *i)).sum::<u64>();
    }
    assert!(
        l.lab.wait("hold", Duration::from_secs(SECS + 45)).is_some(),
        "hold-ids finished"
    );
    let held = last_json(&l.lab.log("hold"));
    let new_stats = sync_stats(&l, new_master);
    assert_eq!(
        refused, 0,
        "a rotation with its overlap refuses no datagram (the stopping owner's flush included): {new_stats}"
    );
    Outcome {
        survived: sum_counts(&held["survived_by_id"]),
        failed: sum_counts(&held["failed_by_id"]),
        failed_by_id: held["failed_by_id"].clone(),
        owner: l.nodes[m].clone(),
        detail: format!(
            "{mv:?}, sync {sync}, key rotated {rotate} ({refused} datagrams refused for their key): backend of n{} away then back, owner n{} -> n{}; {exceptions} exceptions; long-lived {held}; new owner's sync {new_stats}",
            k + 1,
            m + 1,
            new_master + 1
        ),
    }
}

#[test]
fn upgrade_sequence_with_sync_loses_no_connection() {
    let o = upgrade_sequence(true, Move::Sigterm, false);
    println!("{}", o.detail);
    assert_eq!(
        (o.survived, o.failed),
        (HOLD, 0),
        "every long-lived connection survives: {}",
        o.detail
    );
}

/// Key rotation under load (issue 31): the upgrade sequence with the cluster key rotated
/// meanwhile and the owner's graceful stop in the middle of the rotation: the stopping owner's
/// flush (old key) is accepted by the peer that already signs with the new key, and no
/// connection is lost.
#[test]
fn upgrade_sequence_with_a_key_rotation_loses_no_connection() {
    let o = upgrade_sequence_with(true, Move::Sigterm, false, true);
    println!("{}", o.detail);
    assert_eq!(
        (o.survived, o.failed),
        (HOLD, 0),
        "every long-lived connection survives a rotation and the owner's stop: {}",
        o.detail
    );
}

#[test]
fn upgrade_sequence_without_sync_resets_the_exceptions() {
    // The control: the same sequence without sync. The connections whose slot went back to the
    // returning backend are reset by the new owner (if this ever stops failing, the test above
    // proves less than it claims).
    let o = upgrade_sequence(false, Move::Sigterm, false);
    println!("{}", o.detail);
    assert!(
        o.failed > 0,
        "without sync some connections are reset: {}",
        o.detail
    );
}

#[test]
fn upgrade_sequence_with_a_crash_of_the_owners_lbd_loses_no_connection() {
    // No last flush: the peers have what the scans after the table change sent.
    let o = upgrade_sequence(true, Move::Sigkill, false);
    println!("{}", o.detail);
    assert_eq!(
        (o.survived, o.failed),
        (HOLD, 0),
        "every long-lived connection survives: {}",
        o.detail
    );
}

#[test]
fn upgrade_sequence_with_the_owners_node_dying_loses_only_its_backends_connections() {
    let o = upgrade_sequence(true, Move::NodeDeath, false);
    println!("{}", o.detail);
    let lost_elsewhere: Vec<(&String, &Value)> = o
        .failed_by_id
        .as_object()
        .map(|m| m.iter().filter(|(id, _)| **id != o.owner).collect())
        .unwrap_or_default();
    assert!(
        lost_elsewhere.is_empty(),
        "only connections on the dead node's backend ({}) may be lost: {}",
        o.owner,
        o.detail
    );
    assert!(o.survived > 0, "the others survive: {}", o.detail);
}

/// The BGP variant: three LB nodes behind an ECMP router (lb3 drained at first), 150
/// long-lived connections opened while backend b1 is away, b1 back, then lb1 drained and lb3
/// undrained (the router rehashes flows onto nodes that never saw them).
fn bgp_sequence(sync: bool) -> (Value, String) {
    use lb_tests::bgp_lab::{BgpLab, VIP4, child_json};
    let mut l = BgpLab::with_sync(sync, HOLD_MS);
    let lbs = ["lb1", "lb2", "lb3"];
    l.lbctl("lb3", &["bgp", "drain"]).expect("drain lb3");
    assert!(
        l.wait_nexthops(2, Duration::from_secs(10)).is_some(),
        "lb3's drain never withdrew it: v4 {:?} v6 {:?}\n{}",
        l.router_nexthops(VIP4),
        l.router_nexthops(lb_tests::bgp_lab::VIP6),
        l.diagnostics()
    );
    let b1 = l.lab.node("b1").v4.clone();
    let state = |l: &BgpLab, n: &str| -> Option<String> {
        l.lbctl(n, &["backends", "list"])?
            .as_array()?
            .iter()
            .find(|b| b["backend"] == b1.as_str())
            .map(|b| b["state"].as_str().unwrap_or("").to_string())
    };
    let wait_b1 = |l: &BgpLab, active: bool| {
        let ok = lb_tests::lab::wait_for(Duration::from_secs(20), || {
            lbs.iter()
                .all(|n| state(l, n).is_some_and(|s| (s == "active") == active))
                .then_some(())
        });
        assert!(
            ok.is_some(),
            "b1 never active={active}\n{}",
            l.diagnostics()
        );
    };
    wait_b1(&l, true);
    l.lab.stop("server-b1", libc::SIGKILL);
    wait_b1(&l, false);
    std::thread::sleep(Duration::from_millis(HOLD_MS + 500));
    let hold = l.client_spawn(&[
        "hold-ids",
        VIP4,
        PORT,
        &HOLD.to_string(),
        &SECS.to_string(),
        "200",
        "8",
    ]);
    std::thread::sleep(Duration::from_secs(3));
    let labnode = lb_tests::bin_dir().join("labnode");
    l.lab
        .spawn("b1", "server2-b1", labnode, &["serve-id", PORT, "b1"]);
    wait_b1(&l, true);
    let stats = |n: &str| {
        l.lbctl(n, &["stats"])
            .map(|v| v["sync"].clone())
            .unwrap_or(Value::Null)
    };
    if sync {
        // lb3 saw none of the connections: it has all of lb1's and lb2's own exceptions. lb1
        // and lb2 also install each other's, so a node's own exceptions are its exceptions
        // less what it installed from peers (summing the raw counts counts those twice).
        // Counted only from scans that began after every node had b1 back: a node's
        // `exceptions` is its last scan's, and a scan still running when b1 came back saw the
        // table without it (no exceptions), which would let lb3 look complete too early.
        let scans = |n: &str| stats(n)["scans"].as_u64().unwrap_or(0);
        let before: Vec<u64> = lbs.iter().map(|n| scans(n)).collect();
        let ok = lb_tests::lab::wait_for(Duration::from_secs(15), || {
            let fresh = lbs.iter().zip(&before).all(|(n, b)| scans(n) >= b + 2);
            let own = |n: &str| {
                let s = stats(n);
                let e = s["exceptions"].as_u64().unwrap_or(0);
                e.saturating_sub(s["installed"].as_u64().unwrap_or(0))
            };
            let e = own("lb1") + own("lb2");
            (fresh && e > 0 && stats("lb3")["installed"].as_u64().unwrap_or(0) >= e).then_some(())
        });
        assert!(
            ok.is_some(),
            "sync never converged: {} {} {}",
            stats("lb1"),
            stats("lb2"),
            stats("lb3")
        );
    } else {
        std::thread::sleep(Duration::from_secs(2));
    }
    l.lbctl("lb1", &["bgp", "drain"]).expect("drain lb1");
    l.lbctl("lb3", &["bgp", "undrain"]).expect("undrain lb3");
    let ok = lb_tests::lab::wait_for(Duration::from_secs(10), || {
        let h = l.router_nexthops(VIP4);
        (h.len() == 2 && !h.contains(&"10.81.0.11".to_string())).then_some(())
    });
    assert!(ok.is_some(), "{:?}", l.router_nexthops(VIP4));
    let held = child_json(hold);
    let detail = format!(
        "BGP, sync {sync}: long-lived {held}; lb1 {} lb2 {} lb3 {}",
        stats("lb1"),
        stats("lb2"),
        stats("lb3")
    );
    (held, detail)
}

#[test]
fn bgp_backend_change_then_node_changes_lose_no_connection_with_sync() {
    let (held, detail) = bgp_sequence(true);
    println!("{detail}");
    assert_eq!(held["failed_by_id"], serde_json::json!({}), "{detail}");
    assert_eq!(sum_counts(&held["survived_by_id"]), HOLD, "{detail}");
}

#[test]
fn bgp_backend_change_then_node_changes_reset_exceptions_without_sync() {
    let (held, detail) = bgp_sequence(false);
    println!("{detail}");
    assert!(sum_counts(&held["failed_by_id"]) > 0, "{detail}");
}

#[test]
fn upgrade_sequence_over_ipv6_loses_no_connection() {
    let o = upgrade_sequence(true, Move::Sigterm, true);
    println!("{}", o.detail);
    assert_eq!(
        (o.survived, o.failed),
        (HOLD, 0),
        "every long-lived connection survives: {}",
        o.detail
    );
}

/// A backend drained on every node, then 150 connections opened: each SYN skips the drained
/// backend's slots, so about a third are exceptions at once, with no table change after them.
/// The scans run only after table changes (`interval_ms` a minute), so what the peers get of
/// them is the stopping owner's last flush. Then the owner's lbd goes with `signal`.
fn drain_then_stop(signal: i32) -> Outcome {
    let mut l = lab(true, false, 60_000);
    let all = [0usize, 1, 2];
    let (m, k, kaddr) = serving(&l);
    for i in all {
        l.lbctl(i, &["backends", "drain", "api", &kaddr])
            .expect("lbctl backends drain");
    }
    wait_backend(&l, &all, &kaddr, false);
    // The drain's own scan is done (it found nothing: no connection yet).
    std::thread::sleep(Duration::from_secs(1));
    let secs = SECS.to_string();
    l.lab.spawn(
        "client",
        "hold",
        LABNODE,
        &[
            "hold-ids",
            l.vip,
            PORT,
            &HOLD.to_string(),
            &secs,
            "200",
            "8",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let before = sync_stats(&l, (m + 1) % 3)["installed"]
        .as_u64()
        .unwrap_or(0)
        + sync_stats(&l, (m + 2) % 3)["installed"]
            .as_u64()
            .unwrap_or(0);
    if signal == libc::SIGKILL {
        l.stop(m, signal);
    } else {
        l.signal(m, signal);
    }
    let rest: Vec<usize> = all.iter().copied().filter(|i| *i != m).collect();
    let new_master = l
        .wait_one_master(&rest, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no new master\n{}", l.logs()));
    assert!(
        l.lab.wait("hold", Duration::from_secs(SECS + 30)).is_some(),
        "hold-ids finished"
    );
    let held = last_json(&l.lab.log("hold"));
    let after = sync_stats(&l, new_master);
    Outcome {
        survived: sum_counts(&held["survived_by_id"]),
        failed: sum_counts(&held["failed_by_id"]),
        failed_by_id: held["failed_by_id"].clone(),
        owner: l.nodes[m].clone(),
        detail: format!(
            "drain of n{} then signal {signal} of owner n{} -> n{}; peers had installed {before} before; long-lived {held}; new owner's sync {after}",
            k + 1,
            m + 1,
            new_master + 1
        ),
    }
}

#[test]
fn a_drain_then_sigterm_keeps_every_connection_by_the_last_flush() {
    let o = drain_then_stop(libc::SIGTERM);
    println!("{}", o.detail);
    assert_eq!(
        (o.survived, o.failed),
        (HOLD, 0),
        "every long-lived connection survives: {}",
        o.detail
    );
}

#[test]
fn a_drain_then_crash_loses_the_exceptions_no_scan_sent() {
    // The control for the flush, and the documented limit: a crash gives no last flush, so
    // exceptions younger than the scan period are lost with the owner.
    let o = drain_then_stop(libc::SIGKILL);
    println!("{}", o.detail);
    assert!(o.failed > 0, "{}", o.detail);
}

/// The sync port of the lab configs (the default).
fn lb_userspace_sync_port() -> &'static str {
    "1940"
}

/// A client reuses a 5-tuple (its ports wrap; a NAT in front of many clients reuses them
/// sooner): the first connection on it was an exception (its slot's backend drained), synced to
/// the peers; the second, after the undrain, is placed on its slot. The owner withdraws the old
/// exception from its peers (a retraction), so when the VIP then moves, the new owner does not
/// send the second connection to the first one's backend, which would reset it.
#[test]
fn a_reused_5_tuple_keeps_its_new_backend_across_a_vip_move() {
    reused_5_tuple(false);
}

/// The same with every retraction the owner's scans send lost (the peers drop sync datagrams
/// meanwhile): the owner's next full send repeats them.
#[test]
fn a_lost_retraction_is_repaired_by_the_next_full_send() {
    reused_5_tuple(true);
}

fn reused_5_tuple(lose_retractions: bool) {
    const N: u64 = 60;
    const FIRST: &str = "41000";
    let mut l = lab(true, false, 500);
    let all = [0usize, 1, 2];
    let (m, k, kaddr) = serving(&l);
    // The client may reuse a port whose last connection it closed (TIME_WAIT), as clients do.
    let client = l.lab.node("client").netns.clone();
    l.lab.sysctl(&client, "net.ipv4.tcp_tw_reuse", "1");
    let drain = |l: &VrrpLab, verb: &str| {
        for i in all {
            l.lbctl(i, &["backends", verb, "api", &kaddr])
                .unwrap_or_else(|| panic!("lbctl backends {verb}"));
        }
    };
    drain(&l, "drain");
    wait_backend(&l, &all, &kaddr, false);
    // First connections: none on k; those whose slot is k are exceptions.
    l.lab.spawn(
        "client",
        "first",
        LABNODE,
        &[
            "hold-ids",
            l.vip,
            PORT,
            &N.to_string(),
            "1",
            "200",
            "3",
            FIRST,
        ],
    );
    assert!(l.lab.wait("first", Duration::from_secs(30)).is_some());
    let first = last_json(&l.lab.log("first"));
    assert_eq!(
        sum_counts(&first["survived_by_id"]),
        N,
        "first connections: {first}"
    );
    let peers: Vec<usize> = all.iter().copied().filter(|i| *i != m).collect();
    let installed = || -> u64 {
        peers
            .iter()
            .map(|i| sync_stats(&l, *i)["installed"].as_u64().unwrap_or(0))
            .sum()
    };
    assert!(
        lb_tests::lab::wait_for(Duration::from_secs(10), || (installed() > 0).then_some(()))
            .is_some(),
        "the peers never installed the exceptions\n{}",
        l.logs()
    );
    drain(&l, "undrain");
    wait_backend(&l, &all, &kaddr, true);
    // A SYN on a closed entry whose pair takes new flows follows it until the close is
    // `FLOW_CLOSE_HOLD` coarse time units old (a forged close then moves nothing); after that
    // the reused 5-tuple is placed afresh, on its slot (k's) now. (TIME_WAIT reuse needs a
    // second since the last segment: within that too.)
    let hold = Duration::from_nanos(
        u64::from(lb_common::FLOW_CLOSE_HOLD) << lb_common::FLOW_CLOSE_TIME_UNIT,
    );
    std::thread::sleep(hold + Duration::from_millis(1000));
    let port = lb_userspace_sync_port();
    let block = |l: &VrrpLab, op: &str| {
        for i in &peers {
            l.lab.run(
                &l.nodes[*i],
                "iptables",
                &[op, "INPUT", "-p", "udp", "--dport", port, "-j", "DROP"],
            );
        }
    };
    if lose_retractions {
        block(&l, "-I");
    }
    // The same 5-tuples again: those whose slot is k go to k now.
    l.lab.spawn(
        "client",
        "second",
        LABNODE,
        &[
            "hold-ids",
            l.vip,
            PORT,
            &N.to_string(),
            if lose_retractions { "16" } else { "12" },
            "200",
            "8",
            FIRST,
        ],
    );
    // Two scans of the owner (500 ms apart), then its lbd stops: the VIP moves.
    std::thread::sleep(Duration::from_secs(3));
    if lose_retractions {
        // The retractions of those scans are lost; the peers hear again, and the owner's next
        // full send (every fifth scan) comes.
        let before: u64 = peers
            .iter()
            .map(|i| sync_stats(&l, *i)["retracted"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            before, 0,
            "no retraction reached the peers while they dropped them"
        );
        block(&l, "-D");
        std::thread::sleep(Duration::from_secs(4));
    }
    let retracted_before: u64 = peers
        .iter()
        .map(|i| sync_stats(&l, *i)["retracted"].as_u64().unwrap_or(0))
        .sum();
    l.signal(m, libc::SIGTERM);
    let new_master = l
        .wait_one_master(&peers, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no new master\n{}", l.logs()));
    assert!(l.lab.wait("second", Duration::from_secs(40)).is_some());
    let second = last_json(&l.lab.log("second"));
    let detail = format!(
        "owner n{} -> n{}, drained n{}; first {first}; second {second}; retracted on the peers before the move {retracted_before}; new owner's sync {}",
        m + 1,
        new_master + 1,
        k + 1,
        sync_stats(&l, new_master)
    );
    println!("{detail}");
    // The case is there: some reused 5-tuples changed backend (to k).
    assert!(
        second["survived_by_id"][&l.nodes[k]].as_u64().unwrap_or(0)
            + second["failed_by_id"][&l.nodes[k]].as_u64().unwrap_or(0)
            > 0,
        "no reused 5-tuple moved to n{}: {detail}",
        k + 1
    );
    assert_eq!(
        (
            sum_counts(&second["survived_by_id"]),
            sum_counts(&second["failed_by_id"])
        ),
        (N, 0),
        "every connection on a reused 5-tuple survives the move: {detail}"
    );
}

/// Connections the client closed travel closed: the first connections on a 5-tuple are
/// exceptions (their slot's backend k drained) on the other backends, synced, and closed by
/// the client (its FIN at the owner). Then k takes new flows again and another backend, a,
/// is drained; the VIP moves once the closes are older than the close rule's hold. A client
/// reusing those 5-tuples at the new owner is placed afresh, as the old owner would have
/// placed it: never on the drained a. With the peers' copies open (as lbd installed them
/// before the close travelled), the reused 5-tuples followed them to a.
#[test]
fn a_5_tuple_reused_after_its_close_is_placed_afresh_after_a_vip_move() {
    const N: u64 = 60;
    const FIRST: &str = "42000";
    let mut l = lab(true, false, 500);
    let all = [0usize, 1, 2];
    let (m, k, kaddr) = serving(&l);
    let a = (m + 2) % 3;
    let aaddr = l.addr(&l.nodes[a].clone());
    let client = l.lab.node("client").netns.clone();
    l.lab.sysctl(&client, "net.ipv4.tcp_tw_reuse", "1");
    let set = |l: &VrrpLab, verb: &str, addr: &str| {
        for i in all {
            l.lbctl(i, &["backends", verb, "api", addr])
                .unwrap_or_else(|| panic!("lbctl backends {verb}"));
        }
    };
    set(&l, "drain", &kaddr);
    wait_backend(&l, &all, &kaddr, false);
    let conns = |l: &mut VrrpLab, name: &str| {
        l.lab.spawn(
            "client",
            name,
            LABNODE,
            &[
                "hold-ids",
                l.vip,
                PORT,
                &N.to_string(),
                "1",
                "200",
                "3",
                FIRST,
            ],
        );
        assert!(l.lab.wait(name, Duration::from_secs(30)).is_some());
        last_json(&l.lab.log(name))
    };
    // First connections, closed by the client when done: none on k.
    let first = conns(&mut l, "first");
    assert_eq!(
        sum_counts(&first["survived_by_id"]),
        N,
        "first connections: {first}"
    );
    let peers: Vec<usize> = all.iter().copied().filter(|i| *i != m).collect();
    // The peers' copies of the exceptions on a.
    let closed_on_a = |l: &VrrpLab| -> (u64, u64) {
        let mut n = (0, 0);
        for i in &peers {
            let f = l
                .lbctl(*i, &["flows", l.vip, "--limit", "10000"])
                .unwrap_or_default();
            for r in f["flows"].as_array().into_iter().flatten() {
                if r["backend"].as_str() == Some(aaddr.as_str()) {
                    if r["client_closed"].as_bool() == Some(true) {
                        n.0 += 1;
                    } else {
                        n.1 += 1;
                    }
                }
            }
        }
        n
    };
    assert!(
        lb_tests::lab::wait_for(Duration::from_secs(10), || {
            let (closed, open) = closed_on_a(&l);
            (closed + open > 0).then_some(())
        })
        .is_some(),
        "the peers never installed an exception on n{}\n{}",
        a + 1,
        l.logs()
    );
    set(&l, "undrain", &kaddr);
    set(&l, "drain", &aaddr);
    wait_backend(&l, &all, &kaddr, true);
    wait_backend(&l, &all, &aaddr, false);
    // The closes are older than the hold everywhere (a copy's hold is at most one coarse unit
    // longer than the owner's).
    std::thread::sleep(Duration::from_nanos(
        u64::from(lb_common::FLOW_CLOSE_HOLD + 1) << lb_common::FLOW_CLOSE_TIME_UNIT,
    ));
    let before_move = closed_on_a(&l);
    l.signal(m, libc::SIGTERM);
    let new_master = l
        .wait_one_master(&peers, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no new master\n{}", l.logs()));
    std::thread::sleep(Duration::from_secs(1));
    let second = conns(&mut l, "second");
    let on = |r: &Value, n: usize| {
        r["survived_by_id"][&l.nodes[n]].as_u64().unwrap_or(0)
            + r["failed_by_id"][&l.nodes[n]].as_u64().unwrap_or(0)
    };
    let detail = format!(
        "owner n{} -> n{}, k n{} (drained, then not), a n{} (drained after); first {first}; second {second}; the peers' entries on a before the move (closed, open) {before_move:?}; new owner's sync {}",
        m + 1,
        new_master + 1,
        k + 1,
        a + 1,
        sync_stats(&l, new_master)
    );
    println!("{detail}");
    assert_eq!(
        on(&second, a),
        0,
        "reused 5-tuples went to the drained backend: {detail}"
    );
    assert_eq!(sum_counts(&second["survived_by_id"]), N, "{detail}");
    assert_eq!(
        before_move.1, 0,
        "the peers held open copies of closed connections: {detail}"
    );
}

/// Send `n` UDP datagrams of `len` bytes (an authentic-looking header, a tag of garbage) from
/// `node` to `to`'s sync port.
fn send_forged(l: &VrrpLab, node: &str, to: &str, n: usize, len: usize) {
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor i in range({n}):\n    s.sendto(b'LBS1\\x01\\x00\\x00\\x00' + bytes(8) + bytes([i % 256]) * {}, ('{to}', 1940))\n",
        len - 16
    );
    let out = l
        .lab
        .cmd(node, "python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn outsiders_and_holders_of_another_key_cannot_write_a_connection_table() {
    let mut l = lab(true, false, 1000);
    let all = [0usize, 1, 2];
    let m = l
        .wait_one_master(&all, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no master\n{}", l.logs()));
    let target = l.addr(&l.nodes[m].clone());
    let peer = l.nodes[(m + 1) % 3].clone();
    let before = sync_stats(&l, m);
    // From a host that is no peer, and from a peer's address without the key.
    send_forged(&l, "client", &target, 20, 16 + 60 + 32);
    send_forged(&l, &peer, &target, 20, 16 + 60 + 32);
    let ok = lb_tests::lab::wait_for(Duration::from_secs(10), || {
        let s = sync_stats(&l, m);
        (s["refused"]["not_a_peer"].as_u64()? >= 20 && s["refused"]["auth"].as_u64()? >= 20)
            .then_some(s)
    });
    let s = ok.unwrap_or_else(|| panic!("refusals not counted: {}", sync_stats(&l, m)));
    assert_eq!(
        s["installed"], before["installed"],
        "nothing forged was installed: {s}"
    );
    assert_eq!(s["received_entries"], before["received_entries"], "{s}");
    // The peers' own datagrams still count. With no exception to share a peer sends only its
    // hello when it starts (which the target may have missed if it started later): restart one.
    let p = (m + 1) % 3;
    l.stop(p, libc::SIGTERM);
    l.start(p);
    let heard = lb_tests::lab::wait_for(Duration::from_secs(15), || {
        let s = sync_stats(&l, m);
        (s["received_datagrams"].as_u64()? > 0).then_some(())
    });
    assert!(
        heard.is_some(),
        "the peers are heard: {}",
        sync_stats(&l, m)
    );
}

/// A backup restarted with no exception of its own still says hello, so the owner sends it
/// every exception at once, not at its next full send (five periods: 5 min here).
#[test]
fn a_restarted_backup_without_exceptions_gets_the_owners_by_its_hello() {
    let mut l = lab(true, false, 60_000);
    let all = [0usize, 1, 2];
    let (m, k, kaddr) = serving(&l);
    // Exceptions at the owner: k's backend is drained, so connections on its slots go to the
    // others.
    for i in all {
        l.lbctl(i, &["backends", "drain", "api", &kaddr])
            .expect("lbctl backends drain");
    }
    wait_backend(&l, &all, &kaddr, false);
    l.lab.spawn(
        "client",
        "hold",
        LABNODE,
        &["hold-ids", l.vip, PORT, "60", "20", "200", "8"],
    );
    // The connections open; the owner scans only after a table change or every 60 s, so
    // what it finds goes out at its next full send, or at once to a peer that says hello.
    std::thread::sleep(Duration::from_secs(3));
    let b = (m + 2) % 3;
    l.stop(b, libc::SIGTERM);
    l.start(b);
    let got = lb_tests::lab::wait_for(Duration::from_secs(20), || {
        let s = sync_stats(&l, b);
        let n = s["installed"].as_u64().unwrap_or(0) + s["already_present"].as_u64().unwrap_or(0);
        (n > 0).then_some(n)
    });
    assert!(
        got.is_some(),
        "the restarted n{} got none of the owner's exceptions (owner n{}, drained n{}): owner {} restarted {}\n{}",
        b + 1,
        m + 1,
        k + 1,
        sync_stats(&l, m),
        sync_stats(&l, b),
        l.logs()
    );
}
