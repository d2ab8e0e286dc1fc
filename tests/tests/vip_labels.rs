//! The labels of the VIPs lbd adds, read back as OVN-Kubernetes reads a node's addresses: it
//! skips addresses whose label ends in `vip` (keepalived's VIPs carry such labels) when it picks
//! the node's gateway address and host CIDRs, so a VIP on br-ex or lo must never be taken for
//! one. lbd still tells its own from the node's and from keepalived's.
use std::net::IpAddr;

use lb_tests::lab::{Lab, sh};
use lb_userspace::net::{self, addr};

/// (address, label) pairs.
type Labelled = Vec<(String, String)>;

/// The node's IPv4 addresses on `dev` as OVN-Kubernetes keeps them: (address, label), minus
/// those whose label ends in "vip".
fn node_addresses(netns: &str, dev: &str) -> (Labelled, Labelled) {
    let out = sh(&["ip", "-n", netns, "-j", "-4", "addr", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all: Vec<(String, String)> = v[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["local"].as_str().unwrap().to_string(),
                a["label"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let kept = all
        .iter()
        .filter(|(_, label)| !label.ends_with("vip"))
        .cloned()
        .collect();
    (all, kept)
}

fn addrs(v: &[(String, String)]) -> Vec<&str> {
    v.iter().map(|(a, _)| a.as_str()).collect()
}

#[test]
fn vips_lbd_adds_are_skipped_by_ovn_kubernetes_and_still_recognised_by_lbd() {
    let mut lab = Lab::new("vl");
    lab.add_node("n1", "10.93.0.1", "fd93::1");
    let ns = lab.node("n1").netns.clone();
    // keepalived's VIP, as OpenShift's keepalived labels it, and a VIP an earlier lbd left.
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        "10.93.0.50/32",
        "dev",
        "eth0",
        "label",
        "eth0:vip",
    ]);
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        "10.93.0.60/32",
        "dev",
        "eth0",
        "label",
        "eth0:lb",
    ]);
    let vip: IpAddr = "10.93.0.100".parse().unwrap();
    let backend_vip: IpAddr = "10.93.0.200".parse().unwrap();
    lab.in_netns("n1", move || {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move {
                let nl = net::Netlink::new().unwrap();
                // A master's VIP on its interface, a DSR backend's copy on lo.
                addr::add_vip(nl.handle(), "eth0", vip).await.unwrap();
                net::ensure_local_vip(nl.handle(), backend_vip)
                    .await
                    .unwrap();
            })
    });
    let (all, kept) = node_addresses(&ns, "eth0");
    assert!(
        all.contains(&("10.93.0.100".into(), "eth0:lbvip".into())),
        "the VIP carries lbd's label: {all:?}"
    );
    assert_eq!(
        addrs(&kept),
        ["10.93.0.1", "10.93.0.60"],
        "OVN-Kubernetes' view of eth0: the node's address (and the old label's VIP), not lbd's VIP nor keepalived's: {all:?}"
    );
    let (all_lo, kept_lo) = node_addresses(&ns, "lo");
    assert!(
        all_lo.contains(&("10.93.0.200".into(), "lo:lbvip".into())),
        "{all_lo:?}"
    );
    assert_eq!(addrs(&kept_lo), ["127.0.0.1"], "{all_lo:?}");

    // lbd knows its own, today's label and the earlier one, and leaves keepalived's VIP and the
    // node's address alone.
    lab.in_netns("n1", move || {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move {
                let nl = net::Netlink::new().unwrap();
                let mut gone = addr::remove_orphans(nl.handle(), "eth0", &[])
                    .await
                    .unwrap();
                gone.sort();
                assert_eq!(
                    gone,
                    [
                        "10.93.0.60".parse::<IpAddr>().unwrap(),
                        "10.93.0.100".parse().unwrap()
                    ]
                );
                net::remove_local_vip(nl.handle(), backend_vip)
                    .await
                    .unwrap();
            })
    });
    let (all, _) = node_addresses(&ns, "eth0");
    assert_eq!(addrs(&all), ["10.93.0.1", "10.93.0.50"], "{all:?}");
    let (all_lo, _) = node_addresses(&ns, "lo");
    assert_eq!(addrs(&all_lo), ["127.0.0.1"], "{all_lo:?}");
}
