//! The fast path: the most common packet a load balancer sees, decided with one bounds check.
//!
//! An IPv4 TCP segment with a 20-byte IP header, not a fragment, not a SYN, whose flow is in
//! the flow cache with a good entry, for a VIP this node forwards for, not from another lbd
//! node, to a backend reached by rewriting the MACs. Every check below is one the full path
//! (`try_lb`) makes for such a packet, with the same outcome; a packet that fails any of them,
//! or that the fast path is not sure of, is left to the full path, which parses it again and
//! decides (`None`). So the fast path can only ever make a decision the full path would have
//! made: `xdp_property.rs` holds both to the forwarding rule on mutated frames.
//!
//! Also decided here: an IPv4 frame of at least 54 bytes whose destination fails the VIP
//! address filter (the node's own traffic), passed as the full path passes it.
use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_TX},
    helpers::generated::bpf_redirect,
    programs::XdpContext,
};
use lb_common::{BACKEND_F_ENCAP, BACKEND_F_LOCAL, FAMILY_V4, FlowKey, LbConfig, PROTO_TCP, stat};

use crate::{
    Outcome, count_forwarded_hit, flows, from_peer, maps::LB_BACKEND_STATS, maps::NONE,
    maps::count_traffic, maybe_vip, packet::ptr_at, vip_owned,
};

/// Ethernet, a 20-byte IPv4 header and a 20-byte TCP header.
const HEAD: usize = 14 + 20 + 20;

#[inline(always)]
pub fn ipv4_tcp(ctx: &XdpContext, cfg: &LbConfig) -> Option<Outcome> {
    let p = ptr_at::<[u8; HEAD]>(ctx, 0).ok()? as *const u8;
    let frame = ctx.data_end() - ctx.data();
    // SAFETY: `HEAD` bytes are in the frame (checked above) and every load is inside them;
    // word and half-word loads at any offset are allowed on packets (see `packet::ptr_at`).
    unsafe {
        let word = |off: usize| (p.add(off) as *const u32).read();
        // The ethertype, big-endian 0x0800.
        if (p.add(12) as *const u16).read() != 0x0008 {
            return None;
        }
        let dst = word(30);
        if !maybe_vip(Some(cfg), &[dst, 0, 0, 0]) {
            return Some((XDP_PASS, stat::PASS_NOT_VIP, NONE));
        }
        // Version 4, IHL 5; total length (big-endian) at least the header, at most the frame.
        let w0 = word(14);
        if w0 & 0xff != 0x45 {
            return None;
        }
        let total = u16::from_be((w0 >> 16) as u16) as usize;
        if total < 20 || 14 + total > frame {
            return None;
        }
        // Not a fragment (MF clear, offset zero), protocol TCP.
        let w1 = word(18);
        let w2 = word(22);
        if (w1 >> 16) & 0xff3f != 0 || (w2 >> 8) & 0xff != PROTO_TCP as u32 {
            return None;
        }
        // TCP: data offset at least 5 words, the header inside the datagram; not a SYN
        // without ACK (a connection attempt takes the full path).
        let w3 = word(46);
        let doff = ((w3 & 0xff) >> 4) as usize * 4;
        let flags = (w3 >> 8) & 0xff;
        if doff < 20 || 34 + doff > 14 + total || flags & 0x12 == 0x02 {
            return None;
        }
        if from_peer(Some(cfg), (p.add(6) as *const [u16; 3]).read()) {
            return None;
        }
        let ports = word(34);
        let sport = u16::from_be(ports as u16) as u64;
        let dport = u16::from_be((ports >> 16) as u16) as u64;
        let words: [u64; 5] = [
            word(26) as u64,
            0,
            dst as u64,
            0,
            sport | dport << 16 | (PROTO_TCP as u64) << 32 | (FAMILY_V4 as u64) << 40,
        ];
        // SAFETY: see `flow_key` in main.rs: the same layout.
        let flow: FlowKey = core::mem::transmute(words);
        let slot = flows::slot(Some(cfg), &flow);
        let v = flows::cached_only(&slot, &flow)?;
        let b = flows::entry_backend(&v)?;
        if !vip_owned(b.vip_id) || b.flags & (BACKEND_F_LOCAL | BACKEND_F_ENCAP) != 0 {
            return None;
        }
        count_traffic(&LB_BACKEND_STATS, v.backend_id, frame as u64, false);
        // The MACs, as `forward` writes them.
        let src = b.dst_mac.as_ptr() as *const u32;
        let (a, m, c) = (src.read(), src.add(1).read(), src.add(2).read());
        let eth = p as *mut u32;
        eth.write(a);
        eth.add(1).write(m);
        eth.add(2).write(c);
        let action = if b.ifindex == 0 {
            XDP_TX
        } else {
            bpf_redirect(b.ifindex, 0) as u32
        };
        count_forwarded_hit(action);
        Some((action, crate::COUNTED, NONE))
    }
}
