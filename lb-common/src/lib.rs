//! Types shared by the XDP program (`lb-ebpf`) and user space (`lb-userspace`).
//!
//! Every map key and value is `#[repr(C)]` with explicit padding and a size assertion, and holds
//! only plain integers: the kernel copies these bytes verbatim between the two sides.
#![no_std]

use core::mem::size_of;

/// `lbctl explain`'s dry run (kept apart: its own module).
pub mod explain;

/// Address family tags used in keys (not the kernel's AF_* numbers: these are ours and stable).
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_ICMPV6: u8 = 58;

/// Highest number of VIP services (address, port, protocol) one node can hold.
pub const MAX_VIPS: u32 = 32;
/// Highest number of (VIP, backend) pairs: backend ids index per-pair state and counters.
pub const MAX_BACKENDS: u32 = 4096;
/// Default Maglev lookup-table size (a prime). User space may choose another prime at load time.
pub const DEFAULT_TABLE_SIZE: u32 = 65537;
/// Default number of entries in the connection table (LRU).
pub const DEFAULT_CONNTRACK_SIZE: u32 = 262_144;
/// Number of distinct addresses that are VIPs (for the fragment check).
pub const MAX_VIP_ADDRS: u32 = MAX_VIPS;
/// A Maglev slot that holds no backend (an empty set): packets are dropped and counted.
pub const NO_BACKEND: u32 = u32::MAX;
/// IPv6 extension headers skipped before giving up on finding the transport header.
pub const MAX_IPV6_EXT_HEADERS: usize = 4;

/// Port value in a [`VipKey`] that matches every port of the address and protocol.
pub const ALL_PORTS: u16 = 0;

/// A VIP service: looked up first with the packet's destination port, then with [`ALL_PORTS`].
// Aligned to 4 (same size and offsets as without): the XDP program builds and hashes keys with
// word loads and stores instead of byte by byte.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VipKey {
    /// IPv4 in the first 4 bytes (rest zero) or IPv6, network byte order.
    pub addr: [u8; 16],
    /// Destination port in host byte order, or [`ALL_PORTS`].
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}
const _: () = assert!(size_of::<VipKey>() == 20);

/// `VipInfo::flags`: this node owns the VIP (VRRP master, or static ownership). Only an owner forwards.
pub const VIP_F_OWNED: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VipInfo {
    /// Index of this VIP's counters and Maglev tables, `< MAX_VIPS`.
    pub vip_id: u32,
    pub flags: u32,
    /// Which of the VIP's two Maglev tables is live (0 or 1). User space fills the other one,
    /// then flips this field: a packet sees either the old table or the new one, never a mix.
    pub active_table: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<VipInfo>() == 16);

/// `BackendInfo::flags`: the backend is in its VIP's set; established flows may stay on it.
pub const BACKEND_F_IN_SET: u32 = 1;
/// The backend is this node: its packets go to the local stack (`XDP_PASS`).
pub const BACKEND_F_LOCAL: u32 = 2;
/// Drained by the operator (not read by the program: `BACKEND_F_NO_NEW` says what matters).
/// Kept in the pinned map so a restarted `lbd` keeps the drain.
pub const BACKEND_F_DRAINED: u32 = 4;
/// In the set and in the Maglev table, but takes no new flows (drained, failing its checks
/// within its hold, its node suspected dead). It keeps its table slots so that a node without
/// a connection-table entry (a new VIP owner) still sends the backend's established flows to
/// it; a flow start whose slot names it takes the same slot of the VIP's new-flow table
/// (`LB_NEW_TABLES`, built without such backends), which names one that takes new flows
/// whenever one exists.
pub const BACKEND_F_NO_NEW: u32 = 8;
/// The backend is not on this node's segment: packets are wrapped in an outer IP header
/// (IP-in-IP, outer family = the backend's) from `BackendInfo::encap_src` to the backend, and
/// sent to the next hop's MAC (`dst_mac`). The backend strips it (`lb_decap`).
pub const BACKEND_F_ENCAP: u32 = 16;
/// The pair moved to another slot (its addressing changed: MAC, next hop, interface, encap
/// source or MTU): its entries, which name this slot, are followed to the slot in the flags'
/// high bits (`moved_to`), which holds the same epoch. Only the flags of a live slot are ever
/// rewritten, so a reader sees the old addressing or the new, never a mix.
pub const BACKEND_F_MOVED: u32 = 32;
/// `BackendInfo::flags` of a slot (flags `old`) whose pair moved to slot `to`. The old slot's
/// own bits stay (a table that still names it, until its flip, forwards as it always did).
pub const fn moved_flags(old: u32, to: u32) -> u32 {
    (old & 0xffff) | BACKEND_F_MOVED | (to << 16)
}
/// The slot a moved pair's flags name.
#[inline(always)]
pub const fn moved_to(flags: u32) -> u32 {
    flags >> 16
}
const _: () = assert!(MAX_BACKENDS <= 1 << 16);
/// Bytes the outer header adds: IPv4 and IPv6.
pub const ENCAP_HLEN_V4: u32 = 20;
pub const ENCAP_HLEN_V6: u32 = 40;

/// One (VIP, backend) pair, indexed by backend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendInfo {
    pub addr: [u8; 16],
    /// The backend's MAC (destination of the rewritten frame).
    pub dst_mac: [u8; 6],
    /// The egress interface's MAC (source of the rewritten frame).
    pub src_mac: [u8; 6],
    /// Egress interface; 0 means "the interface the packet came in on" (`XDP_TX`).
    pub ifindex: u32,
    /// The VIP this backend belongs to; a connection-table entry is only trusted if it matches.
    pub vip_id: u32,
    pub flags: u32,
    /// The pair's identity, never reused (see [`FlowValue::epoch`]); 0 in an empty slot.
    /// Everything but `flags` is written once per slot: a change of addressing moves the pair
    /// to a new slot with the same epoch (`BACKEND_F_MOVED`), so a reader never sees a
    /// half-written MAC.
    pub epoch: u32,
    pub family: u8,
    pub _pad: u8,
    /// `BACKEND_F_ENCAP`: the egress MTU; a packet whose wrapped size would exceed it gets an
    /// ICMP "fragmentation needed" / "packet too big" back instead (0 = no limit).
    pub encap_mtu: u16,
    /// `BACKEND_F_ENCAP`: the outer source address (this node's, IPv4 in the first 4 bytes).
    pub encap_src: [u8; 16],
}
const _: () = assert!(size_of::<BackendInfo>() == 64);

/// The connection table's key: the full 5-tuple as the client sent it.
// Aligned to 8 (layout unchanged): the XDP program stores the key's zero words in pairs.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Ports in host byte order (0 for protocols without ports).
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<FlowKey>() == 40);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowValue {
    pub backend_id: u32,
    /// The epoch of the (VIP, backend) pair the entry names. Epochs come from one counter kept
    /// in the pinned `LbConfig::next_epoch` and are never handed out twice, so an entry is good
    /// exactly while `LB_BACKENDS[backend_id].epoch` still equals it: reused backend ids, VIP
    /// ids, re-created services and restarts with other settings all make old entries stale.
    pub epoch: u32,
}
const _: () = assert!(size_of::<FlowValue>() == 8);

/// One slot of the flow cache (`LB_FLOW_CACHE_V2`): a direct-mapped copy of connection-table
/// entries in an array, which the kernel looks up inline (no hashing helper, no bucket walk), in
/// front of the LRU hash `LB_CONNTRACK`. A slot is read without a lock while another CPU may be
/// rewriting it: `check` binds the value to the key (`flow_cache_check`), so a reader that got
/// words of two different entries sees a mismatch and falls back to the LRU hash. An empty slot
/// has `key.family == 0`, which no real flow has.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowCacheEntry {
    pub key: FlowKey,
    pub value: FlowValue,
    pub check: u64,
    /// One slot per 64-byte cache line.
    pub _pad: u64,
}
const _: () = assert!(size_of::<FlowCacheEntry>() == 64);

/// Flow-cache slots for a connection table of `conntrack_size` entries: the power of two at or
/// above half of it (at least 64), so the cache holds about as many flows as are usually active
/// and costs 64 bytes a slot (8 MiB at the default 262144 entries).
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

/// The slot of a key whose `flow_cache_hash` is `h`.
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

/// Per-VIP and per-backend traffic counters (per CPU; user space sums them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}
const _: () = assert!(size_of::<Counters>() == 24);

/// `LB_VIP_OWNED[vip_id]`: this node forwards for the VIP (read by the fast path, which does not
/// look the VIP up).
pub const VIP_OWNED: u32 = 1;

/// Global settings the XDP program reads (one entry in the `LB_CONFIG` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LbConfig {
    /// Seed of the flow hash. Every node must use the same seed so that a flow hashes to the same
    /// backend whichever node owns the VIP.
    pub hash_seed: u32,
    /// Maglev table size (prime); 0 until user space has configured the program.
    pub table_size: u32,
    /// `CONFIG_F_*` bits.
    pub flags: u32,
    /// The next (VIP, backend) pair epoch user space hands out (not read by the program).
    pub next_epoch: u32,
    /// A 256-bit filter of VIP addresses (bit `addr_filter_bit(addr)`): a destination whose bit
    /// is clear is not a VIP, decided without a hash lookup.
    pub addr_filter: [u64; 4],
    /// The same for the source MACs in `LB_PEERS` (bit `mac_filter_bit(mac)`): most frames come
    /// from a router, whose bit is clear, and skip the loop-guard lookup.
    pub peer_filter: [u64; 4],
    /// Flood mode: above this many connection-table misses per second on the node (every
    /// packet that would write an entry: SYNs, and segments or datagrams of flows without
    /// one), no miss writes an entry for at least `FLOOD_HOLD_NS`. 0 = never.
    pub syn_flood_rate: u32,
    /// The flow cache's size and this node's secret seed part (`flow_cache_config`). Was
    /// padding: 0 means one slot and no secret, which is still correct, only slower.
    pub flow_cache: u32,
}
const _: () = assert!(size_of::<LbConfig>() == 88);

/// The node's miss accounting for flood mode (`LB_FLOOD_NODE`, one entry shared by every CPU),
/// in `bpf_ktime_get_coarse_ns` time (with the precise clock the SYN path was clearly slower in
/// `bench micro`; a tick does for 100 ms).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FloodState {
    pub window_start: u64,
    /// Misses that would write an entry (for owned VIPs) in the current window, and in the one
    /// before.
    pub count: u32,
    pub last_count: u32,
    /// Flood mode holds until then.
    pub flood_until: u64,
}
const _: () = assert!(size_of::<FloodState>() == 24);

/// `LB_DECAP_PEERS` key: an LB node whose IP-in-IP packets a backend unwraps.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DecapKey {
    /// IPv4 in the first 4 bytes (rest zero) or IPv6, network byte order.
    pub addr: [u8; 16],
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<DecapKey>() == 20);

/// Most LB nodes a backend accepts wrapped packets from.
pub const MAX_DECAP_PEERS: u32 = 64;

/// Most VIPs a backend unwraps packets for (`LB_DECAP_VIPS`), and most local addresses an outer
/// header may be sent to (`LB_DECAP_LOCAL`).
pub const MAX_DECAP_VIPS: u32 = 64;
pub const MAX_DECAP_LOCAL: u32 = 256;

/// `LB_DECAP_STATS` counters (one per-CPU entry). `lb_decap` unwraps an IP-in-IP packet only
/// when its outer source is a known LB node (`LB_DECAP_PEERS`), its outer destination one of
/// this host's addresses (`LB_DECAP_LOCAL`), its headers add up, and its inner destination one
/// of the VIPs served here (`LB_DECAP_VIPS`). An LB node only ever wraps VIP traffic to its
/// backends, so an LB node's packet that fails any of these is forged: dropped, never handed to
/// a stack that could route its inner packet on.
pub mod decap_stat {
    /// Unwrapped and passed to the stack.
    pub const DECAPSULATED: u32 = 0;
    /// IP-in-IP from a source that is not a known LB node: passed unchanged (another tunnel's
    /// traffic is the kernel's business).
    pub const NOT_FROM_PEER: u32 = 1;
    /// IP-in-IP from an LB node whose headers do not add up (lengths, options, fragments):
    /// dropped.
    pub const MALFORMED: u32 = 2;
    /// Anything else: passed unchanged.
    pub const PASSED: u32 = 3;
    /// IP-in-IP from an LB node whose outer destination is not this host's: dropped.
    pub const NOT_LOCAL: u32 = 4;
    /// IP-in-IP from an LB node whose inner destination is not a VIP served here: dropped.
    pub const NOT_VIP: u32 = 5;
    /// Outer header marked CE around a packet that is not ECN-capable: dropped (RFC 6040 4.2:
    /// the congestion signal cannot be passed on).
    pub const ECN_DROP: u32 = 6;
    pub const COUNT: u32 = 7;
    pub const NAMES: [&str; COUNT as usize] = [
        "decapsulated",
        "not_from_peer",
        "malformed",
        "passed",
        "not_local",
        "not_vip",
        "ecn_drop",
    ];
}

/// Socket load balancing: what the cgroup hooks of `lb-ebpf/src/sock.rs` read (one entry of
/// `LB_SOCK_CONFIG`). Written by `lbd` when it attaches them; all zero = the hooks change nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockConfig {
    /// The network namespace whose sockets this node balances (`SO_NETNS_COOKIE` of `lbd`'s
    /// own namespace). The hooks sit on the root cgroup and so see every process of the host,
    /// whatever its namespace: a socket of another namespace is never touched.
    pub netns_cookie: u64,
    /// `SOCK_F_*` bits.
    pub flags: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<SockConfig>() == 16);

/// `SockConfig::flags`: the hooks balance (clear: they only answer reverse lookups of sockets
/// balanced before, so a connection keeps showing its VIP).
pub const SOCK_F_ENABLED: u32 = 1;

/// `LB_SOCK_REV` key: a socket (its cookie) and the backend address it was sent to, as the
/// socket sees it (an IPv4-mapped IPv6 address for a dual-stack socket, family then 6).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockRevKey {
    pub cookie: u64,
    /// Network byte order; IPv4 in the first 4 bytes.
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    pub family: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(size_of::<SockRevKey>() == 32);

/// `LB_SOCK_REV` value: the VIP service address the application asked for.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockRevValue {
    pub addr: [u8; 16],
    pub port: u16,
    pub family: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<SockRevValue>() == 20);

/// Entries of `LB_SOCK_REV` (LRU): sockets balanced and still asking for their VIP back.
pub const SOCK_REV_SIZE: u32 = 65_536;

/// `LB_SOCK_STATS` counters (one per-CPU entry).
pub mod sock_stat {
    /// A connect() or an unconnected send to a VIP service got a backend.
    pub const BALANCED: u32 = 0;
    /// A VIP service without a backend taking new connections: left to the local stack, as
    /// without the hooks.
    pub const NO_BACKEND: u32 = 1;
    /// The chosen backend's family is not the socket's (a routed backend of the other family):
    /// left to the local stack.
    pub const FAMILY_MISMATCH: u32 = 2;
    /// getpeername() or a received datagram showed the VIP instead of the backend.
    pub const REVERSED: u32 = 3;
    pub const COUNT: u32 = 4;
    pub const NAMES: [&str; COUNT as usize] =
        ["balanced", "no_backend", "family_mismatch", "reversed"];
}

/// The window SYNs are counted in (`LbConfig::syn_flood_rate` is scaled to it).
pub const FLOOD_WINDOW_NS: u64 = 100_000_000;
/// Once the rate is exceeded, flood mode holds this long after the last window over it.
pub const FLOOD_HOLD_NS: u64 = 1_000_000_000;
/// Entries of `LB_HANDSHAKES`: handshakes in flight whose SYN skipped a slot in SYN flood mode.
/// Only SYNs that land on a slot taking no new flows use it; at a million such SYNs a second an
/// entry still lasts 16 ms, far above a round trip inside a data centre.
pub const HANDSHAKE_TABLE_SIZE: u32 = 16384;
/// Default `syn_flood_rate`: far above what an API or ingress VIP sees from real clients per
/// CPU, far below what a spoofed flood sends.
pub const DEFAULT_SYN_FLOOD_RATE: u32 = 10_000;

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

/// Most MACs of other lbd nodes (VRRP peers and backends) one node tracks for the loop guard.
pub const MAX_PEERS: u32 = 1024;

/// `LbConfig::flags`: some service matches all ports (a second VIP lookup is needed on a miss).
pub const CONFIG_F_ALL_PORTS: u32 = 1;

/// Global counters, one per verdict and per pass/drop reason, indexes into `LB_STATS`.
pub mod stat {
    pub const VERDICT_PASS: u32 = 0;
    pub const VERDICT_DROP: u32 = 1;
    pub const VERDICT_TX: u32 = 2;
    pub const VERDICT_REDIRECT: u32 = 3;
    /// Not IPv4/IPv6, or not addressed to a VIP service.
    pub const PASS_NOT_VIP: u32 = 4;
    /// A VIP this node does not own: the local stack serves it (e.g. as a DSR backend).
    pub const PASS_NOT_OWNER: u32 = 5;
    /// The chosen backend is this node.
    pub const PASS_LOCAL_BACKEND: u32 = 6;
    /// Truncated frame or impossible header field (e.g. IPv4 IHL < 5).
    pub const PASS_MALFORMED: u32 = 7;
    /// More IPv6 extension headers than we walk.
    pub const PASS_IPV6_EXT_LIMIT: u32 = 8;
    /// ICMP error that does not embed a VIP flow.
    pub const PASS_ICMP_NOT_VIP: u32 = 9;
    /// The VIP's table is empty.
    pub const DROP_NO_BACKEND: u32 = 10;
    /// A fragment of a datagram to a VIP address (see docs/architecture.md).
    pub const DROP_FRAGMENT: u32 = 11;
    /// A table slot names a backend that is not in the set (user space mid-update); never forward.
    pub const DROP_BAD_BACKEND: u32 = 12;
    pub const CONNTRACK_HIT: u32 = 13;
    pub const CONNTRACK_MISS: u32 = 14;
    /// A connection-table entry whose backend left the set: the flow is hashed again.
    pub const CONNTRACK_STALE: u32 = 15;
    /// ICMP "fragmentation needed" / "packet too big" sent on to a flow's backend.
    pub const ICMP_FORWARDED: u32 = 16;
    /// Sent to a remote backend (XDP_TX or redirect).
    pub const FORWARDED: u32 = 17;
    /// Loop guard: a VIP packet whose source MAC is another lbd node's (a VRRP peer or a
    /// backend) was already forwarded once; it goes to the local stack.
    pub const PASS_FROM_PEER: u32 = 18;
    /// A SYN forwarded in flood mode without writing a connection-table entry (a SYN that
    /// skipped a slot taking no new flows is remembered in the small handshake table instead).
    pub const SYN_FLOOD_UNTRACKED: u32 = 19;
    /// Forwarded to a routed backend inside an outer IP header (also counted as `FORWARDED`).
    pub const ENCAPSULATED: u32 = 20;
    /// Too big to wrap for a routed backend's path: an ICMP "fragmentation needed" / "packet
    /// too big" went back to the client instead.
    pub const ENCAP_TOO_BIG: u32 = 21;
    /// The frame could not be grown or shrunk for encapsulation (a driver without headroom).
    pub const DROP_ENCAP: u32 = 22;
    /// A packet other than a SYN without a connection-table entry (a TCP segment or a UDP
    /// datagram of a flow the table does not hold), forwarded in flood mode without writing one.
    pub const FLOOD_UNTRACKED: u32 = 23;
    pub const COUNT: u32 = 24;

    /// Names in index order, used by user space for `lbctl stats` and metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "verdict_pass",
        "verdict_drop",
        "verdict_tx",
        "verdict_redirect",
        "pass_not_vip",
        "pass_not_owner",
        "pass_local_backend",
        "pass_malformed",
        "pass_ipv6_ext_limit",
        "pass_icmp_not_vip",
        "drop_no_backend",
        "drop_fragment",
        "drop_bad_backend",
        "conntrack_hit",
        "conntrack_miss",
        "conntrack_stale",
        "icmp_forwarded",
        "forwarded",
        "pass_from_peer",
        "syn_flood_untracked",
        "encapsulated",
        "encap_too_big",
        "drop_encap",
        "flood_untracked",
    ];
}

/// Names of the pinned maps (also the names in the BPF object).
pub mod maps {
    pub const CONFIG: &str = "LB_CONFIG";
    pub const VIPS: &str = "LB_VIPS";
    pub const VIP_ADDRS: &str = "LB_VIP_ADDRS";
    pub const BACKENDS: &str = "LB_BACKENDS";
    pub const TABLES: &str = "LB_TABLES";
    pub const NEW_TABLES: &str = "LB_NEW_TABLES";
    pub const CONNTRACK: &str = "LB_CONNTRACK";
    pub const STATS: &str = "LB_STATS";
    pub const VIP_STATS: &str = "LB_VIP_STATS";
    pub const BACKEND_STATS: &str = "LB_BACKEND_STATS";
    pub const VIP_OWNED: &str = "LB_VIP_OWNED";
    pub const PEERS: &str = "LB_PEERS";
    pub const FLOOD: &str = "LB_FLOOD_NODE";
    pub const HANDSHAKES: &str = "LB_HANDSHAKES";
    /// Versioned: a cache laid out by another `flow_cache_hash` must never be adopted (its
    /// entries would sit in the wrong slots). Change the hash, change the version.
    pub const FLOW_CACHE: &str = "LB_FLOW_CACHE_V2";
    pub const DECAP_PEERS: &str = "LB_DECAP_PEERS";
    pub const DECAP_STATS: &str = "LB_DECAP_STATS";
    pub const DECAP_VIPS: &str = "LB_DECAP_VIPS";
    pub const DECAP_LOCAL: &str = "LB_DECAP_LOCAL";
    /// The backends' decapsulation program.
    pub const DECAP_PROGRAM: &str = "lb_decap";
    /// Pins of maps earlier versions had and this one does not.
    pub const OBSOLETE: &[&str] = &["LB_VIP_GEN", "LB_FLOOD", "LB_FLOW_CACHE"];
    /// The XDP program's name in the object.
    pub const PROGRAM: &str = "lb_xdp";
    /// Socket load balancing (see `SockConfig`).
    pub const SOCK_CONFIG: &str = "LB_SOCK_CONFIG";
    pub const SOCK_REV: &str = "LB_SOCK_REV";
    pub const SOCK_STATS: &str = "LB_SOCK_STATS";
    /// The cgroup programs of socket load balancing, by attach point.
    pub const SOCK_PROGRAMS: &[&str] = &[
        "lb_sock_connect4",
        "lb_sock_connect6",
        "lb_sock_sendmsg4",
        "lb_sock_sendmsg6",
        "lb_sock_recvmsg4",
        "lb_sock_recvmsg6",
        "lb_sock_getpeername4",
        "lb_sock_getpeername6",
    ];
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
fn word(b: &[u8; 16], i: usize) -> u32 {
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

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for VipInfo {}
    unsafe impl aya::Pod for BackendInfo {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowValue {}
    unsafe impl aya::Pod for FlowCacheEntry {}
    unsafe impl aya::Pod for DecapKey {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for LbConfig {}
    unsafe impl aya::Pod for FloodState {}
    unsafe impl aya::Pod for SockConfig {}
    unsafe impl aya::Pod for SockRevKey {}
    unsafe impl aya::Pod for SockRevValue {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
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
        assert_eq!(maps::FLOW_CACHE, "LB_FLOW_CACHE_V2");
        assert_eq!(flow_cache_hash(&v4_key(), seed), 0x8075_5e93_ac37_1144);
        assert!(maps::OBSOLETE.contains(&"LB_FLOW_CACHE"));
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
}
