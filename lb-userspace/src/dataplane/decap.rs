//! The backend side of L3 direct server return: `lb_decap` on a backend's interface unwraps the
//! IP-in-IP packets of the LB nodes it knows (`LB_DECAP_PEERS`) sent to this host
//! (`LB_DECAP_LOCAL`) for the VIPs it serves (`LB_DECAP_VIPS`), and hands the client's packet to
//! the stack, where the VIP lives on `lo`. `lbd decap` (`crate::decap`) runs it (see
//! docs/architecture.md).
//!
//! The same BPF object as the load balancer, loaded with its big maps shrunk (a backend needs
//! none of them) and pinned under a directory of its own, so it never meets an LB's pins.

use std::{net::IpAddr, path::PathBuf};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    programs::{Xdp, XdpMode},
};
use lb_common::{DecapKey, decap_stat, maps};

use super::{addr_bytes, ensure_bpffs};

type DecapStats = [u64; decap_stat::COUNT as usize];

pub struct Decap {
    ebpf: Ebpf,
    peers: BpfHashMap<MapData, DecapKey, u32>,
    vips: BpfHashMap<MapData, DecapKey, u32>,
    local: BpfHashMap<MapData, DecapKey, u32>,
    stats: PerCpuArray<MapData, DecapStats>,
    pin_dir: PathBuf,
}

impl Decap {
    /// Load `lb_decap` with its maps pinned under `<bpffs_root>/<name>-decap`.
    pub fn load(name: &str, bpffs_root: &std::path::Path) -> Result<Decap> {
        ensure_bpffs(bpffs_root)?;
        let pin_dir = bpffs_root.join(format!("{name}-decap"));
        // Nothing here is state worth keeping across runs: start clean.
        if pin_dir.exists() {
            std::fs::remove_dir_all(&pin_dir)
                .with_context(|| format!("remove {}", pin_dir.display()))?;
        }
        std::fs::create_dir_all(&pin_dir)
            .with_context(|| format!("create pin directory {}", pin_dir.display()))?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            // The load balancer's maps, unused here: as small as the kernel allows.
            .map_max_entries(maps::TABLES, 2)
            .map_max_entries(maps::NEW_TABLES, 2)
            .map_max_entries(maps::CONNTRACK, 64)
            .map_max_entries(maps::FLOW_CACHE, 64)
            .map_max_entries(maps::HANDSHAKES, 64)
            .load(crate::EBPF_OBJECT)
            .context("load the XDP object")?;
        let prog: &mut Xdp = ebpf
            .program_mut(maps::DECAP_PROGRAM)
            .ok_or_else(|| anyhow!("program {} missing", maps::DECAP_PROGRAM))?
            .try_into()?;
        prog.load()
            .with_context(|| format!("verify and load {}", maps::DECAP_PROGRAM))?;
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| anyhow!("map {name} missing"))
        };
        let peers = BpfHashMap::try_from(take(maps::DECAP_PEERS)?)?;
        let vips = BpfHashMap::try_from(take(maps::DECAP_VIPS)?)?;
        let local = BpfHashMap::try_from(take(maps::DECAP_LOCAL)?)?;
        let stats = PerCpuArray::try_from(
            ebpf.take_map(maps::DECAP_STATS)
                .ok_or_else(|| anyhow!("map {} missing", maps::DECAP_STATS))?,
        )?;
        Ok(Decap {
            ebpf,
            peers,
            vips,
            local,
            stats,
            pin_dir,
        })
    }

    /// Accept wrapped packets from exactly these LB node addresses.
    pub fn set_peers(&mut self, peers: &[IpAddr]) -> Result<()> {
        sync(
            &mut self.peers,
            "lb_nodes",
            peers,
            lb_common::MAX_DECAP_PEERS,
        )
    }

    /// Unwrap only packets whose inner destination is one of these VIPs.
    pub fn set_vips(&mut self, vips: &[IpAddr]) -> Result<()> {
        sync(&mut self.vips, "vips", vips, lb_common::MAX_DECAP_VIPS)
    }

    /// Unwrap only packets whose outer destination is one of these addresses (this host's:
    /// `crate::decap::serve` keeps them in step with its `local_addrs`).
    pub fn set_local(&mut self, addrs: &[IpAddr]) -> Result<()> {
        sync(
            &mut self.local,
            "local addresses",
            addrs,
            lb_common::MAX_DECAP_LOCAL,
        )
    }

    /// Attach to `interface` (detached when this value is dropped).
    pub fn attach(&mut self, interface: &str, mode: crate::config::XdpMode) -> Result<()> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(maps::DECAP_PROGRAM)
            .expect("loaded")
            .try_into()?;
        match mode {
            crate::config::XdpMode::Driver => prog.attach(interface, XdpMode::Driver),
            crate::config::XdpMode::Skb => prog.attach(interface, XdpMode::Skb),
            crate::config::XdpMode::Auto => prog
                .attach(interface, XdpMode::Driver)
                .or_else(|_| prog.attach(interface, XdpMode::Skb)),
        }
        .with_context(|| format!("attach {} to {interface}", maps::DECAP_PROGRAM))?;
        Ok(())
    }

    /// The counters, summed over CPUs, by name.
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>> {
        let per_cpu = self.stats.get(&0, 0)?;
        Ok(decap_stat::NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, per_cpu.iter().map(|c| c[i]).sum()))
            .collect())
    }

    /// Run `lb_decap` on one frame (BPF_PROG_TEST_RUN): verdict and output frame.
    pub fn test_run(&mut self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(maps::DECAP_PROGRAM)
            .expect("loaded")
            .try_into()?;
        super::counters::run_once(prog, frame)
    }
}

impl Drop for Decap {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

/// Make `map` hold exactly `addrs`: new ones added before old ones go, so an address in both
/// is never missing.
fn sync(
    map: &mut BpfHashMap<MapData, DecapKey, u32>,
    what: &str,
    addrs: &[IpAddr],
    max: u32,
) -> Result<()> {
    let want: Vec<DecapKey> = addrs.iter().map(|p| decap_key(*p)).collect();
    if want.len() > max as usize {
        anyhow::bail!("{what}: at most {max}, got {}", want.len());
    }
    let old: Vec<DecapKey> = map.keys().filter_map(|k| k.ok()).collect();
    for k in &want {
        if !old.contains(k) {
            map.insert(k, 1, 0)?;
        }
    }
    for k in old.iter().filter(|k| !want.contains(k)) {
        map.remove(k)?;
    }
    Ok(())
}

fn decap_key(addr: IpAddr) -> DecapKey {
    let (addr, family) = addr_bytes(addr);
    DecapKey {
        addr,
        family,
        _pad: [0; 3],
    }
}
