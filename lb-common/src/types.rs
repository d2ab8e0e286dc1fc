//! Map keys and values, with the flag bits of their fields: `#[repr(C)]`, explicit padding,
//! a size assertion each.
use core::mem::size_of;

use crate::MAX_BACKENDS;

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
/// The bits of `BackendInfo::flags` that are addressing, not state: how a frame reaches the
/// pair (the local stack, or wrapped to a next hop). Like the MACs, they never change in a
/// live slot, and a retirement keeps them: the program reads a slot's flags more than once
/// while it forwards one packet (a check, then the way out), so a retirement between two reads
/// must not turn a routed pair into an on-link one (its next hop's MAC, the frame unwrapped) or
/// a local one into a remote one.
pub const BACKEND_F_ADDRESSING: u32 = BACKEND_F_LOCAL | BACKEND_F_ENCAP;
/// `BackendInfo::flags` of a retired slot whose flags were `flags`: its addressing bits only
/// (out of the set, no new flows, not moved; with epoch 0, the slot names no pair).
pub const fn retired_flags(flags: u32) -> u32 {
    flags & BACKEND_F_ADDRESSING
}
const _: () = assert!(MAX_BACKENDS <= 1 << 16);
/// Bytes the outer header adds: IPv4 and IPv6.
pub const ENCAP_HLEN_V4: u32 = 20;
pub const ENCAP_HLEN_V6: u32 = 40;
/// The smallest MTU an IPv6 path may have (RFC 8200 5): no IPv6 client lowers its path MTU
/// below it, so a routed backend whose path cannot carry that much once wrapped cannot serve
/// IPv6 clients.
pub const IPV6_MIN_MTU: u32 = 1280;

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
    /// Everything but `flags` (and of `flags`, `BACKEND_F_ADDRESSING` too) is written once per
    /// pair in a slot: a change of addressing moves the pair to a new slot with the same epoch
    /// (`BACKEND_F_MOVED`), so a reader never sees a half-written MAC.
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

impl BackendInfo {
    /// A slot that names no pair: never written, or retired (epoch 0, and of its flags only
    /// the addressing bits, which a retirement keeps).
    pub const fn is_vacant(&self) -> bool {
        self.epoch == 0 && self.flags == retired_flags(self.flags)
    }
}

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

/// Set in `FlowValue::backend_id` once the client closed the connection the entry was written
/// for: a TCP FIN or RST from the client went through this node. Later segments of that
/// connection (the last ACK, retransmits) still follow the entry. A SYN on a closed entry opens
/// a new connection on the 5-tuple (a client reusing its port) and is placed afresh, as IPVS
/// reschedules a SYN on a connection in FIN_WAIT in direct-routing mode (`conn_reuse_mode`),
/// once the close is `FLOW_CLOSE_HOLD` time units old, whatever the entry's pair takes; before,
/// it follows the entry (a forged close and SYN must not move a connection, not even one on a
/// drained or failing backend), unless the pair left the set.
/// The close keeps the low bits of the closing segment's end sequence number
/// (`FLOW_CLOSE_SEQ_*`) and the coarse time of the close (`FLOW_CLOSE_TIME_*`) in the bits of
/// `backend_id` above the backend's slot: a later client segment whose sequence number is not
/// the close's (a real client sends nothing after its FIN but its retransmission and ACKs at
/// the FIN's end, nothing after its RST but RSTs at the same place) shows the close was forged,
/// and reopens the entry (`FlowValue::open`). Backend ids stay far below (`MAX_BACKENDS`).
pub const FLOW_F_CLIENT_CLOSED: u32 = 1 << 31;
const _: () = assert!(MAX_BACKENDS < FLOW_F_CLIENT_CLOSED);
/// The bits of `FlowValue::backend_id` that hold the backend's slot.
pub const FLOW_ID_MASK: u32 = MAX_BACKENDS - 1;
const _: () = assert!(MAX_BACKENDS.is_power_of_two() && MAX_BACKENDS == 1 << FLOW_CLOSE_SEQ_SHIFT);
/// A closed entry: the low `FLOW_CLOSE_SEQ_BITS` bits of the closing segment's end (its
/// sequence number plus its payload, plus one for a FIN), at `FLOW_CLOSE_SEQ_SHIFT`.
pub const FLOW_CLOSE_SEQ_SHIFT: u32 = 12;
pub const FLOW_CLOSE_SEQ_BITS: u32 = 7;
/// A closed entry: the time of the close, `bpf_ktime_get_coarse_ns() >> FLOW_CLOSE_TIME_UNIT`
/// (units of 2^31 ns, about 2.1 s), its low `FLOW_CLOSE_TIME_BITS` bits (they wrap every
/// 2,199 s), at `FLOW_CLOSE_TIME_SHIFT`.
pub const FLOW_CLOSE_TIME_SHIFT: u32 = 19;
pub const FLOW_CLOSE_TIME_BITS: u32 = 10;
pub const FLOW_CLOSE_TIME_UNIT: u32 = 31;
/// A SYN on a closed entry (its pair in the set) is placed afresh once the close is this many
/// time units old (at least 6.4 s, at most 8.6 s); before, it follows the entry.
pub const FLOW_CLOSE_HOLD: u32 = 4;
// Bits 29 and 30 stay clear in every entry: the program's flow-cache hints use them.
const _: () = assert!(FLOW_CLOSE_TIME_SHIFT + FLOW_CLOSE_TIME_BITS <= 29);
const _: () = assert!(FLOW_CLOSE_SEQ_SHIFT + FLOW_CLOSE_SEQ_BITS == FLOW_CLOSE_TIME_SHIFT);
const FLOW_CLOSE_SEQ_MASK: u32 = (1 << FLOW_CLOSE_SEQ_BITS) - 1;
const FLOW_CLOSE_TIME_MASK: u32 = (1 << FLOW_CLOSE_TIME_BITS) - 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowValue {
    /// The backend's slot in `LB_BACKENDS` (`FLOW_ID_MASK`), with `FLOW_F_CLIENT_CLOSED` and a
    /// closed entry's sequence and time bits (read it through [`FlowValue::backend`]).
    pub backend_id: u32,
    /// The epoch of the (VIP, backend) pair the entry names. Epochs come from one counter kept
    /// in the pinned `LbConfig::next_epoch` and are never handed out twice, so an entry is good
    /// exactly while `LB_BACKENDS[backend_id].epoch` still equals it: reused backend ids, VIP
    /// ids, re-created services and restarts with other settings all make old entries stale.
    pub epoch: u32,
}
const _: () = assert!(size_of::<FlowValue>() == 8);

impl FlowValue {
    /// The backend slot the entry names.
    #[inline(always)]
    pub const fn backend(&self) -> u32 {
        self.backend_id & FLOW_ID_MASK
    }
    /// The client closed the connection the entry was written for (`FLOW_F_CLIENT_CLOSED`).
    #[inline(always)]
    pub const fn client_closed(&self) -> bool {
        self.backend_id & FLOW_F_CLIENT_CLOSED != 0
    }
    /// The same entry, marked closed by the client with no sequence number or time (0 both).
    #[inline(always)]
    pub const fn closed(self) -> FlowValue {
        self.closed_at(0, 0)
    }
    /// The same entry, marked closed by a client segment ending at sequence number `seq_end`,
    /// at `now_ns` (`bpf_ktime_get_coarse_ns`).
    #[inline(always)]
    pub const fn closed_at(self, seq_end: u32, now_ns: u64) -> FlowValue {
        let time = (now_ns >> FLOW_CLOSE_TIME_UNIT) as u32 & FLOW_CLOSE_TIME_MASK;
        FlowValue {
            backend_id: self.backend()
                | FLOW_F_CLIENT_CLOSED
                | (seq_end & FLOW_CLOSE_SEQ_MASK) << FLOW_CLOSE_SEQ_SHIFT
                | time << FLOW_CLOSE_TIME_SHIFT,
            epoch: self.epoch,
        }
    }
    /// The same entry, open (a client segment showed its close was forged).
    #[inline(always)]
    pub const fn open(self) -> FlowValue {
        FlowValue {
            backend_id: self.backend(),
            epoch: self.epoch,
        }
    }
    /// A closed entry: is `seq` (a client segment's sequence number; for a FIN or RST, its
    /// end) the close's end, or one before it (the FIN's own retransmission)? What a real
    /// client sends after its close has it; anything else shows the close was forged.
    #[inline(always)]
    pub const fn close_matches(&self, seq: u32) -> bool {
        let stored = self.backend_id >> FLOW_CLOSE_SEQ_SHIFT;
        stored.wrapping_sub(seq) & FLOW_CLOSE_SEQ_MASK <= 1
    }
    /// A closed entry: the low `FLOW_CLOSE_SEQ_BITS` bits of the close's end.
    #[inline(always)]
    pub const fn close_seq(&self) -> u32 {
        (self.backend_id >> FLOW_CLOSE_SEQ_SHIFT) & FLOW_CLOSE_SEQ_MASK
    }
    /// A closed entry: the time at `now_ns` since the start of the coarse time unit its close
    /// fell in (an upper bound of the close's age, modulo the time bits' wrap every 2,199 s).
    /// What the connection sync sends so a peer's copy keeps the close's hold.
    #[inline(always)]
    pub const fn close_age_ns(&self, now_ns: u64) -> u64 {
        let now = (now_ns >> FLOW_CLOSE_TIME_UNIT) as u32;
        let at = self.backend_id >> FLOW_CLOSE_TIME_SHIFT;
        let units = now.wrapping_sub(at) & FLOW_CLOSE_TIME_MASK;
        ((units as u64) << FLOW_CLOSE_TIME_UNIT) | (now_ns & ((1 << FLOW_CLOSE_TIME_UNIT) - 1))
    }
    /// The same entry, closed at end `seq_end` by a close whose time unit started `age_ns`
    /// before `now_ns` (a peer's [`FlowValue::close_age_ns`]): its time is the first unit
    /// starting at or after that instant, so the hold here is never shorter than the data
    /// plane's own (at least `FLOW_CLOSE_HOLD - 1` units after the close; at most one unit
    /// longer than the sender's).
    #[inline(always)]
    pub const fn closed_aged(self, seq_end: u32, age_ns: u64, now_ns: u64) -> FlowValue {
        let start = now_ns.wrapping_sub(age_ns);
        let unit = 1u64 << FLOW_CLOSE_TIME_UNIT;
        let at = start.wrapping_add(unit - 1) & !(unit - 1);
        self.closed_at(seq_end, at)
    }
    /// A closed entry: is the close at least `FLOW_CLOSE_HOLD` time units old at `now_ns`?
    #[inline(always)]
    pub const fn close_held(&self, now_ns: u64) -> bool {
        let now = (now_ns >> FLOW_CLOSE_TIME_UNIT) as u32;
        let at = self.backend_id >> FLOW_CLOSE_TIME_SHIFT;
        now.wrapping_sub(at) & FLOW_CLOSE_TIME_MASK >= FLOW_CLOSE_HOLD
    }
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

/// `LbConfig::flags`: some service matches all ports (a second VIP lookup is needed on a miss).
pub const CONFIG_F_ALL_PORTS: u32 = 1;
