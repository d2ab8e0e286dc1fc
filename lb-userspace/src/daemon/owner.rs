//! The owner: the one task that holds lbd's state and changes it, the shell of
//! [`lb_core::controller`]. Events arrive as [`Msg`]s (API requests, VRRP ownership, dead peers,
//! facts gathered beside it, reload requests) or from streams it selects on (health events,
//! netlink notifications, signals, timers); the owner turns them into the controller's inputs
//! and carries out the effects it returns ([`Owner::feed`]). Every handler is short: anything that can block (netlink dumps, vtysh) runs in a task beside the
//! owner and reports back as a message, with a deadline, so a stuck FRR or kernel call never
//! delays a stop, a health change or a VIP move.
//!
//! API requests (lbctl, `/metrics`, `/readyz`) come on an inbox of their own, bounded
//! ([`API_QUEUE`]) and served last: any local process can send them as fast as it likes, and
//! they must never stand between the owner and a health event, a VRRP ownership change, a
//! neighbour notification or SIGHUP. Under API load a ready event waits for at most the one
//! API answer being computed; the clients wait for room in the queue.

use std::{
    collections::VecDeque,
    net::IpAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use tokio::sync::{mpsc, oneshot};

use super::{
    adopt, bgp::BgpHandle, churn, conntrack, front::Front, health_targets, initial_health,
    load_options, lock::InstanceLock, netexec, refresh::Gathered, supervise::Shared,
    vrrp::VrrpHandle,
};
use crate::{
    api::{Request, Response},
    config::Config,
    dataplane::Dataplane,
    health::{FailureClass, Health, HealthEvent, HealthMonitor},
    net::{self, Netlink},
    plan::{self, BackendPlan, Facts},
};
use lb_core::controller::{self, Controller, Effect, Input};

/// What reaches the owner from other tasks.
pub enum Msg {
    /// An API request; the answer goes back on the channel.
    Api(Request, oneshot::Sender<Response>),
    /// `lbctl bgp status`: the config and the BGP worker's last status (the sessions are read
    /// beside the owner, through vtysh).
    BgpView(oneshot::Sender<(Config, crate::bgp::Status)>),
    /// `lbctl flows`: where the maps are pinned and what each backend slot holds (the maps are
    /// walked beside the owner).
    FlowsView(oneshot::Sender<super::flows::FlowsView>),
    /// A VRRP instance's forwarding changed (through the handover grace). `id` names the
    /// instance's incarnation: a message from one a reload replaced is ignored. `done` is
    /// answered once the data plane forwards accordingly.
    Ownership {
        name: String,
        id: u64,
        forward: bool,
        done: oneshot::Sender<()>,
    },
    /// A VRRP instance took over because its master `peer` went silent (fate sharing, see
    /// `lb_core::backends`).
    PeerFailed { name: String, peer: IpAddr },
    /// Kernel facts gathered beside the owner (see `refresh`).
    Gathered(Box<Result<Gathered>>),
    /// The netlink executor's answer to [`Effect::SetStaticVips`] (see `netexec`).
    StaticVipsSet { error: Option<String> },
    /// A reload asked for while another ran: its turn.
    Reload,
    /// The config file's contents changed (see `config_watch`): reload, as on SIGHUP.
    ConfigChanged,
    /// The learned members changed (see `members`): their peers join the VRRP instances and
    /// the sync.
    Members(Box<crate::members::roster::Roster>),
}

/// API requests queued for the owner at most; more wait in their connection's task.
pub const API_QUEUE: usize = 16;

/// The main loop ticks every second; this long without a tick means lbd is wedged.
pub const LIVENESS_STALE: Duration = Duration::from_secs(10);

/// The owner's state. Only the owner task touches it.
pub struct Owner {
    pub(super) cfg: Config,
    pub(super) config_path: PathBuf,
    pub(super) dp: Dataplane,
    /// The kernel's facts (the health, drains and ownership the plan also reads are the
    /// controller's).
    pub(super) facts: Facts,
    pub(super) rows: Vec<BackendPlan>,
    pub(super) ifindex: u32,
    /// The decisions (see [`lb_core::controller`]): this task is their shell.
    pub(super) ctl: Controller,
    /// The answer of the ownership message being handled ([`Effect::AckOwnership`]).
    pending_ack: Option<oneshot::Sender<()>>,
    /// A reload's new config until it is installed, then the running one until it commits
    /// (see `reload`).
    pub(super) staged: Option<super::reload::Staged>,
    /// Who waits for the reload in progress (`lbctl reload`), and the reloads asked for while
    /// it runs, in order (each with its waiter, if any; each reads the file when its turn
    /// comes).
    pub(super) reload_waiters: Vec<oneshot::Sender<Response>>,
    pub(super) next_reload: std::collections::VecDeque<Option<oneshot::Sender<Response>>>,
    /// Address changes run beside the owner, with a deadline (see `netexec`).
    pub(super) netexec: super::netexec::NetExec,
    /// The config file's bytes at the last load or reload attempt: a file change with the same
    /// bytes (a reload already read them) is not reloaded again (see `config_watch`).
    pub(super) config_bytes: Option<Vec<u8>>,
    pub(super) health: HealthMonitor,
    health_events: Option<mpsc::UnboundedReceiver<HealthEvent>>,
    pub(super) vrrp: Vec<VrrpHandle>,
    /// Instances stopped at a reload that had not left within the deadline (see
    /// `stop_instance`); dropped once gone.
    pub(super) leaving: Vec<crate::vrrp::instance::Leaving>,
    pub(super) netlink: Netlink,
    pub(super) bgp: BgpHandle,
    /// Interface checks so far (see `churn.rs`).
    pub(super) churn_checks: u64,
    /// Gives the VRRP VIPs back if this process dies without stopping (`lbd run` only).
    pub(super) guardian: Option<crate::guardian::Guardian>,
    pub(super) conntrack: Arc<conntrack::ConntrackCount>,
    /// Connection sync with the peers (`[sync]`), if configured.
    pub(super) sync: Option<super::sync::SyncHandle>,
    /// Membership announcements (`[members]`), if configured, and what they taught.
    pub(super) members: Option<super::members::MembersHandle>,
    pub(super) roster: crate::members::roster::Roster,
    pub(super) shared: Arc<Shared>,
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) rx: mpsc::UnboundedReceiver<Msg>,
    /// API requests ([`Msg::Api`], [`Msg::BgpView`], [`Msg::FlowsView`]): served after
    /// everything else that is ready.
    pub(super) api_rx: mpsc::Receiver<Msg>,
    /// Held until the process exits: a second lbd with this config refuses to start.
    _lock: InstanceLock,
}

impl Owner {
    /// Load the program, adopt or create pinned state, attach, and apply the config once.
    pub async fn start(
        config_path: PathBuf,
        cfg: Config,
        lock: InstanceLock,
    ) -> Result<(Owner, Arc<Front>)> {
        let netlink = Netlink::new()?;
        let link = netlink.link(&cfg.interface).await?;
        // A link pinned to a device that was deleted since (the interface was recreated) must
        // not make every start fail: drop it and attach afresh.
        churn::drop_stale_link_pin(&churn::link_pin(&load_options(&cfg), &cfg.interface), &link)?;
        super::vrrp::prepare_dsr_backend(&cfg, netlink.handle()).await?;
        let mut dp = Dataplane::load(load_options(&cfg))?;
        // A kernel whose number suggests it lacks an optional feature: what lbd does without.
        if let Some(release) = crate::dataplane::kernel::Release::current() {
            for line in crate::dataplane::kernel::without_optional(&release) {
                tracing::warn!("{line}");
            }
        }
        let lock = lock.with_pins(&load_options(&cfg))?;
        for dev in cfg.attach_interfaces() {
            if dev != cfg.interface {
                // An attach device below `interface` (br-ex's uplink): its stale pin too.
                let l = netlink
                    .link(dev)
                    .await
                    .with_context(|| format!("xdp_interfaces: no interface {dev:?}"))?;
                churn::drop_stale_link_pin(&churn::link_pin(&load_options(&cfg), dev), &l)?;
            }
            dp.attach(dev, cfg.xdp_mode)
                .with_context(|| format!("attach XDP to {dev}"))?;
        }
        if cfg.socket_lb
            && let Err(e) = dp.attach_sock()
        {
            let kernel = crate::dataplane::kernel::Release::current()
                .map_or_else(|| "unknown".to_string(), |r| r.to_string());
            tracing::error!(error = %format!("{e:#}"), kernel, "socket load balancing is off: this node's own connections to a VIP go to its local stack");
        }
        dp.spawn_log_reader()?;
        let conntrack = conntrack::spawn_counter(
            load_options(&cfg)
                .pin_dir()
                .join(lb_common::maps::CONNTRACK),
        );
        let sync = match &cfg.sync {
            Some(s) => Some(super::sync::SyncHandle::spawn(
                s,
                load_options(&cfg).pin_dir(),
            )?),
            None => None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let members = match &cfg.members {
            Some(m) => Some(super::members::MembersHandle::spawn(&cfg, m, tx.clone())?),
            None => None,
        };
        let up = adopt::adopted_up(&cfg, &dp);
        let drained = adopt::adopted_drained(&cfg, &dp);
        let vrrp_master = adopt::adopted_ownership(&cfg, &dp);
        let (health, events) = HealthMonitor::start(health_targets(&cfg, &up));
        let facts = Facts {
            if_mac: link.mac,
            ..Default::default()
        };
        let ctl = Controller::new(
            controller::Adopted {
                health: initial_health(&cfg, &up),
                drained,
                forwarding: vrrp_master.into_keys().collect(),
            },
            Duration::from_millis(cfg.failed_backend_hold_ms),
        );
        let bgp = BgpHandle::spawn(
            netlink.handle().clone(),
            crate::bgp::drain_marker(&cfg.api_socket).exists(),
        );
        let (api_tx, api_rx) = mpsc::channel(API_QUEUE);
        let shared = Arc::new(Shared::new());
        let config_bytes = std::fs::read(&config_path).ok();
        let netexec = netexec::NetExec::spawn(netlink.handle().clone(), &cfg.interface);
        let mut owner = Owner {
            cfg,
            config_path,
            dp,
            facts,
            rows: Vec::new(),
            ifindex: link.index,
            ctl,
            pending_ack: None,
            staged: None,
            reload_waiters: Vec::new(),
            next_reload: std::collections::VecDeque::new(),
            netexec,
            config_bytes,
            health,
            health_events: Some(events),
            vrrp: Vec::new(),
            leaving: Vec::new(),
            netlink,
            bgp,
            churn_checks: 0,
            guardian: None,
            conntrack,
            sync,
            members,
            roster: Default::default(),
            shared: shared.clone(),
            tx: tx.clone(),
            rx,
            api_rx,
            _lock: lock,
        };
        // The first facts before anything is announced (start-up may wait for them).
        owner.churn_checks = 1;
        let input = owner.gather_input(true);
        let got = super::refresh::gather(owner.netlink.clone(), input).await;
        owner.gathered(got).await?;
        // A data plane that refuses the first plan fails the start, with its error.
        if !owner.ctl.in_sync() {
            owner.apply()?;
        }
        owner.ctl.handle(Instant::now(), Input::Started);
        owner.shared.tick();
        // Without it only `lbctl trace` is missing: never a reason not to forward.
        let trace = match owner
            .dp
            .take_trace()
            .and_then(|t| t.map(super::trace::Hub::new).transpose())
        {
            Ok(hub) => hub,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "lbctl trace is off");
                None
            }
        };
        Ok((owner, Arc::new(Front::new(api_tx, shared, trace))))
    }

    /// Start the VIP guardian and tell it what to give back.
    pub fn start_guardian(&mut self) {
        match crate::guardian::Guardian::spawn(&crate::guardian::Watch::of(&self.cfg)) {
            Ok(g) => self.guardian = Some(g),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "no VIP guardian: a crash would leave the VIPs up")
            }
        }
    }

    /// The loop: until SIGTERM/SIGINT (`Ok(None)`) or a task failure (`Ok(Some(why))`). A stop
    /// signal that came during the start is seen first.
    pub async fn run(&mut self, signals: super::Signals) -> Result<Option<String>> {
        let mut events = self.health_events.take().context("the loop runs once")?;
        let mut neigh = net::neighbour_changes()?;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut frr_check = tokio::time::interval(Duration::from_secs(5));
        let super::Signals {
            mut term,
            mut int,
            mut hup,
        } = signals;
        let mut last_neigh = Instant::now() - Duration::from_secs(1);
        let shared = self.shared.clone();
        loop {
            // Biased: a stop is seen before any other work that is ready at the same time, and
            // API requests come after every event (see the module doc).
            tokio::select! {
                biased;
                _ = term.recv() => return Ok(None),
                _ = int.recv() => return Ok(None),
                f = shared.supervisor.failed() => return Ok(Some(f)),
                _ = tick.tick() => {
                    self.shared.tick();
                    let ramping = self.rows.iter().any(|r| r.ramping());
                    self.feed(Input::Tick { ramping }).await;
                }
                m = self.rx.recv() => match m {
                    Some(m) => self.handle(m).await,
                    None => return Ok(Some("the owner's channel closed".into())),
                },
                e = events.recv() => match e {
                    Some(e) => self.health_event(e).await,
                    None => {
                        self.shared.supervisor.fail("health monitor failed: its event channel closed".into());
                    }
                },
                n = neigh.recv() => {
                    if n.is_none() {
                        self.shared.supervisor.fail("netlink watcher stopped".into());
                        continue;
                    }
                    // Coalesce bursts of notifications.
                    if last_neigh.elapsed() > Duration::from_millis(20) {
                        last_neigh = Instant::now();
                        self.feed(Input::GatherWanted).await;
                    }
                }
                _ = frr_check.tick() => self.bgp.check(),
                _ = hup.recv() => self.reload(None).await,
                // (Closed only when the front is gone: the branch is then off.)
                Some(m) = self.api_rx.recv() => self.handle(m).await,
            }
        }
    }

    /// Refuse further messages and drop the queued ones (see `stop`).
    pub(super) fn close_inbox(&mut self) {
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
        self.api_rx.close();
        while self.api_rx.try_recv().is_ok() {}
    }

    async fn handle(&mut self, m: Msg) {
        match m {
            Msg::Api(crate::api::Request::Reload, reply) => self.reload(Some(reply)).await,
            Msg::Reload => self.reload(None).await,
            Msg::StaticVipsSet { error } => {
                if let Some(e) = &error {
                    tracing::error!(error = %e, "static VIPs");
                }
                self.feed(Input::StaticVipsSet { error }).await;
            }
            Msg::Api(req, reply) => {
                let resp = self.api(req).await;
                let _ = reply.send(resp);
            }
            Msg::BgpView(reply) => {
                let _ = reply.send((self.cfg.clone(), self.bgp.status()));
            }
            Msg::FlowsView(reply) => {
                let _ = reply.send(self.flows_view());
            }
            Msg::Ownership {
                name,
                id,
                forward,
                done,
            } => {
                // The instance announces its VIPs on this reply: it goes as soon as the data
                // plane forwards, not after the follow-up work of the change.
                self.pending_ack = Some(done);
                self.feed(Input::Ownership { name, id, forward }).await;
            }
            Msg::PeerFailed { name, peer } => {
                let pairs = plan::fate_shared(&self.cfg, peer);
                let instance = name;
                self.feed(Input::DeadMaster {
                    instance,
                    peer,
                    pairs,
                })
                .await;
            }
            Msg::Gathered(got) => {
                if let Err(e) = self.gathered(*got).await {
                    tracing::warn!(error = %format!("{e:#}"), "refresh");
                }
            }
            Msg::ConfigChanged => {
                // One read: what is compared is what is reloaded.
                let read = std::fs::read(&self.config_path);
                if crate::config_watch::reload_due(&self.config_bytes, &read.as_ref().ok().cloned())
                {
                    self.reload_bytes(read).await;
                }
            }
            Msg::Members(roster) => {
                self.roster = *roster;
                self.apply_members().await;
            }
        }
    }

    async fn api(&mut self, req: Request) -> Response {
        let result: Result<Response> = async {
            Ok(match req {
                Request::Backends => Response::json(&self.backends()?),
                Request::Vips => Response::json(&self.vips()?),
                Request::Stats => Response::json(&self.stats()?),
                Request::Vrrp => Response::json(&self.vrrp_status()),
                // Answered by the front (its sessions come from vtysh, beside the owner).
                Request::Bgp => Response::error(500, "BGP status is answered by the front"),
                Request::Flows(_) => Response::error(500, "flows are answered by the front"),
                Request::Explain(q) => Response::json(&self.explain(&q)?),
                Request::Trace(_) => Response::error(500, "traces are answered by the front"),
                Request::BgpDrain(drained) => Response::json(&self.set_node_drained(drained)?),
                Request::Drain(d) => {
                    self.set_drained(&d.vip, d.backend, true).await?;
                    Response::json(&serde_json::json!({"drained": d.backend, "vip": d.vip}))
                }
                Request::Undrain(d) => {
                    self.set_drained(&d.vip, d.backend, false).await?;
                    Response::json(&serde_json::json!({"undrained": d.backend, "vip": d.vip}))
                }
                // Answered when the reload ends (see `handle`).
                Request::Reload => Response::error(500, "reloads are answered when done"),
                // Answered by the front from the loop's tick.
                Request::Healthz => Response::text(200, "ok\n".into()),
                Request::Version => Response::json(&crate::status::VersionRow::this()),
                Request::Readyz => {
                    let (status, text) = self.readyz();
                    Response::text(status, text)
                }
                Request::Metrics => Response::openmetrics(self.metrics()?),
            })
        }
        .await;
        result.unwrap_or_else(|e| Response::error(400, format!("{e:#}")))
    }

    /// Feed the controller and carry out its effects, in order, the results of those that do
    /// I/O fed back, until none is left.
    pub(super) async fn feed(&mut self, input: Input) {
        let mut queue: VecDeque<Effect> = self.ctl.handle(Instant::now(), input).into();
        while let Some(effect) = queue.pop_front() {
            if let Some(result) = self.execute(effect).await {
                queue.extend(self.ctl.handle(Instant::now(), result));
            }
        }
    }

    /// Carry out one effect; the input its result is, if any.
    async fn execute(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Apply => {
                let error = self.write_plan().err().map(|e| {
                    tracing::error!(error = %format!("{e:#}"), "applying the plan");
                    format!("{e:#}")
                });
                return Some(Input::Applied { error });
            }
            Effect::ForceDown { ids, reason } => {
                let changed = self.health.force_down(&ids, &reason);
                tracing::warn!(%reason, backends = ?changed, "backends of the failed master taken out at once");
            }
            Effect::PushTracks => self.sync_tracking().await,
            Effect::SyncBgp => self.sync_bgp(),
            Effect::SyncView => self.sync_view(),
            Effect::AckOwnership => {
                if let Some(done) = self.pending_ack.take() {
                    let _ = done.send(());
                }
            }
            Effect::WatchOwnership { name, .. } => {
                tracing::error!(instance = %name, "an instance's watcher outside its start");
            }
            Effect::StartGather => self.start_gather(),
            Effect::CheckTasks => {
                self.check_vrrp_tasks();
                if let Some(g) = &self.guardian {
                    g.check();
                }
            }
            Effect::InstallConfig | Effect::RestoreConfig => self.swap_staged(),
            Effect::SetStaticVips => {
                // Beside the owner: the answer comes back as a message, within the deadline.
                let want = crate::static_vip::static_vips(&self.cfg);
                let answer = self
                    .netexec
                    .ask(netexec::Request::StaticVips { want, fresh: false });
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let error = match answer.await {
                        Ok(r) => r.err(),
                        Err(_) => Some("the netlink executor stopped".into()),
                    };
                    let _ = tx.send(Msg::StaticVipsSet { error });
                });
            }
            Effect::ReconcileVrrp => {
                let r = self.reconcile_staged().await;
                return Some(Input::VrrpReconciled {
                    error: r.err().map(|e| format!("{e:#}")),
                });
            }
            Effect::CommitReload => self.commit_reload().await,
            Effect::ReloadDone(r) => {
                match &r {
                    Ok(()) => {
                        tracing::info!(path = %self.config_path.display(), "config reloaded")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "config refused; the running config stays")
                    }
                }
                self.staged = None;
                let answer = |_: ()| match &r {
                    Ok(()) => crate::api::Response::json(&serde_json::json!({"reloaded": true})),
                    Err(e) => crate::api::Response::error(422, e.clone()),
                };
                for w in std::mem::take(&mut self.reload_waiters) {
                    let _ = w.send(answer(()));
                }
                // The next one asked for meanwhile reads the file now: each request is a
                // reload of its own, counted and answered by its own outcome.
                if let Some(waiter) = self.next_reload.pop_front() {
                    self.reload_waiters.extend(waiter);
                    let _ = self.tx.send(Msg::Reload);
                }
            }
        }
        None
    }

    /// An apply the shell does itself (inside a step such as a VRRP reconcile, or following
    /// the interface): the controller learns whether the maps are in sync.
    pub(super) fn apply(&mut self) -> Result<()> {
        let r = self.write_plan();
        let error = r.as_ref().err().map(|e| format!("{e:#}"));
        let effects = self.ctl.handle(Instant::now(), Input::Applied { error });
        debug_assert!(effects.is_empty(), "{effects:?}");
        r
    }

    /// The facts the plan reads: the kernel's (`self.facts`) with the controller's (health,
    /// drains, VRRP ownership), which `self.facts` does not hold. Every reader of the plan's
    /// view (the maps, the status rows, the metrics) takes them from here.
    pub(super) fn plan_facts(&self) -> Facts {
        Facts {
            now: Some(Instant::now()),
            health: self.ctl.health().clone(),
            drained: self.ctl.drained().clone(),
            vrrp_master: self.ctl.vrrp_master().clone(),
            ..self.facts.clone()
        }
    }

    /// Rebuild the plan from the config, the kernel's facts and the controller's, and write it
    /// to the data plane.
    fn write_plan(&mut self) -> Result<()> {
        let facts = self.plan_facts();
        let (desired, rows) = plan::plan(&self.cfg, &facts);
        self.dp.apply(&desired).context("apply to the data plane")?;
        log_fail_open(&self.rows, &rows);
        self.rows = rows;
        Ok(())
    }

    /// The connection sync learns the services as applied (it scans after a change).
    pub(super) fn sync_view(&self) {
        if let Some(s) = &self.sync {
            s.view(self.dp.sync_view());
        }
    }

    /// A backend's health changed: rebuild that VIP's table (the plan does the rest).
    async fn health_event(&mut self, e: HealthEvent) {
        if let Some(track) = e.id.strip_prefix(super::TRACK_PREFIX) {
            tracing::info!(track, passing = e.healthy, reason = %e.reason, "tracked check changed");
            let (name, passing) = (track.to_string(), e.healthy);
            return self.feed(Input::Track { name, passing }).await;
        }
        let Some((vip, addr)) = e.id.rsplit_once('/') else {
            return;
        };
        let Ok(addr) = addr.parse::<IpAddr>() else {
            return;
        };
        tracing::info!(vip, backend = %addr, healthy = e.healthy, reason = %e.reason, "backend health changed");
        let check = lb_core::backends::Check {
            pair: (vip.to_string(), addr),
            healthy: e.healthy,
            reason: e.reason.clone(),
            previous: match e.previous {
                Health::Up => Some(true),
                Health::Down => Some(false),
                Health::Unknown => None,
            },
            hard: e.failure.is_hard(),
            refused: e.failure == FailureClass::Refused,
        };
        self.feed(Input::Health(check)).await;
    }

    async fn set_drained(&mut self, vip: &str, backend: IpAddr, drained: bool) -> Result<()> {
        let Some(v) = self
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
        self.feed(Input::Drain { pair, drained }).await;
        // The operator hears whether the data plane took it.
        match self.ctl.in_sync() {
            true => Ok(()),
            false => bail!("the data plane refused the change (see lbd's log)"),
        }
    }
}

/// Say when a VIP starts or stops serving by fail-open (see `plan::fail_open`).
fn log_fail_open(before: &[BackendPlan], after: &[BackendPlan]) {
    let (was, is) = (plan::failing_open(before), plan::failing_open(after));
    for vip in is.iter().filter(|v| !was.contains(v)) {
        tracing::warn!(
            vip,
            "fail-open: every backend fails its checks by being slow or answering wrong; new flows still go to them until one passes"
        );
    }
    for vip in was.iter().filter(|v| !is.contains(v)) {
        tracing::info!(vip, "fail-open over");
    }
}
