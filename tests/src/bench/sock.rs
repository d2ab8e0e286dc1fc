//! `bench sock`: what socket load balancing costs a connect(), with the hooks attached and
//! without, interleaved round by round in one network namespace of a lab.
//!
//! Cases (ns per call of the calling thread's CPU time, median of the rounds):
//! - `udp_connect_vip`: connect() of a UDP socket to a VIP service (the hook balances it: VIP
//!   lookup, Maglev slot, reverse entry). No packet is sent.
//! - `udp_connect_other`: connect() of a UDP socket to an address that is no VIP (the hook's
//!   cheapest path: the namespace check and the address filter).
//! - `tcp_connect_vip`: a whole TCP connect() to a VIP service whose only backend is the node
//!   itself (handshake on the node, accept, close), the realistic case.
//! - `tcp_connect_node`: the same to the node's own address, which is where the hook sends
//!   `tcp_connect_vip`: its plain value is the connection without any balancing work.
use std::{
    io::ErrorKind,
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
};

use lb_common::{DEFAULT_TABLE_SIZE, PROTO_TCP, PROTO_UDP};
use lb_userspace::dataplane::{BackendSpec, Desired, ServiceSpec, vip_key};
use serde_json::{Value, json};

use super::{median, write_json};
use crate::{TestDataplane, backend, lab::Lab};

const VIP: &str = "10.87.0.100";
const NODE: &str = "10.87.0.11";
const OTHER: &str = "10.87.0.12";
const PORT: u16 = 8080;
const ROUNDS: usize = 7;
const UDP_CALLS: u32 = 50_000;
/// Few enough that all rounds' connections (each leaves a TIME_WAIT) fit in the port range.
const TCP_CALLS: u32 = 1_000;

fn local(addr: &str) -> BackendSpec {
    BackendSpec {
        mac: None,
        local: true,
        ..backend(addr, 0)
    }
}

/// CPU time of the calling thread, in ns: what a call costs its caller (the hooks run in the
/// caller's context), without the time it waited for a CPU on a shared machine.
fn thread_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn udp_connects(to: SocketAddr, n: u32) -> f64 {
    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
    let t = thread_ns();
    for _ in 0..n {
        s.connect(to).unwrap();
    }
    (thread_ns() - t) / n as f64
}

fn tcp_connects(to: SocketAddr, n: u32) -> f64 {
    let t = thread_ns();
    for _ in 0..n {
        let s = loop {
            match TcpStream::connect(to) {
                Ok(s) => break s,
                Err(e) if e.kind() == ErrorKind::AddrNotAvailable => continue,
                Err(e) => panic!("connect {to}: {e}"),
            }
        };
        drop(s);
    }
    (thread_ns() - t) / n as f64
}

/// (case, with hooks, without) in ns per call: medians of interleaved rounds.
fn measure() -> Vec<(&'static str, Vec<f64>, Vec<f64>)> {
    let mut t = TestDataplane::new(DEFAULT_TABLE_SIZE);
    let vip = VIP.parse().unwrap();
    t.dp.apply(&Desired {
        services: vec![
            ServiceSpec {
                key: vip_key(vip, PORT, PROTO_TCP),
                owned: false,
                backends: vec![local(NODE)],
            },
            ServiceSpec {
                key: vip_key(vip, PORT, PROTO_UDP),
                owned: false,
                backends: vec![local(NODE), backend(OTHER, 12), backend("10.87.0.13", 13)],
            },
        ],
        peers: Vec::new(),
    })
    .unwrap();
    let listener = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
    // Threads inherit the namespace of the thread that creates them.
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let to_vip: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let to_other: SocketAddr = format!("{OTHER}:{PORT}").parse().unwrap();
    let to_node: SocketAddr = format!("{NODE}:{PORT}").parse().unwrap();
    let mut cases: Vec<(&str, Vec<f64>, Vec<f64>)> = [
        "udp_connect_vip",
        "udp_connect_other",
        "tcp_connect_vip",
        "tcp_connect_node",
    ]
    .into_iter()
    .map(|c| (c, Vec::new(), Vec::new()))
    .collect();
    for _ in 0..ROUNDS {
        for hooked in [false, true] {
            if hooked {
                t.dp.attach_sock().unwrap();
            } else {
                t.dp.detach_sock();
            }
            let v = [
                udp_connects(to_vip, UDP_CALLS),
                udp_connects(to_other, UDP_CALLS),
                tcp_connects(to_vip, TCP_CALLS),
                tcp_connects(to_node, TCP_CALLS),
            ];
            for (c, ns) in cases.iter_mut().zip(v) {
                if hooked { c.1.push(ns) } else { c.2.push(ns) }
            }
        }
    }
    t.dp.detach_sock();
    cases
}

pub fn run() {
    let mut lab = Lab::new("skb");
    lab.add_node("node", NODE, "fd87::11");
    lab.make_dsr_backend("node", &[VIP]);
    // Every round's connections leave TIME_WAITs: a wide port range, and reuse, keep the port
    // search short and the same in every round.
    let ns = lab.node("node").netns.clone();
    lab.sysctl(&ns, "net.ipv4.ip_local_port_range", "1024 65000");
    lab.sysctl(&ns, "net.ipv4.tcp_tw_reuse", "1");
    let cases = lab.in_netns("node", measure);
    println!("{ROUNDS} rounds, interleaved; ns per call (median)");
    println!(
        "{:<20} {:>10} {:>10} {:>10}",
        "case", "hooked", "plain", "added"
    );
    let mut rows: Vec<Value> = Vec::new();
    for (name, hooked, plain) in cases {
        let (h, p) = (median(hooked.clone()), median(plain.clone()));
        println!("{name:<20} {h:>10.0} {p:>10.0} {:>10.0}", h - p);
        rows.push(json!({
            "name": name,
            "ns_per_call_hooked": h,
            "ns_per_call_plain": p,
            "added_ns": h - p,
            "hooked_samples": hooked,
            "plain_samples": plain,
        }));
    }
    write_json(
        "sock",
        &json!({
            "method": "CPU time of the calling thread per call, in one lab namespace; the hooks attached to the cgroup v2 root and detached in alternate rounds",
            "rounds": ROUNDS,
            "udp_calls": UDP_CALLS,
            "tcp_calls": TCP_CALLS,
            "cases": rows,
        }),
    );
    drop(lab);
}
