//! The connection table as the program uses it: a flow cache in front of the LRU hash.
//!
//! `LB_CONNTRACK` (an LRU hash keyed by the full 5-tuple) is where every remembered flow is
//! written. A hash lookup costs a call, a jhash of the 40-byte key and a bucket walk: on its own
//! more than twice the whole baseline program (`bench micro`'s floor cases). `LB_FLOW_CACHE_V3` is
//! an array of 64-byte lines, each one cache line, indexed by `flow_cache_hash`: the kernel
//! inlines an array lookup, so an established flow found there costs a multiply-xorshift hash,
//! a few word compares and a check word, with no call and one cache miss. A line holds two IPv4
//! entries (two ways of 32 bytes) or one IPv6 entry (lb-common `flow_cache` has the layout). A
//! flow's home line has a buddy, the other line of its aligned pair (the same 128 bytes, the
//! same page): a flow goes there when its home line's ways are taken, and is looked up there
//! when its home line does not hold it. So with many flows nearly every flow has a way of its
//! own (100k flows in 131,072 lines: about 1.4 % without one, against 30 % with one 64-byte
//! slot per flow), and a flow in its home line costs one line.
//!
//! The rules that keep the two one table:
//! - **A write goes to both.** Remembering a flow inserts it into the LRU hash and puts it in a
//!   way of its home line or its buddy.
//! - **The cache is looked up first and wins.** A way holds the last decision written for its
//!   key; the LRU hash holds it too, unless it aged out there while the flow was served from the
//!   cache (cache hits do not touch the LRU's recency).
//! - **Nothing is lost when a way changes hands.** A flow that takes an occupied way (or an IPv6
//!   flow a line) first writes the occupants back into the LRU hash if they are still good, so
//!   a flow served from the cache never falls back to a hash that has forgotten it. The
//!   write-back only ever adds a missing entry (`BPF_NOEXIST`): an entry another CPU wrote
//!   meanwhile is newer than the cache's copy and is never replaced by it.
//! - **A way goes to the flow that uses it (a second chance, as a CLOCK cache gives).** A
//!   new decision always takes a way: a free one (empty, its pair gone, or not used since the
//!   last ask; the home line's, then the buddy's), else the home line's older way (the one not
//!   written last, byte 7 of way 0). A way that holds the flow is always the one rewritten:
//!   a flow is never in both lines. A flow found only in the LRU hash takes a free way only:
//!   each way has a use mark (byte 6 of its tail word), set when its entry forwards a packet
//!   and when it is written, and cleared by an ask. One in `ASK_ONE_IN` of such packets asks (a random draw) and clears both lines' marks:
//!   a mark is written only then and at its occupant's next packet, not on every packet when
//!   more active flows share a pair of lines than it has ways (with many flows every line write is a
//!   dirty cache line). So a flow that lost its way to one that then went idle gets it back
//!   within a few packets (`ASK_ONE_IN` on average, plus one), instead of paying the LRU hash
//!   for as long as the idle flow's pair stands, and active flows do not evict each other on
//!   every packet (an occupant keeps its way while it forwards a packet between asks).
//! - **Lines are read without a lock.** Another CPU may be rewriting a way while it is read:
//!   the check word binds the value to the key's 64-bit hash, so words of two different entries
//!   fail it and the packet falls back to the LRU hash. Values and checks are read once.
use lb_common::{
    BACKEND_F_IN_SET, BACKEND_F_MOVED, BackendInfo, FAMILY_V4, FAMILY_V6, FLOW_ID_MASK, FlowKey,
    FlowValue, LAST_BYTE, LbConfig, MARK_BYTE, MAX_BACKENDS, TAIL_KEY_MASK, V4_ADDRS, V4_CHECK,
    V4_VALUE, V6_CHECK, V6_SRC, V6_VALUE, WAY_WORDS, flow_cache_check, flow_cache_hash,
    flow_cache_index, flow_cache_seed, key_of_words, key_words, moved_to, tail_family,
    tail_matches, v4_addrs, v4_key, value_of, value_word,
};

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_get_prandom_u32};

use crate::maps::{LB_BACKENDS, LB_CONNTRACK, LB_FLOW_CACHE_V3};

/// A flow's place in the cache: its home line (if the cache is there), its key's hash, and
/// where a cache hit found it (the home line or its buddy, and the way).
pub struct Slot {
    /// The words of the line the flow was found in, else of its home line; null without a
    /// cache (no configuration yet, or an index past its end).
    line: *mut u64,
    hash: u64,
    /// Word offset of the flow's way (0 or `WAY_WORDS`; an IPv6 line's entry is at 0), with
    /// `IN_BUDDY` when the hit was in the buddy line: set by a cache hit, read by `touch` and
    /// `mark_closed`.
    way: u32,
    /// `LbConfig::flow_cache`: the cache's size, to find the buddy line.
    cache: u32,
}

/// `Slot::way`: the flow was found in its buddy line.
const IN_BUDDY: u32 = 0x100;

#[inline(always)]
pub fn slot(cfg: Option<&LbConfig>, flow: &FlowKey) -> Slot {
    match cfg {
        Some(cfg) => slot_at(cfg, flow_cache_hash(flow, seed(cfg))),
        None => Slot {
            line: core::ptr::null_mut(),
            hash: 0,
            way: 0,
            cache: 0,
        },
    }
}

/// The home line of a key whose hash is `hash` (an inlined array lookup, no hashing).
#[inline(always)]
pub fn slot_at(cfg: &LbConfig, hash: u64) -> Slot {
    Slot {
        line: line_at(flow_cache_index(hash, cfg.flow_cache)),
        hash,
        way: 0,
        cache: cfg.flow_cache,
    }
}

/// Line `i`'s words, or null.
#[inline(always)]
fn line_at(i: u32) -> *mut u64 {
    LB_FLOW_CACHE_V3
        .get_ptr_mut(i)
        .map_or(core::ptr::null_mut(), |l| l as *mut u64)
}

/// The buddy of the home line of a key whose hash is `hash`: the other line of its aligned
/// pair (one 128-byte block, the same page), where the flow goes when its home line's ways
/// are taken.
#[inline(always)]
fn buddy_of(hash: u64, cache: u32) -> *mut u64 {
    line_at(flow_cache_index(hash, cache) ^ 1)
}

#[inline(always)]
fn seed(cfg: &LbConfig) -> u64 {
    flow_cache_seed(cfg.hash_seed, cfg.flow_cache)
}

/// Where a connection-table entry was found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Cache,
    Table,
}

/// The flow's entry: from its home line or its buddy if one holds it, else from the LRU hash.
#[inline(always)]
pub fn lookup(slot: &mut Slot, flow: &FlowKey) -> Option<(FlowValue, Found)> {
    if let Some(v) = cached_only(slot, flow) {
        return Some((v, Found::Cache));
    }
    if let Some(v) = in_buddy_line(slot, flow) {
        return Some((v, Found::Cache));
    }
    table_only(flow)
}

/// The flow's entry in the LRU hash (its cache line is known not to hold it).
#[inline(always)]
pub fn table_only(flow: &FlowKey) -> Option<(FlowValue, Found)> {
    let v = unsafe { *LB_CONNTRACK.get_ptr(flow)? };
    Some((v, Found::Table))
}

/// What the fast path learned about a flow before leaving it to the full path: its key's hash
/// and what its line held for it (and in which way), so that the full path, which builds the
/// same key from the same headers, neither hashes nor compares the line again. Two words: the
/// program's stack is near its limit.
pub struct Hint {
    hash: u64,
    /// The packed value the line held for the flow (`SPARE_BIT` set for way 1), or
    /// `NOT_CACHED`.
    cached: u64,
}

/// `Hint::cached` when the line did not hold the flow. No entry holds it: backend id
/// `u32::MAX` names no pair (`MAX_BACKENDS` is far below), so such a value is stale anyway.
const NOT_CACHED: u64 = u64::MAX;

/// A bit of a packed value (`pack`) no entry has (backend id bit 30): in a hint, the flow's
/// way; in `take`'s argument, a new decision (which always takes a way).
const SPARE_BIT: u64 = 1 << 62;
/// Another (backend id bit 29): in a hint, the flow was found in its buddy line.
const BUDDY_BIT: u64 = 1 << 61;
const _: () = assert!(MAX_BACKENDS <= 1 << 29);

impl Hint {
    #[inline(always)]
    pub fn new(slot: &Slot, cached: Option<FlowValue>) -> Hint {
        Hint {
            hash: slot.hash,
            cached: cached.map_or(NOT_CACHED, |v| {
                pack(v)
                    | if slot.way & WAY_WORDS as u32 != 0 {
                        SPARE_BIT
                    } else {
                        0
                    }
                    | if slot.way & IN_BUDDY != 0 {
                        BUDDY_BIT
                    } else {
                        0
                    }
            }),
        }
    }

    /// The flow's slot and its entry, as `slot` and `lookup` would give them.
    #[inline(always)]
    pub fn found(&self, cfg: &LbConfig, flow: &FlowKey) -> (Slot, Option<(FlowValue, Found)>) {
        let mut slot = slot_at(cfg, self.hash);
        if self.cached != NOT_CACHED {
            if self.cached & SPARE_BIT != 0 {
                slot.way = WAY_WORDS as u32;
            }
            if self.cached & BUDDY_BIT != 0 {
                slot.line = buddy_line(self.hash, slot.cache as u64);
                slot.way |= IN_BUDDY;
            }
            let v = self.cached & !(SPARE_BIT | BUDDY_BIT);
            return (slot, Some((unpack(v), Found::Cache)));
        }
        if let Some(v) = in_buddy_line(&mut slot, flow) {
            return (slot, Some((v, Found::Cache)));
        }
        (slot, table_only(flow))
    }
}

/// The flow's entry if its home line holds it (the fast path; a miss, even one the buddy line
/// would answer, takes the full path, so that the fast path makes no call); notes the way in
/// `slot`.
#[inline(always)]
pub fn cached_only(slot: &mut Slot, flow: &FlowKey) -> Option<FlowValue> {
    if slot.line.is_null() {
        return None;
    }
    let (v, way) = cached(slot.line, flow, slot.hash)?;
    slot.way = way as u32;
    Some(v)
}

/// The flow's entry if its buddy line holds it (its home line is known not to); then `slot`
/// names the buddy line and the way.
#[inline(always)]
fn in_buddy_line(slot: &mut Slot, flow: &FlowKey) -> Option<FlowValue> {
    if slot.line.is_null() {
        return None;
    }
    let found = in_buddy(slot.hash, slot.cache as u64, flow);
    if found == NOT_CACHED {
        return None;
    }
    slot.line = buddy_line(slot.hash, slot.cache as u64);
    slot.way = IN_BUDDY
        | if found & SPARE_BIT != 0 {
            WAY_WORDS as u32
        } else {
            0
        };
    Some(unpack(found & !SPARE_BIT))
}

/// `buddy_of` as a subprogram: the array lookup's key stays out of the caller's frame, which is
/// near the limit.
#[inline(never)]
fn buddy_line(hash: u64, cache: u64) -> *mut u64 {
    buddy_of(hash, cache as u32)
}

/// What the buddy line holds for `flow`: its packed value (`SPARE_BIT` set for way 1), or
/// `NOT_CACHED`. A subprogram: its work stays out of the fast path's frame, which is near the
/// limit, and runs only when the home line does not hold the flow.
#[inline(never)]
fn in_buddy(hash: u64, cache: u64, flow: &FlowKey) -> u64 {
    let buddy = buddy_of(hash, cache as u32);
    if buddy.is_null() {
        return NOT_CACHED;
    }
    match cached(buddy, flow, hash) {
        Some((v, way)) => pack(v) | if way != 0 { SPARE_BIT } else { 0 },
        None => NOT_CACHED,
    }
}

/// The value a way of the line holds for `flow`, with the way's word offset, if its check word
/// matches. Each way is read in the reverse of the order `put` writes (check, value, then the
/// key): on a CPU that keeps stores and loads in order (x86) a reader that sees any word of a
/// new entry then sees the rest of it too, so a mixed read never passes the key compare with
/// another entry's value; on others the check word, keyed by this node's secret seed, is what
/// fails. An IPv4 key is compared with both ways (one cache line), an IPv6 key with the line.
#[inline(always)]
fn cached(line: *mut u64, flow: &FlowKey, hash: u64) -> Option<(FlowValue, usize)> {
    let k = key_words(flow);
    // SAFETY: a map value of the array, 64 bytes; the words are plain integers.
    unsafe {
        if flow.family == FAMILY_V4 {
            let addrs = v4_addrs(flow);
            for b in [0, WAY_WORDS] {
                let check = line.add(b + V4_CHECK).read_volatile();
                let value = value_of(line.add(b + V4_VALUE).read_volatile());
                if v4_way_holds(line, b, k[4], addrs) && check == flow_cache_check(hash, value) {
                    return Some((value, b));
                }
            }
            return None;
        }
        let check = line.add(V6_CHECK).read_volatile();
        let value = value_of(line.add(V6_VALUE).read_volatile());
        (holds_v6(line, k) && check == flow_cache_check(hash, value)).then_some((value, 0))
    }
}

/// Does the IPv4 way at word `b` hold the key whose tail word is `tail` and whose addresses are
/// `addrs` (`v4_addrs`)? The tail first (it differs most often between flows), then the
/// addresses: the reverse of the order `put` writes them (see `cached`).
#[inline(always)]
fn v4_way_holds(line: *mut u64, b: usize, tail: u64, addrs: u64) -> bool {
    // SAFETY: words of the line.
    unsafe {
        tail_matches(line.add(b).read_volatile(), tail)
            && line.add(b + V4_ADDRS).read_volatile() == addrs
    }
}

/// Does an IPv6 line hold this IPv6 key (words `k`)? The tail first, then the addresses from
/// the last word: the reverse of the order `put` writes them (see `cached`).
#[inline(always)]
fn holds_v6(line: *mut u64, k: &[u64; 5]) -> bool {
    // SAFETY: words of the line.
    unsafe {
        if !tail_matches(line.read_volatile(), k[4]) {
            return false;
        }
        for i in [3, 2, 1, 0] {
            if line.add(V6_SRC + i).read_volatile() != k[i] {
                return false;
            }
        }
    }
    true
}

/// The backend an entry names, and its slot, if the entry is still good: the pair it was
/// written for still exists (same epoch, never reused) and is in its VIP's set. A pair whose
/// addressing changed moved to another slot with the same epoch (`BACKEND_F_MOVED`): followed
/// once (user space points every old slot of a pair at its current one). A reference into the
/// map: the few fields used are read where needed.
#[inline(always)]
pub fn entry_backend(v: &FlowValue) -> Option<(u32, &'static BackendInfo)> {
    let id = v.backend();
    let b = LB_BACKENDS.get(id)?;
    if b.epoch != v.epoch || b.epoch == 0 || b.flags & BACKEND_F_IN_SET == 0 {
        return None;
    }
    if b.flags & BACKEND_F_MOVED == 0 {
        return Some((id, b));
    }
    let id = moved_to(b.flags);
    let m = LB_BACKENDS.get(id)?;
    if m.epoch == v.epoch && m.flags & BACKEND_F_IN_SET != 0 {
        Some((id, m))
    } else {
        None
    }
}

/// One in this many packets of a flow found only in the LRU hash, whose line's occupants are
/// in use, asks for a way (a power of two).
const ASK_ONE_IN: u32 = 8;

/// The flow's way forwarded a packet: set its use mark (a byte store only when it was clear, so
/// a flow forwarding from its way does not write the line on every packet).
#[inline(always)]
pub fn touch(slot: &Slot) {
    if slot.line.is_null() {
        return;
    }
    // SAFETY: a byte of the line (way offset 0 or 4 words, mark byte 6 of its first word).
    unsafe {
        let mark = (slot.line as *mut u8).add((slot.way as usize & WAY_WORDS) * 8 + MARK_BYTE);
        if mark.read_volatile() == 0 {
            mark.write_volatile(1);
        }
    }
}

/// A good entry found only in the LRU hash takes a way of its line if one is free: empty,
/// holding this flow unusably (torn), holding another flow whose pair no longer stands, or
/// holding one that has not used it since the last ask (whose entry is written back first).
#[inline(always)]
pub fn promote(cfg: &LbConfig, slot: &Slot, flow: &FlowKey, value: FlowValue) {
    if !slot.line.is_null() {
        used(take(slot.hash, flow, pack(value), cfg));
    }
}

/// Rewrite a flow's entry's close (`FLOW_F_CLIENT_CLOSED` and its sequence and time bits, or
/// none: `value` open) where it was found: the LRU hash's copy in place (a word store of the
/// backend word's flag bits: no insert, which could evict another entry), and the line's way
/// when the line holds it. Returns `value`.
#[inline(always)]
pub fn set_closed(slot: &Slot, flow: &FlowKey, at: Found, value: FlowValue) -> FlowValue {
    if let Some(p) = LB_CONNTRACK.get_ptr_mut(flow) {
        // SAFETY: a map value of the hash; the word is a plain integer.
        unsafe {
            let id = core::ptr::addr_of_mut!((*p).backend_id);
            id.write_volatile(
                (id.read_volatile() & FLOW_ID_MASK) | (value.backend_id & !FLOW_ID_MASK),
            );
        }
    }
    if at == Found::Cache && !slot.line.is_null() {
        put(
            slot.line,
            slot.way as usize & WAY_WORDS,
            flow,
            value,
            slot.hash,
        );
    }
    value
}

/// Replace a flow's entry where it was found, adding none: the LRU hash's copy in place (word
/// stores: no insert, which could evict another entry) if it has one, and the line's way when
/// the line holds it (no `take`, which could displace an occupant and write it back).
#[inline(always)]
pub fn replace(slot: &Slot, flow: &FlowKey, at: Found, value: FlowValue) {
    if let Some(p) = LB_CONNTRACK.get_ptr_mut(flow) {
        // SAFETY: a map value of the hash; the words are plain integers. A reader between the
        // two stores sees an epoch that is not its pair's: a stale entry, hashed again.
        unsafe {
            core::ptr::addr_of_mut!((*p).backend_id).write_volatile(value.backend_id);
            core::ptr::addr_of_mut!((*p).epoch).write_volatile(value.epoch);
        }
    }
    if at == Found::Cache && !slot.line.is_null() {
        put(
            slot.line,
            slot.way as usize & WAY_WORDS,
            flow,
            value,
            slot.hash,
        );
    }
}

/// Remember a flow's decision: in the LRU hash and in a way of its line (a new decision always
/// takes one). Good occupants it displaces are written back to the LRU hash first.
#[inline(always)]
pub fn remember(cfg: Option<&LbConfig>, slot: &Slot, flow: &FlowKey, value: FlowValue) {
    let _ = LB_CONNTRACK.insert(flow, value, 0);
    if let Some(cfg) = cfg
        && !slot.line.is_null()
    {
        used(take(slot.hash, flow, pack(value) | SPARE_BIT, cfg));
    }
}

#[inline(always)]
fn pack(v: FlowValue) -> u64 {
    ((v.backend_id as u64) << 32) | v.epoch as u64
}

#[inline(always)]
fn unpack(v: u64) -> FlowValue {
    FlowValue {
        backend_id: (v >> 32) as u32,
        epoch: v as u32,
    }
}

/// Keep a subprogram's result: a result no caller reads is dropped by the compiler, and the
/// return register may then still hold a pointer into the caller's frame, which the verifier
/// refuses.
#[inline(always)]
fn used(x: u64) {
    // SAFETY: a volatile read of a local.
    unsafe { core::ptr::read_volatile(&x) };
}

// Subprograms of at most five arguments: their stack (the occupants' copies) is not added to
// the caller's, whose frame is near the limit.

/// Put `flow` in a way of its home line or its buddy (`value` packed; with `SPARE_BIT`, a new
/// decision, which always takes one), writing the good occupants it displaces back to the LRU
/// hash. Whether it took one (a value, so that no pointer to this frame is left in the return
/// register, which the verifier refuses).
#[inline(never)]
fn take(hash: u64, flow: &FlowKey, value: u64, cfg: &LbConfig) -> u64 {
    let home = line_at(flow_cache_index(hash, cfg.flow_cache));
    let buddy = buddy_of(hash, cfg.flow_cache);
    if home.is_null() || buddy.is_null() {
        return 0;
    }
    // A line that holds the flow (torn, or being rewritten) first: never two copies of a flow.
    let (line, way) = if let Some(w) = holding(home, flow) {
        (home, w)
    } else if let Some(w) = holding(buddy, flow) {
        (buddy, w)
    } else if let Some(w) = free_way(home, flow) {
        (home, w)
    } else if let Some(w) = free_way(buddy, flow) {
        (buddy, w)
    } else if value & SPARE_BIT != 0 {
        (home, victim(home))
    } else {
        ask(home, buddy);
        return 0;
    };
    let way = way & WAY_WORDS;
    let seed = seed(cfg);
    // SAFETY: a map value of the array.
    let v6_line = tail_family(unsafe { line.read_volatile() }) == FAMILY_V6;
    if v6_line {
        // Whatever takes a way of an IPv6 line displaces its one entry.
        used(write_back(line, 0, true, flow, seed));
    } else if flow.family == FAMILY_V4 {
        used(write_back(line, way, false, flow, seed));
    } else {
        // An IPv6 flow takes the whole line.
        used(write_back(line, 0, false, flow, seed));
        used(write_back(line, WAY_WORDS, false, flow, seed));
    }
    put(
        line,
        way,
        flow,
        unpack(value & !(SPARE_BIT | BUDDY_BIT)),
        hash,
    );
    1
}

/// The way of `line` that holds `flow` (word offset; an IPv6 line's entry is at 0), whatever
/// its check word says.
#[inline(always)]
fn holding(line: *mut u64, flow: &FlowKey) -> Option<usize> {
    let k = key_words(flow);
    // SAFETY: words of the line.
    let w0 = unsafe { line.read_volatile() };
    if tail_family(w0) == FAMILY_V6 {
        return (flow.family == FAMILY_V6 && holds_v6(line, k)).then_some(0);
    }
    if flow.family != FAMILY_V4 {
        return None;
    }
    let addrs = v4_addrs(flow);
    [0, WAY_WORDS]
        .into_iter()
        .find(|&b| v4_way_holds(line, b, k[4], addrs))
}

/// A way of `line` free for `flow`: for an IPv4 flow a free way (the older first, the one not
/// written last), or way 0 of an IPv6 line whose entry is free; for an IPv6 flow the line, if
/// all it holds is free.
#[inline(always)]
fn free_way(line: *mut u64, flow: &FlowKey) -> Option<usize> {
    // SAFETY: a word of the line.
    let w0 = unsafe { line.read_volatile() };
    if tail_family(w0) == FAMILY_V6 {
        return free(line, 0, V6_VALUE).then_some(0);
    }
    if flow.family != FAMILY_V4 {
        return (free(line, 0, V4_VALUE) && free(line, WAY_WORDS, WAY_WORDS + V4_VALUE))
            .then_some(0);
    }
    let older = older_way(w0);
    let newer = WAY_WORDS - older;
    if free(line, older, older + V4_VALUE) {
        return Some(older);
    }
    free(line, newer, newer + V4_VALUE).then_some(newer)
}

/// The way a new decision takes when nothing is free: the older way of an IPv4 line; an IPv6
/// line's entry (way 0), whichever the flow's family.
#[inline(always)]
fn victim(line: *mut u64) -> usize {
    // SAFETY: a word of the line.
    let w0 = unsafe { line.read_volatile() };
    if tail_family(w0) == FAMILY_V6 {
        0
    } else {
        older_way(w0)
    }
}

/// The IPv4 way not written last (way 0's tail word `w0` names the last).
#[inline(always)]
fn older_way(w0: u64) -> usize {
    if (w0 >> (8 * LAST_BYTE)) & 1 == 0 {
        WAY_WORDS
    } else {
        0
    }
}

/// Is the entry whose tail word is at word `b` (value at word `value_at`) free for another
/// flow: empty, its pair gone, or its use mark clear? No check word is needed for this (a torn
/// occupant only means the flow does not take the way now), so a hit in the LRU hash whose
/// line is in use costs no hashing.
#[inline(always)]
fn free(line: *mut u64, b: usize, value_at: usize) -> bool {
    // SAFETY: words of the line.
    let (tail, v) = unsafe {
        (
            line.add(b).read_volatile(),
            value_of(line.add(value_at).read_volatile()),
        )
    };
    tail_family(tail) == 0 || (tail >> (8 * MARK_BYTE)) as u8 == 0 || entry_backend(&v).is_none()
}

/// One time in `ASK_ONE_IN`, clear the use marks of both lines' ways (an IPv6 line has one
/// mark, way 0's byte).
#[inline(always)]
fn ask(home: *mut u64, buddy: *mut u64) {
    // SAFETY: the helper has no preconditions.
    if unsafe { bpf_get_prandom_u32() } & (ASK_ONE_IN - 1) != 0 {
        return;
    }
    for line in [home, buddy] {
        // SAFETY: words and mark bytes of the line.
        unsafe {
            let v6 = tail_family(line.read_volatile()) == FAMILY_V6;
            let bytes = line as *mut u8;
            bytes.add(MARK_BYTE).write_volatile(0);
            if !v6 {
                bytes.add(WAY_WORDS * 8 + MARK_BYTE).write_volatile(0);
            }
        }
    }
}

/// Write the occupant of the way at word `b` (`v6`: the line's IPv6 entry) back to the LRU hash
/// if it is a good entry of another flow than `flow`. Usually still there (written with it;
/// the lookup refreshes it): a lookup costs far less than an insert into a full LRU hash. An
/// entry there, whatever it holds, is kept: it may be newer than this copy.
/// A subprogram of its own: the occupant's copy is in its frame, not in `take`'s (whose
/// caller's frame is near the limit). Whether it wrote one.
#[inline(never)]
fn write_back(line: *mut u64, b: usize, v6: bool, flow: &FlowKey, seed: u64) -> u64 {
    if let Some((key, v)) = occupant(line, b & WAY_WORDS, v6, seed)
        && key != *flow
        && LB_CONNTRACK.get_ptr(&key).is_none()
    {
        return LB_CONNTRACK.insert(&key, v, BPF_NOEXIST as u64).is_ok() as u64;
    }
    0
}

/// The occupant at word `b` (an IPv4 way, or with `v6` the IPv6 line), copied, if it is a good
/// entry (check holds, pair still stands).
#[inline(always)]
fn occupant(line: *mut u64, b: usize, v6: bool, seed: u64) -> Option<(FlowKey, FlowValue)> {
    // SAFETY: words of the line; every bit pattern is a key.
    let (key, value, check) = unsafe {
        let tail = line.add(b).read_volatile() & TAIL_KEY_MASK;
        if v6 {
            let w = |i: usize| line.add(V6_SRC + i).read_volatile();
            (
                key_of_words([w(0), w(1), w(2), w(3), tail]),
                line.add(V6_VALUE).read_volatile(),
                line.add(V6_CHECK).read_volatile(),
            )
        } else {
            (
                v4_key(tail, line.add(b + V4_ADDRS).read_volatile()),
                line.add(b + V4_VALUE).read_volatile(),
                line.add(b + V4_CHECK).read_volatile(),
            )
        }
    };
    let want = if v6 { FAMILY_V6 } else { FAMILY_V4 };
    if key.family != want {
        return None;
    }
    let value = value_of(value);
    if check != flow_cache_check(flow_cache_hash(&key, seed), value) {
        return None;
    }
    entry_backend(&value)?;
    Some((key, value))
}

/// Write `flow`'s entry into the way at word `b` (an IPv6 flow: the line). Word stores: the
/// key, the value, then the check (see `cached` for why the order matters). A new occupant
/// starts with its use mark set; writing way 1 notes it as the line's last written, and an
/// IPv4 entry written over an IPv6 line leaves way 1 empty.
#[inline(always)]
fn put(line: *mut u64, b: usize, flow: &FlowKey, value: FlowValue, hash: u64) {
    let k = key_words(flow);
    let check = flow_cache_check(hash, value);
    let tail = (k[4] & TAIL_KEY_MASK) | 1 << (8 * MARK_BYTE);
    // SAFETY: words and bytes of the line.
    unsafe {
        if flow.family == FAMILY_V4 {
            let b = b & WAY_WORDS;
            let was_v6 = tail_family(line.read_volatile()) == FAMILY_V6;
            line.add(b + V4_ADDRS).write_volatile(v4_addrs(flow));
            // Way 0's tail word also says way 0 was written last (byte 7 zero).
            line.add(b).write_volatile(tail);
            line.add(b + V4_VALUE).write_volatile(value_word(value));
            line.add(b + V4_CHECK).write_volatile(check);
            if b != 0 {
                (line as *mut u8).add(LAST_BYTE).write_volatile(1);
            } else if was_v6 {
                line.add(WAY_WORDS).write_volatile(0);
            }
            return;
        }
        for i in 0..4 {
            line.add(V6_SRC + i).write_volatile(k[i]);
        }
        line.write_volatile(tail);
        line.add(V6_VALUE).write_volatile(value_word(value));
        line.add(V6_CHECK).write_volatile(check);
    }
}
