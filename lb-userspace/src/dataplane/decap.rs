//! The backend side of L3 direct server return: `lb_decap` on a backend's interface unwraps the
//! IP-in-IP packets of the LB nodes it knows (`LB_DECAP_PEERS`) sent to this host
//! (`LB_DECAP_LOCAL`) for the VIPs it serves (`LB_DECAP_VIPS`), and hands the client's packet to
//! the stack, where the VIP lives on `lo`. `lbd decap` runs it (see docs/architecture.md).
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
    /// `serve` keeps them in step with `local_addrs`).
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

/// Every address of this host's interfaces (IPv4 and IPv6).
pub fn local_addrs() -> Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs");
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a list getifaddrs returned, freed below.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()));
                }
                libc::AF_INET6 => {
                    let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(IpAddr::from(a.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        p = ifa.ifa_next;
    }
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}

fn decap_key(addr: IpAddr) -> DecapKey {
    let (addr, family) = addr_bytes(addr);
    DecapKey {
        addr,
        family,
        _pad: [0; 3],
    }
}

/// What `lbd decap` runs with.
#[derive(Clone, Debug)]
pub struct DecapOptions {
    /// Names the pin directory (`<bpffs>/<name>-decap`) and the saved sysctls.
    pub name: String,
    pub interface: String,
    pub lb_nodes: Vec<IpAddr>,
    /// VIPs to serve: held on `lo`, never announced (arp_ignore/arp_announce as lbd sets them).
    pub vips: Vec<IpAddr>,
    pub mode: crate::config::XdpMode,
    /// A TCP port answered while unwrapping (lbd's check of a routed backend connects to it
    /// first); 0: none.
    pub health_port: u16,
    /// Where the ARP sysctls found at start are saved until the stop puts them back.
    pub state_dir: std::path::PathBuf,
}

/// `lbd decap`: unwrap the LB nodes' packets on the interface and serve the VIPs from `lo`
/// until SIGTERM or SIGINT; then detach, and take back the VIPs and sysctls it set.
pub async fn serve(o: DecapOptions) -> Result<()> {
    if o.lb_nodes.is_empty() {
        anyhow::bail!("lb_nodes: name at least one LB node (--lb-node)");
    }
    if o.vips.is_empty() {
        anyhow::bail!("vips: name at least one VIP (--vip): only packets for them are unwrapped");
    }
    let mut d = Decap::load(&o.name, std::path::Path::new("/sys/fs/bpf"))?;
    d.set_peers(&o.lb_nodes)?;
    d.set_vips(&o.vips)?;
    let nl = crate::netlink::Netlink::new()?;
    let saved = o.state_dir.join(format!("{}-decap-sysctls.json", o.name));
    if !o.vips.is_empty() {
        crate::netlink::set_arp_sysctls(&o.interface, &saved)?;
    }
    for vip in &o.vips {
        crate::netlink::ensure_local_vip(nl.handle(), *vip).await?;
    }
    // The VIPs are on `lo` now: part of the host's addresses, as the outer destination may be.
    d.set_local(&local_addrs()?)?;
    d.attach(&o.interface, o.mode)?;
    // Answered only from here on, and gone with the process: lbd's checks of this backend
    // pass only while it unwraps.
    let _health = if o.health_port != 0 {
        let l = tokio::net::TcpListener::bind(("::", o.health_port))
            .await
            .or(tokio::net::TcpListener::bind(("0.0.0.0", o.health_port)).await)
            .with_context(|| format!("health_port {}: listen", o.health_port))?;
        Some(tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        }))
    } else {
        None
    };
    tracing::info!(interface = %o.interface, lb_nodes = ?o.lb_nodes, vips = ?o.vips, "unwrapping IP-in-IP from the LB nodes");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    tick.tick().await;
    // The host's addresses may change (DHCP, an operator): followed within a second.
    let mut addrs = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = addrs.tick() => {
                if let Err(e) = local_addrs().and_then(|a| d.set_local(&a)) {
                    tracing::warn!(error = %format!("{e:#}"), "refreshing the local addresses");
                }
            }
            _ = tick.tick() => {
                if let Ok(s) = d.stats() {
                    tracing::info!(?s, "decap counters");
                }
            }
        }
    }
    if let Ok(s) = d.stats() {
        tracing::info!(?s, "decap counters; stopping");
    }
    drop(d);
    for vip in &o.vips {
        if let Err(e) = crate::netlink::remove_local_vip(nl.handle(), *vip).await {
            tracing::warn!(%vip, error = %format!("{e:#}"), "removing the VIP from lo");
        }
    }
    crate::netlink::restore_arp_sysctls(&saved)?;
    Ok(())
}
