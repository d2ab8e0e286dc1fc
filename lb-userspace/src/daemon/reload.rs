//! Config reloads (SIGHUP or `lbctl reload`): one at a time (the owner runs them); all or
//! nothing: a config is validated (fields lbd cannot change while running refused by name, the
//! VRRP instances to start checked against this node's interfaces), then applied, and rolled
//! back to the running one if any step fails; VRRP instances keep running through changes
//! they can take in place (priority, track weights, interval, peers, preemption), so a reload
//! never moves a VIP it did not have to. `[sync]` applies whole (peers, keys, port...): its
//! keys are read and a new port bound before anything changes.

use std::{collections::HashSet, net::IpAddr};

use anyhow::{Context, Result, bail};

use lb_core::{backends::HealthFacts, controller::Input};
use tokio::sync::oneshot;

use super::{health_targets, initial_health, owner::Owner, vrrp::VrrpHandle};
use crate::{
    api::Response,
    config::{Config, ConfigFile, Validate},
    vrrp::InstanceConfig,
};

/// Top-level config fields a reload applies. Any other field that changes refuses the reload
/// (the running config stays), so no setting is ever silently ignored.
pub const APPLIED_ON_RELOAD: &[&str] = &[
    "vips",
    "vrrp",
    "track",
    "bgp",
    "failed_backend_hold_ms",
    "sync",
];

/// Refuse a reload that changes a field lbd cannot apply while running, naming the field.
pub fn check_reloadable(old: &Config, new: &Config) -> Result<()> {
    for (i, r) in new.vrrp.iter().enumerate() {
        if let Some(why) = old
            .vrrp
            .iter()
            .find(|o| o.name == r.name)
            .and_then(|o| o.version_switch_refused(r))
        {
            bail!("vrrp[{i}].version: {why}");
        }
    }
    let (old, new) = (serde_json::to_value(old)?, serde_json::to_value(new)?);
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        bail!("config is not a table");
    };
    let mut fields: Vec<&String> = old.keys().chain(new.keys()).collect();
    fields.sort();
    fields.dedup();
    for field in fields {
        if APPLIED_ON_RELOAD.contains(&field.as_str()) {
            continue;
        }
        if old.get(field) != new.get(field) {
            bail!("{field}: cannot change on reload (restart lbd to change it)");
        }
    }
    Ok(())
}

/// What a reload does to the running VRRP instances (see [`Owner::reconcile_vrrp`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VrrpChanges {
    /// Names of instances that keep running unchanged or take the change in place.
    pub in_place: Vec<String>,
    /// Instances to stop and start again (identity changed), with why.
    pub restart: Vec<(String, String)>,
    /// Instances to stop (no longer configured).
    pub remove: Vec<String>,
    /// Instances to start (new names).
    pub start: Vec<String>,
}

/// Sort the instances of `old` and `new` into [`VrrpChanges`]. Pure.
pub fn vrrp_changes(old: &[InstanceConfig], new: &[InstanceConfig]) -> VrrpChanges {
    let mut c = VrrpChanges::default();
    for o in old {
        match new.iter().find(|r| r.name == o.name) {
            Some(r) => match o.restart_needed(r) {
                None => c.in_place.push(o.name.clone()),
                Some(f) => c.restart.push((o.name.clone(), format!("{f} changed"))),
            },
            None => c.remove.push(o.name.clone()),
        }
    }
    for r in new {
        if !old.iter().any(|o| o.name == r.name) {
            c.start.push(r.name.clone());
        }
    }
    c
}

/// Check what starting the instances of `new` that are not running unchanged needs and can be
/// known before touching anything: a valid instance config, an interface that exists. The
/// error names the field.
pub fn preflight_vrrp(new: &Config, changes: &VrrpChanges) -> Result<()> {
    let starting = changes
        .start
        .iter()
        .chain(changes.restart.iter().map(|(n, _)| n));
    for name in starting {
        let Some((i, r)) = new.vrrp.iter().enumerate().find(|(_, r)| r.name == *name) else {
            continue;
        };
        r.validate_at(&format!("vrrp[{i}]"))?;
        let ifname = super::vrrp::interface_of(r, new);
        if crate::net::iface::if_index(&ifname).is_err() {
            let field = if r.interface.is_some() {
                format!("vrrp[{i}].interface")
            } else {
                "interface".into()
            };
            bail!("{field}: no interface {ifname:?} on this node (VRRP instance {name})");
        }
    }
    Ok(())
}

/// What a reload does to the connection sync, decided before anything changes.
pub(super) enum SyncStep {
    Same,
    /// `[sync]` was added: the task, started (its socket bound), not yet shown the services.
    Start(super::sync::SyncHandle),
    Change(super::sync::Prepared),
    Stop,
}

/// A reload's data while the controller runs it (`lb_core::controller`'s reload steps): the
/// config not in force (the new one until `Effect::InstallConfig`, then the running one,
/// which `Effect::RestoreConfig` puts back), and what the steps and the commit need.
pub(super) struct Staged {
    cfg: Config,
    changes: VrrpChanges,
    sync: Option<SyncStep>,
    /// Pairs up before the reload: they stay up in the health monitor.
    up: HashSet<(String, IpAddr)>,
}

impl Owner {
    /// Reload the config file (SIGHUP, `lbctl reload`; `reply`: who waits for the outcome):
    /// all or nothing. The new config is validated, then applied step by step (data plane,
    /// static VIPs, VRRP instances); if a step fails, the steps already done are undone and the
    /// running config stays (the controller decides the steps and the undo; the owner's loop
    /// goes on between them). Either way the outcome is counted and logged, and a failure is
    /// shown in `lbctl stats`. Those asked for while one runs follow it, one by one.
    pub(super) async fn reload(&mut self, reply: Option<oneshot::Sender<Response>>) {
        if self.ctl.reloading() {
            self.next_reload.push_back(reply);
            return;
        }
        self.reload_waiters.extend(reply);
        let read = std::fs::read(&self.config_path);
        self.reload_bytes(read).await
    }

    /// [`Owner::reload`] of the file's bytes as read once (a watcher that compared them reads
    /// no second time: the file may change between two reads).
    pub(super) async fn reload_bytes(&mut self, read: std::io::Result<Vec<u8>>) {
        if self.ctl.reloading() {
            // It reads the file again when this one is done.
            self.next_reload.push_back(None);
            return;
        }
        self.config_bytes = read.as_ref().ok().cloned();
        match self.stage(read) {
            Ok((staged, fresh)) => {
                let hold = std::time::Duration::from_millis(staged.cfg.failed_backend_hold_ms);
                self.staged = Some(staged);
                self.feed(Input::ReloadStaged { fresh, hold }).await;
            }
            Err(e) => {
                let error = format!("{e:#}");
                self.feed(Input::ReloadRefused { error }).await;
            }
        }
    }

    /// Read and check the new config and decide what it changes, touching nothing: what the
    /// reload's steps need, and the health facts it starts with.
    fn stage(&self, read: std::io::Result<Vec<u8>>) -> Result<(Staged, HealthFacts)> {
        let path = &self.config_path;
        let bytes = read.map_err(|error| crate::config::LoadError::Read {
            path: path.clone(),
            error,
        })?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("config file {} is not UTF-8", path.display()))?;
        let new = Config::from_file_text(&text)?;
        check_reloadable(&self.cfg, &new)?;
        let running: Vec<InstanceConfig> = self.vrrp.iter().map(|h| h.cfg.clone()).collect();
        let changes = vrrp_changes(&running, &new.vrrp);
        preflight_vrrp(&new, &changes)?;
        let sync = match (&self.sync, &new.sync) {
            (None, None) => SyncStep::Same,
            (Some(_), None) => SyncStep::Stop,
            (Some(h), Some(s)) if h.config() == s => SyncStep::Same,
            (Some(h), Some(s)) => SyncStep::Change(h.prepare(s)?),
            (None, Some(s)) => SyncStep::Start(super::sync::SyncHandle::spawn(
                s,
                super::load_options(&new).pin_dir(),
            )?),
        };
        // Pairs that are up now stay up across the reload; new ones wait for a check.
        let health = self.ctl.health();
        let up: HashSet<(String, IpAddr)> = health
            .iter()
            .filter(|(_, h)| h.healthy)
            .map(|(k, _)| k.clone())
            .collect();
        let mut fresh = initial_health(&new, &up);
        for (k, v) in health {
            if fresh.contains_key(k) {
                fresh.insert(k.clone(), v.clone());
            }
        }
        let staged = Staged {
            cfg: new,
            changes,
            sync: Some(sync),
            up,
        };
        Ok((staged, fresh))
    }

    /// The config in force and the staged one change places (install, restore).
    pub(super) fn swap_staged(&mut self) {
        if let Some(st) = &mut self.staged {
            std::mem::swap(&mut self.cfg, &mut st.cfg);
        }
    }

    /// The reload's VRRP step, for the config in force.
    pub(super) async fn reconcile_staged(&mut self) -> Result<()> {
        let changes = match &mut self.staged {
            Some(st) => std::mem::take(&mut st.changes),
            None => bail!("no reload in progress"),
        };
        self.reconcile_vrrp(&changes).await
    }

    /// Committed: what cannot fail (or is retried on its own) follows the new config.
    pub(super) async fn commit_reload(&mut self) {
        let Some(mut st) = self.staged.take() else {
            return;
        };
        match st.sync.take() {
            None | Some(SyncStep::Same) => {}
            Some(SyncStep::Start(h)) => self.sync = Some(h),
            Some(SyncStep::Change(p)) => {
                if let Some(h) = &mut self.sync {
                    h.commit(p).await;
                }
            }
            Some(SyncStep::Stop) => self.sync = None,
        }
        // A new sync learns the members too.
        self.apply_members().await;
        self.health.set_targets(health_targets(&self.cfg, &st.up));
        self.configure_bgp();
        if let Some(g) = &self.guardian {
            g.watch(&crate::guardian::Watch::of(&self.cfg));
        }
    }

    /// Bring the running VRRP instances in line with `self.cfg` (the new config): unchanged
    /// ones are left alone, in-place changes are handed to the running instance (no
    /// resignation), and only instances whose identity changed (VRID, version, VIPs,
    /// interface...) or that were removed are stopped. New instances start first and
    /// restarted ones next; if one fails to start, what this call did is undone (the new ones
    /// stop, the restarted ones run their old config again) before the error is returned, and
    /// nothing was reconfigured or removed yet.
    async fn reconcile_vrrp(&mut self, changes: &VrrpChanges) -> Result<()> {
        let new = self.cfg.clone();
        let wanted = |name: &str| new.vrrp.iter().find(|r| r.name == name).cloned();
        // 1. New instances, beside the running ones.
        let mut started = Vec::new();
        for name in &changes.start {
            let Some(r) = wanted(name) else { continue };
            match self.start_instance(&new, r).await {
                Ok(h) => started.push(h),
                Err(e) => {
                    for h in started {
                        self.stop_instance(h).await;
                    }
                    return Err(e);
                }
            }
        }
        // 2. Restarts: the old incarnation stops, the new one starts.
        let mut replaced: Vec<InstanceConfig> = Vec::new();
        let mut failure = None;
        for (name, why) in &changes.restart {
            let Some(r) = wanted(name) else { continue };
            let Some(pos) = self.vrrp.iter().position(|h| h.cfg.name == *name) else {
                continue;
            };
            tracing::info!(instance = %name, why, "VRRP instance restarts");
            let old = self.vrrp.remove(pos);
            let old_cfg = old.cfg.clone();
            self.stop_instance(old).await;
            match self.start_instance(&new, r).await {
                Ok(h) => {
                    self.vrrp.push(h);
                    replaced.push(old_cfg);
                }
                Err(e) => {
                    replaced.push(old_cfg);
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            for h in started {
                self.stop_instance(h).await;
            }
            for old_cfg in replaced {
                if let Some(pos) = self.vrrp.iter().position(|h| h.cfg.name == old_cfg.name) {
                    let h = self.vrrp.remove(pos);
                    self.stop_instance(h).await;
                }
                let name = old_cfg.name.clone();
                match self.spawn_instance(old_cfg).await {
                    Ok(h) => self.vrrp.push(h),
                    Err(e) => {
                        tracing::error!(instance = %name, error = %format!("{e:#}"), "reload: restarting the running instance failed")
                    }
                }
            }
            let _ = self.apply();
            return Err(e);
        }
        self.vrrp.extend(started);
        // 3. In-place changes, then removals: nothing can fail from here. An instance runs
        // with the learned members beside the file's peers (see `members`).
        let effective: Vec<Option<InstanceConfig>> = self
            .vrrp
            .iter()
            .map(|h| {
                new.vrrp
                    .iter()
                    .find(|r| r.name == h.cfg.name)
                    .filter(|r| changes.in_place.contains(&h.cfg.name) && **r != h.cfg)
                    .map(|r| self.effective_instance(r))
            })
            .collect();
        for (h, e) in self.vrrp.iter_mut().zip(effective) {
            if let Some(e) = e {
                h.cfg = new
                    .vrrp
                    .iter()
                    .find(|r| r.name == h.cfg.name)
                    .cloned()
                    .unwrap_or_else(|| e.clone());
                h.peers = e.unicast_peers.clone();
                h.instance.reconfigure(e);
            }
        }
        for name in &changes.remove {
            if let Some(pos) = self.vrrp.iter().position(|h| h.cfg.name == *name) {
                tracing::info!(instance = %name, why = "removed", "VRRP instance restarts");
                let h = self.vrrp.remove(pos);
                self.stop_instance(h).await;
            }
        }
        if let Err(e) = self.apply() {
            tracing::error!(error = %format!("{e:#}"), "applying VRRP ownership");
        }
        Ok(())
    }

    /// A DSR backend holds the instance's VIPs on `lo` first; then the instance starts.
    async fn start_instance(&mut self, new: &Config, r: InstanceConfig) -> Result<VrrpHandle> {
        if new.dsr_backend {
            for vip in r.vips.iter().filter(|v| new.backend_here(&r, **v)) {
                let req = super::netexec::Request::LocalVip(*vip);
                self.netexec.call(req).await.map_err(anyhow::Error::msg)?;
            }
        }
        self.spawn_instance(r).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Config {
        toml::from_str(
            r#"
            interface = "eth0"
            [[vips]]
            name = "api"
            address = "192.0.2.100"
            ports = [6443]
            vrrp = "api"
            [[vips.backends]]
            address = "192.0.2.11"
            [[vrrp]]
            name = "api"
            vrid = 14
            vips = ["192.0.2.100"]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn every_other_field_is_refused_by_name() {
        let refused = |f: fn(&mut Config)| {
            let mut c = base();
            f(&mut c);
            check_reloadable(&base(), &c)
                .map_err(|e| e.to_string())
                .err()
        };
        let field = |f| refused(f).map(|e| e.split(':').next().unwrap().to_string());
        assert_eq!(
            field(|c| c.metrics_listen = Some("127.0.0.1:9444".parse().unwrap())),
            Some("metrics_listen".into())
        );
        assert_eq!(
            field(|c| c.xdp_mode = crate::config::XdpMode::Skb),
            Some("xdp_mode".into())
        );
        assert_eq!(
            field(|c| c.dsr_backend = !c.dsr_backend),
            Some("dsr_backend".into())
        );
        assert_eq!(
            field(|c| c.interface = "eth1".into()),
            Some("interface".into())
        );
        assert_eq!(field(|c| c.table_size = 65_521), Some("table_size".into()));
        assert_eq!(field(|c| c.hash_seed ^= 1), Some("hash_seed".into()));
        assert_eq!(
            field(|c| c.api_socket = "/tmp/x.sock".into()),
            Some("api_socket".into())
        );
        // What a reload applies.
        assert_eq!(refused(|c| c.vrrp[0].priority = 7), None);
        assert_eq!(refused(|c| c.vips[0].ports = vec![6443, 22623]), None);
        assert_eq!(refused(|c| c.vrrp.clear()), None);
        // `[sync]` applies whole: added, changed (a peer joins, a key rotates), removed.
        let sync = |peers: &str| {
            toml::from_str::<Config>(&format!(
                "interface = \"eth0\"\n[sync]\npeers = [{peers}]\nkey_file = \"/k\"\n"
            ))
            .unwrap()
            .sync
        };
        let mut two = base();
        two.sync = sync("\"192.0.2.12\"");
        let mut three = two.clone();
        three.sync = sync("\"192.0.2.12\", \"192.0.2.13\"");
        three.sync.as_mut().unwrap().accept_key_files = vec!["/old".into()];
        three.sync.as_mut().unwrap().port = 1950;
        assert!(check_reloadable(&base(), &two).is_ok());
        assert!(check_reloadable(&two, &three).is_ok());
        assert!(check_reloadable(&three, &base()).is_ok());
        // A VRRP version switch that would split the instance is refused; through v2_compat
        // it is applied.
        assert!(field(|c| c.vrrp[0].version = 2).is_some_and(|f| f == "vrrp[0].version"),);
        assert_eq!(
            refused(|c| {
                c.vrrp[0].version = 2;
                c.vrrp[0].advert_interval_ms = Some(1000);
                c.vrrp[0].v2_compat = false;
            })
            .map(|e| e.contains("v2_compat = true")),
            Some(true)
        );
    }

    fn with(extra: &str) -> Config {
        toml::from_str(&format!(
            r#"
            interface = "lo"
            [[vrrp]]
            name = "api"
            vrid = 14
            vips = ["192.0.2.100"]
            {extra}
            "#
        ))
        .unwrap()
    }

    #[test]
    fn instances_are_sorted_into_in_place_restart_remove_and_start() {
        let old = with("[[vrrp]]\nname = \"gone\"\nvrid = 15\nvips = [\"192.0.2.101\"]\n");
        let mut new = with("[[vrrp]]\nname = \"new\"\nvrid = 16\nvips = [\"192.0.2.102\"]\n");
        new.vrrp[0].priority = 7;
        let c = vrrp_changes(&old.vrrp, &new.vrrp);
        assert_eq!(c.in_place, ["api"]);
        assert!(c.restart.is_empty());
        assert_eq!(c.remove, ["gone"]);
        assert_eq!(c.start, ["new"]);
        new.vrrp[0].vrid = 20;
        let c = vrrp_changes(&old.vrrp, &new.vrrp);
        assert_eq!(c.restart.len(), 1, "{c:?}");
        assert_eq!(c.restart[0].0, "api");
        assert!(c.in_place.is_empty());
    }

    #[test]
    fn instances_to_start_need_an_interface_of_this_node_named_by_field() {
        let old = with("");
        let new = with(
            "[[vrrp]]\nname = \"x\"\nvrid = 16\ninterface = \"nosuch0\"\nvips = [\"192.0.2.102\"]\n",
        );
        let c = vrrp_changes(&old.vrrp, &new.vrrp);
        let e = preflight_vrrp(&new, &c).unwrap_err().to_string();
        assert!(e.starts_with("vrrp[1].interface:"), "{e}");
        assert!(e.contains("nosuch0"), "{e}");
        // Running instances are not checked again; `lo` exists everywhere.
        let ok = with("[[vrrp]]\nname = \"x\"\nvrid = 16\nvips = [\"192.0.2.102\"]\n");
        assert!(preflight_vrrp(&ok, &vrrp_changes(&old.vrrp, &ok.vrrp)).is_ok());
    }
}
