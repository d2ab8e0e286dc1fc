//! The status rows (`lbctl vips`, `backends`, `stats`) and the metrics, read from the owner's
//! state (and the data plane's counters) without changing anything.

use anyhow::Result;

use super::{format_mac, owner::Owner};
use crate::{
    dataplane::vip_key,
    metrics,
    plan::{self, BackendPlan},
    status::{BackendRow, CheckRow, StatsRow, SynFloodRow, VipRow},
};

impl Owner {
    pub(super) fn backends(&self) -> Result<Vec<BackendRow>> {
        let g = self;
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
                    healthy: g.ctl.health().get(&pair).map(|h| h.healthy).unwrap_or(true),
                    drained: g.ctl.drained().contains(&pair),
                    expected: r.expected,
                    check,
                    vip_name: v.name.clone(),
                    vip: v.address,
                    port,
                    protocol: v.protocol.name().into(),
                    backend: r.addr,
                    mac: if r.local {
                        "local".into()
                    } else {
                        r.mac.map(|m| format_mac(&m)).unwrap_or_default()
                    },
                    weight: r.weight,
                    state: r.state.as_str().into(),
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

    pub(super) fn vips(&self) -> Result<Vec<VipRow>> {
        let g = self;
        let facts = g.plan_facts();
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
                protocol: v.protocol.name().into(),
                owned: plan::owned(&g.cfg, i, &facts),
                vrrp: v.vrrp.clone(),
                backends_active: rows
                    .iter()
                    .filter(|r| r.state == plan::BackendState::Active)
                    .count(),
                backends_total: rows.len(),
                fail_open: rows.iter().any(|r| r.state == plan::BackendState::FailOpen),
                packets: traffic.packets,
                bytes: traffic.bytes,
                new_flows: traffic.new_flows,
            });
        }
        Ok(out)
    }

    pub(super) fn stats(&self) -> Result<StatsRow> {
        let g = self;
        let flood = g.dp.flood_status()?;
        Ok(StatsRow {
            interface: g.cfg.interface.clone(),
            ready: self.readyz().0 == 200,
            uptime_s: self.shared.uptime().as_secs(),
            conntrack_entries: self.conntrack.entries(),
            conntrack_count: self.conntrack.snapshot(),
            conntrack_size: g.cfg.conntrack_size,
            syn_flood: SynFloodRow {
                new_connections_per_s: flood.new_connections_per_s,
                conntrack_size: flood.conntrack_size,
                threshold_per_s: flood.threshold_per_s,
                active: flood.active,
            },
            table_size: g.cfg.table_size,
            reloads: g.ctl.reloads().done,
            reload_failures: g.ctl.reloads().failed,
            last_reload_error: g.ctl.reloads().last_error.clone(),
            counters: g
                .dp
                .global_stats()?
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            sync: self.sync.as_ref().map(|s| s.stats.snapshot()),
        })
    }

    /// Each installed backend slot (aliases included): its pair and current epoch.
    pub(super) fn flows_view(&self) -> super::flows::FlowsView {
        let mut view = super::flows::FlowsView {
            pin_dir: super::load_options(&self.cfg).pin_dir(),
            ..Default::default()
        };
        for (i, port) in self.cfg.services() {
            let v = &self.cfg.vips[i];
            for b in self
                .dp
                .installed(&vip_key(v.address, port, v.protocol.number()))
            {
                for id in std::iter::once(b.id).chain(b.aliases.iter().copied()) {
                    view.slots
                        .insert(id, (v.name.clone(), b.spec.addr, b.epoch));
                }
            }
        }
        view
    }

    pub(super) fn metrics(&self) -> Result<String> {
        let stats = self.stats()?;
        let backends = self.backends()?;
        let vips = self.vips()?;
        let vrrp = self.vrrp_status();
        Ok(metrics::render(&stats, &vips, &backends, &vrrp))
    }
}
