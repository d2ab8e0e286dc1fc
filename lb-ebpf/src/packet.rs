//! Header parsing. `ptr_at` is the only place raw packet pointers are made; every field is read
//! as raw bytes or integers at a bounds-checked offset.

use aya_ebpf::programs::XdpContext;
use lb_common::{FAMILY_V4, FAMILY_V6, MAX_IPV6_EXT_HEADERS, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};

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
}

/// Largest offset we ever read at; keeps the verifier's range tracking simple.
const MAX_OFFSET: usize = 512;

#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, ParseError> {
    let start = ctx.data();
    let end = ctx.data_end();
    if offset > MAX_OFFSET || start + offset + core::mem::size_of::<T>() > end {
        return Err(ParseError::Malformed);
    }
    Ok((start + offset) as *mut T)
}

#[inline(always)]
pub fn u8_at(ctx: &XdpContext, offset: usize) -> Result<u8, ParseError> {
    Ok(unsafe { *ptr_at::<u8>(ctx, offset)? })
}

#[inline(always)]
pub fn be16_at(ctx: &XdpContext, offset: usize) -> Result<u16, ParseError> {
    let p = ptr_at::<[u8; 2]>(ctx, offset)?;
    Ok(u16::from_be_bytes(unsafe { *p }))
}

#[inline(always)]
fn addr4_at(ctx: &XdpContext, offset: usize) -> Result<[u8; 16], ParseError> {
    let p = ptr_at::<[u8; 4]>(ctx, offset)?;
    let a = unsafe { *p };
    let mut out = [0u8; 16];
    out[0] = a[0];
    out[1] = a[1];
    out[2] = a[2];
    out[3] = a[3];
    Ok(out)
}

#[inline(always)]
fn addr6_at(ctx: &XdpContext, offset: usize) -> Result<[u8; 16], ParseError> {
    let p = ptr_at::<[u8; 16]>(ctx, offset)?;
    Ok(unsafe { *p })
}

/// The layer-3 facts the pipeline needs.
#[derive(Clone, Copy)]
pub struct L3 {
    pub family: u8,
    pub proto: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Offset of the transport header.
    pub l4_off: usize,
    /// Part of a fragmented datagram (first or later fragment).
    pub fragment: bool,
}

/// Parse an IPv4 header at `off`, honouring IHL (options allowed).
#[inline(always)]
pub fn ipv4(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    let ver_ihl = u8_at(ctx, off)?;
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 {
        return Err(ParseError::Malformed);
    }
    // The whole header, options included, must be in the frame.
    ptr_at::<u8>(ctx, off + ihl - 1)?;
    let frag = be16_at(ctx, off + 6)?;
    Ok(L3 {
        family: FAMILY_V4,
        proto: u8_at(ctx, off + 9)?,
        src: addr4_at(ctx, off + 12)?,
        dst: addr4_at(ctx, off + 16)?,
        l4_off: off + ihl,
        // MF set, or a non-zero fragment offset.
        fragment: frag & 0x3fff != 0,
    })
}

/// Parse an IPv6 header at `off` and walk up to `MAX_IPV6_EXT_HEADERS` extension headers.
#[inline(always)]
pub fn ipv6(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    let ver = u8_at(ctx, off)?;
    if ver >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    ptr_at::<[u8; IPV6_HLEN]>(ctx, off)?;
    let mut next = u8_at(ctx, off + 6)?;
    let mut l4_off = off + IPV6_HLEN;
    let mut fragment = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        let len = match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                (u8_at(ctx, l4_off + 1)? as usize + 1) * 8
            }
            IPPROTO_AH => (u8_at(ctx, l4_off + 1)? as usize + 2) * 4,
            IPPROTO_FRAGMENT => {
                // Any fragment header marks the datagram as fragmented (atomic fragments too:
                // they are rare and treating them alike is the safe side).
                fragment = true;
                8
            }
            _ => break,
        };
        next = u8_at(ctx, l4_off)?;
        l4_off += len;
        if l4_off > MAX_OFFSET {
            return Err(ParseError::Malformed);
        }
    }
    if matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    ) {
        return Err(ParseError::ExtLimit);
    }
    Ok(L3 {
        family: FAMILY_V6,
        proto: next,
        src: addr6_at(ctx, off + 8)?,
        dst: addr6_at(ctx, off + 24)?,
        l4_off,
        fragment,
    })
}

/// Source and destination ports of a TCP or UDP header at `off`; the whole minimal header
/// (20 bytes for TCP, 8 for UDP) must be present.
#[inline(always)]
pub fn ports(ctx: &XdpContext, proto: u8, off: usize) -> Result<(u16, u16), ParseError> {
    let min = if proto == PROTO_TCP { 20 } else { 8 };
    ptr_at::<u8>(ctx, off + min - 1)?;
    Ok((be16_at(ctx, off)?, be16_at(ctx, off + 2)?))
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
    let ty = u8_at(ctx, off)?;
    let code = u8_at(ctx, off + 1)?;
    let inner = if outer.proto == PROTO_ICMP && outer.family == FAMILY_V4 {
        if ty != 3 || code != 4 {
            return Ok(None);
        }
        ipv4_embedded(ctx, off + 8)?
    } else if outer.proto == PROTO_ICMPV6 && outer.family == FAMILY_V6 {
        if ty != 2 {
            return Ok(None);
        }
        ipv6_embedded(ctx, off + 8)?
    } else {
        return Ok(None);
    };
    if !has_ports(inner.proto) || inner.fragment {
        return Ok(None);
    }
    // Only the first 8 bytes of the embedded transport header are guaranteed: read just ports.
    let sport = be16_at(ctx, inner.l4_off)?;
    let dport = be16_at(ctx, inner.l4_off + 2)?;
    Ok(Some(Embedded { l3: inner, sport, dport }))
}

#[inline(always)]
fn ipv4_embedded(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    ipv4(ctx, off)
}

#[inline(always)]
fn ipv6_embedded(ctx: &XdpContext, off: usize) -> Result<L3, ParseError> {
    // No extension-header walk inside an ICMP payload: the embedded header must be followed
    // directly by TCP or UDP, anything else is not treated as a VIP flow.
    let ver = u8_at(ctx, off)?;
    if ver >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    Ok(L3 {
        family: FAMILY_V6,
        proto: u8_at(ctx, off + 6)?,
        src: addr6_at(ctx, off + 8)?,
        dst: addr6_at(ctx, off + 24)?,
        l4_off: off + IPV6_HLEN,
        fragment: false,
    })
}
