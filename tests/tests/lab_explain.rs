//! `lbctl explain` through a real lbd (the DSR lab: static VIPs web4/web6, backends b1, b2, b3):
//! its answer for a 5-tuple is checked against where a real connection of that 5-tuple went
//! (a new flow, an established one, one whose slot's backend is drained), it names the MAC the
//! frame leaves with, a VIP this node does not own or an address that is no VIP is passed, and
//! asking writes nothing: no connection-table entry, no counter. Needs root; `cargo xtask test`.

use std::time::Duration;

use lb_tests::{
    dsr::{DsrLab, PORT, VIP4, VIP6, setup},
    lab::wait_for,
    lbctl_output,
};
use lb_userspace::status::{BackendRow, ExplainRow, FlowsRow, StatsRow, VipRow};

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

use lb_tests::lbctl::lbctl_typed as json;

fn explain(l: &DsrLab, client: &str, sport: u16, vip: &str, extra: &[&str]) -> ExplainRow {
    let c = format!("{client}:{sport}");
    let v = format!("{vip}:{PORT}");
    let mut a = vec!["explain", c.as_str(), v.as_str()];
    a.extend_from_slice(extra);
    json(&l.socket, &a)
}

/// A real connection from `sport`: the id of the backend that answered.
fn connect_from(l: &DsrLab, vip: &str, sport: u16) -> String {
    let out = l.lab.run(
        "client",
        LABNODE,
        &["connect-from", vip, PORT, &sport.to_string(), "3000"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("connection from {sport}: {v}"))
        .to_string()
}

/// What a dry run must not change: the data plane's forwarding counters, the web4 pairs'
/// traffic, and the connection table's entries of the lab's client.
#[derive(Debug, PartialEq)]
struct Written {
    counters: Vec<(String, u64)>,
    pairs: Vec<(String, u64, u64)>,
    entries: usize,
}

fn written(l: &DsrLab, client: &str) -> Written {
    let stats: StatsRow = json(&l.socket, &["stats"]);
    // Counters client traffic moves (the lab's health checks and neighbour traffic only add to
    // the `pass_not_vip` ones).
    let counters = stats
        .counters
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("conntrack")
                || k.starts_with("verdict_tx")
                || k.starts_with("verdict_redirect")
                || k.contains("forwarded")
                || k.contains("flood")
                || k == "pass_not_owner"
        })
        .collect();
    let rows: Vec<BackendRow> = json(&l.socket, &["backends", "list"]);
    let pairs = rows
        .iter()
        .map(|r| (r.backend.to_string(), r.packets, r.new_flows))
        .collect();
    let flows: FlowsRow = json(
        &l.socket,
        &["flows", VIP4, "--client", client, "--limit", "10000"],
    );
    Written {
        counters,
        pairs,
        entries: flows.flows.len(),
    }
}

#[test]
fn explain_matches_real_forwarding_and_writes_nothing() {
    let l = setup(LABNODE);
    let client = l.lab.node("client").v4.clone();
    let name_of = |addr: &str| -> String {
        ["b1", "b2", "b3"]
            .into_iter()
            .find(|n| l.lab.node(n).v4 == addr || l.lab.node(n).v6 == addr)
            .unwrap_or_else(|| panic!("{addr}: not a backend"))
            .to_string()
    };
    let macs: Vec<BackendRow> = json(&l.socket, &["backends", "list", "web4"]);

    // A new flow: where explain says its SYN goes, before any packet of it.
    let before = written(&l, &client);
    let new = explain(&l, &client, 41001, VIP4, &[]);
    assert!(matches!(new.verdict.as_str(), "tx" | "redirect"), "{new:?}");
    assert_eq!(new.reason, "forwarded", "{new:?}");
    assert_eq!(new.conntrack.as_deref(), Some("conntrack_miss"), "{new:?}");
    assert_eq!(new.vip_name.as_deref(), Some("web4"));
    assert!(
        new.owned && new.entry.is_none() && new.would_remember,
        "{new:?}"
    );
    assert!(new.slot.is_some() && !new.skipped, "{new:?}");
    assert_eq!(new.slot_backend, new.backend, "{new:?}");
    let predicted = new.backend.expect("a backend").to_string();
    // The frame leaves with the backend's MAC.
    let mac = &macs
        .iter()
        .find(|r| r.backend.to_string() == predicted)
        .unwrap()
        .mac;
    assert_eq!(new.dst_mac.as_deref(), Some(mac.as_str()), "{new:?}");
    // Asking wrote nothing: no entry, no counter, no pair traffic (asked twice more to be sure).
    explain(&l, &client, 41001, VIP4, &["--ack"]);
    explain(&l, &client, 41001, VIP4, &[]);
    assert_eq!(
        written(&l, &client),
        before,
        "explain wrote to the data plane"
    );

    // The real connection of that 5-tuple went there.
    assert_eq!(connect_from(&l, VIP4, 41001), name_of(&predicted));
    let after = written(&l, &client);
    assert_ne!(
        after, before,
        "the real connection is seen where the dry run was not"
    );
    assert!(after.entries > before.entries);

    // Established: its entry is found and followed, to the backend that served it.
    let est = explain(&l, &client, 41001, VIP4, &["--ack"]);
    assert!(
        est.entry.is_some() && est.entry_current && est.entry_used,
        "{est:?}"
    );
    assert_eq!(est.backend.map(|b| b.to_string()), Some(predicted.clone()));
    assert_eq!(est.conntrack.as_deref(), Some("conntrack_hit"), "{est:?}");
    assert!(!est.would_remember);

    // Drain the backend of a fresh flow's slot: explain says the SYN skips it, and a real
    // connection of that 5-tuple goes where explain says.
    let (sport, x) = (42000u16..42200)
        .map(|p| (p, explain(&l, &client, p, VIP4, &[])))
        .find(|(_, r)| r.backend.map(|b| b.to_string()) == Some(predicted.clone()))
        .map(|(p, r)| (p, r.backend.unwrap().to_string()))
        .expect("a port whose slot names the first backend");
    let out = lbctl_output(&l.socket, &["backends", "drain", "web4", &x]);
    assert!(out.status.success(), "{out:?}");
    let drained = wait_for(Duration::from_secs(10), || {
        let r = explain(&l, &client, sport, VIP4, &[]);
        r.skipped.then_some(r)
    })
    .expect("the drained backend is skipped by a new flow");
    assert_eq!(drained.slot_backend.map(|b| b.to_string()), Some(x.clone()));
    let y = drained.backend.expect("another backend").to_string();
    assert_ne!(y, x, "{drained:?}");
    assert!(
        drained
            .skip_reason
            .as_deref()
            .unwrap_or("")
            .contains("drain"),
        "{drained:?}"
    );
    // A segment of a connection already open without an entry stays on the slot's backend.
    let mid = explain(&l, &client, sport, VIP4, &["--ack"]);
    assert_eq!(
        mid.backend.map(|b| b.to_string()),
        Some(x.clone()),
        "{mid:?}"
    );
    assert!(!mid.skipped, "{mid:?}");
    // The established flow stays on its (now drained) backend.
    let est = explain(&l, &client, 41001, VIP4, &["--ack"]);
    assert_eq!(
        est.backend.map(|b| b.to_string()),
        Some(x.clone()),
        "{est:?}"
    );
    assert_eq!(connect_from(&l, VIP4, sport), name_of(&y));

    // An address that is no VIP service, and a port the VIP does not serve: passed.
    let none = explain(&l, &client, 41003, "10.77.0.200", &[]);
    assert_eq!(
        (none.verdict.as_str(), none.reason.as_str()),
        ("pass", "pass_not_vip")
    );
    let c = format!("{client}:41003");
    let other_port: ExplainRow = json(&l.socket, &["explain", &c, &format!("{VIP4}:9999")]);
    assert_eq!(other_port.reason, "pass_not_vip", "{other_port:?}");

    // Usage errors exit 2; a refused question (an address family mix) exits 1.
    let out = lbctl_output(&l.socket, &["explain", "10.77.0.1", "10.77.0.100:8080"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = lbctl_output(&l.socket, &["explain", "10.77.0.1:1", "[fd77::100]:8080"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The table shows the steps.
    let out = lbctl_output(&l.socket, &["explain", &c, &format!("{VIP4}:{PORT}")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Maglev slot") && text.contains("BACKEND"),
        "{text}"
    );

    // A VIP this node does not own (web6, made not owned by a reload): passed to the stack.
    let cfg = l.lab.dir.join("lbd.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let web6 = format!("name = \"web6\"\naddress = \"{VIP6}\"\nports = [{PORT}]\nowned = true");
    assert!(text.contains(&web6), "{text}");
    std::fs::write(
        &cfg,
        text.replace(&web6, &web6.replace("owned = true", "owned = false")),
    )
    .unwrap();
    let out = lbctl_output(&l.socket, &["reload"]);
    assert!(out.status.success(), "{out:?}");
    wait_for(Duration::from_secs(10), || {
        let vips: Vec<VipRow> = json(&l.socket, &["vips", "list"]);
        vips.iter()
            .any(|v| v.name == "web6" && !v.owned)
            .then_some(())
    })
    .expect("web6 not owned after the reload");
    let client6 = l.lab.node("client").v6.clone();
    let c6 = format!("[{client6}]:41004");
    let v6 = format!("[{VIP6}]:{PORT}");
    let not_owned: ExplainRow = json(&l.socket, &["explain", &c6, &v6]);
    assert_eq!(
        (not_owned.verdict.as_str(), not_owned.reason.as_str()),
        ("pass", "pass_not_owner"),
        "{not_owned:?}"
    );
    assert_eq!(not_owned.vip_name.as_deref(), Some("web6"));
    assert!(
        !not_owned.owned && not_owned.backend.is_none(),
        "{not_owned:?}"
    );
}

/// `lbctl trace`: while a trace runs, the decisions for the lab's connections are shown, with
/// their reason and the backend each went to; a trace of another VIP leaves them out.
#[test]
fn trace_shows_the_decisions_for_the_lab_traffic() {
    use lb_userspace::status::TracesRow;
    let l = setup(LABNODE);
    let client = l.lab.node("client").v4.clone();
    let backends: Vec<String> = ["b1", "b2", "b3"]
        .iter()
        .map(|n| l.lab.node(n).v4.clone())
        .collect();
    let trace = |args: &[&str]| {
        let mut a = vec!["--socket", l.socket.as_str(), "-o", "json", "trace"];
        a.extend_from_slice(args);
        std::process::Command::new(lb_tests::bin_dir().join("lbctl"))
            .args(&a)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = trace(&["web4", "--count", "30", "--wait", "30s"]);
    // Traffic until the trace has its 30 decisions (it is attached some time after it starts).
    for _ in 0..100 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        let r = l.connect_many(LABNODE, VIP4, 10);
        assert_eq!(r["ok"], 10, "{r}");
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: TracesRow = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.decisions.len(), 30, "{r:?}");
    assert!(!r.timed_out);
    for d in &r.decisions {
        assert_eq!(d.client.to_string(), client, "{d:?}");
        assert_eq!((d.vip.to_string().as_str(), d.port), (VIP4, 8080), "{d:?}");
        assert_eq!(d.reason, "forwarded", "{d:?}");
        let b = d.backend.expect("a backend").to_string();
        assert!(backends.contains(&b), "{d:?}");
    }
    // A connection's first segment wrote its entry, the rest followed it.
    assert!(
        r.decisions
            .iter()
            .any(|d| d.conntrack.as_deref() == Some("conntrack_miss") && d.remembered)
    );
    assert!(
        r.decisions
            .iter()
            .any(|d| d.conntrack.as_deref() == Some("conntrack_hit") && d.entry_used)
    );

    // A trace of the other VIP: web4's traffic is read and left out.
    let child = trace(&["web6", "--count", "1", "--wait", "3s"]);
    let r = l.connect_many(LABNODE, VIP4, 10);
    assert_eq!(r["ok"], 10, "{r}");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: TracesRow = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r.decisions.is_empty() && r.timed_out, "{r:?}");
    // A bad count is refused by name.
    let out = lbctl_output(&l.socket, &["trace", "--count", "0"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("count"),
        "{out:?}"
    );
}
