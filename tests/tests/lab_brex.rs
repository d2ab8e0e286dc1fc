//! lbd on OVN-Kubernetes' node networking: each node's address, and so the VIP, on an Open
//! vSwitch bridge `br-ex` whose port is the uplink `eth0`, with the shared-gateway flows for
//! host traffic (conntrack zone 64000, see `lb_tests::brex`). Needs root and Open vSwitch's
//! datapath (the `openvswitch` module): the lab kernel has none, so the test is ignored there
//! and the kernel matrix runs it in Debian's 6.1 (xtask/src/vm.rs, `GUEST_TESTS`).
//!
//! The attach choices: n1 attaches the XDP program below br-ex, natively on its uplink
//! (`xdp_interfaces = ["eth0"]`, driver mode); in the first lab n2 attaches on br-ex itself
//! (generic mode, its frames sent back go through br-ex's flows), in the second n2's br-ex port
//! is a bond of two links (active-backup, `lb_tests::brex::make_bond`) and the program is on
//! the bond (`xdp_interfaces = ["bond0"]`: the bonding driver puts it on both members and sends
//! its XDP_TX out of the active one). Waits scale with `LB_TIME_SCALE` (software emulation in
//! the VM); the assertions do not.

use std::time::Duration;

use lb_tests::{
    TestDataplane,
    brex::{self, scaled},
    vrrp_lab::{NodeOpts, PORT, VrrpLab},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

/// `labnode connect-many ADDR PORT COUNT 2 <2 s, scaled>` from the client: (ok, answering
/// ids).
fn connect_many(l: &VrrpLab, addr: &str, count: u32) -> (u64, Vec<String>) {
    let out = l.lab.run(
        "client",
        LABNODE,
        &[
            "connect-many",
            addr,
            PORT,
            &count.to_string(),
            "2",
            &(2000 * brex::time_scale()).to_string(),
        ],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let ids = v["by_id"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    (v["ok"].as_u64().unwrap_or(0), ids)
}

/// The veths' XDP counters (`ethtool -S`) and the nodes' TCP receive errors (`nstat`), for
/// failure messages: where forwarded frames went.
fn counters(l: &VrrpLab) -> String {
    let switch = format!("{}-sw", l.lab.prefix);
    let mut out = String::new();
    for (ns, dev) in [
        (l.lab.node("n1").netns.clone(), "eth0"),
        (switch.clone(), "n1"),
        (switch.clone(), "n2"),
        (l.lab.node("n2").netns.clone(), "eth0"),
        (switch.clone(), "n2b"),
        (l.lab.node("n2").netns.clone(), "eth1"),
    ] {
        let o = lb_tests::lab::try_sh(&["ip", "netns", "exec", &ns, "ethtool", "-S", dev]);
        out += &format!(
            "---- ethtool -S {dev} in {ns} ----\n{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    for n in ["n1", "n2"] {
        let ns = l.lab.node(n).netns.clone();
        let o = lb_tests::lab::try_sh(&["ip", "netns", "exec", &ns, "nstat", "-az", "Tcp*", "Ip*"]);
        out += &format!(
            "---- nstat in {n} ----\n{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    out
}

fn flows(l: &VrrpLab) -> String {
    l.nodes
        .iter()
        .map(|n| format!("---- br-ex of {n} ----\n{}", brex::dump_flows(&l.lab, n)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Start `hold-ids` from the client: eight connections through the VIP held for `secs`
/// (scaled), a line echoed every 200 ms.
fn hold(l: &mut VrrpLab, secs: u32) {
    let secs = (secs * brex::time_scale()).to_string();
    l.lab.spawn(
        "client",
        "hold",
        LABNODE,
        &["hold-ids", l.vip, PORT, "8", &secs, "200", "20"],
    );
}

/// `hold-ids`'s result once it ends (waits for it): the connections that survived, and its
/// JSON.
fn held(l: &mut VrrpLab) -> (u64, Value) {
    assert!(
        l.lab
            .wait("hold", scaled(Duration::from_secs(90)))
            .is_some(),
        "hold-ids finished"
    );
    let v: Value = l
        .lab
        .log("hold")
        .lines()
        .rev()
        .find_map(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null);
    let survived = v["survived_by_id"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    (survived, v)
}

/// Whether XDP is attached to `dev` in node `node` (`ip -j link`'s `xdp` object).
fn has_xdp(l: &VrrpLab, node: &str, dev: &str) -> bool {
    let link = lb_tests::lab::sh(&[
        "ip",
        "-n",
        &l.lab.node(node).netns,
        "-j",
        "link",
        "show",
        dev,
    ]);
    String::from_utf8_lossy(&link.stdout).contains("\"xdp\"")
}

/// Two lbd nodes on br-ex and a client, both lbds running and n1 (priority 150) master with the
/// VIP answering. `below[i]`: node i's attach device below br-ex (driver mode), or None for
/// br-ex itself (generic); with `bond`, n2's br-ex port is a bond ([`brex::make_bond`]).
/// Returns the lab and the switch-side `lb_pass` programs (kept attached while it lives).
fn start(below: [Option<&str>; 2], bond: bool) -> (VrrpLab, TestDataplane) {
    if let Err(why) = brex::available() {
        panic!("{why}: this lab needs Open vSwitch's datapath (run it in the kernel matrix)");
    }
    let node = |priority| NodeOpts {
        priority,
        // Loading the socket hooks too only lengthens start-up under emulation.
        top: "socket_lb = false\n".into(),
        // Adverts every second (keepalived's `advert_int 1`, as OpenShift runs it): at lbd's
        // default 100 ms the master's real-time VRRP thread and its adverts crowd out its API
        // under emulation (lbctl read no state from n1 while it was master).
        advert_ms: 1000,
        ..Default::default()
    };
    let mut l = VrrpLab::prepare(LABNODE, vec![node(150), node(100)]);
    l.vip_dev = "br-ex".into();
    if bond {
        brex::make_bond(&l.lab, "n2");
    }
    brex::make_br_ex(&mut l.lab, "n1");
    brex::make_br_ex_on(&mut l.lab, "n2", if bond { brex::BOND } else { "eth0" });
    // A native XDP_TX on a veth reaches its peer only if the peer runs an XDP program (a NIC
    // sends it to the wire): lb_pass on the switch-side peers of the native attaches' links.
    let switch = format!("{}-sw", l.lab.prefix);
    let mut peers = vec!["n1"];
    if below[1].is_some() {
        peers.push("n2");
        if bond {
            peers.push("n2b");
        }
    }
    let pass = lb_tests::attach_pass(&switch, &peers);
    // The client's frames carry whole checksums, as frames from a wire do.
    let client_ns = l.lab.node("client").netns.clone();
    lb_tests::lab::sh(&[
        "ip", "netns", "exec", &client_ns, "ethtool", "-K", "eth0", "tx", "off",
    ]);
    for (i, dev) in below.iter().enumerate() {
        l.write_config(i);
        if let Some(dev) = dev {
            let native = l.config(i).replace(
                "xdp_mode = \"skb\"\n",
                &format!("xdp_mode = \"driver\"\nxdp_interfaces = [\"{dev}\"]\n"),
            );
            assert!(native.contains("xdp_interfaces"));
            std::fs::write(l.config_path(i), native).unwrap();
        }
    }
    l.start(0);
    l.start(1);
    // The waits below start once both lbds run: under software emulation loading the data
    // plane takes minutes, by the load on the host.
    assert!(
        lb_tests::lab::wait_for(scaled(Duration::from_secs(60)), || (0..2)
            .all(|i| l.log(i).contains("lbd running"))
            .then_some(()))
        .is_some(),
        "both lbds running\n{}",
        l.logs()
    );
    let m = l.wait_one_master(&[0, 1], scaled(Duration::from_secs(15)));
    assert_eq!(
        m,
        Some(0),
        "n1 is master: states {:?}, VIP on br-ex of {:?}, status {:?}\n{}",
        [l.state(0), l.state(1)],
        l.holders(&[0, 1]),
        l.status(0),
        l.logs()
    );
    assert!(
        l.wait_serving(scaled(Duration::from_secs(10))),
        "the VIP answers\n{}\n{}",
        l.logs(),
        flows(&l)
    );
    (l, pass)
}

#[test]
#[ignore = "needs Open vSwitch's datapath (the openvswitch module), which the lab kernel lacks: cargo xtask test's kernel matrix runs it in Debian's kernel (--include-ignored, docs/kernels.md)"]
fn on_br_ex_lbd_fails_over_forwards_dsr_keeps_connections_and_host_traffic() {
    let (mut l, _pass) = start([Some("eth0"), None], false);
    // The program is on n1's uplink, not on br-ex: lbd attached where the config says.
    assert!(has_xdp(&l, "n1", "eth0"), "XDP (driver mode) on n1's eth0");

    // Host traffic: the nodes' own addresses answer through br-ex's conntrack flows (OVS
    // prints the flow's match as `ct_state=+est+trk`).
    for n in ["n1", "n2"] {
        let addr = l.addr(n);
        let (ok, ids) = connect_many(&l, &addr, 10);
        assert_eq!((ok, ids), (10, vec![n.to_string()]), "host traffic to {n}");
    }
    assert!(
        brex::flow_packets(&l.lab, "n1", "ct_state=+est+trk") > 0,
        "host traffic took the established-connection flow\n{}",
        flows(&l)
    );
    // DSR from the native attach: connections through the VIP reach both nodes' backends.
    let (ok, ids) = connect_many(&l, l.vip, 40);
    assert_eq!(
        ok,
        40,
        "every connection through n1 answered\n{}\n{}",
        l.logs(),
        counters(&l)
    );
    assert_eq!(ids, vec!["n1", "n2"], "DSR to the other node too");

    // The VIP moves (n1's lbd stops) while connections are open: they survive, and n2, in
    // generic mode on br-ex, forwards through br-ex's flows.
    hold(&mut l, 6);
    std::thread::sleep(scaled(Duration::from_secs(2)));
    l.stop(0, libc::SIGTERM);
    let m = l.wait_one_master(&[1], scaled(Duration::from_secs(15)));
    assert_eq!(m, Some(1), "n2 took over\n{}", l.logs());
    let (survived, held) = held(&mut l);
    assert_eq!(
        survived,
        8,
        "every open connection survived the VIP's move: {held}\n{}\n{}\n{}",
        l.logs(),
        flows(&l),
        counters(&l)
    );
    let (ok, ids) = connect_many(&l, l.vip, 40);
    assert_eq!(
        ok,
        40,
        "every connection through n2 (generic, br-ex) answered\n{}\n{}\n{}",
        l.logs(),
        flows(&l),
        counters(&l)
    );
    assert_eq!(ids, vec!["n1", "n2"], "DSR to the other node from br-ex");
    assert!(
        brex::flow_packets(&l.lab, "n2", "in_port=LOCAL") > 0,
        "n2's forwarded frames went through br-ex's flows"
    );
}

#[test]
#[ignore = "needs Open vSwitch's datapath (the openvswitch module), which the lab kernel lacks: cargo xtask test's kernel matrix runs it in Debian's kernel (--include-ignored, docs/kernels.md)"]
fn on_a_bond_under_br_ex_lbd_takes_the_vip_forwards_dsr_and_keeps_connections_through_a_member_loss()
 {
    let (mut l, _pass) = start([Some("eth0"), Some(brex::BOND)], true);
    let switch = format!("{}-sw", l.lab.prefix);
    // The program is on n2's bond, not on br-ex. (The bonding driver puts it on the members
    // without recording it there: `ip link` shows it on the bond only; the members' XDP
    // counters below show it running there.)
    assert!(
        has_xdp(&l, "n2", brex::BOND),
        "XDP (driver mode) on n2's bond"
    );
    assert!(!has_xdp(&l, "n2", "br-ex"), "no XDP on n2's br-ex");
    // Host traffic to the bond node, through br-ex's conntrack flows.
    let addr = l.addr("n2");
    let (ok, ids) = connect_many(&l, &addr, 10);
    assert_eq!(
        (ok, ids),
        (10, vec!["n2".to_string()]),
        "host traffic to n2"
    );
    assert!(
        brex::flow_packets(&l.lab, "n2", "ct_state=+est+trk") > 0,
        "host traffic to n2 took the established-connection flow\n{}",
        flows(&l)
    );

    // While connections are open, the bond's active member loses its link (its switch-side
    // end goes down: the connections n2's backend serves come in through the other member),
    // then the VIP moves onto the bond node (n1's lbd stops): they survive both, and new ones
    // go through the other member. (Member first: n2's failover under emulation can outlast
    // the hold, its member's never.)
    hold(&mut l, 8);
    std::thread::sleep(scaled(Duration::from_secs(2)));
    assert_eq!(brex::active_member(&l.lab, "n2").as_deref(), Some("eth0"));
    lb_tests::lab::sh(&["ip", "-n", &switch, "link", "set", "n2", "down"]);
    assert!(
        lb_tests::lab::wait_for(scaled(Duration::from_secs(5)), || {
            (brex::active_member(&l.lab, "n2").as_deref() == Some("eth1")).then_some(())
        })
        .is_some(),
        "the bond fails over to eth1"
    );
    assert!(
        !l.lab.log("hold").contains("survived_by_id"),
        "the held connections were still open when the member went down"
    );
    l.stop(0, libc::SIGTERM);
    let m = l.wait_one_master(&[1], scaled(Duration::from_secs(15)));
    assert_eq!(m, Some(1), "n2 (the bond) took over\n{}", l.logs());
    let (survived, v) = held(&mut l);
    assert_eq!(
        survived,
        8,
        "every open connection survived the VIP's move onto the bond and its member's loss: {v}\n{}\n{}",
        l.logs(),
        counters(&l)
    );
    // DSR from the bond, through its other member, to both nodes' backends.
    let (ok, ids) = connect_many(&l, l.vip, 40);
    assert_eq!(
        ok,
        40,
        "every connection through n2's bond (eth1) answered\n{}\n{}",
        l.logs(),
        counters(&l)
    );
    assert_eq!(
        ids,
        vec!["n1", "n2"],
        "DSR from the bond to the other node too"
    );
    // The program ran on the member, and what it forwarded left through it (the bond turns an
    // XDP_TX into a send out of its active member: here the receiving one).
    assert!(
        xdp_tx(&l, "n2", "eth1") > 0,
        "frames forwarded with XDP_TX on eth1\n{}",
        counters(&l)
    );
}

/// The XDP_TX count of veth `dev` in node `node` (`ethtool -S`: `rx_queue_0_xdp_tx`).
fn xdp_tx(l: &VrrpLab, node: &str, dev: &str) -> u64 {
    let ns = l.lab.node(node).netns.clone();
    let o = lb_tests::lab::try_sh(&["ip", "netns", "exec", &ns, "ethtool", "-S", dev]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("rx_queue_0_xdp_tx: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
