//! Programs for the benches, in an object of their own (`lb-bench`: never in the one lbd
//! loads): the baseline every bench compares with; for `bench throughput` a traffic generator
//! run with BPF_PROG_TEST_RUN in live-frames mode and a sink that counts and drops what the load
//! balancer sends back; for `bench micro` the floor of an established flow's path (one
//! connection-table lookup) and of a new flow's (one insert, with the common and with per-CPU LRU
//! lists). Their maps are small, unpinned, and not shared with the data plane.
#![no_std]
#![no_main]

#[allow(dead_code)]
mod packet;

use aya_ebpf::{
    bindings::{
        BPF_F_NO_COMMON_LRU,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    macros::{map, xdp},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::XdpContext,
};

use crate::packet::{ptr_at, swap_macs};

/// The benchmark baseline: the least an XDP forwarder can do (swap the MACs, send it back).
#[xdp]
pub fn lb_baseline(ctx: XdpContext) -> u32 {
    match ptr_at::<[u8; 12]>(&ctx, 0) {
        Ok(eth) => {
            unsafe {
                let eth = &mut *eth;
                let mut dst = [0u8; 6];
                dst.copy_from_slice(&eth[..6]);
                eth.copy_within(6..12, 0);
                eth[6..].copy_from_slice(&dst);
            }
            XDP_TX
        }
        Err(_) => XDP_PASS,
    }
}

/// The generator's per-CPU state: `[flows, step, next, _]`. With `flows` > 1 every frame gets
/// the source address 10.x.y.z of flow `next` (x.y.z = the flow number + 1), and `next` moves
/// by `step` (coprime with `flows`) modulo `flows`, so consecutive frames belong to flows far
/// apart and every flow comes once per `flows` frames.
#[map]
static BENCH_GEN: PerCpuArray<[u32; 4]> = PerCpuArray::with_max_entries(1, 0);

/// Frames the sink received, per CPU.
#[map]
static BENCH_SINK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Offset of the IPv4 source address in an untagged Ethernet frame.
const IPV4_SRC: usize = 14 + 12;

/// The generator: sends every frame out of the interface it "arrived" on (XDP_TX), optionally
/// spreading frames over many flows (see `BENCH_GEN`).
#[xdp]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    if let Some(state) = BENCH_GEN.get_ptr_mut(0) {
        let s = unsafe { &mut *state };
        let (flows, step) = (s[0], s[1]);
        if flows > 1
            && let Ok(src) = ptr_at::<[u8; 4]>(&ctx, IPV4_SRC)
        {
            let flow = s[2] + 1;
            unsafe { *src = [10, (flow >> 16) as u8, (flow >> 8) as u8, flow as u8] };
            let mut next = s[2] + step;
            if next >= flows {
                next -= flows;
            }
            s[2] = next;
        }
    }
    XDP_TX
}

/// The sink on the generator's side: counts and drops. (It also makes the veth deliver the
/// load balancer's XDP_TX frames at all: a native-mode veth only delivers to an XDP peer.)
#[xdp]
pub fn bench_sink(_ctx: XdpContext) -> u32 {
    if let Some(n) = BENCH_SINK.get_ptr_mut(0) {
        unsafe { *n += 1 };
    }
    XDP_DROP
}

/// Connection-table-like LRU maps for `bench micro`'s floor cases: the same 40-byte key as
/// `LB_CONNTRACK` (`FlowKey`), and a 16-byte IPv4-only key, each holding a few flows.
#[map]
static BENCH_LRU40: LruHashMap<[u32; 10], u64> = LruHashMap::with_max_entries(1024, 0);
#[map]
static BENCH_LRU16: LruHashMap<[u32; 4], u64> = LruHashMap::with_max_entries(1024, 0);

/// The IPv4 5-tuple words of an untagged TCP/UDP frame without IP options: source, destination,
/// the two ports as one word, the protocol.
#[inline(always)]
fn v4_tuple(ctx: &XdpContext) -> Option<[u32; 4]> {
    let ip = unsafe { *ptr_at::<[u32; 5]>(ctx, 14).ok()? };
    let ports = unsafe { *ptr_at::<u32>(ctx, 34).ok()? };
    Some([ip[3], ip[4], ports, (ip[2] >> 8) & 0xff])
}

/// The floor of an established flow's path: one LRU lookup of a `FlowKey`-sized key built from
/// the frame (inserted on the first miss), then the baseline's MAC swap.
#[xdp]
pub fn bench_lru40(ctx: XdpContext) -> u32 {
    let Some(t) = v4_tuple(&ctx) else {
        return XDP_PASS;
    };
    let key = [t[0], 0, 0, 0, t[1], 0, 0, 0, t[2], t[3] | (4 << 8)];
    if BENCH_LRU40.get_ptr(&key).is_none() {
        let _ = BENCH_LRU40.insert(&key, &1, 0);
    }
    match swap_macs(&ctx) {
        Some(()) => XDP_TX,
        None => XDP_PASS,
    }
}

/// The same with a compact IPv4 key (16 bytes).
#[xdp]
pub fn bench_lru16(ctx: XdpContext) -> u32 {
    let Some(key) = v4_tuple(&ctx) else {
        return XDP_PASS;
    };
    if BENCH_LRU16.get_ptr(&key).is_none() {
        let _ = BENCH_LRU16.insert(&key, &1, 0);
    }
    match swap_macs(&ctx) {
        Some(()) => XDP_TX,
        None => XDP_PASS,
    }
}

/// A per-CPU sequence for `bench_lru_insert40`: each run inserts a key never seen before.
#[map]
static BENCH_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);
#[map]
static BENCH_LRU_NEW: LruHashMap<[u32; 10], u64> = LruHashMap::with_max_entries(1024, 0);

/// The floor of a path that remembers a new flow: one insert of a new `FlowKey`-sized key into
/// a full LRU hash (after the first 1024 runs every insert evicts, as in a full connection
/// table), then the baseline's MAC swap. What no new-flow path that writes a connection-table
/// entry can beat.
#[xdp]
pub fn bench_lru_insert40(ctx: XdpContext) -> u32 {
    let Some(t) = v4_tuple(&ctx) else {
        return XDP_PASS;
    };
    let Some(seq) = BENCH_SEQ.get_ptr_mut(0) else {
        return XDP_PASS;
    };
    let n = unsafe {
        *seq = (*seq).wrapping_add(1);
        *seq
    };
    let key = [t[0], n, 0, 0, t[1], 0, 0, 0, t[2], t[3] | (4 << 8)];
    let _ = BENCH_LRU_NEW.insert(&key, &1, 0);
    match swap_macs(&ctx) {
        Some(()) => XDP_TX,
        None => XDP_PASS,
    }
}

/// The same insert into an LRU hash with per-CPU LRU lists (`BPF_F_NO_COMMON_LRU`): one hash
/// table shared by every CPU, but each CPU evicts from and inserts into its own list, so an
/// insert never takes the shared LRU lock. The kernel splits the entries over the possible CPUs.
#[map]
static BENCH_LRU_NEW_PCPU: LruHashMap<[u32; 10], u64> =
    LruHashMap::with_max_entries(1024, BPF_F_NO_COMMON_LRU);

#[xdp]
pub fn bench_lru_insert40_pcpu(ctx: XdpContext) -> u32 {
    let Some(t) = v4_tuple(&ctx) else {
        return XDP_PASS;
    };
    let Some(seq) = BENCH_SEQ.get_ptr_mut(0) else {
        return XDP_PASS;
    };
    let n = unsafe {
        *seq = (*seq).wrapping_add(1);
        *seq
    };
    let key = [t[0], n, 0, 0, t[1], 0, 0, 0, t[2], t[3] | (4 << 8)];
    let _ = BENCH_LRU_NEW_PCPU.insert(&key, &1, 0);
    match swap_macs(&ctx) {
        Some(()) => XDP_TX,
        None => XDP_PASS,
    }
}

/// As many 64-byte slots as the flow cache has at the default connection-table size
/// (131,072: 8 MiB), zeroed.
#[map]
static BENCH_SLOTS: Array<[u64; 8]> = Array::with_max_entries(131_072, 0);

/// The floor of any program that reads per-flow state from a table of the flow cache's size:
/// the frame's IPv4 source hashed to a slot, one word of the slot read, then the baseline's MAC
/// swap. With `bench throughput`'s 100k flows every packet's slot is a random cache line (and
/// page) of 8 MiB, as the flow cache's is.
#[xdp]
pub fn bench_slot_floor(ctx: XdpContext) -> u32 {
    let Ok(src) = ptr_at::<u32>(&ctx, IPV4_SRC) else {
        return XDP_PASS;
    };
    let i = (unsafe { *src }.wrapping_mul(0x9e37_79b1) >> 15) & (131_072 - 1);
    match BENCH_SLOTS.get(i) {
        // Never true (the slots are zero): the read cannot be left out.
        Some(s) if s[0] == 1 => return XDP_DROP,
        Some(_) => {}
        None => return XDP_PASS,
    }
    match swap_macs(&ctx) {
        Some(()) => XDP_TX,
        None => XDP_PASS,
    }
}

/// `bench_dsr_floor`'s backends: entry i holds in bytes 0..4 the VIP (as on the wire; entry 0's
/// is the one matched), 4..10 backend i's MAC, 10..16 the forwarding interface's own MAC.
#[map]
static BENCH_DSR: Array<[u8; 16]> = Array::with_max_entries(4, 0);

/// How many of `BENCH_DSR`'s entries are backends (1-4; 0 forwards nothing).
#[map]
static BENCH_DSR_N: Array<u32> = Array::with_max_entries(1, 0);

/// Offset of the IPv4 destination address in an untagged Ethernet frame.
const IPV4_DST: usize = 14 + 16;
/// Offset of the TCP source port after an IPv4 header without options.
const TCP_SRC: usize = 14 + 20;

/// The floor of any L2 direct-server-return forwarder (`bench e2e`'s `floor` cases): a TCP
/// segment for the VIP of `BENCH_DSR` gets backend i's and the interface's MACs, i = the
/// client's port modulo `BENCH_DSR_N`, and goes back out (XDP_TX): no parsing beyond the
/// EtherType, the IPv4 header's first bytes and the port, no table, no state. Everything else
/// passes to the stack.
#[xdp]
pub fn bench_dsr_floor(ctx: XdpContext) -> u32 {
    let n = match BENCH_DSR_N.get(0) {
        Some(&n) if (1..=4).contains(&n) => n,
        _ => return XDP_PASS,
    };
    let Ok(frame) = ptr_at::<[u8; TCP_SRC + 2]>(&ctx, 0) else {
        return XDP_PASS;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let frame = unsafe { &mut *frame };
    let Some(first) = BENCH_DSR.get(0) else {
        return XDP_PASS;
    };
    // IPv4 without options, TCP, to the VIP.
    if frame[12..14] != [0x08, 0x00]
        || frame[14] != 0x45
        || frame[14 + 9] != 6
        || frame[IPV4_DST..IPV4_DST + 4] != first[..4]
    {
        return XDP_PASS;
    }
    let port = u16::from_be_bytes([frame[TCP_SRC], frame[TCP_SRC + 1]]) as u32;
    let Some(rule) = BENCH_DSR.get(port % n) else {
        return XDP_PASS;
    };
    frame[..12].copy_from_slice(&rule[4..]);
    XDP_TX
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
