//! L3 direct server return: IP-in-IP to backends on other subnets (`BACKEND_F_ENCAP`), the
//! ICMP "too big" a client gets when its packet would not fit the path once wrapped, and the
//! backends' program that unwraps (`lb_decap`).
//!
//! Wrapped: `[Ethernet to the next hop][outer IPv4 or IPv6 from encap_src to the backend][the
//! client's packet, unchanged]`. The outer family is the backend's, the protocol 4 (IPv4
//! inside) or 41 (IPv6 inside). The backend unwraps it, its stack serves the VIP held on `lo`,
//! and it answers the client directly.

use aya_ebpf::{
    bindings::{
        bpf_check_mtu_ret,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    helpers::generated::{
        bpf_check_mtu, bpf_csum_diff, bpf_redirect, bpf_xdp_adjust_head, bpf_xdp_adjust_tail,
    },
    macros::xdp,
    programs::XdpContext,
};
use lb_common::{
    BackendInfo, DecapKey, ENCAP_HLEN_V4, ENCAP_HLEN_V6, FAMILY_V4, FAMILY_V6, IPV6_MIN_MTU,
    PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, decap_stat, stat,
};

use crate::{
    Outcome,
    maps::{LB_DECAP_LOCAL, LB_DECAP_PEERS, LB_DECAP_STATS, LB_DECAP_VIPS, NONE, count},
    packet::{self, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, ParseError, is_ipv6_ext, ptr_at, swap_macs},
};

const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
const TTL: u8 = 64;

/// One's-complement sum of big-endian 16-bit words, folded.
#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

#[inline(always)]
fn sum_words<const N: usize>(bytes: &[u8; N]) -> u32 {
    let mut sum = 0u32;
    let mut i = 0;
    while i + 1 < N {
        sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    sum
}

/// `sum_words` of a message in packet memory, summed by the kernel (`bpf_csum_diff`). For the
/// ICMP answers' 36- and 56-byte messages: summed inline, the compiler loads every byte first
/// and spills them, a frame of hundreds of bytes that counts against the 512-byte stack of the
/// call chain (see docs/kernels.md).
#[inline(always)]
fn sum_packet<const N: usize>(bytes: &[u8; N]) -> u32 {
    const { assert!(N % 4 == 0 && N <= 512) };
    // SAFETY: the helper reads N bytes of packet memory the caller bounds-checked.
    let sum = unsafe {
        bpf_csum_diff(
            core::ptr::null_mut(),
            0,
            bytes.as_ptr() as *mut u32,
            N as u32,
            0,
        )
    };
    // The helper sums 16-bit words in memory order; folded and read as big-endian, that is the
    // sum of the big-endian words (RFC 1071 2.(B), byte order independence).
    u32::from(u16::from_be(fold(sum as u32)))
}

/// The outer header's length for this backend's address family.
#[inline(always)]
fn outer_hlen(b: &BackendInfo) -> u32 {
    if b.family == FAMILY_V4 {
        ENCAP_HLEN_V4
    } else {
        ENCAP_HLEN_V6
    }
}

/// A packet for a routed backend: wrapped and sent to the next hop, or, too big to wrap,
/// answered with an ICMP error if `may_answer` (not itself an ICMP error), else dropped. Each
/// is a subprogram called from here, so no call chain is three frames deep (the 512-byte stack
/// limit counts the frames of a chain together).
#[inline(always)]
pub fn encapsulate(ctx: &XdpContext, b: &BackendInfo, may_answer: bool, dry: bool) -> Outcome {
    let Some((inner_family, len)) = inner_at(ctx, ETH_HLEN) else {
        return (XDP_PASS, stat::PASS_MALFORMED, NONE);
    };
    let outer_hlen = outer_hlen(b);
    if b.encap_mtu != 0
        && len + outer_hlen > u32::from(b.encap_mtu)
        && !gro_merged(ctx, inner_family)
    {
        if !may_answer {
            return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
        }
        let mtu = u32::from(b.encap_mtu) - outer_hlen;
        return if inner_family == FAMILY_V4 {
            too_big4(ctx, mtu)
        } else if mtu < IPV6_MIN_MTU {
            // No IPv6 client lowers its path MTU below 1280 (RFC 8201): any answer would be
            // a wrong one, and its packets would still not fit. Dropped; user space gives such
            // a pair no new IPv6 flows (lb-userspace `plan`).
            (XDP_DROP, stat::ENCAP_TOO_BIG, NONE)
        } else {
            too_big6(ctx, mtu)
        };
    }
    let wrapped = wrap(ctx, b, inner_family, len);
    // (Not for `lbctl explain`'s dry run, which writes no counter.)
    if wrapped.1 == stat::FORWARDED && !dry {
        count([stat::ENCAPSULATED, NONE, NONE]);
    }
    wrapped
}

/// Whether the frame is TCP segments that GRO merged: longer than the receiving device's MTU
/// lets a frame be (`bpf_check_mtu` on the device the frame came in on), which only a merge
/// is. Generic (skb) mode sees frames after GRO, e.g. on an OVS bridge such as br-ex; driver
/// mode never does. The merge's segments each came in within that MTU, so a "fragmentation
/// needed" quoting the merge's length would be false (and repeated for every merge, stalling
/// the connection): it is wrapped and forwarded whole, its segments left to the kernel.
#[inline(always)]
fn gro_merged(ctx: &XdpContext, inner_family: u8) -> bool {
    // The transport protocol: IPv4's protocol field, IPv6's next header (GRO merges TCP with
    // no extension headers).
    let proto = if inner_family == FAMILY_V4 {
        ptr_at::<[u8; 10]>(ctx, ETH_HLEN).map(|h| unsafe { (*h)[9] })
    } else {
        ptr_at::<[u8; 7]>(ctx, ETH_HLEN).map(|h| unsafe { (*h)[6] })
    };
    if !matches!(proto, Ok(PROTO_TCP)) {
        return false;
    }
    let mut mtu: u32 = 0;
    // SAFETY: the helper reads the frame's length and its device from the context and writes
    // the device's MTU to `mtu`.
    let r = unsafe { bpf_check_mtu(ctx.ctx as *mut _, 0, &mut mtu, 0, 0) };
    r == i64::from(bpf_check_mtu_ret::BPF_MTU_CHK_RET_FRAG_NEEDED)
}

/// Wrap the frame for a routed backend and send it to the next hop. `inner_family` and `len`:
/// the client's packet as `inner_at` read it.
#[inline(never)]
fn wrap(ctx: &XdpContext, b: &BackendInfo, inner_family: u8, len: u32) -> Outcome {
    let outer_hlen = outer_hlen(b);
    // The inner header's traffic class, copied to the outer one (DSCP and ECN, RFC 6040's
    // normal mode).
    let tclass = match (inner_family, ptr_at::<[u8; 2]>(ctx, ETH_HLEN)) {
        (FAMILY_V4, Ok(h)) => unsafe { (*h)[1] },
        (_, Ok(h)) => unsafe { ((*h)[0] << 4) | ((*h)[1] >> 4) },
        _ => 0,
    };
    let proto = if inner_family == FAMILY_V4 {
        IPPROTO_IPIP
    } else {
        IPPROTO_IPV6
    };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(outer_hlen as i32)) } != 0 {
        return (XDP_DROP, stat::DROP_ENCAP, NONE);
    }
    let eth_type = if b.family == FAMILY_V4 {
        ETH_P_IP
    } else {
        ETH_P_IPV6
    };
    let Ok(eth) = ptr_at::<[u8; ETH_HLEN]>(ctx, 0) else {
        return (XDP_DROP, stat::DROP_ENCAP, NONE);
    };
    unsafe {
        let eth = &mut *eth;
        eth[0..6].copy_from_slice(&b.dst_mac);
        eth[6..12].copy_from_slice(&b.src_mac);
        eth[12..14].copy_from_slice(&eth_type.to_be_bytes());
    }
    // The outer header is written in place (the stack is shared with the caller's frames).
    if b.family == FAMILY_V4 {
        let Ok(ip) = ptr_at::<[u8; 20]>(ctx, ETH_HLEN) else {
            return (XDP_DROP, stat::DROP_ENCAP, NONE);
        };
        let h = unsafe { &mut *ip };
        *h = [0; 20];
        h[0] = 0x45;
        h[1] = tclass;
        h[2..4].copy_from_slice(&((len + ENCAP_HLEN_V4) as u16).to_be_bytes());
        // Don't fragment: the path MTU is what `encap_mtu` says.
        h[6] = 0x40;
        h[8] = TTL;
        h[9] = proto;
        h[12..16].copy_from_slice(&b.encap_src[0..4]);
        h[16..20].copy_from_slice(&b.addr[0..4]);
        let c = !fold(sum_words(h));
        h[10..12].copy_from_slice(&c.to_be_bytes());
    } else {
        let Ok(ip) = ptr_at::<[u8; 40]>(ctx, ETH_HLEN) else {
            return (XDP_DROP, stat::DROP_ENCAP, NONE);
        };
        let h = unsafe { &mut *ip };
        h[0] = 0x60 | (tclass >> 4);
        h[1] = tclass << 4;
        h[2] = 0;
        h[3] = 0;
        h[4..6].copy_from_slice(&(len as u16).to_be_bytes());
        h[6] = proto;
        h[7] = TTL;
        h[8..24].copy_from_slice(&b.encap_src);
        h[24..40].copy_from_slice(&b.addr);
    }

    let action = if b.ifindex == 0 {
        XDP_TX
    } else {
        unsafe { bpf_redirect(b.ifindex, 0) as u32 }
    };
    (action, stat::FORWARDED, NONE)
}

// Too big to wrap: the client's packet becomes an ICMP "fragmentation needed" (IPv4) or "packet
// too big" (IPv6) from the VIP quoting it, reporting `mtu`, sent back where it came from. The
// quote is the client's IP header (no options) and 8 bytes: enough for its stack to find the
// connection. An IPv4 packet with options is dropped and counted. Built in place, a word at a
// time (the BPF stack is shared with the caller's frames).

/// Copy `WORDS` 4-byte words from `from` to `to` (not overlapping), packet to packet.
#[inline(always)]
fn move_words<const WORDS: usize>(ctx: &XdpContext, from: usize, to: usize) -> Option<()> {
    // One bounds check per side (a check per word kept a dozen pointers live: spills, and a
    // frame that counted against the 512-byte stack of the call chain).
    let s = ptr_at::<[u32; WORDS]>(ctx, from).ok()? as *const u32;
    let d = ptr_at::<[u32; WORDS]>(ctx, to).ok()? as *mut u32;
    for i in 0..WORDS {
        unsafe { d.add(i).write(s.add(i).read()) };
    }
    Some(())
}

#[inline(never)]
fn too_big4(ctx: &XdpContext, mtu: u32) -> Outcome {
    const QUOTE: usize = 28;
    const ICMP: usize = ETH_HLEN + 20;
    const OUT: usize = ICMP + 8 + QUOTE;
    let frame = ctx.data_end() - ctx.data();
    let (Ok(head), true) = (ptr_at::<[u8; OUT]>(ctx, 0), frame >= OUT) else {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    };
    if unsafe { (*head)[ETH_HLEN] } != 0x45 {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    }
    const Q: usize = ICMP + 8;
    if move_words::<{ QUOTE / 4 }>(ctx, ETH_HLEN, Q).is_none() || swap_macs(ctx).is_none() {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    }
    let head = unsafe { &mut *head };
    // From the VIP (the quoted destination) to the client (the quoted source).
    let mut addrs = [0u8; 8];
    addrs[0..4].copy_from_slice(&head[Q + 16..Q + 20]);
    addrs[4..8].copy_from_slice(&head[Q + 12..Q + 16]);
    let ip = &mut head[ETH_HLEN..ICMP];
    ip.fill(0);
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + QUOTE) as u16).to_be_bytes());
    ip[8] = TTL;
    ip[9] = IPPROTO_ICMP;
    ip[12..20].copy_from_slice(&addrs);
    let icmp = &mut head[ICMP..Q];
    icmp.fill(0);
    icmp[0] = 3; // destination unreachable
    icmp[1] = 4; // fragmentation needed and DF set
    icmp[6..8].copy_from_slice(&(mtu as u16).to_be_bytes());
    let (Ok(iph), Ok(icmph)) = (
        ptr_at::<[u8; 20]>(ctx, ETH_HLEN),
        ptr_at::<[u8; 8 + QUOTE]>(ctx, ICMP),
    ) else {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    };
    let (iph, icmph) = unsafe { (&mut *iph, &mut *icmph) };
    let c = !fold(sum_packet(iph));
    iph[10..12].copy_from_slice(&c.to_be_bytes());
    let c = !fold(sum_packet(icmph));
    icmph[2..4].copy_from_slice(&c.to_be_bytes());
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, OUT as i32 - frame as i32) } != 0 {
        return (XDP_DROP, stat::DROP_ENCAP, NONE);
    }
    (XDP_TX, stat::ENCAP_TOO_BIG, NONE)
}

#[inline(never)]
fn too_big6(ctx: &XdpContext, mtu: u32) -> Outcome {
    const QUOTE: usize = 48;
    const ICMP: usize = ETH_HLEN + 40;
    const Q: usize = ICMP + 8;
    const OUT: usize = Q + QUOTE;
    let frame = ctx.data_end() - ctx.data();
    let (Ok(head), true) = (ptr_at::<[u8; OUT]>(ctx, 0), frame >= OUT) else {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    };
    if move_words::<{ QUOTE / 4 }>(ctx, ETH_HLEN, Q).is_none() || swap_macs(ctx).is_none() {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    }
    // From the VIP (the quoted destination) to the client (the quoted source).
    if move_words::<4>(ctx, Q + 24, ETH_HLEN + 8).is_none()
        || move_words::<4>(ctx, Q + 8, ETH_HLEN + 24).is_none()
    {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    }
    let head = unsafe { &mut *head };
    let ip = &mut head[ETH_HLEN..ICMP];
    ip[0] = 0x60;
    ip[1] = 0;
    ip[2] = 0;
    ip[3] = 0;
    ip[4..6].copy_from_slice(&((8 + QUOTE) as u16).to_be_bytes());
    ip[6] = IPPROTO_ICMPV6;
    ip[7] = 255;
    let icmp = &mut head[ICMP..Q];
    icmp.fill(0);
    icmp[0] = 2; // packet too big
    icmp[4..8].copy_from_slice(&mtu.to_be_bytes());
    let (Ok(addrs), Ok(icmph)) = (
        ptr_at::<[u8; 32]>(ctx, ETH_HLEN + 8),
        ptr_at::<[u8; 8 + QUOTE]>(ctx, ICMP),
    ) else {
        return (XDP_DROP, stat::ENCAP_TOO_BIG, NONE);
    };
    let (addrs, icmph) = unsafe { (&*addrs, &mut *icmph) };
    // The pseudo-header: source, destination, upper-layer length, next header.
    let sum =
        sum_packet(addrs) + (8 + QUOTE) as u32 + u32::from(IPPROTO_ICMPV6) + sum_packet(icmph);
    let c = !fold(sum);
    icmph[2..4].copy_from_slice(&c.to_be_bytes());
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, OUT as i32 - frame as i32) } != 0 {
        return (XDP_DROP, stat::DROP_ENCAP, NONE);
    }
    (XDP_TX, stat::ENCAP_TOO_BIG, NONE)
}

#[inline(always)]
fn decap_count(i: u32) {
    if let Some(c) = LB_DECAP_STATS.get_ptr_mut(0) {
        if let Some(v) = unsafe { (*c).get_mut(i as usize) } {
            *v += 1;
        }
    }
}

/// The backends' program: unwrap IP-in-IP from a known LB node (`LB_DECAP_PEERS`) to this host
/// (`LB_DECAP_LOCAL`) whose inner packet is for a VIP served here (`LB_DECAP_VIPS`), and pass the
/// client's packet to the stack. An LB node's packet that fails a check is dropped; IP-in-IP
/// from anyone else, and everything that is not IP-in-IP, passes unchanged (see `decap_stat`).
#[xdp]
pub fn lb_decap(ctx: XdpContext) -> u32 {
    let r = try_decap(&ctx);
    decap_count(r);
    match r {
        decap_stat::DECAPSULATED | decap_stat::NOT_FROM_PEER | decap_stat::PASSED => XDP_PASS,
        _ => XDP_DROP,
    }
}

/// An address read from a header, as a `DecapKey`.
#[inline(always)]
fn decap_key<const N: usize>(family: u8, addr: &[u8; N]) -> DecapKey {
    let mut key = DecapKey {
        family,
        ..Default::default()
    };
    key.addr[0..N].copy_from_slice(addr);
    key
}

#[inline(always)]
fn try_decap(ctx: &XdpContext) -> u32 {
    let Ok(t) = ptr_at::<[u8; 2]>(ctx, 12) else {
        return decap_stat::PASSED;
    };
    let ethertype = u16::from_be_bytes(unsafe { *t });
    // From a known LB node: the outer header's length, the inner protocol, the outer
    // destination, the inner length it claims, and the outer ECN field.
    let (hlen, proto, dst, claimed, ecn) = match ethertype {
        ETH_P_IP => {
            let Ok(h) = ptr_at::<[u8; 20]>(ctx, ETH_HLEN) else {
                return decap_stat::PASSED;
            };
            let h = unsafe { *h };
            if h[9] != IPPROTO_IPIP && h[9] != IPPROTO_IPV6 {
                return decap_stat::PASSED;
            }
            let src = decap_key::<4>(FAMILY_V4, &[h[12], h[13], h[14], h[15]]);
            let dst = decap_key::<4>(FAMILY_V4, &[h[16], h[17], h[18], h[19]]);
            if LB_DECAP_PEERS.get_ptr(&src).is_none() {
                return decap_stat::NOT_FROM_PEER;
            }
            // No options, not a fragment (MF or an offset).
            if h[0] != 0x45 || (h[6] & 0x3f) != 0 || h[7] != 0 {
                return decap_stat::MALFORMED;
            }
            let total = u32::from(u16::from_be_bytes([h[2], h[3]]));
            (20usize, h[9], dst, total.wrapping_sub(20), h[1] & 3)
        }
        ETH_P_IPV6 => {
            let Ok(h) = ptr_at::<[u8; 40]>(ctx, ETH_HLEN) else {
                return decap_stat::PASSED;
            };
            let h = unsafe { &*h };
            // An LB node wraps behind a bare header. Behind extension headers, IP-in-IP (or a
            // chain that cannot be walked to its end, which may hide it) is not checked like
            // that: an LB node's is dropped below, anyone else's passed as IP-in-IP is.
            let bare = h[6] == IPPROTO_IPIP || h[6] == IPPROTO_IPV6;
            if !bare {
                if !is_ipv6_ext(h[6]) {
                    return decap_stat::PASSED;
                }
                if let Ok(l3) = packet::ipv6(ctx, ETH_HLEN, |_| true)
                    && l3.proto != IPPROTO_IPIP
                    && l3.proto != IPPROTO_IPV6
                {
                    return decap_stat::PASSED;
                }
            }
            let mut src = DecapKey {
                family: FAMILY_V6,
                ..Default::default()
            };
            src.addr.copy_from_slice(&h[8..24]);
            if LB_DECAP_PEERS.get_ptr(&src).is_none() {
                return decap_stat::NOT_FROM_PEER;
            }
            if !bare {
                return decap_stat::MALFORMED;
            }
            let mut dst = src;
            dst.addr.copy_from_slice(&h[24..40]);
            (
                40usize,
                h[6],
                dst,
                u32::from(u16::from_be_bytes([h[4], h[5]])),
                (h[1] >> 4) & 3,
            )
        }
        _ => return decap_stat::PASSED,
    };
    if LB_DECAP_LOCAL.get_ptr(&dst).is_none() {
        return decap_stat::NOT_LOCAL;
    }
    // The inner header must be what the outer one says, and fit in the frame.
    let inner = ETH_HLEN + hlen;
    let Some((family, len)) = inner_at(ctx, inner) else {
        return decap_stat::MALFORMED;
    };
    let frame = (ctx.data_end() - ctx.data()) as u32;
    let want_family = if proto == IPPROTO_IPIP {
        FAMILY_V4
    } else {
        FAMILY_V6
    };
    if family != want_family || len != claimed || inner as u32 + len > frame {
        return decap_stat::MALFORMED;
    }
    let r = if family == FAMILY_V4 {
        inner4(ctx, inner, ecn)
    } else {
        inner6(ctx, inner, ecn)
    };
    if r != decap_stat::DECAPSULATED {
        return r;
    }
    // Move the Ethernet header up against the inner packet, with the inner ethertype, then
    // drop the outer header.
    let Ok(eth) = ptr_at::<[u8; ETH_HLEN]>(ctx, 0) else {
        return decap_stat::MALFORMED;
    };
    let mut e = unsafe { *eth };
    let inner_type = if family == FAMILY_V4 {
        ETH_P_IP
    } else {
        ETH_P_IPV6
    };
    e[12..14].copy_from_slice(&inner_type.to_be_bytes());
    let Ok(dst) = ptr_at::<[u8; ETH_HLEN]>(ctx, hlen) else {
        return decap_stat::MALFORMED;
    };
    unsafe { *dst = e };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, hlen as i32) } != 0 {
        return decap_stat::MALFORMED;
    }
    decap_stat::DECAPSULATED
}

/// ECN codepoints (the two low bits of the TOS byte / traffic class).
const ECN_NOT_ECT: u8 = 0;
const ECN_ECT1: u8 = 1;
const ECN_ECT0: u8 = 2;
const ECN_CE: u8 = 3;

/// The inner packet's ECN field after unwrapping (RFC 6040 4.2, figure 4): a CE mark on the
/// outer header is carried to an ECN-capable inner packet, ECT(1) outside turns ECT(0) inside
/// into ECT(1); `None` when the outer CE meets a Not-ECT inner packet (drop).
#[inline(always)]
fn decap_ecn(outer: u8, inner: u8) -> Option<u8> {
    match (outer, inner) {
        (ECN_CE, ECN_NOT_ECT) => None,
        (ECN_CE, _) => Some(ECN_CE),
        (ECN_ECT1, ECN_ECT0) => Some(ECN_ECT1),
        _ => Some(inner),
    }
}

/// An IPv4 inner packet at `off`: for a VIP served here, its ECN field updated from the outer
/// one's (`decap_ecn`) with the header checksum adjusted to match.
#[inline(always)]
fn inner4(ctx: &XdpContext, off: usize, outer_ecn: u8) -> u32 {
    let Ok(h) = ptr_at::<[u8; 20]>(ctx, off) else {
        return decap_stat::MALFORMED;
    };
    let h = unsafe { &mut *h };
    if LB_DECAP_VIPS
        .get_ptr(&decap_key::<4>(FAMILY_V4, &[h[16], h[17], h[18], h[19]]))
        .is_none()
    {
        return decap_stat::NOT_VIP;
    }
    // What lb_xdp forwards: TCP, UDP or ICMP, never a fragment (MF or an offset).
    if !matches!(h[9], PROTO_TCP | PROTO_UDP | PROTO_ICMP) || (h[6] & 0x3f) != 0 || h[7] != 0 {
        return decap_stat::INNER_PROTO;
    }
    let old = h[1];
    let Some(ecn) = decap_ecn(outer_ecn, old & 3) else {
        return decap_stat::ECN_DROP;
    };
    let new = (old & !3) | ecn;
    if new != old {
        // RFC 1624: HC' = ~(~HC + ~m + m'), m the 16-bit word holding the TOS byte.
        let m = u16::from_be_bytes([h[0], old]);
        let m2 = u16::from_be_bytes([h[0], new]);
        let hc = u16::from_be_bytes([h[10], h[11]]);
        let sum = u32::from(!hc) + u32::from(!m) + u32::from(m2);
        h[1] = new;
        h[10..12].copy_from_slice(&(!fold(sum)).to_be_bytes());
    }
    decap_stat::DECAPSULATED
}

/// An IPv6 inner packet at `off`: for a VIP served here, its ECN field updated (no header
/// checksum in IPv6; the transport checksums do not cover the traffic class).
#[inline(always)]
fn inner6(ctx: &XdpContext, off: usize, outer_ecn: u8) -> u32 {
    let Ok(h) = ptr_at::<[u8; 40]>(ctx, off) else {
        return decap_stat::MALFORMED;
    };
    let h = unsafe { &mut *h };
    let mut key = DecapKey {
        family: FAMILY_V6,
        ..Default::default()
    };
    key.addr.copy_from_slice(&h[24..40]);
    if LB_DECAP_VIPS.get_ptr(&key).is_none() {
        return decap_stat::NOT_VIP;
    }
    // What lb_xdp forwards: TCP, UDP or ICMPv6 after at most `MAX_IPV6_EXT_HEADERS` extension
    // headers, never a fragment.
    match packet::ipv6(ctx, off, |_| true) {
        Ok(l3) if !l3.fragment && matches!(l3.proto, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) => {}
        Ok(_) | Err(ParseError::ExtLimit) => return decap_stat::INNER_PROTO,
        Err(_) => return decap_stat::MALFORMED,
    }
    // (Read again: the walk's bounds checks are not this pointer's.)
    let Ok(h) = ptr_at::<[u8; 40]>(ctx, off) else {
        return decap_stat::MALFORMED;
    };
    let h = unsafe { &mut *h };
    let old = (h[1] >> 4) & 3;
    let Some(ecn) = decap_ecn(outer_ecn, old) else {
        return decap_stat::ECN_DROP;
    };
    h[1] = (h[1] & !0x30) | (ecn << 4);
    decap_stat::DECAPSULATED
}

/// The family and total length of the IP packet at `off`, from its own header.
#[inline(always)]
fn inner_at(ctx: &XdpContext, off: usize) -> Option<(u8, u32)> {
    let h = unsafe { *ptr_at::<[u8; 6]>(ctx, off).ok()? };
    match h[0] >> 4 {
        4 => Some((FAMILY_V4, u32::from(u16::from_be_bytes([h[2], h[3]])))),
        6 => Some((FAMILY_V6, 40 + u32::from(u16::from_be_bytes([h[4], h[5]])))),
        _ => None,
    }
}
