//! The flow cache's line layout (`maps::FLOW_CACHE`), shared by the XDP program (lb-ebpf
//! `flows`, which reads and writes the words in place), user space (which lists the cached
//! flows) and the tests.
//!
//! A line is 64 bytes, one cache line (the map is `BPF_F_MMAPABLE`, so its values start on a
//! page; a plain array's start 56 bytes into a line). It holds two IPv4 entries (ways 0 and 1,
//! 32 bytes each) or one IPv6 entry, so a flow's whole set is read with one cache miss:
//! - an IPv4 way, words `4w..4w + 4`: the tail word, both addresses (`v4_addrs`), the value
//!   (`value_word`) and the check word (`flow_cache_check`);
//! - an IPv6 line, words 0..8: the tail word, the source (two words), the destination (two),
//!   the value, the check word, and a word not used.
//!
//! The tail word is the flow key's last word (ports, protocol, family; `tail_word`) in its low
//! 48 bits, the way's use mark in byte 6 (`MARK_BYTE`) and, in way 0's only, the line's
//! last-written way in byte 7 (`LAST_BYTE`). Way 0's family byte tells the line's form:
//! `FAMILY_V6` for an IPv6 line, else two IPv4 ways (each empty while its family is 0).
use crate::{FAMILY_V4, FAMILY_V6, FlowKey, FlowValue, flow_cache_check, flow_cache_hash};

/// One line of the flow cache (see the module).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowCacheLine {
    pub w: [u64; 8],
}
const _: () = assert!(size_of::<FlowCacheLine>() == 64);

/// Words of an IPv4 way; way `w` starts at word `WAY_WORDS * w`.
pub const WAY_WORDS: usize = 4;
/// Word offsets inside an IPv4 way.
pub const V4_ADDRS: usize = 1;
pub const V4_VALUE: usize = 2;
pub const V4_CHECK: usize = 3;
/// Word offsets of an IPv6 line (the source at 1 and 2, the destination at 3 and 4).
pub const V6_SRC: usize = 1;
pub const V6_VALUE: usize = 5;
pub const V6_CHECK: usize = 6;
/// Byte offsets inside a tail word (little-endian: the key's bytes 32..38 come first).
pub const MARK_BYTE: usize = 6;
pub const LAST_BYTE: usize = 7;
/// The key's part of a tail word.
pub const TAIL_KEY_MASK: u64 = (1 << 48) - 1;
const FAMILY_SHIFT: u32 = 40;

/// The key's part of its tail word: its fifth 64-bit word (sport, dport, protocol, family,
/// with the padding bytes left out).
#[inline(always)]
pub fn tail_word(key: &FlowKey) -> u64 {
    key_words(key)[4] & TAIL_KEY_MASK
}

/// Do a stored tail word's key bytes equal `tail` (`tail_word` of a key)? The mark and
/// last-written bytes are not part of the key.
#[inline(always)]
pub fn tail_matches(stored: u64, tail: u64) -> bool {
    (stored ^ tail) << 16 == 0
}

/// The family a tail word names (0: an empty way).
#[inline(always)]
pub fn tail_family(tail: u64) -> u8 {
    (tail >> FAMILY_SHIFT) as u8
}

/// An IPv4 key's two addresses in one word: the source in the low half, the destination in the
/// high one (their bytes in memory order).
#[inline(always)]
pub fn v4_addrs(key: &FlowKey) -> u64 {
    let k = key_words(key);
    (k[0] & 0xffff_ffff) | (k[2] << 32)
}

/// The IPv4 key of a way's tail word (key bytes only) and addresses word (`v4_addrs`).
#[inline(always)]
pub fn v4_key(tail: u64, addrs: u64) -> FlowKey {
    key_of_words([addrs & 0xffff_ffff, 0, addrs >> 32, 0, tail])
}

/// A value as the slot holds it: `FlowValue`'s own bytes read as one word.
#[inline(always)]
pub fn value_word(v: FlowValue) -> u64 {
    v.backend_id as u64 | (v.epoch as u64) << 32
}

#[inline(always)]
pub fn value_of(w: u64) -> FlowValue {
    FlowValue {
        backend_id: w as u32,
        epoch: (w >> 32) as u32,
    }
}

/// A flow key's five 64-bit words.
#[inline(always)]
pub fn key_words(key: &FlowKey) -> &[u64; 5] {
    // SAFETY: FlowKey is `#[repr(C, align(8))]`, 40 bytes of plain integers.
    unsafe { &*(key as *const FlowKey as *const [u64; 5]) }
}

/// The flow key of five 64-bit words.
#[inline(always)]
pub fn key_of_words(w: [u64; 5]) -> FlowKey {
    // SAFETY: as above; every bit pattern is a FlowKey.
    unsafe { core::mem::transmute(w) }
}

impl FlowCacheLine {
    /// Does the line hold one IPv6 entry (rather than two IPv4 ways)?
    pub fn is_v6(&self) -> bool {
        tail_family(self.w[0]) == FAMILY_V6
    }

    /// The key stored in way `way` (0 or 1; an IPv6 line's entry is way 0), whatever its check
    /// word says; `None` for an empty way.
    pub fn key(&self, way: usize) -> Option<FlowKey> {
        if self.is_v6() {
            if way != 0 {
                return None;
            }
            let w = &self.w;
            return Some(key_of_words([w[1], w[2], w[3], w[4], w[0] & TAIL_KEY_MASK]));
        }
        let b = WAY_WORDS * (way & 1);
        let tail = self.w[b] & TAIL_KEY_MASK;
        if tail_family(tail) != FAMILY_V4 {
            return None;
        }
        Some(v4_key(tail, self.w[b + V4_ADDRS]))
    }

    /// The value and check word stored in way `way`.
    pub fn value(&self, way: usize) -> (FlowValue, u64) {
        if self.is_v6() {
            return (value_of(self.w[V6_VALUE]), self.w[V6_CHECK]);
        }
        let b = WAY_WORDS * (way & 1);
        (value_of(self.w[b + V4_VALUE]), self.w[b + V4_CHECK])
    }

    /// Way `way`'s use mark.
    pub fn marked(&self, way: usize) -> bool {
        let b = if self.is_v6() {
            0
        } else {
            WAY_WORDS * (way & 1)
        };
        (self.w[b] >> (8 * MARK_BYTE)) & 0xff != 0
    }

    /// The entries whose check word binds their value to their key under `seed`
    /// (`flow_cache_seed`), with their way: what the program would trust.
    pub fn entries(&self, seed: u64) -> impl Iterator<Item = (usize, FlowKey, FlowValue)> + '_ {
        (0..2).filter_map(move |way| {
            let key = self.key(way)?;
            let (value, check) = self.value(way);
            (flow_cache_check(flow_cache_hash(&key, seed), value) == check)
                .then_some((way, key, value))
        })
    }

    /// The way holding `key` (check word not verified).
    pub fn way_of(&self, key: &FlowKey) -> Option<usize> {
        (0..2).find(|&w| self.key(w).as_ref() == Some(key))
    }

    /// Write `key`'s entry into way `way` as the program does (use mark set), with the check
    /// word for `seed`; an IPv6 key takes the whole line, an IPv4 key on an IPv6 line way 0
    /// (way 1 then empty).
    pub fn put(&mut self, way: usize, key: &FlowKey, value: FlowValue, seed: u64) {
        let check = flow_cache_check(flow_cache_hash(key, seed), value);
        let mark = 1u64 << (8 * MARK_BYTE);
        let k = key_words(key);
        if key.family == FAMILY_V6 {
            self.w = [
                tail_word(key) | mark,
                k[0],
                k[1],
                k[2],
                k[3],
                value_word(value),
                check,
                0,
            ];
            return;
        }
        let way = if self.is_v6() {
            self.w[WAY_WORDS] = 0;
            0
        } else {
            way & 1
        };
        let b = WAY_WORDS * way;
        let last = (way as u64) << (8 * LAST_BYTE);
        if way == 0 {
            self.w[0] = tail_word(key) | mark;
        } else {
            self.w[b] = tail_word(key) | mark;
            self.w[0] = (self.w[0] & !(0xff << (8 * LAST_BYTE))) | last;
        }
        self.w[b + V4_ADDRS] = v4_addrs(key);
        self.w[b + V4_VALUE] = value_word(value);
        self.w[b + V4_CHECK] = check;
    }
}
