//! `lbd`'s core: one task, the owner ([`owner::Owner`]), holds the configuration, the kernel's
//! facts, the data plane, the VRRP instances, the BGP worker's handle and what the status rows
//! are made of. Everything else reaches it as a message (see [`owner::Msg`]) or a stream it
//! selects on: health events, VRRP ownership changes and dead peers, netlink notifications,
//! signals, API requests and timers. Slow work (netlink dumps, vtysh, the connection-table
//! count) runs in tasks beside it that report back with a deadline. No policy lives here: the
//! decisions are [`lb_core::controller`]'s (the owner turns events into its inputs and carries
//! out its effects), [`crate::plan`] makes the desired state, [`crate::dataplane`] writes the
//! maps.
//!
//! - [`owner`]: the owner, its messages, its loop and the controller's shell (`feed`).
//! - [`front`]: the API's side: requests become messages; `/healthz` from the loop's tick.
//! - `refresh`: kernel facts gathered beside the owner; `churn`: the interface recreated.
//! - `vrrp`: the VRRP instances' handles; `bgp`: the BGP worker.
//! - `reload`: reading and checking a new config, the steps the controller runs; `stop`: the
//!   stop order; `lock`: one lbd per config.
//! - `query`: status rows and metrics; `adopt`: state a previous lbd left; `conntrack`,
//!   `supervise`, `rollback` (`lbd teardown`).

use std::{collections::HashSet, net::IpAddr, path::PathBuf};

use anyhow::{Context, Result};

mod adopt;
mod bgp;
mod churn;
mod conntrack;
mod explain;
mod flows;
pub mod front;
mod lock;
pub mod members;
mod netexec;
pub mod owner;
mod query;
mod refresh;
mod reload;
mod rollback;
mod stop;
mod supervise;
pub mod sync;
mod trace;
mod vrrp;

pub use rollback::teardown;

use crate::{
    config::{Config, ConfigFile},
    dataplane::LoadOptions,
    health::{CheckKind, Health, Target},
    plan::HealthFact,
};

/// Health-check id prefix of tracked local checks (VRRP priority), next to `<vip>/<backend>`.
const TRACK_PREFIX: &str = "track/";

/// Health-check targets for every checked backend. Ids are `<vip name>/<backend address>`.
/// `up` lists pairs known good (adopted from a previous lbd): they start up, so a restart changes
/// no table until a check says otherwise. Others start unknown and get no flows until they pass.
pub fn health_targets(cfg: &Config, up: &HashSet<(String, IpAddr)>) -> Vec<Target> {
    let mut out: Vec<Target> = cfg
        .track
        .iter()
        .filter_map(|t| {
            let addr = t.address?;
            Some(Target::new(
                format!("{TRACK_PREFIX}{}", t.name),
                addr,
                t.health.clone(),
            ))
        })
        .collect();
    for v in &cfg.vips {
        if v.health.kind == CheckKind::None {
            continue;
        }
        let Some(port) = v.health.port.or(v.ports.first().copied()) else {
            continue;
        };
        for b in &v.backends {
            let mut t = Target::new(
                format!("{}/{}", v.name, b.address),
                std::net::SocketAddr::new(b.address, port),
                v.health.clone(),
            );
            if up.contains(&(v.name.clone(), b.address)) {
                t = t.starting(Health::Up);
            }
            if b.encap == crate::config::EncapMode::Ipip && b.decap_health_port != 0 {
                t = t.gated(std::net::SocketAddr::new(b.address, b.decap_health_port));
            }
            out.push(t);
        }
    }
    out
}

/// Facts for checked backends before any result: pairs known good are up, the rest wait.
pub(crate) fn initial_health(
    cfg: &Config,
    up: &HashSet<(String, IpAddr)>,
) -> std::collections::HashMap<(String, IpAddr), HealthFact> {
    let mut m = std::collections::HashMap::new();
    for v in &cfg.vips {
        if v.health.kind == CheckKind::None {
            continue;
        }
        for b in &v.backends {
            let pair = (v.name.clone(), b.address);
            let healthy = up.contains(&pair);
            let reason = if healthy {
                "adopted as up; rechecking"
            } else {
                "not checked yet"
            };
            m.insert(
                pair,
                HealthFact {
                    healthy,
                    reason: reason.into(),
                    ..Default::default()
                },
            );
        }
    }
    m
}

/// Where pins live unless LB_BPFFS overrides it (tests and labs use their own directory).
pub fn bpffs_root() -> PathBuf {
    std::env::var_os("LB_BPFFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/sys/fs/bpf".into())
}

pub fn load_options(cfg: &Config) -> LoadOptions {
    LoadOptions {
        name: cfg.name.clone(),
        bpffs_root: bpffs_root(),
        table_size: cfg.table_size,
        conntrack_size: cfg.conntrack_size,
        hash_seed: cfg.hash_seed,
        syn_flood_rate: cfg.syn_flood_rate,
    }
}

pub use crate::status::{BackendRow, CheckRow, VipRow};

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The signals lbd acts on, registered once at its start: from then on a SIGTERM, SIGINT or
/// SIGHUP is held for the loop instead of killing the process with the default action. A
/// kubelet may stop a pod while it is still starting; lbd then finishes the start and stops
/// the way it always does (VIPs given back, the guardian told goodbye), not as a crash.
pub struct Signals {
    pub term: tokio::signal::unix::Signal,
    pub int: tokio::signal::unix::Signal,
    pub hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Register the handlers (inside a tokio runtime).
    pub fn register() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    /// The next stop signal (SIGTERM or SIGINT).
    pub async fn stop(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Run until SIGTERM/SIGINT or a task failure: start the owner, serve the API, loop, stop.
/// `signals` were registered before anything else ran (see [`Signals`]).
pub async fn run(config_path: PathBuf, mut signals: Signals) -> Result<()> {
    let cfg =
        Config::load(&config_path).with_context(|| format!("config {}", config_path.display()))?;
    // Before anything touches the interface, the pins or the socket: one lbd per config.
    let lock = lock::InstanceLock::acquire(&cfg, &load_options(&cfg))?;
    let (mut owner, front) = owner::Owner::start(config_path.clone(), cfg.clone(), lock).await?;
    // A change of the file reloads it (the MCO writes rendered configs; no `lbctl reload`).
    let tx = owner.tx.clone();
    let watcher = tokio::spawn(crate::config_watch::watch_file(
        config_path.clone(),
        move || tx.send(owner::Msg::ConfigChanged).is_ok(),
    ));
    owner.start_guardian();
    // A joining node elects only once its peers know it (see `members`). That wait (up to
    // `join_wait_ms`, 60 s at most) gives way to a stop: a kubelet's grace period may be
    // shorter, and a node that is stopping has nothing to join.
    let stopped = tokio::select! {
        _ = owner.join_members() => false,
        _ = signals.stop() => true,
    };
    let mut tasks = Vec::new();
    let failure = if stopped {
        tracing::info!("stop signal while joining the members: stopping before VRRP starts");
        None
    } else {
        owner.start_vrrp().await?;
        owner.start_bgp();
        tracing::info!(interface = %cfg.interface, vips = cfg.vips.len(), "lbd running");
        tasks.push(front.supervise(
            "API listener",
            crate::api::serve_unix(cfg.api_socket.clone(), front.clone()),
        ));
        if let Some(addr) = cfg.metrics_listen {
            tasks.push(front.supervise(
                "metrics listener",
                crate::api::serve_tcp(addr, front.clone()),
            ));
        }
        if let Some(tls) = cfg.metrics_tls.clone() {
            tasks.push(front.supervise(
                "metrics TLS listener",
                crate::metrics_tls::serve(tls, front.clone()),
            ));
        }
        // Whatever ends the loop, the stop runs: VIPs and routes are given back first.
        match owner.run(signals).await {
            Ok(f) => f,
            Err(e) => Some(format!("{e:#}")),
        }
    };
    owner.stop().await;
    watcher.abort();
    for t in tasks {
        t.abort();
    }
    // lb removed from this node: its config file is gone at a stop that no failure caused
    // (the MachineConfig was deleted, or the node left the description). Under a node
    // disruption policy that skips the reboot nothing else would clear what lbd added, so the
    // stop tears it down (the next lbd, if any, starts afresh).
    let removed = failure.is_none() && !config_path.exists();
    drop(owner);
    if removed {
        tracing::info!(path = %config_path.display(), "config removed: tearing down what lbd added");
        if let Err(e) = rollback::teardown(&cfg).await {
            tracing::error!(error = %format!("{e:#}"), "teardown after the config's removal");
        }
        return Ok(());
    }
    let _ = std::fs::remove_file(&cfg.api_socket);
    tracing::info!("lbd stopping; the XDP program and pinned maps stay for the next lbd");
    match failure {
        // Non-zero, so kubelet (or systemd) restarts us.
        Some(f) => Err(anyhow::anyhow!("stopped after a failure: {f}")),
        None => Ok(()),
    }
}
