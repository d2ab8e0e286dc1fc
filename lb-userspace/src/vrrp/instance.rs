//! One VRRP instance as a tokio task: owns its socket and timer, feeds packets, timer expiries,
//! link changes and priority updates to the pure [`Machine`], and carries out its actions
//! (adverts, VIPs, announcements). Ownership changes go to the daemon through a
//! `watch::Receiver<bool>`; the daemon flips the data plane's owned flag.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::announce::{self, Announcer};
use super::codec::{self, Advert, Auth, DecodeError, Expect, Version};
use super::collision::{self, Collisions};
use super::io::{Incoming, VrrpSocket, interface_info};
use super::state::{self, Action, Event, Machine, Params, State};

/// Announcements right after becoming master, and their spacing: several, because a single
/// frame can be lost and switches may still be learning.
pub const GARP_BURST: u32 = 5;
pub const GARP_SPACING: Duration = Duration::from_millis(100);
/// How often link state is polled (a link going down means fault).
const LINK_POLL: Duration = Duration::from_millis(250);

fn default_version() -> u8 {
    3
}
fn default_priority() -> u8 {
    100
}
fn default_true() -> bool {
    true
}
fn default_garp_refresh() -> u64 {
    60
}

/// One `[[vrrp]]` entry of the daemon config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    pub name: String,
    /// Defaults to the daemon's interface.
    #[serde(default)]
    pub interface: Option<String>,
    pub vrid: u8,
    /// 2 or 3.
    #[serde(default = "default_version")]
    pub version: u8,
    /// 1..=255; 255 means this node owns the addresses.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// Default: 100 ms for v3, 1000 ms for v2 (v2 needs whole seconds).
    #[serde(default)]
    pub advert_interval_ms: Option<u32>,
    /// VRRPv2 simple-text password, at most 8 bytes.
    #[serde(default)]
    pub auth_pass: Option<String>,
    #[serde(default = "default_true")]
    pub preempt: bool,
    #[serde(default)]
    pub preempt_delay_ms: u64,
    /// Empty: multicast.
    #[serde(default)]
    pub unicast_peers: Vec<IpAddr>,
    /// Source address of adverts; default: the interface's first address (IPv6: link-local).
    #[serde(default)]
    pub unicast_src: Option<IpAddr>,
    pub vips: Vec<IpAddr>,
    /// Re-announce the VIPs this often while master; 0 disables the refresh.
    #[serde(default = "default_garp_refresh")]
    pub garp_refresh_s: u64,
}

/// A config error naming the field (e.g. `vrrp[0].auth_pass`) and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl InstanceConfig {
    /// Validate as the `index`-th entry of the `vrrp` list.
    pub fn validate_at(&self, index: usize) -> Result<(), ConfigError> {
        self.validate().map_err(|e| ConfigError {
            field: format!("vrrp[{index}].{}", e.field),
            reason: e.reason,
        })
    }

    /// Validate; the error's field is relative to this entry (see [`Self::validate_at`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field: &str, reason: String| {
            Err(ConfigError {
                field: field.to_string(),
                reason,
            })
        };
        if self.name.is_empty() {
            return err("name", "must not be empty".into());
        }
        if let Some(i) = &self.interface
            && (i.is_empty() || i.len() >= libc::IFNAMSIZ)
        {
            return err("interface", format!("{i:?} is not a valid interface name"));
        }
        if self.vrid == 0 {
            return err("vrid", "must be 1..=255".into());
        }
        let version = match self.version {
            2 => Version::V2,
            3 => Version::V3,
            v => return err("version", format!("{v} is not 2 or 3")),
        };
        if self.priority == 0 {
            return err(
                "priority",
                "must be 1..=255 (0 is reserved for resigning)".into(),
            );
        }
        let ms = self.interval_ms();
        match version {
            Version::V2 if !ms.is_multiple_of(1000) || !(1000..=255_000).contains(&ms) => {
                return err(
                    "advert_interval_ms",
                    format!("{ms}: VRRPv2 needs whole seconds, 1000..=255000"),
                );
            }
            Version::V3 if !ms.is_multiple_of(10) || !(10..=40_950).contains(&ms) => {
                return err(
                    "advert_interval_ms",
                    format!("{ms}: VRRPv3 needs centiseconds, 10..=40950 in steps of 10"),
                );
            }
            _ => {}
        }
        if let Some(pass) = &self.auth_pass {
            if version == Version::V3 {
                return err("auth_pass", "VRRPv3 has no authentication".into());
            }
            if pass.is_empty() {
                return err(
                    "auth_pass",
                    "must not be empty (omit it for no authentication)".into(),
                );
            }
            if pass.len() > 8 {
                return err("auth_pass", "longer than 8 bytes".into());
            }
        }
        let Some(first) = self.vips.first() else {
            return err("vips", "at least one VIP is needed".into());
        };
        let v6 = first.is_ipv6();
        for (i, vip) in self.vips.iter().enumerate() {
            if vip.is_ipv6() != v6 {
                return err(
                    &format!("vips[{i}]"),
                    format!("{vip}: all VIPs must be one address family"),
                );
            }
            if vip.is_unspecified() || vip.is_multicast() || vip.is_loopback() {
                return err(&format!("vips[{i}]"), format!("{vip} cannot be a VIP"));
            }
            if self.vips[..i].contains(vip) {
                return err(&format!("vips[{i}]"), format!("{vip} is listed twice"));
            }
        }
        if version == Version::V2 && v6 {
            return err(
                "version",
                "VRRPv2 is IPv4 only; use version 3 for IPv6 VIPs".into(),
            );
        }
        for (i, peer) in self.unicast_peers.iter().enumerate() {
            if peer.is_ipv6() != v6 {
                return err(
                    &format!("unicast_peers[{i}]"),
                    format!("{peer}: not the VIPs' address family"),
                );
            }
        }
        if let Some(src) = self.unicast_src
            && src.is_ipv6() != v6
        {
            return err(
                "unicast_src",
                format!("{src}: not the VIPs' address family"),
            );
        }
        if self.preempt_delay_ms > 3_600_000 {
            return err("preempt_delay_ms", "more than an hour".into());
        }
        Ok(())
    }

    pub fn interval_ms(&self) -> u32 {
        self.advert_interval_ms
            .unwrap_or(if self.version == 2 { 1000 } else { 100 })
    }

    fn codec_version(&self) -> Version {
        if self.version == 2 {
            Version::V2
        } else {
            Version::V3
        }
    }

    fn auth(&self) -> Auth {
        match &self.auth_pass {
            Some(p) if self.version == 2 => Auth::simple(p),
            _ => Auth::None,
        }
    }
}

/// The last state change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TransitionRecord {
    pub at_unix_ms: u64,
    pub from: State,
    pub to: State,
    pub reason: String,
}

/// The last split-brain event (another master seen while we were master).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitBrainRecord {
    pub at_unix_ms: u64,
    pub peer: IpAddr,
    pub peer_priority: u8,
    pub stepped_down: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub adverts_sent: u64,
    pub adverts_received: u64,
    pub send_errors: u64,
    /// Dropped packets per [`DecodeError::reason`].
    pub drops: BTreeMap<&'static str, u64>,
    pub split_brain: u64,
    pub transitions: u64,
    pub became_master: u64,
    pub announcements: u64,
    pub vip_errors: u64,
}

/// `lbctl vrrp status` for one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceStatus {
    pub name: String,
    pub interface: String,
    pub vrid: u8,
    pub version: u8,
    pub state: State,
    pub base_priority: u8,
    pub effective_priority: u8,
    /// Our advert source address (the election tie-breaker).
    pub primary_addr: IpAddr,
    pub master: Option<IpAddr>,
    pub advert_interval_ms: u64,
    /// The interval the current master advertises.
    pub master_advert_interval_ms: u64,
    pub vips: Vec<IpAddr>,
    pub unicast_peers: Vec<IpAddr>,
    pub owned: bool,
    pub last_transition: Option<TransitionRecord>,
    pub last_split_brain: Option<SplitBrainRecord>,
    pub counters: Counters,
    pub collisions: Collisions,
}

enum Command {
    TrackWeight(i32),
    Shutdown(oneshot::Sender<()>),
}

/// The daemon's handle on a running instance.
pub struct Instance {
    commands: mpsc::Sender<Command>,
    status: Arc<Mutex<InstanceStatus>>,
    owned: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Instance {
    /// Validate `cfg`, clean up stale VIPs from an earlier run, open the socket and start the
    /// instance task. `default_interface` is used when the config names none; `netlink` is the
    /// daemon's rtnetlink handle (e.g. `Netlink::handle().clone()`).
    pub async fn spawn(
        cfg: InstanceConfig,
        default_interface: &str,
        netlink: rtnetlink::Handle,
    ) -> Result<Instance> {
        cfg.validate()
            .map_err(|e| anyhow!("vrrp instance {:?}: {e}", cfg.name))?;
        let ifname = cfg
            .interface
            .clone()
            .unwrap_or_else(|| default_interface.to_string());
        let v6 = cfg.vips.first().is_some_and(IpAddr::is_ipv6);
        let info = interface_info(&ifname).with_context(|| format!("interface {ifname:?}"))?;
        let src = match cfg.unicast_src {
            Some(s) => s,
            None => info.primary_addr(v6, &cfg.vips).ok_or_else(|| {
                anyhow!(
                    "interface {ifname:?} has no {} address to send adverts from",
                    if v6 { "IPv6 link-local" } else { "IPv4" }
                )
            })?,
        };
        let removed = announce::remove_stale(&netlink, &ifname, &cfg.vips).await?;
        if !removed.is_empty() {
            tracing::info!(instance = %cfg.name, ?removed, "removed stale VIPs left by an earlier run");
        }
        let socket = VrrpSocket::open(&ifname, src, cfg.unicast_peers.is_empty())
            .with_context(|| format!("open VRRP socket on {ifname}"))?;
        let announcer = match Announcer::new(&ifname) {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(instance = %cfg.name, error = %e, "no GARP/NA announcements on {ifname}");
                None
            }
        };
        let machine = Machine::new(Params {
            base_priority: cfg.priority,
            advert_interval: Duration::from_millis(u64::from(cfg.interval_ms())),
            preempt: cfg.preempt,
            preempt_delay: Duration::from_millis(cfg.preempt_delay_ms),
            primary_addr: src,
        });
        let status = Arc::new(Mutex::new(InstanceStatus {
            name: cfg.name.clone(),
            interface: ifname.clone(),
            vrid: cfg.vrid,
            version: cfg.version,
            state: State::Initialize,
            base_priority: cfg.priority,
            effective_priority: cfg.priority,
            primary_addr: src,
            master: None,
            advert_interval_ms: u64::from(cfg.interval_ms()),
            master_advert_interval_ms: u64::from(cfg.interval_ms()),
            vips: cfg.vips.clone(),
            unicast_peers: cfg.unicast_peers.clone(),
            owned: false,
            last_transition: None,
            last_split_brain: None,
            counters: Counters {
                drops: DecodeError::ALL.iter().map(|e| (e.reason(), 0)).collect(),
                ..Counters::default()
            },
            collisions: Collisions::default(),
        }));
        let (commands, rx) = mpsc::channel(16);
        let (owned_tx, owned) = watch::channel(false);
        let runner = Runner {
            expect: Expect {
                version: cfg.codec_version(),
                vrid: cfg.vrid,
                interval_cs: (cfg.interval_ms() / 10) as u16,
                auth: cfg.auth(),
            },
            cfg,
            ifname,
            link_up: info.up,
            socket,
            announcer,
            netlink,
            machine,
            epoch: Instant::now(),
            timer: None,
            garp_left: 0,
            next_garp: None,
            status: status.clone(),
            owned: owned_tx,
        };
        let task = tokio::spawn(runner.run(rx));
        Ok(Instance {
            commands,
            status,
            owned,
            task,
        })
    }

    /// A snapshot for `lbctl vrrp status` and metrics.
    pub fn status(&self) -> InstanceStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Ownership of the VIPs: `true` while master. The daemon watches this to flip the data
    /// plane's owned flag.
    pub fn ownership(&self) -> watch::Receiver<bool> {
        self.owned.clone()
    }

    /// Set the sum of tracked weights (e.g. +20 for a ready local haproxy-equivalent); the
    /// effective priority becomes base + weights, clamped to 1..=254 (255 stays 255).
    pub async fn set_track_weight(&self, weight: i32) {
        let _ = self.commands.send(Command::TrackWeight(weight)).await;
    }

    /// Graceful stop: a master sends a priority-0 advert (a backup takes over after its skew
    /// only) and removes its VIPs. Returns when done.
    pub async fn shutdown(self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let _ = self.task.await;
    }
}

struct Runner {
    cfg: InstanceConfig,
    ifname: String,
    expect: Expect,
    link_up: bool,
    socket: VrrpSocket,
    announcer: Option<Announcer>,
    netlink: rtnetlink::Handle,
    machine: Machine,
    /// The state machine's time zero.
    epoch: Instant,
    timer: Option<Instant>,
    garp_left: u32,
    next_garp: Option<Instant>,
    status: Arc<Mutex<InstanceStatus>>,
    owned: watch::Sender<bool>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sleep until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Runner {
    fn now(&self) -> state::Time {
        Instant::now().saturating_duration_since(self.epoch)
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        if !self.link_up {
            self.step(Event::InterfaceDown).await;
        }
        self.step(Event::Startup).await;
        let mut link_poll = tokio::time::interval(LINK_POLL);
        link_poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = sleep_until(self.timer) => {
                    self.step(Event::TimerFired).await;
                }
                () = sleep_until(self.next_garp) => self.announce_tick(),
                r = self.socket.recv() => match r {
                    Ok(incoming) => self.on_packet(incoming).await,
                    Err(e) => {
                        tracing::warn!(instance = %self.cfg.name, error = %e, "VRRP receive failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = link_poll.tick() => self.poll_link().await,
                cmd = commands.recv() => match cmd {
                    Some(Command::TrackWeight(w)) => {
                        let p = state::effective_priority(self.cfg.priority, w);
                        self.step(Event::PriorityChanged(p)).await;
                    }
                    Some(Command::Shutdown(done)) => {
                        self.step(Event::Shutdown).await;
                        let _ = done.send(());
                        return;
                    }
                    // The handle was dropped without shutdown(): still leave cleanly.
                    None => {
                        self.step(Event::Shutdown).await;
                        return;
                    }
                },
            }
        }
    }

    async fn poll_link(&mut self) {
        let up = interface_info(&self.ifname).is_ok_and(|i| i.up);
        if up != self.link_up {
            self.link_up = up;
            let ev = if up {
                Event::InterfaceUp
            } else {
                Event::InterfaceDown
            };
            self.step(ev).await;
        }
    }

    async fn on_packet(&mut self, incoming: Incoming) {
        let (src, advert) = match incoming {
            Incoming::Advert { src, advert } => (src, advert),
            Incoming::Dropped { reason, src } => {
                tracing::debug!(instance = %self.cfg.name, ?src, reason = reason.reason(), "VRRP packet dropped");
                return self.count_drop(reason);
            }
        };
        if src == self.socket.src() {
            return;
        }
        let differs = collision::compare(&advert, &self.cfg.vips, &self.expect.auth);
        match codec::check(&advert, &self.expect) {
            Ok(()) => {}
            Err(reason) => {
                if reason == DecodeError::WrongAuth {
                    self.record_collision(src, &advert, differs);
                }
                return self.count_drop(reason);
            }
        }
        self.record_collision(src, &advert, differs);
        self.with_status(|s| s.counters.adverts_received += 1);
        let ev = Event::AdvertReceived {
            from: src,
            priority: advert.priority,
            interval: Duration::from_millis(u64::from(advert.interval_cs) * 10),
        };
        self.step(ev).await;
    }

    fn record_collision(&mut self, src: IpAddr, advert: &Advert, differs: collision::Mismatch) {
        let name = self.cfg.name.clone();
        let vrid = self.cfg.vrid;
        let new = self.with_status(|s| s.collisions.observe(src, advert, differs, unix_ms()));
        if new {
            tracing::warn!(
                instance = %name,
                vrid,
                peer = %src,
                differs = differs.describe(),
                their_vips = ?advert.addrs,
                "VRID collision: another router uses our VRID with different VIPs or auth"
            );
        }
    }

    fn count_drop(&mut self, reason: DecodeError) {
        self.with_status(|s| *s.counters.drops.entry(reason.reason()).or_insert(0) += 1);
    }

    fn with_status<T>(&self, f: impl FnOnce(&mut InstanceStatus) -> T) -> T {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Feed one event to the machine and carry out its output.
    async fn step(&mut self, event: Event) {
        let out = self.machine.handle(self.now(), event);
        if let Some(t) = out.transition {
            tracing::info!(
                instance = %self.cfg.name,
                vrid = self.cfg.vrid,
                from = t.from.as_str(),
                to = t.to.as_str(),
                reason = t.reason,
                "VRRP state change"
            );
            self.with_status(|s| {
                s.counters.transitions += 1;
                if t.to == State::Master {
                    s.counters.became_master += 1;
                }
                s.last_transition = Some(TransitionRecord {
                    at_unix_ms: unix_ms(),
                    from: t.from,
                    to: t.to,
                    reason: t.reason.to_string(),
                });
            });
        }
        if let Some(sb) = out.split_brain {
            tracing::warn!(
                instance = %self.cfg.name,
                peer = %sb.peer,
                peer_priority = sb.peer_priority,
                stepped_down = sb.stepped_down,
                "two masters seen (split brain)"
            );
            self.with_status(|s| {
                s.counters.split_brain += 1;
                s.last_split_brain = Some(SplitBrainRecord {
                    at_unix_ms: unix_ms(),
                    peer: sb.peer,
                    peer_priority: sb.peer_priority,
                    stepped_down: sb.stepped_down,
                });
            });
            // We stay master, but the other master announced the VIPs too and clients may
            // have taken its MAC: announce ours again (a fresh burst), or they keep sending to
            // a node that no longer forwards until their caches expire.
            if !sb.stepped_down && self.garp_left == 0 {
                self.garp_left = GARP_BURST;
                self.next_garp = Some(Instant::now());
            }
        }
        for action in out.actions {
            match action {
                Action::SendAdvert { priority } => self.send_advert(priority).await,
                Action::TakeOwnership => self.take_ownership().await,
                Action::ReleaseOwnership => self.release_ownership().await,
                Action::SetTimer(at) => self.timer = Some(self.epoch + at),
                Action::CancelTimer => self.timer = None,
            }
        }
        let m = &self.machine;
        let snapshot = (
            m.state(),
            m.effective_priority(),
            m.master_addr(),
            m.master_interval().as_millis() as u64,
        );
        self.with_status(|s| {
            (
                s.state,
                s.effective_priority,
                s.master,
                s.master_advert_interval_ms,
            ) = snapshot;
        });
    }

    async fn send_advert(&mut self, priority: u8) {
        let advert = Advert {
            version: self.expect.version,
            vrid: self.cfg.vrid,
            priority,
            interval_cs: self.expect.interval_cs,
            addrs: self.cfg.vips.clone(),
            auth: self.expect.auth,
        };
        let src = self.socket.src();
        let dsts: Vec<IpAddr> = if self.cfg.unicast_peers.is_empty() {
            vec![if src.is_ipv6() {
                codec::MCAST_V6.into()
            } else {
                codec::MCAST_V4.into()
            }]
        } else {
            self.cfg.unicast_peers.clone()
        };
        for dst in dsts {
            // The v3 checksum covers the destination, so each peer gets its own encoding.
            let result = match codec::encode(&advert, src, dst) {
                Ok(bytes) => self
                    .socket
                    .send(&bytes, dst)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => self.with_status(|s| s.counters.adverts_sent += 1),
                Err(e) => {
                    tracing::debug!(instance = %self.cfg.name, %dst, error = %e, "advert not sent");
                    self.with_status(|s| s.counters.send_errors += 1);
                }
            }
        }
    }

    async fn take_ownership(&mut self) {
        for vip in self.cfg.vips.clone() {
            if let Err(e) = announce::add_vip(&self.netlink, &self.ifname, vip).await {
                tracing::error!(instance = %self.cfg.name, error = format!("{e:#}"), "adding VIP failed");
                self.with_status(|s| s.counters.vip_errors += 1);
            }
        }
        let _ = self.owned.send(true);
        self.with_status(|s| s.owned = true);
        self.garp_left = GARP_BURST;
        self.next_garp = Some(Instant::now());
    }

    async fn release_ownership(&mut self) {
        // Stop forwarding first, then give the addresses back.
        let _ = self.owned.send(false);
        self.with_status(|s| s.owned = false);
        self.garp_left = 0;
        self.next_garp = None;
        for vip in self.cfg.vips.clone() {
            if let Err(e) = announce::remove_vip(&self.netlink, &self.ifname, vip).await {
                tracing::error!(instance = %self.cfg.name, error = format!("{e:#}"), "removing VIP failed");
                self.with_status(|s| s.counters.vip_errors += 1);
            }
        }
    }

    /// Send one round of announcements; schedule the next one of the burst, then the refresh.
    fn announce_tick(&mut self) {
        if let Some(a) = &self.announcer {
            match a.announce(&self.cfg.vips) {
                Ok(()) => self.with_status(|s| s.counters.announcements += 1),
                Err(e) => {
                    tracing::debug!(instance = %self.cfg.name, error = %e, "announcement failed")
                }
            }
        }
        self.garp_left = self.garp_left.saturating_sub(1);
        self.next_garp = if self.garp_left > 0 {
            Some(Instant::now() + GARP_SPACING)
        } else if self.cfg.garp_refresh_s > 0 {
            Some(Instant::now() + Duration::from_secs(self.cfg.garp_refresh_s))
        } else {
            None
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> InstanceConfig {
        toml::from_str(
            r#"
            name = "api"
            vrid = 14
            vips = ["192.0.2.100"]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn defaults() {
        let c = cfg();
        assert_eq!(c.version, 3);
        assert_eq!(c.priority, 100);
        assert_eq!(c.interval_ms(), 100);
        assert!(c.preempt);
        assert_eq!(c.garp_refresh_s, 60);
        assert!(c.unicast_peers.is_empty());
        c.validate().unwrap();
        let v2 = InstanceConfig {
            version: 2,
            ..cfg()
        };
        assert_eq!(v2.interval_ms(), 1000);
        v2.validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<InstanceConfig, _> = toml::from_str("name='a'\nvrid=1\nvips=[]\nprio=3\n");
        assert!(r.unwrap_err().to_string().contains("prio"));
    }

    #[test]
    fn validation_names_the_field() {
        let e = |f: fn(&mut InstanceConfig)| {
            let mut c = cfg();
            f(&mut c);
            c.validate_at(0).unwrap_err().to_string()
        };
        assert_eq!(
            e(|c| {
                c.version = 2;
                c.auth_pass = Some("ocp_api_vip".into());
            }),
            "vrrp[0].auth_pass: longer than 8 bytes"
        );
        assert!(e(|c| c.auth_pass = Some("x".into())).starts_with("vrrp[0].auth_pass: VRRPv3"));
        assert!(e(|c| c.vrid = 0).starts_with("vrrp[0].vrid:"));
        assert!(e(|c| c.version = 4).starts_with("vrrp[0].version:"));
        assert!(e(|c| c.priority = 0).starts_with("vrrp[0].priority:"));
        assert!(e(|c| c.advert_interval_ms = Some(15)).starts_with("vrrp[0].advert_interval_ms:"));
        assert!(
            e(|c| {
                c.version = 2;
                c.advert_interval_ms = Some(1500);
            })
            .starts_with("vrrp[0].advert_interval_ms: 1500: VRRPv2")
        );
        assert!(e(|c| c.vips.clear()).starts_with("vrrp[0].vips:"));
        assert!(e(|c| c.vips.push("2001:db8::1".parse().unwrap())).starts_with("vrrp[0].vips[1]:"));
        assert!(e(|c| c.vips.push("192.0.2.100".parse().unwrap())).contains("listed twice"));
        assert!(
            e(|c| c.unicast_peers = vec!["fe80::1".parse().unwrap()])
                .starts_with("vrrp[0].unicast_peers[0]:")
        );
        assert!(
            e(|c| c.unicast_src = Some("fe80::1".parse().unwrap()))
                .starts_with("vrrp[0].unicast_src:")
        );
        assert!(
            e(|c| {
                c.version = 2;
                c.vips = vec!["2001:db8::1".parse().unwrap()];
            })
            .starts_with("vrrp[0].version:")
        );
        assert!(
            e(|c| c.interface = Some("a-very-long-interface".into()))
                .starts_with("vrrp[0].interface:")
        );
    }

    #[test]
    fn openshift_style_v2_config() {
        let c: InstanceConfig = toml::from_str(
            r#"
            name = "ostest_API"
            vrid = 14
            version = 2
            priority = 40
            advert_interval_ms = 1000
            auth_pass = "ostest_a"
            unicast_peers = ["192.0.2.11", "192.0.2.12"]
            unicast_src = "192.0.2.10"
            vips = ["192.0.2.5"]
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.auth(), Auth::simple("ostest_a"));
        assert_eq!(c.codec_version(), Version::V2);
    }
}

/// Manual smoke test against a live peer (needs root and a prepared namespace), e.g.
/// `ip netns exec ns1 <test binary> vrrp::instance::smoke --ignored --nocapture` with
/// `LB_SMOKE_IF`, `LB_SMOKE_VIP`, `LB_SMOKE_PRIO` and optionally `LB_SMOKE_V2_PASS` set. It runs
/// an instance for 4 s, prints its status, shuts it down and prints the status again.
#[cfg(test)]
mod smoke {
    use super::*;

    #[tokio::test]
    #[ignore = "needs root, a network namespace and a VRRP peer"]
    async fn smoke() {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
        let pass = std::env::var("LB_SMOKE_V2_PASS").ok();
        let cfg = InstanceConfig {
            name: "smoke".into(),
            interface: Some(var("LB_SMOKE_IF")),
            vrid: var("LB_SMOKE_VRID").parse().unwrap(),
            version: if pass.is_some() { 2 } else { 3 },
            priority: var("LB_SMOKE_PRIO").parse().unwrap(),
            advert_interval_ms: Some(1000),
            auth_pass: pass,
            preempt: true,
            preempt_delay_ms: 0,
            unicast_peers: vec![],
            unicast_src: None,
            vips: vec![var("LB_SMOKE_VIP").parse().unwrap()],
            garp_refresh_s: 60,
        };
        let (conn, handle, _) = rtnetlink::new_connection().unwrap();
        tokio::spawn(conn);
        let inst = Instance::spawn(cfg, "unused", handle).await.unwrap();
        let mut owned = inst.ownership();
        let _ = tokio::time::timeout(Duration::from_secs(4), async {
            loop {
                if owned.changed().await.is_err() {
                    break;
                }
                println!("owned -> {}", *owned.borrow());
            }
        })
        .await;
        println!("{}", serde_json::to_string_pretty(&inst.status()).unwrap());
        inst.shutdown().await;
    }
}
