//! The flow cache in front of the connection table (`LB_FLOW_CACHE_V3`, lb-ebpf `flows.rs`),
//! with the real XDP program through BPF_PROG_TEST_RUN and the real maps read and written through
//! their pins:
//! - a flow served from the cache keeps its backend after its LRU entry aged out and the table
//!   changed, and still keeps it when other flows take its way (it is written back);
//! - the cache is really consulted (a good entry wins over the LRU hash), and an entry whose check
//!   word does not bind its value to its key (a torn read) is never trusted, for IPv4 and IPv6;
//! - a line holds two IPv4 flows, or one IPv6 flow, and IPv4 and IPv6 flows displace each other
//!   without losing either;
//! - a way goes to the flow that uses it: a flow that lost its way to flows that went idle gets
//!   one back within a few packets, and occupants that keep forwarding keep theirs.
//!
//! Needs root; `cargo xtask test`.

use std::net::IpAddr;

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};
use lb_common::{
    FlowCacheLine, FlowKey, FlowValue, PROTO_TCP, V4_CHECK, V6_CHECK, WAY_WORDS, flow_cache_check,
    flow_cache_hash, flow_cache_index, flow_cache_seed,
};
use lb_tests::{TestDataplane, backend, frames::*};
use lb_userspace::dataplane::{Desired, ServiceSpec, addr_bytes, vip_key};

const TX: u32 = 3;
const VIP4: [u8; 4] = [10, 68, 0, 100];
const VIP6: [u8; 16] = [0xfd, 0x68, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x64];
const PORT: u16 = 6443;

fn desired(vip: IpAddr, n: u8) -> Desired {
    let backends = (11..11 + n)
        .map(|i| {
            let addr = match vip {
                IpAddr::V4(_) => format!("10.68.0.{i}"),
                IpAddr::V6(_) => format!("fd68::{i}"),
            };
            backend(&addr, i)
        })
        .collect();
    Desired {
        services: vec![ServiceSpec {
            key: vip_key(vip, PORT, PROTO_TCP),
            owned: true,
            backends,
        }],
        ..Default::default()
    }
}

struct Maps {
    conntrack: BpfHashMap<MapData, FlowKey, FlowValue>,
    cache: Array<MapData, FlowCacheLine>,
    seed: u64,
    config: u32,
}

impl Maps {
    fn open(t: &TestDataplane) -> Maps {
        let pin = |name: &str| MapData::from_pin(t.opts.pin_dir().join(name)).unwrap();
        let config: Array<MapData, lb_common::LbConfig> =
            Array::try_from(Map::Array(pin(lb_common::maps::CONFIG))).unwrap();
        let config = config.get(&0, 0).unwrap();
        assert_eq!(
            1 << (config.flow_cache & 31),
            lb_common::flow_cache_slots(t.opts.conntrack_size)
        );
        assert_ne!(config.flow_cache >> 5, 0, "a secret seed part");
        Maps {
            conntrack: BpfHashMap::try_from(Map::LruHashMap(pin(lb_common::maps::CONNTRACK)))
                .unwrap(),
            cache: Array::try_from(Map::Array(pin(lb_common::maps::FLOW_CACHE))).unwrap(),
            seed: flow_cache_seed(t.opts.hash_seed, config.flow_cache),
            config: config.flow_cache,
        }
    }

    /// The index of `k`'s home line (its buddy is `^ 1`).
    fn slot(&self, k: &FlowKey) -> u32 {
        flow_cache_index(flow_cache_hash(k, self.seed), self.config)
    }

    fn line_at(&self, i: u32) -> FlowCacheLine {
        self.cache.get(&i, 0).unwrap()
    }

    fn set_line_at(&mut self, i: u32, line: FlowCacheLine) {
        self.cache.set(i, line, 0).unwrap();
    }

    /// The home line of `k`.
    fn line(&self, k: &FlowKey) -> FlowCacheLine {
        self.line_at(self.slot(k))
    }

    /// Where `k` is cached: its home line or its buddy, and the way.
    fn find(&self, k: &FlowKey) -> Option<(u32, usize)> {
        let home = self.slot(k);
        [home, home ^ 1]
            .into_iter()
            .find_map(|i| self.line_at(i).way_of(k).map(|w| (i, w)))
    }

    /// `k`'s entry in the cache, whatever its check word says: value and check word.
    fn entry(&self, k: &FlowKey) -> Option<(FlowValue, u64)> {
        self.find(k).map(|(i, w)| self.line_at(i).value(w))
    }

    fn holds(&self, k: &FlowKey) -> bool {
        self.find(k).is_some()
    }

    /// Empty `k`'s home line and its buddy.
    fn clear(&mut self, k: &FlowKey) {
        let home = self.slot(k);
        for i in [home, home ^ 1] {
            self.set_line_at(i, FlowCacheLine::default());
        }
    }

    /// For ports f in `fs` from `client`, each in a pair of lines (home and buddy) of its own,
    /// `n` ports from `g_from` on whose flows have f's home line.
    fn line_sets(
        &self,
        client: IpAddr,
        vip: IpAddr,
        fs: std::ops::Range<u16>,
        g_from: u16,
        n: usize,
    ) -> Vec<(u16, Vec<u16>)> {
        let mut used = std::collections::HashSet::new();
        fs.filter_map(|f| {
            let s = self.slot(&key(client, vip, f));
            if !used.insert(s >> 1) {
                return None;
            }
            let gs: Vec<u16> = (g_from..u16::MAX)
                .filter(|g| self.slot(&key(client, vip, *g)) == s)
                .take(n)
                .collect();
            (gs.len() == n).then_some((f, gs))
        })
        .collect()
    }
}

/// The word of `line` that holds way `way`'s check word.
fn check_word(line: &FlowCacheLine, way: usize) -> usize {
    if line.is_v6() {
        V6_CHECK
    } else {
        WAY_WORDS * way + V4_CHECK
    }
}

fn key(client: IpAddr, vip: IpAddr, sport: u16) -> FlowKey {
    let (src, family) = addr_bytes(client);
    let (dst, _) = addr_bytes(vip);
    FlowKey {
        src,
        dst,
        sport,
        dport: PORT,
        proto: PROTO_TCP,
        family,
        _pad: [0; 2],
    }
}

fn frame(client: IpAddr, vip: IpAddr, sport: u16, flags: u8) -> Vec<u8> {
    match (client, vip) {
        (IpAddr::V4(c), IpAddr::V4(v)) => {
            ipv4_frame(c.octets(), v.octets(), PROTO_TCP, &tcp(sport, PORT, flags))
        }
        (IpAddr::V6(c), IpAddr::V6(v)) => {
            ipv6_frame(c.octets(), v.octets(), PROTO_TCP, &tcp(sport, PORT, flags))
        }
        _ => unreachable!(),
    }
}

/// The last byte of the backend MAC the packet was sent to.
fn send(t: &mut TestDataplane, f: &[u8]) -> u8 {
    let (v, out, _) = t.dp.test_run("lb_xdp", f, 1).unwrap();
    assert_eq!(v, TX, "forwarded");
    out[5]
}

#[test]
fn a_cached_flow_keeps_its_backend_after_its_lru_entry_aged_out_and_when_its_slot_is_taken() {
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 1, 1]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);

    // 64 flows, each in a pair of lines (home and buddy) of its own, and for each four more
    // flows with its home line (a pair of lines has four IPv4 ways).
    // (flow's port, the ports of the flows on the same line, backend, the flow's entry)
    let mut flows: Vec<(u16, Vec<u16>, u8, FlowValue)> = Vec::new();
    for (f, gs) in m.line_sets(client, vip, 10000..11000, 11000, 4) {
        if flows.len() == 64 {
            break;
        }
        let b = send(&mut t, &frame(client, vip, f, SYN));
        assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), b);
        let v = m.conntrack.get(&key(client, vip, f), 0).unwrap();
        flows.push((f, gs, b, v));
    }
    assert_eq!(flows.len(), 64);
    for (f, _, _, v) in &flows {
        let k = key(client, vip, *f);
        assert_eq!(m.entry(&k).map(|e| e.0), Some(*v), "a new flow takes a way");
        // Served from the cache, the flow's LRU entry may age out: do it here.
        m.conntrack.remove(&k).unwrap();
    }
    // A fourth backend: Maglev moves about a quarter of the flows' slots to it.
    t.dp.apply(&desired(vip, 4)).unwrap();
    for (f, _, b, _) in &flows {
        assert_eq!(
            send(&mut t, &frame(client, vip, *f, ACK)),
            *b,
            "a cached flow keeps its backend"
        );
    }
    // Four other flows take the lines: the first three the free ways (the home line's, then
    // the buddy's), the fourth the home line's older way, the flow's; the flow is written back
    // to the LRU hash first.
    for (f, gs, b, v) in &flows {
        let k = key(client, vip, *f);
        for g in &gs[..3] {
            send(&mut t, &frame(client, vip, *g, SYN));
        }
        assert!(m.holds(&k), "free ways are taken first");
        assert_eq!(m.find(&key(client, vip, gs[1])).unwrap().0, m.slot(&k) ^ 1);
        send(&mut t, &frame(client, vip, gs[3], SYN));
        assert!(gs.iter().all(|g| m.holds(&key(client, vip, *g))));
        let back = m
            .conntrack
            .get(&k, 0)
            .expect("written back to the LRU hash");
        assert_eq!(back, *v);
        assert_eq!(
            send(&mut t, &frame(client, vip, *f, ACK)),
            *b,
            "a flow that lost its way keeps its backend"
        );
        // Found in the LRU hash only; its line's occupants are good and in use, so it does not
        // take a way back.
        assert!(!m.holds(&k), "no ping-pong over a line");
    }
    // The test could fail: without their entries, some of these flows would move now.
    let mut moved = 0;
    for (f, gs, b, _) in &flows {
        m.conntrack.remove(&key(client, vip, *f)).unwrap();
        for g in gs {
            let _ = m.conntrack.remove(&key(client, vip, *g));
        }
        if send(&mut t, &frame(client, vip, *f, ACK)) != *b {
            moved += 1;
        }
    }
    assert!(
        moved > 0,
        "the fourth backend took some of the flows' slots"
    );
}

fn cache_is_consulted_and_torn_slots_are_not_trusted(vip: IpAddr, client: IpAddr) {
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let installed = t.dp.installed(&vip_key(vip, PORT, PROTO_TCP));
    let pair = |n: u8| {
        let b = installed
            .iter()
            .find(|b| b.spec.mac.unwrap()[5] == n)
            .unwrap();
        FlowValue {
            backend_id: b.id,
            epoch: b.epoch,
        }
    };
    for sport in 30000..30016u16 {
        let k = key(client, vip, sport);
        let b = send(&mut t, &frame(client, vip, sport, SYN));
        let other = if b == 11 { 12 } else { 11 };
        let (i, way) = m.find(&k).expect("the SYN's decision is cached");
        let e = m.entry(&k).unwrap();
        assert_eq!(
            e,
            (
                pair(b),
                flow_cache_check(flow_cache_hash(&k, m.seed), pair(b))
            ),
            "the SYN's decision is cached, with its check word"
        );

        // A good entry wins over the LRU hash: the cache is where the flow is looked up.
        let mut good = m.line_at(i);
        good.put(way, &k, pair(other), m.seed);
        m.set_line_at(i, good);
        assert_eq!(send(&mut t, &frame(client, vip, sport, ACK)), other);

        // The same way as a reader sees it while another CPU rewrites it: this key, the
        // value of another entry, a check word that binds neither. The LRU hash decides.
        m.conntrack.insert(k, pair(b), 0).unwrap();
        let mut torn = good;
        torn.w[check_word(&torn, way)] = e.1 ^ 1;
        m.set_line_at(i, torn);
        assert_eq!(send(&mut t, &frame(client, vip, sport, ACK)), b);
        // ... and the flow takes its way back, written whole.
        assert_eq!(m.entry(&k), Some(e));
        assert_eq!(m.find(&k), Some((i, way)));

        // A check of another key's hash with this key's words: not trusted either.
        let other_key = key(client, vip, sport.wrapping_add(1000));
        let mut forged = good;
        forged.w[check_word(&forged, way)] =
            flow_cache_check(flow_cache_hash(&other_key, m.seed), pair(other));
        m.set_line_at(i, forged);
        assert_eq!(send(&mut t, &frame(client, vip, sport, ACK)), b);
    }
}

#[test]
fn the_cache_is_consulted_and_a_torn_slot_is_not_trusted_ipv4() {
    cache_is_consulted_and_torn_slots_are_not_trusted(
        IpAddr::from(VIP4),
        IpAddr::from([10, 68, 2, 2]),
    );
}

#[test]
fn the_cache_is_consulted_and_a_torn_slot_is_not_trusted_ipv6() {
    let mut c = VIP6;
    c[1] = 0x69;
    c[15] = 7;
    cache_is_consulted_and_torn_slots_are_not_trusted(IpAddr::from(VIP6), IpAddr::from(c));
}

fn counter(t: &TestDataplane, index: u32) -> u64 {
    t.dp.global_stats().unwrap()[index as usize].1
}

/// A data plane with three backends for `vip` (and `peers` as other lbd nodes) and one flow
/// from `client` whose SYN put it in the cache; the backend it went to.
fn cached_flow(
    vip: IpAddr,
    client: IpAddr,
    sport: u16,
    peers: Vec<[u8; 6]>,
) -> (TestDataplane, Maps, u8) {
    let mut t = TestDataplane::new(251);
    let mut want = desired(vip, 3);
    want.peers = peers;
    t.dp.apply(&want).unwrap();
    let m = Maps::open(&t);
    let b = send(&mut t, &frame(client, vip, sport, SYN));
    assert!(m.holds(&key(client, vip, sport)));
    (t, m, b)
}

/// The fast path (lb-ebpf `fast.rs`) decides only cached, established IPv4 TCP flows, and only
/// when the full path would decide the same: a cached flow's frame that is a fragment, longer
/// by its own length than the frame, has a bad TCP data offset, IP options, a SYN, or comes
/// from another lbd node gets what the full path gives it, and what it forwards is counted as
/// the full path counts it.
#[test]
fn the_fast_path_leaves_every_doubtful_frame_of_a_cached_flow_to_the_full_path() {
    use lb_common::stat;
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 3, 3]);
    let peer = [0x02, 0xee, 0, 0, 0, 9];
    let sport = 45000;
    let (mut t, m, b) = cached_flow(vip, client, sport, vec![peer]);
    let ack = frame(client, vip, sport, ACK);

    // Forwarded from the cache, counted as a connection-table hit, in its pair's counters.
    let before = t.dp.global_stats().unwrap();
    let id = m.entry(&key(client, vip, sport)).unwrap().0.backend_id;
    let pair_before = t.dp.backend_traffic(id).unwrap();
    assert_eq!(send(&mut t, &ack), b);
    let after = t.dp.global_stats().unwrap();
    for (i, n) in [
        (stat::VERDICT_TX, 1),
        (stat::FORWARDED, 1),
        (stat::CONNTRACK_HIT, 1),
        (stat::CONNTRACK_MISS, 0),
    ] {
        assert_eq!(
            after[i as usize].1 - before[i as usize].1,
            n,
            "{}",
            after[i as usize].0
        );
    }
    let pair_after = t.dp.backend_traffic(id).unwrap();
    assert_eq!(pair_after.packets - pair_before.packets, 1);
    assert_eq!(pair_after.bytes - pair_before.bytes, ack.len() as u64);

    // More-fragments set: a fragment to a VIP is dropped.
    let mut f = ack.clone();
    f[20] |= 0x20;
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 1, "XDP_DROP");
    assert_eq!(counter(&t, stat::DROP_FRAGMENT), 1);
    // Total length past the frame: malformed, passed.
    let mut f = ack.clone();
    f[16..18].copy_from_slice(&((ack.len() - 14 + 1) as u16).to_be_bytes());
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 2, "XDP_PASS");
    assert_eq!(counter(&t, stat::PASS_MALFORMED), 1);
    // TCP data offset below 5 words: malformed.
    let mut f = ack.clone();
    f[46] = 4 << 4;
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 2);
    assert_eq!(counter(&t, stat::PASS_MALFORMED), 2);
    // From another lbd node: the local stack serves it.
    let mut f = ack.clone();
    f[6..12].copy_from_slice(&peer);
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 2);
    assert_eq!(counter(&t, stat::PASS_FROM_PEER), 1);
    // IP options (IHL 6): the full path forwards it, to the same backend.
    let mut payload = tcp(sport, PORT, ACK);
    payload.extend_from_slice(b"x");
    let f = ipv4_frame_opts(
        [10, 68, 3, 3],
        VIP4,
        PROTO_TCP,
        &[1, 1, 1, 0],
        &payload,
        0x4000,
    );
    assert_eq!(send(&mut t, &f), b);
    // Not the owner any more: passed to the local stack, not forwarded from the cache.
    t.dp.set_owned(vip, false).unwrap();
    assert_eq!(t.dp.test_run("lb_xdp", &ack, 1).unwrap().0, 2);
    assert_eq!(counter(&t, stat::PASS_NOT_OWNER), 1);
    t.dp.set_owned(vip, true).unwrap();
    assert_eq!(send(&mut t, &ack), b);
    // A frame for another address: passed as not ours, by the fast path as by the full one.
    let other = ipv4_frame(
        [10, 68, 3, 3],
        [10, 68, 9, 9],
        PROTO_TCP,
        &tcp(sport, PORT, ACK),
    );
    let n = counter(&t, stat::PASS_NOT_VIP);
    assert_eq!(t.dp.test_run("lb_xdp", &other, 1).unwrap().0, 2);
    assert_eq!(counter(&t, stat::PASS_NOT_VIP), n + 1);
}

/// The same for IPv6: the fast path takes only a TCP header right after the fixed header.
#[test]
fn the_ipv6_fast_path_leaves_extension_headers_fragments_and_bad_lengths_to_the_full_path() {
    use lb_common::stat;
    let vip = IpAddr::from(VIP6);
    let mut c = VIP6;
    c[15] = 0x33;
    let client = IpAddr::from(c);
    let sport = 46000;
    let (mut t, _, b) = cached_flow(vip, client, sport, Vec::new());
    let ack = frame(client, vip, sport, ACK);
    let hits = counter(&t, stat::CONNTRACK_HIT);
    assert_eq!(send(&mut t, &ack), b);
    assert_eq!(counter(&t, stat::CONNTRACK_HIT), hits + 1);
    // A hop-by-hop options header: the full path walks it and forwards to the same backend.
    let f = ipv6_frame_ext(c, VIP6, PROTO_TCP, &[(0, 0)], &tcp(sport, PORT, ACK));
    assert_eq!(send(&mut t, &f), b);
    // A fragment header: dropped.
    let f = ipv6_fragment(c, VIP6, PROTO_TCP, &tcp(sport, PORT, ACK));
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 1, "XDP_DROP");
    assert_eq!(counter(&t, stat::DROP_FRAGMENT), 1);
    // Payload length past the frame, and 0 (a jumbogram): malformed, passed.
    for len in [(ack.len() - 54 + 1) as u16, 0] {
        let mut f = ack.clone();
        f[18..20].copy_from_slice(&len.to_be_bytes());
        assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 2, "XDP_PASS");
    }
    assert_eq!(counter(&t, stat::PASS_MALFORMED), 2);
    // Version 4 in an IPv6 ethertype: malformed.
    let mut f = ack.clone();
    f[14] = 0x40;
    assert_eq!(t.dp.test_run("lb_xdp", &f, 1).unwrap().0, 2);
    assert_eq!(counter(&t, stat::PASS_MALFORMED), 3);
    assert_eq!(send(&mut t, &ack), b);
}

#[test]
fn a_flow_gets_a_way_back_from_idle_occupants_and_not_from_active_ones() {
    // Flow f loses its way to the SYNs of g1..g4, flows with its home line (the home line and
    // its buddy have four IPv4 ways: g1 takes the home line's free way, g2 and g3 the buddy's,
    // g4 the home line's older, f's), and they all go idle. f's next packet, found only in the
    // LRU hash, may ask for a way but does not take one (all were just written); within a few
    // more of f's packets (one in eight asks, at random) f takes the home line's older way,
    // g1's, whose entry is kept in the LRU hash. Then all five are active in turn: the four
    // occupants each forward between g1's packets and keep their ways however many ask.
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 3, 3]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let m = Maps::open(&t);
    let mut checked = 0;
    let mut taken_after = Vec::new();
    for (f, gs) in m.line_sets(client, vip, 14000..14100, 30000, 4) {
        let kf = key(client, vip, f);
        let kg: Vec<FlowKey> = gs.iter().map(|g| key(client, vip, *g)).collect();
        let bf = send(&mut t, &frame(client, vip, f, SYN));
        let bg: Vec<u8> = gs
            .iter()
            .map(|g| send(&mut t, &frame(client, vip, *g, SYN)))
            .collect();
        assert!(
            kg.iter().all(|k| m.holds(k)) && !m.holds(&kf),
            "new decisions take the free ways, then the home line's older"
        );
        let vf = m.conntrack.get(&kf, 0).expect("the occupant written back");
        assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
        assert!(!m.holds(&kf), "occupants keep their ways at the first ask");
        // (7/8)^400: never, for a correct program.
        let packets = (1..=400)
            .find(|_| {
                assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
                m.holds(&kf)
            })
            .expect("idle occupants give a way up");
        taken_after.push(packets);
        assert_eq!(
            m.entry(&kf),
            Some((vf, flow_cache_check(flow_cache_hash(&kf, m.seed), vf))),
            "written whole"
        );
        assert_eq!(m.find(&kf).unwrap().0, m.slot(&kf), "in its home line");
        assert!(
            kg[1..].iter().all(|k| m.holds(k)) && !m.holds(&kg[0]),
            "the home line's older occupant gave its way up"
        );
        let vg = m
            .conntrack
            .get(&kg[0], 0)
            .expect("the idle occupant's entry is kept");
        // Five active flows on four ways, in turn: the occupants keep their ways. (Their marks
        // were cleared by f's last ask: they forward first, as active flows would have.)
        for _ in 0..64 {
            for (g, b) in gs[1..].iter().zip(&bg[1..]) {
                assert_eq!(send(&mut t, &frame(client, vip, *g, ACK)), *b);
            }
            assert_eq!(send(&mut t, &frame(client, vip, gs[0], ACK)), bg[0]);
            assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
            assert!(
                m.holds(&kf) && kg[1..].iter().all(|k| m.holds(k)) && !m.holds(&kg[0]),
                "active occupants keep their ways"
            );
        }
        assert_eq!(m.conntrack.get(&kg[0], 0).unwrap(), vg);
        checked += 1;
    }
    assert!(checked > 30, "{checked} flows checked");
    taken_after.sort();
    println!("packets until a way was taken back (sorted): {taken_after:?}");
}

#[test]
fn a_write_back_never_replaces_an_entry_written_since() {
    // Flow f is in its line; its LRU entry is rewritten (as by another CPU since the way was
    // written: a newer decision for the 5-tuple). Then flows g1..g4 take the ways of its home
    // line and its buddy:
    // the write-back of f's copy must not replace the newer entry, and f's next packet follows
    // the newer one.
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 2, 2]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let installed = t.dp.installed(&vip_key(vip, PORT, PROTO_TCP));
    let mut checked = 0;
    // Each set on a line of its own: no flow seen before.
    for (f, gs) in m.line_sets(client, vip, 12000..12100, 20000, 4) {
        let b = send(&mut t, &frame(client, vip, f, SYN));
        let k = key(client, vip, f);
        assert!(m.holds(&k));
        // The newer entry: another backend of the service.
        let other = installed
            .iter()
            .find(|i| i.spec.mac.unwrap()[5] != b)
            .unwrap();
        let newer = FlowValue {
            backend_id: other.id,
            epoch: other.epoch,
        };
        m.conntrack.insert(k, newer, 0).unwrap();
        for g in &gs {
            send(&mut t, &frame(client, vip, *g, SYN));
        }
        assert!(!m.holds(&k) && gs.iter().all(|g| m.holds(&key(client, vip, *g))));
        assert_eq!(
            m.conntrack.get(&k, 0).unwrap(),
            newer,
            "the write-back replaced a newer entry"
        );
        assert_eq!(
            send(&mut t, &frame(client, vip, f, ACK)),
            other.spec.mac.unwrap()[5]
        );
        checked += 1;
    }
    assert!(checked > 30, "{checked} flows checked");
}

/// Run `f` on CPU `cpu` only (BPF_PROG_TEST_RUN runs the program on the calling CPU), then
/// give the thread back its earlier CPUs.
fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> T {
    // SAFETY: plain libc calls on this thread's own affinity mask.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut old), 0);
        lb_tests::xdp::pin_to_cpu(cpu);
        let out = f();
        assert_eq!(libc::sched_setaffinity(0, size, &old), 0);
        out
    }
}

/// One counter of `LB_STATS` on each CPU.
fn per_cpu_counter(t: &TestDataplane, index: u32) -> Vec<u64> {
    let stats: aya::maps::PerCpuArray<MapData, [u64; lb_common::stat::COUNT as usize]> =
        aya::maps::PerCpuArray::try_from(Map::PerCpuArray(
            MapData::from_pin(t.opts.pin_dir().join(lb_common::maps::STATS)).unwrap(),
        ))
        .unwrap();
    stats
        .get(&0, 0)
        .unwrap()
        .iter()
        .map(|c| c[index as usize])
        .collect()
}

/// A flow whose packets arrive on two CPUs (RSS moving a flow, or its directions' queues): the
/// connection-table entry the SYN wrote on one CPU is the one the other CPU's packets find
/// (one hash table shared by every CPU, whatever its LRU lists are), so they keep their backend
/// when the Maglev table changed and the flow-cache slot is gone; and an entry rewritten on the
/// second CPU (a stale entry replaced) is found back on the first.
#[test]
fn a_flow_whose_packets_arrive_on_two_cpus_keeps_its_backend() {
    use lb_common::stat;
    lb_tests::xdp::assert_two_cpus();
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 7, 7]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let ports: Vec<u16> = (20000..20064).collect();

    // SYNs on CPU 0: each misses there and writes its entry there.
    let miss0 = per_cpu_counter(&t, stat::CONNTRACK_MISS);
    let chosen: Vec<u8> = on_cpu(0, || {
        ports
            .iter()
            .map(|&p| send(&mut t, &frame(client, vip, p, SYN)))
            .collect()
    });
    let miss1 = per_cpu_counter(&t, stat::CONNTRACK_MISS);
    assert_eq!(
        miss1[0] - miss0[0],
        ports.len() as u64,
        "the SYNs ran on CPU 0"
    );
    assert_eq!(miss1[1], miss0[1], "no SYN ran on CPU 1");

    // The table changes and the cache forgets the flows: only the entries keep them.
    t.dp.apply(&desired(vip, 4)).unwrap();
    for &p in &ports {
        m.clear(&key(client, vip, p));
    }
    let hit0 = per_cpu_counter(&t, stat::CONNTRACK_HIT);
    on_cpu(1, || {
        for (&p, &b) in ports.iter().zip(&chosen) {
            assert_eq!(
                send(&mut t, &frame(client, vip, p, ACK)),
                b,
                "flow {p} keeps its backend on CPU 1"
            );
        }
    });
    let hit1 = per_cpu_counter(&t, stat::CONNTRACK_HIT);
    assert_eq!(
        hit1[1] - hit0[1],
        ports.len() as u64,
        "CPU 1 found every entry"
    );
    assert_eq!(hit1[0], hit0[0], "nothing ran on CPU 0");

    // A stale entry (its pair gone) replaced on CPU 1 is what CPU 0 finds next.
    let p = ports[0];
    let k = key(client, vip, p);
    let stale = FlowValue {
        backend_id: m.conntrack.get(&k, 0).unwrap().backend_id,
        epoch: u32::MAX,
    };
    m.conntrack.insert(k, stale, 0).unwrap();
    m.clear(&k);
    let b = on_cpu(1, || send(&mut t, &frame(client, vip, p, ACK)));
    let written = m.conntrack.get(&k, 0).unwrap();
    assert_ne!(written.epoch, u32::MAX, "CPU 1 rewrote the stale entry");
    m.clear(&k);
    assert_eq!(on_cpu(0, || send(&mut t, &frame(client, vip, p, ACK))), b);
    assert_eq!(m.conntrack.get(&k, 0).unwrap(), written);

    // The test could fail: without their entries, some of these flows would move now.
    let mut moved = 0;
    for (&p, &b) in ports.iter().zip(&chosen) {
        let k = key(client, vip, p);
        m.conntrack.remove(&k).unwrap();
        m.clear(&k);
        if on_cpu(1, || send(&mut t, &frame(client, vip, p, ACK))) != b {
            moved += 1;
        }
    }
    assert!(
        moved > 0,
        "the fourth backend took some of the flows' slots"
    );
}

/// Both VIPs of a dual-stack service, three backends each.
fn dual_stack() -> Desired {
    let mut d = desired(IpAddr::from(VIP4), 3);
    d.services.extend(desired(IpAddr::from(VIP6), 3).services);
    d
}

#[test]
fn ipv4_and_ipv6_flows_on_one_line_displace_each_other_without_losing_either() {
    // Four IPv4 flows fill the two ways of a home line and of its buddy; an IPv6 flow with
    // the same home line takes that whole line and writes its two flows back; an IPv4 flow then
    // takes way 0 back and writes the IPv6 flow back. Every flow's LRU entry was gone before (aged out while it was served from the
    // cache), and Maglev moved between: each flow keeps its backend only through its entry.
    let (v4, v6) = (IpAddr::from(VIP4), IpAddr::from(VIP6));
    let c4 = IpAddr::from([10, 68, 5, 5]);
    let mut c6 = VIP6;
    c6[1] = 0x6a;
    c6[15] = 9;
    let c6 = IpAddr::from(c6);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&dual_stack()).unwrap();
    let mut m = Maps::open(&t);
    let mut checked = 0;
    let mut moved = 0;
    let mut used = std::collections::HashSet::new();
    for p6 in 40000..40012u16 {
        let k6 = key(c6, v6, p6);
        let line = m.slot(&k6);
        if !used.insert(line >> 1) {
            continue;
        }
        let p4: Vec<u16> = (1000..u16::MAX)
            .filter(|p| m.slot(&key(c4, v4, *p)) == line)
            .take(5)
            .collect();
        let k4: Vec<FlowKey> = p4.iter().map(|p| key(c4, v4, *p)).collect();
        let b4: Vec<u8> = p4[..4]
            .iter()
            .map(|p| send(&mut t, &frame(c4, v4, *p, SYN)))
            .collect();
        assert!(
            k4[..4].iter().all(|k| m.holds(k)),
            "four IPv4 flows, four ways"
        );
        let v4s: Vec<FlowValue> = k4[..4]
            .iter()
            .map(|k| {
                m.conntrack
                    .remove(k)
                    .map(|_| m.entry(k).unwrap().0)
                    .unwrap()
            })
            .collect();

        let b6 = send(&mut t, &frame(c6, v6, p6, SYN));
        let l = m.line(&k6);
        assert!(
            l.is_v6() && l.way_of(&k6) == Some(0),
            "an IPv6 flow takes the line"
        );
        for (k, v) in k4[..2].iter().zip(&v4s) {
            assert_eq!(m.conntrack.get(k, 0).ok(), Some(*v), "written back");
        }
        for k in &k4[2..4] {
            assert_eq!(m.find(k).map(|f| f.0), Some(line ^ 1), "kept in the buddy");
        }
        let v6v = m.entry(&k6).unwrap().0;
        m.conntrack.remove(&k6).unwrap();

        let b4c = send(&mut t, &frame(c4, v4, p4[4], SYN));
        let l = m.line(&k6);
        assert!(!l.is_v6() && l.way_of(&k4[4]) == Some(0) && l.key(1).is_none());
        assert_eq!(m.conntrack.get(&k6, 0).ok(), Some(v6v), "IPv6 written back");

        // A fourth backend on both VIPs: the flows keep theirs through their entries.
        let mut more = dual_stack();
        for (s, vip) in more.services.iter_mut().zip([v4, v6]) {
            *s = desired(vip, 4).services.remove(0);
        }
        t.dp.apply(&more).unwrap();
        for (p, b) in p4.iter().zip(b4.iter().chain([&b4c])) {
            assert_eq!(send(&mut t, &frame(c4, v4, *p, ACK)), *b);
        }
        assert_eq!(send(&mut t, &frame(c6, v6, p6, ACK)), b6);
        // The test could fail: without their entries, some flows would move.
        m.conntrack.remove(&k6).unwrap();
        m.clear(&k6);
        if send(&mut t, &frame(c6, v6, p6, ACK)) != b6 {
            moved += 1;
        }
        for (k, (p, b)) in k4.iter().zip(p4.iter().zip(b4.iter().chain([&b4c]))) {
            let _ = m.conntrack.remove(k);
            m.clear(k);
            if send(&mut t, &frame(c4, v4, *p, ACK)) != *b {
                moved += 1;
            }
        }
        t.dp.apply(&dual_stack()).unwrap();
        checked += 1;
    }
    assert!(checked >= 8, "{checked} lines checked");
    assert!(
        moved > 0,
        "the fourth backend took some of the flows' slots"
    );
}

/// Create and pin an array map of `entries` 64-byte values at `path` (the layout of the flow
/// cache an earlier version pinned).
fn pin_array64(path: &std::path::Path, entries: u32) {
    #[repr(C)]
    #[derive(Default)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    #[repr(C)]
    struct PinAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_OBJ_PIN: libc::c_long = 6;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = CreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 64,
        max_entries: entries,
        map_flags: 0,
    };
    // SAFETY: attr outlives the call; the kernel reads at most `size` bytes of it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &mut attr as *mut CreateAttr,
            std::mem::size_of::<CreateAttr>() as u32,
        )
    };
    assert!(fd >= 0, "create: {}", std::io::Error::last_os_error());
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut pin = PinAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd as u32,
        file_flags: 0,
    };
    // SAFETY: as above; the path outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_PIN,
            &mut pin as *mut PinAttr,
            std::mem::size_of::<PinAttr>() as u32,
        )
    };
    assert_eq!(rc, 0, "pin: {}", std::io::Error::last_os_error());
    // SAFETY: our own descriptor; the pin keeps the map.
    unsafe { libc::close(fd as i32) };
}

/// One entry of the earlier version's flow cache (one 64-byte slot per flow): the key's words,
/// the value's, and `check` as the slot's check word.
fn earlier_cache_entry(k: &FlowKey, v: FlowValue, check: u64) -> [u64; 8] {
    let w = lb_common::key_words(k);
    [
        w[0],
        w[1],
        w[2],
        w[3],
        w[4],
        lb_common::value_word(v),
        check,
        0,
    ]
}
#[test]
fn an_upgrade_writes_the_earlier_flow_cache_back_to_the_connection_table() {
    // An lbd of the earlier version kept a flow only in its flow cache (`LB_FLOW_CACHE_V2`:
    // one 64-byte entry per slot, the key's words, the value, the check word): the flow's LRU
    // entry had aged out. The new version starts on the same pins: once its program forwards
    // (the old one may write the old cache until then), the entries go into the connection
    // table before the old pin is removed, and the flow keeps its backend after Maglev moved.
    // A forged or torn old entry (its check word wrong) is not taken.
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 8, 8]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let m = Maps::open(&t);
    let old_pin = t.opts.pin_dir().join(lb_common::maps::FLOW_CACHE_V2);
    pin_array64(&old_pin, 64);
    let mut old: Array<MapData, [u64; 8]> =
        Array::try_from(Map::Array(MapData::from_pin(&old_pin).unwrap())).unwrap();
    let mut flows = Vec::new();
    for (i, sport) in (50000..50040u16).enumerate() {
        let k = key(client, vip, sport);
        let b = send(&mut t, &frame(client, vip, sport, SYN));
        let mut m = Maps::open(&t);
        let v = m
            .conntrack
            .remove(&k)
            .map(|_| m.entry(&k).unwrap().0)
            .unwrap();
        m.clear(&k);
        let check = flow_cache_check(flow_cache_hash(&k, m.seed), v);
        // Every fourth entry torn: its check word does not bind its value.
        let torn = i % 4 == 3;
        let entry = earlier_cache_entry(&k, v, if torn { check ^ 1 } else { check });
        old.set(i as u32, entry, 0).unwrap();
        flows.push((k, sport, b, v, torn));
    }
    drop(m);
    // The new lbd loads: the old program still forwards (until the new one replaces it behind
    // the link) and still writes its cache, so the cache is not retired yet.
    let i = 38u32;
    assert!(!flows[i as usize].4, "not a torn one");
    let mut hidden = old.get(&i, 0).unwrap();
    old.set(i, [0u64; 8], 0).unwrap();
    t.restart(251, t.opts.hash_seed);
    assert!(
        old_pin.exists(),
        "kept while the old program may still write it"
    );
    // The old program's last decision, written after the new lbd loaded.
    old.set(i, std::mem::take(&mut hidden), 0).unwrap();
    drop(old);
    // The attach (what `Dataplane::attach` runs once the new program forwards).
    t.dp.retire_earlier_cache().unwrap();
    assert!(!old_pin.exists(), "the earlier cache's pin is removed");
    let m = Maps::open(&t);
    for (k, _, _, v, torn) in &flows {
        let got = m.conntrack.get(k, 0).ok();
        if *torn {
            assert_eq!(got, None, "a torn entry is not taken");
        } else {
            assert_eq!(got, Some(*v), "written back at the upgrade");
        }
    }
    t.dp.apply(&desired(vip, 4)).unwrap();
    let mut moved_torn = 0;
    for (_, sport, b, _, torn) in &flows {
        let got = send(&mut t, &frame(client, vip, *sport, ACK));
        if *torn {
            moved_torn += (got != *b) as usize;
        } else {
            assert_eq!(got, *b, "flow {sport} keeps its backend across the upgrade");
        }
    }
    println!("torn entries whose flows moved: {moved_torn} of 10");
}

#[test]
fn an_upgrade_on_several_devices_writes_the_earlier_cache_back_once_the_last_runs_the_new_program()
{
    // With several attach devices (`xdp_interfaces`: br-ex's uplinks), the new lbd replaces the
    // old program device by device, behind each pinned link. Until the last, the old program
    // still forwards on the others and writes its flow cache (`LB_FLOW_CACHE_V2`): that cache
    // is written back, and its pin removed, only once every pinned link runs the new program.
    use lb_userspace::config::XdpMode;
    let mut lab = lb_tests::lab::Lab::new("fv2");
    lab.add_node("n1", "10.93.0.1", "fd93::1");
    lab.add_node("n2", "10.93.0.2", "fd93::2");
    lab.link("n1", "up1", "10.94.0.1/24", "n2", "up2", "10.94.0.2/24");
    lab.in_netns("n1", move || {
        let vip = IpAddr::from(VIP4);
        let client = IpAddr::from([10, 68, 8, 9]);
        let mut t = TestDataplane::new(251);
        t.dp.apply(&desired(vip, 3)).unwrap();
        for dev in ["eth0", "up1"] {
            t.dp.attach(dev, XdpMode::Skb).unwrap();
        }
        let old_pin = t.opts.pin_dir().join(lb_common::maps::FLOW_CACHE_V2);
        pin_array64(&old_pin, 64);
        // A flow the old program keeps only in its cache (its LRU entry aged out).
        let k = key(client, vip, 50100);
        send(&mut t, &frame(client, vip, 50100, SYN));
        let mut m = Maps::open(&t);
        let v = m.conntrack.get(&k, 0).unwrap();
        m.conntrack.remove(&k).unwrap();
        m.clear(&k);
        let entry = earlier_cache_entry(&k, v, flow_cache_check(flow_cache_hash(&k, m.seed), v));
        drop(m);
        // The new lbd: loaded, then attached to one device; the old program runs on the other.
        t.restart(251, t.opts.hash_seed);
        t.dp.attach("eth0", XdpMode::Skb).unwrap();
        assert!(
            old_pin.exists(),
            "the earlier cache retired while the old program still runs on up1"
        );
        // The old program's decision, written on up1 meanwhile.
        let mut old: Array<MapData, [u64; 8]> =
            Array::try_from(Map::Array(MapData::from_pin(&old_pin).unwrap())).unwrap();
        old.set(7, entry, 0).unwrap();
        drop(old);
        t.dp.attach("up1", XdpMode::Skb).unwrap();
        assert!(
            !old_pin.exists(),
            "retired once the new program runs on both"
        );
        let m = Maps::open(&t);
        assert_eq!(m.conntrack.get(&k, 0).ok(), Some(v), "written back");
    });
}

#[test]
fn the_connection_table_walks_see_every_entry_once() {
    // lbd's walks of the table (the sync's scan, `lbctl flows`, the entry count) read the LRU
    // hash in batches and the flow cache through its mapping. Each sees every entry once with
    // its value, and the scan sees a flow that is in both places once.
    use lb_userspace::dataplane::sync_view::{ConntrackPins, FlowCachePins, LruPins};
    let t = TestDataplane::with_conntrack(251, 65_536);
    let mut m = Maps::open(&t);
    let vip = IpAddr::from(VIP4);
    let client = |i: u32| IpAddr::from([10, 69, (i >> 8) as u8, i as u8]);
    let value = |i: u32| FlowValue {
        backend_id: 1 + i % 7,
        epoch: i,
    };
    // 20,000 flows in the LRU hash (several batches), and 300 in the cache only, and 100 of
    // the LRU's in the cache too.
    let mut want = std::collections::HashMap::new();
    for i in 0..20_000u32 {
        let k = key(client(i), vip, 1024 + (i % 50_000) as u16);
        m.conntrack.insert(k, value(i), 0).unwrap();
        want.insert(k, value(i));
    }
    let mut cached = std::collections::HashMap::new();
    for i in 0..20_400u32 {
        if (100..20_000).contains(&i) {
            continue;
        }
        let k = key(client(i), vip, 1024 + (i % 50_000) as u16);
        let home = m.slot(&k);
        let Some(at) = [home, home ^ 1]
            .into_iter()
            .find(|at| m.line_at(*at).entries(m.seed).count() == 0)
        else {
            continue;
        };
        let mut line = m.line_at(at);
        line.put(0, &k, value(i), m.seed);
        m.set_line_at(at, line);
        cached.insert(k, value(i));
    }
    assert!(
        cached.len() > 350,
        "{} flows placed in the cache",
        cached.len()
    );

    let pins = t.opts.pin_dir();
    let mut seen = std::collections::HashMap::new();
    LruPins::open(&pins.join(lb_common::maps::CONNTRACK))
        .unwrap()
        .for_each(|k, v| {
            assert!(seen.insert(*k, *v).is_none(), "{k:?} seen twice");
            true
        })
        .unwrap();
    assert_eq!(seen, want, "the LRU hash walk");

    let mut from_cache = std::collections::HashMap::new();
    FlowCachePins::open(&pins)
        .unwrap()
        .for_each(|k, v| {
            assert!(from_cache.insert(k, v).is_none(), "{k:?} cached twice");
            true
        })
        .unwrap();
    assert_eq!(from_cache, cached, "the flow cache walk");

    let all = ConntrackPins::open(&pins).unwrap();
    let scanned = all.scan(usize::MAX, |_, _| true).unwrap();
    let mut union = want.clone();
    union.extend(cached.iter());
    assert_eq!(scanned.len(), union.len(), "each flow once");
    assert_eq!(
        scanned
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
        union
    );
    // A walk stops where it is told to.
    assert_eq!(all.scan(1000, |_, _| true).unwrap().len(), 1000);
    let mut n = 0;
    LruPins::open(&pins.join(lb_common::maps::CONNTRACK))
        .unwrap()
        .for_each(|_, _| {
            n += 1;
            n < 4100
        })
        .unwrap();
    assert_eq!(n, 4100);
}

#[test]
fn a_retraction_takes_the_flow_out_of_the_cache_too_and_nothing_writes_it_back() {
    // A peer withdraws an entry it sent (`ConntrackPins::remove_if`): the flow's cache way must
    // go with the LRU hash's copy, or it keeps deciding, and the program writes it back to the
    // LRU hash when the way changes hands.
    use lb_userspace::dataplane::sync_view::ConntrackPins;
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 7, 1]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let m = Maps::open(&t);
    let mut pins = ConntrackPins::open(&t.opts.pin_dir()).unwrap();
    let mut retracted = Vec::new();
    for sport in 20000..20050u16 {
        send(&mut t, &frame(client, vip, sport, SYN));
        let k = key(client, vip, sport);
        let (v, _) = m.entry(&k).expect("in the cache");
        assert_eq!(m.conntrack.get(&k, 0).unwrap(), v);
        assert!(pins.remove_if(&k, v).unwrap());
        assert!(m.conntrack.get(&k, 0).is_err(), "the LRU hash's copy");
        assert!(
            pins.scan(usize::MAX, |s, _| *s == k).unwrap().is_empty(),
            "port {sport}: the cache still holds the retracted entry"
        );
        retracted.push(k);
    }
    // Many more flows take the ways of those lines: none writes a retracted entry back.
    for sport in 21000..29000u16 {
        send(&mut t, &frame(client, vip, sport, SYN));
    }
    for k in &retracted {
        assert!(m.conntrack.get(k, 0).is_err(), "{k:?} written back");
    }
}

#[test]
fn a_peer_record_never_replaces_this_nodes_own_entry_held_only_in_the_cache() {
    // A flow served from the cache may have aged out of the LRU hash (cache hits do not
    // refresh it). A peer's record for it must not be installed there: the scan would then
    // advertise the peer's backend as this node's, and a write-back would keep it over the
    // node's own decision. The scan reads what the program decides: the cache's copy.
    use lb_userspace::dataplane::sync_view::ConntrackPins;
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 7, 2]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let mut pins = ConntrackPins::open(&t.opts.pin_dir()).unwrap();
    let flows: Vec<(u16, u8, FlowValue)> = (22000..22060u16)
        .map(|sport| {
            let b = send(&mut t, &frame(client, vip, sport, SYN));
            let (v, _) = m.entry(&key(client, vip, sport)).expect("in the cache");
            (sport, b, v)
        })
        .collect();
    for (sport, b, own) in &flows {
        let k = key(client, vip, *sport);
        let peer = flows
            .iter()
            .map(|f| f.2)
            .find(|v| v.backend() != own.backend())
            .unwrap();
        // Its LRU copy aged out.
        m.conntrack.remove(&k).unwrap();
        assert!(
            !pins.insert_absent(&k, peer).unwrap(),
            "port {sport}: installed over the cache's own entry"
        );
        assert!(m.conntrack.get(&k, 0).is_err());
        let scanned = pins.scan(usize::MAX, |s, _| *s == k).unwrap();
        assert_eq!(scanned, vec![(k, *own)], "the scan reads the cache's copy");
        assert_eq!(send(&mut t, &frame(client, vip, *sport, ACK)), *b);
        // An LRU copy that differs (written under it by another writer): the scan still
        // reports what the program decides.
        m.conntrack.insert(k, peer, 0).unwrap();
        let scanned = pins.scan(usize::MAX, |s, _| *s == k).unwrap();
        assert_eq!(scanned, vec![(k, *own)], "the scan reads the cache's copy");
    }
}

#[test]
fn a_retraction_racing_the_program_leaves_the_flow_in_neither_table() {
    // A retraction (`ConntrackPins::remove_if`) while another CPU forwards new flows whose
    // decisions take the ways of the line that holds the retracted flow: whatever the
    // interleaving, once it returns neither the LRU hash nor the cache holds the retracted
    // entry. (A way that changes hands between the removal from one map and from the other
    // writes the entry back to the LRU hash; in the other order a hit in the LRU hash copies
    // it into a way in between.)
    use lb_userspace::dataplane::sync_view::ConntrackPins;
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed},
    };
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 7, 3]);
    // A small table: 64 lines.
    let mut t = TestDataplane::with_conntrack(251, 128);
    // Flood mode off: the other CPU's new flows come faster than its default threshold.
    t.opts.syn_flood_rate = 0;
    t.restart(251, t.opts.hash_seed);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let m = Maps::open(&t);
    let mut pins = ConntrackPins::open(&t.opts.pin_dir()).unwrap();
    // Flows of other clients by home line, each sent once (a new decision, which takes a way
    // of its home line).
    let lines = lb_common::flow_cache_slots(128) as usize;
    let mut by_line: Vec<Vec<(IpAddr, u16)>> = vec![Vec::new(); lines];
    for i in 0..65_536u32 {
        let c = IpAddr::from([10, 70, (i >> 8) as u8, i as u8]);
        for sport in 1024..1030u16 {
            by_line[m.slot(&key(c, vip, sport)) as usize].push((c, sport));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The line that holds the flow being retracted, plus one (0: none yet).
    let target = Arc::new(AtomicU32::new(0));
    let churned = Arc::new(AtomicU64::new(0));
    let churn = {
        let mut dp = t.second_instance();
        let (stop, target, churned) = (stop.clone(), target.clone(), churned.clone());
        std::thread::spawn(move || {
            let mut next = vec![0usize; lines];
            while !stop.load(Relaxed) {
                let Some(line) = target.load(Relaxed).checked_sub(1) else {
                    std::thread::yield_now();
                    continue;
                };
                let pool = &by_line[line as usize];
                let (c, sport) = pool[next[line as usize] % pool.len()];
                next[line as usize] += 1;
                let (v, _, _) = dp
                    .test_run("lb_xdp", &frame(c, vip, sport, SYN), 1)
                    .unwrap();
                assert_eq!(v, TX);
                churned.fetch_add(1, Relaxed);
            }
        })
    };
    // `k`'s entry in the cache, if its check word holds (what the program would trust).
    let cached = |k: &FlowKey| {
        let home = m.slot(k);
        [home, home ^ 1].into_iter().find_map(|i| {
            m.line_at(i)
                .entries(m.seed)
                .find_map(|(_, c, v)| (c == *k).then_some(v))
        })
    };
    let (mut retracted, mut left) = (0u32, Vec::new());
    for round in 0..6u16 {
        for sport in 1024..11024u16 {
            let k = key(client, vip, sport);
            send(&mut t, &frame(client, vip, sport, SYN));
            let Some((line, _)) = m.find(&k) else {
                continue;
            };
            target.store(line + 1, Relaxed);
            // The other CPU's flows may have pushed it out of the LRU hash (then the cache
            // holds it) or out of the cache (then the LRU hash does).
            let Some(v) = m.conntrack.get(&k, 0).ok().or_else(|| cached(&k)) else {
                continue;
            };
            if !pins.remove_if(&k, v).unwrap() {
                continue;
            }
            retracted += 1;
            let in_lru = m.conntrack.get(&k, 0).is_ok();
            let in_cache = cached(&k).is_some();
            if in_lru || in_cache {
                left.push((round, sport, in_lru, in_cache));
            }
        }
    }
    stop.store(true, Relaxed);
    churn.join().unwrap();
    println!(
        "{retracted} retractions, {} packets of other flows meanwhile, {} entries left",
        churned.load(Relaxed),
        left.len()
    );
    assert!(churned.load(Relaxed) > 10_000, "the other CPU forwarded");
    left.truncate(10);
    assert!(
        left.is_empty(),
        "retracted entries still held (round, port, in the LRU hash, in the cache): {left:?}"
    );
}

#[test]
fn a_peers_close_of_the_same_pair_closes_this_nodes_open_entry_and_nothing_else() {
    // BGP: this node forwards the service too, so its own entry stands against a peer's
    // record; but a client that closed through the peer (ECMP moved its segments there) comes
    // as the peer's closed record, and this node's open entry of the same pair takes the
    // close (`ConntrackPins::close_same`). A SYN reusing the 5-tuple after the hold is then
    // placed afresh, not sent to the pair the entry names. Another pair, an open record or
    // an entry closed already are left alone.
    use lb_userspace::dataplane::sync_view::ConntrackPins;
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 7, 4]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let mut pins = ConntrackPins::open(&t.opts.pin_dir()).unwrap();
    let flows: Vec<(u16, u8, FlowValue)> = (23000..23040u16)
        .map(|sport| {
            let b = send(&mut t, &frame(client, vip, sport, SYN));
            let (v, _) = m.entry(&key(client, vip, sport)).expect("in the cache");
            (sport, b, v)
        })
        .collect();
    // 20 s ago: the hold (at most 8.6 s) is over.
    let long_ago = |v: FlowValue, seq: u32| {
        v.closed_aged(seq, 20_000_000_000, lb_userspace::sync::view::coarse_ns())
    };
    for (sport, b, own) in &flows {
        let k = key(client, vip, *sport);
        let (xb, other) = flows
            .iter()
            .find(|f| f.1 != *b)
            .map(|f| (f.1, f.2))
            .unwrap();
        // This node's entry names another pair (placed before the set changed), open.
        m.clear(&k);
        m.conntrack.insert(k, other, 0).unwrap();
        assert_eq!(
            send(&mut t, &frame(client, vip, *sport, SYN)),
            xb,
            "port {sport}: a SYN follows an open entry"
        );
        assert!(m.holds(&k), "port {sport}: the entry is in the cache now");
        assert!(
            !pins.close_same(&k, long_ago(*own, 5)).unwrap(),
            "port {sport}: the peer's close of another pair closed this node's entry"
        );
        assert!(
            !pins.close_same(&k, other).unwrap(),
            "port {sport}: an open record changed the entry"
        );
        assert_eq!(
            pins.scan(usize::MAX, |s, _| *s == k).unwrap(),
            vec![(k, other)],
            "port {sport}: still open"
        );
        let closed = long_ago(other, 5);
        assert!(
            pins.close_same(&k, closed).unwrap(),
            "port {sport}: the peer's close of the same pair"
        );
        assert!(
            !pins.close_same(&k, long_ago(other, 9)).unwrap(),
            "port {sport}: a close held already stays"
        );
        assert_eq!(
            pins.scan(usize::MAX, |s, _| *s == k).unwrap(),
            vec![(k, closed)],
            "port {sport}: closed as the peer saw it, its own close kept"
        );
        assert_eq!(
            send(&mut t, &frame(client, vip, *sport, SYN)),
            *b,
            "port {sport}: the reused 5-tuple is placed afresh"
        );
    }
    // No entry: nothing is written (a record fills an empty slot through `insert_absent`).
    let k = key(client, vip, 24000);
    assert!(!pins.close_same(&k, long_ago(flows[0].2, 5)).unwrap());
    assert!(m.conntrack.get(&k, 0).is_err() && !m.holds(&k));
}
