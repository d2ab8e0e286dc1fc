//! The daemon's BGP wiring (a child of `daemon`, kept apart so the wiring of each concern stays
//! readable): hands the config and the plan's rows to [`crate::bgp::Announcer`] whenever they
//! change, and answers `lbctl bgp ...`.

use anyhow::Result;

use super::Daemon;
use crate::bgp;

impl Daemon {
    /// Configure FRR for the `[[bgp]]` section and announce what is ready. A failure (FRR not
    /// running yet) is logged and retried on the next sync.
    pub async fn start_bgp(&self) {
        let cfg = self.config().await;
        if cfg.bgp.is_empty() {
            return;
        }
        let mut a = self.bgp.lock().await;
        if let Err(e) = a.configure(&cfg).await {
            tracing::error!(error = %format!("{e:#}"), "BGP: configuring FRR failed; will retry");
        } else {
            tracing::info!(
                asn = cfg.bgp[0].asn,
                peers = cfg.bgp[0].peers.len(),
                "BGP: FRR configured"
            );
        }
        drop(a);
        self.sync_bgp().await;
    }

    /// Re-decide the announcements from the current plan and converge the kernel routes.
    pub async fn sync_bgp(&self) {
        let (cfg, rows) = {
            let g = self.inner.lock().await;
            if g.cfg.bgp.is_empty() && !self.bgp_active.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            (g.cfg.clone(), g.rows.clone())
        };
        let mut a = self.bgp.lock().await;
        if !cfg.bgp.is_empty()
            && !a.configured()
            && let Err(e) = a.configure(&cfg).await
        {
            tracing::debug!(error = %format!("{e:#}"), "BGP: FRR still not configured");
        }
        self.bgp_active
            .store(!cfg.bgp.is_empty(), std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = a.sync(&cfg, &rows).await {
            tracing::error!(error = %format!("{e:#}"), "BGP: converging announcements");
        }
    }

    /// Periodic: configure FRR again if it lost lbd's configuration (FRR restarted; the
    /// announcement routes are in the kernel and zebra reads them again). vtysh runs without
    /// the announcer's lock, so a slow FRR never delays a withdrawal.
    pub async fn check_bgp(&self) {
        let Some(applied) = self.bgp.lock().await.applied() else {
            return;
        };
        match bgp::frr_has_instance(&applied).await {
            // [issue 20.7] converge against the kernel's routes every check.
            Ok(true) => self.sync_bgp().await,
            Ok(false) => {
                tracing::warn!(
                    "BGP: FRR lost lbd's configuration (restarted?); configuring it again"
                );
                self.bgp.lock().await.mark_unconfigured();
                self.sync_bgp().await;
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "BGP: checking FRR"),
        }
    }

    /// Reload: bring FRR to the new section, then re-decide.
    pub async fn reconcile_bgp(&self) {
        let cfg = self.config().await;
        {
            let mut a = self.bgp.lock().await;
            if (!cfg.bgp.is_empty() || a.configured())
                && let Err(e) = a.configure(&cfg).await
            {
                tracing::error!(error = %format!("{e:#}"), "BGP: reconfiguring FRR failed");
            }
        }
        self.sync_bgp().await;
    }

    /// lbd is stopping: withdraw every prefix (the XDP program keeps forwarding what is still
    /// in flight towards this node while the routers converge).
    pub async fn stop_bgp(&self) {
        self.bgp.lock().await.set_stopping();
        self.sync_bgp().await;
    }

    /// `lbctl bgp drain` / `undrain`: take this node out of (or back into) every ECMP group.
    pub async fn set_node_drained(&self, drained: bool) -> Result<serde_json::Value> {
        let cfg = self.config().await;
        if cfg.bgp.is_empty() {
            anyhow::bail!("no [[bgp]] section: this node announces nothing over BGP");
        }
        let marker = bgp::drain_marker(&cfg);
        let written = if drained {
            std::fs::write(&marker, b"drained by lbctl bgp drain\n")
        } else {
            std::fs::remove_file(&marker).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %marker.display(), "BGP: the drain will not survive an lbd restart");
        }
        self.bgp.lock().await.set_drained(drained);
        self.sync_bgp().await;
        Ok(serde_json::json!({ "node_drained": drained }))
    }

    pub async fn bgp_status(&self) -> bgp::Status {
        let cfg = self.config().await;
        let mut status = self.bgp.lock().await.status(&cfg);
        (status.sessions, status.sessions_error) = bgp::sessions(&cfg).await;
        status
    }
}
