//! The connection table as the program uses it: a flow cache in front of the LRU hash.
//!
//! `LB_CONNTRACK` (an LRU hash keyed by the full 5-tuple) is where every remembered flow is
//! written. A hash lookup costs a call, a jhash of the 40-byte key and a bucket walk: on its own
//! more than twice the whole baseline program (`bench micro`'s floor cases). `LB_FLOW_CACHE_V2` is
//! an array of 64-byte slots, one per cache line, indexed by `flow_cache_hash`: the kernel
//! inlines an array lookup, so an established flow found there costs a multiply-xorshift hash,
//! five word compares and a check word, with no call.
//!
//! The rules that keep the two one table:
//! - **A write goes to both.** Remembering a flow inserts it into the LRU hash and puts it in its
//!   slot.
//! - **The cache is looked up first and wins.** A slot holds the last decision written for its
//!   key; the LRU hash holds it too, unless it aged out there while the flow was served from the
//!   cache (cache hits do not touch the LRU's recency).
//! - **Nothing is lost when a slot changes hands.** A flow that takes an occupied slot first
//!   writes the occupant back into the LRU hash if the occupant is still good, so a flow served
//!   from the cache never falls back to a hash that has forgotten it. The write-back only ever
//!   adds a missing entry (`BPF_NOEXIST`): an entry another CPU wrote meanwhile is newer than
//!   the slot's copy and is never replaced by it.
//! - **The slot goes to the flow that uses it (a second chance, as a CLOCK cache gives).** A
//!   new decision always takes its slot. A flow found only in the LRU hash takes its slot if
//!   the slot is empty, its occupant is no longer good, or its occupant has not forwarded a
//!   packet since a flow found only in the LRU hash last asked for the slot: each slot has a
//!   use mark (`FlowCacheEntry::_pad`), set when its entry forwards a packet and when it is
//!   written, and cleared by an ask. One in `ASK_ONE_IN` of such packets asks (a random draw):
//!   the mark is written only then and at the occupant's next packet, not twice per packet
//!   when two active flows share a slot (with many flows every slot write is a dirty cache
//!   line). So a flow that lost its slot to one that then went idle gets it back within a few
//!   packets (`ASK_ONE_IN` on average, plus one), instead of paying the LRU hash for as long as
//!   the idle flow's pair stands, and two active flows on one slot do not evict each other on
//!   every packet (the occupant keeps the slot while it forwards a packet between asks).
//! - **Slots are read without a lock.** Another CPU may be rewriting a slot while it is read:
//!   the check word binds the value to the key's 64-bit hash, so words of two different entries
//!   fail it and the packet falls back to the LRU hash. Values and checks are read once.
use lb_common::{
    BACKEND_F_IN_SET, BACKEND_F_MOVED, BackendInfo, FLOW_F_CLIENT_CLOSED, FlowCacheEntry, FlowKey,
    FlowValue, LbConfig, flow_cache_check, flow_cache_hash, flow_cache_index, flow_cache_seed,
    moved_to,
};

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_get_prandom_u32};

use crate::maps::{LB_BACKENDS, LB_CONNTRACK, LB_FLOW_CACHE_V2};

/// A flow's place in the cache: its slot (if the cache is there) and its key's hash.
pub struct Slot {
    /// Null without a cache (no configuration yet, or an index past its end).
    entry: *mut FlowCacheEntry,
    hash: u64,
}

#[inline(always)]
pub fn slot(cfg: Option<&LbConfig>, flow: &FlowKey) -> Slot {
    match cfg {
        Some(cfg) => slot_at(cfg, flow_cache_hash(flow, seed(cfg))),
        None => Slot {
            entry: core::ptr::null_mut(),
            hash: 0,
        },
    }
}

/// The slot of a key whose hash is `hash` (an inlined array lookup, no hashing).
#[inline(always)]
pub fn slot_at(cfg: &LbConfig, hash: u64) -> Slot {
    Slot {
        entry: LB_FLOW_CACHE_V2
            .get_ptr_mut(flow_cache_index(hash, cfg.flow_cache))
            .unwrap_or(core::ptr::null_mut()),
        hash,
    }
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

/// The flow's entry: from its cache slot if the slot holds it, else from the LRU hash.
#[inline(always)]
pub fn lookup(slot: &Slot, flow: &FlowKey) -> Option<(FlowValue, Found)> {
    if !slot.entry.is_null()
        && let Some(v) = cached(slot.entry, flow, slot.hash)
    {
        return Some((v, Found::Cache));
    }
    table_only(flow)
}

/// The flow's entry in the LRU hash (its cache slot is known not to hold it).
#[inline(always)]
pub fn table_only(flow: &FlowKey) -> Option<(FlowValue, Found)> {
    let v = unsafe { *LB_CONNTRACK.get_ptr(flow)? };
    Some((v, Found::Table))
}

/// What the fast path learned about a flow before leaving it to the full path: its key's hash
/// and what its slot held for it, so that the full path, which builds the same key from the
/// same headers, neither hashes nor compares the slot again. Two words: the program's stack
/// is near its limit.
pub struct Hint {
    hash: u64,
    /// The packed value the slot held for the flow, or `NOT_CACHED`.
    cached: u64,
}

/// `Hint::cached` when the slot did not hold the flow. No entry holds it: backend id
/// `u32::MAX` names no pair (`MAX_BACKENDS` is far below), so such a value is stale anyway.
const NOT_CACHED: u64 = u64::MAX;

impl Hint {
    #[inline(always)]
    pub fn new(slot: &Slot, cached: Option<FlowValue>) -> Hint {
        Hint {
            hash: slot.hash,
            cached: cached.map_or(NOT_CACHED, pack),
        }
    }

    /// The flow's slot and its entry, as `slot` and `lookup` would give them.
    #[inline(always)]
    pub fn found(&self, cfg: &LbConfig, flow: &FlowKey) -> (Slot, Option<(FlowValue, Found)>) {
        let slot = slot_at(cfg, self.hash);
        if self.cached != NOT_CACHED {
            return (slot, Some((unpack(self.cached), Found::Cache)));
        }
        (slot, table_only(flow))
    }
}

/// The flow's entry if its cache slot holds it (the fast path; a miss takes the full path).
#[inline(always)]
pub fn cached_only(slot: &Slot, flow: &FlowKey) -> Option<FlowValue> {
    if slot.entry.is_null() {
        return None;
    }
    cached(slot.entry, flow, slot.hash)
}

/// The slot's value if it holds `flow` and its check word matches. Read in the reverse of the
/// order `put` writes (check, value, then the key): on a CPU that keeps stores and loads in
/// order (x86) a reader that sees any word of a new entry then sees the rest of it too, so a
/// mixed read never passes the key compare with another entry's value; on others the check
/// word, keyed by this node's secret seed, is what fails.
#[inline(always)]
fn cached(e: *mut FlowCacheEntry, flow: &FlowKey, hash: u64) -> Option<FlowValue> {
    // SAFETY: a map value of the array; the words are plain integers.
    unsafe {
        let check = core::ptr::addr_of!((*e).check).read_volatile();
        let value = core::ptr::addr_of!((*e).value).read_volatile();
        let have = &(*e).key as *const FlowKey as *const u64;
        let want = flow as *const FlowKey as *const u64;
        // Ports, protocol and family first: they differ most often between flows of a slot.
        for i in [4, 3, 2, 1, 0] {
            if have.add(i).read_volatile() != want.add(i).read() {
                return None;
            }
        }
        (check == flow_cache_check(hash, value)).then_some(value)
    }
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

/// The slot's use mark (see the module's rules): its entry forwarded a packet, or was written,
/// since a flow found only in the LRU hash last asked for the slot.
const USED: u64 = 1;

/// One in this many packets of a flow found only in the LRU hash, whose slot's occupant is in
/// use, asks for the slot (a power of two).
const ASK_ONE_IN: u32 = 8;

/// The slot's entry forwarded a packet: set its use mark (a store only when it was clear, so
/// a flow forwarding from its slot does not write the slot's line on every packet).
#[inline(always)]
pub fn touch(slot: &Slot) {
    if slot.entry.is_null() {
        return;
    }
    // SAFETY: a map value of the array; the word is a plain integer.
    unsafe {
        let mark = core::ptr::addr_of_mut!((*slot.entry)._pad);
        if mark.read_volatile() != USED {
            mark.write_volatile(USED);
        }
    }
}

/// A good entry found only in the LRU hash takes its slot if the slot is free: empty, holding
/// this flow unusably (torn), holding another flow whose pair no longer stands, or holding
/// one that has not used the slot since the last ask (whose entry is written back first).
#[inline(always)]
pub fn promote(cfg: &LbConfig, slot: &Slot, flow: &FlowKey, value: FlowValue) {
    if !slot.entry.is_null() && claim(slot.entry, flow) {
        take(slot.entry, slot.hash, flow, pack(value), cfg);
    }
}

/// Mark a flow's entry closed by the client (`FLOW_F_CLIENT_CLOSED`) where it was found: the
/// LRU hash's copy in place (a word store: no insert, which could evict another entry), and
/// the slot when the slot holds it. Returns the marked value.
#[inline(always)]
pub fn mark_closed(slot: &Slot, flow: &FlowKey, at: Found, value: FlowValue) -> FlowValue {
    let closed = value.closed();
    if let Some(p) = LB_CONNTRACK.get_ptr_mut(flow) {
        // SAFETY: a map value of the hash; the word is a plain integer.
        unsafe {
            let id = core::ptr::addr_of_mut!((*p).backend_id);
            id.write_volatile(id.read_volatile() | FLOW_F_CLIENT_CLOSED);
        }
    }
    if at == Found::Cache && !slot.entry.is_null() {
        put(slot.entry, flow, closed, slot.hash);
    }
    closed
}

/// Remember a flow's decision: in the LRU hash and in its slot. A good occupant of another
/// flow is written back to the LRU hash first.
#[inline(always)]
pub fn remember(cfg: Option<&LbConfig>, slot: &Slot, flow: &FlowKey, value: FlowValue) {
    let _ = LB_CONNTRACK.insert(flow, value, 0);
    if let Some(cfg) = cfg
        && !slot.entry.is_null()
    {
        take(slot.entry, slot.hash, flow, pack(value), cfg);
    }
}

#[inline(always)]
fn pack(v: FlowValue) -> u64 {
    ((v.backend_id as u64) << 32) | v.epoch as u64
}

// Subprograms of at most five arguments: their stack (the occupant's copy) is not added to the caller's,
// whose frame is near the limit.

#[inline(always)]
fn unpack(v: u64) -> FlowValue {
    FlowValue {
        backend_id: (v >> 32) as u32,
        epoch: v as u32,
    }
}

/// Put `flow` in slot `e`, writing a good occupant of another flow back to the LRU hash.
#[inline(never)]
fn take(e: *mut FlowCacheEntry, hash: u64, flow: &FlowKey, value: u64, cfg: &LbConfig) {
    if let Some((key, v)) = occupant(seed(cfg), e)
        && key != *flow
    {
        // Usually still there (written with it; the lookup refreshes it): a lookup costs far
        // less than an insert into a full LRU hash. An entry there, whatever it holds, is kept:
        // it may be newer than this copy.
        if LB_CONNTRACK.get_ptr(&key).is_none() {
            let _ = LB_CONNTRACK.insert(&key, v, BPF_NOEXIST as u64);
        }
    }
    put(e, flow, unpack(value), hash);
}

/// May a flow found only in the LRU hash take slot `e`? Yes if no other flow whose pair still
/// stands is there, or if the one there has not used the slot since the last ask; an occupant
/// that has keeps the slot, and is asked (its use mark cleared) one time in `ASK_ONE_IN`. No check word is needed for
/// this (a torn occupant only means the flow is not promoted now), so a hit in the LRU hash
/// whose slot is in use costs no hashing.
#[inline(never)]
fn claim(e: *mut FlowCacheEntry, flow: &FlowKey) -> bool {
    // SAFETY: a map value of the array.
    let (family, v) = unsafe {
        (
            core::ptr::addr_of!((*e).key.family).read_volatile(),
            core::ptr::addr_of!((*e).value).read_volatile(),
        )
    };
    if family == 0 || cached_key(e) == *flow || entry_backend(&v).is_none() {
        return true;
    }
    // SAFETY: as above; the helper has no preconditions.
    unsafe {
        let mark = core::ptr::addr_of_mut!((*e)._pad);
        if mark.read_volatile() == USED {
            if bpf_get_prandom_u32() & (ASK_ONE_IN - 1) == 0 {
                mark.write_volatile(0);
            }
            return false;
        }
    }
    true
}

/// The slot's key, copied word by word to the stack.
#[inline(always)]
fn cached_key(e: *mut FlowCacheEntry) -> FlowKey {
    // SAFETY: a map value of the array; every bit pattern is a FlowKey.
    unsafe {
        let mut key = FlowKey::default();
        let from = &(*e).key as *const FlowKey as *const u64;
        let to = &mut key as *mut FlowKey as *mut u64;
        for i in 0..5 {
            to.add(i).write(from.add(i).read_volatile());
        }
        key
    }
}

/// The slot's occupant, copied, if it is a good entry (check holds, pair still stands).
#[inline(always)]
fn occupant(seed: u64, e: *mut FlowCacheEntry) -> Option<(FlowKey, FlowValue)> {
    let key = cached_key(e);
    if key.family == 0 {
        return None;
    }
    let value = cached(e, &key, flow_cache_hash(&key, seed))?;
    entry_backend(&value)?;
    Some((key, value))
}

#[inline(always)]
fn put(e: *mut FlowCacheEntry, flow: &FlowKey, value: FlowValue, hash: u64) {
    // SAFETY: a map value of the array. Word stores: the key, the value, then the check (see
    // `cached` for why the order matters). A new occupant starts with its use mark set.
    unsafe {
        let from = flow as *const FlowKey as *const u64;
        let to = &mut (*e).key as *mut FlowKey as *mut u64;
        for i in 0..5 {
            to.add(i).write_volatile(from.add(i).read());
        }
        core::ptr::addr_of_mut!((*e)._pad).write_volatile(USED);
        core::ptr::addr_of_mut!((*e).value).write_volatile(value);
        core::ptr::addr_of_mut!((*e).check).write_volatile(flow_cache_check(hash, value));
    }
}
