//! The BGP worker: a task beside the owner that holds the [`crate::bgp::Announcer`] and does
//! its slow work (vtysh to FRR, up to 10 s a call) so the owner never waits on FRR. The owner
//! holds a [`BgpHandle`]: it sends the config and the plan's rows whenever they change, reads
//! the last status without waiting, and at the stop withdraws every prefix within a deadline
//! (a vtysh call in progress is abandoned; if the worker still does not answer, the routes are
//! removed directly).
//!
//! Inside the worker, FRR's configuration and the kernel routes are two lanes: one vtysh job
//! (configure, or check that FRR still has lbd's configuration) runs at a time, and route
//! syncs (a drain, a withdrawal because the backends failed) are done while it runs, never
//! after it.

use std::{future::Future, pin::Pin, time::Duration};

use anyhow::Result;
use tokio::sync::{mpsc, oneshot, watch};

use super::owner::Owner;
use crate::{
    bgp::{self, Announcer, Status},
    config::Config,
    plan::BackendPlan,
};

enum Cmd {
    /// Bring FRR to the config's `[[bgp]]` section (start, reload; queued on the FRR lane).
    Configure(Box<Config>),
    /// Re-decide the announcements from the current plan and converge the kernel routes.
    Sync {
        cfg: Box<Config>,
        rows: Vec<BackendPlan>,
        attached: bool,
    },
    /// Periodic: converge the kernel routes, and configure FRR again if it lost lbd's
    /// configuration (the check is queued on the FRR lane).
    Check,
    /// `lbctl bgp drain` / `undrain`.
    Drain(bool),
    /// lbd stops: withdraw every prefix, then answer.
    Stop(oneshot::Sender<()>),
}

impl Cmd {
    /// Commands of which only the newest queued one needs running.
    fn coalesced_kind(&self) -> Option<u8> {
        match self {
            Cmd::Configure(_) => Some(0),
            Cmd::Sync { .. } => Some(1),
            Cmd::Check => Some(2),
            Cmd::Drain(_) | Cmd::Stop(_) => None,
        }
    }
}

pub struct BgpHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    status: watch::Receiver<Status>,
    task: tokio::task::JoinHandle<()>,
    handle: rtnetlink::Handle,
    /// A `[[bgp]]` section was in effect when last synced: routes may need withdrawing after
    /// a reload drops it.
    active: bool,
}

fn empty_status() -> Status {
    Status {
        enabled: false,
        asn: None,
        node_drained: false,
        sessions: Vec::new(),
        sessions_error: None,
        prefixes: Vec::new(),
        bfd_detect_ms: None,
        last_error: None,
    }
}

impl BgpHandle {
    pub fn spawn(handle: rtnetlink::Handle, drained: bool) -> BgpHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(empty_status());
        let worker = Worker {
            a: Announcer::new(handle.clone()).with_drained(drained),
            cfg: None,
            rows: Vec::new(),
            active: false,
            status: status_tx,
            frr: None,
            frr_next: None,
        };
        BgpHandle {
            tx,
            status,
            task: tokio::spawn(worker.run(rx)),
            handle,
            active: false,
        }
    }

    /// The worker's last status (without the sessions, which come from vtysh).
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Withdraw every prefix within `deadline` (see the module doc).
    pub async fn stop(&mut self, deadline: Duration) {
        let (reply, done) = oneshot::channel();
        let answered = self.tx.send(Cmd::Stop(reply)).is_ok()
            && matches!(tokio::time::timeout(deadline, done).await, Ok(Ok(())));
        if answered {
            return;
        }
        self.task.abort();
        tracing::warn!("BGP: the worker did not withdraw in time; removing the routes directly");
        let direct = async {
            for a in bgp::routes::installed(&self.handle).await? {
                bgp::routes::remove(&self.handle, a).await?;
                tracing::info!(prefix = %a, "BGP: withdrawing (lbd is stopping)");
            }
            anyhow::Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(1), direct).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "BGP: withdrawing at stop"),
            Err(_) => tracing::error!("BGP: netlink did not answer; routes may be left"),
        }
    }
}

impl Owner {
    /// Configure FRR for the `[[bgp]]` section and announce what is ready (in the worker; a
    /// failure, e.g. FRR not running yet, is logged there and retried on the next sync).
    pub fn start_bgp(&mut self) {
        if self.cfg.bgp.is_empty() {
            return;
        }
        self.configure_bgp();
    }

    /// Start and reload: bring FRR to the section, then re-decide.
    pub(super) fn configure_bgp(&mut self) {
        if self.cfg.bgp.is_empty() && !self.bgp.active {
            return;
        }
        self.bgp.active = !self.cfg.bgp.is_empty();
        let _ = self.bgp.tx.send(Cmd::Configure(Box::new(self.cfg.clone())));
        self.sync_bgp();
    }

    /// Re-decide the announcements from the current plan (in the worker).
    pub(super) fn sync_bgp(&mut self) {
        if self.cfg.bgp.is_empty() && !self.bgp.active {
            return;
        }
        self.bgp.active = !self.cfg.bgp.is_empty();
        let _ = self.bgp.tx.send(Cmd::Sync {
            cfg: Box::new(self.cfg.clone()),
            rows: self.rows.clone(),
            attached: self.ctl.attached(),
        });
    }

    /// `lbctl bgp drain` / `undrain`: take this node out of (or back into) every ECMP group.
    pub(super) fn set_node_drained(&mut self, drained: bool) -> Result<serde_json::Value> {
        if self.cfg.bgp.is_empty() {
            anyhow::bail!("no [[bgp]] section: this node announces nothing over BGP");
        }
        let marker = bgp::drain_marker(&self.cfg.api_socket);
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
        let _ = self.bgp.tx.send(Cmd::Drain(drained));
        self.sync_bgp();
        Ok(serde_json::json!({ "node_drained": drained }))
    }
}

impl BgpHandle {
    /// Periodic FRR check (in the worker).
    pub fn check(&self) {
        if self.active {
            let _ = self.tx.send(Cmd::Check);
        }
    }
}

/// A vtysh job of the worker, and what it tells when it ends.
type FrrJob = Pin<Box<dyn Future<Output = FrrOutcome> + Send>>;

enum FrrOutcome {
    /// [`Announcer::configure_job`]'s result.
    Configured(Result<Option<crate::bgp::BgpConfig>>),
    /// Whether FRR still holds lbd's configuration.
    Checked(Result<bool>),
}

/// What the FRR lane does next (a configure makes a check needless).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FrrWant {
    Check,
    Configure,
}

struct Worker {
    a: Announcer,
    /// The last config and rows the owner sent.
    cfg: Option<Config>,
    rows: Vec<BackendPlan>,
    active: bool,
    status: watch::Sender<Status>,
    /// The vtysh job in progress.
    frr: Option<FrrJob>,
    /// What to run on FRR when it ends.
    frr_next: Option<FrrWant>,
}

/// The end of the job in progress; never, without one.
async fn frr_end(job: &mut Option<FrrJob>) -> FrrOutcome {
    match job {
        Some(j) => j.await,
        None => std::future::pending().await,
    }
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        loop {
            tokio::select! {
                first = rx.recv() => {
                    let Some(first) = first else { return };
                    // Everything queued meanwhile: only the newest configure, sync and check
                    // matter, so the queue never grows.
                    let mut batch = vec![first];
                    while let Ok(c) = rx.try_recv() {
                        batch.push(c);
                    }
                    let kinds: Vec<Option<u8>> = batch.iter().map(Cmd::coalesced_kind).collect();
                    for (i, cmd) in batch.into_iter().enumerate() {
                        let superseded = kinds[i].is_some() && kinds[i + 1..].contains(&kinds[i]);
                        match cmd {
                            _ if superseded => {}
                            Cmd::Stop(reply) => {
                                self.stop_now().await;
                                let _ = reply.send(());
                                return;
                            }
                            cmd => self.handle(cmd).await,
                        }
                    }
                }
                out = frr_end(&mut self.frr) => {
                    self.frr = None;
                    self.frr_done(out);
                }
            }
            self.start_frr();
            self.publish();
        }
    }

    fn publish(&self) {
        if let Some(cfg) = &self.cfg {
            let _ = self.status.send(self.a.status(cfg.bgp.first()));
        }
    }

    /// Queue work for the FRR lane (started when the job in progress ends).
    fn want(&mut self, w: FrrWant) {
        self.frr_next = self.frr_next.max(Some(w));
    }

    /// Start the queued FRR work unless a job runs.
    fn start_frr(&mut self) {
        if self.frr.is_some() {
            return;
        }
        let Some(want) = self.frr_next.take() else {
            return;
        };
        let Some(cfg) = &self.cfg else { return };
        self.frr = match want {
            FrrWant::Configure => self
                .a
                .configure_job(cfg.bgp.first(), &cfg.bgp_vips())
                .map(|j| -> FrrJob { Box::pin(async move { FrrOutcome::Configured(j.await) }) }),
            FrrWant::Check => self.a.applied().map(|applied| -> FrrJob {
                Box::pin(async move { FrrOutcome::Checked(bgp::frr_has_instance(applied).await) })
            }),
        };
    }

    fn frr_done(&mut self, out: FrrOutcome) {
        match out {
            FrrOutcome::Configured(r) => {
                self.a.configured(&r);
                match (&r, self.cfg.as_ref().and_then(|c| c.bgp.first())) {
                    (Ok(Some(_)), Some(b)) => {
                        tracing::info!(asn = b.asn, peers = b.peers.len(), "BGP: FRR configured")
                    }
                    (Ok(_), _) => {}
                    (Err(e), _) => {
                        tracing::error!(error = %format!("{e:#}"), "BGP: configuring FRR failed; will retry")
                    }
                }
            }
            FrrOutcome::Checked(Ok(true)) => {}
            FrrOutcome::Checked(Ok(false)) => {
                tracing::warn!(
                    "BGP: FRR lost lbd's configuration (restarted?); configuring it again"
                );
                self.a.mark_unconfigured();
                self.want(FrrWant::Configure);
            }
            FrrOutcome::Checked(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "BGP: checking FRR")
            }
        }
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Configure(cfg) => {
                if !cfg.bgp.is_empty() || self.a.is_configured() {
                    self.want(FrrWant::Configure);
                }
                self.cfg = Some(*cfg);
            }
            Cmd::Sync {
                cfg,
                rows,
                attached,
            } => {
                self.a.set_detached(!attached);
                self.rows = rows;
                self.cfg = Some(*cfg);
                self.sync().await;
            }
            Cmd::Check => {
                // Converge against the kernel's routes at every check: a flush is repaired.
                self.sync().await;
                if self.a.is_configured() {
                    self.want(FrrWant::Check);
                }
            }
            Cmd::Drain(drained) => {
                self.a.set_drained(drained);
            }
            Cmd::Stop(_) => unreachable!("handled by run"),
        }
    }

    /// Converge the kernel routes now, then have FRR configured if it is not (FRR started
    /// late, or lost its configuration; the FRR lane does that).
    async fn sync(&mut self) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        if cfg.bgp.is_empty() && !self.active {
            return;
        }
        self.active = !cfg.bgp.is_empty();
        if let Err(e) = self.a.sync(&cfg.bgp_vips(), &self.rows).await {
            tracing::error!(error = %format!("{e:#}"), "BGP: converging announcements");
        }
        if !cfg.bgp.is_empty() && !self.a.is_configured() {
            self.want(FrrWant::Configure);
        }
    }

    /// lbd is stopping: abandon the vtysh job (its vtysh is killed) and withdraw every prefix
    /// (the XDP program keeps forwarding what is still in flight towards this node while the
    /// routers converge).
    async fn stop_now(&mut self) {
        self.frr = None;
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        self.a.set_stopping();
        if let Err(e) = self.a.sync(&cfg.bgp_vips(), &self.rows).await {
            tracing::error!(error = %format!("{e:#}"), "BGP: withdrawing at stop");
        }
    }
}
