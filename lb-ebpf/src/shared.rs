//! Steps both paths take, the full one (main.rs) and the fast one (fast.rs): the VIP address
//! and peer filters, a VIP's ownership, flow keys, the MAC rewrite and send, and the counters of
//! a forwarded packet of an established flow. Kept here so main.rs reads as the pipeline only.
use aya_ebpf::{bindings::xdp_action::XDP_TX, helpers::generated::bpf_redirect};
use lb_common::{
    BackendInfo, FlowKey, LbConfig, VIP_OWNED, addr_filter_bit_words, mac_halves_filter_bit,
    peer_key_halves, stat,
};

use crate::maps::{LB_PEERS, LB_STATS, LB_VIP_OWNED};

#[inline(always)]
pub(crate) fn maybe_vip(cfg: Option<&LbConfig>, addr: &[u32; 4]) -> bool {
    let Some(cfg) = cfg else {
        return true;
    };
    let bit = addr_filter_bit_words(addr);
    match cfg.addr_filter.get((bit >> 6) as usize) {
        Some(w) => w & (1u64 << (bit & 63)) != 0,
        None => true,
    }
}

#[inline(always)]
pub(crate) fn from_peer(cfg: Option<&LbConfig>, mac: [u16; 3]) -> bool {
    let Some(cfg) = cfg else {
        return false;
    };
    let bit = mac_halves_filter_bit(mac);
    let maybe = match cfg.peer_filter.get((bit >> 6) as usize) {
        Some(w) => w & (1u64 << (bit & 63)) != 0,
        None => true,
    };
    maybe && LB_PEERS.get_ptr(&peer_key_halves(mac)).is_some()
}

#[inline(always)]
pub(crate) fn vip_owned(vip_id: u32) -> bool {
    LB_VIP_OWNED
        .get(vip_id)
        .map(|o| o & VIP_OWNED != 0)
        .unwrap_or(false)
}

/// A flow key's ports as its last word holds them (`key_of`).
#[inline(always)]
pub(crate) fn ports_word(sport: u16, dport: u16) -> u64 {
    sport as u64 | (dport as u64) << 16
}

/// A flow key built with five word stores (an IPv4 key's address words 1 and 3 are constant
/// zeros), instead of field by field with byte stores for the protocol, family and padding.
#[inline(always)]
pub(crate) fn key_of(src: &[u32; 4], dst: &[u32; 4], ports: u64, proto: u8, family: u8) -> FlowKey {
    let pair = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
    let words: [u64; 5] = [
        pair(src[0], src[1]),
        pair(src[2], src[3]),
        pair(dst[0], dst[1]),
        pair(dst[2], dst[3]),
        ports | (proto as u64) << 32 | (family as u64) << 40,
    ];
    // SAFETY: FlowKey is `#[repr(C, align(8))]`, 40 bytes: the addresses' bytes as the words
    // hold them in memory, then sport, dport, proto, family and two zero bytes (little-endian).
    unsafe { core::mem::transmute(words) }
}

// `send_to` copies the two MACs as one 12-byte block at a 4-aligned offset.
const _: () = assert!(
    core::mem::offset_of!(BackendInfo, src_mac) == core::mem::offset_of!(BackendInfo, dst_mac) + 6
        && core::mem::offset_of!(BackendInfo, dst_mac) % 4 == 0
);

/// Write the backend's MACs over the Ethernet header at `eth` (12 bytes the caller checked are
/// in the frame) and send the frame: XDP_TX, or a redirect to the backend's interface.
#[inline(always)]
pub(crate) fn send_to(eth: *mut u32, backend: &BackendInfo) -> u32 {
    // `dst_mac` then `src_mac` are the 12 bytes at offset 16 of the (4-aligned) map value, in
    // the order of the Ethernet header: three word copies instead of twelve byte copies.
    unsafe {
        let src = backend.dst_mac.as_ptr() as *const u32;
        let (a, b, c) = (src.read(), src.add(1).read(), src.add(2).read());
        eth.write(a);
        eth.add(1).write(b);
        eth.add(2).write(c);
    }
    if backend.ifindex == 0 {
        XDP_TX
    } else {
        unsafe { bpf_redirect(backend.ifindex, 0) as u32 }
    }
}

/// The counters of an established flow's forwarded packet, at constant indexes (the generic
/// `count` checks each index against the array and `NONE`).
#[inline(always)]
pub(crate) fn count_forwarded_hit(action: u32) {
    if let Some(c) = LB_STATS.get_ptr_mut(0) {
        // Per-CPU value: no other writer.
        let c = unsafe { &mut *c };
        let verdict = if action == XDP_TX {
            stat::VERDICT_TX
        } else {
            stat::VERDICT_REDIRECT
        };
        c[verdict as usize] += 1;
        c[stat::FORWARDED as usize] += 1;
        c[stat::CONNTRACK_HIT as usize] += 1;
    }
}
