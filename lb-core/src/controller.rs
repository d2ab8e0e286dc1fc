//! The daemon's decisions as one state machine: [`Controller::handle`] takes what happened
//! ([`Input`]) at a time the caller passes in and says what to do ([`Effect`]s, in order). The
//! owner task in `lb-userspace` (`daemon/owner.rs`) is its shell: it turns health events, VRRP
//! ownership, dead masters, gathered facts, drains, reloads and ticks into inputs, carries out
//! the effects, and feeds the results of effects that do I/O back as inputs ([`Input::Applied`],
//! [`Input::StaticVipsSet`], [`Input::VrrpReconciled`]).
//!
//! What it holds is what the decisions need and nothing of the world: the backends' health
//! facts (with the failed-backend hold and fate sharing, [`crate::backends`]), drains, each VRRP
//! instance's ownership as the data plane should see it, tracked checks, whether the maps match
//! the plan, the running instances' incarnations and which of them the previous lbd was
//! forwarding, the refresh's one-at-a-time gate, the reload in progress with what undoes it, and
//! the reload counters. The config and the plan stay with the shell: a reload hands over the
//! health facts its new config starts with, and [`Effect::InstallConfig`] /
//! [`Effect::RestoreConfig`] tell the shell which config is in force.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::backends::{self, Check, HealthFacts, Pair};

/// What happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A backend's check result changed.
    Health(Check),
    /// A tracked check (VRRP priority) passes or not.
    Track { name: String, passing: bool },
    /// `instance`'s master `peer` went silent and this node took over; `pairs` are the
    /// backends at its address. Comes before the [`Input::Ownership`] it caused.
    DeadMaster {
        instance: String,
        peer: IpAddr,
        pairs: Vec<Pair>,
    },
    /// A VRRP instance's forwarding changed (through the handover grace). `id`: the
    /// incarnation that says so (see [`Input::InstanceStarted`]).
    Ownership {
        name: String,
        id: u64,
        forward: bool,
    },
    /// A VRRP instance was started: `priority` and advert `interval` size an adopted hold.
    InstanceStarted {
        name: String,
        priority: u8,
        interval: Duration,
    },
    /// A VRRP instance was stopped (restart, removal): its ownership is gone.
    InstanceStopped { name: String },
    /// Every configured VRRP instance was started once.
    VrrpStarted,
    /// Start-up is done: the first facts are applied.
    Started,
    /// An operator drained (or undrained) a backend.
    Drain { pair: Pair, drained: bool },
    /// A second passed. `ramping`: a backend's slow start has a step due.
    Tick { ramping: bool },
    /// Kernel facts should be read again (a netlink notification).
    GatherWanted,
    /// A gather ended. `changed`: its facts differ from the ones held (`None`: it failed).
    Gathered { changed: Option<bool> },
    /// The XDP program is attached to the interface as it is now, or not.
    Attached(bool),
    /// The result of [`Effect::Apply`] (or of an apply the shell did itself): the data
    /// plane's error, if it refused.
    Applied { error: Option<String> },
    /// A reload's new config was read and checked. `fresh`: the health facts it starts with;
    /// `hold`: its `failed_backend_hold_ms`. The shell holds the new config until
    /// [`Effect::InstallConfig`].
    ReloadStaged { fresh: HealthFacts, hold: Duration },
    /// A reload was refused before anything changed (unreadable, invalid, not reloadable).
    ReloadRefused { error: String },
    /// The result of [`Effect::SetStaticVips`].
    StaticVipsSet { error: Option<String> },
    /// The result of [`Effect::ReconcileVrrp`] (which undoes its own steps on an error).
    VrrpReconciled { error: Option<String> },
    /// lbd stops: no VIP is forwarded any more.
    Stopping,
}

/// What the shell does, in this order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Rebuild the plan from the config and the facts and write it (answer [`Input::Applied`]).
    Apply,
    /// Mark these checks (`"VIP/backend"` ids) down at once in the health monitor.
    ForceDown { ids: Vec<String>, reason: String },
    /// Push each VRRP instance's tracked weight (from [`Controller::tracks`] and the plan).
    PushTracks,
    /// Tell the BGP worker the plan's rows.
    SyncBgp,
    /// Show the connection sync the services as applied.
    SyncView,
    /// Answer the ownership message being handled: the instance may announce its VIPs.
    AckOwnership,
    /// Start the watcher of a started instance: its messages carry `id`; keep forwarding for
    /// `hold` (an adopted master's, zero otherwise) unless VRRP makes this node master first.
    WatchOwnership {
        name: String,
        id: u64,
        hold: Duration,
    },
    /// Read the kernel facts beside the owner (answer [`Input::Gathered`]).
    StartGather,
    /// Periodic checks: VRRP tasks still running, the guardian alive.
    CheckTasks,
    /// Put the staged config in force (the running one becomes the staged: the undo).
    InstallConfig,
    /// Put the config that ran before the reload back in force.
    RestoreConfig,
    /// Hold the static VIPs of the config in force (answer [`Input::StaticVipsSet`]).
    SetStaticVips,
    /// Bring the VRRP instances to the config in force (answer [`Input::VrrpReconciled`]).
    ReconcileVrrp,
    /// The reload is committed: the parts that cannot fail follow the config in force (the
    /// connection sync, the members, the health targets, BGP, the guardian's watch).
    CommitReload,
    /// The reload's outcome, counted ([`Controller::reloads`]); the shell logs and answers it.
    ReloadDone(Result<(), String>),
}

/// Where a reload is (one at a time; other inputs are taken between its steps).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// The new config is in force; waiting for the data plane to take it.
    Apply,
    /// Waiting for the static VIPs.
    StaticVips,
    /// Waiting for the VRRP instances.
    Vrrp,
}

/// A reload in progress and what undoes it.
#[derive(Clone, Debug)]
struct Reload {
    step: Step,
    /// The health facts and the hold the running config had.
    health: HealthFacts,
    hold: Duration,
}

/// Reload counters for `lbctl stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    pub done: u64,
    pub failed: u64,
    pub last_error: Option<String>,
}

/// The daemon's decision state (see the module doc).
#[derive(Clone, Debug)]
pub struct Controller {
    health: HealthFacts,
    /// `failed_backend_hold_ms` of the config in force.
    hold: Duration,
    drained: HashSet<Pair>,
    /// Per VRRP instance: forward its VIPs (master, or within the handover grace).
    vrrp_master: HashMap<String, bool>,
    tracks: HashMap<String, bool>,
    /// The last apply succeeded: the maps say what the config and facts ask for.
    in_sync: bool,
    ready: bool,
    attached: bool,
    vrrp_started: bool,
    /// Instances whose VIPs the previous lbd was forwarding (adopted pinned state): their
    /// first incarnation holds forwarding for the master-down interval.
    adopted_master: HashSet<String>,
    /// The running incarnation of each instance.
    instances: HashMap<String, u64>,
    next_instance: u64,
    /// A gather runs; `gather_again`: another was asked for meanwhile.
    gathering: bool,
    gather_again: bool,
    reload: Option<Reload>,
    reloads: Reloads,
}

/// State a previous lbd left in the pinned maps, read at start.
#[derive(Clone, Debug, Default)]
pub struct Adopted {
    /// Health facts to start with (pairs the data plane had as healthy start up).
    pub health: HealthFacts,
    pub drained: HashSet<Pair>,
    /// Instances whose VIPs the data plane forwards.
    pub forwarding: HashSet<String>,
}

impl Controller {
    /// A controller starting from what the previous lbd left (nothing, on a fresh node);
    /// `hold`: `failed_backend_hold_ms`.
    pub fn new(adopted: Adopted, hold: Duration) -> Self {
        Controller {
            health: adopted.health,
            hold,
            drained: adopted.drained,
            vrrp_master: adopted
                .forwarding
                .iter()
                .map(|n| (n.clone(), true))
                .collect(),
            tracks: HashMap::new(),
            in_sync: false,
            ready: false,
            attached: true,
            vrrp_started: false,
            adopted_master: adopted.forwarding,
            instances: HashMap::new(),
            next_instance: 0,
            gathering: false,
            gather_again: false,
            reload: None,
            reloads: Reloads::default(),
        }
    }

    pub fn health(&self) -> &HealthFacts {
        &self.health
    }
    pub fn drained(&self) -> &HashSet<Pair> {
        &self.drained
    }
    pub fn vrrp_master(&self) -> &HashMap<String, bool> {
        &self.vrrp_master
    }
    pub fn tracks(&self) -> &HashMap<String, bool> {
        &self.tracks
    }
    /// A reload runs: its steps' answers are awaited (the shell starts no other meanwhile).
    pub fn reloading(&self) -> bool {
        self.reload.is_some()
    }
    /// The last apply succeeded.
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }
    pub fn attached(&self) -> bool {
        self.attached
    }
    pub fn reloads(&self) -> &Reloads {
        &self.reloads
    }
    /// Whether some VIP is forwarded here now.
    pub fn forwarding(&self) -> bool {
        self.vrrp_master.values().any(|m| *m)
    }
    /// Whether `id` is the running incarnation of `name`.
    pub fn current(&self, name: &str, id: u64) -> bool {
        self.instances.get(name) == Some(&id)
    }

    /// `/readyz` apart from a task failure: `instances` are the configured VRRP instances
    /// with whether each runs (`None`: not started).
    pub fn readiness(&self, instances: &[(&str, Option<bool>)]) -> Result<(), String> {
        if !self.ready {
            return Err("starting".into());
        }
        if !self.attached {
            return Err("data plane not attached to the interface".into());
        }
        for (name, running) in instances {
            match running {
                Some(true) => {}
                Some(false) => return Err(format!("VRRP instance {name} is not running")),
                None if self.vrrp_started => {
                    return Err(format!("VRRP instance {name} is not running"));
                }
                None => return Err("VRRP not started yet".into()),
            }
        }
        Ok(())
    }

    /// Take `input` at `now`; what to do, in order.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Health(check) => {
                self.backends(now, backends::Input::Check(check), &mut out);
                after_apply(&mut out);
            }
            Input::Track { name, passing } => {
                self.tracks.insert(name, passing);
                out.push(Effect::PushTracks);
            }
            Input::DeadMaster {
                instance,
                peer,
                pairs,
            } => {
                let input = backends::Input::DeadMaster {
                    instance,
                    peer,
                    pairs,
                };
                self.backends(now, input, &mut out);
                after_apply(&mut out);
            }
            Input::Ownership { name, id, forward } => {
                if self.current(&name, id) {
                    self.vrrp_master.insert(name, forward);
                    // A group's other members follow before the data plane is rebuilt: the
                    // instant their VIPs are on another node than this one's is that much
                    // shorter. The answer goes as soon as the data plane forwards.
                    out.push(Effect::PushTracks);
                    self.apply(now, &mut out);
                    out.push(Effect::AckOwnership);
                    after_apply(&mut out);
                } else {
                    // A replaced incarnation: nothing changes, but its watcher is not kept
                    // waiting.
                    out.push(Effect::AckOwnership);
                }
            }
            Input::InstanceStarted {
                name,
                priority,
                interval,
            } => {
                self.next_instance += 1;
                let id = self.next_instance;
                // After a crash and a quick restart, clients may still send here until another
                // node has taken over and announced it: forward with the adopted table until
                // the new master can have done so (its first incarnation only).
                let hold = if self.adopted_master.remove(&name) {
                    crate::handover::adopted_hold(priority, interval)
                } else {
                    Duration::ZERO
                };
                self.instances.insert(name.clone(), id);
                out.push(Effect::WatchOwnership { name, id, hold });
            }
            Input::InstanceStopped { name } => {
                self.instances.remove(&name);
                self.vrrp_master.remove(&name);
            }
            Input::VrrpStarted => {
                self.vrrp_started = true;
                out.push(Effect::PushTracks);
            }
            Input::Started => self.ready = true,
            Input::Drain { pair, drained } => {
                if drained {
                    self.drained.insert(pair);
                } else {
                    self.drained.remove(&pair);
                }
                self.apply(now, &mut out);
                after_apply(&mut out);
            }
            Input::Tick { ramping } => {
                // Slow start climbs with time alone; a failed backend's hold ends with it.
                if ramping || backends::holds_over(&self.health, now) {
                    self.apply(now, &mut out);
                }
                out.push(Effect::SyncView);
                self.gather(&mut out);
                out.push(Effect::CheckTasks);
                // Groups follow their members' states, which change without a message.
                out.push(Effect::PushTracks);
            }
            Input::GatherWanted => self.gather(&mut out),
            Input::Gathered { changed } => {
                self.gathering = false;
                if std::mem::take(&mut self.gather_again) {
                    self.gather(&mut out);
                }
                if let Some(changed) = changed {
                    // With nothing new, re-applying would only rebuild every table to find it
                    // equal; a hold that ran out is news (its flows move now).
                    if changed || !self.in_sync || backends::holds_over(&self.health, now) {
                        self.apply(now, &mut out);
                    }
                    out.push(Effect::SyncBgp);
                }
            }
            Input::Attached(a) => self.attached = a,
            Input::Applied { error } => {
                self.in_sync = error.is_none();
                if self.step_is(Step::Apply) {
                    match error {
                        None => self.reload_step(Step::StaticVips, Effect::SetStaticVips, &mut out),
                        Some(e) => self.undo(
                            now,
                            false,
                            &format!(
                                "new config refused by the data plane; kept the running one: {e}"
                            ),
                            &mut out,
                        ),
                    }
                }
            }
            Input::ReloadStaged { .. } if self.reload.is_some() => {
                out.push(Effect::ReloadDone(Err("a reload is in progress".into())));
            }
            Input::ReloadStaged { fresh, hold } => {
                let running = std::mem::replace(&mut self.health, fresh);
                self.reload = Some(Reload {
                    step: Step::Apply,
                    health: running,
                    hold: std::mem::replace(&mut self.hold, hold),
                });
                out.push(Effect::InstallConfig);
                self.apply(now, &mut out);
            }
            Input::ReloadRefused { error } => self.reload_done(Err(error), &mut out),
            Input::StaticVipsSet { error } => {
                if self.step_is(Step::StaticVips) {
                    match error {
                        None => self.reload_step(Step::Vrrp, Effect::ReconcileVrrp, &mut out),
                        Some(e) => self.undo(
                            now,
                            true,
                            &format!("static VIPs; kept the running config: {e}"),
                            &mut out,
                        ),
                    }
                }
            }
            Input::VrrpReconciled { error } => {
                if self.step_is(Step::Vrrp) {
                    match error {
                        None => {
                            self.reload = None;
                            out.push(Effect::CommitReload);
                            out.push(Effect::SyncView);
                            out.push(Effect::PushTracks);
                            self.gather(&mut out);
                            self.reload_done(Ok(()), &mut out);
                        }
                        Some(e) => self.undo(
                            now,
                            true,
                            &format!("VRRP instances; kept the running config: {e}"),
                            &mut out,
                        ),
                    }
                }
            }
            Input::Stopping => {
                if !self.vrrp_master.is_empty() {
                    self.vrrp_master.clear();
                    self.apply(now, &mut out);
                }
            }
        }
        out
    }

    fn step_is(&self, step: Step) -> bool {
        self.reload.as_ref().is_some_and(|r| r.step == step)
    }

    fn reload_step(&mut self, step: Step, effect: Effect, out: &mut Vec<Effect>) {
        if let Some(r) = &mut self.reload {
            r.step = step;
        }
        out.push(effect);
    }

    /// A reload step failed: the running config comes back with its health facts, in the data
    /// plane and (when that step ran) in the static VIPs.
    fn undo(&mut self, now: Instant, static_vips: bool, why: &str, out: &mut Vec<Effect>) {
        let Some(mut r) = self.reload.take() else {
            return;
        };
        // The steps' answers come through the owner's loop: checks of the running config's
        // backends that changed meanwhile are newer than the facts kept for the undo.
        for (pair, fact) in std::mem::take(&mut self.health) {
            if let Some(kept) = r.health.get_mut(&pair) {
                *kept = fact;
            }
        }
        self.health = r.health;
        self.hold = r.hold;
        out.push(Effect::RestoreConfig);
        self.apply(now, out);
        if static_vips {
            out.push(Effect::SetStaticVips);
        }
        self.reload_done(Err(why.to_string()), out);
    }

    fn reload_done(&mut self, result: Result<(), String>, out: &mut Vec<Effect>) {
        match &result {
            Ok(()) => {
                self.reloads.done += 1;
                self.reloads.last_error = None;
            }
            Err(e) => {
                self.reloads.failed += 1;
                self.reloads.last_error = Some(e.clone());
            }
        }
        out.push(Effect::ReloadDone(result));
    }

    /// One gather at a time; a request while one runs starts another when it is done.
    fn gather(&mut self, out: &mut Vec<Effect>) {
        if self.gathering {
            self.gather_again = true;
        } else {
            self.gathering = true;
            out.push(Effect::StartGather);
        }
    }

    /// An apply: holds that ended first let their flows move (and the refresh stop asking).
    fn apply(&mut self, now: Instant, out: &mut Vec<Effect>) {
        backends::handle(&mut self.health, self.hold, now, backends::Input::Tick);
        out.push(Effect::Apply);
    }

    fn backends(&mut self, now: Instant, input: backends::Input, out: &mut Vec<Effect>) {
        for e in backends::handle(&mut self.health, self.hold, now, input) {
            match e {
                backends::Effect::ForceDown { ids, reason } => {
                    out.push(Effect::ForceDown { ids, reason })
                }
                backends::Effect::Apply => self.apply(now, out),
            }
        }
    }
}

/// What follows a change of the plan: tracked weights, BGP announcements, the sync's view.
fn after_apply(out: &mut Vec<Effect>) {
    if out.contains(&Effect::Apply) {
        out.extend([Effect::PushTracks, Effect::SyncBgp, Effect::SyncView]);
    }
}
