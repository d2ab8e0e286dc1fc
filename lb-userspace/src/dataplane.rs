//! Loads and attaches the XDP program and is the only writer of its maps.
//!
//! Callers describe what they want ([`Desired`]: services, their backends and whether this node
//! owns each VIP) and [`Dataplane::apply`] makes the maps say exactly that, with two guarantees:
//! - a VIP's Maglev table is replaced atomically: the new table goes into the VIP's idle half
//!   (a memory-mapped array, so this is plain stores), then one map update flips `active_table`;
//! - ids are stable: a (service, backend) pair keeps its backend id for as long as it exists, so
//!   connection-table entries stay valid across updates and across `lbd` restarts (maps and the
//!   XDP link are pinned under `/sys/fs/bpf/<name>/`, and a new `lbd` adopts them).

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray},
    programs::{
        TestRun, TestRunOptions, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
    },
};
use lb_common::{
    BACKEND_F_IN_SET, BACKEND_F_LOCAL, BackendInfo, Counters, FAMILY_V4, FAMILY_V6, FlowKey,
    FlowValue, LbConfig, MAX_BACKENDS, MAX_VIPS, VIP_F_OWNED, VipInfo, VipKey, maps, stat,
    table_index,
};

use crate::maglev;

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// What `lbd` wants the data plane to do, recomputed from config, health, neighbours and VRRP.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub services: Vec<ServiceSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceSpec {
    pub key: VipKey,
    pub owned: bool,
    pub backends: Vec<BackendSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BackendSpec {
    pub addr: IpAddr,
    pub weight: u32,
    /// Where to send frames; `None` when the MAC is not resolved yet (then not in the set).
    pub mac: Option<[u8; 6]>,
    /// Source MAC of the egress interface.
    pub src_mac: [u8; 6],
    /// 0 = the XDP interface itself (XDP_TX), else redirect to this interface.
    pub ifindex: u32,
    /// The backend is this node (its traffic goes to the local stack).
    pub local: bool,
    /// Passing health checks. A failed backend leaves the set: its flows move.
    pub healthy: bool,
    /// Drained: no new flows, established ones stay.
    pub drained: bool,
}

impl BackendSpec {
    /// May keep established flows.
    pub fn in_set(&self) -> bool {
        self.healthy && (self.local || self.mac.is_some())
    }
    /// May receive new flows.
    pub fn in_table(&self) -> bool {
        self.in_set() && !self.drained && self.weight > 0
    }
}

pub fn vip_key(addr: IpAddr, port: u16, proto: u8) -> VipKey {
    let (bytes, family) = addr_bytes(addr);
    VipKey {
        addr: bytes,
        port,
        proto,
        family,
    }
}

pub fn addr_bytes(addr: IpAddr) -> ([u8; 16], u8) {
    let mut b = [0u8; 16];
    match addr {
        IpAddr::V4(a) => {
            b[..4].copy_from_slice(&a.octets());
            (b, FAMILY_V4)
        }
        IpAddr::V6(a) => (a.octets(), FAMILY_V6),
    }
}

pub fn key_addr(addr: &[u8; 16], family: u8) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::from([addr[0], addr[1], addr[2], addr[3]])
    } else {
        IpAddr::from(*addr)
    }
}

/// How the program is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Pins live under `<bpffs_root>/<name>/`.
    pub name: String,
    pub bpffs_root: PathBuf,
    pub table_size: u32,
    pub conntrack_size: u32,
    pub hash_seed: u32,
}

impl LoadOptions {
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs_root.join(&self.name)
    }
}

/// Counters of one service or backend, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

/// What is installed for one (service, backend) pair.
#[derive(Clone, Debug)]
pub struct InstalledBackend {
    pub id: u32,
    pub spec: BackendSpec,
}

#[derive(Clone, Debug)]
struct InstalledService {
    vip_id: u32,
    active: u32,
    owned: bool,
    /// The live table's content (what the idle half is compared against).
    table: Vec<u32>,
    backends: BTreeMap<IpAddr, InstalledBackend>,
}

/// The memory-mapped `LB_TABLES` array, seen as a dense run of u32 slots (elements are
/// `[u32; 2]`, exactly 8 bytes, so the kernel adds no padding between them).
struct TableMemory {
    ptr: *mut u32,
    len: usize,
    bytes: usize,
}

// The mapping is only touched through &mut Dataplane.
unsafe impl Send for TableMemory {}

impl TableMemory {
    fn map(map: &MapData, slots: u32) -> Result<Self> {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let bytes = (slots as usize * 4).div_ceil(page) * page;
        let fd = map.fd().as_fd().as_raw_fd();
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "mmap of {}: {}",
                maps::TABLES,
                std::io::Error::last_os_error()
            );
        }
        Ok(TableMemory {
            ptr: ptr.cast(),
            len: slots as usize,
            bytes,
        })
    }

    fn slice(&self, start: usize, len: usize) -> &[u32] {
        assert!(start + len <= self.len);
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) }
    }

    fn write(&mut self, start: usize, data: &[u32]) {
        assert!(start + data.len() <= self.len);
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(start), data.len()) };
        // The flip of `active_table` that follows is a syscall (a full barrier), but make the
        // ordering explicit: every slot is visible before the table can become live.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for TableMemory {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
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
    vip_gen: Array<MapData, u32>,
    backend_stats: PerCpuArray<MapData, Counters>,
    tables: TableMemory,
    _tables_map: MapData,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    services: HashMap<VipKey, InstalledService>,
    /// Backend ids handed out; ids are reused only after every never-used one is gone.
    next_backend_id: u32,
    free_backend_ids: Vec<u32>,
    attached: Option<String>,
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
        drop_mismatched_pins(
            &pin_dir,
            &[
                (maps::TABLES, table_entries),
                (maps::CONNTRACK, opts.conntrack_size),
            ],
        )?;

        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .map_max_entries(maps::TABLES, table_entries)
            .map_max_entries(maps::CONNTRACK, opts.conntrack_size)
            .load(crate::EBPF_OBJECT)
            .context("load the XDP object")?;
        for name in [maps::PROGRAM, "lb_baseline", "lb_pass"] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("program {name} missing"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("verify and load {name}"))?;
        }
        // The program's rare-path log lines (aya-log); optional so a missing map is not fatal.
        let logger = aya_log::EbpfLogger::init(&mut ebpf).ok();
        let tables_map: MapData = match ebpf.take_map(maps::TABLES) {
            Some(Map::Array(m)) => m,
            _ => bail!("map {} missing or not an array", maps::TABLES),
        };
        let tables = TableMemory::map(&tables_map, table_entries * 2)?;

        let mut dp = Dataplane {
            config: take(&mut ebpf, maps::CONFIG)?,
            vips: take(&mut ebpf, maps::VIPS)?,
            vip_addrs: take(&mut ebpf, maps::VIP_ADDRS)?,
            backends: take(&mut ebpf, maps::BACKENDS)?,
            conntrack: take(&mut ebpf, maps::CONNTRACK)?,
            stats: take(&mut ebpf, maps::STATS)?,
            vip_stats: take(&mut ebpf, maps::VIP_STATS)?,
            vip_gen: take(&mut ebpf, maps::VIP_GEN)?,
            backend_stats: take(&mut ebpf, maps::BACKEND_STATS)?,
            ebpf,
            tables,
            _tables_map: tables_map,
            logger,
            services: HashMap::new(),
            next_backend_id: 0,
            free_backend_ids: Vec::new(),
            attached: None,
            opts,
        };
        let old = dp.config.get(&0, 0).unwrap_or_default();
        let cfg = LbConfig {
            hash_seed: dp.opts.hash_seed,
            table_size: dp.opts.table_size,
            ..old
        };
        if old.table_size != 0 && (old.hash_seed, old.table_size) != (cfg.hash_seed, cfg.table_size)
        {
            // Another seed or size invalidates the adopted tables: start clean.
            tracing::warn!(?old, new = ?cfg, "pinned state used other settings; resetting it");
            dp.clear_all()?;
        }
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
        let mut max_id = 0;
        let mut used = vec![false; MAX_BACKENDS as usize];
        let mut services: HashMap<VipKey, InstalledService> = by_id
            .values()
            .map(|(k, v)| {
                let size = self.opts.table_size as usize;
                let start = table_index(v.vip_id, v.active_table, self.opts.table_size, 0) as usize;
                let table = self.tables.slice(start, size).to_vec();
                (
                    *k,
                    InstalledService {
                        vip_id: v.vip_id,
                        active: v.active_table,
                        owned: v.flags & VIP_F_OWNED != 0,
                        table,
                        backends: BTreeMap::new(),
                    },
                )
            })
            .collect();
        for id in 0..MAX_BACKENDS {
            let b = self.backends.get(&id, 0)?;
            if b.flags == 0 && b.family == 0 {
                continue;
            }
            let Some((key, _)) = by_id.get(&b.vip_id) else {
                continue;
            };
            let Some(svc) = services.get_mut(key) else {
                continue;
            };
            let addr = key_addr(&b.addr, b.family);
            used[id as usize] = true;
            max_id = max_id.max(id + 1);
            let in_set = b.flags & BACKEND_F_IN_SET != 0;
            svc.backends.insert(
                addr,
                InstalledBackend {
                    id,
                    spec: BackendSpec {
                        addr,
                        weight: 1,
                        mac: (b.flags & BACKEND_F_LOCAL == 0 && in_set).then_some(b.dst_mac),
                        src_mac: b.src_mac,
                        ifindex: b.ifindex,
                        local: b.flags & BACKEND_F_LOCAL != 0,
                        healthy: in_set,
                        drained: b.flags & lb_common::BACKEND_F_DRAINED != 0,
                    },
                },
            );
        }
        self.next_backend_id = max_id;
        self.free_backend_ids = (0..max_id).filter(|i| !used[*i as usize]).collect();
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
            self.backends.set(id, BackendInfo::default(), 0)?;
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
        Ok(())
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

    /// Make the maps match `want`. Order matters for packets in flight: backends are written
    /// before any table names them, and are taken out of the set only after the tables stop
    /// naming them.
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
        if cfg.flags != flags || cfg.addr_filter != filter {
            cfg.flags = flags;
            cfg.addr_filter = filter;
            self.config.set(0, cfg, 0)?;
        }
        Ok(())
    }

    fn alloc_vip_id(&self) -> Result<u32> {
        let used: Vec<u32> = self.services.values().map(|s| s.vip_id).collect();
        (0..MAX_VIPS)
            .find(|i| !used.contains(i))
            .ok_or_else(|| anyhow!("more than {MAX_VIPS} VIP services"))
    }

    fn alloc_backend_id(&mut self) -> Result<u32> {
        if self.next_backend_id < MAX_BACKENDS {
            self.next_backend_id += 1;
            return Ok(self.next_backend_id - 1);
        }
        self.free_backend_ids
            .pop()
            .ok_or_else(|| anyhow!("more than {MAX_BACKENDS} backends"))
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
                    backends: BTreeMap::new(),
                },
            );
            // Counters of a reused id start from zero, and its generation moves on so no
            // connection-table entry of the id's previous VIP can match.
            self.reset_counters(vip_id, true)?;
            self.bump_generation(vip_id, false)?;
        }
        let vip_id = self.services[&key].vip_id;

        // Backends: allocate ids for new pairs and write their info (added to the set first).
        let mut entries = Vec::new();
        for b in &spec.backends {
            let existing = self.services[&key].backends.get(&b.addr).map(|i| i.id);
            let id = match existing {
                Some(id) => id,
                None => {
                    let id = self.alloc_backend_id()?;
                    self.reset_counters(id, false)?;
                    id
                }
            };
            let svc = self.services.get_mut(&key).expect("present");
            let changed = svc
                .backends
                .get(&b.addr)
                .map(|i| &i.spec != b)
                .unwrap_or(true);
            svc.backends.insert(
                b.addr,
                InstalledBackend {
                    id,
                    spec: b.clone(),
                },
            );
            if changed {
                self.backends.set(id, backend_info(vip_id, b), 0)?;
            }
            if b.in_table() {
                entries.push(maglev::Entry {
                    addr: b.addr,
                    weight: b.weight,
                    id,
                });
            }
        }

        // Table: install into the idle half, then flip.
        let table = maglev::build(&entries, self.opts.table_size);
        let svc = self.services.get_mut(&key).expect("present");
        let mut info = VipInfo {
            vip_id,
            flags: if spec.owned { VIP_F_OWNED } else { 0 },
            active_table: svc.active,
            _pad: 0,
        };
        let fresh = self.vips.get(&key, 0).is_err();
        if table != svc.table {
            let idle = svc.active ^ 1;
            let start = table_index(vip_id, idle, self.opts.table_size, 0) as usize;
            self.tables.write(start, &table);
            info.active_table = idle;
            self.vips.insert(key, info, 0)?;
            svc.active = idle;
            svc.table = table;
            svc.owned = spec.owned;
        } else if fresh || svc.owned != spec.owned {
            self.vips.insert(key, info, 0)?;
            svc.owned = spec.owned;
        }
        self.set_gen_owned(vip_id, spec.owned)?;
        let svc = self.services.get_mut(&key).expect("present");

        // Pairs no longer wanted: out of the set only now that no table names them.
        let wanted: Vec<IpAddr> = spec.backends.iter().map(|b| b.addr).collect();
        let removed: Vec<InstalledBackend> = svc
            .backends
            .values()
            .filter(|b| !wanted.contains(&b.spec.addr))
            .cloned()
            .collect();
        for b in removed {
            svc.backends.remove(&b.spec.addr);
            self.backends.set(b.id, BackendInfo::default(), 0)?;
            self.free_backend_ids.push(b.id);
        }
        Ok(())
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

    /// Start a new generation of `vip_id` (its entries in the connection table stop matching).
    fn bump_generation(&mut self, vip_id: u32, owned: bool) -> Result<()> {
        let old = self.vip_gen.get(&vip_id, 0)?;
        let next = ((old >> 1).wrapping_add(1) << 1) | owned as u32;
        self.vip_gen.set(vip_id, next, 0)?;
        Ok(())
    }

    fn set_gen_owned(&mut self, vip_id: u32, owned: bool) -> Result<()> {
        let old = self.vip_gen.get(&vip_id, 0)?;
        let next = (old & !lb_common::VIP_GEN_OWNED) | owned as u32;
        if next != old {
            self.vip_gen.set(vip_id, next, 0)?;
        }
        Ok(())
    }

    fn remove_service(&mut self, key: &VipKey) -> Result<()> {
        let Some(svc) = self.services.remove(key) else {
            return Ok(());
        };
        // The VIP entry and generation go first: after them, no packet reaches its backends.
        let _ = self.vips.remove(key);
        self.bump_generation(svc.vip_id, false)?;
        for b in svc.backends.values() {
            self.backends.set(b.id, BackendInfo::default(), 0)?;
            self.free_backend_ids.push(b.id);
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
            self.set_gen_owned(vip_id, owned)?;
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

    pub fn global_stats(&self) -> Result<Vec<(&'static str, u64)>> {
        let per_cpu = self.stats.get(&0, 0)?;
        Ok(stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, per_cpu.iter().map(|c| c[i]).sum()))
            .collect())
    }

    fn sum(map: &PerCpuArray<MapData, Counters>, id: u32) -> Result<Traffic> {
        let v = map.get(&id, 0)?;
        Ok(v.iter().fold(Traffic::default(), |t, c| Traffic {
            packets: t.packets + c.packets,
            bytes: t.bytes + c.bytes,
            new_flows: t.new_flows + c.new_flows,
        }))
    }

    pub fn vip_traffic(&self, vip_id: u32) -> Result<Traffic> {
        Self::sum(&self.vip_stats, vip_id)
    }

    pub fn backend_traffic(&self, backend_id: u32) -> Result<Traffic> {
        Self::sum(&self.backend_stats, backend_id)
    }

    /// Entries in the connection table (walks the map: for status, not for hot paths).
    pub fn conntrack_entries(&self) -> usize {
        self.conntrack.keys().filter(|k| k.is_ok()).count()
    }

    /// Run one of the object's XDP programs on `frame` with BPF_PROG_TEST_RUN.
    /// Returns (verdict, output frame, average ns per run).
    pub fn test_run(
        &mut self,
        program: &str,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, Vec<u8>, f64)> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("no program {program}"))?
            .try_into()?;
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat: repeat.max(1),
            ..TestRunOptions::new()
        };
        let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, out, r.duration.as_nanos() as f64))
    }
}

fn backend_info(vip_id: u32, b: &BackendSpec) -> BackendInfo {
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
    BackendInfo {
        addr,
        dst_mac: b.mac.unwrap_or_default(),
        src_mac: b.src_mac,
        ifindex: b.ifindex,
        vip_id,
        flags,
        family,
        _pad: [0; 3],
    }
}

/// Remove pins of maps whose size differs from what we will create (a changed `table_size` or
/// `conntrack_size`); aya would otherwise adopt the old map with the old size.
fn drop_mismatched_pins(dir: &Path, sizes: &[(&str, u32)]) -> Result<()> {
    for (name, entries) in sizes {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let keep = aya::maps::MapInfo::from_pin(&path)
            .map(|info| info.max_entries() == *entries)
            .unwrap_or(false);
        if !keep {
            tracing::warn!(map = name, "pinned map has another size; replacing it");
            std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
    }
    Ok(())
}
