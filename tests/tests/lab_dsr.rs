//! End to end in network namespaces: a client, an LB node running lbd (XDP, L2 DSR) and three
//! backends that hold the VIP without answering ARP/ND for it. Needs root; `cargo xtask test`.

use std::collections::BTreeMap;

use lb_tests::{
    dsr::{VIP4, VIP6, setup},
    lab::Lab,
};
use serde_json::Value;

const CONNECTIONS: u64 = 2000;
const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

/// Connections per backend within 15 % of its weight share.
fn assert_weighted(by_id: &Value, total: u64) {
    let by_id: BTreeMap<String, u64> = serde_json::from_value(by_id.clone()).unwrap();
    for (id, weight) in [("b1", 1.0), ("b2", 1.0), ("b3", 2.0)] {
        let want = total as f64 * weight / 4.0;
        let got = *by_id.get(id).unwrap_or(&0) as f64;
        assert!(
            (got - want).abs() / want <= 0.15,
            "{id}: {got} connections, want {want} +-15% ({by_id:?})"
        );
    }
}

fn arp_responders(lab: &Lab) -> Vec<String> {
    let out = lab.run(
        "client",
        "arping",
        &["-c", "3", "-w", "3", "-I", "eth0", VIP4],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let mut macs: Vec<String> = text
        .lines()
        .filter_map(|l| l.split('[').nth(1)?.split(']').next().map(str::to_string))
        .collect();
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
        .filter_map(|l| {
            l.split(':')
                .skip(1)
                .collect::<Vec<_>>()
                .join(":")
                .trim()
                .to_string()
                .into()
        })
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

#[test]
fn dsr_lab_ipv4_and_ipv6() {
    let l = setup(LABNODE);
    let lb_mac = l.lab.node("lb").mac.to_lowercase();

    // Only the LB node answers ARP / ND for the VIP; the backends hold it silently.
    assert_eq!(
        arp_responders(&l.lab),
        vec![lb_mac.clone()],
        "ARP responders for {VIP4}"
    );
    assert_eq!(
        nd_responders(&l.lab),
        vec![lb_mac.clone()],
        "ND responders for {VIP6}"
    );

    for vip in [VIP4, VIP6] {
        let (lb_rx0, _) = l.lab.counters("lb");
        let (_, client_tx0) = l.lab.counters("client");
        let backends_tx0: u64 = ["b1", "b2", "b3"].iter().map(|n| l.lab.counters(n).1).sum();

        let r = l.connect_many(LABNODE, vip, CONNECTIONS);
        assert_eq!(
            r["ok"], CONNECTIONS,
            "{vip}: every connection completes: {r}"
        );
        assert_weighted(&r["by_id"], CONNECTIONS);

        // Direct server return: the LB node received (about) what the client sent, not the
        // replies, which went from the backends straight to the client.
        let (lb_rx1, _) = l.lab.counters("lb");
        let (_, client_tx1) = l.lab.counters("client");
        let backends_tx1: u64 = ["b1", "b2", "b3"].iter().map(|n| l.lab.counters(n).1).sum();
        let (lb_rx, client_tx, backends_tx) = (
            lb_rx1 - lb_rx0,
            client_tx1 - client_tx0,
            backends_tx1 - backends_tx0,
        );
        assert!(
            backends_tx >= 2 * CONNECTIONS,
            "{vip}: backends sent {backends_tx} packets"
        );
        assert!(
            lb_rx <= client_tx + 50,
            "{vip}: the LB node received {lb_rx} packets but the client sent only {client_tx}: replies passed through it"
        );
    }

    // lbctl backends list -o json: the documented fields, traffic counted per backend.
    let rows = l.backends().unwrap();
    for r in &rows {
        for field in [
            "vip", "port", "protocol", "backend", "mac", "weight", "state", "packets", "bytes",
        ] {
            assert!(r.get(field).is_some(), "field {field} missing in {r}");
        }
        assert!(r["packets"].as_u64().unwrap() > 0, "{r}");
    }
    let stats = l.lbctl(&["stats"]).unwrap();
    assert!(stats["counters"]["forwarded"].as_u64().unwrap() >= 2 * CONNECTIONS * 3);
}

/// A plain HTTP/1.0 GET on the node's loopback; returns (status, body).
fn http_get(lab: &Lab, node: &str, path: &'static str) -> (u16, String) {
    lab.in_netns(node, move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect("127.0.0.1:9444").expect("metrics listener");
        write!(s, "GET {path} HTTP/1.0\r\nHost: lbd\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    })
}

#[test]
fn api_socket_metrics_and_probes() {
    let l = setup(LABNODE);
    // The API socket is private to root.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&l.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "API socket mode");

    let r = l.connect_many(LABNODE, VIP4, 200);
    assert_eq!(r["ok"], 200, "{r}");

    // The TCP listener serves probes and Prometheus metrics, nothing else.
    assert_eq!(http_get(&l.lab, "lb", "/healthz").0, 200);
    assert_eq!(http_get(&l.lab, "lb", "/readyz").0, 200);
    assert_eq!(
        http_get(&l.lab, "lb", "/v1/backends").0,
        404,
        "the full API is only on the unix socket"
    );
    let (status, metrics) = http_get(&l.lab, "lb", "/metrics");
    assert_eq!(status, 200);
    for line in metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(
            line.starts_with("lbd_") || line.starts_with("process_"),
            "metric without the lbd_ prefix: {line}"
        );
    }
    let forwarded: u64 = metrics
        .lines()
        .find(|l| l.starts_with("lbd_xdp_packets_total{reason=\"forwarded\"}"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .expect("forwarded counter");
    assert!(forwarded >= 200 * 3, "{forwarded}");
    let new_flows: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("lbd_backend_new_flows_total{vip=\"web4\""))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    // One new flow per connection (a retransmitted SYN would count again: allow a few).
    assert!(
        (200..=210).contains(&new_flows),
        "new flows counted per backend: {new_flows}"
    );
    assert!(
        metrics.contains("lbd_backend_up{vip=\"web6\""),
        "per-backend health for every VIP"
    );

    // lbctl vips list: both services owned, all backends active.
    let vips = l.lbctl(&["vips", "list"]).unwrap();
    let vips = vips.as_array().unwrap();
    assert_eq!(vips.len(), 2);
    for v in vips {
        assert_eq!(v["owned"], true, "{v}");
        assert_eq!(v["backends_active"], 3, "{v}");
    }
}
