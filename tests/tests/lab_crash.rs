//! A crash of lbd (SIGKILL, the OOM killer) on the API VIP's owner, in the compact cluster's
//! shape as `lbctl render` makes it (three nodes, each an LB node and a DSR backend of the API
//! VIP, the connection sync and the membership on), lbd run as a process (the guardian its
//! child; `lab_pod.rs` runs the same in the pods, the guardian as PID 1): long-lived
//! connections through the owner to every node's backend survive. The owner's node keeps
//! forwarding (the pinned program) until a backup holds the VIP; no node answers a segment of
//! them with a reset. Needs root; `cargo xtask test`.

use std::{process::Child, time::Duration};

use lb_tests::sum_counts;
use lb_tests::{
    cluster::{API_VIP, CONTROL_PLANE, Cluster, ECHO_PORT, Runner, Shape},
    lab::wait_for,
};
use serde_json::Value;

fn labnode(c: &Cluster, args: &[&str]) -> Child {
    c.client_labnode(args)
}

#[test]
fn a_crash_of_the_owners_lbd_resets_no_connection_to_any_nodes_backend() {
    crash_of_the_owner(Shape::Compact, false);
}

/// The same in the demo's shape (`cargo xtask demo`: three control-plane nodes for the API VIP,
/// two workers for the ingress VIP).
#[test]
fn a_crash_of_the_owners_lbd_in_the_demo_shape_resets_no_connection() {
    crash_of_the_owner(Shape::Demo, false);
}

/// After the upgrade sequence (issue 35): a node reboots (its lbd and backends away until the
/// owner has them out, plus a hold), 150 connections open meanwhile, it comes back (lbd and
/// backends; some connections are exceptions now), then the owner's lbd is killed. The
/// returning backend climbs through slow start on each node's own clock (and the restarted
/// node gives its own backend its full weight), so the nodes' tables differ for a while: a flow
/// on its slot at the owner may be off it at the new one, and is shared anyway
/// (`sync::view::Service::share_all`).
#[test]
fn a_crash_of_the_owners_lbd_after_a_node_came_back_resets_no_connection() {
    crash_of_the_owner(Shape::Demo, true);
}

fn active_on(c: &Cluster, node: &str, n: usize) -> Option<()> {
    let rows = c.lbctl(node, &["backends", "list"])?;
    let rows = rows.as_array()?;
    (rows.iter().filter(|r| r["state"] == "active").count() == n).then_some(())
}

fn crash_of_the_owner(shape: Shape, upgrade: bool) {
    let mut c = Cluster::boot(shape, Runner::Process);
    let api = c
        .wait_master("api", &CONTROL_PLANE, Duration::from_secs(30))
        .expect("an API VIP owner");
    wait_for(Duration::from_secs(30), || {
        let rows = c.lbctl(&api, &["backends", "list"])?;
        rows.as_array()?
            .iter()
            .all(|r| r["state"] == "active")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("backends never all active on {api}"));
    let all = c
        .lbctl(&api, &["backends", "list"])
        .unwrap()
        .as_array()
        .unwrap()
        .len();
    let k = CONTROL_PLANE.iter().copied().find(|n| *n != api).unwrap();
    if upgrade {
        // Node k reboots: its backends and its lbd go away, until the owner has them out.
        for t in c.service_tags(k) {
            c.lab.stop(&t, libc::SIGKILL);
        }
        c.lab.stop(&format!("lbd-{k}"), libc::SIGTERM);
        wait_for(Duration::from_secs(40), || {
            let rows = c.lbctl(&api, &["backends", "list"])?;
            let rows = rows.as_array()?;
            (rows.iter().filter(|r| r["state"] == "active").count() < all).then_some(())
        })
        .unwrap_or_else(|| panic!("{k}'s backends never out on {api}"));
        std::thread::sleep(Duration::from_secs(11));
    }
    let secs = if upgrade { "45" } else { "12" };
    let hold = labnode(&c, &["hold-ids", API_VIP, ECHO_PORT, "150", secs, "100"]);
    std::thread::sleep(Duration::from_millis(2500));
    if upgrade {
        c.start_services(k);
        c.start(k);
        wait_for(Duration::from_secs(30), || active_on(&c, &api, all))
            .unwrap_or_else(|| panic!("{k}'s backends never back on {api}"));
        // Scans after the change reach the peers.
        std::thread::sleep(Duration::from_secs(6));
        println!(
            "owner's sync before the crash: {}",
            c.lbctl(&api, &["stats"])
                .map(|v| v["sync"].clone())
                .unwrap_or_default()
        );
    }
    // Each node's view of the API VIP's backends at the crash (slow start's step in the
    // reason): where they differ, a flow on its slot at the owner may be off it elsewhere.
    for n in CONTROL_PLANE {
        let rows = c.lbctl(n, &["backends", "list"]).unwrap_or_default();
        let view: Vec<String> = rows
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["vip"] == API_VIP)
            .map(|r| format!("{} {} {}", r["backend"], r["state"], r["reason"]))
            .collect();
        println!("{n}'s API backends at the crash: {view:?}");
    }
    c.lab.stop(&format!("lbd-{api}"), libc::SIGKILL);
    let rest: Vec<&str> = CONTROL_PLANE
        .iter()
        .copied()
        .filter(|n| *n != api)
        .collect();
    let new_owner = c.wait_master("api", &rest, Duration::from_secs(20));
    let out = hold.wait_with_output().expect("labnode");
    let held: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    println!("SIGKILL of lbd on the owner {api}, new owner {new_owner:?}: {held}");
    for n in &rest {
        println!(
            "{n}'s sync after: {}",
            c.lbctl(n, &["stats"])
                .map(|v| v["sync"].clone())
                .unwrap_or_default()
        );
    }
    let on: Vec<&String> = held["survived_by_id"]
        .as_object()
        .into_iter()
        .chain(held["failed_by_id"].as_object())
        .flat_map(|m| m.keys())
        .filter(|k| **k != api)
        .collect();
    assert!(
        !on.is_empty(),
        "connections on other nodes' backends: {held}"
    );
    assert_eq!(
        (
            sum_counts(&held["survived_by_id"]),
            sum_counts(&held["failed_by_id"])
        ),
        (150, 0),
        "connections across a crash of the owner's lbd ({api}): {held}"
    );
}
