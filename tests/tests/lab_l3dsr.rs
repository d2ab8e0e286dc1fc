//! L3 direct server return in network namespaces: backends two routed hops from the LB node.
//! lbd wraps each VIP packet in IPv4 (IP-in-IP) to the backend through its next hop, the routers
//! forward it as ordinary traffic, `lbd decap` on the backend unwraps it, and the backend
//! answers the client directly through its own routers. Needs root; `cargo xtask test`.
//!
//! ```text
//!  client 10.94.0.2 ┐
//!  lb     10.94.0.10┼ bridge ─ r1 10.94.0.1 │ 10.95.0.1 ── 10.95.0.2 r2 │ 10.96.1.1 ── b1 10.96.1.2
//!                   ┘                                                   │ 10.96.2.1 ── b2 10.96.2.2
//! ```

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    time::Duration,
};

use lb_tests::{
    bin_dir,
    lab::{Lab, sh, wait_for},
    lbctl_json,
};
use serde_json::Value;

const VIP: &str = "10.94.0.100";
const PORT: &str = "8080";
const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");

struct L3Lab {
    lab: Lab,
    socket: String,
}

fn route(lab: &Lab, node: &str, args: &[&str]) {
    let mut a = vec!["ip", "-n", &lab.node(node).netns, "route", "add"];
    a.extend_from_slice(args);
    sh(&a);
}

fn setup() -> L3Lab {
    setup_with(None)
}

/// The lab; with `small_hop` (MTU, declared), the link between the routers has that MTU and,
/// if declared, the LB node's route to the backends says so (`ip route ... mtu`).
fn setup_with(small_hop: Option<(u32, bool)>) -> L3Lab {
    let mut lab = Lab::new("l3");
    lab.add_node("client", "10.94.0.2", "fd94::2");
    lab.add_node("lb", "10.94.0.10", "fd94::10");
    lab.add_node("r1", "10.94.0.1", "fd94::1");
    lab.add_detached_node("r2", "10.95.0.2");
    lab.add_detached_node("b1", "10.96.1.2");
    lab.add_detached_node("b2", "10.96.2.2");
    lab.link("r1", "eth1", "10.95.0.1/24", "r2", "eth0", "10.95.0.2/24");
    lab.link("r2", "eth1", "10.96.1.1/24", "b1", "eth0", "10.96.1.2/24");
    lab.link("r2", "eth2", "10.96.2.1/24", "b2", "eth0", "10.96.2.2/24");
    for n in ["r1", "r2"] {
        lab.sysctl(&lab.node(n).netns.clone(), "net.ipv4.ip_forward", "1");
    }
    // Replies from the VIP reach the client through the routers, not from the VIP's subnet's
    // owner: no reverse-path filtering on the way.
    for n in ["client", "r1", "r2", "b1", "b2"] {
        let ns = lab.node(n).netns.clone();
        for k in [
            "net.ipv4.conf.all.rp_filter",
            "net.ipv4.conf.default.rp_filter",
        ] {
            lab.sysctl(&ns, k, "0");
        }
    }
    // The client sends what a NIC puts on the wire, frames of its MTU, not the TSO/GSO
    // super-frames a veth hands on whole: the LB takes a TCP frame longer than its device's
    // MTU for a GRO merge and wraps it whole (tests/tests/xdp_encap.rs), and this lab checks
    // the path of full-size frames that wrapped exceed the path: fragmentation needed.
    let client = lab.node("client").netns.clone();
    sh(&[
        "ip", "netns", "exec", &client, "ethtool", "-K", "eth0", "tso", "off", "gso", "off",
    ]);
    match small_hop {
        None => route(&lab, "lb", &["10.96.0.0/16", "via", "10.94.0.1"]),
        Some((mtu, declared)) => {
            let mtu = mtu.to_string();
            for (n, dev) in [("r1", "eth1"), ("r2", "eth0")] {
                let ns = lab.node(n).netns.clone();
                sh(&["ip", "-n", &ns, "link", "set", dev, "mtu", &mtu]);
            }
            let mut r = vec!["10.96.0.0/16", "via", "10.94.0.1"];
            if declared {
                r.extend(["mtu", &mtu]);
            }
            route(&lab, "lb", &r);
        }
    }
    route(&lab, "r1", &["10.96.0.0/16", "via", "10.95.0.2"]);
    route(&lab, "r2", &["default", "via", "10.95.0.1"]);
    route(&lab, "b1", &["default", "via", "10.96.1.1"]);
    route(&lab, "b2", &["default", "via", "10.96.2.1"]);

    let lbd = bin_dir().join("lbd");
    let lbd = lbd.to_str().unwrap().to_string();
    for n in ["b1", "b2"] {
        lab.spawn(n, &format!("server-{n}"), LABNODE, &["serve-id", PORT, n]);
        let name = format!("{}_{n}", lab.prefix.replace('-', "_"));
        // Its saved sysctls stay in the lab's own directory.
        let state_dir = lab.dir.display().to_string();
        lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(format!("{name}-decap")));
        lab.spawn(
            n,
            &format!("decap-{n}"),
            &lbd,
            &[
                "decap",
                "--interface",
                "eth0",
                "--lb-node",
                "10.94.0.10",
                "--vip",
                VIP,
                "--xdp-mode",
                "skb",
                "--name",
                &name,
                "--state-dir",
                &state_dir,
            ],
        );
    }

    let name = lab.prefix.replace('-', "_");
    let socket = lab.dir.join("lbd.sock").display().to_string();
    let cfg = format!(
        "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\n\n[[vips]]\nname = \"web\"\naddress = \"{VIP}\"\nports = [{PORT}]\nowned = true\n[vips.health]\nkind = \"tcp\"\ninterval_ms = 200\n[[vips.backends]]\naddress = \"10.96.1.2\"\nencap = \"ipip\"\n[[vips.backends]]\naddress = \"10.96.2.2\"\nencap = \"ipip\"\n"
    );
    let cfg_path = lab.dir.join("lbd.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(&name));
    lab.spawn("lb", "lbd", &lbd, &["--config", cfg_path.to_str().unwrap()]);
    let l = L3Lab { lab, socket };
    let ready = wait_for(Duration::from_secs(30), || {
        let rows = l.lbctl(&["backends", "list"])?;
        let rows = rows.as_array()?;
        (rows.len() == 2 && rows.iter().all(|r| r["state"] == "active")).then_some(())
    });
    if ready.is_none() {
        panic!(
            "routed backends never became active: {:?}\nlbd:\n{}\ndecap b1:\n{}",
            l.lbctl(&["backends", "list"]),
            l.lab.log("lbd"),
            l.lab.log("decap-b1")
        );
    }
    l
}

impl L3Lab {
    fn lbctl(&self, args: &[&str]) -> Option<Value> {
        lbctl_json(&self.socket, args)
    }

    fn stat(&self, name: &str) -> u64 {
        self.lbctl(&["stats"])
            .and_then(|v| v["counters"][name].as_u64())
            .unwrap_or(0)
    }
}

#[test]
fn backends_two_routed_hops_away_serve_the_vip_and_answer_directly() {
    let l = setup();
    check_serving(&l, 1500);
}

#[test]
fn a_smaller_hop_on_the_routed_path_is_honoured() {
    // The routers' link takes 1400 bytes; the LB node's route says so. Wrapped packets must fit
    // 1400, not the LB's 1500-byte link: a full-size segment gets fragmentation-needed and the
    // 20 kB echo completes (sized by the link instead, it would vanish at the routers).
    let l = setup_with(Some((1400, true)));
    check_serving(&l, 1400);
}

#[test]
fn a_smaller_hop_is_learned_from_the_routers_errors() {
    // The same hop, declared nowhere: the first wrapped packet too big for it gets
    // fragmentation-needed from r1; the LB node's kernel learns the backend's path MTU from it
    // and lbd sizes wrapped packets by it within a second. The echo completes.
    let l = setup_with(Some((1400, false)));
    check_serving(&l, 1400);
}

/// Connections through the VIP, and a 20 kB echo through a path of `mtu` bytes.
fn check_serving(l: &L3Lab, mtu: u32) {
    let rows = l.lbctl(&["backends", "list"]).unwrap();
    println!("{}", serde_json::to_string_pretty(&rows).unwrap());

    // Connections through the VIP reach both routed backends.
    let out = l.lab.run(
        "client",
        LABNODE,
        &["connect-many", VIP, PORT, "400", "8", "3000"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["ok"],
        400,
        "through the routed backends: {v}\n{}",
        l.lab.log("lbd")
    );
    let by_id: BTreeMap<String, u64> = serde_json::from_value(v["by_id"].clone()).unwrap();
    assert!(
        by_id.get("b1").copied().unwrap_or(0) > 100 && by_id.get("b2").copied().unwrap_or(0) > 100,
        "spread over both: {by_id:?}"
    );
    let wrapped = l.stat("encapsulated");
    assert!(
        wrapped >= 400 * 3,
        "the LB wrapped the client's packets: {wrapped}"
    );

    // The answers do not come back through the LB node: it forwarded only the client's side.
    let forwarded = l.stat("forwarded");
    assert_eq!(forwarded, wrapped, "every forwarded packet was wrapped");

    // A client that sends full-size segments: wrapped they would exceed the path,
    // so the LB answers the first with "fragmentation needed" and the client's stack lowers its
    // path MTU for the VIP and sends smaller ones; the echo completes.
    let too_big_before = l.stat("encap_too_big");
    let echoed = l.lab.in_netns("client", || {
        let addr = format!("{VIP}:{PORT}").parse().unwrap();
        let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut id = String::new();
        r.read_line(&mut id).unwrap();
        let payload: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        (&s).write_all(&payload).unwrap();
        let mut back = vec![0u8; payload.len()];
        r.read_exact(&mut back).unwrap();
        (id.trim().to_string(), back == payload)
    });
    assert!(echoed.1, "20 kB echoed through {}", echoed.0);
    let too_big = l.stat("encap_too_big") - too_big_before;
    assert!(too_big >= 1, "the LB sent fragmentation-needed: {too_big}");
    println!(
        "400 connections over {by_id:?}; {wrapped} packets wrapped; a 20 kB echo through {} after {too_big} ICMP fragmentation-needed (path MTU {mtu})",
        echoed.0
    );
}

#[test]
fn a_stopped_lbd_decap_takes_back_what_it_set_and_its_backend_goes_down() {
    let mut l = setup();
    let ns = l.lab.node("b1").netns.clone();
    assert!(lb_tests::lab::has_address(&ns, "lo", VIP));
    let pid = l.lab.pid("decap-b1").unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert_eq!(
        l.lab
            .wait("decap-b1", Duration::from_secs(5))
            .map(|s| s.success()),
        Some(true),
        "lbd decap exits 0 on SIGTERM\n{}",
        l.lab.log("decap-b1")
    );
    assert!(
        !lb_tests::lab::has_address(&ns, "lo", VIP),
        "the VIP left lo"
    );
    let xdp = sh(&["ip", "-n", &ns, "-j", "link", "show", "dev", "eth0"]);
    let v: Value = serde_json::from_slice(&xdp.stdout).unwrap();
    assert!(v[0]["xdp"].is_null(), "no XDP program left on eth0: {v}");
    // Without its decapsulation b1 cannot serve, though its own address still answers: lbd's
    // check connects to the decap health port first, so b1 goes down and its flows move.
    let down = wait_for(Duration::from_secs(5), || {
        let rows = l.lbctl(&["backends", "list"])?;
        rows.as_array()?
            .iter()
            .find(|r| r["backend"] == "10.96.1.2" && r["state"] != "active")
            .map(|r| r["reason"].as_str().unwrap_or("").to_string())
    })
    .unwrap_or_else(|| panic!("b1 stayed active\n{:?}", l.lbctl(&["backends", "list"])));
    assert!(down.contains("lbd decap"), "the reason says why: {down}");
    let out = l.lab.run(
        "client",
        LABNODE,
        &["connect-many", VIP, PORT, "100", "8", "1000"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], 100, "all through b2: {v}");
    assert_eq!(v["by_id"]["b2"], 100, "{v}");
}
