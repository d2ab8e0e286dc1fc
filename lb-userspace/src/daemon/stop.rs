//! The stop (SIGTERM, SIGINT, or a task failure), in the order that keeps every VIP on exactly
//! one node, each step with a deadline so the whole fits a 10 s termination grace (kubelet's
//! default is 30 s; OpenShift's static pods often run with less):
//!
//! 1. VRRP: every instance resigns at once (priority-0 advert: a backup takes over after its
//!    skew) and removes its VIPs. An instance that does not finish in time has its VIPs
//!    removed directly, as the guardian would.
//! 2. BGP: every prefix is withdrawn (the worker abandons a vtysh call in progress; routes are
//!    removed directly if it still does not answer).
//! 3. The handover grace: the data plane keeps forwarding for clients that still send here
//!    while the new owner's announcement spreads, then stops forwarding the VRRP VIPs.
//! 4. The guardian is told goodbye (its VIPs are given back already).
//!
//! The owner runs the stop itself, after its loop: a reload is either done before it starts
//! or never starts, so no instance outlives the stop.

use std::time::{Duration, Instant};

use super::owner::Owner;

/// The whole stop, within a 10 s termination grace with room for the process to exit.
pub const STOP_BUDGET: Duration = Duration::from_secs(8);
/// Step 1's share: priority-0 adverts and address removal are one packet and one netlink
/// message per VIP.
const VRRP_DEADLINE: Duration = Duration::from_secs(3);
/// Step 2's share.
const BGP_DEADLINE: Duration = Duration::from_secs(2);

impl Owner {
    /// Stop in the order above.
    pub async fn stop(&mut self) {
        let start = Instant::now();
        // Requests still queued (a reload racing the stop) are answered "stopping" by their
        // dropped reply channels, and nothing new gets in.
        self.close_inbox();
        let forwarding = self.facts.vrrp_master.values().any(|m| *m);
        self.resign_vrrp().await;
        self.bgp.stop(BGP_DEADLINE).await;
        if forwarding {
            let grace = Duration::from_millis(self.cfg.handover_grace_ms);
            let left = STOP_BUDGET.saturating_sub(start.elapsed());
            let grace = grace.min(left);
            tracing::info!(
                ?grace,
                "handover: forwarding for the new owner's clients until the grace ends"
            );
            tokio::time::sleep(grace).await;
        }
        self.facts.vrrp_master.clear();
        if let Err(e) = self.apply() {
            tracing::error!(error = %format!("{e:#}"), "stop: applying the end of VRRP ownership");
        }
        if let Some(g) = self.guardian.take() {
            g.bye();
        }
    }

    /// Step 1: every VRRP instance resigns and removes its VIPs, all at once, within
    /// [`VRRP_DEADLINE`]; VIPs of instances that did not finish are removed directly.
    async fn resign_vrrp(&mut self) {
        let handles = std::mem::take(&mut self.vrrp);
        if handles.is_empty() {
            return;
        }
        let cfg = self.cfg.clone();
        let vips: Vec<(String, Vec<std::net::IpAddr>)> = handles
            .iter()
            .map(|h| (super::vrrp::interface_of(&h.cfg, &cfg), h.cfg.vips.clone()))
            .collect();
        let all = futures::future::join_all(handles.into_iter().map(|h| h.instance.shutdown()));
        if tokio::time::timeout(VRRP_DEADLINE, all).await.is_ok() {
            return;
        }
        tracing::error!(
            ?VRRP_DEADLINE,
            "VRRP instances did not stop in time; removing their VIPs directly"
        );
        for (ifname, vips) in vips {
            let removed = tokio::time::timeout(
                Duration::from_secs(1),
                crate::vrrp::announce::remove_stale(self.netlink.handle(), &ifname, &vips),
            )
            .await;
            match removed {
                Ok(Ok(r)) => tracing::info!(interface = %ifname, removed = ?r, "VIPs removed"),
                Ok(Err(e)) => {
                    tracing::error!(interface = %ifname, error = %format!("{e:#}"), "removing VIPs")
                }
                Err(_) => tracing::error!(interface = %ifname, "netlink did not answer"),
            }
        }
    }
}
