//! End to end in network namespaces: a client, an LB node running lbd (XDP, L2 DSR) and three
//! backends that hold the VIP without answering ARP/ND for it. Needs root; `cargo xtask test`.

use std::{collections::BTreeMap, time::Duration};

use lb_tests::{
    bin_dir,
    lab::{Lab, wait_for},
};
use serde_json::Value;

const VIP4: &str = "10.77.0.100";
const VIP6: &str = "fd77::100";
const PORT: &str = "8080";
const CONNECTIONS: u64 = 2000;

struct DsrLab {
    lab: Lab,
    socket: String,
}

fn config(lab: &Lab, name: &str, socket: &str) -> String {
    let b = |n: &str, v6: bool| if v6 { lab.node(n).v6.clone() } else { lab.node(n).v4.clone() };
    let mut c = format!(
        "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\n"
    );
    for (vname, vip, v6) in [("web4", VIP4, false), ("web6", VIP6, true)] {
        c += &format!(
            "\n[[vips]]\nname = \"{vname}\"\naddress = \"{vip}\"\nports = [{PORT}]\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n"
        );
        for (n, w) in [("b1", 1), ("b2", 1), ("b3", 2)] {
            c += &format!("[[vips.backends]]\naddress = \"{}\"\nweight = {w}\n", b(n, v6));
        }
    }
    c
}

fn setup() -> DsrLab {
    let mut lab = Lab::new("dsr");
    lab.add_node("client", "10.77.0.1", "fd77::1");
    lab.add_node("lb", "10.77.0.2", "fd77::2");
    for (i, n) in ["b1", "b2", "b3"].iter().enumerate() {
        lab.add_node(n, &format!("10.77.0.{}", 11 + i), &format!("fd77::{}", 11 + i));
        lab.make_dsr_backend(n, &[VIP4, VIP6]);
        let labnode = env!("CARGO_BIN_EXE_labnode");
        lab.spawn(n, &format!("server-{n}"), labnode, &["serve-id", PORT, n]);
    }
    // The LB node owns the VIPs (static ownership: no VRRP in this lab).
    lab.add_address("lb", VIP4);
    lab.add_address("lb", VIP6);

    let name = lab.prefix.replace('-', "_");
    let socket = lab.dir.join("lbd.sock").display().to_string();
    let cfg_path = lab.dir.join("lbd.toml");
    std::fs::write(&cfg_path, config(&lab, &name, &socket)).unwrap();
    lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(&name));
    let lbd = bin_dir().join("lbd");
    lab.spawn("lb", "lbd", &lbd, &["--config", cfg_path.to_str().unwrap()]);
    let l = DsrLab { lab, socket };
    // Ready when every backend of both VIPs is active (MAC resolved, health check passed).
    let ready = wait_for(Duration::from_secs(20), || {
        let rows = l.backends()?;
        (rows.len() == 6 && rows.iter().all(|r| r["state"] == "active")).then_some(())
    });
    if ready.is_none() {
        panic!("backends never became active: {:?}\nlbd log:\n{}", l.backends(), l.lab.log("lbd"));
    }
    l
}

impl DsrLab {
    fn lbctl(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["--socket", &self.socket, "-o", "json"];
        a.extend_from_slice(args);
        let out = std::process::Command::new(bin_dir().join("lbctl")).args(&a).output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn backends(&self) -> Option<Vec<Value>> {
        self.lbctl(&["backends", "list"])?.as_array().cloned()
    }

    fn connect_many(&self, vip: &str, count: u64) -> Value {
        let out = self.lab.run(
            "client",
            env!("CARGO_BIN_EXE_labnode"),
            &["connect-many", vip, PORT, &count.to_string(), "8", "3000"],
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// Connections per backend within 15 % of its weight share.
fn assert_weighted(by_id: &Value, total: u64) {
    let by_id: BTreeMap<String, u64> = serde_json::from_value(by_id.clone()).unwrap();
    for (id, weight) in [("b1", 1.0), ("b2", 1.0), ("b3", 2.0)] {
        let want = total as f64 * weight / 4.0;
        let got = *by_id.get(id).unwrap_or(&0) as f64;
        assert!((got - want).abs() / want <= 0.15, "{id}: {got} connections, want {want} +-15% ({by_id:?})");
    }
}

fn arp_responders(lab: &Lab) -> Vec<String> {
    let out = lab.run("client", "arping", &["-c", "3", "-w", "3", "-I", "eth0", VIP4]);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let mut macs: Vec<String> =
        text.lines().filter_map(|l| l.split('[').nth(1)?.split(']').next().map(str::to_string)).collect();
    macs.sort();
    macs.dedup();
    macs
}

fn nd_responders(lab: &Lab) -> Vec<String> {
    let out = lb_tests::lab::try_sh(&[
        "nsenter",
        &format!("--net=/run/netns/{}", lab.node("client").netns),
        "ndisc6",
        "-m",
        "-n",
        "-r",
        "3",
        "-w",
        "500",
        VIP6,
        "eth0",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let mut macs: Vec<String> = text
        .lines()
        .filter(|l| l.contains("target link-layer address"))
        .filter_map(|l| l.split(':').skip(1).collect::<Vec<_>>().join(":").trim().to_string().into())
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

#[test]
fn dsr_lab_ipv4_and_ipv6() {
    let l = setup();
    let lb_mac = l.lab.node("lb").mac.to_lowercase();

    // Only the LB node answers ARP / ND for the VIP; the backends hold it silently.
    assert_eq!(arp_responders(&l.lab), vec![lb_mac.clone()], "ARP responders for {VIP4}");
    assert_eq!(nd_responders(&l.lab), vec![lb_mac.clone()], "ND responders for {VIP6}");

    for vip in [VIP4, VIP6] {
        let (lb_rx0, _) = l.lab.counters("lb");
        let (_, client_tx0) = l.lab.counters("client");
        let backends_tx0: u64 = ["b1", "b2", "b3"].iter().map(|n| l.lab.counters(n).1).sum();

        let r = l.connect_many(vip, CONNECTIONS);
        assert_eq!(r["ok"], CONNECTIONS, "{vip}: every connection completes: {r}");
        assert_weighted(&r["by_id"], CONNECTIONS);

        // Direct server return: the LB node received (about) what the client sent, not the
        // replies, which went from the backends straight to the client.
        let (lb_rx1, _) = l.lab.counters("lb");
        let (_, client_tx1) = l.lab.counters("client");
        let backends_tx1: u64 = ["b1", "b2", "b3"].iter().map(|n| l.lab.counters(n).1).sum();
        let (lb_rx, client_tx, backends_tx) = (lb_rx1 - lb_rx0, client_tx1 - client_tx0, backends_tx1 - backends_tx0);
        assert!(backends_tx >= 2 * CONNECTIONS, "{vip}: backends sent {backends_tx} packets");
        assert!(
            lb_rx <= client_tx + 50,
            "{vip}: the LB node received {lb_rx} packets but the client sent only {client_tx}: replies passed through it"
        );
    }

    // lbctl backends list -o json: the documented fields, traffic counted per backend.
    let rows = l.backends().unwrap();
    for r in &rows {
        for field in ["vip", "port", "protocol", "backend", "mac", "weight", "state", "packets", "bytes"] {
            assert!(r.get(field).is_some(), "field {field} missing in {r}");
        }
        assert!(r["packets"].as_u64().unwrap() > 0, "{r}");
    }
    let stats = l.lbctl(&["stats"]).unwrap();
    assert!(stats["counters"]["forwarded"].as_u64().unwrap() >= 2 * CONNECTIONS * 3);
}
