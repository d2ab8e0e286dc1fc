extern crate std;
use super::*;
use crate::hash::word;
use std::{vec, vec::Vec};

/// 10.0.0.1:40000 -> 10.0.0.100:6443, TCP.
fn v4_key() -> FlowKey {
    FlowKey {
        src: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        dst: [10, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        sport: 40000,
        dport: 6443,
        proto: PROTO_TCP,
        family: FAMILY_V4,
        _pad: [0; 2],
    }
}

#[test]
fn hash_depends_on_every_field() {
    let base = v4_key();
    let h = flow_hash(&base, 7);
    assert_ne!(h, flow_hash(&base, 8), "seed");
    let mut k = base;
    k.sport += 1;
    assert_ne!(h, flow_hash(&k, 7), "sport");
    let mut k = base;
    k.dport += 1;
    assert_ne!(h, flow_hash(&k, 7), "dport");
    let mut k = base;
    k.src[3] = 2;
    assert_ne!(h, flow_hash(&k, 7), "src");
    let mut k = base;
    k.dst[15] = 1;
    assert_ne!(h, flow_hash(&k, 7), "dst");
    let mut k = base;
    k.proto = PROTO_UDP;
    assert_ne!(h, flow_hash(&k, 7), "proto");
}

#[test]
fn flow_cache_hash_depends_on_every_word_a_key_can_hold_and_on_both_seed_parts() {
    let v4 = v4_key();
    let v6 = FlowKey {
        src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x64],
        family: FAMILY_V6,
        ..v4
    };
    let seed = flow_cache_seed(7, flow_cache_config(1 << 12, 0x123));
    for base in [v4, v6] {
        let h = flow_cache_hash(&base, seed);
        assert_ne!(h, flow_cache_hash(&base, seed ^ 1), "hash_seed");
        assert_ne!(h, flow_cache_hash(&base, seed ^ (1 << 40)), "secret");
        let mut fields: Vec<FlowKey> = Vec::new();
        for i in 0..16 {
            let mut k = base;
            k.src[i] ^= 0x80;
            fields.push(k);
            let mut k = base;
            k.dst[i] ^= 1;
            fields.push(k);
        }
        let mut k = base;
        k.sport ^= 1;
        fields.push(k);
        let mut k = base;
        k.dport ^= 0x8000;
        fields.push(k);
        let mut k = base;
        k.proto = PROTO_UDP;
        fields.push(k);
        for k in fields {
            // An IPv4 key's address bytes 4..16 are always zero: they are not hashed.
            let v4_tail = base.family == FAMILY_V4
                && (k.src[4..] != base.src[4..] || k.dst[4..] != base.dst[4..]);
            if !v4_tail {
                assert_ne!(h, flow_cache_hash(&k, seed), "{k:?}");
            }
        }
    }
}

#[test]
fn the_flow_cache_hash_is_the_one_its_pin_version_names() {
    // A restarted lbd adopts a pinned cache by name: if this fails, the hash changed, and
    // `maps::FLOW_CACHE` (and the map's name in lb-ebpf) must get a new version, the old
    // name going to `maps::OBSOLETE`.
    let seed = flow_cache_seed(0x1b_5eed, flow_cache_config(1 << 12, 0x123));
    assert_eq!(maps::FLOW_CACHE, "LB_FLOW_CACHE_V3");
    assert_eq!(flow_cache_hash(&v4_key(), seed), 0x8075_5e93_ac37_1144);
    assert!(maps::OBSOLETE.contains(&"LB_FLOW_CACHE"));
    assert!(maps::OBSOLETE.contains(&"LB_FLOW_CACHE_V2"));
    // The line layout the version names: an IPv4 way's words.
    let mut line = FlowCacheLine::default();
    let v = FlowValue {
        backend_id: 7,
        epoch: 9,
    };
    line.put(1, &v4_key(), v, seed);
    assert_eq!(line.w[4] & TAIL_KEY_MASK, key_words(&v4_key())[4]);
    assert_eq!(line.w[5], v4_addrs(&v4_key()));
    assert_eq!(line.w[6], 7 | 9 << 32);
    assert_eq!(line.w[0] >> 56, 1, "way 1 written last");
}

#[test]
fn flow_cache_slots_are_spread_and_the_config_round_trips() {
    assert_eq!(flow_cache_slots(DEFAULT_CONNTRACK_SIZE), 131_072);
    assert_eq!(flow_cache_slots(1024), 512);
    assert_eq!(flow_cache_slots(1000), 512);
    assert_eq!(flow_cache_slots(3), 64);
    let slots = 4096;
    let cfg = flow_cache_config(slots, (1 << 27) - 1);
    assert_eq!(1 << (cfg & 31), slots);
    assert_eq!(cfg >> 5, (1 << 27) - 1);
    let seed = flow_cache_seed(0xabcd, cfg);
    let mut used = vec![0u32; slots as usize];
    for sport in 0..(slots * 4) {
        let k = FlowKey {
            src: [10, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [10, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: sport as u16,
            dport: 443,
            proto: PROTO_TCP,
            family: FAMILY_V4,
            _pad: [0; 2],
        };
        let i = flow_cache_index(flow_cache_hash(&k, seed), cfg);
        assert!(i < slots);
        used[i as usize] += 1;
    }
    // 4 keys a slot on average: with a uniform spread about 2 % of slots stay empty and
    // none holds more than a dozen.
    let empty = used.iter().filter(|n| **n == 0).count();
    assert!(empty < slots as usize / 20, "{empty} empty slots");
    assert!(used.iter().all(|n| *n <= 14), "max {:?}", used.iter().max());
}

#[test]
fn a_flow_cache_check_binds_the_value_to_the_key() {
    let a = FlowValue {
        backend_id: 3,
        epoch: 17,
    };
    let b = FlowValue {
        backend_id: 4,
        epoch: 17,
    };
    let c = FlowValue {
        backend_id: 3,
        epoch: 18,
    };
    let h = 0x0123_4567_89ab_cdef;
    assert_ne!(flow_cache_check(h, a), flow_cache_check(h, b));
    assert_ne!(flow_cache_check(h, a), flow_cache_check(h, c));
    assert_ne!(flow_cache_check(h, a), flow_cache_check(h ^ (1 << 63), a));
}

#[test]
fn hash_spreads_ports_evenly() {
    // 65537 slots, 60000 source ports: every 1/8 of the table gets close to 1/8 of the flows.
    let mut buckets = [0u32; 8];
    let mut k = FlowKey {
        proto: PROTO_TCP,
        family: FAMILY_V4,
        dport: 443,
        ..Default::default()
    };
    k.src[..4].copy_from_slice(&[192, 0, 2, 7]);
    for p in 1024..61024u32 {
        k.sport = p as u16;
        let slot = flow_hash(&k, 1) % DEFAULT_TABLE_SIZE;
        buckets[(slot as usize * 8) / DEFAULT_TABLE_SIZE as usize] += 1;
    }
    for b in buckets {
        assert!((7000..8000).contains(&b), "uneven bucket {b}: {buckets:?}");
    }
}

#[test]
fn word_forms_agree_with_byte_forms() {
    for i in 0..200u8 {
        let mac = [i, 0x52, i.wrapping_mul(7), 0x01, 0xfe, i ^ 0x5a];
        let halves = [
            u16::from_ne_bytes([mac[0], mac[1]]),
            u16::from_ne_bytes([mac[2], mac[3]]),
            u16::from_ne_bytes([mac[4], mac[5]]),
        ];
        assert_eq!(mac_halves_filter_bit(halves), mac_filter_bit(&mac));
        assert_eq!(peer_key_halves(halves), peer_key(&mac));
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[10, i, 0, 100]);
        a[15] = i.wrapping_mul(3);
        let w = [word(&a, 0), word(&a, 4), word(&a, 8), word(&a, 12)];
        assert_eq!(addr_filter_bit_words(&w), addr_filter_bit(&a));
    }
}

#[test]
fn addr_filter_bits_spread() {
    let mut seen = [false; 256];
    for i in 0..64u8 {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[10, 0, i, 100]);
        seen[addr_filter_bit(&a) as usize] = true;
    }
    assert!(
        seen.iter().filter(|b| **b).count() > 40,
        "64 addresses land on many bits"
    );
}

#[test]
fn stat_names_cover_every_index() {
    assert_eq!(stat::NAMES.len(), stat::COUNT as usize);
    assert_eq!(stat::NAMES[stat::ICMP_FORWARDED as usize], "icmp_forwarded");
    assert_eq!(stat::NAMES[stat::DROP_FRAGMENT as usize], "drop_fragment");
}

#[test]
fn table_index_separates_vips_and_halves() {
    assert_eq!(table_stride(7), 8);
    assert_eq!(table_index(0, 0, 7, 3), 3);
    assert_eq!(table_index(0, 1, 7, 3), 11);
    assert_eq!(table_index(1, 0, 7, 0), 16);
    assert_eq!(table_index(1, 3, 7, 0), 24, "which is masked to one bit");
    assert_eq!(table_elements(65537) * 2, MAX_VIPS * 2 * 65538);
}

#[test]
fn a_flow_cache_line_holds_two_ipv4_ways_or_one_ipv6_entry() {
    let seed = flow_cache_seed(0x1b_5eed, flow_cache_config(1 << 12, 0x123));
    let v = |b: u32| FlowValue {
        backend_id: b,
        epoch: 100 + b,
    };
    let a = v4_key();
    let mut b = v4_key();
    b.sport ^= 0x5a5a;
    b.src[0] ^= 0xff;
    let mut line = FlowCacheLine::default();
    assert_eq!(line.entries(seed).count(), 0, "an empty line");
    line.put(0, &a, v(1), seed);
    line.put(1, &b, v(2), seed);
    assert!(!line.is_v6());
    let got: Vec<_> = line.entries(seed).collect();
    assert_eq!(got, [(0, a, v(1)), (1, b, v(2))]);
    assert!(line.marked(0) && line.marked(1));
    assert_eq!(line.way_of(&b), Some(1));
    // A torn way (another value than its check binds) is not trusted; the other way still is.
    line.w[V4_VALUE] ^= 1;
    let got: Vec<_> = line.entries(seed).collect();
    assert_eq!(got, [(1, b, v(2))]);
    // An IPv6 entry takes the whole line.
    let mut c = v4_key();
    c.family = FAMILY_V6;
    c.src[15] = 1;
    c.dst[9] = 4;
    line.put(1, &c, v(3), seed);
    assert!(line.is_v6());
    let got: Vec<_> = line.entries(seed).collect();
    assert_eq!(got, [(0, c, v(3))]);
    assert_eq!(line.key(1), None);
    // An IPv4 entry on an IPv6 line goes to way 0, way 1 left empty.
    line.put(1, &b, v(2), seed);
    let got: Vec<_> = line.entries(seed).collect();
    assert_eq!(got, [(0, b, v(2))]);
    assert_eq!(line.key(1), None);
    // The marks and the last-written byte are not part of a key.
    assert!(tail_matches(line.w[0], tail_word(&b)));
    assert!(!tail_matches(line.w[0], tail_word(&a)));
}

#[test]
fn a_close_keeps_its_backend_and_epoch_and_reads_back_its_end_and_age() {
    let unit = 1u64 << FLOW_CLOSE_TIME_UNIT;
    let v = FlowValue {
        backend_id: MAX_BACKENDS - 1,
        epoch: 77,
    };
    // A close at sequence end 0xffff_fff0, 5 units after a wrap of the time bits.
    let at = (1u64 << (FLOW_CLOSE_TIME_UNIT + FLOW_CLOSE_TIME_BITS)) * 3 + 5 * unit;
    let c = v.closed_at(0xffff_fff0, at);
    assert!(c.client_closed());
    assert_eq!((c.backend(), c.epoch), (MAX_BACKENDS - 1, 77));
    // The flow cache's hint bits (backend id bits 29 and 30) stay clear.
    assert_eq!(c.backend_id & (3 << 29), 0);
    assert!(c.close_matches(0xffff_fff0) && c.close_matches(0xffff_ffef));
    assert!(!c.close_matches(0xffff_fff1) && !c.close_matches(0xffff_ffee));
    assert!(!c.close_matches(1000));
    assert!(!c.close_held(at));
    assert!(!c.close_held(at + (FLOW_CLOSE_HOLD as u64 - 1) * unit));
    assert!(c.close_held(at + FLOW_CLOSE_HOLD as u64 * unit));
    assert_eq!(c.open(), v);
    // What a peer is sent (the close's end bits, the age of its time unit) rebuilds the close
    // on another clock with its hold (never shorter, at most one unit longer).
    assert_eq!(c.close_seq(), 0xffff_fff0 & 0x7f);
    for (sent_at, peer_now) in [
        (at + 2 * unit + 7, 5 * unit + 3),
        (at + unit / 3, 1u64 << 40),
    ] {
        let age = c.close_age_ns(sent_at);
        assert!(age >= sent_at - at && age < sent_at - at + unit, "{age}");
        let p = v.closed_aged(c.close_seq(), age, peer_now);
        assert!(p.client_closed() && p.close_matches(0xffff_fff0));
        assert_eq!((p.backend(), p.epoch), (MAX_BACKENDS - 1, 77));
        let start = peer_now - age; // the close's unit started here on the peer's clock
        let held = (age..8 * unit)
            .step_by(unit as usize / 64)
            .find(|d| p.close_held(start + d))
            .unwrap();
        assert!(!p.close_held(peer_now));
        assert!(held >= FLOW_CLOSE_HOLD as u64 * unit, "{held}");
        assert!(held <= (FLOW_CLOSE_HOLD as u64 + 1) * unit, "{held}");
    }
    // A close far older than the hold stays held.
    let old = v.closed_aged(3, 60 << 30, 1u64 << 40);
    assert!(old.close_held(1u64 << 40));
    // A close again at another end replaces the first one's bits.
    let again = c.closed_at(3, at + unit);
    assert!(again.close_matches(3) && !again.close_matches(0xffff_fff0));
    assert_eq!(again.backend(), MAX_BACKENDS - 1);
}

#[test]
fn a_retired_slot_keeps_its_way_out_and_names_no_pair() {
    let live = BackendInfo {
        dst_mac: [2, 0xb0, 0, 0, 0, 1],
        vip_id: 3,
        flags: BACKEND_F_IN_SET | BACKEND_F_ENCAP | BACKEND_F_NO_NEW | BACKEND_F_DRAINED,
        epoch: 41,
        ..Default::default()
    };
    assert!(!live.is_vacant());
    let retired = BackendInfo {
        flags: retired_flags(live.flags),
        epoch: 0,
        ..live
    };
    assert_eq!(retired.flags, BACKEND_F_ENCAP, "routed stays routed");
    assert!(retired.is_vacant());
    // A moved slot keeps its addressing bits too, and a retirement drops the pointer.
    let moved = moved_flags(BACKEND_F_IN_SET | BACKEND_F_LOCAL, 7);
    assert_eq!(retired_flags(moved), BACKEND_F_LOCAL);
    assert!(BackendInfo::default().is_vacant());
    // Epoch 0 with state flags still set is not vacant (adoption retires such a slot).
    let odd = BackendInfo {
        flags: BACKEND_F_IN_SET,
        ..Default::default()
    };
    assert!(!odd.is_vacant());
}
