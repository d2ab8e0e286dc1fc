//! The XDP load balancer. A packet's path, top to bottom:
//!
//! parse (Ethernet, IPv4/IPv6, TCP/UDP, ICMP too-big) -> loop guard -> connection table ->
//! VIP lookup -> ownership gate -> Maglev table -> rewrite the MACs, or wrap for a routed
//! backend -> XDP_TX / redirect / local pass -> count.
//!
//! The forwarding rule: a frame is forwarded only if it is a well-formed, unfragmented packet to
//! an owned VIP service (or an ICMP too-big quoting one), judged by its own length fields as well
//! as the frame's, and not from another lbd node; and the forwarded frame differs from the input
//! only in its two MAC addresses (L2 direct server return: the backend holds the VIP as a local
//! address and answers the client itself), or, for a routed backend, is the input's IP packet
//! unchanged behind one outer IP header (`encap`). Everything else is passed or dropped, and
//! counted. The connection table's rules (what a SYN may change, what writes an entry) are at
//! `Track` and `balance`.
#![no_std]
#![no_main]
// `atomic_xadd`: the target has no atomic types; an add whose result is unused is BPF_XADD.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod encap;
mod explain;
mod fast;
mod flows;
mod maps;
mod packet;
mod shared;
mod sock;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::generated::bpf_ktime_get_coarse_ns,
    macros::xdp,
    programs::XdpContext,
};
use lb_common::{
    ALL_PORTS, BACKEND_F_ENCAP, BACKEND_F_IN_SET, BACKEND_F_LOCAL, BACKEND_F_NO_NEW, BackendInfo,
    CONFIG_F_ALL_PORTS, FLOOD_HOLD_NS, FLOOD_WINDOW_NS, FlowKey, FlowValue, LbConfig, MAX_BACKENDS,
    NO_BACKEND, PROTO_TCP, VIP_F_OWNED, VipInfo, VipKey, explain::step as explain_step, flow_hash,
    stat, table_index,
};
use maps::{
    LB_BACKEND_STATS, LB_BACKENDS, LB_CONFIG, LB_FLOOD_NODE, LB_HANDSHAKES, LB_NEW_TABLES,
    LB_TABLES, LB_VIP_ADDRS, LB_VIPS, NONE, count, count_traffic,
};
use packet::{ETH_HLEN, ETH_P_IP, ETH_P_IPV6, L3, ParseError, has_ports, ptr_at};
use shared::{count_forwarded_hit, from_peer, key_of, maybe_vip, ports_word, send_to, vip_owned};

#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    // `lbctl explain`'s dry run (never a frame from the wire) or a traced packet (`lbctl
    // trace` attached), see `explain`: each takes `lb_xdp_noted`, its own compiled copy of the
    // same path, so that a packet that is neither pays for neither: a frame from the wire has
    // no metadata (two context fields compared) and, while no trace is attached, the switch
    // reads zero (a load of a global: no helper, no stack); then the path, inlined here, without
    // a call. (A tail call, not a subprogram call: this program's frame and the other copy's
    // would not fit the 512-byte stack limit on one call chain.)
    if ctx.metadata() < ctx.data() || explain::tracing() {
        // SAFETY: a tail call; it returns only if the slot is empty.
        unsafe { explain::LB_NOTED.tail_call(&ctx, 0) };
        // lbd fills the slot at load: an empty one means no lbd serves explain or trace. A
        // traced packet is then an ordinary one; a frame with metadata, which could be a dry
        // run that must write nothing, is passed untouched.
        if ctx.metadata() < ctx.data() {
            return XDP_PASS;
        }
    }
    lb(&ctx, explain::OFF)
}

/// The path of a dry run or a traced packet (or, for `explain::OFF`, e.g. metadata without the
/// token, of an ordinary one), reached only through `lb_xdp`'s tail call.
#[xdp]
pub fn lb_xdp_noted(ctx: XdpContext) -> u32 {
    lb(&ctx, explain::mode(ctx.ctx as usize))
}

#[inline(always)]
fn lb(ctx: &XdpContext, rec: explain::Rec) -> u32 {
    let (action, reason, conntrack) = match try_lb(ctx, rec) {
        Ok(v) => v,
        Err(ParseError::Malformed) => (XDP_PASS, stat::PASS_MALFORMED, NONE),
        Err(ParseError::ExtLimit) => (XDP_PASS, stat::PASS_IPV6_EXT_LIMIT, NONE),
        Err(ParseError::NotWanted) => (XDP_PASS, stat::PASS_NOT_VIP, NONE),
    };
    if reason == COUNTED {
        if rec == explain::TRACE {
            explain::emit(action, stat::FORWARDED, stat::CONNTRACK_HIT);
        }
        return action;
    }
    if rec == explain::DRY {
        explain::finish(ctx, reason, conntrack);
        return action;
    }
    let verdict = match action {
        XDP_PASS => stat::VERDICT_PASS,
        XDP_DROP => stat::VERDICT_DROP,
        XDP_TX => stat::VERDICT_TX,
        _ => stat::VERDICT_REDIRECT,
    };
    count([verdict, reason, conntrack]);
    if rec == explain::TRACE {
        explain::emit(action, reason, conntrack);
    }
    action
}

/// A verdict, the counter that explains it, and the connection-table counter (or `NONE`).
type Outcome = (u32, u32, u32);

/// An `Outcome`'s reason when its path counted the packet itself (see `count_forwarded_hit`).
const COUNTED: u32 = u32::MAX - 1;

#[inline(always)]
fn try_lb(ctx: &XdpContext, rec: explain::Rec) -> Result<Outcome, ParseError> {
    let cfg = LB_CONFIG.get(0);
    // An established TCP flow in the flow cache, or the node's own traffic: decided
    // with one bounds check (see `fast`); anything else, or any doubt, takes the path below,
    // with the flow's cache slot if the fast path found it.
    // (A dry run or a traced packet takes the path below, which notes its steps: the fast path
    // decides as it would.)
    let mut hint = None;
    if rec == explain::OFF
        && let Some(c) = cfg
        && let Some(outcome) = fast::established(ctx, c, &mut hint)
    {
        return Ok(outcome);
    }
    // VLAN-tagged frames are not ours: lbd attaches to the interface that carries the VIPs
    // untagged.
    let ethertype = packet::ethertype(ctx)?;
    // Most traffic on a node is not for a VIP: a filter bit says so without a hash lookup, tested
    // as soon as the destination is read (a frame to another address, well-formed or not, is
    // passed as not ours). Fragments and ICMP errors for a VIP flow are addressed to the VIP too.
    let wanted = |dst: &[u32; 4]| maybe_vip(cfg, dst);
    let l3 = match ethertype {
        ETH_P_IP => packet::ipv4(ctx, ETH_HLEN, wanted)?,
        ETH_P_IPV6 => packet::ipv6(ctx, ETH_HLEN, wanted)?,
        _ => return Ok((XDP_PASS, stat::PASS_NOT_VIP, NONE)),
    };
    // The loop guard: another lbd node already forwarded this frame (it may be a backup that
    // still forwards, or one whose tables differ from ours). Forwarding it again could send it
    // back and forth; the local stack serves it (this node is a backend of the VIP).
    if from_peer(cfg, packet::source_mac(ctx)?) {
        explain::steps(rec, explain_step::FROM_PEER);
        return Ok((XDP_PASS, stat::PASS_FROM_PEER, NONE));
    }
    if l3.fragment {
        return Ok(fragment(&l3));
    }
    if has_ports(l3.proto) {
        let (sport, dport, tcp_flags, seq) = packet::ports(ctx, &l3)?;
        let flow = flow_key(&l3, sport, dport);
        let track = if packet::opens_connection(tcp_flags) {
            Track::NewConnection
        } else if packet::closes_connection(tcp_flags) {
            Track::Closing
        } else {
            Track::Yes
        };
        // The fast path stopped at this TCP segment's slot only after reading the same headers
        // as this path: same key, so its slot and what the slot held stand.
        let hint = if l3.proto == PROTO_TCP { hint } else { None };
        return Ok(balance(ctx, cfg, &flow, track, seq, hint, rec));
    }
    if let Some(inner) = packet::icmp_too_big(ctx, &l3)? {
        // The embedded packet is one the VIP sent to the client: swap it back into the flow
        // as the client sent it, so it hashes to the same backend.
        let flow = FlowKey {
            src: addr_bytes(inner.l3.dst),
            dst: addr_bytes(inner.l3.src),
            sport: inner.dport,
            dport: inner.sport,
            proto: inner.l3.proto,
            family: inner.l3.family,
            _pad: [0; 2],
        };
        if inner.l3.src != l3.dst || lookup_vip(cfg, &flow).is_none() {
            return Ok((XDP_PASS, stat::PASS_ICMP_NOT_VIP, NONE));
        }
        let (action, reason, conntrack) = balance(ctx, cfg, &flow, Track::LookupOnly, 0, None, rec);
        let reason = match reason {
            stat::FORWARDED | stat::PASS_LOCAL_BACKEND => stat::ICMP_FORWARDED,
            other => other,
        };
        return Ok((action, reason, conntrack));
    }
    Ok((XDP_PASS, stat::PASS_NOT_VIP, NONE))
}

#[inline(always)]
fn flow_key(l3: &L3, sport: u16, dport: u16) -> FlowKey {
    key_of(
        &l3.src,
        &l3.dst,
        ports_word(sport, dport),
        l3.proto,
        l3.family,
    )
}

/// An address's words as the bytes of a map key (the same bytes in memory: keys are aligned to 4,
/// so this compiles to word stores).
#[inline(always)]
fn addr_bytes(w: [u32; 4]) -> [u8; 16] {
    // SAFETY: plain integers of the same size; every bit pattern is valid.
    unsafe { core::mem::transmute(w) }
}

/// Fragments carry no ports after the first, so they cannot be hashed like the rest of their
/// flow. Fragments of datagrams to a VIP address are dropped and counted (never split across
/// backends, never sent to a wrong one); other fragments are not ours and pass.
#[inline(always)]
fn fragment(l3: &L3) -> Outcome {
    let key = VipKey {
        addr: addr_bytes(l3.dst),
        port: 0,
        proto: 0,
        family: l3.family,
    };
    if LB_VIP_ADDRS.get_ptr(&key).is_some() {
        (XDP_DROP, stat::DROP_FRAGMENT, NONE)
    } else {
        (XDP_PASS, stat::PASS_NOT_VIP, NONE)
    }
}

/// The VIP service for this flow: the exact port first, then the "all ports" entry.
#[inline(always)]
fn lookup_vip(cfg: Option<&LbConfig>, flow: &FlowKey) -> Option<VipInfo> {
    let mut key = VipKey {
        addr: flow.dst,
        port: flow.dport,
        proto: flow.proto,
        family: flow.family,
    };
    if let Some(v) = LB_VIPS.get_ptr(&key) {
        return Some(unsafe { *v });
    }
    // Most nodes have no "all ports" service: then non-VIP traffic costs one lookup, not two.
    let all_ports = cfg
        .map(|c| c.flags & CONFIG_F_ALL_PORTS != 0)
        .unwrap_or(true);
    if !all_ports {
        return None;
    }
    key.port = ALL_PORTS;
    LB_VIPS.get_ptr(&key).map(|v| unsafe { *v })
}

/// A backend id read from a table slot, trusted only if it is in the set of this VIP.
#[inline(always)]
fn backend_of(vip: &VipInfo, id: u32) -> Option<&'static BackendInfo> {
    let b = LB_BACKENDS.get(id)?;
    if b.flags & BACKEND_F_IN_SET != 0 && b.vip_id == vip.vip_id && b.epoch != 0 {
        Some(b)
    } else {
        None
    }
}

/// How a packet uses the connection table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Track {
    /// Look up; on a miss choose by Maglev and remember the choice.
    Yes,
    /// A TCP SYN: looked up like any packet, and a good entry (its pair still in the set) is
    /// kept while its connection is open: a SYN never moves or deletes a live connection's
    /// entry, so a spoofed SYN with a client's address and port cannot reset it. On a miss, a
    /// stale entry, or an entry whose connection the client closed (a FIN or RST went through
    /// and nothing the client sent since contradicted it: the client is reusing its port for a
    /// new connection) it starts a flow: Maglev, skipping backends that take no new flows, and
    /// remembered at once so the rest of the handshake follows the SYN even if the table
    /// changes in between. A closed entry whose pair is still in the set must be
    /// `FLOW_CLOSE_HOLD` old for that, whatever the pair takes; a SYN on a younger one follows
    /// the entry, which it leaves as it is.
    NewConnection,
    /// A TCP FIN or RST from the client: as `Yes`, and the entry it follows is marked closed
    /// (`FLOW_F_CLIENT_CLOSED`) with the segment's end and the time, unless it is closed at
    /// that end already (a retransmission).
    Closing,
    /// Look up, choose by Maglev on a miss, remember nothing (ICMP errors about a flow).
    LookupOnly,
}

/// Set in `pick_slot`'s answer when it skipped at least one slot (backend ids are below it).
const SLOT_SKIPPED: u32 = 1 << 31;
const _: () = assert!(MAX_BACKENDS < SLOT_SKIPPED);

/// The backend id at `slot` of a VIP's live table; for a packet that starts a flow, one that
/// takes new flows (`BACKEND_F_NO_NEW` clear): the slot's, else the same slot's of the new-flow
/// table (built without such backends, so it names one whenever one exists), with
/// `SLOT_SKIPPED` set. `NO_BACKEND` when there is none (or the new-flow table is not written
/// yet: just after an upgrade created it, until lbd's first update).
#[inline(never)]
fn pick_slot(vip_id: u32, active: u32, size: u32, slot: u32, starts_flow: u32) -> u32 {
    let pos = table_index(vip_id, active, size, slot);
    let id = live_slot(pos);
    if id == NO_BACKEND || starts_flow == 0 {
        return id;
    }
    // (A slot naming a pair outside the set is the caller's to refuse: never replaced here.)
    match LB_BACKENDS.get(id) {
        Some(b) if b.flags & BACKEND_F_NO_NEW != 0 => {}
        _ => return id,
    }
    match LB_NEW_TABLES.get(pos >> 1) {
        Some(pair) if takes_new_flows(vip_id, pair[(pos & 1) as usize]) => {
            pair[(pos & 1) as usize] | SLOT_SKIPPED
        }
        _ => NO_BACKEND,
    }
}

/// The backend id at position `pos` of the live tables (`NO_BACKEND` past their end).
#[inline(always)]
fn live_slot(pos: u32) -> u32 {
    match LB_TABLES.get(pos >> 1) {
        Some(pair) => pair[(pos & 1) as usize],
        None => NO_BACKEND,
    }
}

/// The coarse clock (`FlowValue::closed_at`, `close_held`).
#[inline(always)]
fn coarse_now() -> u64 {
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Whether flood mode holds, without counting (a dry run's view of `flooded`).
#[inline(always)]
fn flood_on() -> bool {
    let Some(s) = LB_FLOOD_NODE.get_ptr(0) else {
        return false;
    };
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: a map value of the array (see `flooded`).
    now < unsafe { core::ptr::addr_of!((*s).flood_until).read_volatile() }
}

/// Pair `id` is of this VIP, in its set, and takes new flows.
#[inline(always)]
fn takes_new_flows(vip_id: u32, id: u32) -> bool {
    match LB_BACKENDS.get(id) {
        Some(b) => {
            b.vip_id == vip_id
                && b.flags & (BACKEND_F_IN_SET | BACKEND_F_NO_NEW) == BACKEND_F_IN_SET
        }
        None => false,
    }
}

/// Count a connection-table miss that would write an entry, node-wide; whether flood mode
/// holds. A SYN (`syn`) always counts; any other miss (a segment or datagram of a flow without
/// an entry) counts while flood mode is off, and while it holds once per flow: in flood mode
/// every later packet of a flow it left untracked is such a miss, and counting each would let
/// real clients' traffic hold flood mode for as long as they keep sending. The flow is noted in
/// the handshake table (a value that names no pair: epoch 0), which every TCP miss looks up
/// anyway (`handshake_of`); a spoofed flood of made-up flows counts in full, each of its
/// packets a flow not seen before. One shared `FloodState` counted with atomic adds:
/// a per-CPU count would let N CPUs take N times the rate unseen. The window roll is not
/// atomic: two CPUs that roll it at once may lose a few counts, which an estimate of a flood's
/// rate can afford.
#[inline(always)]
fn flooded(cfg: Option<&LbConfig>, syn: bool, flow: &FlowKey) -> bool {
    let Some(limit) = cfg.map(|c| c.syn_flood_rate / 10) else {
        return false;
    };
    let Some(s) = LB_FLOOD_NODE.get_ptr_mut(0) else {
        return false;
    };
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: a map value of the array, shared by every CPU: fields are read and written with
    // volatile (or atomic) accesses.
    unsafe {
        if !syn && now < core::ptr::addr_of!((*s).flood_until).read_volatile() {
            if LB_HANDSHAKES.get_ptr(flow).is_some() {
                return true;
            }
            let _ = LB_HANDSHAKES.insert(
                flow,
                FlowValue {
                    backend_id: 0,
                    epoch: 0,
                },
                0,
            );
        }
        let start = core::ptr::addr_of_mut!((*s).window_start);
        let count = core::ptr::addr_of_mut!((*s).count);
        if now.wrapping_sub(start.read_volatile()) >= FLOOD_WINDOW_NS {
            start.write_volatile(now);
            core::ptr::addr_of_mut!((*s).last_count).write_volatile(count.read_volatile());
            count.write_volatile(0);
        }
        // An atomic add whose result is not used (BPF_XADD); the total is read after it.
        core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(
            count, 1,
        );
        let until = core::ptr::addr_of_mut!((*s).flood_until);
        if limit != 0 && count.read_volatile() > limit {
            until.write_volatile(now + FLOOD_HOLD_NS);
        }
        now < until.read_volatile()
    }
}

/// For a TCP packet without a connection-table entry (or an ICMP error about one): the backend
/// its SYN chose if that SYN skipped its slot in flood mode (`LB_HANDSHAKES`) and the pair still
/// stands, whatever the slot's backend takes now. The connection's first later segment (the
/// handshake's ACK: a spoofed-source SYN never gets one) writes its connection-table entry, in
/// flood mode too, and removes the handshake entry; so the connection no longer depends on the
/// small LRU handshake table, which a flood of SYNs on skipped slots churns in milliseconds.
/// A SYN on the 5-tuple placed on its slot in flood mode removes it too.
#[inline(always)]
fn handshake_of(
    track: Track,
    flow: &FlowKey,
    vip: &VipInfo,
) -> Option<(u32, &'static BackendInfo)> {
    if track == Track::NewConnection || flow.proto != PROTO_TCP {
        return None;
    }
    let v = unsafe { *LB_HANDSHAKES.get_ptr(flow)? };
    let (id, b) = flows::entry_backend(&v)?;
    if b.vip_id != vip.vip_id {
        return None;
    }
    Some((id, b))
}

#[inline(always)]
fn balance(
    ctx: &XdpContext,
    cfg: Option<&LbConfig>,
    flow: &FlowKey,
    track: Track,
    seq: u32,
    hint: Option<flows::Hint>,
    rec: explain::Rec,
) -> Outcome {
    // A dry run writes no map the data plane reads (see `explain`).
    let dry = rec == explain::DRY;
    explain::flow(rec, flow);
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    let (slot, found) = match (hint, cfg) {
        (Some(h), Some(cfg)) => h.found(cfg, flow),
        _ => {
            let mut slot = flows::slot(cfg, flow);
            let found = flows::lookup(&mut slot, flow);
            (slot, found)
        }
    };
    let cached = found.map(|(v, _)| v);
    let entry = cached.and_then(|v| flows::entry_backend(&v));
    // A SYN on an entry whose connection the client closed: a new connection on a reused
    // 5-tuple, placed afresh (the entry is replaced, so the rest of its handshake follows it)
    // once the close is `FLOW_CLOSE_HOLD` old (`close_held`), whatever the entry's pair takes
    // (at once only if the pair left the set: the entry is stale). On a younger close it
    // follows the entry: a forged FIN or RST and a forged SYN right after it cannot move a
    // connection (one on a drained backend or a failing one in its hold, one placed under an
    // older table or by a skip), and the client's own segments meanwhile show the close was
    // forged (see the `Closing` rules below). A client that reuses its port sooner stays on
    // the old connection's backend, even one that takes no new flows.
    let reopen = track == Track::NewConnection
        && cached
            .is_some_and(|v| v.client_closed() && (entry.is_none() || v.close_held(coarse_now())));
    explain::note(rec, |r| {
        if let Some((v, at)) = found {
            r.entry_backend = v.backend();
            if v.client_closed() {
                r.steps |= explain_step::ENTRY_CLOSED;
            }
            r.steps |= if at == flows::Found::Cache {
                explain_step::ENTRY_CACHE
            } else {
                explain_step::ENTRY_TABLE
            };
        }
    });

    // 1. Fast path for established flows: the entry's pair still exists and is in its set, and
    //    this node forwards for its VIP. (The 5-tuple names the VIP service, so the entry's
    //    backend belongs to it: pairs of other services have other epochs.)
    let valid = if reopen { None } else { entry };
    if valid.is_some() {
        explain::steps(rec, explain_step::ENTRY_GOOD);
    }
    if let Some((id, b)) = valid
        && vip_owned(b.vip_id)
    {
        explain::note(rec, |r| {
            r.steps |= explain_step::ENTRY_USED | explain_step::VIP_OWNED | explain_step::CHOSEN;
            r.backend = id;
        });
        if dry {
            let (action, reason, _) = forward(ctx, b, track, dry);
            return (action, reason, stat::CONNTRACK_HIT);
        }
        if let Some((v, at)) = found
            && track != Track::LookupOnly
        {
            // The client's FIN or RST: a later SYN on this 5-tuple may be a new connection
            // (`reopen`). A client segment on a closed entry
            // whose sequence number is not the close's shows the close was forged: the entry is
            // open again (a FIN or RST then closes it at its own end).
            let open = v.client_closed() && !v.close_matches(seq);
            let v = if track == Track::Closing && (open || !v.client_closed()) {
                flows::set_closed(&slot, flow, at, v.closed_at(seq, coarse_now()))
            } else if open && track == Track::Yes {
                flows::set_closed(&slot, flow, at, v.open())
            } else {
                v
            };
            match (at, cfg) {
                (flows::Found::Table, Some(cfg)) => flows::promote(cfg, &slot, flow, v),
                (flows::Found::Cache, _) => flows::touch(&slot),
                _ => {}
            }
        }
        // One per-CPU entry per forwarded packet: its pair's (a VIP's counters are the sum of
        // its pairs', added up by user space).
        let (action, reason, _) = forward(ctx, b, track, dry);
        // Only what reaches the pair is its traffic (not a too-big answer, not a drop).
        if delivered(reason) {
            count_traffic(&LB_BACKEND_STATS, id, bytes, false);
        }
        // (An ICMP error is counted as such by the caller.)
        if reason == stat::FORWARDED && track != Track::LookupOnly {
            count_forwarded_hit(action);
            return (action, COUNTED, NONE);
        }
        return (action, reason, stat::CONNTRACK_HIT);
    }

    // 2. Full path: the VIP service and the ownership gate.
    let Some(vip) = lookup_vip(cfg, flow) else {
        return (XDP_PASS, stat::PASS_NOT_VIP, NONE);
    };
    explain::steps(rec, explain_step::VIP_FOUND);
    if vip.flags & VIP_F_OWNED == 0 {
        // Not the owner: the local stack serves the VIP (this node may be a DSR backend).
        return (XDP_PASS, stat::PASS_NOT_OWNER, NONE);
    }

    // 3. A good entry (the owned flags were mid-update), or a stale one: hash again.
    let mut ct = match (track, cached) {
        (_, Some(_)) => stat::CONNTRACK_STALE,
        (Track::LookupOnly, None) => NONE,
        (_, None) => stat::CONNTRACK_MISS,
    };
    let mut chosen: Option<(u32, &BackendInfo)> = None;
    if let Some((id, b)) = valid
        && b.vip_id == vip.vip_id
    {
        ct = stat::CONNTRACK_HIT;
        chosen = Some((id, b));
        explain::steps(rec, explain_step::ENTRY_USED);
    }
    explain::steps(rec, explain_step::VIP_OWNED);
    let new_flow = chosen.is_none();
    let mut skipped = false;
    let mut handshake = false;

    // 4. Maglev: the slot of the flow hash in the VIP's live table.
    let (id, backend) = match chosen {
        Some(c) => c,
        None => {
            let Some(cfg) = cfg else {
                return (XDP_DROP, stat::DROP_NO_BACKEND, ct);
            };
            if cfg.table_size == 0 {
                return (XDP_DROP, stat::DROP_NO_BACKEND, ct);
            }
            let slot = flow_hash(flow, cfg.hash_seed) % cfg.table_size;
            // A packet that starts a flow skips backends that take no new flows; a mid-flow
            // packet without an entry (e.g. at a new VIP owner) goes where the table says, so
            // established flows of a drained or failing backend stay on it. A UDP datagram
            // without an entry starts its flow wherever it comes, and an ICMP error about a
            // UDP flow goes where that flow's datagrams went.
            let starts_flow = match track {
                Track::NewConnection => true,
                Track::Yes | Track::Closing | Track::LookupOnly => flow.proto != PROTO_TCP,
            };
            let picked = pick_slot(
                vip.vip_id,
                vip.active_table,
                cfg.table_size,
                slot,
                starts_flow as u32,
            );
            explain::note(rec, |r| {
                r.steps |= explain_step::MAGLEV;
                if starts_flow {
                    r.steps |= explain_step::STARTS_FLOW;
                }
                r.slot = slot;
                r.slot_backend = live_slot(table_index(
                    vip.vip_id,
                    vip.active_table,
                    cfg.table_size,
                    slot,
                ));
            });
            if picked == NO_BACKEND {
                return (XDP_DROP, stat::DROP_NO_BACKEND, ct);
            }
            skipped = picked & SLOT_SKIPPED != 0;
            if skipped {
                explain::steps(rec, explain_step::SKIPPED);
            }
            let id = picked & !SLOT_SKIPPED;
            // User space takes a backend out of the set only after no table names it: this is
            // a bug or a hand-edited map, counted (never logged per packet) and never forwarded.
            let Some(b) = backend_of(&vip, id) else {
                return (XDP_DROP, stat::DROP_BAD_BACKEND, ct);
            };
            // A TCP packet without an entry (or an ICMP error about one): a connection whose
            // SYN skipped its slot in SYN flood mode follows its SYN, whatever the slot's
            // backend takes by now (a drain that ended, a backend that recovered).
            match handshake_of(track, flow, &vip) {
                Some(h) => {
                    handshake = true;
                    explain::steps(rec, explain_step::HANDSHAKE);
                    h
                }
                None => (id, b),
            }
        }
    };
    // Flood mode: a spoofed flood (SYNs, or segments and datagrams of made-up flows) must not
    // push established flows out of the LRU table, so misses that would write an entry are
    // counted (`flooded`), and while they come faster than `syn_flood_rate` none writes one:
    // the flow is forwarded by its Maglev slot, as every packet of it will be until the flood
    // is over. A SYN that skipped its slot is remembered in the small handshake table instead:
    // its later packets must not go to the slot's backend, whatever the flood state is by then;
    // and the first of them (the handshake's ACK) moves it into the connection table, in flood
    // mode too (`handshake`: not counted, its SYN was).
    let mut remember = new_flow && track != Track::LookupOnly;
    explain::note(rec, |r| {
        r.steps |= explain_step::CHOSEN;
        r.backend = id;
    });
    if dry {
        // What a real packet would do, written nowhere.
        let flood = remember && !reopen && !handshake && flood_on();
        explain::note(rec, |r| {
            if flood {
                r.steps |= explain_step::FLOOD;
            } else if remember {
                r.steps |= explain_step::WOULD_REMEMBER;
            }
        });
        let (action, reason, _) = forward(ctx, backend, track, dry);
        let ct = match (flood, track) {
            (false, _) => ct,
            (true, Track::NewConnection) => stat::SYN_FLOOD_UNTRACKED,
            (true, _) => stat::FLOOD_UNTRACKED,
        };
        return (action, reason, ct);
    }
    // A reopened 5-tuple replaces its closed entry (it adds none): written in flood mode too,
    // or the rest of its handshake would follow the closed entry to its old backend.
    if remember && !handshake && flooded(cfg, track == Track::NewConnection, flow) && !reopen {
        remember = false;
        explain::steps(rec, explain_step::FLOOD);
        ct = if track == Track::NewConnection {
            stat::SYN_FLOOD_UNTRACKED
        } else {
            stat::FLOOD_UNTRACKED
        };
        if track == Track::NewConnection {
            if skipped {
                let _ = LB_HANDSHAKES.insert(
                    flow,
                    FlowValue {
                        backend_id: id,
                        epoch: backend.epoch,
                    },
                    0,
                );
            } else {
                // A new connection on its slot: an earlier one's handshake entry on this
                // 5-tuple must not send it elsewhere.
                let _ = LB_HANDSHAKES.remove(flow);
            }
        }
    }
    if remember && reopen && flood_on() {
        // A reopened 5-tuple in flood mode: its entry rewritten where it is (the LRU hash's copy
        // in place, the cache's way), so that it adds no entry to either.
        explain::steps(rec, explain_step::WOULD_REMEMBER);
        flows::replace(
            &slot,
            flow,
            found.map_or(flows::Found::Table, |(_, at)| at),
            FlowValue {
                backend_id: id,
                epoch: backend.epoch,
            },
        );
    } else if remember {
        explain::steps(rec, explain_step::WOULD_REMEMBER);
        let value = FlowValue {
            backend_id: id,
            epoch: backend.epoch,
        };
        // A FIN or RST of a flow this node never saw: remembered as closed.
        let value = if track == Track::Closing {
            value.closed_at(seq, coarse_now())
        } else {
            value
        };
        flows::remember(cfg, &slot, flow, value);
        if handshake {
            // The connection table has it now (in flood mode too): the handshake table, which
            // SYNs on skipped slots churn, no longer decides where it goes.
            let _ = LB_HANDSHAKES.remove(flow);
        }
    }

    let counted_new = new_flow && track != Track::LookupOnly;
    let (action, reason, _) = forward(ctx, backend, track, dry);
    if delivered(reason) {
        count_traffic(&LB_BACKEND_STATS, id, bytes, counted_new);
    }
    (action, reason, ct)
}

/// The packet went to its pair: sent on, or to the local stack as the pair's.
#[inline(always)]
fn delivered(reason: u32) -> bool {
    reason == stat::FORWARDED || reason == stat::PASS_LOCAL_BACKEND
}

/// Send the packet to its backend: the MACs rewritten (L2 direct server return), wrapped for a
/// routed backend (`encap`), or passed to the local stack when the backend is this node.
#[inline(always)]
fn forward(ctx: &XdpContext, backend: &BackendInfo, track: Track, dry: bool) -> Outcome {
    if backend.flags & BACKEND_F_LOCAL != 0 {
        return (XDP_PASS, stat::PASS_LOCAL_BACKEND, NONE);
    }
    if backend.flags & BACKEND_F_ENCAP != 0 {
        // An ICMP error too big to wrap is dropped, never answered with another ICMP error
        // (RFC 1122 3.2.2, RFC 4443 2.4 e).
        return encap::encapsulate(ctx, backend, track != Track::LookupOnly, dry);
    }
    let Ok(eth) = ptr_at::<[u32; 3]>(ctx, 0) else {
        return (XDP_PASS, stat::PASS_MALFORMED, NONE);
    };
    (send_to(eth as *mut u32, backend), stat::FORWARDED, NONE)
}

/// Attached to the peer of a native-mode veth so that XDP_TX frames are delivered (a kernel
/// requirement for veth, see docs/architecture.md).
#[xdp]
pub fn lb_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
