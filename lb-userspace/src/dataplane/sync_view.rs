//! What the connection sync (`daemon/sync.rs`) reads and writes: the installed services as a
//! [`View`], and the pinned connection table through descriptors of its own (walked beside the
//! owner, as the count in `daemon/conntrack.rs` is).

use std::{path::Path, sync::Arc};

use anyhow::Result;
use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};
use lb_common::{FlowCacheLine, FlowKey, FlowValue, LbConfig, flow_cache_seed, maps};

use super::Dataplane;
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
            })
            .collect();
        services.sort_by_key(|s| (s.key.addr, s.key.port, s.key.proto));
        View {
            hash_seed: self.opts.hash_seed,
            services,
        }
    }
}

/// The pinned flow cache, opened by path, read as the program reads it.
pub struct FlowCachePins {
    cache: Array<MapData, FlowCacheLine>,
    config: Array<MapData, LbConfig>,
}

impl FlowCachePins {
    pub fn open(pin_dir: &Path) -> Result<FlowCachePins> {
        let cache = Array::try_from(Map::Array(MapData::from_pin(
            pin_dir.join(maps::FLOW_CACHE),
        )?))?;
        let config = Array::try_from(Map::Array(MapData::from_pin(pin_dir.join(maps::CONFIG))?))?;
        Ok(FlowCachePins { cache, config })
    }

    /// Every entry the program would trust, line by line, until `f` returns false: an empty
    /// way, or one read while a CPU rewrote it (its check word does not bind the value to the
    /// key under the node's seed), is skipped as the data plane skips it.
    pub fn for_each(&self, mut f: impl FnMut(FlowKey, FlowValue) -> bool) -> Result<()> {
        let cfg = self.config.get(&0, 0)?;
        let seed = flow_cache_seed(cfg.hash_seed, cfg.flow_cache);
        for i in 0..self.cache.len() {
            let Ok(line) = self.cache.get(&i, 0) else {
                continue;
            };
            for (_, k, v) in line.entries(seed) {
                if !f(k, v) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The pinned connection table, opened by path.
pub struct ConntrackPins {
    lru: BpfHashMap<MapData, FlowKey, FlowValue>,
    cache: FlowCachePins,
}

impl ConntrackPins {
    pub fn open(pin_dir: &Path) -> Result<ConntrackPins> {
        let lru = BpfHashMap::try_from(Map::LruHashMap(MapData::from_pin(
            pin_dir.join(maps::CONNTRACK),
        )?))?;
        let cache = FlowCachePins::open(pin_dir)?;
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
        for k in self.lru.keys() {
            if out.len() >= limit {
                return Ok(out);
            }
            let Ok(k) = k else { continue };
            // Gone since the key was listed: nothing to share.
            let Ok(v) = self.lru.get(&k, 0) else { continue };
            if keep(&k, &v) && seen.insert(k) {
                out.push((k, v));
            }
        }
        self.cache.for_each(|k, v| {
            if out.len() >= limit {
                return false;
            }
            if keep(&k, &v) && seen.insert(k) {
                out.push((k, v));
            }
            true
        })?;
        Ok(out)
    }

    /// Add an entry unless the table has one for the flow (`BPF_NOEXIST`): what this node
    /// decided itself is never replaced. `Ok(false)`: one was there.
    pub fn insert_absent(&mut self, key: &FlowKey, value: FlowValue) -> Result<bool> {
        const BPF_NOEXIST: u64 = 1;
        match self.lru.insert(key, value, BPF_NOEXIST) {
            Ok(()) => Ok(true),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}
