//! Header parsing. `ptr_at` is the only place raw packet pointers are made; every field is read
//! as raw bytes or integers at a bounds-checked offset.

use aya_ebpf::programs::XdpContext;
use lb_common::{
    FAMILY_V4, FAMILY_V6, MAX_IPV6_EXT_HEADERS, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
const IPV6_HLEN: usize = 40;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;

/// Why a frame could not be parsed far enough to be judged.
#[derive(Clone, Copy)]
pub enum ParseError {
    /// Too short for a header it announces, or a header field is impossible.
    Malformed,
    /// More IPv6 extension headers than `MAX_IPV6_EXT_HEADERS`.
    ExtLimit,
    /// The caller's destination filter declined the packet (checked straight after the fixed
    /// header is read, before any other parsing: most traffic on a node is not for a VIP).
    NotWanted,
}

/// Largest offset we ever read at; keeps the verifier's range tracking simple.
const MAX_OFFSET: usize = 512;

/// A bounds-checked pointer to a `T` at `offset` of the frame. Headers after the 14-byte Ethernet
/// header are only 2-byte aligned, and word reads through these pointers are deliberate: BPF has
/// one load instruction whatever the alignment, the kernel accepts misaligned packet loads on
/// the architectures lb supports (x86_64, arm64: CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS), and it
/// is what the kernel's own XDP programs do with `struct iphdr *`. `read_unaligned` would make
/// LLVM split every load into bytes.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, ParseError> {
    let start = ctx.data();
    let end = ctx.data_end();
    if offset > MAX_OFFSET || start + offset + core::mem::size_of::<T>() > end {
        return Err(ParseError::Malformed);
    }
    Ok((start + offset) as *mut T)
}

/// Two bytes at a (possibly variable) offset. There is deliberately no one-byte reader: LLVM turns
/// `p + 1 > end` into `p >= end`, which the verifier cannot use to prove a read at `p`.
#[inline(always)]
pub fn pair_at(ctx: &XdpContext, offset: usize) -> Result<[u8; 2], ParseError> {
    Ok(unsafe { *ptr_at::<[u8; 2]>(ctx, offset)? })
}

/// The Ethernet header's ethertype.
#[inline(always)]
pub fn ethertype(ctx: &XdpContext) -> Result<u16, ParseError> {
    // One half-word load (the frame's bytes in order), then to host order.
    let t = unsafe { *ptr_at::<u16>(ctx, 12)? };
    Ok(u16::from_be(t))
}

/// The Ethernet header's source MAC (read only for VIP packets: the loop guard).
#[inline(always)]
/// As three native-endian half-words in memory order (see `lb_common::mac_halves_filter_bit`).
pub fn source_mac(ctx: &XdpContext) -> Result<[u16; 3], ParseError> {
    Ok(unsafe { *ptr_at::<[u16; 3]>(ctx, 6)? })
}

/// Swap the Ethernet addresses in place (a frame sent back where it came from).
#[inline(always)]
pub fn swap_macs(ctx: &XdpContext) -> Option<()> {
    let e = ptr_at::<[u16; 6]>(ctx, 0).ok()?;
    let e = unsafe { &mut *e };
    for i in 0..3 {
        e.swap(i, i + 3);
    }
    Some(())
}

/// The layer-3 facts the pipeline needs.
#[derive(Clone, Copy)]
pub struct L3 {
    pub family: u8,
    pub proto: u8,
    /// Addresses as four native-endian words holding the header's bytes in order (IPv4: the
    /// first word, the rest zero), so they are read, compared and hashed a word at a time.
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Offset of the transport header.
    pub l4_off: usize,
    /// Offset just past the datagram, by its own length field (IPv4 total length, IPv6 payload
    /// length): bytes after it (Ethernet padding, trailing garbage) are never payload.
    pub end: usize,
    /// Part of a fragmented datagram (first or later fragment).
    pub fragment: bool,
}

/// The fixed 20 bytes of an IPv4 header, read through one bounds check, and the check that the
/// whole header (options included) is in the frame. Returns the facts and the total length.
#[inline(always)]
fn ipv4_fixed(
    ctx: &XdpContext,
    off: usize,
    wanted: impl Fn(&[u32; 4]) -> bool,
) -> Result<(L3, usize, u16), ParseError> {
    // Word loads: the verifier allows unaligned packet access where the CPU does (x86, arm64),
    // and byte loads would cost four instructions per word plus the shifts to join them.
    let h = unsafe { *ptr_at::<[u32; 5]>(ctx, off)? };
    if !wanted(&[h[4], 0, 0, 0]) {
        return Err(ParseError::NotWanted);
    }
    let [ver_ihl, _, len_hi, len_lo] = h[0].to_ne_bytes();
    let [_, _, frag_hi, frag_lo] = h[1].to_ne_bytes();
    let [_, proto, _, _] = h[2].to_ne_bytes();
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 {
        return Err(ParseError::Malformed);
    }
    ptr_at::<[u8; 4]>(ctx, off + ihl - 4)?;
    let total = u16::from_be_bytes([len_hi, len_lo]) as usize;
    let frag = u16::from_be_bytes([frag_hi, frag_lo]);
    let l3 = L3 {
        family: FAMILY_V4,
        proto,
        src: [h[3], 0, 0, 0],
        dst: [h[4], 0, 0, 0],
        l4_off: off + ihl,
        end: off + total,
        // MF set, or a non-zero fragment offset.
        fragment: frag & 0x3fff != 0,
    };
    Ok((l3, total, frag))
}

/// Parse an IPv4 header at `off`, honouring IHL (options allowed), if `wanted` accepts its
/// destination.
#[inline(always)]
pub fn ipv4(
    ctx: &XdpContext,
    off: usize,
    wanted: impl Fn(&[u32; 4]) -> bool,
) -> Result<L3, ParseError> {
    let (l3, total, _) = ipv4_fixed(ctx, off, wanted)?;
    // The datagram must fit in the frame: a truncated datagram is malformed even if all its
    // headers are present.
    if total < l3.l4_off - off || off + total > ctx.data_end() - ctx.data() {
        return Err(ParseError::Malformed);
    }
    Ok(l3)
}

/// Parse an IPv6 header at `off`, if `wanted` accepts its destination, and walk up to
/// `MAX_IPV6_EXT_HEADERS` extension headers.
#[inline(always)]
pub fn ipv6(
    ctx: &XdpContext,
    off: usize,
    wanted: impl Fn(&[u32; 4]) -> bool,
) -> Result<L3, ParseError> {
    let (mut l3, payload) = ipv6_fixed(ctx, off, wanted)?;
    // Payload length 0 would mean a jumbogram: not ours to handle, and it cannot be checked.
    if payload == 0 || off + IPV6_HLEN + payload > ctx.data_end() - ctx.data() {
        return Err(ParseError::Malformed);
    }
    let mut next = l3.proto;
    let mut l4_off = off + IPV6_HLEN;
    let mut fragment = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        // Every extension header starts with (next header, length).
        if !is_ipv6_ext(next) {
            break;
        }
        let [hdr_next, hdr_len] = pair_at(ctx, l4_off)?;
        let len = match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => (hdr_len as usize + 1) * 8,
            IPPROTO_AH => (hdr_len as usize + 2) * 4,
            IPPROTO_FRAGMENT => {
                // Any fragment header marks the datagram as fragmented (atomic fragments too:
                // they are rare and treating them alike is the safe side).
                fragment = true;
                8
            }
            _ => break,
        };
        next = hdr_next;
        l4_off += len;
        if l4_off > MAX_OFFSET {
            return Err(ParseError::Malformed);
        }
    }
    if is_ipv6_ext(next) {
        return Err(ParseError::ExtLimit);
    }
    // Extension headers are part of the payload: they must end inside it.
    if l4_off > l3.end {
        return Err(ParseError::Malformed);
    }
    l3.proto = next;
    l3.l4_off = l4_off;
    l3.fragment = fragment;
    Ok(l3)
}

/// An IPv6 extension header this parser walks (the others end the chain as a protocol).
#[inline(always)]
pub fn is_ipv6_ext(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    )
}

/// The fixed 40-byte IPv6 header through one bounds check; returns the facts (proto = the first
/// next-header) and the payload length.
#[inline(always)]
fn ipv6_fixed(
    ctx: &XdpContext,
    off: usize,
    wanted: impl Fn(&[u32; 4]) -> bool,
) -> Result<(L3, usize), ParseError> {
    // Word loads, as in `ipv4_fixed`.
    let h = unsafe { *ptr_at::<[u32; IPV6_HLEN / 4]>(ctx, off)? };
    if !wanted(&[h[6], h[7], h[8], h[9]]) {
        return Err(ParseError::NotWanted);
    }
    let [ver_tc, _, _, _] = h[0].to_ne_bytes();
    let [len_hi, len_lo, next, _] = h[1].to_ne_bytes();
    if ver_tc >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let payload = u16::from_be_bytes([len_hi, len_lo]) as usize;
    let l3 = L3 {
        family: FAMILY_V6,
        proto: next,
        src: [h[2], h[3], h[4], h[5]],
        dst: [h[6], h[7], h[8], h[9]],
        l4_off: off + IPV6_HLEN,
        end: off + IPV6_HLEN + payload,
        fragment: false,
    };
    Ok((l3, payload))
}

/// TCP flags (the header's 14th byte).
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// A SYN without ACK: a connection's first segment (a new one, or a retransmission).
#[inline(always)]
pub fn opens_connection(tcp_flags: u8) -> bool {
    tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// A FIN or RST: the client closes its connection.
#[inline(always)]
pub fn closes_connection(tcp_flags: u8) -> bool {
    tcp_flags & (TCP_FIN | TCP_RST) != 0
}

/// Transport facts of a TCP or UDP header: ports, and for TCP its flags and its sequence number
/// (for a FIN or RST its end: the sequence number after its payload and FIN), 0 both for UDP.
/// The whole
/// header must lie inside the datagram (`l3.end`), not just inside the frame: TCP's data offset
/// (at least 5 words, options included), UDP's length (at least the 8-byte header, at most what
/// the IP header says is left).
#[inline(always)]
pub fn ports(ctx: &XdpContext, l3: &L3) -> Result<(u16, u16, u8, u32), ParseError> {
    let off = l3.l4_off;
    // Word loads, as in `ipv4_fixed`; the first word of both headers holds the two ports.
    let (ports, tcp_flags, seq) = if l3.proto == PROTO_TCP {
        let t = unsafe { *ptr_at::<[u32; 5]>(ctx, off)? };
        let [doff, flags, _, _] = t[3].to_ne_bytes();
        let doff = (doff >> 4) as usize * 4;
        if doff < 20 || off + doff > l3.end {
            return Err(ParseError::Malformed);
        }
        let mut seq = u32::from_be(t[1]);
        if closes_connection(flags) {
            seq = seq
                .wrapping_add((l3.end - off - doff) as u32)
                .wrapping_add((flags & TCP_FIN) as u32);
        }
        (t[0], flags, seq)
    } else {
        let u = unsafe { *ptr_at::<[u32; 2]>(ctx, off)? };
        let [len_hi, len_lo, _, _] = u[1].to_ne_bytes();
        let len = u16::from_be_bytes([len_hi, len_lo]) as usize;
        if len < 8 || off + len > l3.end {
            return Err(ParseError::Malformed);
        }
        (u[0], 0, 0)
    };
    let [s0, s1, d0, d1] = ports.to_ne_bytes();
    Ok((
        u16::from_be_bytes([s0, s1]),
        u16::from_be_bytes([d0, d1]),
        tcp_flags,
        seq,
    ))
}

pub fn has_ports(proto: u8) -> bool {
    proto == PROTO_TCP || proto == PROTO_UDP
}

/// An ICMP error about a packet we (the VIP) sent: "fragmentation needed" (v4 type 3 code 4)
/// or "packet too big" (v6 type 2). Returns the embedded header's facts.
pub struct Embedded {
    pub l3: L3,
    pub sport: u16,
    pub dport: u16,
}

#[inline(always)]
pub fn icmp_too_big(ctx: &XdpContext, outer: &L3) -> Result<Option<Embedded>, ParseError> {
    let off = outer.l4_off;
    let [ty, code] = pair_at(ctx, off)?;
    let inner = if outer.proto == PROTO_ICMP && outer.family == FAMILY_V4 {
        if ty != 3 || code != 4 {
            return Ok(None);
        }
        ipv4_embedded(ctx, off + 8)?
    } else if outer.proto == PROTO_ICMPV6 && outer.family == FAMILY_V6 {
        if ty != 2 || code != 0 {
            return Ok(None);
        }
        ipv6_embedded(ctx, off + 8)?
    } else {
        return Ok(None);
    };
    if !has_ports(inner.proto) || inner.fragment {
        return Ok(None);
    }
    // The quote (IP header and the 8 transport bytes every ICMP error carries) must lie inside
    // the outer datagram.
    if inner.l4_off + 8 > outer.end {
        return Err(ParseError::Malformed);
    }
    // Only the first 8 bytes of the embedded transport header are guaranteed: read just ports.
    let p = unsafe { *ptr_at::<[u8; 4]>(ctx, inner.l4_off)? };
    let (sport, dport) = (
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
    );
    Ok(Some(Embedded {
        l3: inner,
        sport,
        dport,
    }))
}

#[inline(always)]
fn ipv4_embedded(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    // An ICMP error quotes only the start of the datagram: its total length is not checked,
    // and a quoted first fragment still carries the ports.
    let (mut l3, _, frag) = ipv4_fixed(ctx, off, |_| true)?;
    l3.fragment = frag & 0x1fff != 0;
    Ok(l3)
}

#[inline(always)]
fn ipv6_embedded(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    // No extension-header walk inside an ICMP payload: the embedded header must be followed
    // directly by TCP or UDP, anything else is not treated as a VIP flow.
    Ok(ipv6_fixed(ctx, off, |_| true)?.0)
}
