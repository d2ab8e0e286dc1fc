//! Spoofed floods against the connection table (the real XDP program and the kernel's LRU hash,
//! through BPF_PROG_TEST_RUN): long-lived connections that are idle during a flood of spoofed
//! SYNs, or of spoofed ACKs of made-up connections, totalling 10x the table keep their entries,
//! and so their backend, even the connections of a backend drained before the flood (a lost
//! entry would move them to another backend, which resets them); the flood leaves the table as
//! it found it; real new connections made during the flood complete on one backend. Flood mode
//! counts misses node-wide, not per CPU. And a spoofed SYN never moves an established
//! connection. See docs/architecture.md ("Floods"). Needs root; `cargo xtask test`.

use std::net::IpAddr;

use lb_common::{PROTO_TCP, PROTO_UDP, stat};
use lb_tests::{TestDataplane, backend, frames::*, xdp_fuzz::Rng};
use lb_userspace::dataplane::{Desired, ServiceSpec, vip_key};

const TX: u32 = 3;
const VIP: [u8; 4] = [10, 67, 0, 100];
/// `TestDataplane`'s connection table.
const TABLE: u64 = 4096;
const LONG_LIVED: u16 = 300;

fn desired(drain_first: bool) -> Desired {
    let mut b = vec![
        backend("10.67.0.11", 11),
        backend("10.67.0.12", 12),
        backend("10.67.0.13", 13),
    ];
    b[0].drained = drain_first;
    Desired {
        services: vec![ServiceSpec {
            key: vip_key(IpAddr::from(VIP), 6443, PROTO_TCP),
            owned: true,
            backends: b,
        }],
        ..Default::default()
    }
}

fn frame(src: [u8; 4], sport: u16, flags: u8) -> Vec<u8> {
    ipv4_frame(src, VIP, PROTO_TCP, &tcp(sport, 6443, flags))
}

fn backend_of(t: &mut TestDataplane, f: &[u8]) -> u8 {
    let (v, out, _) = t.dp.test_run("lb_xdp", f, 1).unwrap();
    assert_eq!(v, TX);
    out[5]
}

fn counter(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

struct Flood {
    survived: usize,
    lost: u64,
    real_ok: u64,
    real: u64,
    /// `syn_flood_untracked` and `flood_untracked`.
    untracked: u64,
    untracked_other: u64,
    /// Connection-table entries after the flood.
    fill: usize,
}

/// Long-lived flows, a drain, the flood with real connections in it, then the long-lived flows'
/// next packets. `syn_flood_rate` 0 turns flood mode off. The flood's packets are SYNs, or ACKs
/// of connections nobody opened (`flood_flags`).
fn flood_run(syn_flood_rate: u32, flood_flags: u8) -> Flood {
    let mut t = TestDataplane::with_flood_rate(251, syn_flood_rate);
    t.dp.apply(&desired(false)).unwrap();
    let client = [10, 67, 1, 1];
    // Long-lived connections: the handshake and some data, then idle.
    let mut first = Vec::new();
    for sport in 20000..20000 + LONG_LIVED {
        let b = backend_of(&mut t, &frame(client, sport, SYN));
        for _ in 0..4 {
            assert_eq!(backend_of(&mut t, &frame(client, sport, ACK)), b);
        }
        first.push(b);
    }
    let on_drained = first.iter().filter(|b| **b == 11).count();
    assert!(
        on_drained > 50,
        "flows on the backend to drain: {on_drained}"
    );
    t.dp.apply(&desired(true)).unwrap();

    // The flood: spoofed sources, each SYN a new flow; real clients connect meanwhile.
    let mut rng = Rng::new(0xf100d);
    let flood = TABLE * 10;
    let (mut real_ok, mut real) = (0u64, 0u64);
    let start = std::time::Instant::now();
    let mut pending: Vec<(u16, u8)> = Vec::new();
    for n in 0..flood {
        let src = [
            100 + rng.below(100) as u8,
            rng.below(256) as u8,
            rng.below(256) as u8,
            1 + rng.below(254) as u8,
        ];
        t.dp.test_run(
            "lb_xdp",
            &frame(src, 1024 + rng.below(60000) as u16, flood_flags),
            1,
        )
        .unwrap();
        // A real connection every 400 flood SYNs: its SYN now, its ACK (one round trip later)
        // after 100 more spoofed SYNs.
        if n % 400 == 0 {
            let sport = 40000 + (n / 400) as u16;
            pending.push((
                sport,
                backend_of(&mut t, &frame([10, 67, 2, 2], sport, SYN)),
            ));
        }
        if n % 400 == 100
            && let Some((sport, b)) = pending.pop()
        {
            real += 1;
            if backend_of(&mut t, &frame([10, 67, 2, 2], sport, ACK)) == b && b != 11 {
                real_ok += 1;
            }
        }
    }
    let flood_secs = start.elapsed().as_secs_f64();
    let stale_before = counter(&t, stat::CONNTRACK_STALE);
    let miss_before = counter(&t, stat::CONNTRACK_MISS);
    let survived = (20000..20000 + LONG_LIVED)
        .zip(&first)
        .filter(|(sport, b)| backend_of(&mut t, &frame(client, *sport, ACK)) == **b)
        .count();
    let lost = counter(&t, stat::CONNTRACK_MISS) - miss_before + counter(&t, stat::CONNTRACK_STALE)
        - stale_before;
    let fill = t.dp.conntrack_entries();
    println!(
        "syn_flood_rate {syn_flood_rate}: {flood} spoofed {} ({fill} table entries after)",
        if flood_flags == SYN { "SYNs" } else { "ACKs" }
    );
    println!(
        "syn_flood_rate {syn_flood_rate}: {flood} spoofed segments ({:.0} per second through BPF_PROG_TEST_RUN) against a {TABLE}-entry table: {survived}/{LONG_LIVED} idle long-lived flows kept their backend ({on_drained} on the drained one), {lost} entries lost; {real_ok}/{real} real connections completed",
        flood as f64 / flood_secs
    );
    Flood {
        survived,
        lost,
        real_ok,
        real,
        untracked: counter(&t, stat::SYN_FLOOD_UNTRACKED),
        untracked_other: counter(&t, stat::FLOOD_UNTRACKED),
        fill,
    }
}

#[test]
fn idle_established_flows_survive_a_spoofed_syn_flood_of_ten_times_the_table() {
    let f = flood_run(lb_common::DEFAULT_SYN_FLOOD_RATE, SYN);
    assert_eq!(
        (f.survived, f.lost),
        (LONG_LIVED as usize, 0),
        "idle established flows keep their entries"
    );
    assert_eq!(
        f.real_ok, f.real,
        "real connections complete during the flood"
    );
    assert!(
        f.untracked > TABLE * 10 / 2,
        "flood mode took the flood's SYNs out of the table: {}",
        f.untracked
    );
    // The flood wrote entries only until flood mode started (a second's worth at the rate).
    assert!(
        f.fill < (TABLE / 2) as usize,
        "the flood filled the table: {} entries",
        f.fill
    );
}

#[test]
fn idle_established_flows_survive_a_spoofed_ack_flood_that_leaves_the_table_empty() {
    // ACKs of connections nobody opened are misses too: each would write an entry.
    let f = flood_run(lb_common::DEFAULT_SYN_FLOOD_RATE, ACK);
    assert_eq!(
        (f.survived, f.lost),
        (LONG_LIVED as usize, 0),
        "idle established flows keep their entries"
    );
    assert_eq!(
        f.real_ok, f.real,
        "real connections complete during the flood"
    );
    assert!(
        f.untracked_other > TABLE * 10 / 2,
        "flood mode took the flood's ACKs out of the table: {}",
        f.untracked_other
    );
    assert!(
        f.fill < (TABLE / 2) as usize,
        "the flood filled the table: {} entries",
        f.fill
    );
}

#[test]
fn without_flood_mode_the_flood_evicts_established_flows() {
    // The control: the kernel's LRU alone does not keep idle established entries through a
    // flood of 10x the table (why flood mode exists; if this ever stops losing entries, the
    // test above proves less than it claims).
    let f = flood_run(0, SYN);
    assert!(f.lost > 0, "entries lost without flood mode");
    assert_eq!(f.untracked, 0);
}

#[test]
fn the_flood_is_visible_next_to_the_table_size() {
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(false)).unwrap();
    let quiet = t.dp.flood_status().unwrap();
    assert!(!quiet.active);
    assert_eq!(quiet.conntrack_size, TABLE as u32);
    // 0.3 s of SYNs as fast as BPF_PROG_TEST_RUN goes: well above 10k per second.
    let mut rng = Rng::new(5);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(300) {
        let src = [100, rng.below(256) as u8, rng.below(256) as u8, 1];
        t.dp.test_run("lb_xdp", &frame(src, rng.below(60000) as u16, SYN), 1)
            .unwrap();
    }
    let s = t.dp.flood_status().unwrap();
    println!("during a flood: {s:?}");
    assert!(s.active, "flood mode is on: {s:?}");
    assert!(
        s.new_connections_per_s > 10_000,
        "the rate shows the flood: {s:?}"
    );
}

#[test]
fn a_handshake_whose_syn_skipped_a_drained_slot_in_flood_mode_completes_after_the_flood() {
    // Which flows' slots name backend 11 (a mid-flow packet without an entry goes to its slot).
    let mut probe = TestDataplane::new(251);
    probe.dp.apply(&desired(false)).unwrap();
    let client = [10, 67, 3, 3];
    let on_11: Vec<u16> = (30000..30300u16)
        .filter(|sport| backend_of(&mut probe, &frame(client, *sport, ACK)) == 11)
        .collect();
    drop(probe);
    assert!(on_11.len() > 40, "flows on backend 11: {}", on_11.len());

    // The owner: backend 11 drained, flood mode at one SYN per 100 ms window.
    let mut t = TestDataplane::with_flood_rate(251, 10);
    t.dp.apply(&desired(true)).unwrap();
    for n in 0..5u16 {
        backend_of(&mut t, &frame([100, 1, 1, 1], 1000 + n, SYN));
    }
    assert!(t.dp.flood_status().unwrap().active, "flood mode is on");
    // Half of the drained backend's flows open now, in flood mode: their SYNs skip its slots
    // and write no connection-table entry.
    let (opened, established) = on_11.split_at(on_11.len() / 2);
    let untracked = counter(&t, stat::SYN_FLOOD_UNTRACKED);
    let chosen: Vec<u8> = opened
        .iter()
        .map(|sport| backend_of(&mut t, &frame(client, *sport, SYN)))
        .collect();
    assert!(
        chosen.iter().all(|b| *b != 11),
        "a new connection went to the drained backend"
    );
    assert_eq!(
        counter(&t, stat::SYN_FLOOD_UNTRACKED) - untracked,
        opened.len() as u64
    );
    // Their ACKs come after flood mode ended (on another CPU it may never have started): each
    // goes where its SYN went, not to the slot's drained backend (which would reset it).
    std::thread::sleep(std::time::Duration::from_millis(
        lb_common::FLOOD_HOLD_NS / 1_000_000 + 300,
    ));
    assert!(!t.dp.flood_status().unwrap().active, "flood mode is over");
    for (sport, b) in opened.iter().zip(&chosen) {
        for _ in 0..3 {
            assert_eq!(
                backend_of(&mut t, &frame(client, *sport, ACK)),
                *b,
                "the handshake's ACK left its SYN's backend"
            );
        }
    }
    // Mid-flow packets of the drained backend's established flows (no entry here) stay on it.
    for sport in established {
        assert_eq!(backend_of(&mut t, &frame(client, *sport, ACK)), 11);
    }
}

/// Like `frame`, a UDP datagram to the VIP's UDP service.
fn udp_frame(src: [u8; 4], sport: u16) -> Vec<u8> {
    ipv4_frame(src, VIP, PROTO_UDP, &udp(sport, 6443, 32))
}

#[test]
fn flood_mode_counts_misses_of_every_cpu_together() {
    // 10 misses per 100 ms window is the limit; each of two CPUs sees 8, of every shape that
    // writes an entry (SYN, a mid-flow ACK, a UDP datagram). Counted per CPU, neither would be
    // over it.
    lb_tests::xdp::assert_two_cpus();
    let mut t = TestDataplane::with_flood_rate(251, 100);
    let mut d = desired(false);
    d.services.push(ServiceSpec {
        key: vip_key(IpAddr::from(VIP), 6443, PROTO_UDP),
        owned: true,
        backends: d.services[0].backends.clone(),
    });
    t.dp.apply(&d).unwrap();
    let mut active = false;
    let mut sport = 1000u16;
    // A window may roll between the two CPUs' misses: a few tries.
    for _ in 0..5 {
        for cpu in [0, 1] {
            lb_tests::xdp::pin_to_cpu(cpu);
            for n in 0..8u8 {
                sport += 1;
                let src = [100, cpu as u8, n, 1];
                let f = match n % 3 {
                    0 => frame(src, sport, SYN),
                    1 => frame(src, sport, ACK),
                    _ => udp_frame(src, sport),
                };
                assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, TX);
            }
        }
        if t.dp.flood_status().unwrap().active {
            active = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert!(
        active,
        "16 misses in a window over two CPUs start flood mode: {:?}",
        t.dp.flood_status().unwrap()
    );
    // Now no miss writes an entry, whatever its shape and CPU; each is still forwarded.
    let before = t.dp.conntrack_entries();
    let (untracked, other) = (
        counter(&t, stat::SYN_FLOOD_UNTRACKED),
        counter(&t, stat::FLOOD_UNTRACKED),
    );
    for cpu in [0, 1] {
        lb_tests::xdp::pin_to_cpu(cpu);
        for n in 0..3u8 {
            sport += 1;
            let src = [101, cpu as u8, n, 1];
            for f in [
                frame(src, sport, SYN),
                frame(src, sport + 1000, ACK),
                udp_frame(src, sport),
            ] {
                assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, TX);
            }
        }
    }
    assert_eq!(
        t.dp.conntrack_entries(),
        before,
        "entries written in flood mode"
    );
    assert_eq!(counter(&t, stat::SYN_FLOOD_UNTRACKED) - untracked, 6);
    assert_eq!(counter(&t, stat::FLOOD_UNTRACKED) - other, 12);
}

/// Flows of `client` whose entries name a backend other than their slot's: opened while
/// backend 11 was drained, on slots of 11 (they went to the next slot's backend). Returns their
/// ports and backends, with 11 taking new flows again.
fn flows_off_their_slot(
    t: &mut TestDataplane,
    client: [u8; 4],
    ports: std::ops::Range<u16>,
) -> Vec<(u16, u8)> {
    let on_11: Vec<u16> = {
        let mut probe = TestDataplane::new(251);
        probe.dp.apply(&desired(false)).unwrap();
        ports
            .filter(|sport| backend_of(&mut probe, &frame(client, *sport, ACK)) == 11)
            .collect()
    };
    assert!(on_11.len() > 20, "flows on backend 11: {}", on_11.len());
    t.dp.apply(&desired(true)).unwrap();
    let opened: Vec<(u16, u8)> = on_11
        .iter()
        .map(|sport| {
            let b = backend_of(t, &frame(client, *sport, SYN));
            assert_ne!(b, 11);
            assert_eq!(backend_of(t, &frame(client, *sport, ACK)), b);
            (*sport, b)
        })
        .collect();
    t.dp.apply(&desired(false)).unwrap();
    opened
}

/// Open a connection (SYN, ACK) from each of `ports`; the ports whose connection is on backend
/// 11 (more than 20 of them).
fn opened_on_11(t: &mut TestDataplane, client: [u8; 4], ports: std::ops::Range<u16>) -> Vec<u16> {
    let on_11: Vec<u16> = ports
        .filter(|sport| {
            backend_of(t, &frame(client, *sport, SYN)) == 11
                && backend_of(t, &frame(client, *sport, ACK)) == 11
        })
        .collect();
    assert!(
        on_11.len() > 20,
        "connections on backend 11: {}",
        on_11.len()
    );
    on_11
}

/// Flood mode from now on: lbd restarted with a limit of one miss per window, then a few
/// spoofed SYNs.
fn flood_mode_on(t: &mut TestDataplane) {
    t.opts.syn_flood_rate = 10;
    t.restart(251, t.opts.hash_seed);
    for n in 0..5u16 {
        backend_of(t, &frame([100, 1, 1, 1], 1000 + n, SYN));
    }
    assert!(t.dp.flood_status().unwrap().active, "flood mode is on");
}

/// A data plane whose flood mode is off until `flood_mode_on`.
fn no_flood_yet() -> TestDataplane {
    TestDataplane::with_flood_rate(251, 0)
}

#[test]
fn a_spoofed_syn_does_not_move_an_established_connection_in_flood_mode_or_out_of_it() {
    for flood in [false, true] {
        let mut t = no_flood_yet();
        let client = [10, 67, 5, 5];
        // Connections off their slot's first choice: placed by a skip, and (below) on a drained
        // backend, and opened under an older table.
        let mut conns = flows_off_their_slot(&mut t, client, 32000..32300);
        for sport in 33000..33100u16 {
            let b = backend_of(&mut t, &frame(client, sport, SYN));
            backend_of(&mut t, &frame(client, sport, ACK));
            conns.push((sport, b));
        }
        // Backend 11 drained, and a fourth backend: the table changes under every connection.
        let mut d = desired(true);
        d.services[0].backends.push(backend("10.67.0.14", 14));
        t.dp.apply(&d).unwrap();
        if flood {
            flood_mode_on(&mut t);
        }
        // The attacker's SYN, with each client's address and port: then the client's next
        // segments. Each stays where it was.
        for (sport, b) in &conns {
            assert_eq!(
                backend_of(&mut t, &frame(client, *sport, SYN)),
                *b,
                "flood {flood}: the spoofed SYN moved port {sport}"
            );
            assert_eq!(
                backend_of(&mut t, &frame(client, *sport, ACK)),
                *b,
                "flood {flood}: port {sport} left its backend after a spoofed SYN"
            );
        }
        // A connection whose backend left the set is not live: a SYN on its 5-tuple starts
        // anew, and its ACK follows it.
        let gone: Vec<&(u16, u8)> = conns.iter().filter(|(_, b)| *b == 12).collect();
        assert!(gone.len() > 10);
        let mut d = desired(false);
        d.services[0].backends.remove(1);
        t.dp.apply(&d).unwrap();
        for (sport, _) in gone {
            let b = backend_of(&mut t, &frame(client, *sport, SYN));
            assert_ne!(b, 12);
            assert_eq!(backend_of(&mut t, &frame(client, *sport, ACK)), b);
        }
    }
}

#[test]
fn a_reused_port_follows_its_new_syn_in_flood_mode_and_out_of_it() {
    // A client reusing a 5-tuple whose entry is still good (the old connection's backend is in
    // the set) and open (no FIN or RST of the client went through: this node cannot tell the
    // SYN from a forged one) reaches that backend again, SYN and ACK alike, in flood mode or
    // not: its stack accepts the reuse (from TIME_WAIT) or answers as RFC 5961 says, never a
    // reset by a move.
    for flood in [false, true] {
        let mut t = no_flood_yet();
        let client = [10, 67, 4, 4];
        let reused = flows_off_their_slot(&mut t, client, 31000..31300);
        // Connections on backend 11, which is drained next: a reuse of a 5-tuple whose entry
        // names it goes to it (the drain refuses new 5-tuples, not a connection's own).
        let on_11 = opened_on_11(&mut t, client, 34000..34200);
        t.dp.apply(&desired(true)).unwrap();
        if flood {
            flood_mode_on(&mut t);
        }
        for (sport, b) in &reused {
            assert_eq!(backend_of(&mut t, &frame(client, *sport, SYN)), *b);
            assert_eq!(
                backend_of(&mut t, &frame(client, *sport, ACK)),
                *b,
                "flood {flood}: the new connection's ACK left its SYN's backend"
            );
        }
        for sport in &on_11 {
            assert_eq!(backend_of(&mut t, &frame(client, *sport, SYN)), 11);
            assert_eq!(backend_of(&mut t, &frame(client, *sport, ACK)), 11);
        }
    }
}

#[test]
fn a_port_reused_after_the_clients_fin_or_rst_on_a_drained_backend_is_placed_afresh_after_the_hold()
{
    // The client closed its connection on backend 11, drained (its FIN or RST went through this
    // node, then its last ACK at the close's end), and opens a new one on the same 5-tuple, as
    // a client whose server closed first does at once. Within `FLOW_CLOSE_HOLD` of the close
    // the new SYN follows the entry to 11 (the data plane cannot tell it from a forged close
    // and SYN, which must not move a live connection), its handshake too, and it stays there;
    // after the hold it is placed like any new connection, so the drained backend gets none,
    // and its handshake follows it. In flood mode and out of it.
    let client = [10, 67, 6, 6];
    let mut cases = Vec::new();
    for flood in [false, true] {
        let mut t = no_flood_yet();
        t.dp.apply(&desired(false)).unwrap();
        let on_11 = opened_on_11(&mut t, client, 35000..35300);
        // Backend 11 drained: it keeps its connections and takes no new ones.
        t.dp.apply(&desired(true)).unwrap();
        if flood {
            flood_mode_on(&mut t);
        }
        for (i, sport) in on_11.iter().enumerate() {
            let close = [FIN | ACK, RST, RST | ACK][i % 3];
            assert_eq!(backend_of(&mut t, &frame_seq(client, *sport, ACK, 500)), 11);
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, close, 500)),
                11,
                "the client's close goes to its connection's backend"
            );
            let end = if close & FIN != 0 { 501 } else { 500 };
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, end)),
                11,
                "the closed connection's last ACK goes to its backend"
            );
        }
        let (early, late) = on_11.split_at(on_11.len() / 2);
        for sport in early {
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000)),
                11,
                "flood {flood}: a reuse of port {sport} within the hold left its entry"
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, 9001)),
                11
            );
        }
        cases.push((flood, t, early.to_vec(), late.to_vec()));
    }
    wait_out_the_close_hold();
    for (flood, mut t, early, late) in cases {
        if flood {
            flood_mode_on(&mut t);
        }
        let stale_before = counter(&t, stat::CONNTRACK_STALE);
        for sport in &late {
            let b = backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000));
            assert_ne!(
                b, 11,
                "flood {flood}: a new connection on reused port {sport} went to the drained backend after the hold"
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, 9001)),
                b,
                "flood {flood}: the new connection's ACK left its SYN's backend"
            );
            // The new connection is open: a forged or retransmitted SYN keeps it there.
            assert_eq!(backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000)), b);
            assert_eq!(backend_of(&mut t, &frame_seq(client, *sport, ACK, 9001)), b);
        }
        assert!(
            counter(&t, stat::CONNTRACK_STALE) - stale_before >= late.len() as u64,
            "each reopened 5-tuple counts as a stale entry"
        );
        // The reuses within the hold are live connections on 11: a SYN keeps them there.
        for sport in &early {
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000)),
                11
            );
        }
    }
}

#[test]
fn a_fin_for_a_flow_this_node_never_saw_is_remembered_closed() {
    // At a new VIP owner the client's FIN is the first segment seen of a connection: it goes
    // where the table says and is remembered closed, so the client's next SYN on that 5-tuple
    // after `FLOW_CLOSE_HOLD` is placed as a new connection (not sent to a drained backend's
    // old slot); within the hold it follows the entry (a forged FIN and SYN must not move a
    // connection the old owner placed there).
    let mut t = no_flood_yet();
    t.dp.apply(&desired(true)).unwrap();
    let client = [10, 67, 7, 7];
    let mut closed = Vec::new();
    for sport in 36000..36300u16 {
        if backend_of(&mut t, &frame(client, sport, FIN | ACK)) == 11 {
            closed.push(sport);
        }
    }
    assert!(closed.len() > 20, "{}", closed.len());
    let (early, late) = closed.split_at(closed.len() / 2);
    for sport in early {
        assert_eq!(backend_of(&mut t, &frame(client, *sport, SYN)), 11);
    }
    wait_out_the_close_hold();
    for sport in late {
        let n = backend_of(&mut t, &frame(client, *sport, SYN));
        assert_ne!(
            n, 11,
            "port {sport}: a new connection went to the drained backend"
        );
        assert_eq!(backend_of(&mut t, &frame(client, *sport, ACK)), n);
    }
}

#[test]
fn a_connection_placed_by_a_skip_in_flood_mode_keeps_its_backend_through_undrain_and_recovery() {
    // In flood mode a SYN on a slot whose backend takes no new flows (11 drained, or 13 failing
    // in its hold) goes elsewhere and writes no connection-table entry. When the drain ends or
    // the backend recovers, during the flood or after it, the connection's later segments and
    // the ICMP errors about it still go where its SYN went (its slot's backend would reset it).
    let client = [10, 67, 9, 9];
    let mut probe = TestDataplane::new(251);
    probe.dp.apply(&desired(false)).unwrap();
    let slot_of: Vec<(u16, u8)> = (39000..39400u16)
        .map(|p| (p, backend_of(&mut probe, &frame(client, p, ACK))))
        .collect();
    drop(probe);
    for out in [0usize, 2] {
        let victim = [11u8, 12, 13][out];
        let on_victim: Vec<u16> = slot_of
            .iter()
            .filter(|(_, b)| *b == victim)
            .map(|(p, _)| *p)
            .collect();
        assert!(on_victim.len() > 40);
        let mut t = no_flood_yet();
        let mut d = desired(false);
        if out == 0 {
            d.services[0].backends[0].drained = true;
        } else {
            d.services[0].backends[2].failing = true;
        }
        t.dp.apply(&d).unwrap();
        flood_mode_on(&mut t);
        let placed: Vec<(u16, u8)> = on_victim
            .iter()
            .map(|p| (*p, backend_of(&mut t, &frame(client, *p, SYN))))
            .collect();
        assert!(placed.iter().all(|(_, b)| *b != victim));
        // The drain ends (the backend recovers) while the flood goes on.
        t.dp.apply(&desired(false)).unwrap();
        assert!(t.dp.flood_status().unwrap().active, "flood mode is on");
        for (p, b) in &placed {
            assert_eq!(
                backend_of(&mut t, &frame(client, *p, ACK)),
                *b,
                "backend {victim} back: port {p} left its SYN's backend"
            );
            let too_big = icmp4_frag_needed([10, 67, 0, 254], VIP, client, 6443, *p);
            assert_eq!(
                backend_of(&mut t, &too_big),
                *b,
                "backend {victim} back: an ICMP error about port {p} went elsewhere"
            );
        }
        // And after the flood.
        std::thread::sleep(std::time::Duration::from_millis(
            lb_common::FLOOD_HOLD_NS / 1_000_000 + 300,
        ));
        assert!(!t.dp.flood_status().unwrap().active, "flood mode is over");
        for (p, b) in &placed {
            assert_eq!(backend_of(&mut t, &frame(client, *p, ACK)), *b);
            assert_eq!(backend_of(&mut t, &frame(client, *p, ACK)), *b);
        }
    }
}

#[test]
fn a_reopen_in_flood_mode_adds_no_connection_table_entry() {
    // A reopened 5-tuple is written in flood mode too (its handshake must follow it), but in
    // place: a closed entry found only in the flow cache (aged out of the LRU hash) must not
    // come back as an insert, which would push an established flow out.
    use aya::maps::{HashMap as BpfHashMap, Map, MapData};
    use lb_common::{FlowKey, FlowValue};
    let mut t = no_flood_yet();
    let client = [10, 67, 6, 9];
    let off = flows_off_their_slot(&mut t, client, 40000..40300);
    flood_mode_on(&mut t);
    let mut lru: BpfHashMap<MapData, FlowKey, FlowValue> = BpfHashMap::try_from(Map::LruHashMap(
        MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::CONNTRACK)).unwrap(),
    ))
    .unwrap();
    let keys: Vec<FlowKey> = lru
        .keys()
        .map(|k| k.unwrap())
        .filter(|k| k.src == [10, 67, 6, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .collect();
    assert_eq!(keys.len(), off.len());
    for (sport, b) in &off {
        assert_eq!(backend_of(&mut t, &frame(client, *sport, RST)), *b);
    }
    // Their LRU copies age out; the cache still holds them (closed).
    for k in &keys {
        lru.remove(k).unwrap();
    }
    // Their pairs take new flows: a SYN is placed afresh once the close is old enough.
    wait_out_the_close_hold();
    flood_mode_on(&mut t);
    let before = t.dp.conntrack_entries();
    for (sport, _) in &off {
        assert_eq!(backend_of(&mut t, &frame(client, *sport, SYN)), 11);
        assert_eq!(backend_of(&mut t, &frame(client, *sport, ACK)), 11);
    }
    assert_eq!(
        t.dp.conntrack_entries(),
        before,
        "reopens in flood mode added connection-table entries"
    );
}

/// Every entry of the handshake table removed, as a flood of SYNs on skipped slots leaves it
/// (an LRU of `HANDSHAKE_TABLE_SIZE` entries, churned within milliseconds).
fn churn_handshakes(t: &TestDataplane) {
    use aya::maps::{HashMap as BpfHashMap, Map, MapData};
    use lb_common::{FlowKey, FlowValue};
    let mut hs: BpfHashMap<MapData, FlowKey, FlowValue> = BpfHashMap::try_from(Map::LruHashMap(
        MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::HANDSHAKES)).unwrap(),
    ))
    .unwrap();
    let keys: Vec<FlowKey> = hs.keys().map(|k| k.unwrap()).collect();
    for k in &keys {
        hs.remove(k).unwrap();
    }
}

#[test]
fn a_connection_placed_by_a_skip_in_flood_mode_outlives_its_handshake_entry() {
    // In flood mode a SYN on a drained backend's slot goes elsewhere and is remembered only in
    // the small handshake table; its ACK moves it into the connection table. So when a flood
    // of SYNs on skipped slots has churned the handshake table, the connection's later
    // segments and the ICMP errors about it still go where its SYN went: while the backend is
    // drained, after the drain ends during the flood, and after the flood.
    let client = [10, 67, 8, 8];
    let mut probe = TestDataplane::new(251);
    probe.dp.apply(&desired(false)).unwrap();
    let on_11: Vec<u16> = (41000..41300u16)
        .filter(|p| backend_of(&mut probe, &frame(client, *p, ACK)) == 11)
        .collect();
    drop(probe);
    assert!(on_11.len() > 40);
    let mut t = no_flood_yet();
    t.dp.apply(&desired(true)).unwrap();
    flood_mode_on(&mut t);
    let placed: Vec<(u16, u8)> = on_11
        .iter()
        .map(|p| {
            let b = backend_of(&mut t, &frame(client, *p, SYN));
            assert_ne!(b, 11);
            assert_eq!(backend_of(&mut t, &frame(client, *p, ACK)), b);
            (*p, b)
        })
        .collect();
    churn_handshakes(&t);
    let check = |t: &mut TestDataplane, when: &str| {
        for (p, b) in &placed {
            assert_eq!(
                backend_of(t, &frame(client, *p, ACK)),
                *b,
                "{when}: port {p} left its SYN's backend once its handshake entry was gone"
            );
            let too_big = icmp4_frag_needed([10, 67, 0, 254], VIP, client, 6443, *p);
            assert_eq!(
                backend_of(t, &too_big),
                *b,
                "{when}: an ICMP error about port {p} went elsewhere"
            );
        }
    };
    check(&mut t, "drained, flood on");
    t.dp.apply(&desired(false)).unwrap();
    assert!(t.dp.flood_status().unwrap().active, "flood mode is on");
    check(&mut t, "undrained, flood on");
    std::thread::sleep(std::time::Duration::from_millis(
        lb_common::FLOOD_HOLD_NS / 1_000_000 + 300,
    ));
    assert!(!t.dp.flood_status().unwrap().active, "flood mode is over");
    check(&mut t, "after the flood");
}

#[test]
fn flood_mode_ends_while_a_flow_it_left_untracked_keeps_sending() {
    // A connection opened in flood mode has no entry: each of its later segments is a miss.
    // Only SYNs count while flood mode holds, so a real client's traffic does not hold it (it
    // held for as long as the client kept sending); once it ends, the flow's next segment
    // writes its entry.
    let mut t = no_flood_yet();
    t.dp.apply(&desired(false)).unwrap();
    flood_mode_on(&mut t);
    let client = [10, 67, 3, 3];
    let b = backend_of(&mut t, &frame(client, 37000, SYN));
    let until = std::time::Instant::now()
        + std::time::Duration::from_millis(lb_common::FLOOD_HOLD_NS / 1_000_000 + 600);
    let mut sent = 0u32;
    while std::time::Instant::now() < until {
        assert_eq!(backend_of(&mut t, &frame(client, 37000, ACK)), b);
        sent += 1;
    }
    assert!(sent > 100, "{sent}");
    assert!(
        !t.dp.flood_status().unwrap().active,
        "the untracked flow's own segments held flood mode"
    );
    let hits = counter(&t, stat::CONNTRACK_HIT);
    backend_of(&mut t, &frame(client, 37000, ACK));
    assert!(
        counter(&t, stat::CONNTRACK_HIT) > hits,
        "the flow has its entry after the flood"
    );
}

/// A segment of `client`'s connection from `sport` with sequence number `seq`.
fn frame_seq(src: [u8; 4], sport: u16, flags: u8, seq: u32) -> Vec<u8> {
    let mut t = tcp(sport, 6443, flags);
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    ipv4_frame(src, VIP, PROTO_TCP, &t)
}

/// Past `FLOW_CLOSE_HOLD`: a SYN on an entry closed before now is placed afresh.
fn wait_out_the_close_hold() {
    std::thread::sleep(
        std::time::Duration::from_nanos(
            (lb_common::FLOW_CLOSE_HOLD as u64 + 1) << lb_common::FLOW_CLOSE_TIME_UNIT,
        ) + std::time::Duration::from_millis(300),
    );
}

/// A forged close's sequence number: its low bits are far from the client's (1000), which a
/// real client's next segment shows (1 in 64 forged closes would have a real segment land on
/// theirs: `FLOW_CLOSE_SEQ_BITS`).
const FORGED: u32 = 0x5eed_0040;

#[test]
fn a_forged_close_and_syn_do_not_move_a_connection_off_its_slot() {
    // Connections whose entry names another backend than their slot (placed by a skip while
    // backend 11 was drained; 11 takes new flows again), each backend taking new flows. A blind
    // attacker who knows the client's address and guesses its port sends a FIN or RST (any
    // sequence number) and a SYN on the 5-tuple: the SYN follows the entry while the close is
    // younger than `FLOW_CLOSE_HOLD`; the client's next segment (its own sequence number, not
    // the forged close's) shows the close was forged and reopens the entry, so a SYN after the
    // hold does not move the connection either. In flood mode and out of it.
    for flood in [false, true] {
        let mut t = no_flood_yet();
        let client = [10, 67, 2, 2];
        let conns = flows_off_their_slot(&mut t, client, 42000..42300);
        if flood {
            flood_mode_on(&mut t);
        }
        for (i, (sport, b)) in conns.iter().enumerate() {
            let close = if i % 2 == 0 { FIN | ACK } else { RST };
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, close, FORGED)),
                *b
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, SYN, 0x0bad_0000)),
                *b,
                "flood {flood}, close {close:#x}: a forged close and SYN moved port {sport}"
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, 1000)),
                *b,
                "flood {flood}: the client's next segment left its connection's backend"
            );
        }
        wait_out_the_close_hold();
        if flood {
            flood_mode_on(&mut t);
        }
        for (sport, b) in &conns {
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, SYN, 0x0bad_0000)),
                *b,
                "flood {flood}: a SYN after the hold moved port {sport}, whose close was forged"
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, 1000)),
                *b
            );
        }
    }
}

#[test]
fn a_forged_close_and_syn_do_not_move_a_connection_off_a_drained_or_failing_backend() {
    // Connections on backend 11, which is then drained, or failing in its hold (its flows
    // held): in the set, taking no new flows. A blind attacker's FIN or RST (any sequence
    // number) and SYN on a 5-tuple: the SYN follows the entry while the close is younger than
    // `FLOW_CLOSE_HOLD`, so the connection stays on 11; the client's next segment (at its own
    // sequence number) reopens the entry, so a SYN after the hold keeps it there too. In flood
    // mode and out of it.
    let client = [10, 67, 2, 4];
    let mut cases = Vec::new();
    for failing in [false, true] {
        for flood in [false, true] {
            let mut t = no_flood_yet();
            t.dp.apply(&desired(false)).unwrap();
            let on_11 = opened_on_11(&mut t, client, 44000..44300);
            let mut d = desired(false);
            if failing {
                d.services[0].backends[0].failing = true;
            } else {
                d.services[0].backends[0].drained = true;
            }
            t.dp.apply(&d).unwrap();
            if flood {
                flood_mode_on(&mut t);
            }
            for (i, sport) in on_11.iter().enumerate() {
                let close = if i % 2 == 0 { FIN | ACK } else { RST };
                assert_eq!(
                    backend_of(&mut t, &frame_seq(client, *sport, close, FORGED)),
                    11
                );
                assert_eq!(
                    backend_of(&mut t, &frame_seq(client, *sport, SYN, 0x0bad_0000)),
                    11,
                    "failing {failing}, flood {flood}, close {close:#x}: a forged close and SYN moved port {sport} off backend 11"
                );
                assert_eq!(
                    backend_of(&mut t, &frame_seq(client, *sport, ACK, 1000)),
                    11,
                    "failing {failing}, flood {flood}: the client's next segment left backend 11"
                );
            }
            cases.push((failing, flood, t, on_11));
        }
    }
    wait_out_the_close_hold();
    for (failing, flood, mut t, on_11) in cases {
        if flood {
            flood_mode_on(&mut t);
        }
        for sport in &on_11 {
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, SYN, 0x0bad_0000)),
                11,
                "failing {failing}, flood {flood}: a SYN after the hold moved port {sport}, whose close was forged"
            );
            assert_eq!(
                backend_of(&mut t, &frame_seq(client, *sport, ACK, 1000)),
                11
            );
        }
    }
}

#[test]
fn a_port_reused_after_a_close_on_a_pair_that_takes_new_flows_is_placed_afresh_after_the_hold() {
    // The client closed (its FIN or RST, then its last ACK, at the close's sequence number) a
    // connection whose entry names another backend than its slot. A reuse of the 5-tuple within
    // `FLOW_CLOSE_HOLD` follows the entry (that backend takes new flows), its handshake too; a
    // reuse after it is placed afresh on its slot, and its handshake follows it.
    let mut t = no_flood_yet();
    let client = [10, 67, 2, 3];
    let conns = flows_off_their_slot(&mut t, client, 43000..43300);
    let (early, late) = conns.split_at(conns.len() / 2);
    for (i, (sport, b)) in conns.iter().enumerate() {
        let close = if i % 2 == 0 { FIN | ACK } else { RST };
        assert_eq!(
            backend_of(&mut t, &frame_seq(client, *sport, close, 500)),
            *b
        );
        let end = if close & FIN != 0 { 501 } else { 500 };
        assert_eq!(backend_of(&mut t, &frame_seq(client, *sport, ACK, end)), *b);
    }
    for (sport, b) in early {
        assert_eq!(
            backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000)),
            *b
        );
        assert_eq!(
            backend_of(&mut t, &frame_seq(client, *sport, ACK, 9001)),
            *b
        );
    }
    wait_out_the_close_hold();
    for (sport, _) in late {
        assert_eq!(
            backend_of(&mut t, &frame_seq(client, *sport, SYN, 9000)),
            11,
            "port {sport}: a reuse after the hold was not placed on its slot"
        );
        assert_eq!(
            backend_of(&mut t, &frame_seq(client, *sport, ACK, 9001)),
            11
        );
    }
}
