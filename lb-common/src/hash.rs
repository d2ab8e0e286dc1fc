//! Where a flow goes: the Maglev flow hash and table layout, the flow cache's hash and sizing,
//! and the address and MAC filter bits. The same code runs in the kernel and in user space.
use crate::{FAMILY_V4, FlowKey, FlowValue, MAX_VIPS};

/// Flow-cache lines for a connection table of `conntrack_size` entries: the power of two at or
/// above half of it (at least 64). A line holds two IPv4 flows or one IPv6 flow
/// (`FlowCacheLine`) and costs 64 bytes (8 MiB at the default 262144 entries).
pub const fn flow_cache_slots(conntrack_size: u32) -> u32 {
    let half = conntrack_size / 2;
    let n = if half < 64 { 64 } else { half };
    n.next_power_of_two()
}

/// `LbConfig::flow_cache`: the cache's size (log2 of its slots, low 5 bits) and this node's
/// secret part of its hash seed (the other 27 bits).
pub const fn flow_cache_config(slots: u32, secret: u32) -> u32 {
    slots.trailing_zeros() | (secret << 5)
}

/// The 64-bit seed of `flow_cache_hash`: the configured `hash_seed` and the node's secret, so
/// that nobody who knows the configuration can aim flows at another flow's slot or check word.
#[inline(always)]
pub fn flow_cache_seed(hash_seed: u32, flow_cache: u32) -> u64 {
    (((flow_cache >> 5) as u64) << 32) | hash_seed as u64
}

/// The line of a key whose `flow_cache_hash` is `h`.
#[inline(always)]
pub fn flow_cache_index(h: u64, flow_cache: u32) -> u32 {
    (h as u32) & (1u32 << (flow_cache & 31)).wrapping_sub(1)
}

/// The seeded 64-bit hash of a flow key that places it in the flow cache
/// (`flow_cache_index`) and, with its value, makes the slot's check word. Not the Maglev hash
/// ([`flow_hash`]): this one never leaves the node and may change between versions, with the
/// version in the cache's pin name (`maps::FLOW_CACHE`).
/// Multiply-xorshift rounds over the key's 64-bit words, cheap in BPF (no rotates, no byte
/// loads); an IPv4 key's words 1 and 3 (address bytes 8..16) are always zero and skipped.
#[inline(always)]
pub fn flow_cache_hash(key: &FlowKey, seed: u64) -> u64 {
    const K: u64 = 0xff51_afd7_ed55_8ccd;
    #[inline(always)]
    fn round(h: u64, w: u64) -> u64 {
        let h = (h ^ w).wrapping_mul(K);
        h ^ (h >> 32)
    }
    // SAFETY: FlowKey is 40 bytes, aligned to 8, every bit pattern of its words is a valid u64.
    let w = unsafe { &*(key as *const FlowKey as *const [u64; 5]) };
    let mut h = round(seed ^ 0x9e37_79b9_7f4a_7c15, w[4]);
    h = round(h, w[0]);
    h = round(h, w[2]);
    if key.family != FAMILY_V4 {
        h = round(h, w[1]);
        h = round(h, w[3]);
    }
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 29)
}

/// The check word of a flow-cache slot holding `value` for a key whose `flow_cache_hash` is
/// `h`. The value's part is a bijection (an odd multiplier), so two slots' words mixed by a
/// concurrent rewrite pass the check only if they hold the same value or their keys' 64-bit
/// hashes collide.
#[inline(always)]
pub fn flow_cache_check(h: u64, value: FlowValue) -> u64 {
    let v = ((value.backend_id as u64) << 32) | value.epoch as u64;
    h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The bit of `addr` in `LbConfig::addr_filter`.
#[inline(always)]
pub fn addr_filter_bit(addr: &[u8; 16]) -> u32 {
    addr_filter_bit_words(&[word(addr, 0), word(addr, 4), word(addr, 8), word(addr, 12)])
}

/// `addr_filter_bit` of an address held as four native-endian words (its bytes in memory order).
#[inline(always)]
pub fn addr_filter_bit_words(w: &[u32; 4]) -> u32 {
    (w[0] ^ w[1] ^ w[2] ^ w[3]).wrapping_mul(0x9e37_79b1) >> 24
}

/// The bit of a MAC address in `LbConfig::peer_filter`.
#[inline(always)]
pub fn mac_filter_bit(mac: &[u8; 6]) -> u32 {
    let x = u32::from_ne_bytes([mac[0], mac[1], mac[2], mac[3]])
        ^ u32::from_ne_bytes([mac[4], mac[5], mac[0], mac[1]]).rotate_left(16);
    x.wrapping_mul(0x9e37_79b1) >> 24
}

/// Key of `LB_PEERS`: a MAC address padded to 8 bytes.
#[inline(always)]
pub fn peer_key(mac: &[u8; 6]) -> [u8; 8] {
    [mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], 0, 0]
}

/// `mac_filter_bit` and `peer_key` of a MAC held as three native-endian u16 (its bytes in memory
/// order, as the XDP program reads it from the frame with half-word loads).
#[inline(always)]
pub fn mac_halves_filter_bit(h: [u16; 3]) -> u32 {
    let [a, b] = h[0].to_ne_bytes();
    let [c, d] = h[1].to_ne_bytes();
    let [e, f] = h[2].to_ne_bytes();
    let x = u32::from_ne_bytes([a, b, c, d]) ^ u32::from_ne_bytes([e, f, a, b]).rotate_left(16);
    x.wrapping_mul(0x9e37_79b1) >> 24
}

/// `peer_key` of a MAC held as in `mac_halves_filter_bit`.
#[inline(always)]
pub fn peer_key_halves(h: [u16; 3]) -> [u8; 8] {
    let [a, b] = h[0].to_ne_bytes();
    let [c, d] = h[1].to_ne_bytes();
    let [e, f] = h[2].to_ne_bytes();
    [a, b, c, d, e, f, 0, 0]
}

/// Slots per table in `LB_TABLES`, rounded up to even: the array's elements are `[u32; 2]`
/// (the kernel rounds array elements to 8 bytes, and user space writes the memory-mapped array
/// as a dense run of u32 slots).
#[inline(always)]
pub fn table_stride(table_size: u32) -> u32 {
    (table_size + 1) & !1
}

/// Elements of `LB_TABLES` for a table size.
pub fn table_elements(table_size: u32) -> u32 {
    MAX_VIPS * table_stride(table_size)
}

/// Position (counted in u32 slots) of slot `slot` of table `which` (0/1) of VIP `vip_id` in the
/// flat `LB_TABLES` array: element `pos / 2`, lane `pos % 2`.
#[inline(always)]
pub fn table_index(vip_id: u32, which: u32, table_size: u32, slot: u32) -> u32 {
    (vip_id * 2 + (which & 1)) * table_stride(table_size) + slot
}

#[inline(always)]
fn rotl(x: u32, r: u32) -> u32 {
    x.rotate_left(r)
}

#[inline(always)]
fn mix(h: u32, k: u32) -> u32 {
    // One murmur3 round: cheap, good avalanche, the same in the kernel and in user space.
    let k = rotl(k.wrapping_mul(0xcc9e_2d51), 15).wrapping_mul(0x1b87_3593);
    rotl(h ^ k, 13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
pub(crate) fn word(b: &[u8; 16], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The seeded flow hash that picks a Maglev slot: murmur3 over source, destination, ports and
/// protocol. Identical on every node, so a flow keeps its backend when the VIP moves.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = seed;
    h = mix(h, word(&key.src, 0));
    h = mix(h, word(&key.src, 4));
    h = mix(h, word(&key.src, 8));
    h = mix(h, word(&key.src, 12));
    h = mix(h, word(&key.dst, 0));
    h = mix(h, word(&key.dst, 4));
    h = mix(h, word(&key.dst, 8));
    h = mix(h, word(&key.dst, 12));
    h = mix(h, ((key.sport as u32) << 16) | key.dport as u32);
    h = mix(h, key.proto as u32);
    // murmur3 finaliser
    h ^= 40;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}
