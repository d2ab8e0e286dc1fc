//! Fate sharing: when we take over an instance because its master went silent (our
//! master-down timer expired, not a priority-0 resignation), that node is most likely dead,
//! and so are the backends at its address. They take no new flows from now on instead of
//! after their health checks fail; they come back through the normal rise count. The report
//! reaches the owner before the mastership it caused (`daemon/vrrp.rs`), so this node forwards
//! only once they are out.

use std::net::IpAddr;

use anyhow::Result;

use super::owner::Owner;
use crate::plan::{self, HealthFact};

impl Owner {
    /// The master `peer` of `instance` died: its backends leave every VIP's table now.
    pub(super) fn peer_failed(&mut self, instance: &str, peer: IpAddr) -> Result<()> {
        let reason = format!(
            "VRRP master {peer} of {instance} went silent; out until its checks pass again"
        );
        let g = self;
        let pairs = plan::fate_shared(&g.cfg, peer);
        if pairs.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = pairs.iter().map(|(v, a)| format!("{v}/{a}")).collect();
        let changed = g.health.force_down(&ids, &reason);
        tracing::warn!(%peer, instance, backends = ?changed, "backends of the failed master taken out at once");
        // No new flows from now on; established flows stay for the hold, so a node that was
        // only cut off (its lbd killed, a partition) loses nothing if it is back in time.
        let hold = std::time::Duration::from_millis(g.cfg.failed_backend_hold_ms);
        let now = std::time::Instant::now();
        for pair in pairs {
            let fact = match g.facts.health.get(&pair) {
                Some(old) if !old.healthy => HealthFact {
                    reason: reason.clone(),
                    hard: true,
                    ..old.clone()
                },
                // A dead node is never a fail-open target.
                _ => HealthFact {
                    hard: true,
                    ..HealthFact::failed(reason.clone(), now, hold)
                },
            };
            g.facts.health.insert(pair, fact);
        }
        g.apply()
    }
}
