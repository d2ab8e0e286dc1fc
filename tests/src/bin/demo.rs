//! `cargo xtask demo`: a self-contained lab of network namespaces shaped like a small cluster,
//! showing lb at work. Everything it creates (namespaces, links, pinned maps, processes) is
//! removed at the end, also when a step fails.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use lb_tests::{
    bin_dir,
    cluster::{API_VIP, CLUSTER, CONTROL_PLANE, Cluster, ECHO_PORT, INGRESS_VIP, WORKERS},
    dsr::{self, VIP4, VIP6},
};
use serde_json::Value;

fn say(step: &str) {
    println!("\n\x1b[1m==> {step}\x1b[0m");
}

fn tally(v: &Value) -> String {
    let by_id: BTreeMap<String, u64> =
        serde_json::from_value(v["by_id"].clone()).unwrap_or_default();
    let parts: Vec<String> = by_id.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let errors: BTreeMap<String, u64> =
        serde_json::from_value(v["errors"].clone()).unwrap_or_default();
    let errors: Vec<String> = errors.iter().map(|(k, n)| format!("{k} x{n}")).collect();
    let errors = if errors.is_empty() {
        String::new()
    } else {
        format!(" (errors: {})", errors.join(", "))
    };
    format!(
        "{} ok, {} failed: {}{errors}",
        v["ok"],
        v["failed"],
        parts.join(", ")
    )
}

fn cluster_demo() {
    let t0 = Instant::now();
    let (api_vrid, ingress_vrid) = lb_userspace::vrrp::vrids::openshift_vrids(CLUSTER);
    say(&format!(
        "Cluster {CLUSTER:?}: 3 control-plane nodes (lbd + apiserver stand-in), 2 workers (lbd + router stand-in), 1 client"
    ));
    println!(
        "  API VIP {API_VIP} (VRID {api_vrid}), ingress VIP {INGRESS_VIP} (VRID {ingress_vrid}), as `lbctl vr-ids {CLUSTER}` derives them"
    );
    let mut c = Cluster::new();

    say("VRRP elects one owner per VIP");
    let api = c
        .wait_master("api", &CONTROL_PLANE, Duration::from_secs(20))
        .expect("an API VIP owner");
    let ingress = c
        .wait_master("ingress", &WORKERS, Duration::from_secs(20))
        .expect("an ingress VIP owner");
    println!(
        "  API VIP owner: {api}; ingress VIP owner: {ingress} (elected in {:.1}s)",
        t0.elapsed().as_secs_f64()
    );
    print!("{}", indent(&c.lbctl_text(&api, &["vrrp", "status"])));
    // Every API backend must be up before traffic (health checks, neighbour resolution).
    lb_tests::lab::wait_for(Duration::from_secs(20), || {
        let rows = c.lbctl(&api, &["backends", "list"])?;
        rows.as_array()?
            .iter()
            .all(|r| r["state"] == "active")
            .then_some(())
    });

    say("Client traffic is spread across backends (direct server return)");
    println!(
        "  600 HTTPS GETs to {API_VIP}:6443    -> {}",
        tally(&c.get_many(&format!("{API_VIP}:6443"), true, 600))
    );
    println!(
        "  400 HTTP GETs to {INGRESS_VIP}:80   -> {}",
        tally(&c.get_many(&format!("{INGRESS_VIP}:80"), false, 400))
    );
    println!(
        "  200 HTTPS GETs to {INGRESS_VIP}:443 -> {}",
        tally(&c.get_many(&format!("{INGRESS_VIP}:443"), true, 200))
    );
    println!("\n  lbctl backends list (on {api}):");
    print!("{}", indent(&c.lbctl_text(&api, &["backends", "list"])));

    say(&format!(
        "The API VIP owner {api} dies (lbd killed, node off the network) with 150 connections open"
    ));
    let labnode = bin_dir().join("labnode");
    let hold = c
        .lab
        .cmd("client", &labnode)
        .args(["hold-ids", API_VIP, ECHO_PORT, "150", "6", "100"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start long-lived connections");
    std::thread::sleep(Duration::from_millis(1500));
    c.fail_node(&api);
    let killed = Instant::now();
    let mut answered = None;
    while killed.elapsed() < Duration::from_secs(10) {
        if c.probe() {
            answered = Some(killed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let rest: Vec<&str> = CONTROL_PLANE
        .iter()
        .copied()
        .filter(|n| *n != api)
        .collect();
    let new_owner = c
        .wait_master("api", &rest, Duration::from_secs(10))
        .unwrap_or_else(|| "?".into());
    match answered {
        Some(t) => println!(
            "  new owner {new_owner}; the client got answers again {} ms after the failure",
            t.as_millis()
        ),
        None => println!("  new owner {new_owner}; the client got no answer within 10 s"),
    }
    let out = hold.wait_with_output().expect("long-lived connections");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let survived: BTreeMap<String, u64> =
        serde_json::from_value(v["survived_by_id"].clone()).unwrap_or_default();
    let failed: BTreeMap<String, u64> =
        serde_json::from_value(v["failed_by_id"].clone()).unwrap_or_default();
    let on_live: u64 = survived
        .iter()
        .filter(|(k, _)| **k != api)
        .map(|(_, n)| n)
        .sum::<u64>();
    let live_total: u64 = on_live
        + failed
            .iter()
            .filter(|(k, _)| **k != api)
            .map(|(_, n)| n)
            .sum::<u64>();
    let on_dead: u64 =
        survived.get(&api).copied().unwrap_or(0) + failed.get(&api).copied().unwrap_or(0);
    println!(
        "  open connections on the surviving apiservers: {on_live} of {live_total} survived the VIP move ({on_dead} were on {api} itself, which died with it)"
    );
    println!("  (with keepalived + haproxy every open connection is reset when the VIP moves)");

    // A non-owner: on the owner itself the failing local /readyz would also lower its VRRP
    // priority (tracked check) and move the VIP, as OpenShift's tracked scripts do.
    let unready = rest
        .iter()
        .copied()
        .find(|n| *n != new_owner)
        .unwrap_or(rest[0]);
    say(&format!(
        "An apiserver becomes unready: {unready} is taken out of rotation"
    ));
    let _ = std::fs::remove_file(c.ready_file(unready));
    let t = Instant::now();
    let gone = lb_tests::lab::wait_for(Duration::from_secs(10), || {
        let rows = c.lbctl(&new_owner, &["backends", "list"])?;
        rows.as_array()?
            .iter()
            .any(|r| {
                r["port"] == 6443
                    && r["state"] == "down"
                    && r["backend"].as_str().map(|b| c.lab.node(unready).v4 == b) == Some(true)
            })
            .then_some(())
    });
    if gone.is_some() {
        println!(
            "  marked down {} ms after /readyz started failing",
            t.elapsed().as_millis()
        );
    }
    println!(
        "  300 HTTPS GETs to {API_VIP}:6443 -> {}",
        tally(&c.get_many(&format!("{API_VIP}:6443"), true, 300))
    );
    print!(
        "{}",
        indent(&c.lbctl_text(&new_owner, &["backends", "list"]))
    );

    say("Cleaning up");
    drop(c);
    println!(
        "  namespaces, links, pinned maps and processes removed ({:.1}s)",
        t0.elapsed().as_secs_f64()
    );
}

fn dsr_demo() {
    let labnode = bin_dir().join("labnode").display().to_string();
    say("Data plane close up: one LB node, three DSR backends (weights 1, 1, 2), IPv4 and IPv6");
    let l = dsr::setup(&labnode);
    for vip in [VIP4, VIP6] {
        let (lb_rx0, _) = l.lab.counters("lb");
        let (_, client_tx0) = l.lab.counters("client");
        let r = l.connect_many(&labnode, vip, 2000);
        let (lb_rx1, _) = l.lab.counters("lb");
        let (_, client_tx1) = l.lab.counters("client");
        println!(
            "  2000 connections to {vip}: {}; the LB node received {} packets for the {} the client sent (replies bypass it)",
            tally(&r),
            lb_rx1 - lb_rx0,
            client_tx1 - client_tx0
        );
    }
    let out = lb_tests::lbctl::command()
        .args(["--socket", &l.socket, "stats"])
        .output()
        .unwrap();
    let counters: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("COUNTER"))
        .skip(1)
        .filter(|l| !l.trim_end().ends_with(" 0"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    println!("  XDP counters: {}", counters.join(", "));
    drop(l);
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("demo: needs root (XDP and network namespaces)");
        std::process::exit(1);
    }
    let t0 = Instant::now();
    cluster_demo();
    dsr_demo();
    println!(
        "\ndemo finished in {:.1}s; nothing left behind",
        t0.elapsed().as_secs_f64()
    );
}
