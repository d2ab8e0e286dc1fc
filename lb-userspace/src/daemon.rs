//! `lbd`'s wiring: gathers facts (netlink, health, VRRP), asks [`crate::plan`] what the data
//! plane should do, hands that to [`crate::dataplane`], and answers the API. No policy lives here.

use std::{
    collections::HashSet,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};
use tokio::sync::Mutex;

mod churn;
mod conntrack;
mod fate;
mod reload;
mod rollback;
mod supervise;

pub use rollback::teardown;
#[path = "daemon_bgp.rs"]
mod bgp_wiring;

use crate::{
    api::{self, Request, Response},
    bgp,
    config::Config,
    dataplane::{Dataplane, LoadOptions, vip_key},
    handover::Handover,
    health::{CheckKind, Health, HealthEvent, HealthMonitor, Target},
    metrics,
    netlink::{self, Netlink},
    plan::{self, BackendPlan, Facts, HealthFact},
    vrrp::{Instance, InstanceConfig},
};

/// Health-check id prefix of tracked local checks (VRRP priority), next to `<vip>/<backend>`.
const TRACK_PREFIX: &str = "track/";

/// Health-check targets for every checked backend. Ids are `<vip name>/<backend address>`.
/// `up` lists pairs known good (adopted from a previous lbd): they start up, so a restart changes
/// no table until a check says otherwise. Others start unknown and get no flows until they pass.
pub fn health_targets(cfg: &Config, up: &HashSet<(String, IpAddr)>) -> Vec<Target> {
    let mut out: Vec<Target> = cfg
        .track
        .iter()
        .filter_map(|t| {
            let addr = t.address?;
            Some(Target::new(
                format!("{TRACK_PREFIX}{}", t.name),
                addr,
                t.health.clone(),
            ))
        })
        .collect();
    for v in &cfg.vips {
        if v.health.kind == CheckKind::None {
            continue;
        }
        let Some(port) = v.health.port.or(v.ports.first().copied()) else {
            continue;
        };
        for b in &v.backends {
            let mut t = Target::new(
                format!("{}/{}", v.name, b.address),
                std::net::SocketAddr::new(b.address, port),
                v.health.clone(),
            );
            if up.contains(&(v.name.clone(), b.address)) {
                t = t.starting(Health::Up);
            }
            if b.encap == crate::config::EncapMode::Ipip && b.decap_health_port != 0 {
                t = t.gated(std::net::SocketAddr::new(b.address, b.decap_health_port));
            }
            out.push(t);
        }
    }
    out
}

/// Facts for checked backends before any result: pairs known good are up, the rest wait.
fn initial_health(
    cfg: &Config,
    up: &HashSet<(String, IpAddr)>,
) -> std::collections::HashMap<(String, IpAddr), HealthFact> {
    let mut m = std::collections::HashMap::new();
    for v in &cfg.vips {
        if v.health.kind == CheckKind::None {
            continue;
        }
        for b in &v.backends {
            let pair = (v.name.clone(), b.address);
            let healthy = up.contains(&pair);
            let reason = if healthy {
                "adopted as up; rechecking"
            } else {
                "not checked yet"
            };
            m.insert(
                pair,
                HealthFact {
                    healthy,
                    reason: reason.into(),
                    hold_until: None,
                },
            );
        }
    }
    m
}

/// Where pins live unless LB_BPFFS overrides it (tests and labs use their own directory).
pub fn bpffs_root() -> PathBuf {
    std::env::var_os("LB_BPFFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/sys/fs/bpf".into())
}

pub fn load_options(cfg: &Config) -> LoadOptions {
    LoadOptions {
        name: cfg.name.clone(),
        bpffs_root: bpffs_root(),
        table_size: cfg.table_size,
        conntrack_size: cfg.conntrack_size,
        hash_seed: cfg.hash_seed,
        syn_flood_rate: cfg.syn_flood_rate,
    }
}

pub use crate::status::{BackendRow, CheckRow, VipRow};

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

struct Inner {
    cfg: Config,
    config_path: PathBuf,
    dp: Dataplane,
    facts: Facts,
    rows: Vec<BackendPlan>,
    ifindex: u32,
    reloads: u64,
    reload_failures: u64,
    last_reload_error: Option<String>,
    health: HealthMonitor,
    /// The last apply succeeded: the maps say what `cfg` and `facts` ask for.
    in_sync: bool,
}

/// A running VRRP instance and what its tracked checks last added to its priority.
struct VrrpHandle {
    cfg: InstanceConfig,
    instance: Instance,
    // [issue 20.4] weights and FAULT by keepalived's rules.
    weight: crate::vrrp::track::Tracking,
}

pub struct Daemon {
    inner: Mutex<Inner>,
    vrrp: Mutex<Vec<VrrpHandle>>,
    /// Tracked checks by name: passing or not.
    tracks: Mutex<std::collections::HashMap<String, bool>>,
    netlink: Netlink,
    started: SystemTime,
    ready: std::sync::atomic::AtomicBool,
    /// Held for a whole reload, so two reloads (SIGHUP and the API) never interleave.
    reload_lock: Mutex<()>,
    /// The first task failure (see `supervise.rs`).
    supervisor: Arc<supervise::Supervisor>,
    /// The XDP program is attached to the interface as it is now.
    attached: std::sync::atomic::AtomicBool,
    /// `start_vrrp` has run: every configured instance should be running.
    vrrp_started: std::sync::atomic::AtomicBool,
    /// When the main loop last ran (ms since `started`): /healthz fails when it is stale.
    last_tick_ms: std::sync::atomic::AtomicU64,
    /// The connection table's size, counted in the background (never under `inner`).
    conntrack: Arc<conntrack::ConntrackCount>,
    /// VRRP instances whose VIPs the previous lbd was forwarding (adopted pinned state).
    adopted_master: HashSet<String>,
    /// VIPs owned without VRRP, held on the interface and announced.
    static_vips: Mutex<crate::static_vip::StaticVips>,
    /// BGP announcements (VIPs with `announce = "bgp"`).
    bgp: Mutex<bgp::Announcer>,
    /// A `[[bgp]]` section was in effect: routes may need withdrawing after a reload drops it.
    bgp_active: std::sync::atomic::AtomicBool,
    /// Interface checks so far (see `churn.rs`).
    churn_checks: std::sync::atomic::AtomicU64,
    /// Gives the VRRP VIPs back if this process dies without stopping (`lbd run` only).
    guardian: std::sync::OnceLock<crate::guardian::Guardian>,
}

/// The main loop ticks every second; this long without a tick means lbd is wedged.
const LIVENESS_STALE: Duration = Duration::from_secs(10);

impl Daemon {
    /// Load the program, adopt or create pinned state, attach, and apply the config once.
    /// Health events arrive on the returned receiver; feed them to [`Daemon::health_event`].
    pub async fn start(
        config_path: PathBuf,
        cfg: Config,
    ) -> Result<(
        Arc<Daemon>,
        tokio::sync::mpsc::UnboundedReceiver<HealthEvent>,
    )> {
        let netlink = Netlink::new()?;
        let link = netlink.link(&cfg.interface).await?;
        // A link pinned to a device that was deleted since (the interface was recreated) must
        // not make every start fail: drop it and attach afresh.
        churn::drop_stale_link_pin(&churn::link_pin(&load_options(&cfg), &cfg.interface), &link)?;
        let cfg_interface = cfg.interface.clone();
        let mut dp = Dataplane::load(load_options(&cfg))?;
        dp.attach(&cfg.interface, cfg.xdp_mode)?;
        if cfg.socket_lb
            && let Err(e) = dp.attach_sock()
        {
            tracing::error!(error = %format!("{e:#}"), "socket load balancing is off: this node's own connections to a VIP go to its local stack");
        }
        dp.spawn_log_reader()?;
        let conntrack = conntrack::spawn_counter(
            load_options(&cfg)
                .pin_dir()
                .join(lb_common::maps::CONNTRACK),
        );
        let up = adopted_up(&cfg, &dp);
        let drained = adopted_drained(&cfg, &dp);
        let vrrp_master = adopted_ownership(&cfg, &dp);
        let (health, events) = HealthMonitor::start(health_targets(&cfg, &up));
        let facts = Facts {
            if_mac: link.mac,
            health: initial_health(&cfg, &up),
            drained,
            vrrp_master: vrrp_master.clone(),
            ..Default::default()
        };
        let bgp_drained = bgp::drain_marker(&cfg).exists();
        let daemon = Arc::new(Daemon {
            inner: Mutex::new(Inner {
                cfg,
                config_path,
                dp,
                facts,
                rows: Vec::new(),
                ifindex: link.index,
                reloads: 0,
                reload_failures: 0,
                last_reload_error: None,
                in_sync: false,
                health,
            }),
            bgp: Mutex::new(
                bgp::Announcer::new(netlink.handle().clone()).with_drained(bgp_drained),
            ),
            bgp_active: false.into(),
            netlink,
            vrrp: Mutex::new(Vec::new()),
            tracks: Mutex::new(std::collections::HashMap::new()),
            started: SystemTime::now(),
            ready: false.into(),
            reload_lock: Mutex::new(()),
            supervisor: Arc::default(),
            attached: true.into(),
            vrrp_started: false.into(),
            last_tick_ms: 0.into(),
            conntrack,
            adopted_master: vrrp_master.into_keys().collect(),
            static_vips: Mutex::new(crate::static_vip::StaticVips::new(&cfg_interface)),
            churn_checks: 0.into(),
            guardian: std::sync::OnceLock::new(),
        });
        daemon.refresh().await?;
        daemon
            .ready
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok((daemon, events))
    }

    /// Prepare this node as a DSR backend of its VRRP VIPs, then start the VRRP instances; each
    /// instance's master state drives the ownership of its VIPs in the data plane.
    pub async fn start_vrrp(self: &Arc<Self>) -> Result<()> {
        let cfg = self.config().await;
        self.static_vips
            .lock()
            .await
            .set(self.netlink.handle(), &cfg)
            .await?;
        if cfg.vrrp.is_empty() {
            return Ok(());
        }
        if cfg.dsr_backend {
            netlink::set_arp_sysctls(&cfg.interface, &rollback::saved_sysctls(&cfg))?;
            for r in &cfg.vrrp {
                for vip in &r.vips {
                    netlink::ensure_local_vip(self.netlink.handle(), *vip).await?;
                }
            }
        }
        // VIPs an earlier configuration left (our label, no instance owns them now). Each
        // instance removes its own stale VIPs itself when it starts, and only those.
        let mut interfaces: Vec<String> = cfg
            .vrrp
            .iter()
            .map(|r| r.interface.clone().unwrap_or_else(|| cfg.interface.clone()))
            .collect();
        interfaces.sort();
        interfaces.dedup();
        // [issue 20.2] static VIPs on the same interface are not leftovers either.
        let keep: Vec<IpAddr> = crate::static_vip::configured_vips(&cfg);
        for ifname in &interfaces {
            let removed =
                crate::vrrp::announce::remove_orphans(self.netlink.handle(), ifname, &keep).await?;
            if !removed.is_empty() {
                tracing::info!(interface = %ifname, ?removed, "removed VIPs of an earlier configuration");
            }
        }
        for r in &cfg.vrrp {
            self.spawn_instance(r.clone(), &cfg.interface).await?;
        }
        self.vrrp_started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.sync_tracking().await;
        Ok(())
    }

    async fn spawn_instance(self: &Arc<Self>, r: InstanceConfig, interface: &str) -> Result<()> {
        let mut instance = Instance::spawn(r.clone(), interface, self.netlink.handle().clone())
            .await
            .with_context(|| format!("start VRRP instance {}", r.name))?;
        self.watch_peer_failures(&mut instance, &r.name);
        let mut owned = instance.ownership();
        let forwarding = instance.forwarding_ack();
        let (d, name) = (self.clone(), r.name.clone());
        let grace = Duration::from_millis(self.config().await.handover_grace_ms);
        // After a crash and a quick restart, clients may still send to this node (their ARP/ND
        // caches) until another node has taken over and announced it. Keep forwarding with the
        // adopted table until the new master can have done so, instead of answering from the
        // local stack with resets: the instance's master-down interval plus a second.
        let hold = if self.adopted_master.contains(&r.name) {
            let interval = Duration::from_millis(u64::from(r.interval_ms()));
            crate::vrrp::state::master_down_interval(r.priority, interval) + Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        tokio::spawn(async move {
            // Mastership drives forwarding, through the handover grace (see `handover`).
            let mut handover = Handover::adopted(grace, hold, Instant::now());
            let mut f = handover.observe(*owned.borrow_and_update(), Instant::now());
            loop {
                tracing::info!(instance = %name, master = *owned.borrow(), forward = f.forward, grace_until = ?f.until, "VRRP ownership");
                if let Err(e) = d
                    .update_facts(|facts| {
                        facts.vrrp_master.insert(name.clone(), f.forward);
                    })
                    .await
                {
                    tracing::error!(error = %format!("{e:#}"), "applying VRRP ownership");
                }
                // The instance announces its VIPs only once the data plane forwards them.
                if let Some(ack) = &forwarding {
                    let _ = ack.send(f.forward);
                }
                // When the instance is gone (lbd stopping, or a reload replacing it) this
                // watcher stops without another write: `stop_vrrp` runs the stop's grace, and a
                // replacing instance's watcher owns the fact from then on.
                f = match f.until {
                    Some(until) => tokio::select! {
                        r = owned.changed() => {
                            if r.is_err() {
                                break;
                            }
                            handover.observe(*owned.borrow_and_update(), Instant::now())
                        }
                        _ = tokio::time::sleep_until(until.into()) => handover.at(Instant::now()),
                    },
                    None => {
                        if owned.changed().await.is_err() {
                            break;
                        }
                        handover.observe(*owned.borrow_and_update(), Instant::now())
                    }
                };
            }
        });
        self.vrrp.lock().await.push(VrrpHandle {
            cfg: r,
            instance,
            weight: Default::default(),
        });
        Ok(())
    }

    /// Push each instance's tracked weight (checks passing, load balancer ready) if it changed.
    async fn sync_tracking(&self) {
        let passing = self.tracks.lock().await.clone();
        let weights: Vec<(String, crate::vrrp::track::Tracking)> = {
            let g = self.inner.lock().await;
            g.cfg
                .vrrp
                .iter()
                .map(|r| {
                    (
                        r.name.clone(),
                        plan::track_weight(&g.cfg, &r.name, &passing, &g.rows),
                    )
                })
                .collect()
        };
        let mut handles = self.vrrp.lock().await;
        for h in handles.iter_mut() {
            let w = weights
                .iter()
                .find(|(n, _)| *n == h.cfg.name)
                .map(|(_, w)| *w)
                .unwrap_or_default();
            if w != h.weight {
                tracing::info!(instance = %h.cfg.name, weight = w.weight, fault = w.fault, "tracked weight changed");
                h.instance.set_track_weight(w).await;
                h.weight = w;
            }
        }
    }

    /// Stop every VRRP instance gracefully (priority-0 adverts, VIPs removed) and stop
    /// forwarding for their VIPs.
    /// An instance that was master keeps forwarding through the handover grace
    /// (`handover_grace_ms`) before lbd exits: clients that have not yet learnt the new owner
    /// keep their connections.
    pub async fn stop_vrrp(&self) {
        let handles = std::mem::take(&mut *self.vrrp.lock().await);
        let forwarding = self
            .inner
            .lock()
            .await
            .facts
            .vrrp_master
            .values()
            .any(|m| *m);
        for h in handles {
            h.instance.shutdown().await;
        }
        if forwarding {
            let grace = Duration::from_millis(self.config().await.handover_grace_ms);
            tracing::info!(
                ?grace,
                "handover: forwarding for the new owner's clients until the grace ends"
            );
            tokio::time::sleep(grace).await;
        }
        let _ = self.update_facts(|f| f.vrrp_master.clear()).await;
    }

    pub async fn vrrp_status(&self) -> serde_json::Value {
        let passing = self.tracks.lock().await.clone();
        let (cfg, ready): (Config, Vec<(String, bool)>) = {
            let g = self.inner.lock().await;
            let ready = g
                .cfg
                .vrrp
                .iter()
                .map(|r| (r.name.clone(), plan::lb_ready(&g.cfg, &r.name, &g.rows)))
                .collect();
            (g.cfg.clone(), ready)
        };
        let handles = self.vrrp.lock().await;
        let list: Vec<serde_json::Value> = handles
            .iter()
            .map(|h| {
                let mut v = serde_json::to_value(h.instance.status()).unwrap_or_default();
                let tracks: Vec<serde_json::Value> = cfg
                    .track
                    .iter()
                    .filter(|t| t.instance == h.cfg.name)
                    .map(|t| {
                        serde_json::json!({
                            "name": t.name,
                            "weight": t.weight,
                            "check": t.address.map(|a| a.to_string()).unwrap_or_else(|| "load balancer ready".into()),
                            "passing": match t.address {
                                Some(_) => passing.get(&t.name).copied().unwrap_or(false),
                                None => ready.iter().any(|(n, r)| *n == h.cfg.name && *r),
                            },
                        })
                    })
                    .collect();
                v["tracks"] = tracks.into();
                v["track_weight"] = h.weight.weight.into();
                v["track_fault"] = h.weight.fault.into();
                v
            })
            .collect();
        list.into()
    }

    /// A backend's health changed: rebuild that VIP's table (the plan does the rest).
    pub async fn health_event(&self, e: HealthEvent) -> Result<()> {
        if let Some(track) = e.id.strip_prefix(TRACK_PREFIX) {
            tracing::info!(track, passing = e.healthy, reason = %e.reason, "tracked check changed");
            self.tracks
                .lock()
                .await
                .insert(track.to_string(), e.healthy);
            self.sync_tracking().await;
            return Ok(());
        }
        let Some((vip, addr)) = e.id.rsplit_once('/') else {
            return Ok(());
        };
        let Ok(addr) = addr.parse::<IpAddr>() else {
            return Ok(());
        };
        tracing::info!(vip, backend = %addr, healthy = e.healthy, reason = %e.reason, "backend health changed");
        let pair = (vip.to_string(), addr);
        let mut g = self.inner.lock().await;
        let hold = Duration::from_millis(g.cfg.failed_backend_hold_ms);
        let fact = match g.facts.health.get(&pair) {
            _ if e.healthy => HealthFact {
                healthy: true,
                reason: e.reason.clone(),
                hold_until: None,
            },
            // Already failing (e.g. taken out by fate sharing): its hold runs on.
            Some(old) if !old.healthy => HealthFact {
                reason: e.reason.clone(),
                ..old.clone()
            },
            // Up until now: it may hold established flows.
            Some(_) if e.previous == Health::Up => {
                HealthFact::failed(e.reason.clone(), Instant::now(), hold)
            }
            _ => HealthFact {
                healthy: false,
                reason: e.reason.clone(),
                hold_until: None,
            },
        };
        g.facts.health.insert(pair, fact);
        g.apply()?;
        drop(g);
        self.sync_tracking().await;
        Ok(())
    }

    /// Re-read kernel facts (interface, neighbours, local addresses) and re-apply the plan.
    pub async fn refresh(&self) -> Result<()> {
        self.follow_interface().await?;
        let (ifindex, iface, backends, routed) = {
            let g = self.inner.lock().await;
            let (routed, backends): (Vec<&crate::config::BackendConfig>, Vec<_>) = g
                .cfg
                .vips
                .iter()
                .flat_map(|v| v.backends.iter())
                .partition(|b| b.encap == crate::config::EncapMode::Ipip);
            let addrs = |v: Vec<&crate::config::BackendConfig>| -> Vec<IpAddr> {
                v.into_iter().map(|b| b.address).collect()
            };
            (
                g.ifindex,
                g.cfg.interface.clone(),
                addrs(backends),
                addrs(routed),
            )
        };
        // Routed backends: the path to each; only one through the XDP interface can be used.
        let mut paths = std::collections::HashMap::new();
        for b in &routed {
            match self.netlink.route_to(*b).await {
                Ok(p) if p.oif == ifindex => {
                    paths.insert(*b, p);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(backend = %b, error = %format!("{e:#}"), "no route"),
            }
        }
        let next_hops: Vec<IpAddr> = paths.values().map(|p| p.next_hop).collect();
        let peers = self.vrrp_peers().await;
        let all: Vec<IpAddr> = backends
            .iter()
            .chain(&peers)
            .chain(&next_hops)
            .copied()
            .collect();
        let mut macs = self.netlink.macs_on(ifindex, &all).await?;
        let local_addrs = self.netlink.local_addresses().await?;
        for b in &all {
            if !macs.contains_key(b) && !local_addrs.contains(b) {
                netlink::trigger_resolution(&iface, *b);
            }
        }
        let peer_macs = peers
            .iter()
            .filter(|p| !backends.contains(p))
            .filter_map(|p| macs.remove(p).map(|m| (*p, m)))
            .collect();
        let mut g = self.inner.lock().await;
        // Only unicast addresses of real interfaces count; VIPs themselves are not backends.
        let vips: HashSet<IpAddr> = g.cfg.vips.iter().map(|v| v.address).collect();
        let local_addrs: HashSet<IpAddr> = local_addrs
            .into_iter()
            .filter(|a| !vips.contains(a))
            .collect();
        // Refreshes come every second and on every neighbour notification (many under load):
        // with nothing new, re-applying would only rebuild every Maglev table to find it equal.
        // A failed backend's hold that has run out is news: its flows move now.
        let now = Instant::now();
        let hold_over = g
            .facts
            .health
            .values()
            .any(|h| h.hold_until.is_some_and(|t| t <= now));
        let unchanged = g.facts.macs == macs
            && g.facts.peer_macs == peer_macs
            && g.facts.local_addrs == local_addrs
            && g.facts.paths == paths
            && !hold_over;
        g.facts.paths = paths;
        g.facts.macs = macs;
        g.facts.peer_macs = peer_macs;
        g.facts.local_addrs = local_addrs;
        if !(unchanged && g.in_sync) {
            g.apply()?;
        }
        drop(g);
        self.sync_bgp().await;
        Ok(())
    }

    /// Addresses of the other VRRP speakers: configured unicast peers and each instance's
    /// current master (for the loop guard).
    async fn vrrp_peers(&self) -> Vec<IpAddr> {
        let handles = self.vrrp.lock().await;
        let mut peers: Vec<IpAddr> = handles
            .iter()
            .flat_map(|h| {
                let status = h.instance.status();
                let master = status.master.filter(|m| *m != status.primary_addr);
                h.cfg.unicast_peers.iter().copied().chain(master)
            })
            .collect();
        peers.sort();
        peers.dedup();
        peers
    }

    pub async fn set_drained(&self, vip: &str, backend: IpAddr, drained: bool) -> Result<()> {
        let mut g = self.inner.lock().await;
        let Some(v) = g
            .cfg
            .vips
            .iter()
            .find(|v| v.name == vip || v.address.to_string() == vip)
        else {
            bail!("no VIP named {vip:?}");
        };
        if !v.backends.iter().any(|b| b.address == backend) {
            bail!("{backend} is not a backend of VIP {}", v.name);
        }
        let pair = (v.name.clone(), backend);
        if drained {
            g.facts.drained.insert(pair);
        } else {
            g.facts.drained.remove(&pair);
        }
        g.apply()
    }

    /// Update facts from outside (health, VRRP) and re-apply.
    pub async fn update_facts(&self, f: impl FnOnce(&mut Facts)) -> Result<()> {
        {
            let mut g = self.inner.lock().await;
            f(&mut g.facts);
            g.apply()?;
        }
        self.sync_tracking().await;
        self.sync_bgp().await;
        Ok(())
    }

    pub async fn config(&self) -> Config {
        self.inner.lock().await.cfg.clone()
    }

    pub async fn backends(&self) -> Result<Vec<BackendRow>> {
        let g = self.inner.lock().await;
        let checks = g.health.status();
        let mut out = Vec::new();
        for (i, port) in g.cfg.services() {
            let v = &g.cfg.vips[i];
            let key = vip_key(v.address, port, v.protocol.number());
            let installed = g.dp.installed(&key);
            for r in g.rows.iter().filter(|r| r.vip == v.name) {
                let traffic = installed
                    .iter()
                    .find(|b| b.spec.addr == r.addr)
                    .map(|b| g.dp.backend_traffic(b.id))
                    .transpose()?
                    .unwrap_or_default();
                let pair = (v.name.clone(), r.addr);
                let check = checks
                    .iter()
                    .find(|c| c.id == format!("{}/{}", v.name, r.addr))
                    .map(|c| CheckRow {
                        result: c.last_result.clone(),
                        duration_ms: c.last_duration_ms,
                        at_unix_ms: c.last_check_unix_ms,
                        checks_run: c.checks_run,
                        checks_failed: c.checks_failed,
                    });
                out.push(BackendRow {
                    healthy: g.facts.health.get(&pair).map(|h| h.healthy).unwrap_or(true),
                    drained: g.facts.drained.contains(&pair),
                    check,
                    vip_name: v.name.clone(),
                    vip: v.address,
                    port,
                    protocol: v.protocol.name(),
                    backend: r.addr,
                    mac: if r.local {
                        "local".into()
                    } else {
                        r.mac.map(|m| format_mac(&m)).unwrap_or_default()
                    },
                    weight: r.weight,
                    state: r.state.as_str(),
                    reason: r.reason.clone(),
                    local: r.local,
                    packets: traffic.packets,
                    bytes: traffic.bytes,
                    new_flows: traffic.new_flows,
                });
            }
        }
        Ok(out)
    }

    pub async fn vips(&self) -> Result<Vec<VipRow>> {
        let g = self.inner.lock().await;
        let mut out = Vec::new();
        for (i, port) in g.cfg.services() {
            let v = &g.cfg.vips[i];
            let key = vip_key(v.address, port, v.protocol.number());
            let traffic = match g.dp.vip_id(&key) {
                Some(id) => g.dp.vip_traffic(id)?,
                None => Default::default(),
            };
            let rows: Vec<&BackendPlan> = g.rows.iter().filter(|r| r.vip == v.name).collect();
            out.push(VipRow {
                name: v.name.clone(),
                vip: v.address,
                port,
                protocol: v.protocol.name(),
                owned: plan::owned(&g.cfg, i, &g.facts),
                vrrp: v.vrrp.clone(),
                backends_active: rows
                    .iter()
                    .filter(|r| r.state == plan::BackendState::Active)
                    .count(),
                backends_total: rows.len(),
                packets: traffic.packets,
                bytes: traffic.bytes,
                new_flows: traffic.new_flows,
            });
        }
        Ok(out)
    }

    pub async fn stats(&self) -> Result<serde_json::Value> {
        let g = self.inner.lock().await;
        let counters: serde_json::Map<String, serde_json::Value> =
            g.dp.global_stats()?
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
        Ok(serde_json::json!({
            "interface": g.cfg.interface,
            "uptime_s": self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
            "conntrack_entries": self.conntrack.entries(),
            "conntrack_count": self.conntrack.snapshot(),
            "conntrack_size": g.cfg.conntrack_size,
            "syn_flood": g.dp.flood_status()?,
            "table_size": g.cfg.table_size,
            "reloads": g.reloads,
            "reload_failures": g.reload_failures,
            "last_reload_error": g.last_reload_error,
            "counters": counters,
        }))
    }

    fn elapsed_ms(&self) -> u64 {
        self.started
            .elapsed()
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    /// The main loop is alive: called on every tick.
    pub fn tick(&self) {
        self.last_tick_ms
            .store(self.elapsed_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    fn since_tick(&self) -> Duration {
        let last = self.last_tick_ms.load(std::sync::atomic::Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }

    async fn metrics(&self) -> Result<String> {
        let stats = self.stats().await?;
        let backends = self.backends().await?;
        let vips = self.vips().await?;
        let vrrp = self.vrrp_status().await;
        Ok(metrics::render(&stats, &vips, &backends, &vrrp))
    }
}

/// VRRP instances some of whose VIP services the previous lbd left forwarding, as owned.
fn adopted_ownership(cfg: &Config, dp: &Dataplane) -> std::collections::HashMap<String, bool> {
    let mut out = std::collections::HashMap::new();
    for (i, port) in cfg.services() {
        let v = &cfg.vips[i];
        if let Some(name) = &v.vrrp
            && dp.owned(&vip_key(v.address, port, v.protocol.number())) == Some(true)
        {
            out.insert(name.clone(), true);
        }
    }
    out
}

/// (VIP name, backend) pairs that a previous lbd left drained: drains survive restarts.
fn adopted_drained(cfg: &Config, dp: &Dataplane) -> HashSet<(String, IpAddr)> {
    let mut out = HashSet::new();
    for (i, port) in cfg.services() {
        let v = &cfg.vips[i];
        for b in dp.installed(&vip_key(v.address, port, v.protocol.number())) {
            if b.spec.drained {
                out.insert((v.name.clone(), b.spec.addr));
            }
        }
    }
    out
}

/// (VIP name, backend) pairs that a previous lbd left in the set: known good at adoption.
fn adopted_up(cfg: &Config, dp: &Dataplane) -> HashSet<(String, IpAddr)> {
    let mut up = HashSet::new();
    for (i, port) in cfg.services() {
        let v = &cfg.vips[i];
        for b in dp.installed(&vip_key(v.address, port, v.protocol.number())) {
            if b.spec.healthy {
                up.insert((v.name.clone(), b.spec.addr));
            }
        }
    }
    up
}

impl Inner {
    fn apply(&mut self) -> Result<()> {
        let now = Instant::now();
        self.facts.now = Some(now);
        // Holds that ended: their backends' flows move now (and the refresh stops asking).
        for h in self.facts.health.values_mut() {
            if h.hold_until.is_some_and(|t| t <= now) {
                h.hold_until = None;
            }
        }
        let (desired, rows) = plan::plan(&self.cfg, &self.facts);
        self.in_sync = false;
        self.dp.apply(&desired).context("apply to the data plane")?;
        self.in_sync = true;
        self.rows = rows;
        Ok(())
    }
}

impl api::Handler for Daemon {
    async fn handle(self: &Arc<Self>, req: Request) -> Response {
        let result: Result<Response> = async {
            Ok(match req {
                Request::Backends => Response::json(&self.backends().await?),
                Request::Vips => Response::json(&self.vips().await?),
                Request::Stats => Response::json(&self.stats().await?),
                Request::Vrrp => Response::json(&self.vrrp_status().await),
                Request::Bgp => Response::json(&self.bgp_status().await),
                Request::BgpDrain(drained) => {
                    Response::json(&self.set_node_drained(drained).await?)
                }
                Request::Drain(d) => {
                    self.set_drained(&d.vip, d.backend, true).await?;
                    Response::json(&serde_json::json!({"drained": d.backend, "vip": d.vip}))
                }
                Request::Undrain(d) => {
                    self.set_drained(&d.vip, d.backend, false).await?;
                    Response::json(&serde_json::json!({"undrained": d.backend, "vip": d.vip}))
                }
                Request::Reload => match self.reload_all().await {
                    Ok(()) => Response::json(&serde_json::json!({"reloaded": true})),
                    Err(e) => Response::error(422, format!("{e:#}")),
                },
                Request::Healthz => {
                    let age = self.since_tick();
                    if age > LIVENESS_STALE {
                        Response::text(503, format!("main loop stalled for {age:?}\n"))
                    } else {
                        let (status, text) = self.healthz();
                        Response::text(status, text)
                    }
                }
                Request::Readyz => {
                    let (status, text) = self.readyz().await;
                    Response::text(status, text)
                }
                Request::Metrics => Response::openmetrics(self.metrics().await?),
            })
        }
        .await;
        result.unwrap_or_else(|e| Response::error(400, format!("{e:#}")))
    }
}

/// Run until SIGTERM/SIGINT: API, neighbour watcher, periodic refresh, SIGHUP reload.
pub async fn run(config_path: PathBuf) -> Result<()> {
    let cfg =
        Config::load(&config_path).with_context(|| format!("config {}", config_path.display()))?;
    let (daemon, mut health_events) = Daemon::start(config_path, cfg.clone()).await?;
    match crate::guardian::Guardian::spawn() {
        Ok(g) => {
            g.watch(&crate::guardian::Watch::of(&cfg));
            let _ = daemon.guardian.set(g);
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "no VIP guardian: a crash would leave the VIPs up")
        }
    }
    daemon.start_vrrp().await?;
    daemon.start_bgp().await;
    tracing::info!(interface = %cfg.interface, vips = cfg.vips.len(), "lbd running");
    let d = daemon.clone();
    let mut tasks = vec![daemon.supervise("health monitor", async move {
        while let Some(e) = health_events.recv().await {
            if let Err(err) = d.health_event(e).await {
                tracing::error!(error = %format!("{err:#}"), "applying a health change");
            }
        }
        anyhow::bail!("its event channel closed")
    })];
    tasks.push(daemon.supervise(
        "API listener",
        api::serve_unix(cfg.api_socket.clone(), daemon.clone()),
    ));
    if let Some(addr) = cfg.metrics_listen {
        tasks.push(daemon.supervise("metrics listener", api::serve_tcp(addr, daemon.clone())));
    }
    let mut neigh = netlink::neighbour_changes()?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut frr_check = tokio::time::interval(Duration::from_secs(5));
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut last_neigh = Instant::now() - Duration::from_secs(1);
    let failure = loop {
        tokio::select! {
            n = neigh.recv() => {
                if n.is_none() {
                    daemon.fail("netlink watcher stopped".into());
                    break daemon.failure();
                }
                // Coalesce bursts of notifications.
                if last_neigh.elapsed() > Duration::from_millis(20) {
                    last_neigh = Instant::now();
                    if let Err(e) = daemon.refresh().await { tracing::warn!(error = %format!("{e:#}"), "refresh"); }
                }
            }
            _ = tick.tick() => {
                daemon.tick();
                if let Err(e) = daemon.refresh().await { tracing::warn!(error = %format!("{e:#}"), "refresh"); }
                daemon.check_vrrp_tasks().await;
            }
            f = daemon.failed() => break Some(f),
            _ = frr_check.tick() => daemon.check_bgp().await,
            _ = hup.recv() => { let _ = daemon.reload_all().await; }
            _ = term.recv() => break None,
            _ = tokio::signal::ctrl_c() => break None,
        }
    };
    daemon.stop_bgp().await;
    daemon.stop_vrrp().await;
    if let Some(g) = daemon.guardian.get() {
        g.bye();
    }
    for t in tasks {
        t.abort();
    }
    let _ = std::fs::remove_file(&cfg.api_socket);
    tracing::info!("lbd stopping; the XDP program and pinned maps stay for the next lbd");
    match failure {
        // Non-zero, so kubelet (or systemd) restarts us.
        Some(f) => Err(anyhow::anyhow!("stopped after a failure: {f}")),
        None => Ok(()),
    }
}
