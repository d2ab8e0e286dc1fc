//! A spoofed SYN flood against the connection table (the real XDP program and the kernel's LRU
//! hash, through BPF_PROG_TEST_RUN): long-lived connections that are idle during a flood of
//! spoofed SYNs totalling 10x the table keep their entries, and so their backend, even the
//! connections of a backend drained before the flood (a lost entry would move them to another
//! backend, which resets them); real new connections made during the flood complete on one
//! backend. See docs/architecture.md ("SYN floods"). Needs root; `cargo xtask test`.

use std::net::IpAddr;

use lb_common::{PROTO_TCP, stat};
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
    untracked: u64,
}

/// Long-lived flows, a drain, the flood with real connections in it, then the long-lived flows'
/// next packets. `syn_flood_rate` 0 turns flood mode off.
fn flood_run(syn_flood_rate: u32) -> Flood {
    let mut t = TestDataplane::new(251);
    t.opts.syn_flood_rate = syn_flood_rate;
    t.restart(251, t.opts.hash_seed);
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
            &frame(src, 1024 + rng.below(60000) as u16, SYN),
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
    println!(
        "syn_flood_rate {syn_flood_rate}: {flood} spoofed SYNs ({:.0} per second through BPF_PROG_TEST_RUN) against a {TABLE}-entry table: {survived}/{LONG_LIVED} idle long-lived flows kept their backend ({on_drained} on the drained one), {lost} entries lost; {real_ok}/{real} real connections completed",
        flood as f64 / flood_secs
    );
    Flood {
        survived,
        lost,
        real_ok,
        real,
        untracked: counter(&t, stat::SYN_FLOOD_UNTRACKED),
    }
}

#[test]
fn idle_established_flows_survive_a_spoofed_syn_flood_of_ten_times_the_table() {
    let f = flood_run(lb_common::DEFAULT_SYN_FLOOD_RATE);
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
}

#[test]
fn without_flood_mode_the_flood_evicts_established_flows() {
    // The control: the kernel's LRU alone does not keep idle established entries through a
    // flood of 10x the table (why flood mode exists; if this ever stops losing entries, the
    // test above proves less than it claims).
    let f = flood_run(0);
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
    let mut t = TestDataplane::new(251);
    t.opts.syn_flood_rate = 10;
    t.restart(251, t.opts.hash_seed);
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

#[test]
fn a_reused_port_in_flood_mode_follows_its_new_syn_not_the_old_connections_entry() {
    // Entries that differ from the table: flows whose slot is backend 11 opened while it was
    // drained went to other backends, and their entries stay after it takes new flows again.
    let mut t = TestDataplane::new(251);
    t.opts.syn_flood_rate = 10;
    t.restart(251, t.opts.hash_seed);
    t.dp.apply(&desired(false)).unwrap();
    let client = [10, 67, 4, 4];
    let on_11: Vec<u16> = (31000..31300u16)
        .filter(|sport| {
            // A mid-flow packet without an entry goes to its slot (and writes the entry, which
            // the SYN below replaces).
            backend_of(&mut t, &frame(client, *sport, ACK)) == 11
        })
        .collect();
    assert!(on_11.len() > 40, "flows on backend 11: {}", on_11.len());
    std::thread::sleep(std::time::Duration::from_millis(
        lb_common::FLOOD_HOLD_NS / 1_000_000 + 300,
    ));
    t.dp.apply(&desired(true)).unwrap();
    let reused = &on_11[..12];
    for sport in reused {
        // One SYN per 100 ms window: below the flood threshold, so the SYN writes its entry.
        assert_ne!(backend_of(&mut t, &frame(client, *sport, SYN)), 11);
        assert!(!t.dp.flood_status().unwrap().active);
        std::thread::sleep(std::time::Duration::from_millis(105));
    }
    t.dp.apply(&desired(false)).unwrap();
    // Flood mode, and the client reuses those ports: each new SYN goes to the slot's backend
    // (11 again) without an entry, and its ACK must follow it, not the old entry.
    for n in 0..5u16 {
        backend_of(&mut t, &frame([100, 1, 1, 1], 1000 + n, SYN));
    }
    assert!(t.dp.flood_status().unwrap().active, "flood mode is on");
    for sport in reused {
        assert_eq!(backend_of(&mut t, &frame(client, *sport, SYN)), 11);
        assert_eq!(
            backend_of(&mut t, &frame(client, *sport, ACK)),
            11,
            "the new connection's ACK went to the old connection's backend"
        );
    }
}
