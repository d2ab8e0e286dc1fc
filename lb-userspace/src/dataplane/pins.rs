//! The bpffs side of the data plane: mounting it, and deciding which pinned maps a new `lbd`
//! may adopt.

use std::path::Path;

use anyhow::{Context, Result, bail};
use lb_common::{BackendInfo, Counters, FlowKey, FlowValue, LbConfig, VipInfo, VipKey, maps, stat};

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// Mount bpffs at `root` unless it already is one (a fresh node or a lab may not have it).
pub fn ensure_bpffs(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("create {}", root.display()))?;
    let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes())?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    let ty = std::ffi::CString::new("bpf")?;
    let rc = unsafe { libc::mount(ty.as_ptr(), c.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        bail!(
            "mount bpffs at {}: {}",
            root.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The shape a pinned map must have to be adopted.
pub struct Shape {
    pub name: &'static str,
    pub key: usize,
    pub value: usize,
    /// `None`: fixed by the object, not by settings.
    pub entries: Option<u32>,
}

/// Remove pins that a new `lbd` must not adopt: maps of an earlier version that this one does
/// not use, and maps whose shape differs from what we will create (a changed `table_size` or
/// `conntrack_size`, or a value layout of another version); aya would otherwise adopt them as
/// they are. When the config or the backends are replaced, the connection table goes too: its
/// entries name pair epochs from a counter that no longer exists, which could be handed out
/// again.
pub fn drop_unadoptable_pins(dir: &Path, shapes: &[Shape]) -> Result<()> {
    for name in lb_common::maps::OBSOLETE {
        if *name != maps::FLOW_CACHE_V2 {
            remove(dir, name, "pinned map of an earlier version")?;
        }
    }
    let mut identity_lost = false;
    for shape in shapes {
        let path = dir.join(shape.name);
        if !path.exists() {
            identity_lost |= is_identity(shape.name);
            continue;
        }
        let keep = aya::maps::MapInfo::from_pin(&path)
            .map(|info| {
                info.key_size() as usize == shape.key
                    && info.value_size() as usize == shape.value
                    && shape.entries.is_none_or(|n| info.max_entries() == n)
            })
            .unwrap_or(false);
        if !keep {
            identity_lost |= is_identity(shape.name);
            remove(
                dir,
                shape.name,
                "pinned map has another shape; replacing it",
            )?;
        }
    }
    if identity_lost {
        for name in [
            lb_common::maps::CONNTRACK,
            lb_common::maps::FLOW_CACHE,
            lb_common::maps::HANDSHAKES,
        ] {
            remove(
                dir,
                name,
                "pair epochs start afresh; dropping the connection table",
            )?;
        }
        return remove(dir, maps::FLOW_CACHE_V2, "pinned map of an earlier version");
    }
    // Kept until the new program forwards (`retire_earlier_cache`, after the attach): the
    // old one still writes and serves from it until then.
    Ok(())
}

/// Once the new program forwards (it replaced the old one behind the link): the previous
/// version's flow cache written back (`retire_v2_cache`) and its pin removed. Nothing writes
/// it any more, so nothing the old program kept there is missed.
pub fn retire_earlier_cache(dir: &Path) -> Result<()> {
    if dir.join(maps::FLOW_CACHE_V2).exists() {
        retire_v2_cache(dir);
    }
    remove(dir, maps::FLOW_CACHE_V2, "pinned map of an earlier version")
}

/// The previous version's flow cache (`maps::FLOW_CACHE_V2`: one 64-byte entry per slot, the
/// key's five words, the value, the check word) may hold flows that aged out of the connection
/// table while served from it: its good entries go into the adopted connection table
/// (`BPF_NOEXIST`: an entry there is as new or newer) before its pin is removed, so an upgrade
/// keeps every flow. Run after the new program is attached (`retire_earlier_cache`). Best
/// effort: a cache or table that cannot be read is only logged.
fn retire_v2_cache(dir: &Path) {
    use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData};
    use lb_common::{flow_cache_check, flow_cache_hash, flow_cache_seed, key_of_words, value_of};
    let path = dir.join(maps::FLOW_CACHE_V2);
    if !path.exists() || !dir.join(maps::CONNTRACK).exists() {
        return;
    }
    let moved = (|| -> Result<usize> {
        let old: Array<MapData, [u64; 8]> = Array::try_from(Map::Array(MapData::from_pin(&path)?))?;
        let config: Array<MapData, LbConfig> =
            Array::try_from(Map::Array(MapData::from_pin(dir.join(maps::CONFIG))?))?;
        let mut table: BpfHashMap<MapData, FlowKey, FlowValue> = BpfHashMap::try_from(
            Map::LruHashMap(MapData::from_pin(dir.join(maps::CONNTRACK))?),
        )?;
        let c = config.get(&0, 0)?;
        let seed = flow_cache_seed(c.hash_seed, c.flow_cache);
        let mut moved = 0;
        for i in 0..old.len() {
            let Ok(w) = old.get(&i, 0) else { continue };
            let key = key_of_words([w[0], w[1], w[2], w[3], w[4]]);
            let value = value_of(w[5]);
            if key.family == 0 || flow_cache_check(flow_cache_hash(&key, seed), value) != w[6] {
                continue;
            }
            const BPF_NOEXIST: u64 = 1;
            if table.insert(key, value, BPF_NOEXIST).is_ok() {
                moved += 1;
            }
        }
        Ok(moved)
    })();
    match moved {
        Ok(n) => tracing::info!(
            entries = n,
            "flow cache of the earlier version written back to the connection table"
        ),
        Err(e) => tracing::warn!(error = %e, "could not write the earlier flow cache back"),
    }
}

fn is_identity(name: &str) -> bool {
    name == lb_common::maps::CONFIG || name == lb_common::maps::BACKENDS
}

fn remove(dir: &Path, name: &str, why: &str) -> Result<()> {
    let path = dir.join(name);
    if path.exists() {
        tracing::warn!(map = name, "{why}");
        std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
    }
    Ok(())
}

/// Every pinned map with the shape this version creates.
pub fn map_shapes(table_entries: u32, conntrack: u32) -> Vec<Shape> {
    use std::mem::size_of;
    let shape = |name, key, value, entries| Shape {
        name,
        key,
        value,
        entries,
    };
    vec![
        shape(maps::CONFIG, 4, size_of::<LbConfig>(), None),
        shape(maps::VIPS, size_of::<VipKey>(), size_of::<VipInfo>(), None),
        shape(maps::VIP_ADDRS, size_of::<VipKey>(), 4, None),
        shape(maps::VIP_OWNED, 4, 4, None),
        shape(maps::PEERS, 8, 4, None),
        shape(maps::BACKENDS, 4, size_of::<BackendInfo>(), None),
        shape(maps::TABLES, 4, 8, Some(table_entries)),
        shape(maps::NEW_TABLES, 4, 8, Some(table_entries)),
        shape(
            maps::CONNTRACK,
            size_of::<FlowKey>(),
            size_of::<FlowValue>(),
            Some(conntrack),
        ),
        shape(
            maps::FLOW_CACHE,
            4,
            size_of::<lb_common::FlowCacheLine>(),
            Some(lb_common::flow_cache_slots(conntrack)),
        ),
        shape(
            maps::HANDSHAKES,
            size_of::<FlowKey>(),
            size_of::<FlowValue>(),
            Some(lb_common::HANDSHAKE_TABLE_SIZE),
        ),
        shape(maps::DECAP_PEERS, size_of::<lb_common::DecapKey>(), 4, None),
        shape(maps::DECAP_VIPS, size_of::<lb_common::DecapKey>(), 4, None),
        shape(maps::DECAP_LOCAL, size_of::<lb_common::DecapKey>(), 4, None),
        shape(
            maps::DECAP_STATS,
            4,
            8 * lb_common::decap_stat::COUNT as usize,
            None,
        ),
        shape(maps::STATS, 4, 8 * stat::COUNT as usize, None),
        shape(maps::VIP_STATS, 4, size_of::<Counters>(), None),
        shape(maps::BACKEND_STATS, 4, size_of::<Counters>(), None),
        shape(maps::FLOOD, 4, size_of::<lb_common::FloodState>(), None),
        // Socket load balancing (dataplane::sock).
        shape(
            maps::SOCK_REV,
            size_of::<lb_common::SockRevKey>(),
            size_of::<lb_common::SockRevValue>(),
            Some(lb_common::SOCK_REV_SIZE),
        ),
        shape(
            maps::SOCK_STATS,
            4,
            8 * lb_common::sock_stat::COUNT as usize,
            None,
        ),
    ]
}
