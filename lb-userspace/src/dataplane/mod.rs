//! Loads and attaches the XDP program and is the only writer of its maps.
//!
//! Callers describe what they want ([`Desired`]: services, their backends and whether this node
//! owns each VIP) and [`Dataplane::apply`] makes the maps say exactly that, with two guarantees:
//! - a VIP's Maglev table is replaced atomically: the new table goes into the VIP's idle half
//!   (a memory-mapped array, so this is plain stores), then one map update flips `active_table`;
//! - ids are stable: a (service, backend) pair keeps its backend id and epoch for as long as it
//!   exists with the same addressing, so connection-table entries stay valid across updates and
//!   across `lbd` restarts (maps and the XDP link are pinned under `/sys/fs/bpf/<name>/`, and a
//!   new `lbd` adopts them);
//! - identities are never reused: each pair gets an epoch from a counter kept in the pinned
//!   config, and an entry is good only while its backend id still holds that epoch;
//! - a slot's MAC, interface or VIP is never rewritten in place (a reader could see half of it):
//!   an addressing change moves the pair to a new slot with the same epoch, and its earlier
//!   slots point at the new one (only their flags change), so the pair keeps its flows;
//! - a live slot is never torn: the kernel copies a map update in no order a reader can rely
//!   on, so a reader on another CPU may see part of a write. A pair is retired by clearing its
//!   epoch and its flags but the addressing ones (`retire`, `lb_common::BACKEND_F_ADDRESSING`:
//!   the program reads a slot's flags more than once per packet), its addressing left as it
//!   was, so whatever mix a reader sees, a frame it still forwards goes where the pair pointed;
//!   a retired id is handed out again only after every other free one ([`ids::BackendIds`],
//!   which hands out slots, VIP ids and epochs).

mod batch;
mod counters;
pub mod decap;
mod explain;
mod ids;
pub mod kernel;
mod pins;
mod pmtu;
pub mod sock;
pub mod sync_view;
mod tables;
mod trace;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    path::PathBuf,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray},
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
    },
};
pub use counters::{FloodStatus, Traffic};
pub use explain::DryRun;
use lb_common::{
    BACKEND_F_IN_SET, BACKEND_F_LOCAL, BackendInfo, Counters, FlowKey, FlowValue, LbConfig,
    MAX_BACKENDS, MAX_PEERS, MAX_VIPS, VIP_F_OWNED, VIP_OWNED, VipInfo, VipKey, maps, stat,
    table_index,
};
pub use pins::ensure_bpffs;
use pins::{drop_unadoptable_pins, map_shapes};
use tables::TableMemory;
pub use trace::TraceTap;

pub use crate::desired::{BackendSpec, Desired, Encap, ServiceSpec, addr_bytes, key_addr, vip_key};
use crate::maglev;

/// How the program is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Pins live under `<bpffs_root>/<name>/`.
    pub name: String,
    pub bpffs_root: PathBuf,
    pub table_size: u32,
    pub conntrack_size: u32,
    pub hash_seed: u32,
    /// `LbConfig::syn_flood_rate`.
    pub syn_flood_rate: u32,
}

impl LoadOptions {
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs_root.join(&self.name)
    }
}

/// What is installed for one (service, backend) pair.
#[derive(Clone, Debug)]
pub struct InstalledBackend {
    pub id: u32,
    /// The pair's identity (see `lb_common::FlowValue::epoch`).
    pub epoch: u32,
    pub spec: BackendSpec,
    /// Earlier slots of the pair (oldest first), left by addressing changes: each points at
    /// `id` (`lb_common::BACKEND_F_MOVED`) so that the entries naming it keep their backend.
    pub aliases: Vec<u32>,
}

/// Earlier slots a pair keeps; beyond them the oldest is retired (its flows hash again), so a
/// flapping MAC cannot use up the backend ids.
const MAX_ALIASES: usize = 8;

#[derive(Clone, Debug)]
struct InstalledService {
    vip_id: u32,
    active: u32,
    owned: bool,
    /// The live table's content (what the idle half is compared against).
    table: Vec<u32>,
    /// The live new-flow table's (`LB_NEW_TABLES`: the same Maglev build without the backends
    /// that take no new flows).
    new_table: Vec<u32>,
    /// What the live tables were built from (`None`: not known, e.g. adopted). An apply with
    /// the same entries reuses them: two Maglev builds per service are most of an apply's CPU,
    /// and a VIP's ownership change (which changes no table) waits for its apply before the
    /// new owner announces the VIP.
    built_from: Option<(Vec<maglev::Entry>, Vec<maglev::Entry>)>,
    backends: BTreeMap<IpAddr, InstalledBackend>,
}

pub struct Dataplane {
    ebpf: Ebpf,
    opts: LoadOptions,
    config: Array<MapData, LbConfig>,
    vips: BpfHashMap<MapData, VipKey, VipInfo>,
    vip_addrs: BpfHashMap<MapData, VipKey, u32>,
    backends: Array<MapData, BackendInfo>,
    /// An LRU hash in the kernel; aya's HashMap type serves both kinds.
    conntrack: BpfHashMap<MapData, FlowKey, FlowValue>,
    stats: PerCpuArray<MapData, [u64; stat::COUNT as usize]>,
    vip_stats: PerCpuArray<MapData, Counters>,
    vip_owned: Array<MapData, u32>,
    peers: BpfHashMap<MapData, [u8; 8], u32>,
    backend_stats: PerCpuArray<MapData, Counters>,
    flood: Array<MapData, lb_common::FloodState>,
    tables: TableMemory,
    _tables_map: MapData,
    new_tables: TableMemory,
    _new_tables_map: MapData,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    services: HashMap<VipKey, InstalledService>,
    /// Backend slots handed out (see [`ids`]).
    backend_ids: ids::BackendIds,
    /// Pair epochs (persisted in `LbConfig::next_epoch` before use).
    epochs: ids::Epochs,
    attached: Option<String>,
    /// Whether `lb_xdp_noted` is loaded and in `LB_NOTED` (see [`Dataplane::arm_noted`]).
    noted: explain::Noted,
    /// Lets the kernel learn routed backends' path MTU from the routers' errors.
    _pmtu: pmtu::PmtuListeners,
}

/// Load the XDP program `name` of the object. A refusal names the kernel and the verifier's
/// reason; the whole log goes to the debug log.
fn load_xdp(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?
        .try_into()?;
    if let Err(e) = prog.load() {
        let text = e.to_string();
        tracing::debug!(program = name, log = %text, "the verifier refused a program");
        bail!(kernel::refused(
            kernel::Release::current().as_ref(),
            name,
            &text
        ));
    }
    Ok(())
}

/// 27 random bits, never 0 (`LbConfig::flow_cache`).
fn flow_cache_secret() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        let bits = (h.finish() as u32) >> 5;
        if bits != 0 {
            return bits;
        }
    }
}

fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<Map>,
    <T as TryFrom<Map>>::Error: std::error::Error + Send + Sync + 'static,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow!("map {name} missing from the object"))?;
    T::try_from(map).with_context(|| format!("map {name}"))
}

impl Dataplane {
    /// Load the program and create or adopt the pinned maps. Does not attach.
    pub fn load(opts: LoadOptions) -> Result<Self> {
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this build has no XDP program: run `cargo xtask setup` and rebuild");
        }
        if opts.table_size == 0 || !maglev::is_prime(opts.table_size) {
            bail!("table_size must be a prime, got {}", opts.table_size);
        }
        ensure_bpffs(&opts.bpffs_root)?;
        let pin_dir = opts.pin_dir();
        std::fs::create_dir_all(&pin_dir)
            .with_context(|| format!("create pin directory {}", pin_dir.display()))?;
        let table_entries = lb_common::table_elements(opts.table_size);
        drop_unadoptable_pins(&pin_dir, &map_shapes(table_entries, opts.conntrack_size))?;

        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .map_max_entries(maps::TABLES, table_entries)
            .map_max_entries(maps::NEW_TABLES, table_entries)
            .map_max_entries(maps::CONNTRACK, opts.conntrack_size)
            .map_max_entries(
                maps::FLOW_CACHE,
                lb_common::flow_cache_slots(opts.conntrack_size),
            )
            .load(crate::EBPF_OBJECT)
            .context("load the XDP object")?;
        // The noted copy of the path (`lbctl explain`, `lbctl trace`) is loaded when first
        // needed (`arm_noted`): it doubles what the verifier does, and forwarding never needs it.
        for name in [maps::PROGRAM, "lb_pass"] {
            load_xdp(&mut ebpf, name)?;
        }
        explain::arm_token(&mut ebpf).context("arm lbctl explain")?;
        // The program's rare-path log lines (aya-log); optional so a missing map is not fatal.
        let logger = aya_log::EbpfLogger::init(&mut ebpf).ok();
        let tables_map: MapData = match ebpf.take_map(maps::TABLES) {
            Some(Map::Array(m)) => m,
            _ => bail!("map {} missing or not an array", maps::TABLES),
        };
        let tables = TableMemory::map(&tables_map, table_entries * 2)?;
        let new_tables_map: MapData = match ebpf.take_map(maps::NEW_TABLES) {
            Some(Map::Array(m)) => m,
            _ => bail!("map {} missing or not an array", maps::NEW_TABLES),
        };
        let new_tables = TableMemory::map(&new_tables_map, table_entries * 2)?;

        let mut dp = Dataplane {
            config: take(&mut ebpf, maps::CONFIG)?,
            vips: take(&mut ebpf, maps::VIPS)?,
            vip_addrs: take(&mut ebpf, maps::VIP_ADDRS)?,
            backends: take(&mut ebpf, maps::BACKENDS)?,
            conntrack: take(&mut ebpf, maps::CONNTRACK)?,
            stats: take(&mut ebpf, maps::STATS)?,
            vip_stats: take(&mut ebpf, maps::VIP_STATS)?,
            vip_owned: take(&mut ebpf, maps::VIP_OWNED)?,
            peers: take(&mut ebpf, maps::PEERS)?,
            flood: take(&mut ebpf, maps::FLOOD)?,
            backend_stats: take(&mut ebpf, maps::BACKEND_STATS)?,
            ebpf,
            tables,
            _tables_map: tables_map,
            new_tables,
            _new_tables_map: new_tables_map,
            logger,
            services: HashMap::new(),
            backend_ids: ids::BackendIds::new(MAX_BACKENDS),
            epochs: ids::Epochs::from_persisted(0),
            attached: None,
            noted: explain::Noted::Unloaded,
            _pmtu: pmtu::PmtuListeners::open(),
            opts,
        };
        let old = dp.config.get(&0, 0).unwrap_or_default();
        let cfg = LbConfig {
            hash_seed: dp.opts.hash_seed,
            table_size: dp.opts.table_size,
            syn_flood_rate: dp.opts.syn_flood_rate,
            // The secret part of the cache's seed is kept across restarts (the cached flows
            // stay where they are), drawn once when there is none.
            flow_cache: lb_common::flow_cache_config(
                lb_common::flow_cache_slots(dp.opts.conntrack_size),
                match old.flow_cache >> 5 {
                    0 => flow_cache_secret(),
                    kept => kept,
                },
            ),
            ..old
        };
        if old.table_size != 0 && (old.hash_seed, old.table_size) != (cfg.hash_seed, cfg.table_size)
        {
            // Another seed or size invalidates the adopted tables: start clean.
            tracing::warn!(?old, new = ?cfg, "pinned state used other settings; resetting it");
            dp.clear_all()?;
        }
        dp.epochs = ids::Epochs::from_persisted(cfg.next_epoch);
        dp.config.set(0, cfg, 0)?;
        dp.adopt()?;
        Ok(dp)
    }

    /// Rebuild our bookkeeping from pinned maps left by a previous `lbd`.
    fn adopt(&mut self) -> Result<()> {
        let mut by_id: HashMap<u32, (VipKey, VipInfo)> = HashMap::new();
        for entry in self.vips.iter() {
            let (k, v) = entry?;
            by_id.insert(v.vip_id, (k, v));
        }
        let mut used = Vec::new();
        let mut services: HashMap<VipKey, InstalledService> = by_id
            .values()
            .map(|(k, v)| {
                let size = self.opts.table_size as usize;
                let start = table_index(v.vip_id, v.active_table, self.opts.table_size, 0) as usize;
                let table = self.tables.slice(start, size).to_vec();
                let new_table = self.new_tables.slice(start, size).to_vec();
                (
                    *k,
                    InstalledService {
                        vip_id: v.vip_id,
                        active: v.active_table,
                        owned: v.flags & VIP_F_OWNED != 0,
                        table,
                        new_table,
                        built_from: None,
                        backends: BTreeMap::new(),
                    },
                )
            })
            .collect();
        let mut moved: Vec<(u32, BackendInfo)> = Vec::new();
        for id in 0..MAX_BACKENDS {
            let b = self.backends.get(&id, 0)?;
            if b.is_vacant() {
                continue;
            }
            if b.flags & lb_common::BACKEND_F_MOVED != 0 {
                moved.push((id, b));
                continue;
            }
            let addr = key_addr(&b.addr, b.family);
            // A slot no service accounts for (an lbd killed between the steps of a removal left
            // its VIP entry gone and its pairs standing; a later service on the same VIP id
            // would forward the old flows to them), or a second pair of one backend: retired.
            let svc = by_id
                .get(&b.vip_id)
                .and_then(|(key, _)| services.get_mut(key))
                .filter(|svc| b.epoch != 0 && !svc.backends.contains_key(&addr));
            let Some(svc) = svc else {
                tracing::warn!(id, vip_id = b.vip_id, %addr, "retiring a pair no service accounts for");
                retire(&mut self.backends, id)?;
                continue;
            };
            used.push(id);
            self.epochs.seen(b.epoch);
            let in_set = b.flags & BACKEND_F_IN_SET != 0;
            svc.backends.insert(
                addr,
                InstalledBackend {
                    id,
                    epoch: b.epoch,
                    spec: BackendSpec {
                        addr,
                        weight: 1,
                        mac: (b.flags & BACKEND_F_LOCAL == 0 && in_set).then_some(b.dst_mac),
                        src_mac: b.src_mac,
                        ifindex: b.ifindex,
                        local: b.flags & BACKEND_F_LOCAL != 0,
                        healthy: in_set,
                        drained: b.flags & lb_common::BACKEND_F_DRAINED != 0,
                        failing: false,
                        step: crate::plan::SLOW_START_STEPS,
                        encap: (b.flags & lb_common::BACKEND_F_ENCAP != 0).then(|| Encap {
                            src: key_addr(&b.encap_src, b.family),
                            mtu: b.encap_mtu,
                        }),
                    },
                    aliases: Vec::new(),
                },
            );
        }
        // Earlier slots of moved pairs: kept (pointed at the pair's slot again) when their pair
        // was adopted, else retired.
        for (id, b) in moved {
            let addr = key_addr(&b.addr, b.family);
            let owner = by_id
                .get(&b.vip_id)
                .and_then(|(key, _)| services.get_mut(key))
                .and_then(|svc| svc.backends.get_mut(&addr))
                .filter(|p| p.epoch == b.epoch && p.aliases.len() < MAX_ALIASES);
            match owner {
                Some(p) => {
                    if lb_common::moved_to(b.flags) != p.id {
                        let flags = lb_common::moved_flags(b.flags, p.id);
                        self.backends.set(id, BackendInfo { flags, ..b }, 0)?;
                    }
                    p.aliases.push(id);
                    used.push(id);
                }
                None => retire(&mut self.backends, id)?,
            }
        }
        // VIP ids without a service forward for nobody.
        for vip_id in 0..MAX_VIPS {
            if !by_id.contains_key(&vip_id) {
                self.set_vip_owned(vip_id, false)?;
            }
        }
        self.backend_ids = ids::BackendIds::adopted(MAX_BACKENDS, used);
        if !services.is_empty() {
            tracing::info!(services = services.len(), "adopted pinned data-plane state");
        }
        self.services = std::mem::take(&mut services);
        Ok(())
    }

    fn clear_all(&mut self) -> Result<()> {
        let keys: Vec<VipKey> = self.vips.keys().collect::<Result<_, _>>()?;
        for k in keys {
            let _ = self.vips.remove(&k);
        }
        let keys: Vec<VipKey> = self.vip_addrs.keys().collect::<Result<_, _>>()?;
        for k in keys {
            let _ = self.vip_addrs.remove(&k);
        }
        for id in 0..MAX_BACKENDS {
            retire(&mut self.backends, id)?;
        }
        for id in 0..MAX_VIPS {
            self.vip_owned.set(id, 0, 0)?;
        }
        Ok(())
    }

    /// Attach `lb_xdp` to `interface`, or atomically replace the program behind a link pinned by
    /// a previous `lbd` (restart without a gap). The link is pinned so forwarding survives us.
    pub fn attach(&mut self, interface: &str, mode: crate::config::XdpMode) -> Result<()> {
        let link_path = self.opts.pin_dir().join(format!("link_{interface}"));
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(maps::PROGRAM)
            .expect("loaded")
            .try_into()?;
        if link_path.exists() {
            let pinned = PinnedLink::from_pin(&link_path)
                .with_context(|| format!("open pinned link {}", link_path.display()))?;
            let fd_link: FdLink = pinned.into();
            prog.attach_to_link(fd_link.try_into()?)
                .context("replace the program behind the pinned XDP link")?;
            tracing::info!(interface, "adopted the pinned XDP link");
        } else {
            let id = match mode {
                crate::config::XdpMode::Driver => prog.attach(interface, XdpMode::Driver)?,
                crate::config::XdpMode::Skb => prog.attach(interface, XdpMode::Skb)?,
                crate::config::XdpMode::Auto => match prog.attach(interface, XdpMode::Driver) {
                    Ok(id) => id,
                    Err(e) => {
                        tracing::warn!(interface, error = %e, "driver-mode XDP failed, using generic mode");
                        prog.attach(interface, XdpMode::Skb)?
                    }
                },
            };
            let link: FdLink = prog.take_link(id)?.try_into()?;
            link.pin(&link_path)
                .with_context(|| format!("pin {}", link_path.display()))?;
            tracing::info!(interface, ?mode, "attached XDP program");
        }
        self.attached = Some(interface.to_owned());
        if !self.opts.pin_dir().join(maps::FLOW_CACHE_V2).exists() {
            return Ok(());
        }
        match self.forwarding_alone() {
            Ok(None) => self.retire_earlier_cache(),
            Ok(Some(link)) => {
                tracing::info!(
                    link = %link.display(),
                    "an earlier program still runs behind this pinned link: its flow cache is kept until it is replaced"
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot tell whether an earlier program still runs: its flow cache is written back now");
                self.retire_earlier_cache()
            }
        }
    }

    /// What `attach` does once this program forwards on every device: the previous version's
    /// flow cache, which the old program wrote and served from until then, goes into the
    /// connection table and its pin is removed (see `pins::retire_earlier_cache`).
    pub fn retire_earlier_cache(&self) -> Result<()> {
        pins::retire_earlier_cache(&self.opts.pin_dir())
    }

    /// `None` when every XDP link pinned here (`link_<interface>`, one per device an `lbd`
    /// attached to) runs this program; else the first that runs another: an earlier `lbd`'s
    /// program, which still forwards on that device (with several `xdp_interfaces` the new
    /// program replaces the old one device by device) and still writes its own flow cache.
    fn forwarding_alone(&self) -> Result<Option<PathBuf>> {
        let prog: &Xdp = self
            .ebpf
            .program(maps::PROGRAM)
            .expect("loaded")
            .try_into()?;
        let id = prog.info()?.id();
        let dir = self.opts.pin_dir();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("link_"))
            {
                continue;
            }
            let link: FdLink = PinnedLink::from_pin(&path)
                .with_context(|| format!("open pinned link {}", path.display()))?
                .into();
            if link.info()?.program_id() != id {
                return Ok(Some(path));
            }
        }
        Ok(None)
    }

    /// Socket load balancing: attach the cgroup hooks (see `sock`). They detach when this
    /// process exits or [`Dataplane::detach_sock`] runs.
    pub fn attach_sock(&mut self) -> Result<()> {
        sock::attach(&mut self.ebpf)
    }

    pub fn detach_sock(&mut self) {
        sock::detach(&mut self.ebpf)
    }

    /// Attach the pass-only program (for the bridge-side peer of a native-mode veth).
    pub fn attach_pass(&mut self, interface: &str) -> Result<()> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut("lb_pass")
            .expect("loaded")
            .try_into()?;
        let id = prog.attach(interface, XdpMode::Driver)?;
        let link: FdLink = prog.take_link(id)?.try_into()?;
        std::mem::forget(link);
        Ok(())
    }

    /// Detach and remove every pin: the node stops load balancing entirely.
    pub fn teardown(opts: &LoadOptions) -> Result<()> {
        let dir = opts.pin_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        Ok(())
    }

    /// Forward the program's log lines to `log` (and so to tracing) until the task is dropped.
    pub fn spawn_log_reader(&mut self) -> Result<()> {
        let Some(logger) = self.logger.take() else {
            return Ok(());
        };
        // SAFETY: the logger owns its ring-buffer fd and keeps it open for as long as it lives.
        let mut fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)?
        };
        tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    break;
                };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        });
        Ok(())
    }

    pub fn options(&self) -> &LoadOptions {
        &self.opts
    }

    /// Make the maps match `want`. Order matters for packets in flight: a pair is written (and
    /// put in the set) before any table names it, and is taken out of the set (or cleared) only
    /// after the live table stops naming it, so a packet never meets a table slot it may not
    /// use; flows of a backend that leaves move to their new backend on their next packet.
    pub fn apply(&mut self, want: &Desired) -> Result<()> {
        let wanted: HashMap<VipKey, &ServiceSpec> =
            want.services.iter().map(|s| (s.key, s)).collect();

        // 1. Services that are gone.
        let gone: Vec<VipKey> = self
            .services
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.remove_service(&key)?;
        }
        // 2. New and changed services, in a stable order.
        let mut specs: Vec<&ServiceSpec> = want.services.iter().collect();
        specs.sort_by_key(|s| (s.key.addr, s.key.port, s.key.proto));
        for spec in specs {
            self.apply_service(spec)?;
        }
        self.sync_vip_addrs()?;
        let peer_filter = self.sync_peers(&want.peers)?;
        let mut cfg = self.config.get(&0, 0)?;
        let all_ports = self.services.keys().any(|k| k.port == lb_common::ALL_PORTS);
        let flags = if all_ports {
            lb_common::CONFIG_F_ALL_PORTS
        } else {
            0
        };
        let mut filter = [0u64; 4];
        for k in self.services.keys() {
            let bit = lb_common::addr_filter_bit(&k.addr);
            filter[(bit >> 6) as usize] |= 1 << (bit & 63);
        }
        if cfg.flags != flags || cfg.addr_filter != filter || cfg.peer_filter != peer_filter {
            cfg.flags = flags;
            cfg.addr_filter = filter;
            cfg.peer_filter = peer_filter;
            self.config.set(0, cfg, 0)?;
        }
        Ok(())
    }

    fn alloc_vip_id(&self) -> Result<u32> {
        ids::lowest_free_vip_id(self.services.values().map(|s| s.vip_id), MAX_VIPS)
            .ok_or_else(|| anyhow!("more than {MAX_VIPS} VIP services"))
    }

    fn alloc_backend_id(&mut self) -> Result<u32> {
        self.backend_ids
            .take()
            .ok_or_else(|| anyhow!("more than {MAX_BACKENDS} backends"))
    }

    /// A fresh pair epoch, persisted before it is used so that no later `lbd` hands it out
    /// again.
    fn alloc_epoch(&mut self) -> Result<u32> {
        let (epoch, next) = self.epochs.next().ok_or_else(|| {
            anyhow!("pair epochs exhausted (4 billion pairs created); remove the pins to reset")
        })?;
        let mut cfg = self.config.get(&0, 0)?;
        cfg.next_epoch = next;
        self.config.set(0, cfg, 0)?;
        self.epochs.advance_to(next);
        Ok(epoch)
    }

    /// A new pair: id, epoch, counters from zero, written (with its flags) before any table
    /// names it.
    fn install_pair(&mut self, vip_id: u32, b: &BackendSpec) -> Result<InstalledBackend> {
        let id = self.alloc_backend_id()?;
        let epoch = self.alloc_epoch()?;
        self.reset_counters(id, false)?;
        self.backends.set(id, backend_info(vip_id, b, epoch), 0)?;
        Ok(InstalledBackend {
            id,
            epoch,
            spec: b.clone(),
            aliases: Vec::new(),
        })
    }

    /// A pair whose addressing changed moves to a new slot with the same epoch, written before
    /// anything names it; then every earlier slot is pointed at it (only their flags change, so a
    /// reader sees the old addressing or the new). Entries name the earlier slots and follow
    /// them: the pair keeps its flows, those placed by a skip or an older table included.
    fn move_pair(
        &mut self,
        vip_id: u32,
        old: &InstalledBackend,
        b: &BackendSpec,
    ) -> Result<InstalledBackend> {
        let id = self.alloc_backend_id()?;
        self.reset_counters(id, false)?;
        self.backends
            .set(id, backend_info(vip_id, b, old.epoch), 0)?;
        let mut aliases = old.aliases.clone();
        aliases.push(old.id);
        while aliases.len() > MAX_ALIASES {
            let gone = aliases.remove(0);
            retire(&mut self.backends, gone)?;
            self.backend_ids.release(gone);
            self.carry_counters(vip_id, gone)?;
        }
        for a in &aliases {
            let cur = self.backends.get(a, 0)?;
            let flags = lb_common::moved_flags(cur.flags, id);
            self.backends.set(*a, BackendInfo { flags, ..cur }, 0)?;
        }
        // What the pair counted so far stays with its VIP; it counts at its new slot from now.
        self.carry_counters(vip_id, old.id)?;
        Ok(InstalledBackend {
            id,
            epoch: old.epoch,
            spec: b.clone(),
            aliases,
        })
    }

    fn apply_service(&mut self, spec: &ServiceSpec) -> Result<()> {
        let key = spec.key;
        if !self.services.contains_key(&key) {
            let vip_id = self.alloc_vip_id()?;
            self.services.insert(
                key,
                InstalledService {
                    vip_id,
                    active: 0,
                    owned: false,
                    // Empty: differs from any built table, so the first apply always writes one
                    // (the idle half may hold a previous VIP's slots).
                    table: Vec::new(),
                    new_table: Vec::new(),
                    built_from: None,
                    backends: BTreeMap::new(),
                },
            );
            // Counters of a reused id start from zero. (Entries of the id's previous VIP name
            // pairs whose epochs are gone: they cannot match.)
            self.reset_counters(vip_id, true)?;
        }
        let vip_id = self.services[&key].vip_id;

        // Backends. New pairs, and pairs whose addressing changed (a replacement pair), are
        // written now; flag changes that add a pair to the set or let it take new flows are
        // written now, those that take it out of either wait for the table flip: until then the
        // live new-flow table still names it, and a flow start on its slot would find no
        // backend (dropped) if its flags already said "no new flows".
        let mut entries = Vec::new();
        let mut new_entries = Vec::new();
        let mut after_flip: Vec<(u32, BackendInfo)> = Vec::new();
        let mut retired: Vec<u32> = Vec::new();
        for b in &spec.backends {
            let existing = self.services[&key].backends.get(&b.addr).cloned();
            let installed = match existing {
                Some(old) if old.spec.same_pair(b) => {
                    if old.spec != *b {
                        let info = backend_info(vip_id, b, old.epoch);
                        if (old.spec.in_set() && !b.in_set())
                            || (old.spec.in_table() && !b.in_table())
                        {
                            after_flip.push((old.id, info));
                        } else {
                            self.backends.set(old.id, info, 0)?;
                        }
                    }
                    InstalledBackend {
                        spec: b.clone(),
                        ..old
                    }
                }
                Some(old) => self.move_pair(vip_id, &old, b)?,
                None => self.install_pair(vip_id, b)?,
            };
            // Backends that take no new flows keep their slots (flagged): see BACKEND_F_NO_NEW.
            if b.in_set() && b.weight > 0 {
                // Slow start: weight steps (see `BackendSpec::step`). Every step rebuilds the
                // tables; the connection table keeps each flow where it started.
                let e = maglev::Entry {
                    addr: b.addr,
                    weight: b.weight * b.step.clamp(1, crate::plan::SLOW_START_STEPS),
                    id: installed.id,
                };
                if b.in_table() {
                    new_entries.push(e.clone());
                }
                entries.push(e);
            }
            let svc = self.services.get_mut(&key).expect("present");
            svc.backends.insert(b.addr, installed);
        }

        // Tables: install into the idle half, then flip. A flow start whose slot names a backend
        // that takes no new flows takes the same slot of the new-flow table, which names one that
        // does whenever one exists.
        let inputs = (entries, new_entries);
        let svc = self.services.get_mut(&key).expect("present");
        // Built from these already: the live tables are what a build would give.
        let built = (svc.built_from.as_ref() != Some(&inputs)).then(|| {
            (
                maglev::build(&inputs.0, self.opts.table_size),
                maglev::build(&inputs.1, self.opts.table_size),
            )
        });
        let mut info = VipInfo {
            vip_id,
            flags: if spec.owned { VIP_F_OWNED } else { 0 },
            active_table: svc.active,
            _pad: 0,
        };
        let fresh = self.vips.get(&key, 0).is_err();
        match built {
            Some((table, new_table)) if table != svc.table || new_table != svc.new_table => {
                let idle = svc.active ^ 1;
                let start = table_index(vip_id, idle, self.opts.table_size, 0) as usize;
                self.new_tables.write(start, &new_table);
                self.tables.write(start, &table);
                info.active_table = idle;
                self.vips.insert(key, info, 0)?;
                svc.active = idle;
                svc.table = table;
                svc.new_table = new_table;
                svc.owned = spec.owned;
            }
            _ if fresh || svc.owned != spec.owned => {
                self.vips.insert(key, info, 0)?;
                svc.owned = spec.owned;
            }
            _ => {}
        }
        svc.built_from = Some(inputs);
        self.set_vip_owned(vip_id, spec.owned)?;

        // The live table names none of these any more: out of the set, or cleared.
        for (id, info) in after_flip {
            self.backends.set(id, info, 0)?;
        }
        let svc = self.services.get_mut(&key).expect("present");
        let wanted: Vec<IpAddr> = spec.backends.iter().map(|b| b.addr).collect();
        let removed: Vec<IpAddr> = svc
            .backends
            .keys()
            .filter(|a| !wanted.contains(a))
            .copied()
            .collect();
        for addr in removed {
            if let Some(b) = svc.backends.remove(&addr) {
                retired.push(b.id);
                retired.extend(b.aliases);
            }
        }
        for id in retired {
            retire(&mut self.backends, id)?;
            self.backend_ids.release(id);
            self.carry_counters(vip_id, id)?;
        }
        Ok(())
    }

    /// The program counts a forwarded packet once, per pair (`LB_BACKEND_STATS`); a VIP's
    /// counters are its pairs' (see `vip_traffic`). A retired pair's counters are added to its
    /// VIP's `LB_VIP_STATS` entry, which only user space writes, and zeroed, so the VIP's totals
    /// never go back.
    fn carry_counters(&mut self, vip_id: u32, id: u32) -> Result<()> {
        let from = self.backend_stats.get(&id, 0)?;
        let to = self.vip_stats.get(&vip_id, 0)?;
        let sum: Vec<Counters> = to
            .iter()
            .zip(from.iter())
            .map(|(a, b)| Counters {
                packets: a.packets + b.packets,
                bytes: a.bytes + b.bytes,
                new_flows: a.new_flows + b.new_flows,
            })
            .collect();
        self.vip_stats
            .set(vip_id, aya::maps::PerCpuValues::try_from(sum)?, 0)?;
        self.reset_counters(id, false)
    }

    fn reset_counters(&mut self, id: u32, vip: bool) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
        let zero = aya::maps::PerCpuValues::try_from(vec![Counters::default(); cpus])?;
        let map = if vip {
            &mut self.vip_stats
        } else {
            &mut self.backend_stats
        };
        map.set(id, zero, 0)?;
        Ok(())
    }

    fn set_vip_owned(&mut self, vip_id: u32, owned: bool) -> Result<()> {
        let next = if owned { VIP_OWNED } else { 0 };
        if self.vip_owned.get(&vip_id, 0)? != next {
            self.vip_owned.set(vip_id, next, 0)?;
        }
        Ok(())
    }

    fn remove_service(&mut self, key: &VipKey) -> Result<()> {
        let Some(svc) = self.services.remove(key) else {
            return Ok(());
        };
        // The VIP entry and ownership go first: after them, no packet reaches its backends.
        let _ = self.vips.remove(key);
        self.set_vip_owned(svc.vip_id, false)?;
        for b in svc.backends.values() {
            for id in b.aliases.iter().chain([&b.id]) {
                retire(&mut self.backends, *id)?;
                self.backend_ids.release(*id);
            }
        }
        Ok(())
    }

    /// `LB_VIP_ADDRS` holds each VIP address once (for the fragment check).
    fn sync_vip_addrs(&mut self) -> Result<()> {
        let mut want: HashMap<VipKey, u32> = HashMap::new();
        for k in self.services.keys() {
            *want
                .entry(VipKey {
                    addr: k.addr,
                    port: 0,
                    proto: 0,
                    family: k.family,
                })
                .or_default() += 1;
        }
        let have: Vec<VipKey> = self.vip_addrs.keys().collect::<Result<_, _>>()?;
        for k in have {
            if !want.contains_key(&k) {
                let _ = self.vip_addrs.remove(&k);
            }
        }
        for (k, n) in want {
            self.vip_addrs.insert(k, n, 0)?;
        }
        Ok(())
    }

    /// `LB_PEERS` holds exactly `peers` (the loop guard); returns their filter bits. New MACs are
    /// added before the filter bit is set and old ones removed after it is cleared: a reader
    /// that passes the filter finds what the filter promised, or nothing.
    fn sync_peers(&mut self, peers: &[[u8; 6]]) -> Result<[u64; 4]> {
        let mut want: Vec<[u8; 8]> = peers.iter().map(lb_common::peer_key).collect();
        want.sort();
        want.dedup();
        if want.len() > MAX_PEERS as usize {
            bail!("more than {MAX_PEERS} peer MACs for the loop guard");
        }
        let have: Vec<[u8; 8]> = self.peers.keys().collect::<Result<_, _>>()?;
        for k in &want {
            if !have.contains(k) {
                self.peers.insert(k, 1, 0)?;
            }
        }
        for k in have {
            if !want.contains(&k) {
                let _ = self.peers.remove(&k);
            }
        }
        let mut filter = [0u64; 4];
        for k in &want {
            let mac = [k[0], k[1], k[2], k[3], k[4], k[5]];
            let bit = lb_common::mac_filter_bit(&mac);
            filter[(bit >> 6) as usize] |= 1 << (bit & 63);
        }
        Ok(filter)
    }

    /// Flip only the ownership flag of every service of `addr` (VRRP master/backup change).
    pub fn set_owned(&mut self, addr: IpAddr, owned: bool) -> Result<()> {
        let (bytes, family) = addr_bytes(addr);
        let keys: Vec<VipKey> = self
            .services
            .keys()
            .filter(|k| k.addr == bytes && k.family == family)
            .copied()
            .collect();
        for key in keys {
            let svc = self.services.get_mut(&key).expect("present");
            if svc.owned == owned {
                continue;
            }
            let info = VipInfo {
                vip_id: svc.vip_id,
                flags: if owned { VIP_F_OWNED } else { 0 },
                active_table: svc.active,
                _pad: 0,
            };
            self.vips.insert(key, info, 0)?;
            svc.owned = owned;
            let vip_id = svc.vip_id;
            self.set_vip_owned(vip_id, owned)?;
        }
        Ok(())
    }

    /// Installed backends of a service, with their ids.
    pub fn installed(&self, key: &VipKey) -> Vec<InstalledBackend> {
        self.services
            .get(key)
            .map(|s| s.backends.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Slots per backend id in the live table of a service.
    pub fn table_shares(&self, key: &VipKey) -> HashMap<u32, usize> {
        let mut m = HashMap::new();
        if let Some(s) = self.services.get(key) {
            for id in &s.table {
                *m.entry(*id).or_default() += 1;
            }
        }
        m
    }

    pub fn vip_id(&self, key: &VipKey) -> Option<u32> {
        self.services.get(key).map(|s| s.vip_id)
    }

    /// Whether the service is forwarded here, as installed (after adoption: as the previous lbd
    /// left it).
    pub fn owned(&self, key: &VipKey) -> Option<bool> {
        self.services.get(key).map(|s| s.owned)
    }
}

/// Take a pair out of service: its epoch cleared and its flags but the addressing bits
/// (`lb_common::retired_flags`), nothing else. A reader on another CPU sees the old flags and
/// epoch (and forwards where the pair always pointed) or a pair that is gone; never a valid
/// pair with addressing half overwritten, and, between two reads of the flags in one packet,
/// never a routed or local pair turned on-link.
fn retire(backends: &mut Array<MapData, BackendInfo>, id: u32) -> Result<()> {
    let b = backends.get(&id, 0)?;
    if b.is_vacant() {
        return Ok(());
    }
    backends.set(
        id,
        BackendInfo {
            flags: lb_common::retired_flags(b.flags),
            epoch: 0,
            ..b
        },
        0,
    )?;
    Ok(())
}

fn backend_info(vip_id: u32, b: &BackendSpec, epoch: u32) -> BackendInfo {
    let (addr, family) = addr_bytes(b.addr);
    let mut flags = 0;
    if b.in_set() {
        flags |= BACKEND_F_IN_SET;
    }
    if b.local {
        flags |= BACKEND_F_LOCAL;
    }
    if b.drained {
        flags |= lb_common::BACKEND_F_DRAINED;
    }
    if b.in_set() && !b.in_table() {
        flags |= lb_common::BACKEND_F_NO_NEW;
    }
    let (encap_src, encap_mtu) = match b.encap {
        Some(e) => {
            flags |= lb_common::BACKEND_F_ENCAP;
            (addr_bytes(e.src).0, e.mtu)
        }
        None => ([0; 16], 0),
    };
    BackendInfo {
        addr,
        dst_mac: b.mac.unwrap_or_default(),
        src_mac: b.src_mac,
        ifindex: b.ifindex,
        vip_id,
        flags,
        epoch,
        family,
        _pad: 0,
        encap_mtu,
        encap_src,
    }
}
