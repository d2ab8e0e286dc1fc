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
        remove(dir, name, "pinned map of an earlier version")?;
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
    }
    Ok(())
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
            size_of::<lb_common::FlowCacheEntry>(),
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
