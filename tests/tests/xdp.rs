//! The XDP program run by the real kernel on hand-built frames (BPF_PROG_TEST_RUN).
//! Needs root; run through `cargo xtask test` (single-threaded).

use std::net::IpAddr;

use lb_common::{FlowKey, PROTO_TCP, PROTO_UDP, flow_hash, stat};
use lb_tests::{TestDataplane, backend, frames::*};
use lb_userspace::{
    dataplane::{BackendSpec, Desired, ServiceSpec, addr_bytes, vip_key},
    maglev,
};

// XDP verdicts (uapi/linux/bpf.h).
const DROP: u32 = 1;
const PASS: u32 = 2;
const TX: u32 = 3;

const VIP: [u8; 4] = [10, 77, 0, 100];
const CLIENT: [u8; 4] = [10, 77, 0, 1];
const VIP6: &str = "fd77::100";
const CLIENT6: &str = "fd77::1";
const SIZE: u32 = 65537;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn service(addr: IpAddr, port: u16, proto: u8, backends: Vec<BackendSpec>) -> ServiceSpec {
    ServiceSpec {
        key: vip_key(addr, port, proto),
        owned: true,
        backends,
    }
}

fn three() -> Vec<BackendSpec> {
    vec![
        backend("10.77.0.11", 11),
        backend("10.77.0.12", 12),
        backend("10.77.0.13", 13),
    ]
}

fn setup(services: Vec<ServiceSpec>) -> TestDataplane {
    let mut t = TestDataplane::new(SIZE);
    t.dp.apply(&Desired {
        services,
        ..Default::default()
    })
    .unwrap();
    t
}

fn counter(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

/// The backend MAC the Maglev table gives for this flow (what the XDP program must pick).
fn expected_mac(t: &TestDataplane, key: &FlowKey, svc: &ServiceSpec) -> [u8; 6] {
    let installed = t.dp.installed(&svc.key);
    let entries: Vec<maglev::Entry> = installed
        .iter()
        .filter(|b| b.spec.in_table())
        .map(|b| maglev::Entry {
            addr: b.spec.addr,
            weight: b.spec.weight,
            id: b.id,
        })
        .collect();
    let table = maglev::build(&entries, SIZE);
    let id = table[(flow_hash(key, 0x1b_5eed) % SIZE) as usize];
    installed
        .iter()
        .find(|b| b.id == id)
        .unwrap()
        .spec
        .mac
        .unwrap()
}

fn flow4(sport: u16, dport: u16, proto: u8) -> FlowKey {
    let mut k = FlowKey {
        sport,
        dport,
        proto,
        family: 4,
        ..Default::default()
    };
    k.src[..4].copy_from_slice(&CLIENT);
    k.dst[..4].copy_from_slice(&VIP);
    k
}

fn run(t: &mut TestDataplane, frame: &[u8]) -> (u32, Vec<u8>) {
    let (v, out, _) = t.dp.test_run("lb_xdp", frame, 1).unwrap();
    (v, out)
}

/// Open an IPv4 TCP flow to VIP:6443: the SYN, then the handshake's ACK. Returns the ACK's
/// output frame.
fn open(t: &mut TestDataplane, sport: u16) -> Vec<u8> {
    let (_, syn_out) = run(
        t,
        &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN)),
    );
    let (v, out) = run(
        t,
        &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, ACK)),
    );
    assert_eq!(v, TX);
    assert_eq!(
        syn_out[0..6],
        out[0..6],
        "SYN and ACK of one flow go to one backend"
    );
    out
}

/// Forwarded: only the MACs changed, to the backend's and the interface's.
fn assert_forwarded(input: &[u8], out: &[u8], mac: [u8; 6]) {
    assert_eq!(&out[0..6], &mac, "destination MAC is the backend's");
    assert_eq!(&out[6..12], &LB_MAC, "source MAC is the egress interface's");
    assert_eq!(
        &out[12..],
        &input[12..],
        "nothing after the Ethernet addresses changes"
    );
}

#[test]
fn non_vip_traffic_passes_untouched() {
    let mut t = setup(vec![service(IpAddr::from(VIP), 6443, PROTO_TCP, three())]);
    let cases = [
        ipv4_frame(CLIENT, [10, 77, 0, 99], PROTO_TCP, &tcp(40000, 6443, SYN)),
        ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 22, SYN)), // VIP address, other port
        ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(40000, 6443, 4)), // other protocol
        {
            let mut arp = vec![0u8; 42];
            arp[12] = 0x08;
            arp[13] = 0x06;
            arp
        },
    ];
    for f in &cases {
        let (v, out) = run(&mut t, f);
        assert_eq!(v, PASS);
        assert_eq!(&out, f, "passed frames are not modified");
    }
    assert_eq!(counter(&t, stat::PASS_NOT_VIP), cases.len() as u64);
    assert_eq!(counter(&t, stat::FORWARDED), 0);
}

#[test]
fn tcp_syn_to_vip_is_forwarded_with_only_macs_changed() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let mut seen = std::collections::HashSet::new();
    for sport in 40000..40050u16 {
        let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN));
        let (v, out) = run(&mut t, &f);
        assert_eq!(v, TX);
        let mac = expected_mac(&t, &flow4(sport, 6443, PROTO_TCP), &svc);
        assert_forwarded(&f, &out, mac);
        seen.insert(mac);
    }
    assert_eq!(seen.len(), 3, "50 flows reach all three backends");
    // Each SYN is a new connection: it writes its connection-table entry at once, so the rest
    // of the handshake follows it even if the table changes meanwhile.
    assert_eq!(counter(&t, stat::CONNTRACK_MISS), 50);
    assert_eq!(t.dp.conntrack_entries(), 50);
    for sport in 40000..40050u16 {
        let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, ACK));
        assert_eq!(run(&mut t, &f).0, TX);
    }
    assert_eq!(counter(&t, stat::CONNTRACK_HIT), 50);
    let vip_id = t.dp.vip_id(&svc.key).unwrap();
    let traffic = t.dp.vip_traffic(vip_id).unwrap();
    assert_eq!((traffic.packets, traffic.new_flows), (100, 50));
    let per_backend: u64 =
        t.dp.installed(&svc.key)
            .iter()
            .map(|b| t.dp.backend_traffic(b.id).unwrap().packets)
            .sum();
    assert_eq!(per_backend, 100);
}

/// The program counts a forwarded packet once, in its pair's counters; a VIP's counters are its
/// pairs' summed by user space, and what a removed backend counted stays in its VIP's totals.
#[test]
fn a_vips_counters_keep_what_a_removed_backend_counted() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let vip_id = t.dp.vip_id(&svc.key).unwrap();
    for sport in 41000..41060u16 {
        for flags in [SYN, ACK, ACK] {
            let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, flags));
            assert_eq!(run(&mut t, &f).0, TX);
        }
    }
    let before = t.dp.vip_traffic(vip_id).unwrap();
    assert_eq!((before.packets, before.new_flows), (180, 60));
    let installed = t.dp.installed(&svc.key);
    let gone = installed
        .iter()
        .find(|b| b.spec.mac.unwrap()[5] == 11)
        .unwrap();
    assert!(t.dp.backend_traffic(gone.id).unwrap().packets > 0);
    // Backend 11 leaves; its id is free for reuse, its counters stay with the VIP.
    let two = three()
        .into_iter()
        .filter(|b| b.mac.unwrap()[5] != 11)
        .collect();
    t.dp.apply(&Desired {
        services: vec![service(IpAddr::from(VIP), 6443, PROTO_TCP, two)],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(t.dp.vip_traffic(vip_id).unwrap(), before);
    // A backend with a new address (a new pair, maybe on the freed id) starts from zero.
    let mut again = three();
    again[0] = backend("10.77.0.21", 21);
    t.dp.apply(&Desired {
        services: vec![service(IpAddr::from(VIP), 6443, PROTO_TCP, again)],
        ..Default::default()
    })
    .unwrap();
    let new = t.dp.installed(&svc.key);
    let b21 = new.iter().find(|b| b.spec.mac.unwrap()[5] == 21).unwrap();
    assert_eq!(t.dp.backend_traffic(b21.id).unwrap().packets, 0);
    assert_eq!(t.dp.vip_traffic(vip_id).unwrap(), before);
    let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(41000, 6443, ACK));
    assert_eq!(run(&mut t, &f).0, TX);
    assert_eq!(t.dp.vip_traffic(vip_id).unwrap().packets, 181);
}

#[test]
fn ipv4_options_are_honoured() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let opts = [1u8, 1, 1, 1, 1, 1, 1, 0]; // NOPs and an end-of-options: 8 bytes
    let f = ipv4_frame_opts(
        CLIENT,
        VIP,
        PROTO_TCP,
        &opts,
        &tcp(40001, 6443, SYN),
        0x4000,
    );
    let (v, out) = run(&mut t, &f);
    assert_eq!(v, TX);
    assert_forwarded(
        &f,
        &out,
        expected_mac(&t, &flow4(40001, 6443, PROTO_TCP), &svc),
    );
}

#[test]
fn established_flows_stick_while_their_backend_stays_in_the_set() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    // Open many flows, then add a fourth backend: Maglev moves about a quarter of the slots,
    // but flows already open must stay where they are.
    let mut first = Vec::new();
    for sport in 41000..41400u16 {
        first.push(open(&mut t, sport)[0..6].to_vec());
    }
    let mut grown = svc.clone();
    grown.backends.push(backend("10.77.0.14", 14));
    t.dp.apply(&Desired {
        services: vec![grown.clone()],
        ..Default::default()
    })
    .unwrap();
    let mut would_move = 0;
    for (i, sport) in (41000..41400u16).enumerate() {
        let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, ACK));
        let (v, out) = run(&mut t, &f);
        assert_eq!(v, TX);
        assert_eq!(
            out[0..6],
            first[i][..],
            "flow {sport} moved although its backend stayed"
        );
        if expected_mac(&t, &flow4(sport, 6443, PROTO_TCP), &grown)[..] != first[i][..] {
            would_move += 1;
        }
    }
    assert!(
        would_move > 40,
        "the test must include flows the new table maps elsewhere ({would_move})"
    );
    assert!(counter(&t, stat::CONNTRACK_HIT) >= 400);
    // A SYN on a 5-tuple whose entry's backend is still in the set (a reuse, or a spoofed SYN)
    // stays on that backend, not where the new table would put a new flow.
    let moved = (41000..41400u16)
        .find(|p| {
            expected_mac(&t, &flow4(*p, 6443, PROTO_TCP), &grown)[..]
                != first[(p - 41000) as usize][..]
        })
        .unwrap();
    let (_, out) = run(
        &mut t,
        &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(moved, 6443, SYN)),
    );
    assert_eq!(out[0..6], first[(moved - 41000) as usize][..]);
    // New flows do use the fourth backend.
    let macs: std::collections::HashSet<Vec<u8>> = (42000..42100u16)
        .map(|sport| {
            run(
                &mut t,
                &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN)),
            )
            .1[0..6]
                .to_vec()
        })
        .collect();
    assert!(macs.contains(&vec![0x02, 0xbe, 0, 0, 0, 14]));
}

#[test]
fn flows_of_a_removed_or_failed_backend_move() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let mut on_12 = Vec::new();
    for sport in 43000..43100u16 {
        let out = open(&mut t, sport);
        if out[5] == 12 {
            on_12.push(sport);
        }
    }
    assert!(!on_12.is_empty());
    let mut failed = svc.clone();
    failed.backends[1].healthy = false;
    t.dp.apply(&Desired {
        services: vec![failed],
        ..Default::default()
    })
    .unwrap();
    for sport in &on_12 {
        let (v, out) = run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(*sport, 6443, ACK)),
        );
        assert_eq!(v, TX);
        assert_ne!(out[5], 12, "flow {sport} still sent to the failed backend");
    }
    assert_eq!(counter(&t, stat::CONNTRACK_STALE), on_12.len() as u64);
}

#[test]
fn drained_backend_keeps_established_flows_but_gets_no_new_ones() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let mut on_11 = Vec::new();
    for sport in 44000..44100u16 {
        let out = open(&mut t, sport);
        if out[5] == 11 {
            on_11.push(sport);
        }
    }
    let mut drained = svc.clone();
    drained.backends[0].drained = true;
    t.dp.apply(&Desired {
        services: vec![drained],
        ..Default::default()
    })
    .unwrap();
    for sport in &on_11 {
        let (_, out) = run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(*sport, 6443, ACK)),
        );
        assert_eq!(out[5], 11, "established flow left the drained backend");
    }
    for sport in 45000..45200u16 {
        let (_, out) = run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN)),
        );
        assert_ne!(out[5], 11, "new flow sent to the drained backend");
    }
}

/// A new VIP owner has no connection-table entries: the drained (or failing, or suspected
/// dead) backend's established flows must still reach it through the table, while new flows
/// whose slot names it take another backend. Without its slots the new owner would re-hash
/// those flows and their new backends would reset them.
#[test]
fn a_new_owner_sends_a_drained_backends_flows_to_it_but_no_new_ones() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    // The old owner: flows open while every backend takes new flows.
    let mut old = setup(vec![svc.clone()]);
    let mut on_11 = Vec::new();
    for sport in 46000..46150u16 {
        if open(&mut old, sport)[5] == 11 {
            on_11.push(sport);
        }
    }
    assert!(!on_11.is_empty());
    // The new owner (its own, empty connection table) with backend 11 drained.
    let mut drained = svc.clone();
    drained.backends[0].drained = true;
    let mut new = setup(vec![drained]);
    for sport in &on_11 {
        let (v, out) = run(
            &mut new,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(*sport, 6443, ACK)),
        );
        assert_eq!(v, TX);
        assert_eq!(
            out[5], 11,
            "an established flow left its drained backend at a new owner"
        );
    }
    for sport in &on_11 {
        let (v, out) = run(
            &mut new,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(*sport + 1000, 6443, SYN)),
        );
        assert_eq!(v, TX);
        assert_ne!(out[5], 11, "a new connection went to the drained backend");
    }
}

#[test]
fn local_backend_passes_to_the_stack() {
    let mut b = three();
    for x in &mut b {
        x.local = true;
        x.mac = None;
    }
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, b);
    let mut t = setup(vec![svc]);
    let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    let (v, out) = run(&mut t, &f);
    assert_eq!(v, PASS);
    assert_eq!(out, f);
    assert_eq!(counter(&t, stat::PASS_LOCAL_BACKEND), 1);
}

#[test]
fn not_owner_passes_to_the_stack() {
    let mut svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    svc.owned = false;
    let mut t = setup(vec![svc.clone()]);
    let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    let (v, out) = run(&mut t, &f);
    assert_eq!((v, out), (PASS, f.clone()));
    assert_eq!(counter(&t, stat::PASS_NOT_OWNER), 1);
    // Becoming owner (what VRRP does) flips it without touching the table.
    t.dp.set_owned(IpAddr::from(VIP), true).unwrap();
    assert_eq!(run(&mut t, &f).0, TX);
}

#[test]
fn all_ports_vip_and_udp() {
    let svc = service(IpAddr::from(VIP), 0, PROTO_UDP, three());
    let mut t = setup(vec![svc.clone()]);
    for port in [53u16, 4789, 65000] {
        let f = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, port, 16));
        let (v, out) = run(&mut t, &f);
        assert_eq!(v, TX, "port {port}");
        assert_forwarded(
            &f,
            &out,
            expected_mac(&t, &flow4(5000, port, PROTO_UDP), &svc),
        );
    }
}

#[test]
fn ipv6_tcp_and_extension_headers() {
    let svc = service(
        ip(VIP6),
        443,
        PROTO_TCP,
        vec![backend("fd77::11", 11), backend("fd77::12", 12)],
    );
    let mut t = setup(vec![svc.clone()]);
    let (src, dst) = (addr_bytes(ip(CLIENT6)).0, addr_bytes(ip(VIP6)).0);
    let key = FlowKey {
        src,
        dst,
        sport: 50000,
        dport: 443,
        proto: PROTO_TCP,
        family: 6,
        _pad: [0; 2],
    };
    let f = ipv6_frame(src, dst, PROTO_TCP, &tcp(50000, 443, SYN));
    let (v, out) = run(&mut t, &f);
    assert_eq!(v, TX);
    assert_forwarded(&f, &out, expected_mac(&t, &key, &svc));

    // Hop-by-hop + destination options: walked, same flow, same backend.
    let f2 = ipv6_frame_ext(
        src,
        dst,
        PROTO_TCP,
        &[(0, 0), (60, 1)],
        &tcp(50000, 443, ACK),
    );
    let (v, out2) = run(&mut t, &f2);
    assert_eq!(v, TX);
    assert_eq!(out2[0..6], out[0..6]);

    // A chain longer than we walk is passed and counted, never forwarded.
    let long = ipv6_frame_ext(
        src,
        dst,
        PROTO_TCP,
        &[(60, 0), (60, 0), (60, 0), (60, 0), (60, 0)],
        &tcp(50000, 443, ACK),
    );
    let (v, out3) = run(&mut t, &long);
    assert_eq!((v, out3), (PASS, long));
    assert_eq!(counter(&t, stat::PASS_IPV6_EXT_LIMIT), 1);
}

#[test]
fn icmp_too_big_reaches_the_flows_backend() {
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let svc6 = service(
        ip(VIP6),
        6443,
        PROTO_TCP,
        vec![
            backend("fd77::11", 21),
            backend("fd77::12", 22),
            backend("fd77::13", 23),
        ],
    );
    let mut t = setup(vec![svc.clone(), svc6.clone()]);
    for sport in [40000u16, 40001, 40002, 40003, 40004, 40005] {
        // The flow's data packets go to backend X ...
        let (_, out) = run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN)),
        );
        // ... and the router's complaint about X's reply (VIP -> client) goes to X too.
        let icmp = icmp4_frag_needed([10, 77, 0, 254], VIP, CLIENT, 6443, sport);
        let (v, iout) = run(&mut t, &icmp);
        assert_eq!(v, TX);
        assert_forwarded(&icmp, &iout, out[0..6].try_into().unwrap());
    }
    // Without a connection-table entry the hash alone gives the same answer.
    let icmp = icmp4_frag_needed([10, 77, 0, 254], VIP, CLIENT, 6443, 49999);
    let (_, iout) = run(&mut t, &icmp);
    assert_eq!(
        iout[0..6],
        expected_mac(&t, &flow4(49999, 6443, PROTO_TCP), &svc)
    );
    assert_eq!(counter(&t, stat::ICMP_FORWARDED), 7);

    let (c6, v6b) = (addr_bytes(ip(CLIENT6)).0, addr_bytes(ip(VIP6)).0);
    let key = FlowKey {
        src: c6,
        dst: v6b,
        sport: 51000,
        dport: 6443,
        proto: PROTO_TCP,
        family: 6,
        _pad: [0; 2],
    };
    let icmp6 = icmp6_too_big(addr_bytes(ip("fd77::fe")).0, v6b, c6, 6443, 51000);
    let (v, out) = run(&mut t, &icmp6);
    assert_eq!(v, TX);
    assert_forwarded(&icmp6, &out, expected_mac(&t, &key, &svc6));

    // An ICMP error quoting something that is not a VIP flow is not ours.
    let other = icmp4_frag_needed([10, 77, 0, 254], VIP, CLIENT, 22, 40000);
    assert_eq!(run(&mut t, &other).0, PASS);
}

#[test]
fn fragments_to_a_vip_are_dropped_and_counted() {
    let mut t = setup(vec![
        service(IpAddr::from(VIP), 6443, PROTO_TCP, three()),
        service(ip(VIP6), 443, PROTO_TCP, vec![backend("fd77::11", 11)]),
    ]);
    let first = ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[], &tcp(40000, 6443, ACK), 0x2000);
    let later = ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[], &[0u8; 24], 0x0003);
    let other = ipv4_frame_opts(CLIENT, [10, 77, 0, 5], PROTO_TCP, &[], &[0u8; 24], 0x2000);
    assert_eq!(run(&mut t, &first).0, DROP);
    assert_eq!(run(&mut t, &later).0, DROP);
    assert_eq!(
        run(&mut t, &other).0,
        PASS,
        "fragments to other addresses are not ours"
    );
    let f6 = ipv6_fragment(
        addr_bytes(ip(CLIENT6)).0,
        addr_bytes(ip(VIP6)).0,
        PROTO_TCP,
        &tcp(1, 443, ACK),
    );
    assert_eq!(run(&mut t, &f6).0, DROP);
    assert_eq!(counter(&t, stat::DROP_FRAGMENT), 3);
    assert_eq!(counter(&t, stat::FORWARDED), 0);
}

#[test]
fn empty_backend_set_drops_and_counts() {
    let mut b = three();
    for x in &mut b {
        x.healthy = false;
    }
    let mut t = setup(vec![service(IpAddr::from(VIP), 6443, PROTO_TCP, b)]);
    assert_eq!(
        run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN))
        )
        .0,
        DROP
    );
    assert_eq!(counter(&t, stat::DROP_NO_BACKEND), 1);
}

#[test]
fn every_truncation_and_bad_header_is_passed_or_dropped_never_forwarded() {
    let mut t = setup(vec![
        service(IpAddr::from(VIP), 6443, PROTO_TCP, three()),
        service(ip(VIP6), 443, PROTO_TCP, vec![backend("fd77::11", 11)]),
        service(IpAddr::from(VIP), 53, PROTO_UDP, three()),
    ]);
    let (c6, v6) = (addr_bytes(ip(CLIENT6)).0, addr_bytes(ip(VIP6)).0);
    let mut payload = tcp(40000, 6443, ACK);
    payload.extend_from_slice(b"GET /readyz HTTP/1.1\r\n\r\n");
    let valid = [
        ipv4_frame(CLIENT, VIP, PROTO_TCP, &payload),
        ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[1, 1, 1, 0], &payload, 0x4000),
        ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 12)),
        ipv6_frame_ext(c6, v6, PROTO_TCP, &[(0, 0)], &tcp(40000, 443, ACK)),
        icmp4_frag_needed([10, 77, 0, 254], VIP, CLIENT, 6443, 40000),
        icmp6_too_big(addr_bytes(ip("fd77::fe")).0, v6, c6, 443, 40000),
    ];
    let mut runs = 0u64;
    for f in &valid {
        assert_ne!(
            run(&mut t, f).0,
            PASS,
            "the untruncated frame is a VIP packet"
        );
        // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header (and no NIC hands
        // such a frame to XDP), so truncations start at 14 bytes.
        for len in 14..f.len() {
            let cut = &f[..len];
            let (v, out) = run(&mut t, cut);
            runs += 1;
            assert!(
                v == PASS || v == DROP,
                "truncated to {len} of {} bytes: verdict {v}",
                f.len()
            );
            assert_eq!(out, cut, "a truncated frame is not modified");
        }
    }
    // Impossible IPv4 header lengths: IHL below 5, and IHL beyond the frame.
    let mut bad = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    for ihl in [0u8, 1, 4, 15] {
        bad[14] = 0x40 | ihl;
        let (v, out) = run(&mut t, &bad);
        assert_eq!((v, &out), (PASS, &bad), "IHL {ihl}");
        runs += 1;
    }
    // Wrong IP version inside an IPv4 ethertype.
    bad[14] = 0x65;
    assert_eq!(run(&mut t, &bad).0, PASS);
    runs += 1;
    let malformed = counter(&t, stat::PASS_MALFORMED);
    let counted =
        malformed + counter(&t, stat::PASS_NOT_VIP) + counter(&t, stat::PASS_ICMP_NOT_VIP);
    assert!(malformed > 0);
    assert_eq!(counter(&t, stat::FORWARDED), valid.len() as u64 - 2);
    assert_eq!(counter(&t, stat::ICMP_FORWARDED), 2);
    assert!(
        counted >= runs,
        "every pass is counted with its reason ({counted} < {runs})"
    );
}

#[test]
fn a_table_slot_naming_a_backend_outside_the_set_is_dropped_not_forwarded() {
    // Simulate a torn update: the table still names backend ids whose entries say "not in set".
    // (The data plane never does this itself; the program must not trust it either.)
    let svc = service(IpAddr::from(VIP), 6443, PROTO_TCP, three());
    let mut t = setup(vec![svc.clone()]);
    let pinned = aya::maps::MapData::from_pin(t.opts.pin_dir().join("LB_BACKENDS")).unwrap();
    let mut backends: aya::maps::Array<_, lb_common::BackendInfo> =
        aya::maps::Array::try_from(aya::maps::Map::Array(pinned)).unwrap();
    for b in t.dp.installed(&svc.key) {
        backends
            .set(b.id, lb_common::BackendInfo::default(), 0)
            .unwrap();
    }
    let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    let (v, out) = run(&mut t, &f);
    assert_eq!((v, out), (DROP, f));
    assert_eq!(counter(&t, stat::DROP_BAD_BACKEND), 1);
}

#[test]
fn a_new_flow_always_finds_a_backend_that_takes_new_flows_when_one_exists() {
    // Weights 9:1 and the heavy backend failing (within its hold: it keeps its slots for its
    // established flows, takes no new ones): nine slots in ten name it, yet every new
    // connection and every new UDP flow goes to the light one. Not one is dropped.
    let mut heavy = backend("10.77.0.11", 11);
    heavy.weight = 9;
    let light = backend("10.77.0.12", 12);
    let svcs = |failing: bool| {
        let mut h = heavy.clone();
        h.failing = failing;
        vec![
            service(
                IpAddr::from(VIP),
                6443,
                PROTO_TCP,
                vec![h.clone(), light.clone()],
            ),
            service(IpAddr::from(VIP), 53, PROTO_UDP, vec![h, light.clone()]),
        ]
    };
    let mut t = setup(svcs(false));
    t.dp.apply(&Desired {
        services: svcs(true),
        ..Default::default()
    })
    .unwrap();
    let flows = 3000u16;
    for sport in 20000..20000 + flows {
        for f in [
            ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN)),
            ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(sport, 53, 16)),
        ] {
            let (v, out) = run(&mut t, &f);
            assert_eq!(
                (v, out.get(5).copied()),
                (TX, Some(12)),
                "new flow from port {sport} (proto {}) not sent to the backend that takes new flows",
                f[23]
            );
        }
    }
    assert_eq!(counter(&t, stat::DROP_NO_BACKEND), 0);
    // Established flows of the failing backend (no entry here: another node opened them) stay
    // on it: a mid-flow TCP segment goes where its slot says.
    let on_heavy = (30000..30200u16)
        .filter(|sport| {
            let (_, out) = run(
                &mut t,
                &ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(*sport, 6443, ACK)),
            );
            out[5] == 11
        })
        .count();
    assert!(
        on_heavy > 150,
        "mid-flow segments on the failing backend: {on_heavy}"
    );
}

#[test]
fn an_icmp_error_about_a_udp_flow_goes_where_the_flows_datagrams_go() {
    // Backend 11 drained: a UDP flow whose slot names it goes elsewhere. An ICMP "fragmentation
    // needed" about that flow (here before any of its datagrams, as at a node without its entry)
    // goes where the flow's datagrams go, not to the slot's drained backend.
    let mut b = three();
    b[0].drained = true;
    let mut t = setup(vec![service(IpAddr::from(VIP), 53, PROTO_UDP, b)]);
    let mut skipped = 0;
    for sport in 21000..21300u16 {
        let icmp = icmp4_frag_needed_proto([10, 77, 9, 254], VIP, CLIENT, 53, sport, PROTO_UDP);
        let (v, err_out) = run(&mut t, &icmp);
        assert_eq!(v, TX);
        let (v, dgram_out) = run(
            &mut t,
            &ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(sport, 53, 8)),
        );
        assert_eq!(v, TX);
        assert_ne!(
            dgram_out[5], 11,
            "a new UDP flow went to the drained backend"
        );
        assert_eq!(
            err_out[0..6],
            dgram_out[0..6],
            "the ICMP error about UDP port {sport} went to another backend than the flow"
        );
        // The slot's backend, by the table with every backend of the set (the drained one too).
        let installed = t.dp.installed(&vip_key(IpAddr::from(VIP), 53, PROTO_UDP));
        let entries: Vec<maglev::Entry> = installed
            .iter()
            .map(|b| maglev::Entry {
                addr: b.spec.addr,
                weight: b.spec.weight,
                id: b.id,
            })
            .collect();
        let table = maglev::build(&entries, SIZE);
        let id = table[(flow_hash(&flow4(sport, 53, PROTO_UDP), 0x1b_5eed) % SIZE) as usize];
        if installed.iter().find(|b| b.id == id).unwrap().spec.addr == ip("10.77.0.11") {
            skipped += 1;
        }
    }
    assert!(
        skipped > 50,
        "flows whose slot is the drained backend's: {skipped}"
    );
}

#[test]
fn the_production_object_holds_only_what_lbd_runs() {
    // The benches' programs and maps live in an object of their own (lb-ebpf `bench_progs`).
    let obj = aya_obj::Object::parse(lb_userspace::EBPF_OBJECT).expect("parse the XDP object");
    let mut programs: Vec<&str> = obj.programs.keys().map(|k| k.as_str()).collect();
    programs.sort();
    assert_eq!(
        programs,
        [
            "lb_decap",
            "lb_pass",
            // Socket load balancing (lbd attaches them to the cgroup v2 root).
            "lb_sock_connect4",
            "lb_sock_connect6",
            "lb_sock_getpeername4",
            "lb_sock_getpeername6",
            "lb_sock_recvmsg4",
            "lb_sock_recvmsg6",
            "lb_sock_sendmsg4",
            "lb_sock_sendmsg6",
            "lb_xdp",
            // Dry runs and traced packets (tail-called by lb_xdp).
            "lb_xdp_noted"
        ]
    );
    let bench_maps: Vec<&String> = obj
        .maps
        .keys()
        .filter(|m| m.to_ascii_uppercase().starts_with("BENCH"))
        .collect();
    assert!(
        bench_maps.is_empty(),
        "bench maps in the object: {bench_maps:?}"
    );
    let bench = aya_obj::Object::parse(lb_userspace::BENCH_OBJECT).expect("parse the bench object");
    assert!(bench.programs.contains_key("lb_baseline"));
}
