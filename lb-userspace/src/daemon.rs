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
use serde::Serialize;
use tokio::sync::Mutex;

#[path = "daemon_bgp.rs"]
mod bgp_wiring;

use crate::{
    api::{self, Request, Response},
    bgp,
    config::Config,
    dataplane::{Dataplane, LoadOptions, vip_key},
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
    }
}

/// One row of `lbctl backends list`.
#[derive(Clone, Debug, Serialize)]
pub struct BackendRow {
    pub vip_name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    pub backend: IpAddr,
    pub mac: String,
    pub weight: u32,
    pub state: &'static str,
    pub reason: String,
    pub local: bool,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VipRow {
    pub name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    pub owned: bool,
    pub vrrp: Option<String>,
    pub backends_active: usize,
    pub backends_total: usize,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

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
}

/// A running VRRP instance and what its tracked checks last added to its priority.
struct VrrpHandle {
    cfg: InstanceConfig,
    instance: Instance,
    weight: i32,
}

pub struct Daemon {
    inner: Mutex<Inner>,
    vrrp: Mutex<Vec<VrrpHandle>>,
    /// Tracked checks by name: passing or not.
    tracks: Mutex<std::collections::HashMap<String, bool>>,
    netlink: Netlink,
    started: SystemTime,
    ready: std::sync::atomic::AtomicBool,
    /// BGP announcements (VIPs with `announce = "bgp"`).
    bgp: Mutex<bgp::Announcer>,
    /// A `[[bgp]]` section was in effect: routes may need withdrawing after a reload drops it.
    bgp_active: std::sync::atomic::AtomicBool,
}

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
        let mut dp = Dataplane::load(load_options(&cfg))?;
        dp.attach(&cfg.interface, cfg.xdp_mode)?;
        dp.spawn_log_reader()?;
        let up = adopted_up(&cfg, &dp);
        let drained = adopted_drained(&cfg, &dp);
        let (health, events) = HealthMonitor::start(health_targets(&cfg, &up));
        let facts = Facts {
            if_mac: link.mac,
            health: initial_health(&cfg, &up),
            drained,
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
        if cfg.vrrp.is_empty() {
            return Ok(());
        }
        if cfg.dsr_backend {
            netlink::set_arp_sysctls(&cfg.interface)?;
            for r in &cfg.vrrp {
                for vip in &r.vips {
                    netlink::ensure_local_vip(self.netlink.handle(), *vip).await?;
                }
            }
        }
        for r in &cfg.vrrp {
            self.spawn_instance(r.clone(), &cfg.interface).await?;
        }
        self.sync_tracking().await;
        Ok(())
    }

    async fn spawn_instance(self: &Arc<Self>, r: InstanceConfig, interface: &str) -> Result<()> {
        let instance = Instance::spawn(r.clone(), interface, self.netlink.handle().clone())
            .await
            .with_context(|| format!("start VRRP instance {}", r.name))?;
        let mut owned = instance.ownership();
        let (d, name) = (self.clone(), r.name.clone());
        tokio::spawn(async move {
            loop {
                let master = *owned.borrow_and_update();
                tracing::info!(instance = %name, master, "VRRP ownership");
                if let Err(e) = d
                    .update_facts(|f| {
                        f.vrrp_master.insert(name.clone(), master);
                    })
                    .await
                {
                    tracing::error!(error = %format!("{e:#}"), "applying VRRP ownership");
                }
                if owned.changed().await.is_err() {
                    break;
                }
            }
        });
        self.vrrp.lock().await.push(VrrpHandle {
            cfg: r,
            instance,
            weight: 0,
        });
        Ok(())
    }

    /// Push each instance's tracked weight (checks passing, load balancer ready) if it changed.
    async fn sync_tracking(&self) {
        let passing = self.tracks.lock().await.clone();
        let weights: Vec<(String, i32)> = {
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
                .unwrap_or(0);
            if w != h.weight {
                tracing::info!(instance = %h.cfg.name, weight = w, "tracked weight changed");
                h.instance.set_track_weight(w).await;
                h.weight = w;
            }
        }
    }

    /// Stop every VRRP instance gracefully (priority-0 adverts, VIPs removed) and stop
    /// forwarding for their VIPs.
    pub async fn stop_vrrp(&self) {
        let handles = std::mem::take(&mut *self.vrrp.lock().await);
        for h in handles {
            h.instance.shutdown().await;
        }
        let _ = self.update_facts(|f| f.vrrp_master.clear()).await;
    }

    /// Restart the instances whose config changed on reload (others keep running untouched).
    async fn reconcile_vrrp(self: &Arc<Self>, new: &Config) -> Result<()> {
        let mut keep = Vec::new();
        let old = std::mem::take(&mut *self.vrrp.lock().await);
        for h in old {
            if new.vrrp.contains(&h.cfg) {
                keep.push(h);
            } else {
                tracing::info!(instance = %h.cfg.name, "VRRP instance changed or removed; stopping it");
                let name = h.cfg.name.clone();
                h.instance.shutdown().await;
                let _ = self
                    .update_facts(|f| {
                        f.vrrp_master.remove(&name);
                    })
                    .await;
            }
        }
        let running: Vec<String> = keep.iter().map(|h| h.cfg.name.clone()).collect();
        self.vrrp.lock().await.extend(keep);
        for r in &new.vrrp {
            if !running.contains(&r.name) {
                if new.dsr_backend {
                    for vip in &r.vips {
                        netlink::ensure_local_vip(self.netlink.handle(), *vip).await?;
                    }
                }
                self.spawn_instance(r.clone(), &new.interface).await?;
            }
        }
        self.sync_tracking().await;
        Ok(())
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
                v["track_weight"] = h.weight.into();
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
        let fact = HealthFact {
            healthy: e.healthy,
            reason: e.reason.clone(),
        };
        self.update_facts(|f| {
            f.health.insert((vip.to_string(), addr), fact);
        })
        .await
    }

    /// Re-read kernel facts (neighbours, local addresses) and re-apply the plan.
    pub async fn refresh(&self) -> Result<()> {
        let (ifindex, iface, backends) = {
            let g = self.inner.lock().await;
            let backends: Vec<IpAddr> = g
                .cfg
                .vips
                .iter()
                .flat_map(|v| v.backends.iter().map(|b| b.address))
                .collect();
            (g.ifindex, g.cfg.interface.clone(), backends)
        };
        let macs = self.netlink.macs_on(ifindex, &backends).await?;
        let local_addrs = self.netlink.local_addresses().await?;
        for b in &backends {
            if !macs.contains_key(b) && !local_addrs.contains(b) {
                netlink::trigger_resolution(&iface, *b);
            }
        }
        let mut g = self.inner.lock().await;
        g.facts.macs = macs;
        // Only unicast addresses of real interfaces count; VIPs themselves are not backends.
        let vips: HashSet<IpAddr> = g.cfg.vips.iter().map(|v| v.address).collect();
        g.facts.local_addrs = local_addrs
            .into_iter()
            .filter(|a| !vips.contains(a))
            .collect();
        g.apply()?;
        drop(g);
        self.sync_bgp().await;
        Ok(())
    }

    /// Reload the config (see [`Daemon::reload`]) and restart changed VRRP instances.
    pub async fn reload_all(self: &Arc<Self>) -> Result<()> {
        self.reload().await?;
        let cfg = self.config().await;
        self.reconcile_bgp().await;
        self.reconcile_vrrp(&cfg).await
    }

    /// Re-read the config file; an invalid config is refused and the running one kept.
    pub async fn reload(&self) -> Result<()> {
        let mut g = self.inner.lock().await;
        let path = g.config_path.clone();
        let result = Config::load(&path)
            .map_err(anyhow::Error::from)
            .and_then(|new| {
                check_reloadable(&g.cfg, &new)?;
                Ok(new)
            });
        match result {
            Ok(new) => {
                let old = std::mem::replace(&mut g.cfg, new);
                if let Err(e) = g.apply() {
                    // The data plane refused it (e.g. limits): put the old config back.
                    g.cfg = old;
                    g.apply()?;
                    g.reload_failures += 1;
                    g.last_reload_error = Some(format!("{e:#}"));
                    return Err(
                        e.context("new config refused by the data plane; kept the running one")
                    );
                }
                g.reloads += 1;
                g.last_reload_error = None;
                // Pairs that are up now stay up across the reload; new ones wait for a check.
                let up: HashSet<(String, IpAddr)> = g
                    .facts
                    .health
                    .iter()
                    .filter(|(_, h)| h.healthy)
                    .map(|(k, _)| k.clone())
                    .collect();
                let targets = health_targets(&g.cfg, &up);
                g.health.set_targets(targets);
                let mut fresh = initial_health(&g.cfg, &up);
                for (k, v) in g.facts.health.drain() {
                    if fresh.contains_key(&k) {
                        fresh.insert(k, v);
                    }
                }
                g.facts.health = fresh;
                g.apply()?;
                tracing::info!(path = %path.display(), "config reloaded");
                drop(g);
                self.refresh().await
            }
            Err(e) => {
                g.reload_failures += 1;
                g.last_reload_error = Some(format!("{e:#}"));
                tracing::error!(error = %format!("{e:#}"), "config refused; the running config stays");
                Err(e)
            }
        }
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
                out.push(BackendRow {
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
            "conntrack_entries": g.dp.conntrack_entries(),
            "conntrack_size": g.cfg.conntrack_size,
            "table_size": g.cfg.table_size,
            "reloads": g.reloads,
            "reload_failures": g.reload_failures,
            "last_reload_error": g.last_reload_error,
            "counters": counters,
        }))
    }

    async fn metrics(&self) -> Result<String> {
        let stats = self.stats().await?;
        let backends = self.backends().await?;
        let vips = self.vips().await?;
        let vrrp = self.vrrp_status().await;
        Ok(metrics::render(&stats, &vips, &backends, &vrrp))
    }
}

/// Settings that shape the pinned maps cannot change without a restart.
fn check_reloadable(old: &Config, new: &Config) -> Result<()> {
    let fields = [
        ("interface", old.interface != new.interface),
        ("name", old.name != new.name),
        ("table_size", old.table_size != new.table_size),
        ("conntrack_size", old.conntrack_size != new.conntrack_size),
        ("hash_seed", old.hash_seed != new.hash_seed),
        ("api_socket", old.api_socket != new.api_socket),
    ];
    for (field, changed) in fields {
        if changed {
            bail!("{field}: cannot change on reload (restart lbd to change it)");
        }
    }
    Ok(())
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
        let (desired, rows) = plan::plan(&self.cfg, &self.facts);
        self.dp.apply(&desired).context("apply to the data plane")?;
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
                Request::Healthz => Response::text(200, "ok\n".into()),
                Request::Readyz => {
                    if self.ready.load(std::sync::atomic::Ordering::SeqCst) {
                        Response::text(200, "ready\n".into())
                    } else {
                        Response::text(503, "starting\n".into())
                    }
                }
                Request::Metrics => Response::text(200, self.metrics().await?),
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
    daemon.start_vrrp().await?;
    daemon.start_bgp().await;
    tracing::info!(interface = %cfg.interface, vips = cfg.vips.len(), "lbd running");
    let d = daemon.clone();
    tokio::spawn(async move {
        while let Some(e) = health_events.recv().await {
            if let Err(err) = d.health_event(e).await {
                tracing::error!(error = %format!("{err:#}"), "applying a health change");
            }
        }
    });

    let api = tokio::spawn(api::serve_unix(cfg.api_socket.clone(), daemon.clone()));
    if let Some(addr) = cfg.metrics_listen {
        let d = daemon.clone();
        tokio::spawn(async move {
            if let Err(e) = api::serve_tcp(addr, d).await {
                tracing::error!(error = %format!("{e:#}"), "metrics listener failed");
            }
        });
    }
    let mut neigh = netlink::neighbour_changes()?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut frr_check = tokio::time::interval(Duration::from_secs(5));
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut last_neigh = Instant::now() - Duration::from_secs(1);
    loop {
        tokio::select! {
            Some(()) = neigh.recv() => {
                // Coalesce bursts of notifications.
                if last_neigh.elapsed() > Duration::from_millis(20) {
                    last_neigh = Instant::now();
                    if let Err(e) = daemon.refresh().await { tracing::warn!(error = %format!("{e:#}"), "refresh"); }
                }
            }
            _ = tick.tick() => {
                if let Err(e) = daemon.refresh().await { tracing::warn!(error = %format!("{e:#}"), "refresh"); }
            }
            _ = frr_check.tick() => daemon.check_bgp().await,
            _ = hup.recv() => { let _ = daemon.reload_all().await; }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    daemon.stop_bgp().await;
    daemon.stop_vrrp().await;
    api.abort();
    let _ = std::fs::remove_file(&cfg.api_socket);
    tracing::info!("lbd stopping; the XDP program and pinned maps stay for the next lbd");
    Ok(())
}
