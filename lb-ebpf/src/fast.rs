//! The fast path: the most common packet a load balancer sees, decided with one bounds check.
//!
//! A TCP segment, IPv4 with a 20-byte header and not a fragment or IPv6 without extension
//! headers, whose flow is in its home line of the flow cache with a good entry, for a VIP this
//! node forwards for, not from another lbd node, to a backend reached by rewriting the MACs. A SYN too: the full
//! path keeps a good entry for a SYN and forwards it as any segment of its flow (a
//! retransmitted SYN, or a SYN reusing a live 5-tuple). Every check below is one the full path
//! (`try_lb`) makes for such a packet, with the same outcome; a packet that fails any of them,
//! or that the fast path is not sure of, is left to the full path, which parses it again and
//! decides. So the fast path can only ever make a decision the full path would have made:
//! `xdp_property.rs` holds both to the forwarding rule on mutated frames. A segment that changes
//! its entry (the client's FIN or RST on an open entry, a SYN on a closed one) is the full
//! path's too. When it got as far as the flow's home line, it hands the line and what it held
//! to the full path (`flows::Hint`): a new flow, a flow in its buddy line, a local or wrapped
//! backend and a VIP not owned then pay the hash and the home line's read once.
//!
//! Also decided here: an IPv4 frame of at least 54 bytes, or an IPv6 one of at least 74, whose
//! destination fails the VIP address filter (the node's own traffic), passed as the full path
//! passes it.
use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use lb_common::{
    BACKEND_F_ENCAP, BACKEND_F_LOCAL, FAMILY_V4, FAMILY_V6, FlowKey, FlowValue, LbConfig,
    PROTO_TCP, stat,
};

use crate::{
    Outcome,
    flows::{self, Hint},
    maps::LB_BACKEND_STATS,
    maps::NONE,
    maps::count_traffic,
    packet::{closes_connection, ptr_at},
    shared::{count_forwarded_hit, from_peer, key_of, maybe_vip, ports_word, send_to, vip_owned},
};

/// Ethernet, a 20-byte IPv4 header and a 20-byte TCP header.
const HEAD4: usize = 14 + 20 + 20;
/// Ethernet, the 40-byte IPv6 header and a 20-byte TCP header.
const HEAD6: usize = 14 + 40 + 20;

/// What a header reader found: a flow to look up (with its TCP flags), or a frame decided
/// already.
enum Seen {
    Flow(FlowKey, u8),
    Decided(Outcome),
}

/// A decision, or `None` for the full path; `hint` is set when the fast path got as far as the
/// flow's cache slot (an out-parameter: the common, decided case then carries no hint around).
#[inline(always)]
pub fn established(ctx: &XdpContext, cfg: &LbConfig, hint: &mut Option<Hint>) -> Option<Outcome> {
    let p = ptr_at::<[u8; HEAD4]>(ctx, 0).ok()? as *const u8;
    let frame = ctx.data_end() - ctx.data();
    // SAFETY: the ethertype is inside the checked `HEAD4` bytes.
    let seen = match unsafe { (p.add(12) as *const u16).read() } {
        // 0x0800 and 0x86dd, big-endian.
        0x0008 => ipv4(p, frame, cfg)?,
        0xdd86 => ipv6(ptr_at::<[u8; HEAD6]>(ctx, 0).ok()? as *const u8, frame, cfg)?,
        _ => return None,
    };
    let (flow, tcp_flags) = match seen {
        Seen::Decided(o) => return Some(o),
        Seen::Flow(f, t) => (f, t),
    };
    // SAFETY: the source MAC is inside the checked bytes.
    if from_peer(Some(cfg), unsafe { (p.add(6) as *const [u16; 3]).read() }) {
        return None;
    }
    let mut slot = flows::slot(Some(cfg), &flow);
    let cached = flows::cached_only(&mut slot, &flow);
    let decided = cached
        .filter(|v| !changes_entry(v, tcp_flags))
        .and_then(|v| decide(p, frame, &v, &slot));
    if decided.is_none() {
        *hint = Some(Hint::new(&slot, cached));
    }
    decided
}

/// The segment may change its entry, which the full path decides: the client's FIN or RST
/// marks an entry closed, any segment on a closed entry may show the close was forged (its
/// sequence number), and a SYN on a closed entry may open a new connection on the 5-tuple.
/// Closed entries are short-lived (the close's last segments, a port's reuse).
#[inline(always)]
fn changes_entry(v: &FlowValue, tcp_flags: u8) -> bool {
    v.client_closed() || closes_connection(tcp_flags)
}

/// Forward a cached flow's segment if its entry is good, its VIP owned and its backend reached
/// by rewriting the MACs.
#[inline(always)]
fn decide(p: *const u8, frame: usize, v: &FlowValue, slot: &flows::Slot) -> Option<Outcome> {
    let (id, b) = flows::entry_backend(v)?;
    if !vip_owned(b.vip_id) || b.flags & (BACKEND_F_LOCAL | BACKEND_F_ENCAP) != 0 {
        return None;
    }
    count_traffic(&LB_BACKEND_STATS, id, frame as u64, false);
    flows::touch(slot);
    // The Ethernet header is inside the checked bytes.
    let action = send_to(p as *mut u32, b);
    count_forwarded_hit(action);
    Some((action, crate::COUNTED, NONE))
}

/// A little-endian load of the word at `off` of the frame.
///
/// # Safety
/// `off + 4` bytes must be inside the bounds-checked frame at `p`.
#[inline(always)]
unsafe fn word(p: *const u8, off: usize) -> u32 {
    unsafe { (p.add(off) as *const u32).read() }
}

/// The TCP header at `off`, inside a datagram ending at `end`: its ports (`ports_word`) and
/// flags, or `None` for a bad data offset.
///
/// # Safety
/// `off + 20` bytes must be inside the bounds-checked frame at `p`.
#[inline(always)]
unsafe fn tcp(p: *const u8, off: usize, end: usize) -> Option<(u64, u8)> {
    let w3 = unsafe { word(p, off + 12) };
    let doff = ((w3 & 0xff) >> 4) as usize * 4;
    if doff < 20 || off + doff > end {
        return None;
    }
    let ports = unsafe { word(p, off) };
    Some((
        ports_word(
            u16::from_be(ports as u16),
            u16::from_be((ports >> 16) as u16),
        ),
        (w3 >> 8) as u8,
    ))
}

/// IPv4 with a 20-byte header, not a fragment, carrying TCP (`HEAD4` bytes checked at `p`).
#[inline(always)]
fn ipv4(p: *const u8, frame: usize, cfg: &LbConfig) -> Option<Seen> {
    // SAFETY: every load is inside the `HEAD4` checked bytes.
    unsafe {
        let dst = word(p, 30);
        if !maybe_vip(Some(cfg), &[dst, 0, 0, 0]) {
            return Some(Seen::Decided((XDP_PASS, stat::PASS_NOT_VIP, NONE)));
        }
        // Version 4, IHL 5; total length (big-endian) at least the header, at most the frame.
        let w0 = word(p, 14);
        if w0 & 0xff != 0x45 {
            return None;
        }
        let total = u16::from_be((w0 >> 16) as u16) as usize;
        if total < 20 || 14 + total > frame {
            return None;
        }
        // Not a fragment (MF clear, offset zero), protocol TCP.
        if (word(p, 18) >> 16) & 0xff3f != 0 || (word(p, 22) >> 8) & 0xff != PROTO_TCP as u32 {
            return None;
        }
        let (ports, flags) = tcp(p, 34, 14 + total)?;
        let src = [word(p, 26), 0, 0, 0];
        Some(Seen::Flow(
            key_of(&src, &[dst, 0, 0, 0], ports, PROTO_TCP, FAMILY_V4),
            flags,
        ))
    }
}

/// IPv6 whose first next header is TCP (no extension headers; `HEAD6` bytes checked at `p`).
#[inline(always)]
fn ipv6(p: *const u8, frame: usize, cfg: &LbConfig) -> Option<Seen> {
    // SAFETY: every load is inside the `HEAD6` checked bytes.
    unsafe {
        let dst = [word(p, 38), word(p, 42), word(p, 46), word(p, 50)];
        if !maybe_vip(Some(cfg), &dst) {
            return Some(Seen::Decided((XDP_PASS, stat::PASS_NOT_VIP, NONE)));
        }
        // Version 6; a payload length that is not 0 (a jumbogram) and fits in the frame; TCP.
        let w0 = word(p, 14);
        let w1 = word(p, 18);
        let payload = u16::from_be(w1 as u16) as usize;
        if (w0 & 0xf0) != 0x60
            || payload == 0
            || 54 + payload > frame
            || (w1 >> 16) & 0xff != PROTO_TCP as u32
        {
            return None;
        }
        let (ports, flags) = tcp(p, 54, 54 + payload)?;
        let src = [word(p, 22), word(p, 26), word(p, 30), word(p, 34)];
        Some(Seen::Flow(
            key_of(&src, &dst, ports, PROTO_TCP, FAMILY_V6),
            flags,
        ))
    }
}
