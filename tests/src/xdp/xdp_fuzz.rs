//! The randomized property test of the forwarding rule: mutated frames through the real XDP
//! program (BPF_PROG_TEST_RUN), each verdict checked against the independent strict reading in
//! [`crate::strict`]. Used by `tests/xdp_property.rs` (a bounded run) and by the `xdpfuzz` tool
//! behind `cargo xtask fuzz-xdp --frames N --seed S`.
//!
//! Properties checked for every frame:
//! - never XDP_ABORTED (or an unknown verdict);
//! - forwarded (XDP_TX / redirect) => the strict reading says it is a packet of an owned service;
//!   the output equals the input except the two MACs; the destination MAC is an in-set backend's
//!   of that service and the source MAC the interface's;
//! - passed or dropped => the frame is unchanged;
//! - the converse, so the two parsers cannot drift apart silently: a packet of an owned service
//!   with backends in its table is forwarded.

use std::{net::IpAddr, time::Instant};

use lb_common::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use lb_userspace::dataplane::{BackendSpec, Desired, ServiceSpec, addr_bytes, vip_key};

use crate::{
    TestDataplane, backend,
    frames::*,
    strict::{self, Reading, Service},
};

const ABORTED: u32 = 0;
const DROP: u32 = 1;
const PASS: u32 = 2;
const TX: u32 = 3;
const REDIRECT: u32 = 4;

/// MAC of another lbd node in the fuzzed data plane (the loop guard must pass its frames).
pub const PEER_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x07];

/// splitmix64: small, deterministic, good enough to drive mutations from one seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

/// A valid seed frame and where its headers are (offsets the mutations aim at).
#[derive(Clone)]
struct Seed {
    frame: Vec<u8>,
    /// Offsets of length fields and other header bytes worth hitting.
    fields: Vec<usize>,
}

const VIP: [u8; 4] = [10, 88, 0, 100];
const VIP_OTHER: [u8; 4] = [10, 88, 0, 101];
const CLIENT: [u8; 4] = [10, 88, 0, 1];
const VIP6: &str = "fd88::100";
const CLIENT6: &str = "fd88::1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn down(mut b: BackendSpec) -> BackendSpec {
    b.healthy = false;
    b
}

fn drained(mut b: BackendSpec) -> BackendSpec {
    b.drained = true;
    b
}

/// The fuzzed configuration: TCP and UDP services on IPv4 and IPv6 (one for every port), a
/// backend that is down, one drained, and a VIP this node does not own.
fn services() -> Vec<ServiceSpec> {
    let svc = |addr: IpAddr, port, proto, owned, backends| ServiceSpec {
        key: vip_key(addr, port, proto),
        owned,
        backends,
    };
    vec![
        svc(
            IpAddr::from(VIP),
            6443,
            PROTO_TCP,
            true,
            vec![
                backend("10.88.0.11", 11),
                backend("10.88.0.12", 12),
                down(backend("10.88.0.13", 13)),
                drained(backend("10.88.0.14", 14)),
            ],
        ),
        svc(
            IpAddr::from(VIP),
            53,
            PROTO_UDP,
            true,
            vec![backend("10.88.0.11", 21)],
        ),
        svc(
            ip(VIP6),
            443,
            PROTO_TCP,
            true,
            vec![backend("fd88::11", 31), backend("fd88::12", 32)],
        ),
        svc(ip(VIP6), 0, PROTO_UDP, true, vec![backend("fd88::11", 41)]),
        svc(
            IpAddr::from(VIP_OTHER),
            80,
            PROTO_TCP,
            false,
            vec![backend("10.88.0.11", 51)],
        ),
    ]
}

fn oracle(specs: &[ServiceSpec]) -> Vec<Service> {
    specs
        .iter()
        .map(|s| {
            let addr = lb_userspace::dataplane::key_addr(&s.key.addr, s.key.family);
            Service {
                addr,
                port: s.key.port,
                proto: s.key.proto,
                owned: s.owned,
                in_set: s
                    .backends
                    .iter()
                    .filter(|b| b.in_set())
                    .filter_map(|b| b.mac)
                    .collect(),
                has_table: s.backends.iter().any(|b| b.in_table()),
            }
        })
        .collect()
}

fn tcp_opts(sport: u16, dport: u16, flags: u8, opts: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut t = tcp(sport, dport, flags);
    t[12] = (((20 + opts.len()) / 4) << 4) as u8;
    t.extend_from_slice(opts);
    t.extend_from_slice(payload);
    t
}

/// Header offsets of a frame built by `frames` (Ethernet at 0, IP at 14).
fn fields_v4(ihl: usize, l4: &[usize]) -> Vec<usize> {
    let mut f = vec![12, 13, 14, 16, 17, 20, 21, 23, 30, 31, 32, 33];
    f.extend(l4.iter().map(|o| 14 + ihl + o));
    f
}

fn fields_v6(l4_off: usize, l4: &[usize]) -> Vec<usize> {
    let mut f = vec![12, 13, 14, 18, 19, 20, 54, 55, 56, 57, 68, 69];
    f.extend(l4.iter().map(|o| l4_off + o));
    f
}

const TCP_FIELDS: [usize; 7] = [0, 1, 2, 3, 12, 13, 20];
const UDP_FIELDS: [usize; 6] = [0, 1, 2, 3, 4, 5];

fn seeds() -> Vec<Seed> {
    let (c6, v6) = (addr_bytes(ip(CLIENT6)).0, addr_bytes(ip(VIP6)).0);
    let payload = b"GET /readyz HTTP/1.1\r\nHost: api\r\n\r\n";
    let mut s = Vec::new();
    let mut add = |frame: Vec<u8>, fields: Vec<usize>| s.push(Seed { frame, fields });
    add(
        ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40000, 6443, SYN)),
        fields_v4(20, &TCP_FIELDS),
    );
    add(
        ipv4_frame(
            CLIENT,
            VIP,
            PROTO_TCP,
            &tcp_opts(
                40001,
                6443,
                ACK,
                &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
                payload,
            ),
        ),
        fields_v4(20, &TCP_FIELDS),
    );
    add(
        ipv4_frame_opts(
            CLIENT,
            VIP,
            PROTO_TCP,
            &[1, 1, 1, 0, 7, 7, 4, 0],
            &tcp(40002, 6443, ACK),
            0x4000,
        ),
        fields_v4(28, &TCP_FIELDS),
    );
    add(
        ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5353, 53, 24)),
        fields_v4(20, &UDP_FIELDS),
    );
    // Shorter than the Ethernet minimum: padded with zeros, which are not payload.
    let mut padded = ipv4_frame(CLIENT, VIP, PROTO_UDP, &udp(5354, 53, 2));
    padded.resize(60, 0);
    add(padded, fields_v4(20, &UDP_FIELDS));
    add(
        ipv6_frame(c6, v6, PROTO_TCP, &tcp(50000, 443, SYN)),
        fields_v6(54, &TCP_FIELDS),
    );
    add(
        ipv6_frame_ext(c6, v6, PROTO_TCP, &[(0, 0), (60, 1)], &tcp(50001, 443, ACK)),
        fields_v6(54 + 8 + 16, &TCP_FIELDS)
            .into_iter()
            .chain([54, 55, 62, 63])
            .collect(),
    );
    add(
        ipv6_frame_ext(c6, v6, PROTO_UDP, &[(43, 0)], &udp(6000, 4789, 16)),
        fields_v6(62, &UDP_FIELDS)
            .into_iter()
            .chain([54, 55])
            .collect(),
    );
    add(
        icmp4_frag_needed([10, 88, 0, 254], VIP, CLIENT, 6443, 40000),
        fields_v4(20, &[0, 1, 8, 9, 10, 11, 16, 17, 28, 29, 30, 31]),
    );
    add(
        icmp6_too_big(addr_bytes(ip("fd88::fe")).0, v6, c6, 443, 50000),
        fields_v6(54, &[0, 1, 8, 12, 13, 14, 48, 49, 50, 51]),
    );
    // Fragments: first (MF) and a later one, IPv4 and IPv6.
    add(
        ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[], &tcp(40003, 6443, ACK), 0x2000),
        fields_v4(20, &TCP_FIELDS),
    );
    add(
        ipv4_frame_opts(CLIENT, VIP, PROTO_TCP, &[], &tcp(40003, 6443, ACK), 0x0005),
        fields_v4(20, &TCP_FIELDS),
    );
    add(
        ipv6_fragment(c6, v6, PROTO_TCP, &tcp(50002, 443, ACK)),
        fields_v6(62, &TCP_FIELDS)
            .into_iter()
            .chain([54, 56, 57])
            .collect(),
    );
    // A VLAN tag in front of a valid packet.
    let mut tagged = ipv4_frame(CLIENT, VIP, PROTO_TCP, &tcp(40004, 6443, SYN));
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
    add(tagged, vec![12, 13, 14, 15, 16, 17]);
    // Not for a service: a VIP this node does not own, another port, another protocol.
    add(
        ipv4_frame(CLIENT, VIP_OTHER, PROTO_TCP, &tcp(40005, 80, SYN)),
        fields_v4(20, &TCP_FIELDS),
    );
    add(
        ipv4_frame(CLIENT, VIP, PROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1]),
        fields_v4(20, &[0, 1]),
    );
    s
}

/// Change the frame: 1 to 3 of truncation, byte changes in header fields (length fields
/// included), ethertype changes, garbage tails, a peer's source MAC.
fn mutate(seed: &Seed, rng: &mut Rng) -> Vec<u8> {
    let mut f = seed.frame.clone();
    for _ in 0..1 + rng.below(3) {
        match rng.below(10) {
            0 => {
                let len = 14 + rng.below(f.len() - 13);
                f.truncate(len);
            }
            1..=4 => {
                // A header field: a random value, or one off, or an extreme.
                let at = seed.fields[rng.below(seed.fields.len())];
                if at < f.len() {
                    f[at] = match rng.below(4) {
                        0 => rng.byte(),
                        1 => f[at].wrapping_add(1),
                        2 => f[at].wrapping_sub(1),
                        _ => [0u8, 0xff, 0x0f, 0xf0][rng.below(4)],
                    };
                }
            }
            5 => {
                let at = rng.below(f.len().min(120));
                f[at] = rng.byte();
            }
            6 => {
                let t: [u8; 2] =
                    [[0x08, 0x00], [0x86, 0xdd], [0x81, 0x00], [0x88, 0xa8]][rng.below(4)];
                f[12..14].copy_from_slice(&t);
            }
            7 => {
                let n = 1 + rng.below(64);
                for _ in 0..n {
                    f.push(rng.byte());
                }
            }
            8 => f[6..12].copy_from_slice(&PEER_MAC),
            _ => {
                // Another client (a new flow), same everything else.
                if f.len() > 14 + 16 && f[12..14] == [0x08, 0x00] {
                    f[14 + 12 + 3] = rng.byte();
                } else if f.len() > 14 + 24 {
                    f[14 + 8 + 15] = rng.byte();
                }
            }
        }
    }
    f
}

/// What a run saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub frames: u64,
    pub forwarded: u64,
    pub passed: u64,
    pub dropped: u64,
    /// Frames the strict reading accepted as service packets.
    pub service_packets: u64,
    pub seconds: f64,
}

impl Report {
    pub fn frames_per_second(&self) -> f64 {
        self.frames as f64 / self.seconds.max(1e-9)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Run `frames` mutated frames from `seed` through the real program; panics on the first frame
/// that breaks a property, naming the seed and the frame.
pub fn run(frames: u64, seed: u64) -> Report {
    let specs = services();
    let mut t = TestDataplane::new(65537);
    t.dp.apply(&Desired {
        services: specs.clone(),
        peers: vec![PEER_MAC],
    })
    .expect("apply the fuzzed configuration");
    let oracle = oracle(&specs);
    let seeds = seeds();
    for s in &seeds {
        let (v, _, _) = t.dp.test_run("lb_xdp", &s.frame, 1).unwrap();
        assert_ne!(v, ABORTED, "a seed frame aborted");
    }
    let mut rng = Rng::new(seed);
    let mut r = Report {
        seed,
        ..Default::default()
    };
    let start = Instant::now();
    for n in 0..frames {
        let s = &seeds[rng.below(seeds.len())];
        let frame = mutate(s, &mut rng);
        let (verdict, out, _) = t.dp.test_run("lb_xdp", &frame, 1).unwrap();
        let reading = strict::read(&frame, &oracle, &[PEER_MAC]);
        let ctx = || {
            format!(
                "seed {seed}, frame #{n}: {}\nstrict reading: {reading:?}, verdict {verdict}",
                hex(&frame)
            )
        };
        r.frames += 1;
        if matches!(reading, Reading::Service(_)) {
            r.service_packets += 1;
        }
        match verdict {
            TX | REDIRECT => {
                r.forwarded += 1;
                let Reading::Service(i) = reading else {
                    panic!("forwarded a frame that is not a service packet\n{}", ctx());
                };
                let svc = &oracle[i];
                assert!(svc.owned, "forwarded for a VIP not owned\n{}", ctx());
                assert_eq!(out.len(), frame.len(), "length changed\n{}", ctx());
                assert_eq!(
                    out[12..],
                    frame[12..],
                    "bytes after the MACs changed\n{}",
                    ctx()
                );
                let dst: [u8; 6] = out[0..6].try_into().unwrap();
                assert!(
                    svc.in_set.contains(&dst),
                    "destination MAC {} is not an in-set backend's\n{}",
                    hex(&dst),
                    ctx()
                );
                assert_eq!(out[6..12], LB_MAC, "source MAC\n{}", ctx());
            }
            PASS | DROP => {
                if verdict == PASS {
                    r.passed += 1;
                } else {
                    r.dropped += 1;
                }
                assert_eq!(out, frame, "a passed or dropped frame changed\n{}", ctx());
                // The converse (frames short enough that no header cap of the program applies).
                if let Reading::Service(i) = reading
                    && oracle[i].owned
                    && oracle[i].has_table
                    && frame.len() < 400
                {
                    panic!("a service packet was not forwarded\n{}", ctx());
                }
            }
            other => panic!("verdict {other} (aborted or unknown)\n{}", ctx()),
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r
}
