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
//!    while the new owner's announcement spreads; the connection sync's second flush sends
//!    the exceptions placed meanwhile; then forwarding of the VRRP VIPs stops.
//! 4. The guardian is told goodbye (its VIPs are given back already).
//!
//! The owner runs the stop itself, after its loop: a reload is either done before it starts
//! or never starts (requests that arrive during the stop are refused), so no instance outlives
//! the stop.

use std::time::{Duration, Instant};

use lb_core::controller::{Effect, Input};

use super::owner::{Msg, Owner};

/// The whole stop, within a 10 s termination grace with room for the process to exit.
pub const STOP_BUDGET: Duration = Duration::from_secs(8);
/// Step 1's share: priority-0 adverts and address removal are one packet and one netlink
/// message per VIP.
const VRRP_DEADLINE: Duration = Duration::from_secs(3);
/// Each of the connection sync's two last flushes, before step 1 and at the end of the
/// handover grace: a scan takes up to about half a second on a full table, and the flush may
/// wait for one already running.
const SYNC_FLUSH_DEADLINE: Duration = Duration::from_millis(1500);
/// Telling the members this node leaves: one datagram per node.
const MEMBERS_LEAVE_DEADLINE: Duration = Duration::from_millis(200);
/// Step 2's share.
const BGP_DEADLINE: Duration = Duration::from_secs(2);

impl Owner {
    /// Stop in the order above.
    pub async fn stop(&mut self) {
        let start = Instant::now();
        let forwarding = self.ctl.forwarding();
        // The peers learn this node's exceptions before one of them takes the VIPs.
        if let Some(s) = &self.sync {
            self.sync_view();
            s.flush(SYNC_FLUSH_DEADLINE).await;
        }
        self.resign_vrrp().await;
        // After the resignation: the peers still take this node's priority-0 adverts.
        if let Some(m) = &self.members {
            m.leave(MEMBERS_LEAVE_DEADLINE).await;
        }
        // The grace counts from the resignation (the priority-0 adverts), as for any move, not
        // from the end of the BGP step: a slow FRR must not lengthen it, and no grace means
        // forwarding stops now.
        let resigned = Instant::now();
        // The second flush's time is kept out of the grace.
        let second_flush = if self.sync.is_some() && forwarding {
            SYNC_FLUSH_DEADLINE
        } else {
            Duration::ZERO
        };
        let grace = Duration::from_millis(self.cfg.handover_grace_ms)
            .min(STOP_BUDGET.saturating_sub(start.elapsed() + second_flush));
        // Requests still queued (a reload racing the stop) are answered "stopping" by their
        // dropped reply channels, and nothing new gets in.
        self.close_inbox();
        if grace.is_zero() {
            self.feed(Input::Stopping).await;
        }
        self.bgp.stop(BGP_DEADLINE).await;
        if forwarding && !grace.is_zero() {
            tracing::info!(
                ?grace,
                "handover: forwarding for the new owner's clients until the grace ends"
            );
            tokio::time::sleep_until((resigned + grace).into()).await;
        }
        // Connections placed during the grace (a SYN that skipped a drained backend) are
        // exceptions the first flush never saw: sent while this node still forwards them (the
        // scan shares only what is forwarded here).
        if let Some(s) = &self.sync
            && forwarding
            && !grace.is_zero()
        {
            self.sync_view();
            s.flush(SYNC_FLUSH_DEADLINE).await;
        }
        self.feed(Input::Stopping).await;
        if let Some(g) = self.guardian.take() {
            g.bye();
        }
    }

    /// Step 1: every VRRP instance resigns and removes its VIPs, all at once, within
    /// [`VRRP_DEADLINE`]; VIPs of instances that did not finish are removed directly.
    /// Meanwhile the resigning instances' ownership changes are still applied (the handover
    /// grace decides when forwarding stops, as for any move); every other message is refused.
    async fn resign_vrrp(&mut self) {
        let handles = std::mem::take(&mut self.vrrp);
        // Instances a reload stopped that are still removing their VIPs are waited for too.
        let leaving = std::mem::take(&mut self.leaving);
        if handles.is_empty() && leaving.is_empty() {
            return;
        }
        let ids: Vec<u64> = handles.iter().map(|h| h.id).collect();
        let cfg = self.cfg.clone();
        let vips: Vec<(String, Vec<std::net::IpAddr>)> = handles
            .iter()
            .map(|h| (super::vrrp::interface_of(&h.cfg, &cfg), h.cfg.vips.clone()))
            .chain(
                leaving
                    .iter()
                    .map(|l| (l.interface.clone(), l.vips.clone())),
            )
            .collect();
        let all = futures::future::join(
            futures::future::join_all(handles.into_iter().map(|h| h.instance.shutdown())),
            futures::future::join_all(leaving.into_iter().map(|l| l.wait())),
        );
        let deadline = tokio::time::sleep(VRRP_DEADLINE);
        tokio::pin!(all, deadline);
        let done = loop {
            tokio::select! {
                _ = &mut all => break true,
                _ = &mut deadline => break false,
                Some(m) = self.rx.recv() => self.while_resigning(m, &ids),
            }
        };
        if done {
            return;
        }
        tracing::error!(
            ?VRRP_DEADLINE,
            "VRRP instances did not stop in time; removing their VIPs directly"
        );
        for (ifname, vips) in vips {
            let removed = tokio::time::timeout(
                Duration::from_secs(1),
                crate::net::addr::remove_stale(self.netlink.handle(), &ifname, &vips),
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

    fn while_resigning(&mut self, m: Msg, ids: &[u64]) {
        // Anything else is dropped: an API request is answered "lbd is stopping".
        if let Msg::Ownership {
            name,
            id,
            forward,
            done,
        } = m
        {
            // Only the rebuild: the instances are gone, and so are their weights.
            let effects = if ids.contains(&id) {
                self.ctl
                    .handle(Instant::now(), Input::Ownership { name, id, forward })
            } else {
                Vec::new()
            };
            if effects.contains(&Effect::Apply)
                && let Err(e) = self.apply()
            {
                tracing::error!(error = %format!("{e:#}"), "applying VRRP ownership");
            }
            let _ = done.send(());
        }
    }
}
