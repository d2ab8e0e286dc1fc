//! Every map the program uses, pinned by name under the bpffs directory user space chooses, so
//! that a restarted `lbd` adopts them and forwarding never stops. Sizes marked "at load time" are
//! overridden by user space (`EbpfLoader::set_max_entries`).

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use lb_common::{
    BackendInfo, Counters, DEFAULT_CONNTRACK_SIZE, DEFAULT_TABLE_SIZE, DecapKey, FloodState,
    FlowCacheLine, FlowKey, FlowValue, HANDSHAKE_TABLE_SIZE, LbConfig, MAX_BACKENDS,
    MAX_DECAP_LOCAL, MAX_DECAP_PEERS, MAX_DECAP_VIPS, MAX_PEERS, MAX_VIP_ADDRS, MAX_VIPS, VipInfo,
    VipKey, decap_stat, flow_cache_slots, stat,
};

/// One entry: hash seed and table size.
#[map]
pub static LB_CONFIG: Array<LbConfig> = Array::pinned(1, 0);

/// VIP services. Not preallocated: an update of a VIP's entry is then RCU-safe for readers.
#[map]
pub static LB_VIPS: HashMap<VipKey, VipInfo> = HashMap::pinned(MAX_VIPS, BPF_F_NO_PREALLOC);

/// Every address that is a VIP (port and protocol zero), to recognise fragments sent to a VIP.
#[map]
pub static LB_VIP_ADDRS: HashMap<VipKey, u32> = HashMap::pinned(MAX_VIP_ADDRS, BPF_F_NO_PREALLOC);

/// Per VIP id: `lb_common::VIP_OWNED` when this node forwards for it (the fast path's gate).
#[map]
pub static LB_VIP_OWNED: Array<u32> = Array::pinned(MAX_VIPS, 0);

/// The loop guard: source MACs of other lbd nodes (VRRP peers and backends), key
/// `lb_common::peer_key`. A VIP packet from one of them was forwarded once already.
#[map]
pub static LB_PEERS: HashMap<[u8; 8], u32> = HashMap::pinned(MAX_PEERS, BPF_F_NO_PREALLOC);

/// (VIP, backend) pairs indexed by backend id.
#[map]
pub static LB_BACKENDS: Array<BackendInfo> = Array::pinned(MAX_BACKENDS, 0);

/// Two Maglev tables per VIP, flat: see `lb_common::table_index`. Size at load time.
/// Memory-mappable: user space writes a whole table with plain stores, then flips `active_table`.
#[map]
/// Elements hold two slots each (see `lb_common::table_stride`).
pub static LB_TABLES: Array<[u32; 2]> =
    Array::pinned(MAX_VIPS * (DEFAULT_TABLE_SIZE + 1), BPF_F_MMAPABLE);

/// The new-flow tables, laid out as `LB_TABLES` (same halves, flipped by the same
/// `active_table`): each VIP's Maglev table built without the backends that take no new flows.
/// Size at load time.
#[map]
pub static LB_NEW_TABLES: Array<[u32; 2]> =
    Array::pinned(MAX_VIPS * (DEFAULT_TABLE_SIZE + 1), BPF_F_MMAPABLE);

/// The connection table: 5-tuple -> backend id. Size at load time.
#[map]
pub static LB_CONNTRACK: LruHashMap<FlowKey, FlowValue> =
    LruHashMap::pinned(DEFAULT_CONNTRACK_SIZE, 0);

/// The flow cache in front of `LB_CONNTRACK` (see `flows`): direct-mapped slots, looked up
/// inline by the kernel. Size at load time (`lb_common::flow_cache_slots`).
#[map]
pub static LB_FLOW_CACHE_V3: Array<FlowCacheLine> =
    Array::pinned(flow_cache_slots(DEFAULT_CONNTRACK_SIZE), BPF_F_MMAPABLE);

/// Handshakes whose SYN skipped a slot that takes no new flows in SYN flood mode: their ACK
/// follows the SYN whatever the flood state is by then. Small and apart from `LB_CONNTRACK`, so
/// a flood churns this table, not the established flows'.
#[map]
pub static LB_HANDSHAKES: LruHashMap<FlowKey, FlowValue> =
    LruHashMap::pinned(HANDSHAKE_TABLE_SIZE, 0);

/// Backends (`lb_decap`): the LB nodes whose IP-in-IP packets are unwrapped.
#[map]
pub static LB_DECAP_PEERS: HashMap<DecapKey, u32> =
    HashMap::pinned(MAX_DECAP_PEERS, BPF_F_NO_PREALLOC);

/// Backends (`lb_decap`): the VIPs an unwrapped packet may be addressed to.
#[map]
pub static LB_DECAP_VIPS: HashMap<DecapKey, u32> =
    HashMap::pinned(MAX_DECAP_VIPS, BPF_F_NO_PREALLOC);

/// Backends (`lb_decap`): this host's addresses, the only outer destinations unwrapped.
#[map]
pub static LB_DECAP_LOCAL: HashMap<DecapKey, u32> =
    HashMap::pinned(MAX_DECAP_LOCAL, BPF_F_NO_PREALLOC);

/// Backends (`lb_decap`): `lb_common::decap_stat` counters.
#[map]
pub static LB_DECAP_STATS: PerCpuArray<[u64; decap_stat::COUNT as usize]> =
    PerCpuArray::pinned(1, 0);

/// Flood accounting, one entry for the node (see `lb_common::FloodState`).
#[map]
pub static LB_FLOOD_NODE: Array<FloodState> = Array::pinned(1, 0);

/// Global counters: one per-CPU entry holding every counter, so a packet costs one lookup.
#[map]
pub static LB_STATS: PerCpuArray<[u64; stat::COUNT as usize]> = PerCpuArray::pinned(1, 0);

/// What retired pairs of a VIP counted (written by user space only; a VIP's counters are these
/// plus its current pairs' `LB_BACKEND_STATS`).
#[map]
pub static LB_VIP_STATS: PerCpuArray<Counters> = PerCpuArray::pinned(MAX_VIPS, 0);

#[map]
pub static LB_BACKEND_STATS: PerCpuArray<Counters> = PerCpuArray::pinned(MAX_BACKENDS, 0);

/// Add one to each of `indexes` (`NONE` skips a slot).
#[inline(always)]
pub fn count(indexes: [u32; 3]) {
    if let Some(c) = LB_STATS.get_ptr_mut(0) {
        // Per-CPU value: no other writer, a plain add is enough.
        let c = unsafe { &mut *c };
        for i in indexes {
            if let Some(v) = c.get_mut(i as usize) {
                *v += 1;
            }
        }
    }
}

/// "No counter" in a [`count`] slot.
pub const NONE: u32 = u32::MAX;

#[inline(always)]
pub fn count_traffic(map: &PerCpuArray<Counters>, index: u32, bytes: u64, new_flow: bool) {
    if let Some(c) = map.get_ptr_mut(index) {
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
            if new_flow {
                (*c).new_flows += 1;
            }
        }
    }
}

/// Socket load balancing (`sock`): this node's network namespace and switches. Not pinned:
/// `lbd` writes it each time it attaches the hooks, which go when `lbd` goes.
#[map]
pub static LB_SOCK_CONFIG: Array<lb_common::SockConfig> = Array::with_max_entries(1, 0);

/// Socket load balancing: (socket cookie, backend) -> the VIP service the application asked
/// for, for getpeername() and received datagrams. Pinned: a restarted `lbd` still answers for
/// sockets balanced before.
#[map]
pub static LB_SOCK_REV: LruHashMap<lb_common::SockRevKey, lb_common::SockRevValue> =
    LruHashMap::pinned(lb_common::SOCK_REV_SIZE, 0);

/// Socket load balancing: `lb_common::sock_stat` counters.
#[map]
pub static LB_SOCK_STATS: PerCpuArray<[u64; lb_common::sock_stat::COUNT as usize]> =
    PerCpuArray::pinned(1, 0);
