//! Socket load balancing between real lbd nodes in network namespaces: a process on a node
//! that holds the VIP (the owner on its interface, the other node on `lo` as a DSR backend)
//! connects to a VIP service and gets a healthy backend by the VIP's Maglev table, not
//! necessarily its own stack. Two nodes run lbd and a backend each (`labnode serve-id` on TCP,
//! `labnode serve-udp-id` on UDP); a third backend runs no lbd. Needs root; `cargo xtask test`.
//!
//! The hooks are attached to the root cgroup v2 of the whole machine: the `client` namespace
//! holds the VIP too and serves it locally, and must keep doing so (the hooks act only in the
//! namespace of the lbd that attached them).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use lb_tests::{
    bin_dir,
    lab::{Lab, wait_for},
};
use serde_json::Value;

const LABNODE: &str = env!("CARGO_BIN_EXE_labnode");
const VIP4: &str = "10.86.0.100";
const VIP6: &str = "fd86::100";
/// A VIP whose one service is every TCP port of the address.
const VIP_ALL: &str = "10.86.0.101";
const TCP: u16 = 8080;
const UDP: u16 = 5353;
/// A port of the VIP that is no service: the local stack serves it, as without lbd.
const OTHER: u16 = 9090;
const NODES: [(&str, &str, &str); 3] = [
    ("lba", "10.86.0.11", "fd86::11"),
    ("lbb", "10.86.0.12", "fd86::12"),
    ("web", "10.86.0.13", "fd86::13"),
];

struct SockLab {
    lab: Lab,
    /// API socket of lba and lbb.
    sockets: BTreeMap<&'static str, String>,
}

fn backends(weights: &[u32; 3], v6: bool) -> String {
    NODES
        .iter()
        .zip(weights)
        .map(|((_, v4a, v6a), w)| {
            format!(
                "[[vips.backends]]\naddress = \"{}\"\nweight = {w}\n",
                if v6 { v6a } else { v4a }
            )
        })
        .collect()
}

fn config(name: &str, socket: &str, owned: bool, weights: &[u32; 3]) -> String {
    let health = format!("[vips.health]\nkind = \"tcp\"\nport = {TCP}\ninterval_ms = 200\n");
    let mut t = format!(
        "interface = \"eth0\"\nname = \"{name}\"\napi_socket = \"{socket}\"\nxdp_mode = \"skb\"\nfailed_backend_hold_ms = 0\n"
    );
    for (vip_name, addr, port, proto, v6) in [
        ("web", VIP4, TCP, "tcp", false),
        ("web6", VIP6, TCP, "tcp", true),
        ("dns", VIP4, UDP, "udp", false),
        ("dns6", VIP6, UDP, "udp", true),
    ] {
        t += &format!(
            "\n[[vips]]\nname = \"{vip_name}\"\naddress = \"{addr}\"\nports = [{port}]\nprotocol = \"{proto}\"\nowned = {owned}\n{health}{}",
            backends(weights, v6)
        );
    }
    t += &format!(
        "\n[[vips]]\nname = \"all\"\naddress = \"{VIP_ALL}\"\nowned = {owned}\n{health}{}",
        backends(weights, false)
    );
    t
}

impl SockLab {
    /// lba owns the VIPs, lbb and lba hold them on `lo`; `weights` of lba, lbb, web.
    fn new(prefix: &str, weights: [u32; 3]) -> SockLab {
        let mut lab = Lab::new(prefix);
        lab.add_node("client", "10.86.0.1", "fd86::1");
        for (n, v4, v6) in NODES {
            lab.add_node(n, v4, v6);
        }
        for (n, _, _) in NODES.iter().chain([("client", "", "")].iter()) {
            lab.make_dsr_backend(n, &[VIP4, VIP6, VIP_ALL]);
            let id = if *n == "client" { "client-local" } else { n };
            lab.spawn(
                n,
                &format!("tcp-{n}"),
                LABNODE,
                &["serve-id", &TCP.to_string(), id],
            );
            lab.spawn(
                n,
                &format!("udp-{n}"),
                LABNODE,
                &["serve-udp-id", &UDP.to_string(), id],
            );
        }
        // The node's own, non-service port of the VIP.
        lab.spawn(
            "lbb",
            "other-lbb",
            LABNODE,
            &["serve-id", &OTHER.to_string(), "lbb-other"],
        );
        let mut sockets = BTreeMap::new();
        for (n, owned) in [("lba", true), ("lbb", false)] {
            let name = format!("{}_{n}", lab.prefix.replace('-', "_"));
            let socket = lab.dir.join(format!("{n}.sock")).display().to_string();
            let cfg = lab.dir.join(format!("{n}.toml"));
            std::fs::write(&cfg, config(&name, &socket, owned, &weights)).unwrap();
            lab.cleanup(std::path::PathBuf::from("/sys/fs/bpf").join(&name));
            lab.spawn(
                n,
                &format!("lbd-{n}"),
                bin_dir().join("lbd"),
                &["--config", cfg.to_str().unwrap()],
            );
            sockets.insert(n, socket);
        }
        let l = SockLab { lab, sockets };
        for n in ["lba", "lbb"] {
            for (b, _, _) in NODES {
                l.wait_state(n, b, "active");
            }
        }
        l
    }

    fn rows(&self, node: &str, backend: &str) -> Vec<Value> {
        lb_tests::lbctl_json(&self.sockets[node], &["backends", "list"])
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                let a = r["backend"].as_str().unwrap_or("");
                NODES
                    .iter()
                    .any(|(n, v4, v6)| *n == backend && (a == *v4 || a == *v6))
            })
            .collect()
    }

    /// Wait until every row of `backend` in `node`'s lbd is in `state`.
    fn wait_state(&self, node: &str, backend: &str, state: &str) {
        let ok = wait_for(Duration::from_secs(20), || {
            let rows = self.rows(node, backend);
            (!rows.is_empty() && rows.iter().all(|r| r["state"] == state)).then_some(())
        });
        assert!(
            ok.is_some(),
            "{backend} never {state} on {node}: {:?}\n{}",
            self.rows(node, backend),
            self.lab.log(&format!("lbd-{node}"))
        );
    }

    /// lbd's `LB_SOCK_STATS` on `node`, summed over CPUs, by name.
    fn sock_stats(&self, node: &str) -> BTreeMap<&'static str, u64> {
        let name = format!("{}_{node}", self.lab.prefix.replace('-', "_"));
        let path = format!("/sys/fs/bpf/{name}/{}", lb_common::maps::SOCK_STATS);
        let data = aya::maps::MapData::from_pin(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let m: aya::maps::PerCpuArray<_, [u64; lb_common::sock_stat::COUNT as usize]> =
            aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).unwrap();
        let per_cpu = m.get(&0, 0).unwrap();
        lb_common::sock_stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, per_cpu.iter().map(|c| c[i]).sum()))
            .collect()
    }
}

/// What `count` TCP connections from `node` to `addr`:`port` got: answers by backend id, the
/// errors, and the peer addresses the application saw (getpeername).
#[derive(Debug, Default)]
struct Outcome {
    by_id: BTreeMap<String, u32>,
    errors: Vec<String>,
    peers: BTreeMap<SocketAddr, u32>,
}

impl Outcome {
    fn ok(&self) -> u32 {
        self.by_id.values().sum()
    }
    fn of(&self, id: &str) -> u32 {
        self.by_id.get(id).copied().unwrap_or(0)
    }
}

fn tcp_many(lab: &Lab, node: &str, addr: &str, port: u16, count: u32) -> Outcome {
    let target = SocketAddr::new(addr.parse().unwrap(), port);
    lab.in_netns(node, move || {
        let mut o = Outcome::default();
        for _ in 0..count {
            let r = TcpStream::connect_timeout(&target, Duration::from_secs(3)).and_then(|s| {
                s.set_read_timeout(Some(Duration::from_secs(3)))?;
                let peer = s.peer_addr()?;
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line)?;
                Ok((peer, line.trim().to_string()))
            });
            match r {
                Ok((peer, id)) => {
                    *o.by_id.entry(id).or_default() += 1;
                    *o.peers.entry(peer).or_default() += 1;
                }
                Err(e) => o.errors.push(e.to_string()),
            }
        }
        o
    })
}

/// `count` request/response exchanges with a UDP service, each on a new socket: connected
/// (the peer is getpeername's answer) or not (the peer is recvfrom's source).
fn udp_many(lab: &Lab, node: &str, addr: &str, port: u16, count: u32, connected: bool) -> Outcome {
    let target = SocketAddr::new(addr.parse().unwrap(), port);
    lab.in_netns(node, move || {
        let mut o = Outcome::default();
        let bind: SocketAddr = match target.ip() {
            IpAddr::V4(_) => "0.0.0.0:0".parse().unwrap(),
            IpAddr::V6(_) => "[::]:0".parse().unwrap(),
        };
        for _ in 0..count {
            let r = (|| -> std::io::Result<(SocketAddr, String)> {
                let s = UdpSocket::bind(bind)?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut buf = [0u8; 512];
                if connected {
                    s.connect(target)?;
                    s.send(b"q")?;
                    let n = s.recv(&mut buf)?;
                    Ok((
                        s.peer_addr()?,
                        String::from_utf8_lossy(&buf[..n]).trim().into(),
                    ))
                } else {
                    s.send_to(b"q", target)?;
                    let (n, from) = s.recv_from(&mut buf)?;
                    Ok((from, String::from_utf8_lossy(&buf[..n]).trim().into()))
                }
            })();
            match r {
                Ok((peer, id)) => {
                    *o.by_id.entry(id).or_default() += 1;
                    *o.peers.entry(peer).or_default() += 1;
                }
                Err(e) => o.errors.push(e.to_string()),
            }
        }
        o
    })
}

fn only_vip(o: &Outcome, vip: &str, port: u16) {
    let want = SocketAddr::new(vip.parse().unwrap(), port);
    assert!(
        o.peers.keys().all(|p| *p == want),
        "the application saw {:?}, not only {want}",
        o.peers
    );
}

/// The case: the node's own backend is down, every connection it makes to the VIP is
/// still answered, by the healthy backends, and the application sees the VIP as its peer.
#[test]
fn a_node_whose_backend_is_down_reaches_the_healthy_ones() {
    let mut l = SockLab::new("sk1", [1, 1, 1]);
    l.lab.stop("tcp-lbb", libc::SIGKILL);
    // Each lbd checks the backends itself: the owner's connections below use the owner's view.
    for node in ["lbb", "lba"] {
        l.wait_state(node, "lbb", "down");
    }
    for vip in [VIP4, VIP6] {
        let o = tcp_many(&l.lab, "lbb", vip, TCP, 20);
        println!("lbb -> {vip}: {o:?}");
        assert_eq!(o.ok(), 20, "20 of 20 answered: {o:?}");
        assert_eq!(o.of("lbb"), 0, "{o:?}");
        assert!(
            o.of("lba") > 0 && o.of("web") > 0,
            "spread over both healthy backends: {o:?}"
        );
        only_vip(&o, vip, TCP);
    }
    // A dual-stack socket given the IPv4 VIP as an IPv4-mapped address.
    let mapped = format!("::ffff:{VIP4}");
    let o = tcp_many(&l.lab, "lbb", &mapped, TCP, 20);
    println!("lbb -> {mapped}: {o:?}");
    assert_eq!(o.ok(), 20, "{o:?}");
    assert_eq!(o.of("lbb"), 0, "{o:?}");
    only_vip(&o, &mapped, TCP);
    // A service of every port of its address.
    let o = tcp_many(&l.lab, "lbb", VIP_ALL, TCP, 20);
    println!("lbb -> {VIP_ALL} (all ports): {o:?}");
    assert_eq!(o.ok(), 20, "{o:?}");
    assert_eq!(o.of("lbb"), 0, "{o:?}");
    only_vip(&o, VIP_ALL, TCP);
    // The owner too.
    let o = tcp_many(&l.lab, "lba", VIP4, TCP, 20);
    println!("lba -> {VIP4}: {o:?}");
    assert_eq!(o.ok(), 20, "{o:?}");
    assert_eq!(o.of("lbb"), 0, "{o:?}");
    only_vip(&o, VIP4, TCP);

    // A port of the VIP that is no service, and a namespace without lbd that holds the VIP
    // itself: served locally, as without the hooks.
    let o = tcp_many(&l.lab, "lbb", VIP4, OTHER, 5);
    assert_eq!(o.of("lbb-other"), 5, "{o:?}");
    only_vip(&o, VIP4, OTHER);
    let o = tcp_many(&l.lab, "client", VIP4, TCP, 10);
    assert_eq!(
        o.of("client-local"),
        10,
        "other namespaces are not touched: {o:?}"
    );
    let stats = l.sock_stats("lbb");
    println!("lbb LB_SOCK_STATS: {stats:?}");
    // 80 connections balanced by the hooks (not by XDP: they never left the node as VIP
    // packets), 80 getpeername() answers turned back into the VIP.
    assert!(stats["balanced"] >= 80, "{stats:?}");
    assert!(stats["reversed"] >= 80, "{stats:?}");

    // lbd dies: its hooks go with it, and the node's connections go where they went without
    // lbd (its own stack, whose backend is down).
    l.lab.stop("lbd-lbb", libc::SIGKILL);
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, 5);
    println!("lbb without lbd: {o:?}");
    assert_eq!(o.ok(), 0, "{o:?}");
    assert_eq!(o.errors.len(), 5, "{o:?}");
    assert_eq!(l.sock_stats("lbb")["balanced"], stats["balanced"]);
}

/// With every backend healthy, the node's own share of its connections is its weight's share
/// of the Maglev table (lbb has weight 2 of 4), within a wide statistical bound.
#[test]
fn with_all_healthy_the_own_share_is_the_weight_share() {
    let l = SockLab::new("sk2", [1, 2, 1]);
    let n = 400;
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, n);
    println!("lbb -> {VIP4}: {o:?}");
    assert_eq!(o.ok(), n, "{o:?}");
    let own = o.of("lbb") as f64 / n as f64;
    // Expected 0.5; the binomial standard deviation at 400 is 0.025.
    assert!((0.4..=0.6).contains(&own), "own share {own}: {o:?}");
    for id in ["lba", "web"] {
        let s = o.of(id) as f64 / n as f64;
        assert!((0.15..=0.35).contains(&s), "{id} share {s}: {o:?}");
    }
}

/// A DNS-like UDP service through the VIP, connected and unconnected, IPv4 and IPv6: every
/// request is answered by a backend, and the answer comes from the VIP as far as the
/// application can tell.
#[test]
fn udp_request_response_connected_and_unconnected() {
    let mut l = SockLab::new("sk3", [1, 1, 1]);
    l.lab.stop("udp-lbb", libc::SIGKILL);
    // Health is by TCP: lbb's UDP server being gone is not seen; stop its TCP server too.
    l.lab.stop("tcp-lbb", libc::SIGKILL);
    l.wait_state("lbb", "lbb", "down");
    for vip in [VIP4, VIP6] {
        for connected in [true, false] {
            let o = udp_many(&l.lab, "lbb", vip, UDP, 20, connected);
            println!("lbb -> {vip} udp connected={connected}: {o:?}");
            assert_eq!(o.ok(), 20, "{o:?}");
            assert_eq!(o.of("lbb"), 0, "{o:?}");
            assert!(o.of("lba") > 0 && o.of("web") > 0, "{o:?}");
            only_vip(&o, vip, UDP);
        }
    }
}

/// Health changes and drains apply to the node's new connections: a drained backend and a
/// failed one get none; both back, they get some again.
#[test]
fn health_and_drain_apply_to_new_host_connections() {
    let mut l = SockLab::new("sk4", [1, 1, 1]);
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, 40);
    assert!(
        o.of("lba") > 0 && o.of("lbb") > 0 && o.of("web") > 0,
        "{o:?}"
    );

    // Drain the node's own backend.
    let out = lb_tests::lbctl_output(
        &l.sockets["lbb"],
        &["backends", "drain", VIP4, "10.86.0.12"],
    );
    assert!(out.status.success(), "drain: {out:?}");
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, 40);
    println!("lbb drained: {o:?}");
    assert_eq!(o.ok(), 40, "{o:?}");
    assert_eq!(
        o.of("lbb"),
        0,
        "a drained backend takes no new host connections: {o:?}"
    );

    // A remote backend fails.
    l.lab.stop("tcp-web", libc::SIGKILL);
    l.wait_state("lbb", "web", "down");
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, 20);
    println!("lbb drained, web down: {o:?}");
    assert_eq!(o.ok(), 20, "{o:?}");
    assert_eq!(o.of("lba"), 20, "{o:?}");

    // Both back.
    let out = lb_tests::lbctl_output(
        &l.sockets["lbb"],
        &["backends", "undrain", VIP4, "10.86.0.12"],
    );
    assert!(out.status.success(), "undrain: {out:?}");
    l.lab.spawn(
        "web",
        "tcp-web2",
        LABNODE,
        &["serve-id", &TCP.to_string(), "web"],
    );
    l.wait_state("lbb", "web", "active");
    let o = tcp_many(&l.lab, "lbb", VIP4, TCP, 40);
    println!("lbb all back: {o:?}");
    assert_eq!(o.ok(), 40, "{o:?}");
    assert!(
        o.of("lba") > 0 && o.of("lbb") > 0 && o.of("web") > 0,
        "{o:?}"
    );
}
