//! The flow cache in front of the connection table (`LB_FLOW_CACHE_V2`, lb-ebpf `flows.rs`),
//! with the real XDP program through BPF_PROG_TEST_RUN and the real maps read and written through
//! their pins:
//! - a flow served from the cache keeps its backend after its LRU entry aged out and the table
//!   changed, and still keeps it when another flow takes its slot (it is written back);
//! - the cache is really consulted (a good slot wins over the LRU hash), and a slot whose check
//!   word does not bind its value to its key (a torn read) is never trusted, for IPv4 and IPv6;
//! - a slot goes to the flow that uses it: a flow that lost its slot to one that went idle gets
//!   it back at its second packet, and an occupant that keeps forwarding keeps it.
//!
//! Needs root; `cargo xtask test`.

use std::net::IpAddr;

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};
use lb_common::{
    FlowCacheEntry, FlowKey, FlowValue, PROTO_TCP, flow_cache_check, flow_cache_hash,
    flow_cache_index, flow_cache_seed,
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
    cache: Array<MapData, FlowCacheEntry>,
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

    fn slot(&self, k: &FlowKey) -> u32 {
        flow_cache_index(flow_cache_hash(k, self.seed), self.config)
    }

    fn entry(&self, k: &FlowKey) -> FlowCacheEntry {
        self.cache.get(&self.slot(k), 0).unwrap()
    }

    /// Pairs of ports (f, g) from `client`, f in `fs` and g from `g_from` on, whose flows share
    /// a slot, each pair on a slot of its own.
    fn slot_pairs(
        &self,
        client: IpAddr,
        vip: IpAddr,
        fs: std::ops::Range<u16>,
        g_from: u16,
    ) -> Vec<(u16, u16)> {
        let mut used = std::collections::HashSet::new();
        fs.filter_map(|f| {
            let s = self.slot(&key(client, vip, f));
            if !used.insert(s) {
                return None;
            }
            let g = (g_from..u16::MAX).find(|g| self.slot(&key(client, vip, *g)) == s)?;
            Some((f, g))
        })
        .collect()
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

    // 64 flows, each in a slot of its own, and for each a second flow that maps to its slot.
    // (flow's port, the port of a flow on the same slot, backend, the flow's entry)
    let mut flows: Vec<(u16, u16, u8, FlowValue)> = Vec::new();
    let mut used = std::collections::HashSet::new();
    let mut sport = 10000u16;
    while flows.len() < 64 {
        let f = sport;
        sport += 1;
        let s = m.slot(&key(client, vip, f));
        if !used.insert(s) {
            continue;
        }
        let g = (sport..u16::MAX)
            .find(|g| m.slot(&key(client, vip, *g)) == s)
            .expect("a flow on the same slot");
        let b = send(&mut t, &frame(client, vip, f, SYN));
        assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), b);
        let v = m.conntrack.get(&key(client, vip, f), 0).unwrap();
        flows.push((f, g, b, v));
    }
    for &(f, _, _, v) in &flows {
        let k = key(client, vip, f);
        let e = m.entry(&k);
        assert_eq!((e.key, e.value), (k, v), "a new flow takes its slot");
        // Served from the cache, the flow's LRU entry may age out: do it here.
        m.conntrack.remove(&k).unwrap();
    }
    // A fourth backend: Maglev moves about a quarter of the flows' slots to it.
    t.dp.apply(&desired(vip, 4)).unwrap();
    for &(f, _, b, _) in &flows {
        assert_eq!(
            send(&mut t, &frame(client, vip, f, ACK)),
            b,
            "a cached flow keeps its backend"
        );
    }
    // Other flows take the slots: each occupant is written back to the LRU hash first.
    for &(f, g, b, v) in &flows {
        send(&mut t, &frame(client, vip, g, SYN));
        let k = key(client, vip, f);
        assert_eq!(m.entry(&key(client, vip, g)).key, key(client, vip, g));
        let back = m
            .conntrack
            .get(&k, 0)
            .expect("written back to the LRU hash");
        assert_eq!(back, v);
        assert_eq!(
            send(&mut t, &frame(client, vip, f, ACK)),
            b,
            "a flow that lost its slot keeps its backend"
        );
        // Found in the LRU hash only; its slot's occupant is good, so it does not take it back.
        assert_eq!(
            m.entry(&k).key,
            key(client, vip, g),
            "no ping-pong over a slot"
        );
    }
    // The test could fail: without their entries, some of these flows would move now.
    let mut moved = 0;
    for &(f, g, b, _) in &flows {
        m.conntrack.remove(&key(client, vip, f)).unwrap();
        let _ = m.conntrack.remove(&key(client, vip, g));
        if send(&mut t, &frame(client, vip, f, ACK)) != b {
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
        let slot = m.slot(&k);
        let e = m.entry(&k);
        assert_eq!(
            (e.key, e.value),
            (k, pair(b)),
            "the SYN's decision is cached"
        );
        assert_eq!(
            e.check,
            flow_cache_check(flow_cache_hash(&k, m.seed), pair(b))
        );

        // A good slot wins over the LRU hash: the cache is where the flow is looked up.
        let good = FlowCacheEntry {
            key: k,
            value: pair(other),
            check: flow_cache_check(flow_cache_hash(&k, m.seed), pair(other)),
            _pad: 0,
        };
        m.cache.set(slot, good, 0).unwrap();
        assert_eq!(send(&mut t, &frame(client, vip, sport, ACK)), other);

        // The same slot as a reader sees it while another CPU rewrites it: this key, the
        // value of another entry, a check word that binds neither. The LRU hash decides.
        m.conntrack.insert(k, pair(b), 0).unwrap();
        let torn = FlowCacheEntry {
            check: e.check ^ 1,
            ..good
        };
        m.cache.set(slot, torn, 0).unwrap();
        assert_eq!(send(&mut t, &frame(client, vip, sport, ACK)), b);
        // ... and the flow takes its slot back, written whole.
        assert_eq!(m.entry(&k), e);

        // A check of another key's hash with this key's words: not trusted either.
        let other_key = key(client, vip, sport.wrapping_add(1000));
        m.cache
            .set(
                slot,
                FlowCacheEntry {
                    check: flow_cache_check(flow_cache_hash(&other_key, m.seed), pair(other)),
                    ..good
                },
                0,
            )
            .unwrap();
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
    assert_eq!(
        m.entry(&key(client, vip, sport)).key,
        key(client, vip, sport)
    );
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
    let id = m.entry(&key(client, vip, sport)).value.backend_id;
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
fn a_flow_gets_its_slot_back_from_an_idle_occupant_and_not_from_an_active_one() {
    // Flow f loses its slot to g's SYN, and g goes idle. f's next packet, found only in the LRU
    // hash, may ask for the slot but does not take it (g was just written); within a few more
    // of f's packets (one in eight asks, at random) f takes it, g's entry kept in the LRU hash.
    // Then both are active, alternating: the occupant forwards between the other's packets
    // and keeps the slot however many ask.
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 3, 3]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let m = Maps::open(&t);
    let mut checked = 0;
    let mut taken_after = Vec::new();
    for (f, g) in m.slot_pairs(client, vip, 14000..14040, 30000) {
        let (kf, kg) = (key(client, vip, f), key(client, vip, g));
        let bf = send(&mut t, &frame(client, vip, f, SYN));
        let bg = send(&mut t, &frame(client, vip, g, SYN));
        assert_eq!(m.entry(&kg).key, kg, "a new decision takes its slot");
        let vf = m.conntrack.get(&kf, 0).expect("the occupant written back");
        assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
        assert_eq!(
            m.entry(&kf).key,
            kg,
            "an occupant keeps its slot at the first ask"
        );
        // (7/8)^400: never, for a correct program.
        let packets = (1..=400)
            .find(|_| {
                assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
                m.entry(&kf).key == kf
            })
            .expect("an idle occupant gives the slot up");
        taken_after.push(packets);
        let e = m.entry(&kf);
        assert_eq!(e.value, vf);
        assert_eq!(
            e.check,
            flow_cache_check(flow_cache_hash(&kf, m.seed), vf),
            "written whole"
        );
        let vg = m
            .conntrack
            .get(&kg, 0)
            .expect("the idle occupant's entry is kept");
        for _ in 0..64 {
            assert_eq!(send(&mut t, &frame(client, vip, g, ACK)), bg);
            assert_eq!(send(&mut t, &frame(client, vip, f, ACK)), bf);
            assert_eq!(m.entry(&kf).key, kf, "an active occupant keeps its slot");
        }
        assert_eq!(m.conntrack.get(&kg, 0).unwrap(), vg);
        checked += 1;
    }
    assert!(checked > 20, "{checked} flows checked");
    taken_after.sort();
    println!("packets until the slot was taken back (sorted): {taken_after:?}");
}

#[test]
fn a_write_back_never_replaces_an_entry_written_since() {
    // Flow f is in its slot; its LRU entry is rewritten (as by another CPU since the slot was
    // written: a newer decision for the 5-tuple). Then flow g takes the slot: the write-back of
    // f's slot copy must not replace the newer entry, and f's next packet follows the newer one.
    let vip = IpAddr::from(VIP4);
    let client = IpAddr::from([10, 68, 2, 2]);
    let mut t = TestDataplane::new(251);
    t.dp.apply(&desired(vip, 3)).unwrap();
    let mut m = Maps::open(&t);
    let installed = t.dp.installed(&vip_key(vip, PORT, PROTO_TCP));
    let mut checked = 0;
    // Each pair (f, g) on a slot of its own: no flow seen before.
    for (f, g) in m.slot_pairs(client, vip, 12000..12040, 20000) {
        let b = send(&mut t, &frame(client, vip, f, SYN));
        let k = key(client, vip, f);
        assert_eq!(m.entry(&k).key, k);
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
        send(&mut t, &frame(client, vip, g, SYN));
        assert_eq!(m.entry(&key(client, vip, g)).key, key(client, vip, g));
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
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
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
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        cpus >= 2,
        "this test needs two CPUs, the machine has {cpus}"
    );
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
        let s = m.slot(&key(client, vip, p));
        m.cache.set(s, FlowCacheEntry::default(), 0).unwrap();
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
    m.cache
        .set(m.slot(&k), FlowCacheEntry::default(), 0)
        .unwrap();
    let b = on_cpu(1, || send(&mut t, &frame(client, vip, p, ACK)));
    let written = m.conntrack.get(&k, 0).unwrap();
    assert_ne!(written.epoch, u32::MAX, "CPU 1 rewrote the stale entry");
    m.cache
        .set(m.slot(&k), FlowCacheEntry::default(), 0)
        .unwrap();
    assert_eq!(on_cpu(0, || send(&mut t, &frame(client, vip, p, ACK))), b);
    assert_eq!(m.conntrack.get(&k, 0).unwrap(), written);

    // The test could fail: without their entries, some of these flows would move now.
    let mut moved = 0;
    for (&p, &b) in ports.iter().zip(&chosen) {
        let k = key(client, vip, p);
        m.conntrack.remove(&k).unwrap();
        m.cache
            .set(m.slot(&k), FlowCacheEntry::default(), 0)
            .unwrap();
        if on_cpu(1, || send(&mut t, &frame(client, vip, p, ACK))) != b {
            moved += 1;
        }
    }
    assert!(
        moved > 0,
        "the fourth backend took some of the flows' slots"
    );
}
