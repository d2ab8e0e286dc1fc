//! L3 direct server return through the real programs (BPF_PROG_TEST_RUN), bytes checked:
//! `lb_xdp` wraps a VIP packet for a routed backend in IPv4 or IPv6 (IP-in-IP), answers a packet
//! too big to wrap with ICMP, and `lb_decap` on the backend unwraps what a known LB node sent
//! and leaves everything else alone. Needs root; `cargo xtask test`.

use std::net::IpAddr;

use lb_common::{PROTO_TCP, PROTO_UDP, decap_stat, stat};
use lb_tests::{TestDataplane, backend, frames::*};
use lb_userspace::dataplane::{BackendSpec, Desired, Encap, ServiceSpec, decap::Decap, vip_key};

const PASS: u32 = 2;
const TX: u32 = 3;
const VIP: [u8; 4] = [10, 88, 0, 100];
const CLIENT: [u8; 4] = [10, 88, 9, 1];
const LB: &str = "10.88.0.10";
const NEXT_HOP: [u8; 6] = [0x02, 0x4e, 0x48, 0, 0, 1];
const VIP6: &str = "fd88::100";
const CLIENT6: &str = "fd88:9::1";
const LB6: &str = "fd88::10";
/// The routed backend's addresses (the outer destination of what the LB node wraps).
const BACKEND: &str = "10.99.4.2";
const BACKEND6: &str = "fd99:4::2";
const DROP: u32 = 1;

fn routed(addr: &str, src: &str, mtu: u16) -> BackendSpec {
    let mut b = backend(addr, 0);
    b.mac = Some(NEXT_HOP);
    b.encap = Some(Encap {
        src: src.parse().unwrap(),
        mtu,
    });
    b
}

fn setup(vip: IpAddr, proto: u8, backends: Vec<BackendSpec>) -> TestDataplane {
    let mut t = TestDataplane::new(251);
    t.dp.apply(&Desired {
        services: vec![ServiceSpec {
            key: vip_key(vip, 0, proto),
            owned: true,
            backends,
        }],
        ..Default::default()
    })
    .unwrap();
    t
}

fn counter(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

/// One's-complement checksum of `bytes` (0 when a header's own checksum field is included).
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[test]
fn ipv4_to_a_routed_backend_is_wrapped_in_ipv4_with_only_the_outer_header_added() {
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed("10.99.4.2", LB, 1500)],
    );
    let mut inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    inner[15] = 0x2e; // DSCP EF, ECN 2: copied to the outer header
    let (v, out, _) = t.dp.test_run("lb_xdp", &inner, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(out.len(), inner.len() + 20);
    assert_eq!(&out[0..6], &NEXT_HOP, "to the next hop");
    assert_eq!(&out[6..12], &LB_MAC);
    assert_eq!(&out[12..14], &[0x08, 0x00]);
    let outer = &out[14..34];
    assert_eq!(outer[0], 0x45);
    assert_eq!(outer[1], 0x2e, "traffic class copied");
    assert_eq!(
        u16::from_be_bytes([outer[2], outer[3]]) as usize,
        inner.len() - 14 + 20
    );
    assert_eq!(outer[6] & 0x40, 0x40, "don't fragment");
    assert_eq!(outer[8], 64, "TTL");
    assert_eq!(outer[9], 4, "IP-in-IP");
    assert_eq!(&outer[12..16], &[10, 88, 0, 10], "from this node");
    assert_eq!(&outer[16..20], &[10, 99, 4, 2], "to the backend");
    assert_eq!(checksum(outer), 0, "outer header checksum");
    assert_eq!(&out[34..], &inner[14..], "the client's packet is unchanged");
    assert_eq!(counter(&t, stat::ENCAPSULATED), 1);
    assert_eq!(counter(&t, stat::FORWARDED), 1);
    // The flow's next packet follows (connection table) and is wrapped the same way.
    let ack = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, ACK));
    let (v, out2, _) = t.dp.test_run("lb_xdp", &ack, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(&out2[30..34], &[10, 99, 4, 2]);
}

#[test]
fn ipv6_to_a_routed_backend_is_wrapped_in_ipv6() {
    let vip: IpAddr = VIP6.parse().unwrap();
    let mut t = setup(vip, PROTO_UDP, vec![routed("fd99:4::2", LB6, 1500)]);
    let inner = ipv6_frame(
        v6(CLIENT6.parse().unwrap()),
        v6(vip),
        PROTO_UDP,
        &udp(5000, 53, 100),
    );
    let (v, out, _) = t.dp.test_run("lb_xdp", &inner, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(out.len(), inner.len() + 40);
    assert_eq!(&out[0..6], &NEXT_HOP);
    assert_eq!(&out[12..14], &[0x86, 0xdd]);
    let outer = &out[14..54];
    assert_eq!(outer[0] >> 4, 6);
    assert_eq!(
        u16::from_be_bytes([outer[4], outer[5]]) as usize,
        inner.len() - 14,
        "payload length: the whole inner packet"
    );
    assert_eq!(outer[6], 41, "IPv6-in-IPv6");
    assert_eq!(outer[7], 64, "hop limit");
    assert_eq!(&outer[8..24], &v6(LB6.parse().unwrap()));
    assert_eq!(&outer[24..40], &v6("fd99:4::2".parse().unwrap()));
    assert_eq!(&out[54..], &inner[14..]);
}

#[test]
fn a_packet_too_big_to_wrap_gets_fragmentation_needed_from_the_vip() {
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_UDP,
        vec![routed("10.99.4.2", LB, 1000)],
    );
    // 1000 bytes of IP packet: 1020 once wrapped, over the path's 1000.
    let big = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 1000 - 20 - 8));
    let (v, out, _) = t.dp.test_run("lb_xdp", &big, 1).unwrap();
    assert_eq!(v, TX, "sent back to the client");
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 1);
    assert_eq!(counter(&t, stat::ENCAPSULATED), 0);
    assert_eq!(out.len(), 14 + 20 + 8 + 28);
    assert_eq!(&out[0..6], &big[6..12], "back to where it came from");
    assert_eq!(&out[6..12], &big[0..6]);
    let ip = &out[14..34];
    assert_eq!(ip[9], 1, "ICMP");
    assert_eq!(&ip[12..16], &VIP, "from the VIP");
    assert_eq!(&ip[16..20], &CLIENT, "to the client");
    assert_eq!(checksum(ip), 0);
    let icmp = &out[34..];
    assert_eq!((icmp[0], icmp[1]), (3, 4), "fragmentation needed");
    assert_eq!(
        u16::from_be_bytes([icmp[6], icmp[7]]),
        980,
        "room left inside"
    );
    assert_eq!(
        &icmp[8..],
        &big[14..14 + 28],
        "the client's header and 8 bytes"
    );
    assert_eq!(checksum(icmp), 0);
    // One byte less fits and is wrapped.
    let fits = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 980 - 20 - 8));
    let (v, out, _) = t.dp.test_run("lb_xdp", &fits, 1).unwrap();
    assert_eq!((v, out.len()), (TX, fits.len() + 20));
}

#[test]
fn an_ipv6_packet_too_big_to_wrap_gets_packet_too_big() {
    let vip: IpAddr = VIP6.parse().unwrap();
    let client: IpAddr = CLIENT6.parse().unwrap();
    let mut t = setup(vip, PROTO_UDP, vec![routed("fd99:4::2", LB6, 1400)]);
    let big = ipv6_frame(
        v6(client),
        v6(vip),
        PROTO_UDP,
        &udp(5000, 53, 1380 - 40 - 8),
    );
    let (v, out, _) = t.dp.test_run("lb_xdp", &big, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(out.len(), 14 + 40 + 8 + 48);
    let ip = &out[14..54];
    assert_eq!(ip[6], 58, "ICMPv6");
    assert_eq!(&ip[8..24], &v6(vip));
    assert_eq!(&ip[24..40], &v6(client));
    let icmp = &out[54..];
    assert_eq!(icmp[0], 2, "packet too big");
    assert_eq!(u32::from_be_bytes(icmp[4..8].try_into().unwrap()), 1360);
    assert_eq!(&icmp[8..], &big[14..14 + 48]);
    // Checksum over the pseudo-header and the message.
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[8..40]);
    pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(icmp);
    assert_eq!(checksum(&pseudo), 0);
}

#[test]
fn an_on_link_backend_next_to_a_routed_one_keeps_plain_mac_rewriting() {
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed("10.99.4.2", LB, 1500), backend("10.88.0.21", 21)],
    );
    let (mut wrapped, mut plain) = (0, 0);
    for sport in 30000..30200u16 {
        let f = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(sport, 6443, SYN));
        let (v, out, _) = t.dp.test_run("lb_xdp", &f, 1).unwrap();
        assert_eq!(v, TX);
        if out.len() == f.len() + 20 {
            wrapped += 1;
            assert_eq!(&out[34..], &f[14..]);
        } else {
            plain += 1;
            assert_eq!(out[5], 21);
            assert_eq!(&out[12..], &f[12..], "only the MACs change");
        }
    }
    assert!(
        wrapped > 50 && plain > 50,
        "{wrapped} wrapped, {plain} plain"
    );
}

fn wrapped4(outer_src: [u8; 4], inner: &[u8]) -> Vec<u8> {
    wrapped4_to(outer_src, [10, 99, 4, 2], 0, inner)
}

/// `inner` (an IPv4 or IPv6 frame) in IPv4 from `src` to `dst`, outer TOS `tos`.
fn wrapped4_to(src: [u8; 4], dst: [u8; 4], tos: u8, inner: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0x02, 0xbe, 0, 0, 0, 2]);
    f.extend_from_slice(&NEXT_HOP);
    f.extend_from_slice(&[0x08, 0x00]);
    let proto = if inner[14] >> 4 == 4 { 4 } else { 41 };
    let mut h = ipv4_header(src, dst, proto, &[], inner.len() - 14, 0x4000);
    if tos != 0 {
        h[1] = tos;
        h[10] = 0;
        h[11] = 0;
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&h);
    f.extend_from_slice(&inner[14..]);
    f
}

/// A backend unwrapping for `VIP` and `VIP6`, from `LB`, at `BACKEND`.
fn decap() -> Decap {
    let mut d = Decap::load(
        &lb_tests::unique("dcp"),
        std::path::Path::new("/sys/fs/bpf"),
    )
    .expect("load lb_decap (needs root)");
    d.set_peers(&[LB.parse().unwrap(), LB6.parse().unwrap()])
        .unwrap();
    d.set_vips(&[IpAddr::from(VIP), VIP6.parse().unwrap()])
        .unwrap();
    d.set_local(&[BACKEND.parse().unwrap(), BACKEND6.parse().unwrap()])
        .unwrap();
    d
}

fn decap_count(d: &Decap, index: u32) -> u64 {
    let stats: std::collections::HashMap<_, _> = d.stats().unwrap().into_iter().collect();
    stats[decap_stat::NAMES[index as usize]]
}

#[test]
fn an_lb_nodes_packet_is_unwrapped_only_to_this_host_and_only_for_its_vips() {
    // Who can forge an LB node's address must not get packets into the backend's stack for
    // anything but its VIPs (with forwarding on, they would be routed on to hosts behind it).
    let mut d = decap();
    let lb = [10, 88, 0, 10];
    let host_behind = [10, 99, 7, 7];
    for (inner, why) in [
        (
            ipv4_frame(CLIENT, host_behind, PROTO_TCP, &tcp(40000, 22, SYN)),
            "TCP to a host behind the backend",
        ),
        (
            ipv4_frame(CLIENT, [10, 99, 4, 2], PROTO_UDP, &udp(5000, 53, 8)),
            "UDP to the backend's own address",
        ),
        (
            ipv6_frame(
                v6(CLIENT6.parse().unwrap()),
                v6("fd99:7::7".parse().unwrap()),
                PROTO_TCP,
                &tcp(40000, 22, SYN),
            ),
            "IPv6 to a host behind the backend",
        ),
    ] {
        let (v, _) = d.test_run(&wrapped4(lb, &inner)).unwrap();
        assert_eq!(v, DROP, "{why}");
    }
    assert_eq!(decap_count(&d, decap_stat::NOT_VIP), 3);
    // For a VIP, but sent to an address that is not this host's (someone else's traffic): not
    // unwrapped here.
    let vip_inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40001, 6443, SYN));
    let other = wrapped4_to(lb, [10, 99, 4, 3], 0, &vip_inner);
    let (v, _) = d.test_run(&other).unwrap();
    assert_eq!(v, DROP);
    assert_eq!(decap_count(&d, decap_stat::NOT_LOCAL), 1);
    // The same to this host: unwrapped.
    let (v, out) = d.test_run(&wrapped4(lb, &vip_inner)).unwrap();
    assert_eq!((v, &out[14..]), (PASS, &vip_inner[14..]));
    // The VIP set follows `set_vips`: a VIP taken away is no longer unwrapped.
    d.set_vips(&[VIP6.parse().unwrap()]).unwrap();
    let (v, _) = d.test_run(&wrapped4(lb, &vip_inner)).unwrap();
    assert_eq!(v, DROP);
    assert_eq!(decap_count(&d, decap_stat::NOT_VIP), 4);
    assert_eq!(decap_count(&d, decap_stat::DECAPSULATED), 1);
}

#[test]
fn unwrapping_carries_a_congestion_mark_to_the_inner_header_rfc_6040() {
    let mut d = decap();
    let lb = [10, 88, 0, 10];
    // (outer ECN, inner ECN, inner ECN after, or None: dropped)
    let cases: [(u8, u8, Option<u8>); 8] = [
        (3, 2, Some(3)),
        (3, 1, Some(3)),
        (3, 3, Some(3)),
        (3, 0, None),
        (1, 2, Some(1)),
        (2, 0, Some(0)),
        (0, 2, Some(2)),
        (2, 1, Some(1)),
    ];
    for (outer, inner_ecn, after) in cases {
        let mut inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, ACK));
        // DSCP AF21 and the inner ECN; checksum made valid for it.
        inner[15] = (18 << 2) | inner_ecn;
        inner[24] = 0;
        inner[25] = 0;
        let c = checksum(&inner[14..34]);
        inner[24..26].copy_from_slice(&c.to_be_bytes());
        let (v, out) = d
            .test_run(&wrapped4_to(lb, [10, 99, 4, 2], 0x10 | outer, &inner))
            .unwrap();
        let case = format!("outer {outer}, inner {inner_ecn}");
        match after {
            None => assert_eq!(v, DROP, "{case}"),
            Some(e) => {
                assert_eq!(v, PASS, "{case}");
                assert_eq!(out[15], (18 << 2) | e, "{case}: DSCP kept, ECN {e}");
                assert_eq!(checksum(&out[14..34]), 0, "{case}: inner checksum");
                assert_eq!(&out[16..24], &inner[16..24], "{case}");
                assert_eq!(&out[26..], &inner[26..], "{case}");
            }
        }
        // The same around IPv6.
        let mut inner6 = ipv6_frame(
            v6(CLIENT6.parse().unwrap()),
            v6(VIP6.parse().unwrap()),
            PROTO_UDP,
            &udp(5000, 53, 16),
        );
        inner6[14] = 0x60 | (18 >> 2);
        inner6[15] = ((18 & 3) << 6) | (inner_ecn << 4) | (inner6[15] & 0x0f);
        let (v, out) = d
            .test_run(&wrapped4_to(lb, [10, 99, 4, 2], outer, &inner6))
            .unwrap();
        match after {
            None => assert_eq!(v, DROP, "v6 {case}"),
            Some(e) => {
                assert_eq!(v, PASS, "v6 {case}");
                assert_eq!(out[14], inner6[14], "v6 {case}");
                assert_eq!(out[15], (inner6[15] & !0x30) | (e << 4), "v6 {case}");
                assert_eq!(&out[16..], &inner6[16..], "v6 {case}");
            }
        }
    }
    assert_eq!(decap_count(&d, decap_stat::ECN_DROP), 2);
}

#[test]
fn a_backend_unwraps_what_a_known_lb_node_sent_and_nothing_else() {
    let mut d = Decap::load(
        &lb_tests::unique("dcp"),
        std::path::Path::new("/sys/fs/bpf"),
    )
    .expect("load lb_decap (needs root)");
    d.set_peers(&[LB.parse().unwrap(), LB6.parse().unwrap()])
        .unwrap();
    d.set_vips(&[IpAddr::from(VIP), VIP6.parse().unwrap()])
        .unwrap();
    d.set_local(&[BACKEND.parse().unwrap(), BACKEND6.parse().unwrap()])
        .unwrap();
    let inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    let (v, out) = d.test_run(&wrapped4([10, 88, 0, 10], &inner)).unwrap();
    assert_eq!(v, PASS);
    assert_eq!(
        &out[12..],
        &inner[12..],
        "the client's packet, as it was sent"
    );
    assert_eq!(
        &out[0..6],
        &[0x02, 0xbe, 0, 0, 0, 2],
        "the frame's own MACs"
    );
    // From an address that is not a known LB node: left alone (the kernel drops it).
    let stranger = wrapped4([10, 88, 0, 66], &inner);
    let (v, out) = d.test_run(&stranger).unwrap();
    assert_eq!((v, out), (PASS, stranger));
    // An LB node's packet whose lengths do not add up: dropped.
    let mut short = wrapped4([10, 88, 0, 10], &inner);
    short.truncate(short.len() - 4);
    let (v, _) = d.test_run(&short).unwrap();
    assert_eq!(v, DROP);
    // Ordinary traffic: untouched.
    let (v, out) = d.test_run(&inner).unwrap();
    assert_eq!((v, out), (PASS, inner.clone()));
    // IPv6 in IPv6 from the LB node's IPv6 address.
    let vip6: IpAddr = VIP6.parse().unwrap();
    let inner6 = ipv6_frame(
        v6(CLIENT6.parse().unwrap()),
        v6(vip6),
        PROTO_UDP,
        &udp(5000, 53, 64),
    );
    let mut f = Vec::new();
    f.extend_from_slice(&inner6[0..12]);
    f.extend_from_slice(&[0x86, 0xdd]);
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&((inner6.len() - 14) as u16).to_be_bytes());
    h.extend_from_slice(&[41, 64]);
    h.extend_from_slice(&v6(LB6.parse().unwrap()));
    h.extend_from_slice(&v6(BACKEND6.parse().unwrap()));
    f.extend_from_slice(&h);
    f.extend_from_slice(&inner6[14..]);
    let (v, out) = d.test_run(&f).unwrap();
    assert_eq!((v, out), (PASS, inner6));
    let stats: std::collections::HashMap<_, _> = d.stats().unwrap().into_iter().collect();
    assert_eq!(
        stats[decap_stat::NAMES[decap_stat::DECAPSULATED as usize]],
        2
    );
    assert_eq!(
        stats[decap_stat::NAMES[decap_stat::NOT_FROM_PEER as usize]],
        1
    );
    assert_eq!(stats[decap_stat::NAMES[decap_stat::MALFORMED as usize]], 1);
}

#[test]
fn what_lb_xdp_wraps_lb_decap_unwraps_to_the_original() {
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed("10.99.4.2", LB, 1500)],
    );
    let mut d = Decap::load(
        &lb_tests::unique("dcp"),
        std::path::Path::new("/sys/fs/bpf"),
    )
    .unwrap();
    d.set_peers(&[LB.parse().unwrap()]).unwrap();
    d.set_vips(&[IpAddr::from(VIP)]).unwrap();
    d.set_local(&[BACKEND.parse().unwrap()]).unwrap();
    for (sport, len) in [(40001u16, 0usize), (40002, 1), (40003, 700)] {
        let mut l4 = tcp(sport, 6443, ACK);
        l4.extend(std::iter::repeat_n(0xab, len));
        let inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &l4);
        let (v, wrapped, _) = t.dp.test_run("lb_xdp", &inner, 1).unwrap();
        assert_eq!(v, TX);
        let (v, out) = d.test_run(&wrapped).unwrap();
        assert_eq!(v, PASS);
        assert_eq!(&out[12..], &inner[12..], "payload {len}");
    }
}

#[test]
fn an_icmp_too_big_about_a_flow_goes_wrapped_to_that_flows_routed_backend() {
    // A router on the clients' side says the backend's answers (from the VIP) are too big: the
    // error belongs to the flow's backend, which is routed, so it goes there wrapped.
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed("10.99.4.2", LB, 1500), routed("10.99.4.3", LB, 1500)],
    );
    let syn = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40500, 6443, SYN));
    let (_, first, _) = t.dp.test_run("lb_xdp", &syn, 1).unwrap();
    let backend = first[30..34].to_vec();
    let icmp = icmp4_frag_needed([10, 88, 9, 254], VIP, CLIENT, 6443, 40500);
    let (v, out, _) = t.dp.test_run("lb_xdp", &icmp, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(counter(&t, stat::ICMP_FORWARDED), 1);
    assert_eq!(out.len(), icmp.len() + 20);
    assert_eq!(&out[30..34], &backend[..], "to the flow's backend");
    assert_eq!(&out[34..], &icmp[14..], "the ICMP message unchanged inside");
}

#[test]
fn what_is_answered_with_too_big_is_not_the_pairs_traffic() {
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_UDP,
        vec![routed("10.99.4.2", LB, 1000)],
    );
    let id = t.dp.installed(&vip_key(IpAddr::from(VIP), 0, PROTO_UDP))[0].id;
    let big = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 1000 - 20 - 8));
    for _ in 0..3 {
        let (v, _, _) = t.dp.test_run("lb_xdp", &big, 1).unwrap();
        assert_eq!(v, TX);
    }
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 3);
    assert_eq!(
        t.dp.backend_traffic(id).unwrap().packets,
        0,
        "answered packets never reached the backend"
    );
    let fits = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 100));
    let (v, _, _) = t.dp.test_run("lb_xdp", &fits, 1).unwrap();
    assert_eq!(v, TX);
    let c = t.dp.backend_traffic(id).unwrap();
    assert_eq!((c.packets, c.bytes), (1, fits.len() as u64));
}

#[test]
fn an_icmp_error_too_big_to_wrap_is_dropped_not_answered_with_another() {
    // The routed backend's path takes 60 bytes: the ICMP error about its flow (56 bytes of IP)
    // does not fit once wrapped. An ICMP error is never answered with an ICMP error.
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed("10.99.4.2", LB, 60)],
    );
    let icmp = icmp4_frag_needed([10, 88, 9, 254], VIP, CLIENT, 6443, 40600);
    assert!(icmp.len() - 14 + 20 > 60);
    let (v, out, _) = t.dp.test_run("lb_xdp", &icmp, 1).unwrap();
    assert_eq!((v, out), (DROP, icmp));
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 1);
    assert_eq!(counter(&t, stat::ICMP_FORWARDED), 0);
    // A TCP segment as big is answered (it is not an error).
    let mut l4 = tcp(40600, 6443, ACK);
    l4.extend_from_slice(&[0x5a; 20]);
    let seg = ipv4_frame(CLIENT, VIP, PROTO_TCP, &l4);
    let (v, out, _) = t.dp.test_run("lb_xdp", &seg, 1).unwrap();
    assert_eq!((v, out[14 + 9]), (TX, 1), "answered with ICMP");
}

/// `inner` (an IPv4 or IPv6 frame) in IPv6 from `src` to `BACKEND6`, behind the outer
/// extension headers `ext` (`ipv6_frame_ext`'s form).
fn wrapped6_ext(src: &str, ext: &[(u8, u8)], inner: &[u8]) -> Vec<u8> {
    let proto = if inner[14] >> 4 == 4 { 4 } else { 41 };
    ipv6_frame_ext(
        v6(src.parse().unwrap()),
        v6(BACKEND6.parse().unwrap()),
        proto,
        ext,
        &inner[14..],
    )
}

#[test]
fn an_lb_nodes_packet_with_outer_extension_headers_is_dropped_and_counted() {
    // An LB node wraps with a bare IPv6 header. One behind extension headers (a fragment
    // header, destination options) cannot be checked like one without: it must not reach the
    // stack (a tunnel device there would unwrap it unchecked).
    let mut d = decap();
    let inner = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN));
    let inner6 = ipv6_frame(
        v6(CLIENT6.parse().unwrap()),
        v6(VIP6.parse().unwrap()),
        PROTO_TCP,
        &tcp(40000, 6443, SYN),
    );
    // The same without extension headers: unwrapped.
    let (v, out) = d.test_run(&wrapped6_ext(LB6, &[], &inner)).unwrap();
    assert_eq!((v, &out[14..]), (PASS, &inner[14..]));
    let chains: [(&[(u8, u8)], &str); 5] = [
        (&[(60, 0)], "destination options"),
        (&[(44, 0)], "a fragment header"),
        (&[(0, 0), (60, 1)], "hop-by-hop and destination options"),
        (&[(60, 0); 5], "more extension headers than are walked"),
        (&[(43, 0)], "a routing header"),
    ];
    for (ext, why) in chains {
        for inner in [&inner, &inner6] {
            let (v, _) = d.test_run(&wrapped6_ext(LB6, ext, inner)).unwrap();
            assert_eq!(v, DROP, "{why}");
        }
    }
    assert_eq!(decap_count(&d, decap_stat::MALFORMED), 10);
    assert_eq!(decap_count(&d, decap_stat::DECAPSULATED), 1);
    // From a source that is not an LB node: not ours, passed unchanged, as IP-in-IP from any
    // stranger is.
    let stranger = wrapped6_ext("fd88::66", &[(60, 0)], &inner);
    let (v, out) = d.test_run(&stranger).unwrap();
    assert_eq!((v, out), (PASS, stranger));
    assert_eq!(decap_count(&d, decap_stat::NOT_FROM_PEER), 1);
    // An LB node's own traffic with extension headers that is not IP-in-IP (a fragmented
    // datagram): not a tunnel packet, passed unchanged.
    let own = ipv6_frame_ext(
        v6(LB6.parse().unwrap()),
        v6(BACKEND6.parse().unwrap()),
        PROTO_UDP,
        &[(44, 0)],
        &udp(5000, 53, 64),
    );
    let (v, out) = d.test_run(&own).unwrap();
    assert_eq!((v, out), (PASS, own));
    assert_eq!(decap_count(&d, decap_stat::MALFORMED), 10);
}

#[test]
fn only_tcp_udp_and_icmp_are_unwrapped() {
    // An LB node wraps only what lb_xdp forwards: TCP, UDP, and ICMP errors about them, never
    // fragments. A tunnel nested inside (IP-in-IP, GRE) addressed to a VIP would otherwise reach
    // any tunnel device that is up on the backend (a CNI's tunl0) and be unwrapped again there.
    let mut d = decap();
    let lb = [10, 88, 0, 10];
    let client6 = v6(CLIENT6.parse().unwrap());
    let vip6 = v6(VIP6.parse().unwrap());
    let nested = ipv4_frame(CLIENT, [10, 99, 7, 7], PROTO_TCP, &tcp(1, 22, SYN));
    let refused: [(Vec<u8>, &str); 7] = [
        (ipv4_frame(CLIENT, VIP, 4, &nested[14..]), "IP-in-IP inside"),
        (ipv4_frame(CLIENT, VIP, 47, &[0u8; 24]), "GRE inside"),
        (
            ipv4_frame(CLIENT, VIP, 41, &[0u8; 48]),
            "IPv6-in-IPv4 inside",
        ),
        (ipv4_frame(CLIENT, VIP, 132, &[0u8; 24]), "SCTP inside"),
        (
            ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[], &tcp(1, 6443, ACK), 0x2000),
            "an IPv4 fragment inside",
        ),
        (
            ipv6_frame(client6, vip6, 4, &nested[14..]),
            "IP-in-IPv6 inside",
        ),
        (
            ipv6_fragment(client6, vip6, PROTO_TCP, &tcp(1, 6443, ACK)),
            "an IPv6 fragment inside",
        ),
    ];
    for (inner, why) in &refused {
        let (v, _) = d.test_run(&wrapped4(lb, inner)).unwrap();
        assert_eq!(v, DROP, "{why}");
    }
    assert_eq!(decap_count(&d, decap_stat::INNER_PROTO), 7);
    let icmp = icmp4_frag_needed([10, 88, 9, 254], VIP, CLIENT, 6443, 40000);
    let icmp_to_vip = ipv4_frame(CLIENT, VIP, 1, &icmp[34..]);
    let served: [(Vec<u8>, &str); 5] = [
        (
            ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(1, 6443, SYN)),
            "TCP",
        ),
        (ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(1, 53, 8)), "UDP"),
        (icmp_to_vip, "ICMP"),
        (
            ipv6_frame_ext(client6, vip6, PROTO_TCP, &[(60, 0)], &tcp(1, 6443, SYN)),
            "IPv6 TCP behind destination options",
        ),
        (
            ipv6_frame(client6, vip6, 58, &[2, 0, 0, 0, 0, 0, 5, 0]),
            "ICMPv6",
        ),
    ];
    for (inner, why) in &served {
        let (v, out) = d.test_run(&wrapped4(lb, inner)).unwrap();
        assert_eq!((v, &out[14..]), (PASS, &inner[14..]), "{why}");
    }
    assert_eq!(decap_count(&d, decap_stat::DECAPSULATED), 5);
    assert_eq!(decap_count(&d, decap_stat::INNER_PROTO), 7);
}

#[test]
fn an_ipv6_packet_is_never_told_a_path_mtu_that_its_packets_still_do_not_fit() {
    // A client never lowers its IPv6 path MTU below 1280 (RFC 8201: a smaller "packet too big"
    // is discarded or read as 1280). So where a 1280-byte packet does not fit once wrapped (a
    // 1300-byte IPv6 path takes 1260 inside), telling it 1280 only makes it resend packets that
    // are dropped again: a black hole dressed as an answer. Such a packet is dropped and
    // counted, never answered with a wrong MTU (user space takes such a pair out of new IPv6
    // flows: `plan`).
    let vip: IpAddr = VIP6.parse().unwrap();
    let client: IpAddr = CLIENT6.parse().unwrap();
    let mut t = setup(vip, PROTO_UDP, vec![routed("fd99:4::2", LB6, 1300)]);
    for size in [1281usize, 1400] {
        let big = ipv6_frame(v6(client), v6(vip), PROTO_UDP, &udp(5000, 53, size - 48));
        let (v, _, _) = t.dp.test_run("lb_xdp", &big, 1).unwrap();
        assert_eq!(v, DROP, "a {size}-byte packet: no PTB the client could use");
    }
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 2);
    // Where 1280 fits (a 1320-byte path), the true value is told, whatever the packet's size.
    let mut t = setup(vip, PROTO_UDP, vec![routed("fd99:4::2", LB6, 1320)]);
    let big = ipv6_frame(v6(client), v6(vip), PROTO_UDP, &udp(5000, 53, 1400 - 48));
    let (v, out, _) = t.dp.test_run("lb_xdp", &big, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(u32::from_be_bytes(out[58..62].try_into().unwrap()), 1280);
}

/// Run `f` on a thread inside a network namespace of its own whose loopback device has MTU
/// `mtu`: BPF_PROG_TEST_RUN takes the frames as received on the loopback device of the
/// caller's namespace, so this is the MTU of the device the frames "came in on".
fn on_a_device_with_mtu<T: Send>(mtu: u32, f: impl FnOnce() -> T + Send) -> T {
    let netns = lb_tests::unique("gro");
    lb_tests::lab::sh(&["ip", "netns", "add", &netns]);
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = lb_tests::lab::try_sh(&["ip", "netns", "del", &self.0]);
        }
    }
    let _gone = Gone(netns.clone());
    lb_tests::lab::sh(&[
        "ip",
        "-n",
        &netns,
        "link",
        "set",
        "lo",
        "mtu",
        &mtu.to_string(),
    ]);
    let path = format!("/run/netns/{netns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = std::fs::File::open(&path).unwrap();
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}");
            f()
        })
        .join()
        .unwrap()
    })
}

#[test]
fn a_gro_merge_is_wrapped_whole_not_answered_with_fragmentation_needed() {
    // In generic mode (br-ex) the program sees TCP segments after GRO merged them: a frame
    // longer than the device's MTU, made of segments that each fit. The pair's path takes
    // 1500 bytes, the device 1500: each segment fits once wrapped if the client's MSS says
    // so, the merge does not.
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_TCP,
        vec![routed(BACKEND, LB, 1500)],
    );
    let mut l4 = tcp(40000, 443, ACK);
    l4.extend(std::iter::repeat_n(7u8, 2 * 1440));
    let merged = ipv4_frame(CLIENT, VIP, PROTO_TCP, &l4);
    let (v, out, _) = on_a_device_with_mtu(1500, || t.dp.test_run("lb_xdp", &merged, 1).unwrap());
    assert_eq!(v, TX);
    assert_eq!(
        counter(&t, stat::ENCAP_TOO_BIG),
        0,
        "no false fragmentation needed"
    );
    assert_eq!(counter(&t, stat::ENCAPSULATED), 1);
    assert_eq!(out.len(), merged.len() + 20, "wrapped whole");
    assert_eq!(&out[34..], &merged[14..], "the merge unchanged inside");
    // The same frame on a device whose MTU lets it in as one frame (a jumbo frame, no merge)
    // is too big for the path: answered, as before.
    let (v, out, _) = t.dp.test_run("lb_xdp", &merged, 1).unwrap();
    assert_eq!(v, TX);
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 1);
    assert_eq!(
        (out[14 + 9], out[34]),
        (1, 3),
        "ICMP destination unreachable"
    );
    // A UDP datagram that long is no GRO merge: answered on the 1500-byte device too.
    let big_udp = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5000, 53, 2 * 1440));
    let mut t = setup(
        IpAddr::from(VIP),
        PROTO_UDP,
        vec![routed(BACKEND, LB, 1500)],
    );
    let (v, _, _) = on_a_device_with_mtu(1500, || t.dp.test_run("lb_xdp", &big_udp, 1).unwrap());
    assert_eq!(v, TX);
    assert_eq!(counter(&t, stat::ENCAP_TOO_BIG), 1);
}
