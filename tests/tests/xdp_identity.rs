//! Connection-table entries cannot outlive what they name: after any sequence of service
//! creation, removal, re-creation, backend id reuse, MAC changes and restarts with changed
//! settings, an entry never sends a packet to a backend of another VIP or one its VIP no longer
//! has. Also: a failing backend's flows move without a drop, and the loop guard. Real XDP program
//! through BPF_PROG_TEST_RUN; run through `cargo xtask test` (single-threaded).

use std::{collections::HashMap, net::IpAddr};

use lb_common::{PROTO_TCP, stat};
use lb_tests::{TestDataplane, backend, frames::*, xdp_fuzz::Rng};
use lb_userspace::dataplane::{BackendSpec, Desired, ServiceSpec, vip_key};

const PASS: u32 = 2;
const TX: u32 = 3;
const CLIENT: [u8; 4] = [10, 66, 0, 1];

fn vip(n: u8) -> [u8; 4] {
    [10, 66, 1, n]
}

fn counter(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

/// One service of the model: VIP `n`, port 6443, and its backends (address last byte -> MAC).
#[derive(Clone)]
struct Svc {
    n: u8,
    owned: bool,
    backends: Vec<BackendSpec>,
}

fn spec(s: &Svc) -> ServiceSpec {
    ServiceSpec {
        key: vip_key(IpAddr::from(vip(s.n)), 6443, PROTO_TCP),
        owned: s.owned,
        backends: s.backends.clone(),
    }
}

fn apply(t: &mut TestDataplane, model: &HashMap<u8, Svc>) {
    let mut services: Vec<ServiceSpec> = model.values().map(spec).collect();
    services.sort_by_key(|s| s.key.addr);
    t.dp.apply(&Desired {
        services,
        ..Default::default()
    })
    .unwrap();
}

fn ack(n: u8, sport: u16) -> Vec<u8> {
    ipv4_frame(CLIENT, vip(n), PROTO_TCP, &tcp(sport, 6443, ACK))
}

/// A backend with a MAC that names its service and a version: 02:b0:<vip>:<addr>:<ver>:00.
fn be(n: u8, addr: u8, ver: u8) -> BackendSpec {
    let mut b = backend(&format!("10.66.{n}.{addr}"), 0);
    b.mac = Some([0x02, 0xb0, n, addr, ver, 0]);
    b
}

/// Every open flow: where its packets may go now, by the model alone.
fn check_flows(t: &mut TestDataplane, model: &HashMap<u8, Svc>, flows: &[(u8, u16)], step: &str) {
    for &(n, sport) in flows {
        let f = ack(n, sport);
        let (v, out, _) = t.dp.test_run("lb_xdp", &f, 1).unwrap();
        let Some(s) = model.get(&n).filter(|s| s.owned) else {
            assert_ne!(
                v, TX,
                "{step}: flow to removed or unowned VIP {n} forwarded"
            );
            continue;
        };
        if v == TX {
            let dst: [u8; 6] = out[0..6].try_into().unwrap();
            assert!(
                s.backends.iter().any(|b| b.in_set() && b.mac == Some(dst)),
                "{step}: flow {sport} of VIP {n} sent to {dst:02x?}, not an in-set backend of it"
            );
        }
    }
}

#[test]
fn entries_never_outlive_what_they_name() {
    // A small table keeps thousands of applies fast.
    let mut t = TestDataplane::new(13);
    let mut rng = Rng::new(0xe90c);
    let mut model: HashMap<u8, Svc> = HashMap::new();
    let mut flows: Vec<(u8, u16)> = Vec::new();
    let mut ver = 0u8;

    // Use up the never-used backend ids so that every later pair reuses a freed id.
    for round in 0..5u8 {
        let scratch = Svc {
            n: 200,
            owned: true,
            backends: (0..250).map(|a| be(200 + round, a, 0)).collect(),
        };
        let mut m = model.clone();
        m.insert(200, scratch.clone());
        for chunk in 0..4u8 {
            let mut s = scratch.clone();
            s.backends = (0..250).map(|a| be(200 + round, a, chunk + 1)).collect();
            for b in &mut s.backends {
                b.addr = format!("10.{}.{chunk}.{}", 100 + round, b.mac.unwrap()[3])
                    .parse()
                    .unwrap();
            }
            m.insert(200, s);
            apply(&mut t, &m);
        }
        apply(&mut t, &model);
    }

    for step in 0..400 {
        let n = 1 + rng.below(4) as u8;
        let what = rng.below(9);
        let name = format!("step {step} op {what} vip {n}");
        match what {
            // Create or re-create a service with 1-4 backends (new addresses each time).
            0 | 1 => {
                ver = ver.wrapping_add(1);
                let k = 1 + rng.below(4);
                let backends = (0..k)
                    .map(|i| be(n, (ver % 50) * 4 + i as u8, ver))
                    .collect();
                model.insert(
                    n,
                    Svc {
                        n,
                        owned: true,
                        backends,
                    },
                );
            }
            2 => {
                model.remove(&n);
            }
            // A backend fails or recovers.
            3 => {
                if let Some(s) = model.get_mut(&n) {
                    let i = rng.below(s.backends.len());
                    s.backends[i].healthy = !s.backends[i].healthy;
                }
            }
            // A backend's MAC changes (a new NIC, a moved VM).
            4 => {
                if let Some(s) = model.get_mut(&n) {
                    let i = rng.below(s.backends.len());
                    let mac = s.backends[i].mac.as_mut().unwrap();
                    mac[5] = mac[5].wrapping_add(1);
                }
            }
            5 => {
                if let Some(s) = model.get_mut(&n) {
                    s.owned = !s.owned;
                }
            }
            // A restart of lbd, with the same or with other settings.
            6 => {
                let (size, seed) = [(13, 0x1b_5eed), (13, 7), (17, 7)][rng.below(3)];
                t.restart(size, seed);
            }
            // New flows.
            _ => {
                for _ in 0..8 {
                    let sport = 1024 + rng.below(60000) as u16;
                    let syn = ipv4_frame(CLIENT, vip(n), PROTO_TCP, &tcp(sport, 6443, SYN));
                    t.dp.test_run("lb_xdp", &syn, 1).unwrap();
                    flows.push((n, sport));
                }
            }
        }
        apply(&mut t, &model);
        check_flows(&mut t, &model, &flows, &name);
    }
    assert!(flows.len() > 100, "the sequence opened flows");
    assert!(
        counter(&t, stat::CONNTRACK_STALE) > 0,
        "some entries went stale"
    );
}

#[test]
fn a_restart_with_the_same_settings_keeps_every_flow_on_its_backend() {
    let mut t = TestDataplane::new(251);
    let s = Svc {
        n: 1,
        owned: true,
        backends: (1..=4).map(|a| be(1, a, 0)).collect(),
    };
    let model = HashMap::from([(1, s.clone())]);
    apply(&mut t, &model);
    let mut before = Vec::new();
    for sport in 30000..30200u16 {
        let syn = ipv4_frame(CLIENT, vip(1), PROTO_TCP, &tcp(sport, 6443, SYN));
        before.push(t.dp.test_run("lb_xdp", &syn, 1).unwrap().1[0..6].to_vec());
    }
    // Grow the set so the table differs from what a fresh hash would give for some flows.
    let mut grown = s.clone();
    grown.backends.push(be(1, 5, 0));
    let model = HashMap::from([(1, grown)]);
    apply(&mut t, &model);
    t.restart(251, 0x1b_5eed);
    apply(&mut t, &model);
    for (i, sport) in (30000..30200u16).enumerate() {
        let (v, out, _) = t.dp.test_run("lb_xdp", &ack(1, sport), 1).unwrap();
        assert_eq!(v, TX);
        assert_eq!(
            out[0..6],
            before[i][..],
            "flow {sport} moved across a restart"
        );
    }
}

#[test]
fn a_mac_change_is_a_new_pair_and_flows_follow_it() {
    let mut t = TestDataplane::new(251);
    let s = Svc {
        n: 2,
        owned: true,
        backends: (1..=3).map(|a| be(2, a, 0)).collect(),
    };
    let mut model = HashMap::from([(2, s.clone())]);
    apply(&mut t, &model);
    let key = spec(&s).key;
    let ids_before: Vec<u32> = t.dp.installed(&key).iter().map(|b| b.id).collect();
    let mut on_first = Vec::new();
    for sport in 31000..31100u16 {
        let syn = ipv4_frame(CLIENT, vip(2), PROTO_TCP, &tcp(sport, 6443, SYN));
        if t.dp.test_run("lb_xdp", &syn, 1).unwrap().1[3] == 1 {
            on_first.push(sport);
        }
    }
    assert!(!on_first.is_empty());
    let m = model.get_mut(&2).unwrap();
    m.backends[0].mac = Some([0x02, 0xb0, 2, 1, 9, 0]);
    apply(&mut t, &model);
    let installed = t.dp.installed(&key);
    let moved = installed
        .iter()
        .find(|b| b.spec.addr == s.backends[0].addr)
        .unwrap();
    assert!(
        !ids_before.contains(&moved.id),
        "a MAC change installs a new pair (the old slot is never rewritten in place)"
    );
    for sport in on_first {
        let (v, out, _) = t.dp.test_run("lb_xdp", &ack(2, sport), 1).unwrap();
        assert_eq!(v, TX);
        assert_eq!(
            out[0..6],
            [0x02, 0xb0, 2, 1, 9, 0],
            "flow {sport} follows the new MAC"
        );
    }
}

#[test]
fn a_failing_backends_flows_move_without_a_drop() {
    let mut t = TestDataplane::new(251);
    let s = Svc {
        n: 3,
        owned: true,
        backends: (1..=3).map(|a| be(3, a, 0)).collect(),
    };
    let mut model = HashMap::from([(3, s.clone())]);
    apply(&mut t, &model);
    let mut on_first = Vec::new();
    for sport in 32000..32400u16 {
        let syn = ipv4_frame(CLIENT, vip(3), PROTO_TCP, &tcp(sport, 6443, SYN));
        if t.dp.test_run("lb_xdp", &syn, 1).unwrap().1[3] == 1 {
            on_first.push(sport);
        }
    }
    // Packets of those flows run on another instance of the program, on the same maps, while
    // the backend fails and recovers over and over.
    let mut reader = t.second_instance();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let flows = on_first.clone();
    let packets = std::thread::spawn(move || {
        let mut verdicts: HashMap<u32, u64> = HashMap::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            // ACKs follow entries; SYNs always take the Maglev table (a slot naming a backend
            // already out of the set would drop them).
            for sport in &flows {
                let syn = ipv4_frame(CLIENT, vip(3), PROTO_TCP, &tcp(*sport, 6443, SYN));
                for f in [ack(3, *sport), syn] {
                    let (v, _, _) = reader.test_run("lb_xdp", &f, 1).unwrap();
                    *verdicts.entry(v).or_default() += 1;
                }
            }
        }
        verdicts
    });
    for i in 0..300 {
        model.get_mut(&3).unwrap().backends[0].healthy = i % 2 == 1;
        apply(&mut t, &model);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let verdicts = packets.join().unwrap();
    assert!(
        verdicts.get(&TX).copied().unwrap_or(0) > 1000,
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts.len(),
        1,
        "every packet forwarded, none dropped or passed: {verdicts:?}"
    );
    assert_eq!(counter(&t, stat::DROP_BAD_BACKEND), 0);
}

#[test]
fn a_syn_crosses_two_nodes_whose_tables_disagree_at_most_once() {
    // Two LB nodes, each the other's backend (their tables disagree on purpose: each sends the
    // flow to the other), each knowing the other's MAC as a peer.
    const A: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
    const B: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 2];
    let node = |me: [u8; 6], other: [u8; 6]| {
        let mut t = TestDataplane::new(251);
        let mut b = backend("10.66.9.9", 0);
        b.mac = Some(other);
        b.src_mac = me;
        t.dp.apply(&Desired {
            services: vec![ServiceSpec {
                key: vip_key(IpAddr::from(vip(9)), 6443, PROTO_TCP),
                owned: true,
                backends: vec![b],
            }],
            peers: vec![other],
        })
        .unwrap();
        t
    };
    let mut a = node(A, B);
    let mut b = node(B, A);
    let mut frame = ipv4_frame(CLIENT, vip(9), PROTO_TCP, &tcp(33000, 6443, SYN));
    let mut forwards = 0;
    for hop in 0..6 {
        let t = if hop % 2 == 0 { &mut a } else { &mut b };
        let (v, out, _) = t.dp.test_run("lb_xdp", &frame, 1).unwrap();
        if v != TX {
            assert_eq!(v, PASS, "the second node gives it to its local stack");
            assert_eq!(counter(t, stat::PASS_FROM_PEER), 1);
            break;
        }
        forwards += 1;
        frame = out;
    }
    assert_eq!(forwards, 1, "the SYN was forwarded {forwards} times");
    // The same frame from the client (not a peer) is forwarded by either node.
    let fresh = ipv4_frame(CLIENT, vip(9), PROTO_TCP, &tcp(33001, 6443, SYN));
    assert_eq!(b.dp.test_run("lb_xdp", &fresh, 1).unwrap().0, TX);
}

#[test]
fn adoption_retires_pairs_of_a_service_whose_removal_a_crash_cut_short() {
    // Two services; service 2 has an open flow. lbd is killed in the middle of removing
    // service 2: its VIP entry is gone, its ownership and pairs are not. The next lbd adopts
    // what is pinned and then creates service 3, which gets service 2's VIP id. The old flow's
    // packets (to service 2's VIP, which no longer exists) are not a VIP's: passed, never sent
    // to service 2's old backend.
    let mut t = TestDataplane::new(251);
    let mut model: HashMap<u8, Svc> = HashMap::new();
    for n in [1, 2] {
        model.insert(
            n,
            Svc {
                n,
                owned: true,
                backends: vec![be(n, 11, 0), be(n, 12, 0), be(n, 13, 0)],
            },
        );
    }
    apply(&mut t, &model);
    let old_id =
        t.dp.vip_id(&spec(&model[&2]).key)
            .expect("service 2 installed");
    let flows: Vec<u16> = (50000..50020).collect();
    for sport in &flows {
        let (v, _, _) = t.dp.test_run("lb_xdp", &ack(2, *sport), 1).unwrap();
        assert_eq!(v, TX);
    }
    // The crash: only the first step of `remove_service` happened.
    {
        let pinned =
            aya::maps::MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::VIPS)).unwrap();
        let mut vips: aya::maps::HashMap<_, lb_common::VipKey, lb_common::VipInfo> =
            aya::maps::HashMap::try_from(aya::maps::Map::HashMap(pinned)).unwrap();
        vips.remove(&spec(&model[&2]).key).unwrap();
    }
    t.restart(251, t.opts.hash_seed);
    model.remove(&2);
    // Service 3: another port of the same address (so the address stays a VIP's).
    let key3 = vip_key(IpAddr::from(vip(2)), 6444, PROTO_TCP);
    t.dp.apply(&Desired {
        services: vec![
            spec(&model[&1]),
            ServiceSpec {
                key: key3,
                owned: true,
                backends: vec![be(3, 21, 0)],
            },
        ],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        t.dp.vip_id(&key3),
        Some(old_id),
        "the test needs service 3 on service 2's old VIP id"
    );
    for sport in &flows {
        let (v, out, _) = t.dp.test_run("lb_xdp", &ack(2, *sport), 1).unwrap();
        assert_eq!(
            (v, &out[0..6]),
            (PASS, &ack(2, *sport)[0..6]),
            "a flow of the removed service 2 was forwarded"
        );
    }
    assert!(counter(&t, stat::PASS_NOT_VIP) >= flows.len() as u64);
}

#[test]
fn a_reader_on_another_cpu_never_forwards_with_a_half_retired_pair() {
    // Pairs retired, re-created and moved over and over while another CPU forwards established
    // flows of them: every frame it sends goes to one of the pairs' own addresses (on-link MACs, or
    // a routed backend's next hop and outer addresses), never to a zeroed MAC or 0.0.0.0.
    lb_tests::xdp::assert_two_cpus();
    let mut t = TestDataplane::new(251);
    let key = vip_key(IpAddr::from(vip(9)), 6443, PROTO_TCP);
    let lb_src: IpAddr = "10.66.0.250".parse().unwrap();
    let pairs = |with: &[u8], ver: u8| {
        let mut backends = Vec::new();
        for a in with {
            let mut b = be(9, *a, ver);
            if *a >= 20 {
                b.encap = Some(lb_userspace::dataplane::Encap {
                    src: lb_src,
                    mtu: 1500,
                });
            }
            backends.push(b);
        }
        Desired {
            services: vec![ServiceSpec {
                key,
                owned: true,
                backends,
            }],
            ..Default::default()
        }
    };
    let all = [11u8, 12, 21, 22];
    t.dp.apply(&pairs(&all, 0)).unwrap();
    // A retirement clears the pair's epoch and its flags but the addressing ones, and nothing
    // else.
    let slots = || {
        let pinned =
            aya::maps::MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::BACKENDS)).unwrap();
        let a: aya::maps::Array<_, lb_common::BackendInfo> =
            aya::maps::Array::try_from(aya::maps::Map::Array(pinned)).unwrap();
        (0..16).map(|i| a.get(&i, 0).unwrap()).collect::<Vec<_>>()
    };
    let before = slots();
    let ids: Vec<u32> = t.dp.installed(&key).iter().map(|b| b.id).collect();
    t.dp.apply(&pairs(&[12, 22], 0)).unwrap();
    let after = slots();
    for id in ids.iter().map(|i| *i as usize) {
        let (b, a) = (before[id], after[id]);
        if [11, 21].contains(&b.addr[3]) {
            assert_eq!(
                (a.flags, a.epoch),
                (b.flags & lb_common::BACKEND_F_ADDRESSING, 0),
                "retired"
            );
            assert!(a.is_vacant());
            assert_eq!(
                lb_common::BackendInfo {
                    flags: b.flags,
                    epoch: b.epoch,
                    ..a
                },
                b,
                "a retirement changed the addressing of pair {id}"
            );
        } else {
            assert_eq!(a, b);
        }
    }
    t.dp.apply(&pairs(&all, 0)).unwrap();
    let frames: Vec<Vec<u8>> = (52000..52064).map(|p| ack(9, p)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let mut dp = t.second_instance();
        let stop = stop.clone();
        let frames = frames.clone();
        std::thread::spawn(move || {
            lb_tests::xdp::pin_to_cpu(1);
            let (mut runs, mut bad) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for f in &frames {
                    let (v, out, _) = dp.test_run("lb_xdp", f, 1).unwrap();
                    runs += 1;
                    if v != TX {
                        continue;
                    }
                    let ok = if out.len() == f.len() {
                        // On-link: 02:b0:09:<addr>:00:00 from the LB's MAC.
                        out[0..4] == [0x02, 0xb0, 9, out[3]]
                            && [11, 12].contains(&out[3])
                            && out[6..12] == LB_MAC
                    } else {
                        // Routed: to the next hop of 21 or 22, outer 10.66.0.250 -> 10.66.9.x.
                        out.len() == f.len() + 20
                            && [21, 22].contains(&out[3])
                            && out[0..4] == [0x02, 0xb0, 9, out[3]]
                            && out[26..30] == [10, 66, 0, 250]
                            && out[30..34] == [10, 66, 9, out[3]]
                    };
                    if !ok && bad.len() < 5 {
                        bad.push(out[0..34.min(out.len())].to_vec());
                    }
                }
            }
            (runs, bad)
        })
    };
    lb_tests::xdp::pin_to_cpu(0);
    // Each round retires two pairs (one on-link, one routed) and brings them back as new
    // pairs, and moves the other two (their MACs change: new slots, the old ones pointed at
    // them).
    for round in 0..3000 {
        let (a, b) = if round % 2 == 0 { (11, 21) } else { (12, 22) };
        let rest: Vec<u8> = all.iter().copied().filter(|x| *x != a && *x != b).collect();
        let ver = (round % 2) as u8;
        t.dp.apply(&pairs(&rest, ver)).unwrap();
        t.dp.apply(&pairs(&all, ver)).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (runs, bad) = reader.join().unwrap();
    println!("{runs} packets forwarded on CPU 1 during 6000 retirements on CPU 0");
    assert!(runs > 10_000, "the reader ran: {runs}");
    assert!(
        bad.is_empty(),
        "frames sent with torn addressing: {bad:02x?}"
    );
}

#[test]
fn a_retirement_between_two_reads_of_the_flags_keeps_the_way_out() {
    // The program reads a slot's flags more than once for one packet (is the entry's pair good,
    // then local, routed or on-link). One routed pair and one local pair are retired (the value
    // `retire` writes: `lb_common::retired_flags`, epoch 0) and restored in a tight loop on one
    // CPU while another forwards their flows: a routed pair's frame always leaves wrapped to its
    // next hop, a local pair's never leaves at all. (With the flags cleared to 0, a retirement
    // between the two reads sent routed frames unwrapped to the next hop's MAC, and local ones
    // out to a zero MAC.)
    lb_tests::xdp::assert_two_cpus();
    let mut t = TestDataplane::new(251);
    let routed_key = vip_key(IpAddr::from(vip(10)), 6443, PROTO_TCP);
    let local_key = vip_key(IpAddr::from(vip(11)), 6443, PROTO_TCP);
    let mut routed = be(10, 22, 0);
    routed.encap = Some(lb_userspace::dataplane::Encap {
        src: "10.66.0.250".parse().unwrap(),
        mtu: 1500,
    });
    let mut local = backend("10.66.11.1", 0);
    (local.mac, local.local) = (None, true);
    t.dp.apply(&Desired {
        services: vec![
            ServiceSpec {
                key: routed_key,
                owned: true,
                backends: vec![routed],
            },
            ServiceSpec {
                key: local_key,
                owned: true,
                backends: vec![local],
            },
        ],
        ..Default::default()
    })
    .unwrap();
    let frames: Vec<(u8, Vec<u8>)> = (53000..53032)
        .flat_map(|p| [(10, ack(10, p)), (11, ack(11, p))])
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let mut dp = t.second_instance();
        let stop = stop.clone();
        std::thread::spawn(move || {
            lb_tests::xdp::pin_to_cpu(1);
            let (mut wrapped, mut passed, mut bad) = (0u64, 0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (n, f) in &frames {
                    let (v, out, _) = dp.test_run("lb_xdp", f, 1).unwrap();
                    let ok = match (n, v) {
                        (10, TX) => {
                            wrapped += 1;
                            out.len() == f.len() + 20
                                && out[0..6] == [0x02, 0xb0, 10, 22, 0, 0]
                                && out[26..30] == [10, 66, 0, 250]
                                && out[30..34] == [10, 66, 10, 22]
                        }
                        (11, PASS) => {
                            passed += 1;
                            out == *f
                        }
                        (11, TX) => false,
                        _ => true,
                    };
                    if !ok && bad.len() < 5 {
                        bad.push((*n, v, out[0..34.min(out.len())].to_vec()));
                    }
                }
            }
            (wrapped, passed, bad)
        })
    };
    lb_tests::xdp::pin_to_cpu(0);
    let pinned =
        aya::maps::MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::BACKENDS)).unwrap();
    let mut slots: aya::maps::Array<_, lb_common::BackendInfo> =
        aya::maps::Array::try_from(aya::maps::Map::Array(pinned)).unwrap();
    let live: Vec<(u32, lb_common::BackendInfo)> = [routed_key, local_key]
        .iter()
        .map(|k| {
            let id = t.dp.installed(k)[0].id;
            (id, slots.get(&id, 0).unwrap())
        })
        .collect();
    for _ in 0..50_000 {
        for (id, b) in &live {
            let retired = lb_common::BackendInfo {
                flags: lb_common::retired_flags(b.flags),
                epoch: 0,
                ..*b
            };
            slots.set(*id, retired, 0).unwrap();
            slots.set(*id, *b, 0).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (wrapped, passed, bad) = reader.join().unwrap();
    println!("{wrapped} frames wrapped and {passed} passed locally during 100,000 retirements");
    assert!(
        wrapped > 1_000 && passed > 1_000,
        "the reader forwarded: {wrapped} wrapped, {passed} passed"
    );
    assert!(
        bad.is_empty(),
        "frames sent another way than their pair's (VIP, verdict, first bytes): {bad:02x?}"
    );
}

#[test]
fn an_addressing_change_keeps_the_pairs_identity_and_its_flows() {
    // Backend 1 drained: flows whose slot is its went to another backend by a skip. Backend 2's
    // MAC changes (twice, then lbd restarts): every flow on backend 2, those placed by the skip
    // included, stays on it, at its new MAC. (Re-hashed, the skipped ones would go to their
    // slot's backend, 1.)
    let model = |drain: bool, ver: u8| {
        let mut backends: Vec<BackendSpec> = (1..=3).map(|a| be(4, a, 0)).collect();
        backends[0].drained = drain;
        backends[1].mac = Some([0x02, 0xb0, 4, 2, ver, 0]);
        HashMap::from([(
            4,
            Svc {
                n: 4,
                owned: true,
                backends,
            },
        )])
    };
    let slot_is_1: Vec<u16> = {
        let mut probe = TestDataplane::new(251);
        apply(&mut probe, &model(false, 0));
        (36000..36600u16)
            .filter(|p| probe.dp.test_run("lb_xdp", &ack(4, *p), 1).unwrap().1[3] == 1)
            .collect()
    };
    let mut t = TestDataplane::new(251);
    apply(&mut t, &model(true, 0));
    let mut on_2 = Vec::new();
    let mut skipped_to_2 = 0;
    for sport in 36000..36600u16 {
        let syn = ipv4_frame(CLIENT, vip(4), PROTO_TCP, &tcp(sport, 6443, SYN));
        let (v, out, _) = t.dp.test_run("lb_xdp", &syn, 1).unwrap();
        assert_eq!(v, TX);
        assert_ne!(out[3], 1, "a new flow went to the drained backend");
        if out[3] == 2 {
            on_2.push(sport);
            skipped_to_2 += slot_is_1.contains(&sport) as usize;
        }
    }
    assert!(skipped_to_2 > 10, "flows on 2 by a skip: {skipped_to_2}");
    let key = spec(&model(true, 0)[&4]).key;
    let epoch = |t: &TestDataplane| {
        t.dp.installed(&key)
            .into_iter()
            .find(|b| b.spec.addr == be(4, 2, 0).addr)
            .unwrap()
            .epoch
    };
    let first = epoch(&t);
    for (ver, restart) in [(1u8, false), (2, false), (2, true)] {
        apply(&mut t, &model(true, ver));
        if restart {
            t.restart(251, t.opts.hash_seed);
            apply(&mut t, &model(true, ver));
        }
        for sport in &on_2 {
            let (v, out, _) = t.dp.test_run("lb_xdp", &ack(4, *sport), 1).unwrap();
            assert_eq!(
                (v, &out[0..6]),
                (TX, &[0x02, 0xb0, 4, 2, ver, 0][..]),
                "flow {sport} left backend 2 after its MAC changed to version {ver} (restart {restart})"
            );
        }
        assert_eq!(epoch(&t), first, "the pair keeps its identity");
    }
}
