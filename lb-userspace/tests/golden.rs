//! Golden vectors: fixed inputs -> fixed outputs of the flow hash and the Maglev table. Nodes of
//! two versions share VIPs during a rolling upgrade, and a flow keeps its backend across a VIP
//! move only if both compute the same slot and the same backend for it. A change that fails
//! here breaks that: it needs a plan for mixed-version clusters, not a new vector.
//!
//! Tables are compared by backend address (index into the given list), not by id: ids are
//! per-node bookkeeping and differ between nodes.

use std::net::IpAddr;

use lb_common::{FAMILY_V4, FAMILY_V6, FlowKey, PROTO_TCP, PROTO_UDP, flow_hash};
use lb_userspace::maglev::{Entry, build};

fn key(src: &str, dst: &str, sport: u16, dport: u16, proto: u8) -> FlowKey {
    let bytes = |s: &str| -> ([u8; 16], u8) {
        match s.parse::<IpAddr>().unwrap() {
            IpAddr::V4(a) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                (b, FAMILY_V4)
            }
            IpAddr::V6(a) => (a.octets(), FAMILY_V6),
        }
    };
    let (src, family) = bytes(src);
    FlowKey {
        src,
        dst: bytes(dst).0,
        sport,
        dport,
        proto,
        family,
        _pad: [0; 2],
    }
}

fn keys() -> Vec<FlowKey> {
    vec![
        key("192.0.2.10", "10.0.0.100", 40000, 6443, PROTO_TCP),
        key("198.51.100.7", "10.0.0.100", 1, 443, PROTO_TCP),
        key("10.0.0.1", "10.0.0.200", 65535, 53, PROTO_UDP),
        key("2001:db8::1", "fd00::100", 51000, 6443, PROTO_TCP),
        key("fe80::1:2:3:4", "fd00::100", 0, 0, PROTO_UDP),
    ]
}

/// Backends in a fixed order; the table holds indexes into this list.
fn backends() -> Vec<Entry> {
    [
        ("10.0.0.1", 1),
        ("10.0.0.2", 1),
        ("10.0.0.3", 2),
        ("fd00::4", 1),
        ("10.0.1.5", 3),
    ]
    .iter()
    .enumerate()
    .map(|(i, (a, w))| Entry {
        addr: a.parse().unwrap(),
        weight: *w,
        // Ids deliberately unrelated to the order: the table must not depend on them.
        id: 1000 - i as u32 * 7,
    })
    .collect()
}

/// The table as indexes into `backends()` (`u32::MAX` for an empty slot).
fn table(entries: &[Entry], size: u32) -> Vec<u32> {
    build(entries, size)
        .into_iter()
        .map(|id| {
            entries
                .iter()
                .position(|e| e.id == id)
                .map(|p| p as u32)
                .unwrap_or(u32::MAX)
        })
        .collect()
}

fn fnv(t: &[u32]) -> u64 {
    t.iter()
        .flat_map(|x| x.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[test]
fn flow_hash_vectors() {
    let want: [(usize, u32, u32); 15] = [
        (0, 0x0, 0xdde78302),
        (0, 0x1b5eed, 0xdd3b2fdb),
        (0, 0xffffffff, 0x1e7e224d),
        (1, 0x0, 0xb1b06f30),
        (1, 0x1b5eed, 0x967acd2f),
        (1, 0xffffffff, 0xd8755529),
        (2, 0x0, 0x58462b5b),
        (2, 0x1b5eed, 0xdc87e889),
        (2, 0xffffffff, 0xdc6fd4c8),
        (3, 0x0, 0xf24a6926),
        (3, 0x1b5eed, 0x543a8d83),
        (3, 0xffffffff, 0xc1aa41f3),
        (4, 0x0, 0xaa2a073d),
        (4, 0x1b5eed, 0x9ee2dd66),
        (4, 0xffffffff, 0xc5f2b641),
    ];
    let keys = keys();
    for (i, seed, hash) in want {
        assert_eq!(
            flow_hash(&keys[i], seed),
            hash,
            "flow hash of key {i} with seed {seed:#x}"
        );
    }
}

#[test]
fn maglev_small_table_vector() {
    let e = backends();
    assert_eq!(
        table(&e[..3], 13),
        [2, 1, 0, 2, 1, 2, 0, 0, 1, 2, 2, 2, 2],
        "10.0.0.1, 10.0.0.2 (weight 1) and 10.0.0.3 (weight 2) in 13 slots"
    );
}

#[test]
fn maglev_default_size_vector() {
    let t = table(&backends(), 65537);
    assert_eq!(
        t[..24],
        [
            3, 4, 4, 3, 1, 4, 2, 2, 2, 3, 2, 2, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        ]
    );
    let mut counts = [0usize; 5];
    for x in &t {
        counts[*x as usize] += 1;
    }
    assert_eq!(
        counts,
        [8192, 8192, 16384, 8192, 24577],
        "slots per backend"
    );
    assert_eq!(fnv(&t), 0xeb43_3a6a_b505_9bb1, "the whole table");
}

#[test]
fn flow_to_backend_vector() {
    // What two nodes of different versions must agree on: this flow goes to that backend.
    let t = table(&backends(), 65537);
    let got: Vec<u32> = keys()
        .iter()
        .map(|k| t[(flow_hash(k, 0x1b_5eed) % 65537) as usize])
        .collect();
    assert_eq!(got, [4, 4, 2, 3, 2]);
}
