//! lbd on OVN-Kubernetes' node networking: each node's address, and so the VIP, on an Open
//! vSwitch bridge `br-ex` whose port is the uplink `eth0`, with the shared-gateway flows for
//! host traffic (conntrack zone 64000, see `lb_tests::brex`). Needs root and Open vSwitch's
//! datapath (the `openvswitch` module): the lab kernel has none, so the test is ignored there
//! and the kernel matrix runs it in Debian's 6.1 (xtask/src/vm.rs, `GUEST_TESTS`).
//!
//! The two attach choices side by side: n1 attaches the XDP program below br-ex, natively on
//! its uplink (`xdp_interfaces = ["eth0"]`, driver mode), n2 on br-ex itself (generic mode,
//! its frames sent back go through br-ex's flows). Waits scale with `LB_TIME_SCALE` (software
//! emulation in the VM); the assertions do not.

use std::time::Duration;

use lb_tests::{
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

#[test]
#[ignore = "needs Open vSwitch's datapath (the openvswitch module), which the lab kernel lacks: cargo xtask test's kernel matrix runs it in Debian's kernel (--include-ignored, docs/kernels.md)"]
fn on_br_ex_lbd_fails_over_forwards_dsr_keeps_connections_and_host_traffic() {
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
    for n in l.nodes.clone() {
        brex::make_br_ex(&mut l.lab, &n);
    }
    // A native XDP_TX on a veth reaches its peer only if the peer runs an XDP program (a NIC
    // sends it to the wire): lb_pass on the switch-side peer of n1's uplink.
    let switch = format!("{}-sw", l.lab.prefix);
    let _pass = lb_tests::attach_pass(&switch, &["n1"]);
    // The client's frames carry whole checksums, as frames from a wire do.
    let client_ns = l.lab.node("client").netns.clone();
    lb_tests::lab::sh(&[
        "ip", "netns", "exec", &client_ns, "ethtool", "-K", "eth0", "tx", "off",
    ]);
    l.write_config(0);
    l.write_config(1);
    let native = l.config(0).replace(
        "xdp_mode = \"skb\"\n",
        "xdp_mode = \"driver\"\nxdp_interfaces = [\"eth0\"]\n",
    );
    assert!(native.contains("xdp_interfaces"));
    std::fs::write(l.config_path(0), native).unwrap();
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
    // The program is on n1's uplink, not on br-ex: lbd attached where the config says.
    let link = lb_tests::lab::sh(&[
        "ip",
        "-n",
        &l.lab.node("n1").netns,
        "-j",
        "link",
        "show",
        "eth0",
    ]);
    assert!(
        String::from_utf8_lossy(&link.stdout).contains("\"xdp\""),
        "XDP (driver mode) on n1's eth0"
    );

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
    let secs = (6 * brex::time_scale()).to_string();
    l.lab.spawn(
        "client",
        "hold",
        LABNODE,
        &["hold-ids", l.vip, PORT, "8", &secs, "200", "20"],
    );
    std::thread::sleep(scaled(Duration::from_secs(2)));
    l.stop(0, libc::SIGTERM);
    let m = l.wait_one_master(&[1], scaled(Duration::from_secs(15)));
    assert_eq!(m, Some(1), "n2 took over\n{}", l.logs());
    assert!(
        l.lab
            .wait("hold", scaled(Duration::from_secs(60)))
            .is_some(),
        "hold-ids finished"
    );
    let held: Value = l
        .lab
        .log("hold")
        .lines()
        .rev()
        .find_map(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null);
    let survived: u64 = held["survived_by_id"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
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
