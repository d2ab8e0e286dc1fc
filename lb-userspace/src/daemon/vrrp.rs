//! The owner's VRRP instances: starting them, their tracked weights, their status. Each
//! instance runs its own task (see [`crate::vrrp::Instance`]); its ownership reaches the owner
//! as [`Msg::Ownership`] through a small watcher that runs the handover grace.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use lb_core::controller::{Effect, Input};

use super::owner::{Msg, Owner};
use crate::{
    config::Config,
    handover::Handover,
    net, plan,
    vrrp::{Instance, InstanceConfig},
};

/// A running VRRP instance and what its tracked checks last added to its priority.
pub struct VrrpHandle {
    /// The instance as configured (the file's peers: the floor).
    pub cfg: InstanceConfig,
    /// The peers it runs with: the floor and the learned members (see `members`).
    pub peers: Vec<IpAddr>,
    pub instance: Instance,
    /// What its tracked checks last added to its priority, and whether one holds it in FAULT.
    pub weight: crate::vrrp::track::Tracking,
    /// This incarnation (see [`Msg::Ownership`]).
    pub id: u64,
}

/// The interface an instance runs on.
pub fn interface_of(r: &InstanceConfig, cfg: &Config) -> String {
    r.interface.clone().unwrap_or_else(|| cfg.interface.clone())
}

impl Owner {
    /// Hold the static VIPs, then start the VRRP instances (this node was prepared as a DSR
    /// backend of their VIPs at start, see [`prepare_dsr_backend`]); each instance's master
    /// state drives the ownership of its VIPs in the data plane.
    pub async fn start_vrrp(&mut self) -> Result<()> {
        let cfg = self.cfg.clone();
        let want = crate::static_vip::static_vips(&cfg);
        let req = super::netexec::Request::StaticVips { want, fresh: false };
        self.netexec
            .call(req)
            .await
            .map_err(|e| anyhow::anyhow!("static VIPs: {e}"))?;
        if cfg.vrrp.is_empty() {
            return Ok(());
        }
        // VIPs an earlier configuration left (our label, no instance owns them now). Each
        // instance removes its own stale VIPs itself when it starts, and only those.
        let mut interfaces: Vec<String> = cfg.vrrp.iter().map(|r| interface_of(r, &cfg)).collect();
        interfaces.sort();
        interfaces.dedup();
        // The static VIPs were just added on the same interface with the same label: keep them.
        let keep: Vec<IpAddr> = crate::static_vip::configured_vips(&cfg);
        for ifname in &interfaces {
            let removed =
                crate::net::addr::remove_orphans(self.netlink.handle(), ifname, &keep).await?;
            if !removed.is_empty() {
                tracing::info!(interface = %ifname, ?removed, "removed VIPs of an earlier configuration");
            }
        }
        for r in &cfg.vrrp {
            let h = self.spawn_instance(r.clone()).await?;
            self.vrrp.push(h);
        }
        self.feed(Input::VrrpStarted).await;
        Ok(())
    }

    /// Before the VRRP instances start: wait until the rendered peers know this node (its
    /// announcement answered), so that their adverts reach it before it could elect itself.
    pub async fn join_members(&mut self) {
        if let Some(m) = &self.members {
            let wait = self.cfg.members.as_ref().map_or(0, |m| m.join_wait_ms);
            m.joined(Duration::from_millis(wait)).await;
            // What it learned meanwhile is in the queue: take it before the instances start;
            // anything else waits for the loop, in its order.
            let mut later = Vec::new();
            while let Ok(msg) = self.rx.try_recv() {
                match msg {
                    Msg::Members(r) => self.roster = *r,
                    other => later.push(other),
                }
            }
            for m in later {
                let _ = self.tx.send(m);
            }
        }
    }

    /// Instance `r` as it runs: its peers are the floor and the learned members of its VRID
    /// and family (a multicast instance, or one without `unicast_src`, as configured).
    pub(super) fn effective_instance(&self, r: &InstanceConfig) -> InstanceConfig {
        let mut e = r.clone();
        if let (false, Some(src)) = (r.unicast_peers.is_empty(), r.unicast_src) {
            e.unicast_peers = crate::members::roster::merge(
                &r.unicast_peers,
                &self.roster.peers_for(r.vrid, src),
                Some(src),
            );
        }
        e
    }

    /// The learned members changed: each instance whose peers change takes them in place,
    /// and the sync its learned peers.
    pub(super) async fn apply_members(&mut self) {
        let effective: Vec<InstanceConfig> = self
            .vrrp
            .iter()
            .map(|h| self.effective_instance(&h.cfg))
            .collect();
        for (h, e) in self.vrrp.iter_mut().zip(effective) {
            if e.unicast_peers != h.peers {
                tracing::info!(instance = %h.cfg.name, peers = ?e.unicast_peers, "VRRP peers follow the members");
                h.peers = e.unicast_peers.clone();
                h.instance.reconfigure(e);
            }
        }
        // A learned sync peer is a node the rendered lists do not know at all: one they name
        // as a VRRP peer and not as a sync peer forwards none of this node's VIPs (a master
        // in the ingress election without a router, say), as render decided.
        let vrids: Vec<u8> = self.cfg.vrrp.iter().map(|r| r.vrid).collect();
        let floor = super::members::floor(&self.cfg);
        let learned: Vec<IpAddr> = self
            .roster
            .sync_peers(&vrids)
            .into_iter()
            .filter(|a| !floor.contains(a))
            .collect();
        if let Some(s) = &mut self.sync {
            s.learn(learned).await;
        }
    }

    /// Start one instance and the watcher that turns its mastership into forwarding.
    pub(super) async fn spawn_instance(&mut self, r: InstanceConfig) -> Result<VrrpHandle> {
        let running = self.effective_instance(&r);
        let peers = running.unicast_peers.clone();
        // An earlier incarnation (or a removed instance) still removing these VIPs goes first.
        self.leaving.retain(|l| !l.is_gone());
        let after = self
            .leaving
            .iter()
            .filter(|l| l.shares(&r.vips))
            .cloned()
            .collect();
        let mut instance = Instance::spawn(
            running,
            &self.cfg.interface,
            self.netlink.handle().clone(),
            self.cfg.vrrp_rt_priority,
            after,
        )
        .await
        .with_context(|| format!("start VRRP instance {}", r.name))?;
        // Its incarnation, and an adopted master's hold (the controller decides both).
        let started = Input::InstanceStarted {
            name: r.name.clone(),
            priority: r.priority,
            interval: Duration::from_millis(u64::from(r.interval_ms())),
        };
        let (id, hold) = match self.ctl.handle(Instant::now(), started).as_slice() {
            [Effect::WatchOwnership { id, hold, .. }] => (*id, *hold),
            other => anyhow::bail!("VRRP instance {}: unexpected {other:?}", r.name),
        };
        let mut failures = instance.take_peer_failures();
        let mut owned = instance.ownership();
        let forwarding = instance.forwarding_ack();
        let (tx, name) = (self.tx.clone(), r.name.clone());
        let grace = Duration::from_millis(self.cfg.handover_grace_ms);
        tokio::spawn(async move {
            // Mastership drives forwarding, through the handover grace (see `handover`).
            let mut handover = Handover::adopted(grace, hold, Instant::now());
            let mut f = handover.observe(*owned.borrow_and_update(), Instant::now());
            // Pass a dead master on to the owner; false once the owner is gone.
            let report = |peer| {
                let name = name.clone();
                tx.send(Msg::PeerFailed { name, peer }).is_ok()
            };
            'watch: loop {
                // A master that went silent is reported before our mastership (the instance
                // sends it first, and the owner takes messages in order): its backends leave
                // the new-flow tables before this node forwards, so no SYN at the takeover is
                // placed on a dead backend (see `lb_core::backends`).
                if let Some(rx) = failures.as_mut() {
                    while let Ok(peer) = rx.try_recv() {
                        if !report(peer) {
                            break 'watch;
                        }
                    }
                }
                tracing::info!(instance = %name, master = *owned.borrow(), forward = f.forward, grace_until = ?f.until, "VRRP ownership");
                let (done, applied) = tokio::sync::oneshot::channel();
                let msg = Msg::Ownership {
                    name: name.clone(),
                    id,
                    forward: f.forward,
                    done,
                };
                // The owner is gone: lbd is stopping, and the stop owns forwarding now.
                if tx.send(msg).is_err() || applied.await.is_err() {
                    break 'watch;
                }
                // The instance announces its VIPs only once the data plane forwards them.
                if let Some(ack) = &forwarding {
                    let _ = ack.send(f.forward);
                }
                // When the instance is gone (lbd stopping, or a reload replacing it) this
                // watcher stops without another write: the stop runs the grace, and a
                // replacing instance's watcher owns the fact from then on.
                let until = f.until;
                f = loop {
                    tokio::select! {
                        r = owned.changed() => {
                            if r.is_err() {
                                break 'watch;
                            }
                            break handover.observe(*owned.borrow_and_update(), Instant::now());
                        }
                        _ = sleep_until(until) => break handover.at(Instant::now()),
                        Some(peer) = next_failure(&mut failures) => {
                            if !report(peer) {
                                break 'watch;
                            }
                        }
                    }
                };
            }
        });
        Ok(VrrpHandle {
            cfg: r,
            peers,
            instance,
            weight: Default::default(),
            id,
        })
    }

    /// Stop a running instance at a reload (restart, removal or undo), waiting for it at most
    /// the netlink deadline: one still removing its VIPs after that goes on leaving on its own
    /// thread, and what starts with one of its VIPs waits for it ([`Instance::spawn`]), so its
    /// late removal never lands after the successor's add.
    pub(super) async fn stop_instance(&mut self, h: VrrpHandle) {
        let name = h.cfg.name.clone();
        let deadline = super::netexec::DEADLINE;
        if let Some(l) = h.instance.shutdown_within(deadline).await {
            tracing::warn!(instance = %name, ?deadline, vips = ?l.vips, "VRRP instance has not left in time (its VIP removal waits on the kernel); what takes its VIPs next waits for it");
            self.leaving.push(l);
        }
        self.instance_stopped(&name);
    }

    /// An instance was stopped (restart, removal): its ownership is gone.
    pub(super) fn instance_stopped(&mut self, name: &str) {
        let name = name.to_string();
        self.ctl
            .handle(Instant::now(), Input::InstanceStopped { name });
    }

    /// Push each instance's tracked weight (checks passing, load balancer ready, and the
    /// instances it moves together with, see [`crate::vrrp::group`]) if it changed.
    pub(super) async fn sync_tracking(&mut self) {
        // In config order: a group's first instance there leads it (a reload appends the
        // instances it starts to `self.vrrp`).
        let rank = |h: &VrrpHandle| self.cfg.vrrp.iter().position(|r| r.name == h.cfg.name);
        let mut order: Vec<usize> = (0..self.vrrp.len()).collect();
        order.sort_by_key(|i| rank(&self.vrrp[*i]));
        let own: Vec<crate::vrrp::track::Tracking> = order
            .iter()
            .map(|i| {
                let tracks = self.ctl.tracks();
                plan::track_weight(&self.cfg, &self.vrrp[*i].cfg.name, tracks, &self.rows)
            })
            .collect();
        let statuses: Vec<_> = order
            .iter()
            .map(|i| self.vrrp[*i].instance.status())
            .collect();
        let members: Vec<crate::vrrp::group::Member> = order
            .iter()
            .map(|i| &self.vrrp[*i])
            .zip(&own)
            .zip(&statuses)
            .map(|((h, own), s)| crate::vrrp::group::Member {
                group: h.cfg.group.as_deref(),
                own: *own,
                // The transition is recorded before the instance releases or takes its VIPs,
                // its state snapshot after: a group reacting to that change (whose ownership
                // message brings us here) must see the new state.
                state: s.last_transition.as_ref().map_or(s.state, |t| t.to),
                master: s.master,
                primary: s.primary_addr,
                pushed_fault: h.weight.fault,
                left_master: s
                    .last_transition
                    .as_ref()
                    .is_some_and(|t| t.from == crate::vrrp::state::State::Master),
            })
            .collect();
        let weights = crate::vrrp::group::group_tracking(&members);
        for (i, w) in order.into_iter().zip(weights) {
            let h = &mut self.vrrp[i];
            if w != h.weight {
                tracing::info!(instance = %h.cfg.name, group = ?h.cfg.group, weight = w.weight, fault = w.fault, "tracked weight changed");
                h.instance.set_track_weight(w);
                h.weight = w;
            }
        }
    }

    /// Addresses of the other VRRP speakers: configured unicast peers and each instance's
    /// current master (for the loop guard).
    pub(super) fn vrrp_peers(&self) -> Vec<IpAddr> {
        let mut peers: Vec<IpAddr> = self
            .vrrp
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

    pub(super) fn vrrp_status(&self) -> Vec<crate::status::VrrpRow> {
        self.vrrp
            .iter()
            .map(|h| {
                let ready = plan::lb_ready(&self.cfg, &h.cfg.name, &self.rows);
                let tracks = self
                    .cfg
                    .track
                    .iter()
                    .filter(|t| t.instance == h.cfg.name)
                    .map(|t| crate::status::TrackRow {
                        name: t.name.clone(),
                        weight: t.weight,
                        check: t
                            .address
                            .map(|a| a.to_string())
                            .unwrap_or_else(|| "load balancer ready".into()),
                        passing: match t.address {
                            Some(_) => self.ctl.tracks().get(&t.name).copied().unwrap_or(false),
                            None => ready,
                        },
                    })
                    .collect();
                crate::status::VrrpRow {
                    instance: h.instance.status(),
                    tracks,
                    track_weight: h.weight.weight,
                    track_fault: h.weight.fault,
                    group: h.cfg.group.clone(),
                }
            })
            .collect()
    }
}

/// Prepare this node as a DSR backend of its VRRP VIPs: the ARP sysctls that keep a VIP on
/// `lo` unannounced first, then the VIPs on `lo`. lbd does it first thing at start, before the
/// data plane loads (seconds on a fresh node, for the verifier): the peers take a backend back
/// as soon as its checks pass, and until its VIPs are on `lo` the packets they send it are
/// dropped. (Across an lbd restart the VIPs stay on `lo`; only `lbd teardown` removes them.)
pub async fn prepare_dsr_backend(cfg: &Config, handle: &rtnetlink::Handle) -> Result<()> {
    if !cfg.dsr_backend || cfg.vrrp.is_empty() {
        return Ok(());
    }
    net::set_arp_sysctls(&cfg.interface, &super::rollback::saved_sysctls(cfg))?;
    for r in &cfg.vrrp {
        for vip in r.vips.iter().filter(|v| cfg.backend_here(r, **v)) {
            net::ensure_local_vip(handle, *vip).await?;
        }
    }
    Ok(())
}

/// Until `until`, or forever.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(u) => tokio::time::sleep_until(u.into()).await,
        None => std::future::pending().await,
    }
}

/// The next master of the instance reported dead (None once the instance is gone).
async fn next_failure(
    failures: &mut Option<tokio::sync::mpsc::UnboundedReceiver<IpAddr>>,
) -> Option<IpAddr> {
    match failures {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
