//! Limits, address families, protocol numbers and flood-mode timing shared by both sides.

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

/// The window SYNs are counted in (`LbConfig::syn_flood_rate` is scaled to it).
pub const FLOOD_WINDOW_NS: u64 = 100_000_000;
/// Once the rate is exceeded, flood mode holds this long after the last window over it.
pub const FLOOD_HOLD_NS: u64 = 1_000_000_000;
/// Entries of `LB_HANDSHAKES`: handshakes in flight whose SYN skipped a slot in SYN flood mode
/// (until the connection's next segment writes the connection table), and flows whose miss
/// flood mode counted already (epoch 0). At a million such SYNs a second an entry still lasts
/// 16 ms, far above a round trip inside a data centre.
pub const HANDSHAKE_TABLE_SIZE: u32 = 16384;
/// Default `syn_flood_rate`: far above what an API or ingress VIP sees from real clients per
/// CPU, far below what a spoofed flood sends.
pub const DEFAULT_SYN_FLOOD_RATE: u32 = 10_000;

/// Most MACs of other lbd nodes (VRRP peers and backends) one node tracks for the loop guard.
pub const MAX_PEERS: u32 = 1024;
