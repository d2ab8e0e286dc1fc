//! Config reloads (SIGHUP or `lbctl reload`): one at a time; every setting is either applied or
//! the whole reload is refused naming the field; VRRP instances keep running through changes
//! they can take in place (priority, track weights, interval, peers, preemption), so a reload
//! never moves a VIP it did not have to.

use std::{collections::HashSet, net::IpAddr, sync::Arc};

use anyhow::{Result, bail};

use super::{Daemon, health_targets, initial_health};
use crate::{config::Config, netlink};

/// Top-level config fields a reload applies. Any other field that changes refuses the reload
/// (the running config stays), so no setting is ever silently ignored.
pub const APPLIED_ON_RELOAD: &[&str] = &["vips", "vrrp", "track", "bgp", "failed_backend_hold_ms"];

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

impl Daemon {
    /// Reload the config (see [`Daemon::reload`]) and reconcile the VRRP instances. Reloads
    /// are serialized: a second one waits for the first to finish.
    pub async fn reload_all(self: &Arc<Self>) -> Result<()> {
        let _one_at_a_time = self.reload_lock.lock().await;
        self.reload().await?;
        let cfg = self.config().await;
        self.static_vips
            .lock()
            .await
            .set(self.netlink.handle(), &cfg)
            .await?;
        self.reconcile_bgp().await;
        let result = self.reconcile_vrrp(&cfg).await;
        if let Some(g) = self.guardian.get() {
            g.watch(&crate::guardian::Watch::of(&cfg));
        }
        result
    }

    /// Bring the running VRRP instances in line with `new`: unchanged ones are left alone,
    /// in-place changes are handed to the running instance (no resignation), and only
    /// instances whose identity changed (VRID, version, VIPs, interface...) or that were
    /// removed are stopped; new and restarted ones are started.
    async fn reconcile_vrrp(self: &Arc<Self>, new: &Config) -> Result<()> {
        let mut keep = Vec::new();
        let old = std::mem::take(&mut *self.vrrp.lock().await);
        for mut h in old {
            let wanted = new.vrrp.iter().find(|r| r.name == h.cfg.name);
            match wanted {
                Some(r) if *r == h.cfg => keep.push(h),
                Some(r) if h.cfg.restart_needed(r).is_none() => {
                    h.instance.reconfigure(r.clone()).await;
                    h.cfg = r.clone();
                    keep.push(h);
                }
                _ => {
                    let why = wanted
                        .and_then(|r| h.cfg.restart_needed(r))
                        .map_or("removed".to_string(), |f| format!("{f} changed"));
                    tracing::info!(instance = %h.cfg.name, why, "VRRP instance restarts");
                    let name = h.cfg.name.clone();
                    h.instance.shutdown().await;
                    let _ = self
                        .update_facts(|f| {
                            f.vrrp_master.remove(&name);
                        })
                        .await;
                }
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
}
