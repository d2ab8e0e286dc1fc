//! Socket load balancing: cgroup hooks that balance this node's own connections to a VIP
//! service when they are made, instead of packet by packet.
//!
//! A node that holds a VIP (on `lo` as a DSR backend, or on its interface as the owner) would
//! otherwise serve its own connections to the VIP with its own backend, healthy or not. Here a
//! connect() (TCP, connected UDP) or an unconnected UDP send to a VIP service gets a backend by
//! the same VIP lookup, Maglev table and pair flags the XDP program uses: a backend that takes
//! no new flows (drained, failing, held) is skipped exactly as for a forwarded SYN. The socket
//! is then simply connected to the backend's own address and the service port (direct server
//! return keeps ports), so the rest of its life needs no per-packet work, and it keeps its
//! backend for as long as it lives. getpeername() and received datagrams show the VIP again
//! through `LB_SOCK_REV`, keyed by the socket's cookie.
//!
//! The hooks sit on the root cgroup, so they run for every process of the host, in any network
//! namespace: each one first checks that the socket lives in the namespace of the `lbd` that
//! attached it (`SockConfig::netns_cookie`) and changes nothing otherwise. Any miss (not a VIP
//! service, no backend taking new connections, a backend of the other family) leaves the
//! address as the application gave it: the connection then goes where it went without the
//! hooks. The hooks never refuse a call.

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_sock_addr,
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use lb_common::{
    BACKEND_F_NO_NEW, BackendInfo, FAMILY_V4, FAMILY_V6, FlowKey, NO_BACKEND, PROTO_TCP, PROTO_UDP,
    SOCK_F_ENABLED, SockRevKey, SockRevValue, flow_hash, sock_stat,
};

use crate::maps::{LB_CONFIG, LB_SOCK_CONFIG, LB_SOCK_REV, LB_SOCK_STATS};

/// A cgroup sock_addr program's "go on" (0 would fail the call with EPERM).
const ALLOW: i32 = 1;

/// `::ffff:0:0/96` as the third word of an IPv6 address in memory order.
const V4_MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

#[cgroup_sock_addr(connect4)]
pub fn lb_sock_connect4(ctx: SockAddrContext) -> i32 {
    to_backend4(&ctx, false);
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn lb_sock_connect6(ctx: SockAddrContext) -> i32 {
    to_backend6(&ctx, false);
    ALLOW
}

#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    to_backend4(&ctx, true);
    ALLOW
}

#[cgroup_sock_addr(sendmsg6)]
pub fn lb_sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    to_backend6(&ctx, true);
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn lb_sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    to_vip4(&ctx);
    ALLOW
}

#[cgroup_sock_addr(recvmsg6)]
pub fn lb_sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    to_vip6(&ctx);
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn lb_sock_getpeername4(ctx: SockAddrContext) -> i32 {
    to_vip4(&ctx);
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn lb_sock_getpeername6(ctx: SockAddrContext) -> i32 {
    to_vip6(&ctx);
    ALLOW
}

// The context is read and written one 4-byte field at a time, as the verifier requires (a
// compiler that merged two neighbouring fields into one 8-byte access would be refused).
#[inline(always)]
fn get(field: *const u32) -> u32 {
    unsafe { core::ptr::read_volatile(field) }
}

#[inline(always)]
fn set(field: *mut u32, v: u32) {
    unsafe { core::ptr::write_volatile(field, v) }
}

#[inline(always)]
fn port_of(sa: *mut bpf_sock_addr) -> u16 {
    // The port is in network byte order in the low 16 bits.
    u16::from_be(get(unsafe { &raw const (*sa).user_port }) as u16)
}

#[inline(always)]
fn set_port(sa: *mut bpf_sock_addr, port: u16) {
    set(unsafe { &raw mut (*sa).user_port }, port.to_be() as u32);
}

#[inline(always)]
fn ip6_of(sa: *mut bpf_sock_addr) -> [u32; 4] {
    unsafe {
        [
            get(&raw const (*sa).user_ip6[0]),
            get(&raw const (*sa).user_ip6[1]),
            get(&raw const (*sa).user_ip6[2]),
            get(&raw const (*sa).user_ip6[3]),
        ]
    }
}

#[inline(always)]
fn set_ip6(sa: *mut bpf_sock_addr, w: [u32; 4]) {
    unsafe {
        set(&raw mut (*sa).user_ip6[0], w[0]);
        set(&raw mut (*sa).user_ip6[1], w[1]);
        set(&raw mut (*sa).user_ip6[2], w[2]);
        set(&raw mut (*sa).user_ip6[3], w[3]);
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(c) = LB_SOCK_STATS.get_ptr_mut(0) {
        // Per-CPU value: no other writer.
        if let Some(v) = unsafe { (*c).get_mut(index as usize) } {
            *v += 1;
        }
    }
}

/// The socket lives in this node's network namespace: the hooks may act on it (the switch
/// `SOCK_F_ENABLED` comes with it).
#[inline(always)]
fn ours(ctx: &SockAddrContext) -> Option<u32> {
    let c = LB_SOCK_CONFIG.get(0)?;
    if c.netns_cookie == 0 || unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != c.netns_cookie {
        return None;
    }
    Some(c.flags)
}

#[inline(always)]
fn words(b: &[u8; 16]) -> [u32; 4] {
    // SAFETY: plain integers of the same size.
    unsafe { core::mem::transmute(*b) }
}

#[inline(always)]
fn bytes(w: [u32; 4]) -> [u8; 16] {
    // SAFETY: plain integers of the same size.
    unsafe { core::mem::transmute(w) }
}

/// The backend for a new connection (or an unconnected datagram) of socket `cookie` to
/// `dst`:`port` (`dst` as the key's words, IPv4 in the first), if that is a VIP service. The
/// Maglev slot is chosen by a hash of the socket and the service, so each socket is one new
/// flow, spread like any other over the table; `pick_slot` skips backends that take no new
/// flows, as it does for a forwarded SYN.
#[inline(always)]
fn choose(
    cookie: u64,
    dst: &[u32; 4],
    port: u16,
    proto: u8,
    family: u8,
) -> Option<&'static BackendInfo> {
    let cfg = LB_CONFIG.get(0)?;
    // Most connections are not to a VIP: the XDP program's address filter says so without a
    // hash lookup.
    if !crate::shared::maybe_vip(Some(cfg), dst) {
        return None;
    }
    let mut src = [0u8; 16];
    let c = cookie.to_ne_bytes();
    let mut i = 0;
    while i < 8 {
        src[i] = c[i];
        i += 1;
    }
    let flow = FlowKey {
        src,
        dst: bytes(*dst),
        sport: 0,
        dport: port,
        proto,
        family,
        _pad: [0; 2],
    };
    let vip = crate::lookup_vip(Some(cfg), &flow)?;
    if cfg.table_size == 0 {
        count(sock_stat::NO_BACKEND);
        return None;
    }
    let slot = flow_hash(&flow, cfg.hash_seed) % cfg.table_size;
    let picked = crate::pick_slot(vip.vip_id, vip.active_table, cfg.table_size, slot, 1);
    if picked == NO_BACKEND {
        count(sock_stat::NO_BACKEND);
        return None;
    }
    let Some(b) = crate::backend_of(&vip, picked & !crate::SLOT_SKIPPED) else {
        count(sock_stat::NO_BACKEND);
        return None;
    };
    // A slot of a backend out of rotation whose new-flow table is not written yet.
    if b.flags & BACKEND_F_NO_NEW != 0 {
        count(sock_stat::NO_BACKEND);
        return None;
    }
    if b.family != family {
        count(sock_stat::FAMILY_MISMATCH);
        return None;
    }
    Some(b)
}

#[inline(always)]
fn wanted_proto(sa: *mut bpf_sock_addr, unconnected: bool) -> Option<u8> {
    match get(unsafe { &raw const (*sa).protocol }) {
        17 => Some(PROTO_UDP),
        6 if !unconnected => Some(PROTO_TCP),
        _ => None,
    }
}

/// Remember what socket `cookie` asked for, under the backend address it got (as the socket
/// sees both).
#[inline(always)]
fn remember(cookie: u64, backend: [u32; 4], vip: [u32; 4], port: u16, family: u8) {
    let key = SockRevKey {
        cookie,
        addr: bytes(backend),
        port,
        family,
        _pad: [0; 5],
    };
    let value = SockRevValue {
        addr: bytes(vip),
        port,
        family,
        _pad: 0,
    };
    let _ = LB_SOCK_REV.insert(&key, &value, 0);
}

/// connect4 / sendmsg4: a VIP service's address becomes a backend's.
#[inline(always)]
fn to_backend4(ctx: &SockAddrContext, unconnected: bool) {
    let Some(flags) = ours(ctx) else { return };
    if flags & SOCK_F_ENABLED == 0 {
        return;
    }
    let sa = ctx.sock_addr;
    let Some(proto) = wanted_proto(sa, unconnected) else {
        return;
    };
    let ip = get(unsafe { &raw const (*sa).user_ip4 });
    let port = port_of(sa);
    let dst = [ip, 0, 0, 0];
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(b) = choose(cookie, &dst, port, proto, FAMILY_V4) else {
        return;
    };
    let to = words(&b.addr);
    remember(cookie, [to[0], 0, 0, 0], dst, port, FAMILY_V4);
    set(unsafe { &raw mut (*sa).user_ip4 }, to[0]);
    count(sock_stat::BALANCED);
}

/// connect6 / sendmsg6, also for an IPv4 VIP given as an IPv4-mapped address to a dual-stack
/// socket.
#[inline(always)]
fn to_backend6(ctx: &SockAddrContext, unconnected: bool) {
    let Some(flags) = ours(ctx) else { return };
    if flags & SOCK_F_ENABLED == 0 {
        return;
    }
    let sa = ctx.sock_addr;
    let Some(proto) = wanted_proto(sa, unconnected) else {
        return;
    };
    let asked = ip6_of(sa);
    let port = port_of(sa);
    let mapped = asked[0] == 0 && asked[1] == 0 && asked[2] == V4_MAPPED;
    let (dst, family) = if mapped {
        ([asked[3], 0, 0, 0], FAMILY_V4)
    } else {
        (asked, FAMILY_V6)
    };
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(b) = choose(cookie, &dst, port, proto, family) else {
        return;
    };
    let w = words(&b.addr);
    let to = if mapped { [0, 0, V4_MAPPED, w[0]] } else { w };
    remember(cookie, to, asked, port, FAMILY_V6);
    set_ip6(sa, to);
    count(sock_stat::BALANCED);
}

/// getpeername4 / recvmsg4: a backend's address seen by a socket balanced to it becomes the
/// VIP service's again.
#[inline(always)]
fn to_vip4(ctx: &SockAddrContext) {
    // Switched off or not: a socket balanced before still gets its VIP back.
    if ours(ctx).is_none() {
        return;
    }
    let sa = ctx.sock_addr;
    let ip = get(unsafe { &raw const (*sa).user_ip4 });
    let key = SockRevKey {
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr: bytes([ip, 0, 0, 0]),
        port: port_of(sa),
        family: FAMILY_V4,
        _pad: [0; 5],
    };
    let Some(v) = (unsafe { LB_SOCK_REV.get(&key) }) else {
        return;
    };
    let (addr, port) = (words(&v.addr)[0], v.port);
    set(unsafe { &raw mut (*sa).user_ip4 }, addr);
    set_port(sa, port);
    count(sock_stat::REVERSED);
}

#[inline(always)]
fn to_vip6(ctx: &SockAddrContext) {
    if ours(ctx).is_none() {
        return;
    }
    let sa = ctx.sock_addr;
    let key = SockRevKey {
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr: bytes(ip6_of(sa)),
        port: port_of(sa),
        family: FAMILY_V6,
        _pad: [0; 5],
    };
    let Some(v) = (unsafe { LB_SOCK_REV.get(&key) }) else {
        return;
    };
    let (addr, port) = (words(&v.addr), v.port);
    set_ip6(sa, addr);
    set_port(sa, port);
    count(sock_stat::REVERSED);
}
