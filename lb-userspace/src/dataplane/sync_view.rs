//! What the connection sync (`daemon/sync.rs`) reads and writes: the installed services as a
//! [`View`], and the pinned connection table through descriptors of its own (walked beside the
//! owner, as the count in `daemon/conntrack.rs` is).

use std::{os::fd::AsFd, path::Path, sync::Arc};

use anyhow::{Result, bail};
use aya::maps::{Array, HashMap as BpfHashMap, IterableMap, Map, MapData};
use lb_common::{
    FlowCacheLine, FlowKey, FlowValue, LbConfig, V4_VALUE, V6_VALUE, WAY_WORDS, flow_cache_hash,
    flow_cache_index, flow_cache_seed, maps,
};

use super::{Dataplane, tables::Mapping};
use crate::sync::view::{Pair, Service, View};

impl Dataplane {
    /// The services as installed now, with their live tables.
    pub fn sync_view(&self) -> View {
        let mut services: Vec<Service> = self
            .services
            .iter()
            .map(|(key, s)| Service {
                key: *key,
                owned: s.owned,
                table: Arc::new(s.table.clone()),
                pairs: s
                    .backends
                    .iter()
                    .map(|(addr, b)| Pair {
                        addr: *addr,
                        id: b.id,
                        epoch: b.epoch,
                        in_set: b.spec.in_set(),
                        aliases: b.aliases.clone(),
                    })
                    .collect(),
                // Climbing through slow start: the step is this node's own.
                share_all: s
                    .backends
                    .values()
                    .any(|b| b.spec.in_table() && b.spec.step < crate::plan::SLOW_START_STEPS),
            })
            .collect();
        services.sort_by_key(|s| (s.key.addr, s.key.port, s.key.proto));
        View {
            hash_seed: self.opts.hash_seed,
            services,
        }
    }
}

/// The pinned flow cache, opened by path and mapped read-only (the array is
/// `BPF_F_MMAPABLE`), read as the program reads it: a walk of all its lines is a walk of
/// memory, not one syscall per line (131,072 lines take about half a second that way, and the
/// connection sync's scan is what a peer waits for after a table change).
pub struct FlowCachePins {
    mem: Mapping,
    lines: usize,
    config: Array<MapData, LbConfig>,
}

impl FlowCachePins {
    pub fn open(pin_dir: &Path) -> Result<FlowCachePins> {
        Self::open_mapped(pin_dir, false)
    }

    /// As `open`, mapped writable too: for [`FlowCachePins::invalidate_if`].
    pub fn open_writable(pin_dir: &Path) -> Result<FlowCachePins> {
        Self::open_mapped(pin_dir, true)
    }

    fn open_mapped(pin_dir: &Path, writable: bool) -> Result<FlowCachePins> {
        let data = MapData::from_pin(pin_dir.join(maps::FLOW_CACHE))?;
        let info = data.info()?;
        let line = std::mem::size_of::<FlowCacheLine>();
        if info.value_size() as usize != line {
            bail!(
                "{}: value size {} is not a flow cache line ({line} bytes)",
                maps::FLOW_CACHE,
                info.value_size()
            );
        }
        let lines = info.max_entries() as usize;
        let mem = Mapping::new(&data, maps::FLOW_CACHE, lines * line, writable)?;
        let config = Array::try_from(Map::Array(MapData::from_pin(pin_dir.join(maps::CONFIG))?))?;
        Ok(FlowCachePins { mem, lines, config })
    }

    /// Line `i`, each word read once (a CPU may be rewriting it: the check words tell).
    fn line(&self, i: usize) -> FlowCacheLine {
        let words = self.mem.ptr().cast::<u64>();
        let mut line = FlowCacheLine { w: [0; 8] };
        for (j, w) in line.w.iter_mut().enumerate() {
            // SAFETY: i < lines, so the word is inside the mapping; u64-aligned (page start).
            *w = unsafe { words.add(i * 8 + j).read_volatile() };
        }
        line
    }

    /// Every entry the program would trust, line by line, until `f` returns false: an empty
    /// way, or one read while a CPU rewrote it (its check word does not bind the value to the
    /// key under the node's seed), is skipped as the data plane skips it.
    pub fn for_each(&self, mut f: impl FnMut(FlowKey, FlowValue) -> bool) -> Result<()> {
        let cfg = self.config.get(&0, 0)?;
        let seed = flow_cache_seed(cfg.hash_seed, cfg.flow_cache);
        for i in 0..self.lines {
            for (_, k, v) in self.line(i).entries(seed) {
                if !f(k, v) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

impl FlowCachePins {
    /// Where the program would find `key`'s entry: its home line or the buddy, the way, and
    /// the value its check word binds to it.
    fn find(&self, key: &FlowKey) -> Result<Option<(usize, FlowCacheLine, usize, FlowValue)>> {
        let cfg = self.config.get(&0, 0)?;
        let seed = flow_cache_seed(cfg.hash_seed, cfg.flow_cache);
        let home = flow_cache_index(flow_cache_hash(key, seed), cfg.flow_cache) as usize;
        for i in [home, home ^ 1] {
            if i >= self.lines {
                continue;
            }
            let line = self.line(i);
            if let Some((way, _, v)) = line.entries(seed).find(|(_, k, _)| k == key) {
                return Ok(Some((i, line, way, v)));
            }
        }
        Ok(None)
    }

    /// The flow's entry in the cache, as the program would read it (which then decides: the
    /// LRU hash is not looked at).
    pub fn get(&self, key: &FlowKey) -> Result<Option<FlowValue>> {
        Ok(self.find(key)?.map(|(_, _, _, v)| v))
    }

    /// Take the flow's entry out of the cache if it names `value`'s pair (closed or not): its
    /// value word cleared, one store (the check word then fails, as a torn way's does, and the
    /// pair of epoch 0 is no pair: the way is free). `Ok(true)`: it did. The mapping must be
    /// writable (`open_writable`).
    pub fn invalidate_if(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        let Some((i, line, way, now)) = self.find(key)? else {
            return Ok(false);
        };
        if now.backend() != value.backend() || now.epoch != value.epoch {
            return Ok(false);
        }
        let word = if line.is_v6() {
            V6_VALUE
        } else {
            WAY_WORDS * way + V4_VALUE
        };
        // SAFETY: i < lines, so the word is inside the (writable) mapping.
        unsafe {
            self.mem
                .ptr()
                .cast::<u64>()
                .add(i * 8 + word)
                .write_volatile(0)
        };
        Ok(true)
    }
}

/// The pinned connection table's LRU hash, opened by path.
pub struct LruPins {
    map: BpfHashMap<MapData, FlowKey, FlowValue>,
}

impl LruPins {
    /// `pin`: the map's pin (`<pin dir>/` [`maps::CONNTRACK`]).
    pub fn open(pin: &Path) -> Result<LruPins> {
        let map = BpfHashMap::try_from(Map::LruHashMap(MapData::from_pin(pin)?))?;
        Ok(LruPins { map })
    }

    /// Every entry, until `f` returns false: in batches of thousands per syscall where the
    /// kernel has them (`batch`), else key by key (an entry evicted between its key and its
    /// value is skipped).
    pub fn for_each(&self, mut f: impl FnMut(&FlowKey, &FlowValue) -> bool) -> Result<()> {
        let fd = self.map.map().fd().as_fd();
        if super::batch::for_each::<FlowKey, FlowValue>(fd, &mut f)? {
            return Ok(());
        }
        for k in self.map.keys() {
            let Ok(k) = k else { continue };
            let Ok(v) = self.map.get(&k, 0) else { continue };
            if !f(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    /// Add an entry unless the table has one for the flow (`BPF_NOEXIST`): what this node
    /// decided itself is never replaced. `Ok(false)`: one was there.
    pub fn insert_absent(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        const BPF_NOEXIST: u64 = 1;
        match self.map.insert(key, value, BPF_NOEXIST) {
            Ok(()) => Ok(true),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Remove the flow's entry if it names `value`'s pair (closed or not). `Ok(true)`: removed.
    pub fn remove_if(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        let Ok(now) = self.map.get(key, 0) else {
            return Ok(false);
        };
        if now.backend() != value.backend() || now.epoch != value.epoch {
            return Ok(false);
        }
        match self.map.remove(key) {
            Ok(()) => Ok(true),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The pinned connection table, opened by path: the LRU hash and the flow cache.
pub struct ConntrackPins {
    lru: LruPins,
    cache: FlowCachePins,
}

impl ConntrackPins {
    pub fn open(pin_dir: &Path) -> Result<ConntrackPins> {
        let lru = LruPins::open(&pin_dir.join(maps::CONNTRACK))?;
        let cache = FlowCachePins::open_writable(pin_dir)?;
        Ok(ConntrackPins { lru, cache })
    }

    /// Every entry that passes `keep`, from the LRU hash and the flow cache (a long-lived flow
    /// served from the cache may have aged out of the LRU hash), at most `limit`; from the
    /// cache, what the program would trust (`FlowCachePins::for_each`).
    pub fn scan(
        &self,
        limit: usize,
        mut keep: impl FnMut(&FlowKey, &FlowValue) -> bool,
    ) -> Result<Vec<(FlowKey, FlowValue)>> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut add = |k: &FlowKey, v: &FlowValue| {
            if out.len() >= limit {
                return false;
            }
            if keep(k, v) && seen.insert(*k) {
                out.push((*k, *v));
            }
            true
        };
        // The cache first: where it holds a flow, its entry is what the program decides.
        self.cache.for_each(|k, v| add(&k, &v))?;
        self.lru.for_each(&mut add)?;
        Ok(out)
    }

    /// [`LruPins::insert_absent`], unless the flow cache holds an entry for the flow (the
    /// cache decides, and a flow served from it may have aged out of the LRU hash): what this
    /// node decided itself is never replaced, nor hidden behind a copy the program would
    /// write back over it.
    pub fn insert_absent(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        if self.cache.get(key)?.is_some() {
            return Ok(false);
        }
        self.lru.insert_absent(key, value)
    }

    /// A peer's closed record for a flow of a service this node forwards too (BGP, where the
    /// client's segments may reach either node): this node's own entry stands, but where it
    /// names the record's pair and is still open, the client closed the flow through the peer,
    /// so it is closed as the peer saw it (its end, and its time set back by the close's age).
    /// A SYN reusing the 5-tuple after the hold is then placed afresh here too, not sent to
    /// the pair whatever became of it. Another pair, an entry closed already (its own close
    /// and time stand) or none (see [`ConntrackPins::insert_absent`]) are left as they are.
    /// The program decides from the cache first: its copy is the one looked at, taken out
    /// and the closed entry written to the LRU hash, as [`ConntrackPins::correct`] does.
    /// `Ok(true)`: closed.
    pub fn close_same(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        if !value.client_closed() {
            return Ok(false);
        }
        let cached = self.cache.get(key)?;
        let held = cached.or_else(|| self.lru.map.get(key, 0).ok());
        let open_same_pair = |v: &FlowValue| {
            v.backend() == value.backend() && v.epoch == value.epoch && !v.client_closed()
        };
        if !held.as_ref().is_some_and(open_same_pair) {
            return Ok(false);
        }
        if let Some(c) = cached {
            self.cache.invalidate_if(key, c)?;
        }
        const BPF_ANY: u64 = 0;
        self.lru.map.insert(key, value, BPF_ANY)?;
        Ok(true)
    }

    /// A peer's record for a flow of a service this node does not forward: the peer forwards
    /// it and its entry is the current one, so an entry held here naming another pair (a
    /// lost retraction, a backend change between two of the peer's scans, an entry from when
    /// this node forwarded), or open where the peer's is closed or the reverse, or closed at
    /// another end, is replaced, in the LRU hash, and taken out of the flow cache. A close
    /// held with the same end keeps its time (a full send repeats the close with its age).
    /// `Ok(true)`: written (new or replaced); `Ok(false)`: it held that pair so already.
    pub fn correct(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        let same = |v: &FlowValue| {
            v.backend() == value.backend()
                && v.epoch == value.epoch
                && v.client_closed() == value.client_closed()
                && (!v.client_closed() || v.close_seq() == value.close_seq())
        };
        let cached = self.cache.get(key)?;
        if let Some(c) = cached
            && !same(&c)
        {
            self.cache.invalidate_if(key, c)?;
        }
        let held = self.lru.map.get(key, 0).ok();
        if held.as_ref().is_some_and(same) || (held.is_none() && cached.as_ref().is_some_and(same))
        {
            return Ok(false);
        }
        const BPF_ANY: u64 = 0;
        self.lru.map.insert(key, value, BPF_ANY)?;
        Ok(true)
    }

    /// [`LruPins::remove_if`], and the same in the flow cache ([`FlowCachePins::invalidate_if`]):
    /// a way left holding the entry would keep deciding, and be written back to the LRU hash
    /// when it changes hands. The program moves an entry between the two while this runs (a
    /// hit in the LRU hash copied into a free way, a way that changes hands written back), so
    /// no order of the two removals is enough: both are repeated until a round finds the entry
    /// in neither (at most `REMOVE_ROUNDS`; a round is two or three syscalls, a packet's move a
    /// few map operations).
    pub fn remove_if(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        let mut removed = false;
        for _ in 0..REMOVE_ROUNDS {
            let cache = self.cache.invalidate_if(key, value)?;
            let lru = self.lru.remove_if(key, value)?;
            if !cache && !lru {
                break;
            }
            removed = true;
        }
        Ok(removed)
    }
}

/// [`ConntrackPins::remove_if`]'s bound: a flow the program keeps moving between the tables for
/// this many rounds is forwarded meanwhile (the entry then stays until a later retraction).
const REMOVE_ROUNDS: usize = 4;
