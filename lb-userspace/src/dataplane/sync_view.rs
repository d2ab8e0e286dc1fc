//! What the connection sync (`daemon/sync.rs`) reads and writes: the installed services as a
//! [`View`], and the pinned connection table through descriptors of its own (walked beside the
//! owner, as the count in `daemon/conntrack.rs` is).

use std::{path::Path, sync::Arc};

use anyhow::Result;
use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};
use lb_common::{
    FlowCacheEntry, FlowKey, FlowValue, LbConfig, flow_cache_check, flow_cache_hash,
    flow_cache_seed, maps,
};

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

/// The pinned connection table, opened by path.
pub struct ConntrackPins {
    lru: BpfHashMap<MapData, FlowKey, FlowValue>,
    cache: Array<MapData, FlowCacheEntry>,
    config: Array<MapData, LbConfig>,
}

impl ConntrackPins {
    pub fn open(pin_dir: &Path) -> Result<ConntrackPins> {
        let lru = BpfHashMap::try_from(Map::LruHashMap(MapData::from_pin(
            pin_dir.join(maps::CONNTRACK),
        )?))?;
        let cache = Array::try_from(Map::Array(MapData::from_pin(
            pin_dir.join(maps::FLOW_CACHE),
        )?))?;
        let config = Array::try_from(Map::Array(MapData::from_pin(pin_dir.join(maps::CONFIG))?))?;
        Ok(ConntrackPins { lru, cache, config })
    }

    /// Every entry that passes `keep`, from the LRU hash and the flow cache (a long-lived flow
    /// served from the cache may have aged out of the LRU hash), at most `limit`. A cache slot
    /// counts only when its check word matches its key and value (a slot being rewritten
    /// while read fails it).
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
        let cfg = self.config.get(&0, 0)?;
        let seed = flow_cache_seed(cfg.hash_seed, cfg.flow_cache);
        for i in 0..self.cache.len() {
            if out.len() >= limit {
                break;
            }
            let Ok(e) = self.cache.get(&i, 0) else {
                continue;
            };
            if e.key.family == 0 {
                continue;
            }
            if flow_cache_check(flow_cache_hash(&e.key, seed), e.value) != e.check {
                continue;
            }
            if keep(&e.key, &e.value) && seen.insert(e.key) {
                out.push((e.key, e.value));
            }
        }
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
