//! The static pods of deploy/ run by a real container engine (podman `kube play`) on lab nodes:
//! a compact three-node cluster whose configs `lbctl render` wrote from one description, each
//! node running the shipped control-plane manifest (host network, privileged, bpffs and /run
//! mounts, exec probes) with the image `cargo xtask image` built, named by digest.
//!
//! Needs root, podman, runc and catatonit (`cargo xtask setup`); the image is built by
//! `cargo xtask test` (or here, with `cargo xtask image --debug`, when missing or stale).

use std::{collections::BTreeMap, process::Child, time::Duration};

use lb_tests::sum_counts;
use lb_tests::{
    cluster::{API_VIP, CONTROL_PLANE, Cluster, ECHO_PORT, INGRESS_VIP, Runner, Shape},
    lab::wait_for,
    pods::Pods,
};
use serde_json::Value;

fn pods(c: &Cluster) -> &Pods {
    match &c.runner {
        Runner::Pod(p) => p,
        Runner::Process => unreachable!("booted with pods"),
    }
}

fn boot() -> Cluster {
    let c = Cluster::boot(Shape::Compact, Runner::Pod(Pods::new("pd")));
    // Host networking must mean the node's network: a pod that landed in the host's
    // namespace would be a test escaping its lab.
    for n in CONTROL_PLANE {
        wait_for(Duration::from_secs(30), || c.lbctl(n, &["stats"])).unwrap_or_else(|| {
            panic!(
                "lbd does not answer in the pod on {n}\n{}",
                pods(&c).logs(n)
            )
        });
        let pid = pods(&c).pid(n).expect("lbd's pid");
        assert_eq!(
            Pods::netns_of_pid(pid),
            Pods::netns_of_node(&c.lab, n),
            "lbd of {n} runs in its node's network namespace"
        );
    }
    c
}

/// Both VIPs elected and every API backend active on the API owner: (api owner, ingress owner).
fn elected(c: &Cluster) -> (String, String) {
    let logs = || {
        CONTROL_PLANE
            .iter()
            .map(|n| format!("--- {n}\n{}", pods(c).logs(n)))
            .collect::<String>()
    };
    let api = c
        .wait_master("api", &CONTROL_PLANE, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no API VIP owner\n{}", logs()));
    let ingress = c
        .wait_master("ingress", &CONTROL_PLANE, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no ingress VIP owner\n{}", logs()));
    wait_for(Duration::from_secs(20), || {
        let rows = c.lbctl(&api, &["backends", "list"])?;
        let rows = rows.as_array()?;
        (rows.len() == 3 * 2 + 3 * 2 && rows.iter().all(|r| r["state"] == "active")).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "backends not all active on {api}\n{}",
            c.lbctl_text(&api, &["backends", "list"])
        )
    });
    (api, ingress)
}

/// The VRRP and ownership events of every node's lbd, for failure messages.
fn events(c: &Cluster) -> String {
    CONTROL_PLANE
        .iter()
        .map(|n| {
            let lines: Vec<String> = pods(c)
                .logs(n)
                .lines()
                .filter(|l| {
                    [
                        "VRRP state",
                        "ownership",
                        "adopted",
                        "keeping",
                        "lbd running",
                        "stopping",
                    ]
                    .iter()
                    .any(|k| l.contains(k))
                })
                .map(str::to_owned)
                .collect();
            format!("--- {n}\n{}\n", lines.join("\n"))
        })
        .collect()
}

fn labnode(c: &Cluster, args: &[&str]) -> Child {
    c.client_labnode(args)
}

fn json_of(child: Child) -> Value {
    let out = child.wait_with_output().expect("labnode");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn pods_from_the_manifests_elect_and_forward_and_lbctl_works_inside() {
    let c = boot();
    let p = pods(&c);
    let (api, ingress) = elected(&c);

    // A normal start logs none of netlink-packet-route's IFLA_INET6_CONF warnings (an operator
    // reads WARN as trouble). Other warnings may be real events: equal-priority nodes started
    // together may briefly both be master and log the split brain they resolve.
    for n in CONTROL_PLANE {
        let logs = p.logs(n);
        let noise: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("\"level\":\"WARN\"") && l.contains("netlink_packet_route"))
            .collect();
        assert!(
            noise.is_empty(),
            "netlink warnings at start on {n}:\n{noise:?}"
        );
    }
    // What docs/deploy.md quotes for the manifests' memory request (`--nocapture` shows it).
    // The container's processes: the guardian (its init) and the daemon.
    let rss_kb = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    for n in CONTROL_PLANE {
        let init = p.pid(n).unwrap();
        let daemon = children(init).first().copied().expect("the daemon");
        println!(
            "lbd in the pod on {n}: daemon VmRSS {} kB, guardian (init) VmRSS {} kB",
            rss_kb(daemon),
            rss_kb(init)
        );
    }
    // Forwarding through both VIPs of the combined config, spread over the backends.
    let v = c.get_many(&format!("{API_VIP}:6443"), true, 300);
    assert_eq!(v["ok"], 300, "HTTPS through the API VIP: {v}");
    let by_id: BTreeMap<String, u64> = serde_json::from_value(v["by_id"].clone()).unwrap();
    assert!(by_id.len() >= 2, "flows spread over apiservers: {v}");
    let v = c.get_many(&format!("{INGRESS_VIP}:80"), false, 200);
    assert_eq!(v["ok"], 200, "HTTP through the ingress VIP: {v}");

    // lbctl inside the pod, on the socket of the pod's /run/lbd mount.
    let out = p.exec(
        &api,
        &["/usr/local/bin/lbctl", "-o", "json", "vips", "list"],
    );
    assert!(
        out.status.success(),
        "lbctl in the pod: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vips: Value = serde_json::from_slice(&out.stdout).expect("lbctl JSON");
    let owned = |name: &str| {
        vips.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["name"] == name)
            .all(|r| r["owned"] == true)
    };
    assert!(
        owned("api"),
        "the API owner's pod says it owns the API VIP: {vips}"
    );
    assert_eq!(owned("ingress"), api == ingress, "{vips}");
    // The manifest's probes run in the image, as kubelet runs them.
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let out = p.probe(&api, probe);
        assert!(
            out.status.success(),
            "{probe}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sigkill_of_the_owners_pod_keeps_forwarding_and_the_restart_adopts_pinned_state() {
    let c = boot();
    let p = pods(&c);
    let (api, _) = elected(&c);
    // SIGKILL of lbd in the owner's pod while 100 connections are open: the pinned program keeps
    // forwarding, a backup takes the VIP with the same table, the engine restarts the
    // container and the new lbd adopts the pinned state.
    let hold = labnode(&c, &["hold-ids", API_VIP, ECHO_PORT, "100", "10", "100"]);
    std::thread::sleep(Duration::from_millis(2000));
    let old = p.pid(&api).unwrap();
    let restarts = p.restart_count(&api);
    p.kill(&api, libc::SIGKILL);
    let new = p
        .wait_restarted(&api, old, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the pod's lbd was not restarted\n{}", p.logs(&api)));
    assert_eq!(
        Pods::netns_of_pid(new),
        Pods::netns_of_node(&c.lab, &api),
        "the restarted lbd runs in its node's network namespace"
    );
    assert!(
        p.restart_count(&api) > restarts,
        "restart policy restarted it"
    );
    let held = json_of(hold);
    assert_eq!(
        (
            sum_counts(&held["survived_by_id"]),
            sum_counts(&held["failed_by_id"])
        ),
        (100, 0),
        "connections across SIGKILL of the owner's lbd ({api}) and its restart: {held}\n{}",
        events(&c)
    );
    let logs = wait_for(Duration::from_secs(20), || {
        let l = p.logs(&api);
        (l.contains("adopted pinned data-plane state") && l.contains("adopted the pinned XDP link"))
            .then_some(l)
    })
    .unwrap_or_else(|| panic!("the restarted lbd adopted nothing\n{}", p.logs(&api)));
    assert!(!logs.contains("resetting it"), "pinned state kept: {logs}");
    wait_for(Duration::from_secs(20), || {
        c.lbctl(&api, &["vrrp", "status"])
            .filter(|v| v.as_array().map(|a| a.len()) == Some(2))
    })
    .expect("the restarted lbd answers with both instances");
    let v = c.get_many(&format!("{API_VIP}:6443"), true, 100);
    assert_eq!(v["ok"], 100, "after the restart: {v}");
}

/// The children of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_crash_of_the_daemon_in_the_pod_gives_the_vip_back_at_once() {
    let c = boot();
    let p = pods(&c);
    let (api, _) = elected(&c);
    let netns = c.lab.node(&api).netns.clone();
    assert!(lb_tests::lab::has_address(&netns, "eth0", API_VIP));
    // The container's init is lbd's VIP guardian and the daemon its child: when an init dies
    // the kernel kills the whole container, so a guardian child would die with the daemon.
    let init = p.pid(&api).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1")),
        "lbd is the container's PID 1: {status}"
    );
    let daemon = *children(init)
        .first()
        .unwrap_or_else(|| panic!("the daemon runs under the guardian\n{}", p.logs(&api)));
    // A crash of the daemon (what the OOM killer would pick: the big process).
    let restarts = p.restart_count(&api);
    let killed = std::time::Instant::now();
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let gone = wait_for(Duration::from_secs(3), || {
        (!lb_tests::lab::has_address(&netns, "eth0", API_VIP)).then(|| killed.elapsed())
    })
    .unwrap_or_else(|| {
        panic!(
            "the VIP stayed on {api} after its daemon died\n{}",
            p.logs(&api)
        )
    });
    println!("daemon SIGKILLed in the pod on {api}: VIP given back after {gone:?}");
    let others: Vec<&str> = CONTROL_PLANE
        .iter()
        .copied()
        .filter(|n| *n != api)
        .collect();
    let new_owner = c
        .wait_master("api", &others, Duration::from_secs(10))
        .expect("a backup takes the VIP");
    // The guardian exits with the daemon's status: the restart policy restarts the container.
    p.wait_restarted(&api, init, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the pod was not restarted\n{}", p.logs(&api)));
    assert!(p.restart_count(&api) > restarts);
    assert!(
        lb_tests::lab::has_address(&c.lab.node(&new_owner).netns, "eth0", API_VIP),
        "the new owner {new_owner} holds the VIP"
    );
    let v = c.get_many(&format!("{API_VIP}:6443"), true, 50);
    assert_eq!(v["ok"], 50, "through the new owner: {v}");
}

/// A kubelet-style restart of the VIP owner's pod resets nothing. Under CPU pressure the new
/// owner's daemon is slow: it must announce the VIP only once its data plane forwards, or its
/// local stack (the VIP on `lo`) resets every flow of the other backends.
#[test]
fn pod_restart_of_the_owner_with_sigterm_resets_no_connection() {
    let c = boot();
    let p = pods(&c);
    let (api, _) = elected(&c);

    // 100 long-lived connections and a stream of new ones while the owner's pod restarts the
    // way kubelet restarts it: SIGTERM, wait for exit (grace 10 s), start.
    let hold = labnode(&c, &["hold-ids", API_VIP, ECHO_PORT, "100", "12", "100"]);
    let stream = labnode(&c, &["connect-for", API_VIP, ECHO_PORT, "11", "2", "2000"]);
    std::thread::sleep(Duration::from_millis(2000));
    let stop = p.stop(&api, Duration::from_secs(10));
    assert!(
        stop.status.success(),
        "podman pod stop: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert_eq!(
        p.exit_code(&api),
        Some(0),
        "lbd exits by itself on SIGTERM, within the grace period\n{}",
        p.logs(&api)
    );
    let start = p.start(&api);
    assert!(
        start.status.success(),
        "podman pod start: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    let pid = wait_for(Duration::from_secs(20), || p.pid(&api)).unwrap_or_else(|| {
        panic!(
            "lbd back within 20 s of the pod's start: state {:?}, exit code {:?}\n{}",
            p.inspect(&api, "{{.State.Status}} {{.State.Error}}"),
            p.exit_code(&api),
            p.logs(&api)
        )
    });
    // Should the pid's namespace not be readable (the process gone), the message says what the
    // pod did meanwhile.
    let netns = Pods::netns_of_pid(pid);
    assert_eq!(
        netns,
        Pods::netns_of_node(&c.lab, &api),
        "the restarted pod runs in its node's network namespace (pid {pid}; now pid {:?}, \
         {} restarts, state {:?})\n{}",
        p.pid(&api),
        p.restart_count(&api),
        p.inspect(&api, "{{.State.Status}} {{.State.Error}}"),
        p.logs(&api)
    );
    let held = json_of(hold);
    let new = json_of(stream);
    // Zero resets on a planned move needs the graceful handover (issue 8): the old owner keeps
    // forwarding with its last table for a grace period after giving up the VIP, until the new
    // owner's announcement has reached the clients.
    assert_eq!(
        (
            sum_counts(&held["survived_by_id"]),
            sum_counts(&held["failed_by_id"])
        ),
        (100, 0),
        "long-lived connections across a SIGTERM restart of the owner's pod: {held}\n{}",
        CONTROL_PLANE
            .iter()
            .map(|n| format!("== {n}'s lbd\n{}", p.logs(n)))
            .collect::<String>()
    );
    assert_eq!(
        new["failed"], 0,
        "new connections during the restart: {new}"
    );
    assert!(new["ok"].as_u64().unwrap_or(0) > 0, "{new}");
}

/// As the container's PID 1 the guardian inherits every orphan in the pod, and reaps it while
/// the daemon runs (not only after the daemon exits): a zombie would hold its pid for good.
#[test]
fn the_guardian_reaps_orphans_while_the_daemon_runs() {
    let c = boot();
    let p = pods(&c);
    let n = CONTROL_PLANE[0];
    let init = p.pid(n).expect("the pod's init");
    // An orphan in the pod's pid namespace: `sh` starts `sleep` and exits, so the kernel gives
    // `sleep` to the namespace's init; it exits a second later.
    let out = std::process::Command::new("nsenter")
        .args([
            "-t",
            &init.to_string(),
            "-p",
            "--",
            "sh",
            "-c",
            "sleep 1 & exit 0",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let zombies = || -> Vec<u32> {
        children(init)
            .into_iter()
            .filter(|c| {
                std::fs::read_to_string(format!("/proc/{c}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')')
                            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                    })
                    .unwrap_or(false)
            })
            .collect()
    };
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(zombies(), Vec::<u32>::new(), "the orphan was reaped");
    assert!(c.lbctl(n, &["stats"]).is_some(), "the daemon still runs");
}

/// A crash of the daemon in the VIP owner's pod (the guardian, PID 1, stays until it has given
/// the VIP back) while long-lived connections go through it, to every node's backend: the
/// owner's node keeps forwarding or drops until a backup holds the VIP, and resets nothing.
#[test]
fn a_crash_of_the_daemon_in_the_owners_pod_resets_no_connection() {
    let c = boot();
    let p = pods(&c);
    let (api, _) = elected(&c);
    let hold = labnode(&c, &["hold-ids", API_VIP, ECHO_PORT, "90", "10", "100"]);
    std::thread::sleep(Duration::from_millis(2000));
    let init = p.pid(&api).unwrap();
    let daemon = *children(init)
        .first()
        .unwrap_or_else(|| panic!("the daemon runs under the guardian\n{}", p.logs(&api)));
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    let held = json_of(hold);
    let on: std::collections::BTreeSet<&String> = held["survived_by_id"]
        .as_object()
        .into_iter()
        .chain(held["failed_by_id"].as_object())
        .flat_map(|m| m.keys())
        .collect();
    assert!(on.len() > 1, "connections on several backends: {held}");
    assert_eq!(
        (
            sum_counts(&held["survived_by_id"]),
            sum_counts(&held["failed_by_id"])
        ),
        (90, 0),
        "connections across a crash of the daemon in the owner's pod ({api}): {held}\n{}",
        events(&c)
    );
}

/// The shipped image gate (deploy/lb-image-gate.sh, what the MachineConfig installs as
/// /usr/local/bin/lb-image-gate) run against `node`'s pod, as its unit runs it after the
/// machine-config daemon wrote the static pod: (success, stdout + stderr).
fn gate(c: &Cluster, node: &str, timeout_s: u64) -> (bool, String) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/lb-image-gate.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env("LB_GATE_MANIFEST", pods(c).manifest_path(node))
        .env("LB_GATE_SOCKET", c.run_dir(node).join("lbd.sock"))
        .env("LB_GATE_TIMEOUT_S", timeout_s.to_string())
        .env("LB_GATE_INTERVAL_S", "1")
        .output()
        .expect("run the image gate");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A pool's rollout of a new lb image, node by node as the machine-config operator does it
/// with the rendered NodeDisruptionPolicy: the pod replaced (the kubelet), then the gate's
/// unit restarted; a failed gate fails the node's update and the rollout stops there. A good
/// image passes the gate; an image that does not start fails it on the first node (here the
/// API owner, the worst node to lose), and the other nodes keep their lbd and both VIPs.
#[test]
fn a_broken_image_stops_the_rollout_at_its_first_node_and_the_others_keep_the_vips() {
    let mut c = boot();
    let (api, _) = elected(&c);
    let good = pods(&c).image();
    let role = lb_tests::pods::Role::ControlPlane;
    // The rollout of a good image (the same one, the pod replaced) passes the gate, on a node
    // that is not the owner; and an lbd older than the manifest does not count.
    let first = *CONTROL_PLANE.iter().find(|n| **n != api).unwrap();
    let (etc, run) = (c.config_dir(first), c.run_dir(first));
    std::thread::sleep(Duration::from_millis(1100));
    let Runner::Pod(p) = &mut c.runner else {
        unreachable!()
    };
    let out = p.replace(&c.lab, first, role, &etc, &run, &good);
    assert!(
        out.status.success(),
        "replace {first}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, log) = gate(&c, first, 90);
    assert!(ok, "the gate passes a good image on {first}: {log}");
    assert!(log.contains("lbd ready"), "{log}");
    elected(&c);

    // A broken image, on the API owner first.
    let broken = {
        let Runner::Pod(p) = &mut c.runner else {
            unreachable!()
        };
        p.broken_image()
    };
    let (etc, run) = (c.config_dir(&api), c.run_dir(&api));
    let Runner::Pod(p) = &mut c.runner else {
        unreachable!()
    };
    let out = p.replace(&c.lab, &api, role, &etc, &run, &broken);
    println!(
        "kube play --replace with the broken image on {api}: {:?} {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let (ok, log) = gate(&c, &api, 20);
    assert!(!ok, "the gate fails a broken image on {api}: {log}");
    assert!(log.contains("no ready lbd"), "{log}");
    // The rollout stops (the node's update failed); the others keep lbd and the VIPs.
    let others: Vec<&str> = CONTROL_PLANE
        .iter()
        .copied()
        .filter(|n| *n != api)
        .collect();
    for n in &others {
        let ready = c
            .lbctl(n, &["stats"])
            .map(|v| v["ready"] == true)
            .unwrap_or(false);
        assert!(ready, "{n} still runs a ready lbd");
    }
    for instance in ["api", "ingress"] {
        let m = c.wait_master(instance, &others, Duration::from_secs(20));
        assert!(
            m.is_some(),
            "one of {others:?} holds the {instance} VIP after {api}'s image broke"
        );
    }
    let v = c.get_many(&format!("{API_VIP}:6443"), true, 50);
    assert_eq!(
        v["ok"], 50,
        "the API VIP serves after the broken rollout step: {v}"
    );
}
